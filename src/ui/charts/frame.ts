/** The SVG every chart draws into. */
import { line, select, type ScaleLinear, type Selection } from 'd3';
import type { Palette } from './palette';
import { fmt } from './format';

export interface FrameOptions {
  width: number;
  height: number;
  /** what the chart shows, for screen readers (aria-label) */
  label: string;
  palette: Palette;
  fontSize?: number;
  /** reachable with the keyboard (tabindex 0), for charts whose cells take focus */
  focusable?: boolean;
}

/**
 * The chart's <svg>, emptied and sized (width × height, the viewBox the same), labelled as an
 * image, in the palette's font and background: written as attributes, so an exported SVG or PNG
 * looks like the screen without the page's stylesheet.
 */
export function chartFrame(svgEl: SVGSVGElement, o: FrameOptions): ChartSvg {
  const svg = select(svgEl);
  svg.selectAll('*').remove();
  svg
    .attr('width', o.width)
    .attr('height', o.height)
    .attr('viewBox', `0 0 ${o.width} ${o.height}`)
    .attr('role', 'img')
    .attr('aria-label', o.label);
  if (o.focusable) svg.attr('tabindex', 0);
  return svg
    .attr('font-family', o.palette.font)
    .attr('font-size', o.fontSize ?? 11)
    .style('background', o.palette.bg);
}

export type ChartSvg = Selection<SVGSVGElement, unknown, null, undefined>;

/**
 * Grid lines at `ticks`: across the plot at x = `at(t)` from y = `from` to `to` (`along: 'x'`), or
 * at y = `at(t)` from x = `from` to `to` (`along: 'y'`), in one <g>.
 */
export function gridLines(
  svg: ChartSvg,
  ticks: number[],
  a: {
    along: 'x' | 'y';
    at: (t: number) => number;
    from: number;
    to: number;
    stroke: (t: number) => string;
    width: number | ((t: number) => number);
  },
): void {
  const [u, v] = a.along === 'x' ? ['x', 'y'] : ['y', 'x'];
  svg
    .append('g')
    .selectAll('line')
    .data(ticks)
    .join('line')
    .attr(`${u}1`, a.at)
    .attr(`${u}2`, a.at)
    .attr(`${v}1`, a.from)
    .attr(`${v}2`, a.to)
    .attr('stroke', a.stroke)
    .attr('stroke-width', a.width);
}

/**
 * Tick labels in one <g>: centred under the plot at x = `at(t)`, on the line y = `line` (`side: 'bottom'`),
 * or right-aligned left of it at x = `line`, level with y = `at(t)` (`side: 'left'`).
 */
export function tickLabels(
  svg: ChartSvg,
  ticks: number[],
  a: { side: 'bottom' | 'left'; at: (t: number) => number; line: number; text: (t: number) => string; fill: string },
): void {
  const bottom = a.side === 'bottom';
  svg
    .append('g')
    .selectAll('text')
    .data(ticks)
    .join('text')
    .attr('x', bottom ? a.at : a.line)
    .attr('y', bottom ? a.line : (t) => a.at(t) + 3.5)
    .attr('text-anchor', bottom ? 'middle' : 'end')
    .attr('fill', a.fill)
    .text(a.text);
}

/** An axis title centred at (x, y) (`side: 'bottom'`), or read upwards centred at y, 14 px from the left edge (`side: 'left'`). */
export function axisTitle(
  svg: ChartSvg,
  a:
    | { side: 'bottom'; x: number; y: number; text: string; fill: string }
    | { side: 'left'; y: number; text: string; fill: string },
): void {
  const t = svg.append('text');
  if (a.side === 'bottom') t.attr('x', a.x).attr('y', a.y);
  else t.attr('transform', `translate(14,${a.y}) rotate(-90)`);
  t.attr('text-anchor', 'middle').attr('fill', a.fill).text(a.text);
}

/** A line through `points` (pixel [x, y] pairs), unfilled: the caller gives it its class and stroke. */
export function curve(svg: ChartSvg, points: [number, number][]) {
  return svg
    .append('path')
    .attr('d', line()(points) ?? '')
    .attr('fill', 'none');
}

/** An unfilled 2 px outline over the cells (the selected cell, a highlighted position) that lets the pointer through to them. */
export function outline(svg: ChartSvg, tag: 'rect' | 'path', cls: string, stroke: string) {
  return svg
    .append(tag)
    .attr('class', cls)
    .attr('fill', 'none')
    .attr('stroke', stroke)
    .attr('stroke-width', 2)
    .attr('pointer-events', 'none');
}

/** One <circle class="cls"> per datum, in one <g>: the caller places and colours them. */
export function dots<T>(svg: ChartSvg, data: T[], cls: string) {
  return svg.append('g').selectAll('circle').data(data).join('circle').attr('class', cls);
}

/**
 * A value axis under horizontal bars: grid lines at x's ticks from `top` to `bottom` (zero drawn
 * in the foreground colour), the tick labels under them, and the axis title centred at `titleY`.
 */
export function drawValueAxis(
  svg: ChartSvg,
  a: {
    x: ScaleLinear<number, number>;
    top: number;
    bottom: number;
    palette: Palette;
    title: string;
    titleX: number;
    titleY: number;
  },
): void {
  const { x, palette: p } = a;
  const ticks = x.ticks(6);
  gridLines(svg, ticks, {
    along: 'x',
    at: x,
    from: a.top,
    to: a.bottom,
    stroke: (t) => (t === 0 ? p.fg : p.grid),
    width: (t) => (t === 0 ? 1 : 0.5),
  });
  tickLabels(svg, ticks, { side: 'bottom', at: x, line: a.bottom + 14, text: (t) => fmt(t, 2), fill: p.muted });
  axisTitle(svg, { side: 'bottom', x: a.titleX, y: a.titleY, text: a.title, fill: p.muted });
}
