/** The SVG every chart draws into. */
import { select, type ScaleLinear, type Selection } from 'd3';
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
export function chartFrame(svgEl: SVGSVGElement, o: FrameOptions): Selection<SVGSVGElement, unknown, null, undefined> {
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

/**
 * A value axis under horizontal bars: grid lines at x's ticks from `top` to `bottom` (zero drawn
 * in the foreground colour), the tick labels under them, and the axis title centred at `titleY`.
 */
export function drawValueAxis(
  svg: Selection<SVGSVGElement, unknown, null, undefined>,
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
  svg
    .append('g')
    .selectAll('line')
    .data(ticks)
    .join('line')
    .attr('x1', (t) => x(t))
    .attr('x2', (t) => x(t))
    .attr('y1', a.top)
    .attr('y2', a.bottom)
    .attr('stroke', (t) => (t === 0 ? p.fg : p.grid))
    .attr('stroke-width', (t) => (t === 0 ? 1 : 0.5));
  svg
    .append('g')
    .selectAll('text')
    .data(ticks)
    .join('text')
    .attr('x', (t) => x(t))
    .attr('y', a.bottom + 14)
    .attr('text-anchor', 'middle')
    .attr('fill', p.muted)
    .text((t) => fmt(t, 2));
  svg
    .append('text')
    .attr('x', a.titleX)
    .attr('y', a.titleY)
    .attr('text-anchor', 'middle')
    .attr('fill', p.muted)
    .text(a.title);
}
