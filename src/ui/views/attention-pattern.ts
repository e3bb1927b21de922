/** One head's attention pattern as a heatmap: what the attention view and the head panel draw alike. */
import type { HeatmapOptions } from '../charts/heatmap';
import { fmt } from '../charts/format';

/** The heatmap of `p` over the prompt's token labels, query by key; the caller adds its cell size, width and selection. */
export function patternHeatmap(
  p: { layer: number; head: number; pattern: number[][] },
  labels: string[],
): Omit<HeatmapOptions, 'cell' | 'maxWidth'> {
  return {
    values: p.pattern,
    rowLabels: labels.map((l, i) => `${i} ${l}`),
    colLabels: labels,
    rowTitle: 'destination (query)',
    colTitle: 'source (key)',
    kind: 'sequential',
    domain: [0, 1],
    legendLabel: 'attention',
    label: `Attention pattern of L${p.layer}H${p.head}`,
    tooltip: (q, k, v) => [`L${p.layer}H${p.head}`, `${labels[q]} (${q}) → ${labels[k]} (${k})`, `weight ${fmt(v, 5)}`],
    posOf: (_q, k) => k,
  };
}
