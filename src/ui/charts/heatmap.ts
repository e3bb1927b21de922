/**
 * A labelled heatmap (layer × head, layer × position, query × key …). Up to RASTER_CELLS cells,
 * every cell is a <rect class="cell"> carrying data-row, data-col and data-value, so tests and
 * exports read the exact numbers drawn. Larger grids are one bitmap (charts/raster.ts; the <svg>
 * says data-render="raster"): the same hover, click and keyboard, without an element per cell.
 * Hover shows the numbers, click (or arrow keys + Enter) selects a cell.
 */
import { select, scaleBand, pointer, max as d3max, min as d3min } from 'd3';
import { chartFrame, outline } from './frame';
import { palette, divergingColor, sequentialColor, textOn } from './palette';
import { RASTER_CELLS, colorLut, rasterImage, onHighlight } from './raster';
import { showTooltip, hideTooltip } from './tooltip';
import { fmt } from './format';

export interface HeatmapOptions {
  values: number[][];
  rowLabels: string[];
  colLabels: string[];
  rowTitle?: string;
  colTitle?: string;
  kind: 'diverging' | 'sequential';
  /** sequential: [min, max] (default data range); diverging: ± this max (default max |v|) */
  domain?: [number, number];
  cellText?: (r: number, c: number) => string | null;
  tooltip: (r: number, c: number, v: number) => string[];
  selected?: [number, number] | null;
  onSelect?: (r: number, c: number) => void;
  /** preferred cell size in px */
  cell?: { w: number; h: number };
  maxWidth?: number;
  legendLabel?: string;
  /** the token position a cell stands for (data-pos: hovering it highlights that token in every view) */
  posOf?: (r: number, c: number) => number | null;
  /** accessible name */
  label: string;
}

const CHAR_W = 6.6;

/**
 * A cell's text as it fits `maxChars`: a number loses its leading zero ("-0.12" → "-.12") or is
 * left out (the tooltip has it: a cut number such as "0…" reads as a wrong value); other text is
 * cut with an ellipsis. A negative number that rounds to zero loses its sign.
 */
export function fitCellText(t: string, maxChars: number): string {
  const m = /^([^\d.+−-]*)([+−-]?)(\d*\.?\d+)$/.exec(t);
  if (!m) return t.length > maxChars ? `${t.slice(0, Math.max(1, maxChars - 1))}…` : t;
  const [, prefix, sign0, digits] = m;
  const sign = /^0*\.?0*$/.test(digits) ? '' : sign0;
  for (const d of [digits, digits.replace(/^0(?=\.)/, '')]) {
    const s = `${prefix}${sign}${d}`;
    if (s.length <= maxChars) return s;
  }
  return prefix.length <= maxChars ? prefix : '';
}

export function drawHeatmap(svgEl: SVGSVGElement, o: HeatmapOptions): void {
  const p = palette();
  const rows = o.values.length;
  const cols = rows ? o.values[0].length : 0;
  const flat = o.values.flat().filter((v) => Number.isFinite(v));
  let color: (v: number) => string;
  /** a value's place on the colour scale, 0…1 (NaN: no value) */
  let toT: (v: number) => number;
  let lo: number;
  let hi: number;
  if (o.kind === 'diverging') {
    const m = o.domain
      ? Math.max(Math.abs(o.domain[0]), Math.abs(o.domain[1]))
      : (d3max(flat, (v) => Math.abs(v)) ?? 1) || 1;
    lo = -m;
    hi = m;
    color = (v) => (Number.isFinite(v) ? divergingColor(Math.max(-1, Math.min(1, v / m))) : p.grid);
    toT = (v) => (Number.isFinite(v) ? (Math.max(-1, Math.min(1, v / m)) + 1) / 2 : NaN);
  } else {
    lo = o.domain?.[0] ?? d3min(flat) ?? 0;
    hi = o.domain?.[1] ?? d3max(flat) ?? 1;
    const span = hi - lo || 1;
    color = (v) => (Number.isFinite(v) ? sequentialColor(Math.max(0, Math.min(1, (v - lo) / span))) : p.grid);
    toT = (v) => (Number.isFinite(v) ? (v - lo) / span : NaN);
  }

  const longestRow = Math.max(...o.rowLabels.map((l) => l.length), 1);
  const longestCol = Math.max(...o.colLabels.map((l) => l.length), 1);
  const rotate = longestCol > 3 && cols > 4;
  // the colour bar (16 px gap, 10 px bar), its tick values and its rotated title fit inside
  const tickW = Math.max(fmt(lo, 2).length, fmt(hi, 2).length, 1) * 6.2;
  const margin = {
    // a rotated first column label reaches left of its column: room for it as well as the row labels
    left: Math.max(
      12 + longestRow * CHAR_W + (o.rowTitle ? 18 : 0),
      rotate ? Math.min(longestCol, 14) * CHAR_W * 0.72 + 4 : 0,
    ),
    top: 8,
    right: 16 + 10 + 4 + tickW + (o.legendLabel ? 18 : 4),
    bottom: (rotate ? Math.min(longestCol, 14) * CHAR_W * 0.75 + 14 : 20) + (o.colTitle ? 18 : 0),
  };
  const maxW = o.maxWidth ?? 900;
  const want = o.cell ?? { w: 34, h: 24 };
  const cw = Math.max(6, Math.min(want.w, (maxW - margin.left - margin.right) / Math.max(cols, 1)));
  const ch = Math.max(6, Math.min(want.h, cw * 1.2));
  const width = margin.left + cw * cols + margin.right;
  const legendH = o.legendLabel ? o.legendLabel.length * 6 + 8 : 0;
  const height = Math.max(margin.top + ch * rows + margin.bottom, margin.top + legendH + 6);

  const svg = chartFrame(svgEl, { width, height, label: o.label, palette: p, focusable: true });

  const x = scaleBand<number>()
    .domain([...Array(cols).keys()])
    .range([margin.left, margin.left + cw * cols]);
  const y = scaleBand<number>()
    .domain([...Array(rows).keys()])
    .range([margin.top, margin.top + ch * rows]);

  const g = svg.append('g').attr('class', 'cells');
  let sel = o.selected ?? null;
  const raster = rows * cols > RASTER_CELLS;
  const unhook = svgEl as SVGSVGElement & { __unhighlight?: () => void };
  unhook.__unhighlight?.();
  unhook.__unhighlight = undefined;
  svg
    .attr('data-render', raster ? 'raster' : null)
    .attr('data-rows', rows)
    .attr('data-cols', cols);
  let markCells: () => void = () => {};

  if (raster) {
    const lut = colorLut(o.kind === 'diverging' ? (t) => divergingColor(2 * t - 1) : sequentialColor);
    const im = rasterImage(
      o.values,
      { toT, lut, missing: p.grid },
      { x: margin.left, y: margin.top, width: cw * cols, height: ch * rows },
    );
    im.setAttribute('class', 'cells-raster');
    g.node()!.appendChild(im);
    const cellAt = (ev: MouseEvent): [number, number] => {
      const [px, py] = pointer(ev, svgEl);
      return [
        Math.max(0, Math.min(rows - 1, Math.floor((py - margin.top) / ch))),
        Math.max(0, Math.min(cols - 1, Math.floor((px - margin.left) / cw))),
      ];
    };
    const imSel = select(im).style('cursor', o.onSelect ? 'pointer' : 'default');
    imSel
      .on('mousemove', (ev: MouseEvent) => {
        const [r, c] = cellAt(ev);
        showTooltip(ev, o.tooltip(r, c, o.values[r][c]));
        // the position under the pointer, for the page's linked highlight (App.svelte reads data-pos on mouseover)
        const q = o.posOf?.(r, c);
        const next = q === null || q === undefined ? null : String(q);
        const prev = im.getAttribute('data-pos');
        if (prev !== next) {
          if (prev !== null) im.dispatchEvent(new MouseEvent('mouseout', { bubbles: true }));
          if (next === null) im.removeAttribute('data-pos');
          else {
            im.setAttribute('data-pos', next);
            im.dispatchEvent(new MouseEvent('mouseover', { bubbles: true }));
          }
        }
      })
      .on('mouseleave', () => {
        hideTooltip();
        im.removeAttribute('data-pos');
      })
      .on('click', (ev: MouseEvent) => {
        const [r, c] = cellAt(ev);
        sel = [r, c];
        mark();
        o.onSelect?.(r, c);
      });
    // a position hovered in another view: outline its cells here
    if (o.posOf) {
      const hl = outline(svg, 'path', 'pos-highlight', p.highlight);
      const off = onHighlight((pos) => {
        if (!svgEl.isConnected) {
          off();
          return;
        }
        let d = '';
        if (pos !== null) {
          for (let r = 0; r < rows; r++)
            for (let c = 0; c < cols; c++) {
              if (o.posOf!(r, c) === pos) d += `M${x(c)!},${y(r)!}h${cw}v${ch}h${-cw}Z`;
            }
        }
        hl.attr('d', d || null);
      });
      unhook.__unhighlight = off;
    }
  } else {
    // no value (NaN): hatched, so it is not read as a value near zero (a near-white cell)
    const hatchId = `hatch-${Math.random().toString(36).slice(2, 9)}`;
    svg
      .append('defs')
      .append('pattern')
      .attr('id', hatchId)
      .attr('patternUnits', 'userSpaceOnUse')
      .attr('width', 5)
      .attr('height', 5)
      .attr('patternTransform', 'rotate(45)')
      .call((pt) => {
        pt.append('rect').attr('width', 5).attr('height', 5).attr('fill', p.bg);
        pt.append('line')
          .attr('x1', 0)
          .attr('y1', 0)
          .attr('x2', 0)
          .attr('y2', 5)
          .attr('stroke', p.grid)
          .attr('stroke-width', 2);
      });
    const cells: { r: number; c: number; v: number }[] = [];
    for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) cells.push({ r, c, v: o.values[r][c] });

    const rects = g
      .selectAll('rect')
      .data(cells)
      .join('rect')
      .attr('class', 'cell')
      .attr('x', (d) => x(d.c)!)
      .attr('y', (d) => y(d.r)!)
      .attr('width', Math.max(1, cw - 1))
      .attr('height', Math.max(1, ch - 1))
      .attr('fill', (d) => (Number.isFinite(d.v) ? color(d.v) : `url(#${hatchId})`))
      // an outline where cells are big enough for one not to drown them (small cells are a texture)
      .attr('stroke', cw >= 12 ? p.grid : null)
      .attr('stroke-width', cw >= 12 ? 0.5 : null)
      .attr('data-missing', (d) => (Number.isFinite(d.v) ? null : 'true'))
      .attr('data-row', (d) => d.r)
      .attr('data-col', (d) => d.c)
      .attr('data-value', (d) => String(d.v))
      .attr('data-pos', (d) => {
        const q = o.posOf?.(d.r, d.c);
        return q === null || q === undefined ? null : String(q);
      })
      .style('cursor', o.onSelect ? 'pointer' : 'default')
      .on('mousemove', (ev: MouseEvent, d) => showTooltip(ev, o.tooltip(d.r, d.c, d.v)))
      .on('mouseleave', hideTooltip)
      .on('click', (_ev, d) => {
        sel = [d.r, d.c];
        mark();
        o.onSelect?.(d.r, d.c);
      });
    markCells = () => {
      rects.attr('aria-selected', (d) => (sel && d.r === sel[0] && d.c === sel[1] ? 'true' : null));
    };

    if (o.cellText && cw >= 18 && ch >= 12) {
      const fontSize = Math.min(11, ch * 0.55);
      // digits of the page's sans-serif font are ≈ 0.6 em wide; 2 px stay free at the cell's edges
      const maxChars = Math.floor((cw - 3) / (fontSize * 0.6));
      g.selectAll('text')
        .data(cells.filter((d) => Number.isFinite(d.v)))
        .join('text')
        .attr('x', (d) => x(d.c)! + cw / 2 - 0.5)
        .attr('y', (d) => y(d.r)! + ch / 2 + 3.5)
        .attr('text-anchor', 'middle')
        .attr('pointer-events', 'none')
        .attr('font-size', fontSize)
        .attr('fill', (d) => textOn(color(d.v)))
        .text((d) => fitCellText(o.cellText!(d.r, d.c) ?? '', maxChars));
    }
  }

  const selection = outline(svg, 'rect', 'selection', p.fg);
  const mark = () => {
    if (!sel) {
      selection.attr('display', 'none');
      return;
    }
    selection
      .attr('display', null)
      .attr('x', x(sel[1])! - 0.5)
      .attr('y', y(sel[0])! - 0.5)
      .attr('width', cw)
      .attr('height', ch);
    markCells();
  };
  mark();

  // keyboard: arrows move the selection, Enter/Space re-announces it
  svgEl.onkeydown = (ev: KeyboardEvent) => {
    const d: Record<string, [number, number]> = {
      ArrowUp: [-1, 0],
      ArrowDown: [1, 0],
      ArrowLeft: [0, -1],
      ArrowRight: [0, 1],
    };
    if (!(ev.key in d) && ev.key !== 'Enter' && ev.key !== ' ') return;
    ev.preventDefault();
    const [r0, c0] = sel ?? [0, 0];
    const [dr, dc] = d[ev.key] ?? [0, 0];
    const r = Math.max(0, Math.min(rows - 1, r0 + dr));
    const c = Math.max(0, Math.min(cols - 1, c0 + dc));
    sel = [r, c];
    mark();
    o.onSelect?.(r, c);
  };

  // axes: row labels left, column labels below
  // where cells are smaller than a line of text, every n-th label (the rest would overlap)
  const rowStep = Math.ceil(11 / ch);
  const colStep = Math.ceil((rotate ? 11 : 7 * Math.min(longestCol, 14)) / cw);
  const every = <T>(xs: T[], n: number) => xs.map((d, i) => ({ d, i })).filter(({ i }) => i % n === 0);
  svg
    .append('g')
    .selectAll('text')
    .data(every(o.rowLabels, rowStep))
    .join('text')
    .attr('x', margin.left - 6)
    .attr('y', ({ i }) => y(i)! + ch / 2 + 3.5)
    .attr('text-anchor', 'end')
    .attr('fill', p.fg)
    .text(({ d }) => d);
  const colG = svg
    .append('g')
    .selectAll('text')
    .data(every(o.colLabels, colStep))
    .join('text')
    .attr('fill', p.fg)
    .text(({ d }) => (d.length > 14 ? `${d.slice(0, 13)}…` : d));
  if (rotate) {
    colG
      .attr('text-anchor', 'end')
      .attr('transform', ({ i }) => `translate(${x(i)! + cw / 2 + 3},${margin.top + ch * rows + 8}) rotate(-45)`);
  } else {
    colG
      .attr('text-anchor', 'middle')
      .attr('x', ({ i }) => x(i)! + cw / 2)
      .attr('y', margin.top + ch * rows + 14);
  }
  if (o.rowTitle) {
    svg
      .append('text')
      .attr('transform', `translate(12,${margin.top + (ch * rows) / 2}) rotate(-90)`)
      .attr('text-anchor', 'middle')
      .attr('fill', p.muted)
      .text(o.rowTitle);
  }
  if (o.colTitle) {
    svg
      .append('text')
      .attr('x', margin.left + (cw * cols) / 2)
      .attr('y', height - 4)
      .attr('text-anchor', 'middle')
      .attr('fill', p.muted)
      .text(o.colTitle);
  }

  // legend: a vertical colour bar with its end values (and 0 for diverging scales)
  const lx = margin.left + cw * cols + 16;
  // the bar is as long as its title (rotated along it), the chart as tall as the bar
  const lh = Math.max(40, Math.min(160, ch * rows), o.legendLabel ? o.legendLabel.length * 6 + 8 : 0);
  const steps = 32;
  const lg = svg.append('g').attr('class', 'legend');
  for (let i = 0; i < steps; i++) {
    const v = hi - ((hi - lo) * (i + 0.5)) / steps;
    lg.append('rect')
      .attr('x', lx)
      .attr('y', margin.top + (lh * i) / steps)
      .attr('width', 10)
      .attr('height', lh / steps + 0.5)
      .attr('fill', color(v));
  }
  const tick = (v: number, yy: number) =>
    lg
      .append('text')
      .attr('x', lx + 14)
      .attr('y', yy)
      .attr('fill', p.fg)
      .attr('font-size', 10)
      .text(fmt(v, 2));
  tick(hi, margin.top + 8);
  tick(lo, margin.top + lh);
  if (o.kind === 'diverging') tick(0, margin.top + lh / 2 + 3);
  if (o.legendLabel) {
    // rotated along the colour bar, which is as long as it (≈6 px a character at 10 px)
    lg.append('text')
      .attr('class', 'legend-title')
      .attr('transform', `translate(${lx + 14 + tickW + 6},${margin.top + lh / 2}) rotate(90)`)
      .attr('text-anchor', 'middle')
      .attr('fill', p.muted)
      .attr('font-size', 10)
      .text(o.legendLabel);
  }
}
