/**
 * The exact decomposition of a logit as a horizontal waterfall: each term a bar from the running
 * sum to the running sum plus the term; the last bar is the total (the logit) from zero. Terms of
 * one layer (names "L{l}…") share a band, every other layer shaded; value labels have a halo of the background so they read over the axis and grid lines.
 */
import { scaleLinear, scaleBand } from 'd3';
import { chartFrame, drawValueAxis } from './frame';
import { palette } from './palette';
import { showTooltip, hideTooltip } from './tooltip';
import { fmt } from './format';

export interface WaterfallTerm {
  name: string;
  value: number;
  detail?: string[];
}

export interface WaterfallOptions {
  terms: WaterfallTerm[];
  total: { name: string; value: number };
  label: string;
  valueTitle: string;
  width?: number;
}

export function drawWaterfall(svgEl: SVGSVGElement, o: WaterfallOptions): void {
  const p = palette();
  const rows = [...o.terms.map((t) => ({ ...t, isTotal: false })), { ...o.total, isTotal: true, detail: undefined }];
  const bh = 17;
  const longest = Math.max(...rows.map((r) => r.name.length), 4);
  const width = o.width ?? 720;
  const margin = { left: 12 + Math.min(longest, 30) * 6.6, right: 70, top: 8, bottom: 34 };
  const layerOf = (name: string) => /^L(\d+)\b/.exec(name)?.[1] ?? null;
  const height = margin.top + bh * rows.length + margin.bottom;
  let run = 0;
  const spans = rows.map((r) => {
    if (r.isTotal) return { ...r, a: 0, b: r.value };
    const a = run;
    run += r.value;
    return { ...r, a, b: run };
  });
  const lo = Math.min(0, ...spans.map((s) => Math.min(s.a, s.b)));
  const hi = Math.max(0, ...spans.map((s) => Math.max(s.a, s.b)));
  const x = scaleLinear()
    .domain([lo, hi === lo ? lo + 1 : hi])
    .nice()
    .range([margin.left, width - margin.right]);
  const y = scaleBand<number>()
    .domain([...Array(rows.length).keys()])
    .range([margin.top, margin.top + bh * rows.length])
    .padding(0.15);

  const svg = chartFrame(svgEl, { width, height, label: o.label, palette: p });

  // one band per run of rows of the same layer, every other one shaded
  const bands: { layer: string; from: number; to: number }[] = [];
  rows.forEach((r, i) => {
    const l = r.isTotal ? null : layerOf(r.name);
    const last = bands.at(-1);
    if (l !== null && last && last.layer === l && last.to === i - 1) last.to = i;
    else if (l !== null) bands.push({ layer: l, from: i, to: i });
  });
  const step = y.step();
  const bandG = svg.append('g').attr('class', 'wf-layers');
  bands.forEach((b, k) => {
    const top = y(b.from)! - (step - y.bandwidth()) / 2;
    const h = (b.to - b.from + 1) * step;
    if (k % 2 === 1)
      bandG
        .append('rect')
        .attr('x', 0)
        .attr('y', top)
        .attr('width', width)
        .attr('height', h)
        .attr('fill', p.grid)
        .attr('opacity', 0.35)
        .attr('data-layer', b.layer);
  });

  drawValueAxis(svg, {
    x,
    top: margin.top,
    bottom: margin.top + bh * rows.length,
    palette: p,
    title: o.valueTitle,
    titleX: (margin.left + width - margin.right) / 2,
    titleY: height - 4,
  });

  // connectors between consecutive bars
  svg
    .append('g')
    .selectAll('line')
    .data(spans.slice(0, -1))
    .join('line')
    .attr('x1', (s) => x(s.b))
    .attr('x2', (s) => x(s.b))
    .attr('y1', (_s, i) => y(i)! + y.bandwidth())
    .attr('y2', (_s, i) => y(i + 1)!)
    .attr('stroke', p.muted)
    .attr('stroke-width', 0.6);

  const g = svg.append('g').selectAll('g').data(spans).join('g');
  g.append('rect')
    .attr('class', (s) => (s.isTotal ? 'wf-total' : 'wf-term'))
    .attr('x', (s) => x(Math.min(s.a, s.b)))
    .attr('y', (_s, i) => y(i)!)
    .attr('width', (s) => Math.max(1, Math.abs(x(s.b) - x(s.a))))
    .attr('height', y.bandwidth())
    .attr('fill', (s) => (s.isTotal ? p.accent : s.value >= 0 ? p.pos : p.neg))
    .attr('data-name', (s) => s.name)
    .attr('data-value', (s) => String(s.value))
    .on('mousemove', (ev: MouseEvent, s) =>
      showTooltip(ev, [s.name, `value: ${fmt(s.value, 6)}`, `running sum: ${fmt(s.b, 6)}`, ...(s.detail ?? [])]),
    )
    .on('mouseleave', hideTooltip);
  g.append('text')
    .attr('x', margin.left - 6)
    .attr('y', (_s, i) => y(i)! + y.bandwidth() / 2 + 3.5)
    .attr('text-anchor', 'end')
    .attr('fill', p.fg)
    .attr('font-weight', (s) => (s.isTotal ? 700 : 400))
    .text((s) => (s.name.length > 30 ? `${s.name.slice(0, 29)}…` : s.name));
  g.append('text')
    .attr('class', 'wf-value')
    .attr('x', (s) => x(Math.max(s.a, s.b)) + 4)
    .attr('y', (_s, i) => y(i)! + y.bandwidth() / 2 + 3.5)
    .attr('fill', p.fg)
    .attr('stroke', p.bg)
    .attr('stroke-width', 3)
    .attr('stroke-linejoin', 'round')
    .attr('paint-order', 'stroke')
    .attr('font-size', 10)
    .text((s) => fmt(s.value, 3));
}
