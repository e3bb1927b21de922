/**
 * The α-sweep charts, shared by the steering sweep (sweep) and the SAE feature sweep (sae_steer):
 * target/control/normalised metrics against the swept value, and KL from base, with the value
 * whose generation is shown marked; clicking a point shows that value.
 */
import { drawLines } from '../charts/lines';
import { fmt } from '../charts/format';

export interface SweepCurves {
  target_logprob_delta: number[];
  control_logprob_delta: number[];
  normalized_effect: number[];
  kl_from_base: number[];
}

export interface SweepChartOptions {
  alphas: number[];
  curves: SweepCurves;
  /** the value whose generation is shown (marked) */
  shown: number;
  onSelect: (alpha: number) => void;
  /** what is swept: 'α' (default), or e.g. 'clamp value' */
  xTitle?: string;
}

const METRICS = [
  ['target_logprob_delta', 'target Δ log-prob'],
  ['control_logprob_delta', 'control Δ log-prob'],
  ['normalized_effect', 'normalised effect'],
] as const;

export function drawSweepMetrics(svg: SVGSVGElement, o: SweepChartOptions): void {
  const x = o.xTitle ?? 'α';
  drawLines(svg, {
    series: METRICS.map(([k, name], i) => ({
      name,
      points: o.alphas.map((a, j) => ({ x: a, y: o.curves[k][j] })),
      dashed: i === 1,
    })),
    xTitle: x,
    yTitle: 'nats',
    label: `Target and control metrics against ${x}`,
    markX: o.shown,
    markLabel: `shown ${x} = ${fmt(o.shown, 3)}`,
    onSelectX: o.onSelect,
    zeroLine: true,
    width: 760,
    height: 320,
  });
}

export function drawSweepKl(svg: SVGSVGElement, o: SweepChartOptions): void {
  const x = o.xTitle ?? 'α';
  drawLines(svg, {
    series: [{ name: 'KL from base', points: o.alphas.map((a, j) => ({ x: a, y: o.curves.kl_from_base[j] })) }],
    xTitle: x,
    yTitle: 'KL (nats)',
    label: `KL of the steered from the base distribution against ${x}`,
    markX: o.shown,
    onSelectX: o.onSelect,
    width: 760,
    height: 220,
  });
}
