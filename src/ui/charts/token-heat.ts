/**
 * Text with a heat per token (a feature's activation over prompts): one block per prompt, its
 * tokens laid out like text and wrapped at the chart's width, each token's background coloured
 * by its value from zero (the page background) to `max`. Drawn in SVG rather than HTML so that it
 * exports as SVG/PNG like every other chart. Every token is a <rect class="tok-cell"> with
 * data-row, data-col and data-value; hover shows the numbers, click or arrow keys select.
 */
import { interpolateOranges, interpolateRgb } from 'd3';
import { chartFrame, outline, type ChartSvg } from './frame';
import { palette, textOn, divergingColor } from './palette';
import { showTooltip, hideTooltip } from './tooltip';
import { fmt } from './format';

export interface TokenHeatRow {
  /** the block's heading, e.g. 'prompt 0 · max 3.2 at 5' */
  label: string;
  tokens: string[];
  values: number[];
}

export interface TokenHeatOptions {
  rows: TokenHeatRow[];
  /** the value drawn at full colour (values above are clipped); ≤ 0 draws everything blank */
  max: number;
  /** signed values (attributions): negative blue, zero the background, positive red, ±max at full colour */
  signed?: boolean;
  label: string;
  valueTitle: string;
  width?: number;
  tooltip?: (r: number, c: number, v: number) => string[];
  selected?: [number, number] | null;
  onSelect?: (r: number, c: number) => void;
}

const CHAR_W = 7.2;
const TOK_H = 20;
const GAP = 3;

/** the colour of a value: zero stays the background so inactive tokens read as plain text */
export function heatColor(v: number, max: number, bg: string): string {
  if (!(max > 0) || !(v > 0)) return bg;
  return interpolateOranges(0.12 + 0.78 * Math.min(1, v / max));
}

/**
 * a signed value's colour: from the background at zero to the diverging palette's ends at ±max,
 * so a value near zero stays near the background in either theme (the palette's own middle is
 * white: a white pill on the dark page)
 */
export function signedColor(v: number, max: number, bg: string): string {
  if (!(max > 0) || v === 0 || !Number.isFinite(v)) return bg;
  const t = Math.max(-1, Math.min(1, v / max));
  return interpolateRgb(bg, divergingColor(Math.sign(t) * 0.85))(Math.abs(t) ** 0.75);
}

export function drawTokenHeat(svgEl: SVGSVGElement, o: TokenHeatOptions): void {
  const p = palette();
  const fill = (v: number) => (o.signed ? signedColor(v, o.max, p.bg) : heatColor(v, o.max, p.bg));
  const coloured = (v: number) => o.max > 0 && (o.signed ? v !== 0 : v > 0);
  const width = o.width ?? 760;
  const pad = 8;
  type Cell = { r: number; c: number; v: number; text: string; x: number; y: number; w: number };
  const cells: Cell[] = [];
  const heads: { text: string; y: number }[] = [];
  let y = pad;
  o.rows.forEach((row, r) => {
    heads.push({ text: row.label, y: y + 11 });
    y += 18;
    let x = pad;
    row.tokens.forEach((text, c) => {
      const w = Math.max(14, Math.min(width - 2 * pad, text.length * CHAR_W + 8));
      if (x + w > width - pad && x > pad) {
        x = pad;
        y += TOK_H + GAP;
      }
      cells.push({ r, c, v: row.values[c], text, x, y, w });
      x += w + GAP;
    });
    y += TOK_H + 12;
  });
  const height = Math.max(y + 22, 60);

  const svg = chartFrame(svgEl, { width, height, label: o.label, palette: p, fontSize: 11.5, focusable: true });

  svg
    .append('g')
    .selectAll('text')
    .data(heads)
    .join('text')
    .attr('x', pad)
    .attr('y', (d) => d.y)
    .attr('fill', p.muted)
    .attr('font-size', 10.5)
    .text((d) => d.text);

  let sel = o.selected ?? null;
  const g = svg.append('g').selectAll('g').data(cells).join('g');
  const rects = g
    .append('rect')
    .attr('class', 'tok-cell')
    .attr('x', (d) => d.x)
    .attr('y', (d) => d.y)
    .attr('width', (d) => d.w)
    .attr('height', TOK_H)
    .attr('rx', 3)
    .attr('fill', (d) => fill(d.v))
    .attr('stroke', p.grid)
    .attr('stroke-width', 0.6)
    .attr('data-row', (d) => d.r)
    .attr('data-col', (d) => d.c)
    .attr('data-value', (d) => String(d.v))
    .style('cursor', o.onSelect ? 'pointer' : 'default')
    .on('mousemove', (ev: MouseEvent, d) =>
      showTooltip(ev, o.tooltip?.(d.r, d.c, d.v) ?? [d.text, `${o.valueTitle}: ${fmt(d.v, 5)}`]),
    )
    .on('mouseleave', hideTooltip)
    .on('click', (_ev, d) => {
      sel = [d.r, d.c];
      mark();
      o.onSelect?.(d.r, d.c);
    });
  g.append('text')
    .attr('x', (d) => d.x + d.w / 2)
    .attr('y', (d) => d.y + TOK_H / 2 + 4)
    .attr('text-anchor', 'middle')
    .attr('pointer-events', 'none')
    .attr('xml:space', 'preserve')
    .attr('fill', (d) => (coloured(d.v) ? textOn(fill(d.v)) : p.fg))
    .text((d) => {
      const maxChars = Math.floor((d.w - 6) / CHAR_W);
      return d.text.length > maxChars ? `${d.text.slice(0, Math.max(1, maxChars - 1))}…` : d.text;
    });

  const selection = outline(svg, 'rect', 'selection', p.fg).attr('rx', 3);
  const mark = () => {
    const c = sel && cells.find((d) => d.r === sel![0] && d.c === sel![1]);
    if (!c) {
      selection.attr('display', 'none');
      return;
    }
    selection
      .attr('display', null)
      .attr('x', c.x - 1)
      .attr('y', c.y - 1)
      .attr('width', c.w + 2)
      .attr('height', TOK_H + 2);
    rects.attr('aria-selected', (d) => (d === c ? 'true' : null));
  };
  mark();

  // keyboard: ←/→ move through the tokens (across prompts), ↑/↓ jump a prompt
  svgEl.onkeydown = (ev: KeyboardEvent) => {
    if (!['ArrowLeft', 'ArrowRight', 'ArrowUp', 'ArrowDown'].includes(ev.key) || !cells.length) return;
    ev.preventDefault();
    let i = sel ? cells.findIndex((d) => d.r === sel![0] && d.c === sel![1]) : -1;
    if (i < 0) i = 0;
    else if (ev.key === 'ArrowRight') i = Math.min(cells.length - 1, i + 1);
    else if (ev.key === 'ArrowLeft') i = Math.max(0, i - 1);
    else {
      const r = Math.max(0, Math.min(o.rows.length - 1, cells[i].r + (ev.key === 'ArrowDown' ? 1 : -1)));
      i = Math.max(
        0,
        cells.findIndex((d) => d.r === r),
      );
    }
    sel = [cells[i].r, cells[i].c];
    mark();
    o.onSelect?.(sel[0], sel[1]);
  };

  // legend: zero … max (signed: −max … +max)
  const steps = o.signed ? 32 : 24;
  const mid = (i: number) => (i + 0.5) / steps;
  drawLegend(svg, {
    right: width - pad,
    y: height - 14,
    width: o.signed ? 160 : 120,
    steps,
    fill: o.signed
      ? (i) => fill((mid(i) * 2 - 1) * o.max)
      : (i) => (i === 0 ? p.bg : heatColor(mid(i) * o.max, o.max, p.bg)),
    stroke: o.signed ? () => null : (i) => (i === 0 ? p.grid : 'none'),
    low: o.signed ? `−${fmt(o.max, 3)}` : '0',
    high: `${o.signed ? '+' : ''}${fmt(o.max, 3)} ${o.valueTitle}`,
    muted: p.muted,
  });
}

/**
 * A colour legend ending `right` px from the left, 8 px plus the high label's width in from it: `steps`
 * swatches over `width` px, the low end's label left of them and the high end's right of them.
 */
function drawLegend(
  svg: ChartSvg,
  a: {
    right: number;
    y: number;
    width: number;
    steps: number;
    fill: (i: number) => string;
    stroke: (i: number) => string | null;
    low: string;
    high: string;
    muted: string;
  },
): void {
  const lx = a.right - a.width - 8 - a.high.length * 6.4;
  const lg = svg.append('g').attr('class', 'legend');
  for (let i = 0; i < a.steps; i++) {
    lg.append('rect')
      .attr('x', lx + (a.width * i) / a.steps)
      .attr('y', a.y - 8)
      .attr('width', a.width / a.steps + 0.5)
      .attr('height', 8)
      .attr('fill', a.fill(i))
      .attr('stroke', a.stroke(i));
  }
  lg.append('text')
    .attr('x', lx - 4)
    .attr('y', a.y)
    .attr('text-anchor', 'end')
    .attr('fill', a.muted)
    .attr('font-size', 10)
    .text(a.low);
  lg.append('text')
    .attr('x', lx + a.width + 4)
    .attr('y', a.y)
    .attr('fill', a.muted)
    .attr('font-size', 10)
    .text(a.high);
}
