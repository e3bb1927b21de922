/** Ranked horizontal bars around zero (ablation effects, attributions, layer damage). */
import { scaleLinear, scaleBand, min as d3min, max as d3max } from 'd3';
import { chartFrame, drawValueAxis } from './frame';
import { palette } from './palette';
import { showTooltip, hideTooltip } from './tooltip';
import { fmt } from './format';

export interface BarItem {
  label: string;
  value: number;
  /** extra tooltip lines */
  detail?: string[];
  key?: string;
  /** draw in the muted colour (e.g. a group, or an item below a threshold) */
  muted?: boolean;
  /** an interval around the value (a confidence interval), drawn as an error bar */
  interval?: [number, number];
}

export interface BarsOptions {
  items: BarItem[];
  valueTitle: string;
  label: string;
  maxWidth?: number;
  barHeight?: number;
  selectedKey?: string | null;
  onSelect?: (item: BarItem) => void;
}

export function drawBars(svgEl: SVGSVGElement, o: BarsOptions): void {
  const p = palette();
  const n = o.items.length;
  const bh = o.barHeight ?? 18;
  const longest = Math.max(...o.items.map((d) => d.label.length), 4);
  const margin = { left: 10 + Math.min(longest, 28) * 6.6, right: 70, top: 8, bottom: 34 };
  const width = Math.min(o.maxWidth ?? 760, 900);
  const height = margin.top + bh * n + margin.bottom;
  const lo = Math.min(0, d3min(o.items, (d) => Math.min(d.value, d.interval?.[0] ?? d.value)) ?? 0);
  const hi = Math.max(0, d3max(o.items, (d) => Math.max(d.value, d.interval?.[1] ?? d.value)) ?? 0);
  // a negative bar's value is written left of its end: keep room for it clear of the labels
  const valueRoom = lo < 0 ? 44 : 0;
  const x = scaleLinear()
    .domain([lo, hi === lo ? lo + 1 : hi])
    .nice()
    .range([margin.left + valueRoom, width - margin.right]);
  const y = scaleBand<number>()
    .domain([...Array(n).keys()])
    .range([margin.top, margin.top + bh * n])
    .padding(0.18);

  const svg = chartFrame(svgEl, { width, height, label: o.label, palette: p });

  // grid + axis
  drawValueAxis(svg, {
    x,
    top: margin.top,
    bottom: margin.top + bh * n,
    palette: p,
    title: o.valueTitle,
    titleX: (margin.left + width - margin.right) / 2,
    titleY: height - 4,
  });

  const g = svg.append('g').selectAll('g').data(o.items).join('g').attr('class', 'bar-row');
  g.append('rect')
    .attr('class', 'bar')
    .attr('x', (d) => Math.min(x(0), x(d.value)))
    .attr('y', (_d, i) => y(i)!)
    .attr('width', (d) => Math.max(1, Math.abs(x(d.value) - x(0))))
    .attr('height', y.bandwidth())
    .attr('fill', (d) => (d.muted ? p.muted : d.value >= 0 ? p.pos : p.neg))
    .attr('stroke', (d) => (o.selectedKey && d.key === o.selectedKey ? p.fg : 'none'))
    .attr('stroke-width', 2)
    .attr('data-label', (d) => d.label)
    .attr('data-value', (d) => String(d.value))
    .style('cursor', o.onSelect ? 'pointer' : 'default')
    .on('mousemove', (ev: MouseEvent, d) =>
      showTooltip(ev, [d.label, `${o.valueTitle}: ${fmt(d.value, 5)}`, ...(d.detail ?? [])]),
    )
    .on('mouseleave', hideTooltip)
    .on('click', (_ev, d) => o.onSelect?.(d));
  // error bars: a whisker over the bar from the interval's low to its high end, with caps
  const iv = g
    .filter((d) => !!d.interval)
    .append('g')
    .attr('class', 'bar-interval');
  const mid = (i: number) => y(i)! + y.bandwidth() / 2;
  const rowOf = (d: BarItem) => o.items.indexOf(d);
  iv.append('line')
    .attr('x1', (d) => x(d.interval![0]))
    .attr('x2', (d) => x(d.interval![1]))
    .attr('y1', (d) => mid(rowOf(d)))
    .attr('y2', (d) => mid(rowOf(d)))
    .attr('stroke', p.fg)
    .attr('stroke-width', 1.2);
  for (const end of [0, 1] as const)
    iv.append('line')
      .attr('x1', (d) => x(d.interval![end]))
      .attr('x2', (d) => x(d.interval![end]))
      .attr('y1', (d) => mid(rowOf(d)) - y.bandwidth() / 3)
      .attr('y2', (d) => mid(rowOf(d)) + y.bandwidth() / 3)
      .attr('stroke', p.fg)
      .attr('stroke-width', 1.2);
  g.append('text')
    .attr('x', margin.left - 6)
    .attr('y', (_d, i) => y(i)! + y.bandwidth() / 2 + 3.5)
    .attr('text-anchor', 'end')
    .attr('fill', p.fg)
    .text((d) => (d.label.length > 28 ? `${d.label.slice(0, 27)}…` : d.label));
  g.append('text')
    .attr('class', 'bar-value')
    .attr('x', (d) => {
      const end =
        d.value >= 0 ? Math.max(d.value, d.interval?.[1] ?? d.value) : Math.min(d.value, d.interval?.[0] ?? d.value);
      return d.value >= 0 ? x(end) + 4 : x(end) - 4;
    })
    .attr('y', (_d, i) => y(i)! + y.bandwidth() / 2 + 3.5)
    .attr('text-anchor', (d) => (d.value >= 0 ? 'start' : 'end'))
    .attr('fill', p.muted)
    .attr('font-size', 10)
    .text((d) => fmt(d.value, 3));
}
