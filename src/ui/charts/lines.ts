/** Curves of metrics against a parameter (α-sweeps), with an optional marked x (the shown α). */
import { scaleLinear, extent } from 'd3';
import { chartFrame, dots, gridLines, tickLabels, axisTitle, curve } from './frame';
import { palette, seriesColor, METRIC_COLORS } from './palette';
import { showTooltip, hideTooltip } from './tooltip';
import { fmt } from './format';

export interface Series {
  name: string;
  points: { x: number; y: number }[];
  color?: string;
  dashed?: boolean;
}

export interface LinesOptions {
  series: Series[];
  xTitle: string;
  yTitle: string;
  label: string;
  markX?: number | null;
  markLabel?: string;
  onSelectX?: (x: number) => void;
  width?: number;
  height?: number;
  /** draw y = 0 */
  zeroLine?: boolean;
  /** x is a count (layers): integer ticks only */
  xIntegers?: boolean;
}

export function drawLines(svgEl: SVGSVGElement, o: LinesOptions): void {
  const p = palette();
  const width = o.width ?? 640;
  const height = o.height ?? 300;
  const legendW = 150;
  const margin = { left: 58, right: 16 + legendW, top: 12, bottom: 40 };
  const all = o.series.flatMap((s) => s.points);
  const xs = extent(all, (d) => d.x) as [number, number];
  const ys = extent(all, (d) => d.y) as [number, number];
  if (o.zeroLine) {
    ys[0] = Math.min(ys[0] ?? 0, 0);
    ys[1] = Math.max(ys[1] ?? 0, 0);
  }
  const x = scaleLinear()
    .domain(xs[0] === undefined ? [0, 1] : xs[0] === xs[1] ? [xs[0] - 1, xs[0] + 1] : xs)
    .nice()
    .range([margin.left, width - margin.right]);
  const y = scaleLinear()
    .domain(ys[0] === undefined ? [0, 1] : ys[0] === ys[1] ? [ys[0] - 1, ys[0] + 1] : ys)
    .nice()
    .range([height - margin.bottom, margin.top]);

  const svg = chartFrame(svgEl, { width, height, label: o.label, palette: p });

  const xt = o.xIntegers ? x.ticks(7).filter((t) => Number.isInteger(t)) : x.ticks(7);
  const yt = y.ticks(6);
  gridLines(svg, yt, {
    along: 'y',
    at: y,
    from: margin.left,
    to: width - margin.right,
    stroke: (t) => (t === 0 && o.zeroLine ? p.muted : p.grid),
    width: 0.6,
  });
  tickLabels(svg, yt, { side: 'left', at: y, line: margin.left - 6, text: (t) => fmt(t, 2), fill: p.muted });
  tickLabels(svg, xt, {
    side: 'bottom',
    at: x,
    line: height - margin.bottom + 15,
    text: (t) => (o.xIntegers ? String(t) : fmt(t, 2)),
    fill: p.muted,
  });
  svg
    .append('line')
    .attr('x1', margin.left)
    .attr('x2', width - margin.right)
    .attr('y1', height - margin.bottom)
    .attr('y2', height - margin.bottom)
    .attr('stroke', p.fg);
  svg
    .append('line')
    .attr('x1', margin.left)
    .attr('x2', margin.left)
    .attr('y1', margin.top)
    .attr('y2', height - margin.bottom)
    .attr('stroke', p.fg);
  axisTitle(svg, {
    side: 'bottom',
    x: (margin.left + width - margin.right) / 2,
    y: height - 6,
    text: o.xTitle,
    fill: p.muted,
  });
  axisTitle(svg, { side: 'left', y: (margin.top + height - margin.bottom) / 2, text: o.yTitle, fill: p.muted });

  if (o.markX !== undefined && o.markX !== null && Number.isFinite(o.markX)) {
    svg
      .append('line')
      .attr('class', 'mark-x')
      .attr('data-x', String(o.markX))
      .attr('x1', x(o.markX))
      .attr('x2', x(o.markX))
      .attr('y1', margin.top)
      .attr('y2', height - margin.bottom)
      .attr('stroke', p.highlight)
      .attr('stroke-width', 2)
      .attr('stroke-dasharray', '5 3');
    svg
      .append('text')
      .attr('x', x(o.markX) + 4)
      .attr('y', height - margin.bottom - 6)
      .attr('fill', p.fg)
      .attr('font-size', 10)
      .text(o.markLabel ?? `x = ${fmt(o.markX, 3)}`);
  }

  o.series.forEach((s, si) => {
    const c = s.color ?? METRIC_COLORS[s.name] ?? seriesColor(si);
    const pts = s.points.filter((d) => Number.isFinite(d.y));
    const xy = pts.map((d): [number, number] => [x(d.x), y(d.y)]);
    curve(svg, xy)
      .attr('class', 'series-line')
      .attr('data-series', s.name)
      .attr('stroke', c)
      .attr('stroke-width', 2)
      .attr('stroke-dasharray', s.dashed ? '6 4' : null);
    dots(svg, pts, 'point')
      .attr('data-series', s.name)
      .attr('data-x', (d) => String(d.x))
      .attr('data-y', (d) => String(d.y))
      .attr('cx', (d) => x(d.x))
      .attr('cy', (d) => y(d.y))
      .attr('r', 4)
      .attr('fill', c)
      .attr('stroke', p.bg)
      .style('cursor', o.onSelectX ? 'pointer' : 'default')
      .on('mousemove', (ev: MouseEvent, d) =>
        showTooltip(ev, [s.name, `${o.xTitle}: ${fmt(d.x, 4)}`, `${o.yTitle}: ${fmt(d.y, 5)}`]),
      )
      .on('mouseleave', hideTooltip)
      .on('click', (_ev, d) => o.onSelectX?.(d.x));
    const ly = margin.top + 8 + si * 18;
    const lx = width - legendW + 4;
    svg
      .append('line')
      .attr('x1', lx)
      .attr('x2', lx + 18)
      .attr('y1', ly)
      .attr('y2', ly)
      .attr('stroke', c)
      .attr('stroke-width', 2)
      .attr('stroke-dasharray', s.dashed ? '6 4' : null);
    svg
      .append('text')
      .attr('x', lx + 24)
      .attr('y', ly + 4)
      .attr('fill', p.fg)
      .text(s.name.length > 18 ? `${s.name.slice(0, 17)}…` : s.name);
  });
}
