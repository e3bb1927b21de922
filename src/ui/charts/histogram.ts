/** A baseline distribution (e.g. effects of random directions) with the observed value marked. */
import { scaleLinear, bin, max as d3max, extent, type ScaleLinear } from 'd3';
import { chartFrame, tickLabels, axisTitle, type ChartSvg } from './frame';
import { palette, type Palette } from './palette';
import { showTooltip, hideTooltip } from './tooltip';
import { fmt } from './format';

/** What both histograms take besides their values. */
interface HistogramOptions {
  xTitle: string;
  label: string;
  width?: number;
  height?: number;
}

export function drawHistogram(
  svgEl: SVGSVGElement,
  o: HistogramOptions & { values: number[]; marker?: { value: number; label: string } | null },
): void {
  const p = palette();
  const width = o.width ?? 560;
  const height = o.height ?? 240;
  const m = { left: 44, right: 16, top: 22, bottom: 40 };
  const ext = extent([...o.values, ...(o.marker ? [o.marker.value] : [])]) as [number, number];
  const lo = ext[0] ?? 0;
  const hi = ext[1] ?? 1;
  const x = scaleLinear()
    .domain(lo === hi ? [lo - 1, hi + 1] : [lo, hi])
    .nice()
    .range([m.left, width - m.right]);
  const bins = bin()
    .domain(x.domain() as [number, number])
    .thresholds(x.ticks(24))(o.values);
  const y = scaleLinear()
    .domain([0, d3max(bins, (b) => b.length) || 1])
    .nice()
    .range([height - m.bottom, m.top]);
  const svg = chartFrame(svgEl, { width, height, label: o.label, palette: p });
  const counted = bins.map((b) => ({ x0: b.x0!, x1: b.x1!, c: b.length }));
  drawBins(
    svg,
    counted,
    { x, y, m, width, height, palette: p, xTitle: o.xTitle },
    {
      fill: p.muted,
      opacity: 0.7,
      minWidth: 0,
      tip: (b) => [`${fmt(b.x0, 3)} … ${fmt(b.x1, 3)}`, `${b.c} of ${o.values.length}`],
    },
  );
  if (o.marker) {
    const mx = x(o.marker.value);
    svg
      .append('line')
      .attr('class', 'hist-marker')
      .attr('x1', mx)
      .attr('x2', mx)
      .attr('y1', m.top - 6)
      .attr('y2', y(0))
      .attr('stroke', p.pos)
      .attr('stroke-width', 2.5);
    svg
      .append('text')
      .attr('x', Math.min(mx + 4, width - 150))
      .attr('y', m.top - 8)
      .attr('fill', p.pos)
      .attr('font-weight', 700)
      .text(`${o.marker.label} ${fmt(o.marker.value, 3)}`);
  }
}

/**
 * Counts already binned (a dashboard's activation histogram): equal-width bins between `edges`,
 * with how many values were left out of the bins (exact zeros) said in the title.
 */
export function drawBinnedHistogram(
  svgEl: SVGSVGElement,
  o: HistogramOptions & { edges: number[]; counts: number[]; note?: string },
): void {
  const p = palette();
  const width = o.width ?? 560;
  const height = o.height ?? 240;
  const m = { left: 52, right: 16, top: 22, bottom: 40 };
  const lo = o.edges[0] ?? 0;
  const hi = o.edges[o.edges.length - 1] ?? 1;
  const x = scaleLinear()
    .domain(lo === hi ? [lo - 1, hi + 1] : [lo, hi])
    .range([m.left, width - m.right]);
  const bins = o.counts.map((c, i) => ({ x0: o.edges[i], x1: lo === hi ? hi + 1 : o.edges[i + 1], c }));
  const y = scaleLinear()
    .domain([0, d3max(o.counts) || 1])
    .nice()
    .range([height - m.bottom, m.top]);
  const svg = chartFrame(svgEl, { width, height, label: o.label, palette: p });
  drawBins(
    svg,
    bins,
    { x, y, m, width, height, palette: p, xTitle: o.xTitle },
    {
      fill: p.pos,
      opacity: 0.75,
      minWidth: 1,
      tip: (b) => [`${fmt(b.x0, 4)} … ${fmt(b.x1, 4)}`, `${b.c} values`],
    },
  ).attr('data-count', (b) => b.c);
  if (o.note)
    svg
      .append('text')
      .attr('x', width - m.right)
      .attr('y', m.top - 8)
      .attr('text-anchor', 'end')
      .attr('fill', p.muted)
      .text(o.note);
}

interface Bin {
  x0: number;
  x1: number;
  /** how many values fell in [x0, x1) */
  c: number;
}

interface Axes {
  x: ScaleLinear<number, number>;
  y: ScaleLinear<number, number>;
  m: { left: number; right: number; bottom: number };
  width: number;
  height: number;
  palette: Palette;
  xTitle: string;
}

/** Both histograms' bins as bars up from zero (each a <rect class="hist-bin"> with its tooltip), then their axes. */
function drawBins(
  svg: ChartSvg,
  bins: Bin[],
  a: Axes,
  look: { fill: string; opacity: number; minWidth: number; tip: (b: Bin) => string[] },
) {
  const { x, y } = a;
  const rects = svg
    .append('g')
    .selectAll('rect')
    .data(bins)
    .join('rect')
    .attr('class', 'hist-bin')
    .attr('x', (b) => x(b.x0) + 0.5)
    .attr('width', (b) => Math.max(look.minWidth, x(b.x1) - x(b.x0) - 1))
    .attr('y', (b) => y(b.c))
    .attr('height', (b) => y(0) - y(b.c))
    .attr('fill', look.fill)
    .attr('opacity', look.opacity)
    .on('mousemove', (ev: MouseEvent, b) => showTooltip(ev, look.tip(b)))
    .on('mouseleave', hideTooltip);
  drawAxes(svg, a);
  return rects;
}

/** Both histograms' axes: x ticks under the bins, counts left of them, the zero line and the x title. */
function drawAxes(svg: ChartSvg, a: Axes): void {
  const { x, y, m, width, height, palette: p } = a;
  tickLabels(svg, x.ticks(7), {
    side: 'bottom',
    at: x,
    line: height - m.bottom + 14,
    text: (t) => fmt(t, 2),
    fill: p.muted,
  });
  tickLabels(svg, y.ticks(4), { side: 'left', at: y, line: m.left - 6, text: String, fill: p.muted });
  svg
    .append('line')
    .attr('x1', m.left)
    .attr('x2', width - m.right)
    .attr('y1', y(0))
    .attr('y2', y(0))
    .attr('stroke', p.fg);
  axisTitle(svg, { side: 'bottom', x: (m.left + width - m.right) / 2, y: height - 6, text: a.xTitle, fill: p.muted });
}
