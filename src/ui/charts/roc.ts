/** ROC curve with the chance diagonal and the AUROC. */
import { scaleLinear } from 'd3';
import { chartFrame, dots, gridLines, tickLabels, axisTitle, curve } from './frame';
import { palette } from './palette';
import { showTooltip, hideTooltip } from './tooltip';
import { fmt } from './format';

export function drawRoc(
  svgEl: SVGSVGElement,
  o: { points: { fpr: number; tpr: number; threshold?: number }[]; auroc: number; label: string; size?: number },
): void {
  const p = palette();
  const size = o.size ?? 320;
  const m = { left: 48, right: 12, top: 12, bottom: 40 };
  const w = size + m.left + m.right;
  const h = size + m.top + m.bottom;
  const x = scaleLinear()
    .domain([0, 1])
    .range([m.left, m.left + size]);
  const y = scaleLinear()
    .domain([0, 1])
    .range([m.top + size, m.top]);
  const svg = chartFrame(svgEl, { width: w, height: h, label: o.label, palette: p });
  const ticks = [0, 0.25, 0.5, 0.75, 1];
  gridLines(svg, ticks, { along: 'x', at: x, from: y(0), to: y(1), stroke: () => p.grid, width: 0.5 });
  gridLines(svg, ticks, { along: 'y', at: y, from: x(0), to: x(1), stroke: () => p.grid, width: 0.5 });
  tickLabels(svg, ticks, { side: 'bottom', at: x, line: y(0) + 14, text: String, fill: p.muted });
  tickLabels(svg, ticks, { side: 'left', at: y, line: x(0) - 6, text: String, fill: p.muted });
  svg
    .append('line')
    .attr('x1', x(0))
    .attr('y1', y(0))
    .attr('x2', x(1))
    .attr('y2', y(1))
    .attr('stroke', p.muted)
    .attr('stroke-dasharray', '4 4');
  const pts = [...o.points].sort((a, b) => a.fpr - b.fpr || a.tpr - b.tpr);
  const xy = pts.map((d): [number, number] => [x(d.fpr), y(d.tpr)]);
  curve(svg, xy).attr('class', 'roc-curve').attr('stroke', p.accent).attr('stroke-width', 2.2);
  dots(svg, pts, 'point')
    .attr('cx', (d) => x(d.fpr))
    .attr('cy', (d) => y(d.tpr))
    .attr('r', 3)
    .attr('fill', p.accent)
    .on('mousemove', (ev: MouseEvent, d) =>
      showTooltip(ev, [
        'ROC point',
        `FPR ${fmt(d.fpr, 3)}`,
        `TPR ${fmt(d.tpr, 3)}`,
        ...(d.threshold !== undefined ? [`threshold ${fmt(d.threshold, 4)}`] : []),
      ]),
    )
    .on('mouseleave', hideTooltip);
  svg
    .append('text')
    .attr('x', x(0.55))
    .attr('y', y(0.12))
    .attr('fill', p.fg)
    .attr('font-size', 14)
    .attr('font-weight', 700)
    .attr('class', 'auroc-label')
    .text(`AUROC ${fmt(o.auroc, 3)}`);
  axisTitle(svg, { side: 'bottom', x: x(0.5), y: h - 6, text: 'false positive rate', fill: p.muted });
  axisTitle(svg, { side: 'left', y: y(0.5), text: 'true positive rate', fill: p.muted });
}
