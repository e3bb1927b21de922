/**
 * Shared pieces of the gradient operations (attribution_patching, integrated_gradients): the
 * metric M = logit[A] − logit[B] at the last position (logit[A] alone without B; lib/metric.ts
 * chooses A and B) as the backward pass's seed, and the rank correlation used to compare
 * estimates with real effects.
 */
import type { Tensor } from '../../engine/tensor';

/** ∂M/∂logits for B rows of one position: +1 at A, −1 at B. */
export function metricSeed(V: number, rows: number, answer: number, counterfactual: number | null): Tensor {
  const s = new Float32Array(rows * V);
  for (let r = 0; r < rows; r++) {
    s[r * V + answer] += 1;
    if (counterfactual !== null) s[r * V + counterfactual] -= 1;
  }
  return { dims: [rows, 1, V], data: s };
}

/** M of one row of logits */
export function metricOf(logits: ArrayLike<number>, answer: number, counterfactual: number | null, offset = 0): number {
  return logits[offset + answer] - (counterfactual !== null ? logits[offset + counterfactual] : 0);
}

/**
 * Spearman rank correlation (average ranks for ties); null for fewer than 3 pairs or a constant side.
 * Values closer than 1e-5 × max(1, max |x|) count as tied: float32 noise (sites whose patch changes
 * nothing differ by 1e-7 between backends) must not order them.
 */
export function spearman(a: number[], b: number[]): number | null {
  if (a.length < 3) return null;
  const rank = (x: number[]) => {
    const idx = x.map((v, i) => [v, i] as const).sort((p, q) => p[0] - q[0]);
    const tol = 1e-5 * Math.max(1, ...x.map(Math.abs));
    const r = new Array<number>(x.length);
    for (let i = 0; i < idx.length;) {
      let j = i;
      while (j + 1 < idx.length && idx[j + 1][0] - idx[j][0] <= tol) j++;
      for (let k = i; k <= j; k++) r[idx[k][1]] = (i + j) / 2;
      i = j + 1;
    }
    return r;
  };
  const ra = rank(a),
    rb = rank(b);
  const n = a.length;
  const ma = ra.reduce((s, v) => s + v, 0) / n,
    mb = rb.reduce((s, v) => s + v, 0) / n;
  let num = 0,
    da = 0,
    db = 0;
  for (let i = 0; i < n; i++) {
    num += (ra[i] - ma) * (rb[i] - mb);
    da += (ra[i] - ma) ** 2;
    db += (rb[i] - mb) ** 2;
  }
  return da > 0 && db > 0 ? num / Math.sqrt(da * db) : null;
}
