/**
 * Estimate against actual (attribution patching's validation): one point per item, the y = x
 * diagonal where a perfect linear estimate would sit, both axes on the same scale. Every point is
 * a <circle class="pt"> with data-x, data-y and data-label.
 */
import { scaleLinear, min as d3min, max as d3max } from 'd3';
import { chartFrame, dots, gridLines, tickLabels, axisTitle } from './frame';
import { palette } from './palette';
import { showTooltip, hideTooltip } from './tooltip';
import { fmt } from './format';

export interface ScatterPoint {
  x: number;
  y: number;
  label: string;
  /** a group drawn in its own colour (e.g. heads vs sites) */
  group?: string;
}

export interface ScatterOptions {
  points: ScatterPoint[];
  xTitle: string;
  yTitle: string;
  label: string;
  size?: number;
  onSelect?: (p: ScatterPoint) => void;
}

export function drawScatter(svgEl: SVGSVGElement, o: ScatterOptions): void {
  const p = palette();
  const size = o.size ?? 340;
  const margin = { left: 56, right: 16, top: 12, bottom: 44 };
  const groups = [...new Set(o.points.map((d) => d.group ?? ''))];
  const legendH = groups.length > 1 ? 18 : 0;
  const width = size + margin.left + margin.right;
  const height = size + margin.top + margin.bottom + legendH;
  const vals = o.points.flatMap((d) => [d.x, d.y]);
  let lo = Math.min(0, d3min(vals) ?? 0);
  let hi = Math.max(0, d3max(vals) ?? 1);
  if (hi === lo) hi = lo + 1;
  const pad = (hi - lo) * 0.06;
  lo -= pad;
  hi += pad;
  const x = scaleLinear()
    .domain([lo, hi])
    .nice()
    .range([margin.left, margin.left + size]);
  const y = scaleLinear()
    .domain(x.domain())
    .range([margin.top + size, margin.top]);
  const colours = [p.accent, p.pos, p.neg, p.highlight];
  const colour = (g: string | undefined) => colours[Math.max(0, groups.indexOf(g ?? '')) % colours.length];

  const svg = chartFrame(svgEl, { width, height, label: o.label, palette: p });

  const ticks = x.ticks(6);
  const stroke = (t: number) => (t === 0 ? p.muted : p.grid);
  gridLines(svg, ticks, { along: 'x', at: x, from: margin.top, to: margin.top + size, stroke, width: 0.6 });
  gridLines(svg, ticks, { along: 'y', at: y, from: margin.left, to: margin.left + size, stroke, width: 0.6 });
  const label = (t: number) => fmt(t, 2);
  tickLabels(svg, ticks, { side: 'bottom', at: x, line: margin.top + size + 14, text: label, fill: p.muted });
  tickLabels(svg, ticks, { side: 'left', at: y, line: margin.left - 6, text: label, fill: p.muted });
  axisTitle(svg, { side: 'bottom', x: margin.left + size / 2, y: margin.top + size + 32, text: o.xTitle, fill: p.fg });
  axisTitle(svg, { side: 'left', y: margin.top + size / 2, text: o.yTitle, fill: p.fg });
  // y = x
  const [d0, d1] = x.domain();
  svg
    .append('line')
    .attr('class', 'diagonal')
    .attr('x1', x(d0))
    .attr('y1', y(d0))
    .attr('x2', x(d1))
    .attr('y2', y(d1))
    .attr('stroke', p.muted)
    .attr('stroke-dasharray', '4 3');
  svg
    .append('text')
    .attr('x', x(d1) - 4)
    .attr('y', y(d1) + 14)
    .attr('text-anchor', 'end')
    .attr('fill', p.muted)
    .attr('font-size', 10)
    .text('y = x');

  dots(svg, o.points, 'pt')
    .attr('cx', (d) => x(d.x))
    .attr('cy', (d) => y(d.y))
    .attr('r', 4.5)
    .attr('fill', (d) => colour(d.group))
    .attr('fill-opacity', 0.8)
    .attr('stroke', p.bg)
    .attr('data-x', (d) => String(d.x))
    .attr('data-y', (d) => String(d.y))
    .attr('data-label', (d) => d.label)
    .style('cursor', o.onSelect ? 'pointer' : 'default')
    .on('mousemove', (ev: MouseEvent, d) =>
      showTooltip(ev, [d.label, `${o.xTitle}: ${fmt(d.x, 5)}`, `${o.yTitle}: ${fmt(d.y, 5)}`]),
    )
    .on('mouseleave', hideTooltip)
    .on('click', (_ev, d) => o.onSelect?.(d));

  if (groups.length > 1) {
    const lg = svg.append('g').attr('class', 'legend');
    let lx = margin.left;
    for (const g of groups) {
      lg.append('circle')
        .attr('cx', lx + 5)
        .attr('cy', height - 8)
        .attr('r', 4.5)
        .attr('fill', colour(g));
      lg.append('text')
        .attr('x', lx + 14)
        .attr('y', height - 4.5)
        .attr('fill', p.fg)
        .text(g);
      lx += 24 + g.length * 6.6;
    }
  }
}
