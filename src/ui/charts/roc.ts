/** ROC curve with the chance diagonal and the AUROC. */
import { scaleLinear, line } from 'd3';
import { chartFrame } from './frame';
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
  for (const t of [0, 0.25, 0.5, 0.75, 1]) {
    svg
      .append('line')
      .attr('x1', x(t))
      .attr('x2', x(t))
      .attr('y1', y(0))
      .attr('y2', y(1))
      .attr('stroke', p.grid)
      .attr('stroke-width', 0.5);
    svg
      .append('line')
      .attr('x1', x(0))
      .attr('x2', x(1))
      .attr('y1', y(t))
      .attr('y2', y(t))
      .attr('stroke', p.grid)
      .attr('stroke-width', 0.5);
    svg
      .append('text')
      .attr('x', x(t))
      .attr('y', y(0) + 14)
      .attr('text-anchor', 'middle')
      .attr('fill', p.muted)
      .text(String(t));
    svg
      .append('text')
      .attr('x', x(0) - 6)
      .attr('y', y(t) + 3.5)
      .attr('text-anchor', 'end')
      .attr('fill', p.muted)
      .text(String(t));
  }
  svg
    .append('line')
    .attr('x1', x(0))
    .attr('y1', y(0))
    .attr('x2', x(1))
    .attr('y2', y(1))
    .attr('stroke', p.muted)
    .attr('stroke-dasharray', '4 4');
  const pts = [...o.points].sort((a, b) => a.fpr - b.fpr || a.tpr - b.tpr);
  svg
    .append('path')
    .attr('class', 'roc-curve')
    .attr(
      'd',
      line<{ fpr: number; tpr: number }>()
        .x((d) => x(d.fpr))
        .y((d) => y(d.tpr))(pts) ?? '',
    )
    .attr('fill', 'none')
    .attr('stroke', p.accent)
    .attr('stroke-width', 2.2);
  svg
    .append('g')
    .selectAll('circle')
    .data(pts)
    .join('circle')
    .attr('class', 'point')
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
  svg
    .append('text')
    .attr('x', x(0.5))
    .attr('y', h - 6)
    .attr('text-anchor', 'middle')
    .attr('fill', p.muted)
    .text('false positive rate');
  svg
    .append('text')
    .attr('transform', `translate(14,${y(0.5)}) rotate(-90)`)
    .attr('text-anchor', 'middle')
    .attr('fill', p.muted)
    .text('true positive rate');
}
