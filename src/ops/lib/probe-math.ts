/**
 * Linear-probe math: L2-regularised logistic regression fitted by Newton's method (deterministic:
 * no random init, no minibatches, so a document re-runs to the same numbers), AUROC, accuracy, and a
 * seeded stratified held-out split. Pure functions on Float64Arrays; no model, no engine.
 *
 * Objective (documented in the probe document too):
 *   L(w, b) = (1/n) Σ_i [ log(1 + e^{z_i}) − y_i z_i ] + (l2 / 2) ‖w‖²,   z_i = x_i·w + b
 * The intercept b is not penalised. The Hessian solve uses a (d+1)×(d+1) Cholesky when d < n and
 * the Woodbury identity on an n×n system when d ≥ n, so the cost is min(n, d)³ per iteration.
 */
import { rng } from './math';

export interface LogisticFit {
  w: Float64Array;
  b: number;
  iterations: number;
  converged: boolean;
  /** final value of the objective L */
  loss: number;
}

export interface LogisticOptions {
  /** L2 strength on w (> 0) */
  l2?: number;
  maxIter?: number;
  /** stop when the objective improves by less than this */
  tol?: number;
}

function sigmoid(z: number): number {
  return z >= 0 ? 1 / (1 + Math.exp(-z)) : Math.exp(z) / (1 + Math.exp(z));
}

/** log(1 + e^z) without overflow */
function softplus(z: number): number {
  return z > 0 ? z + Math.log1p(Math.exp(-z)) : Math.log1p(Math.exp(z));
}

/** In-place Cholesky A = L Lᵀ (lower triangle of `a`, n×n row-major). Adds jitter if A is not positive definite. */
export function cholesky(a: Float64Array, n: number): Float64Array {
  let jitter = 0;
  for (let attempt = 0; attempt < 6; attempt++) {
    const l = new Float64Array(n * n);
    let ok = true;
    for (let j = 0; j < n && ok; j++) {
      let s = a[j * n + j] + jitter;
      for (let k = 0; k < j; k++) s -= l[j * n + k] * l[j * n + k];
      if (!(s > 0)) {
        ok = false;
        break;
      }
      const d = Math.sqrt(s);
      l[j * n + j] = d;
      for (let i = j + 1; i < n; i++) {
        let t = a[i * n + j];
        for (let k = 0; k < j; k++) t -= l[i * n + k] * l[j * n + k];
        l[i * n + j] = t / d;
      }
    }
    if (ok) return l;
    let maxDiag = 0;
    for (let i = 0; i < n; i++) maxDiag = Math.max(maxDiag, Math.abs(a[i * n + i]));
    jitter = jitter === 0 ? 1e-10 * Math.max(maxDiag, 1) : jitter * 100;
  }
  throw new Error('cholesky: matrix is not positive definite');
}

/** Solve L Lᵀ x = v given the Cholesky factor L. */
export function cholSolve(l: Float64Array, n: number, v: ArrayLike<number>): Float64Array {
  const y = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    let s = v[i];
    for (let k = 0; k < i; k++) s -= l[i * n + k] * y[k];
    y[i] = s / l[i * n + i];
  }
  const x = new Float64Array(n);
  for (let i = n - 1; i >= 0; i--) {
    let s = y[i];
    for (let k = i + 1; k < n; k++) s -= l[k * n + i] * x[k];
    x[i] = s / l[i * n + i];
  }
  return x;
}

function objective(
  X: Float64Array,
  y: ArrayLike<number>,
  n: number,
  d: number,
  w: Float64Array,
  b: number,
  l2: number,
): number {
  let s = 0;
  for (let i = 0; i < n; i++) {
    let z = b;
    for (let j = 0; j < d; j++) z += X[i * d + j] * w[j];
    s += softplus(z) - y[i] * z;
  }
  let r = 0;
  for (let j = 0; j < d; j++) r += w[j] * w[j];
  return s / n + 0.5 * l2 * r;
}

/**
 * Fit logistic regression. X: n×d row-major, y: 0/1 labels.
 * Returns the weights in the basis of X (callers that standardised X convert back).
 */
export function fitLogistic(
  X: Float64Array,
  y: ArrayLike<number>,
  n: number,
  d: number,
  opts: LogisticOptions = {},
): LogisticFit {
  const l2 = opts.l2 ?? 1e-2;
  const maxIter = opts.maxIter ?? 100;
  const tol = opts.tol ?? 1e-12;
  if (!(l2 > 0)) throw new Error('fitLogistic: l2 must be > 0');
  const w = new Float64Array(d);
  // start the intercept at the log-odds of the base rate: a deterministic, sensible start
  let pos = 0;
  for (let i = 0; i < n; i++) pos += y[i];
  let b = Math.log((pos + 0.5) / (n - pos + 0.5));
  let loss = objective(X, y, n, d, w, b, l2);
  // Gram matrix for the Woodbury path, computed once
  const useWoodbury = d >= n;
  let gram: Float64Array | null = null;
  if (useWoodbury) {
    gram = new Float64Array(n * n);
    for (let i = 0; i < n; i++) {
      for (let k = 0; k <= i; k++) {
        let s = 0;
        for (let j = 0; j < d; j++) s += X[i * d + j] * X[k * d + j];
        gram[i * n + k] = s;
        gram[k * n + i] = s;
      }
    }
  }
  let converged = false;
  let it = 0;
  const p = new Float64Array(n);
  const sw = new Float64Array(n);
  for (; it < maxIter; it++) {
    // gradient and curvature weights
    const gw = new Float64Array(d);
    let gb = 0;
    for (let i = 0; i < n; i++) {
      let z = b;
      for (let j = 0; j < d; j++) z += X[i * d + j] * w[j];
      p[i] = sigmoid(z);
      sw[i] = Math.max(p[i] * (1 - p[i]), 1e-12) / n;
      const r = (p[i] - y[i]) / n;
      gb += r;
      for (let j = 0; j < d; j++) gw[j] += X[i * d + j] * r;
    }
    for (let j = 0; j < d; j++) gw[j] += l2 * w[j];

    let dw: Float64Array;
    let db: number;
    if (!useWoodbury) {
      // full (d+1)×(d+1) Hessian, last row/column for the intercept
      const m = d + 1;
      const H = new Float64Array(m * m);
      for (let i = 0; i < n; i++) {
        const s = sw[i];
        const row = i * d;
        for (let a = 0; a < d; a++) {
          const xa = X[row + a] * s;
          if (xa === 0) continue;
          for (let c = 0; c <= a; c++) H[a * m + c] += xa * X[row + c];
          H[d * m + a] += xa;
        }
        H[d * m + d] += s;
      }
      for (let a = 0; a < d; a++) {
        for (let c = 0; c < a; c++) H[c * m + a] = H[a * m + c];
        H[a * m + d] = H[d * m + a];
        H[a * m + a] += l2;
      }
      const L = cholesky(H, m);
      const g = new Float64Array(m);
      g.set(gw);
      g[d] = gb;
      const step = cholSolve(L, m, g);
      dw = step.subarray(0, d);
      db = step[d];
    } else {
      // A = l2 I + Xsᵀ Xs with Xs = diag(√sw) X;  A⁻¹v = (v − Xsᵀ (l2 I + Xs Xsᵀ)⁻¹ Xs v) / l2
      const rs = new Float64Array(n);
      for (let i = 0; i < n; i++) rs[i] = Math.sqrt(sw[i]);
      const M = new Float64Array(n * n);
      for (let i = 0; i < n; i++) {
        for (let k = 0; k < n; k++) M[i * n + k] = rs[i] * gram![i * n + k] * rs[k];
        M[i * n + i] += l2;
      }
      const L = cholesky(M, n);
      const ainv = (v: Float64Array): Float64Array => {
        const xv = new Float64Array(n);
        for (let i = 0; i < n; i++) {
          let s = 0;
          for (let j = 0; j < d; j++) s += X[i * d + j] * v[j];
          xv[i] = rs[i] * s;
        }
        const t = cholSolve(L, n, xv);
        const out = new Float64Array(d);
        for (let j = 0; j < d; j++) out[j] = v[j];
        for (let i = 0; i < n; i++) {
          const c = rs[i] * t[i];
          for (let j = 0; j < d; j++) out[j] -= X[i * d + j] * c;
        }
        for (let j = 0; j < d; j++) out[j] /= l2;
        return out;
      };
      // Schur complement for the intercept: u = Xᵀ sw, c = Σ sw
      const u = new Float64Array(d);
      let c = 0;
      for (let i = 0; i < n; i++) {
        c += sw[i];
        for (let j = 0; j < d; j++) u[j] += X[i * d + j] * sw[i];
      }
      const aG = ainv(gw);
      const aU = ainv(u);
      let uaG = 0;
      let uaU = 0;
      for (let j = 0; j < d; j++) {
        uaG += u[j] * aG[j];
        uaU += u[j] * aU[j];
      }
      db = (gb - uaG) / Math.max(c - uaU, 1e-300);
      dw = new Float64Array(d);
      for (let j = 0; j < d; j++) dw[j] = aG[j] - aU[j] * db;
    }
    // backtracking line search on the objective (Newton can overshoot far from the optimum)
    let t = 1;
    let next = Infinity;
    const wNew = new Float64Array(d);
    let bNew = b;
    for (let ls = 0; ls < 30; ls++) {
      for (let j = 0; j < d; j++) wNew[j] = w[j] - t * dw[j];
      bNew = b - t * db;
      next = objective(X, y, n, d, wNew, bNew, l2);
      if (next <= loss) break;
      t /= 2;
    }
    if (!(next <= loss)) {
      converged = true;
      break;
    } // no descent possible: at the optimum to float precision
    const improvement = loss - next;
    w.set(wNew);
    b = bNew;
    loss = next;
    if (improvement < tol) {
      converged = true;
      it++;
      break;
    }
  }
  return { w, b, iterations: it, converged, loss };
}

/** Area under the ROC curve (Mann–Whitney U, ties count one half). NaN when a class is absent. */
export function auroc(scores: ArrayLike<number>, labels: ArrayLike<number>): number {
  const n = scores.length;
  const idx = Array.from({ length: n }, (_, i) => i).sort((a, b) => scores[a] - scores[b]);
  // average ranks over ties
  const rank = new Float64Array(n);
  for (let i = 0; i < n;) {
    let j = i;
    while (j + 1 < n && scores[idx[j + 1]] === scores[idx[i]]) j++;
    const r = (i + j) / 2 + 1;
    for (let k = i; k <= j; k++) rank[idx[k]] = r;
    i = j + 1;
  }
  let nPos = 0;
  let sumPos = 0;
  for (let i = 0; i < n; i++)
    if (labels[i] === 1) {
      nPos++;
      sumPos += rank[i];
    }
  const nNeg = n - nPos;
  if (nPos === 0 || nNeg === 0) return NaN;
  return (sumPos - (nPos * (nPos + 1)) / 2) / (nPos * nNeg);
}

/** fraction correct at probability threshold 0.5 (score = P(label 1)) */
export function accuracy(probs: ArrayLike<number>, labels: ArrayLike<number>): number {
  if (probs.length === 0) return NaN;
  let ok = 0;
  for (let i = 0; i < probs.length; i++) if ((probs[i] >= 0.5 ? 1 : 0) === labels[i]) ok++;
  return ok / probs.length;
}

/** Fisher–Yates with a seeded generator */
export function shuffled<T>(xs: readonly T[], seed: number): T[] {
  const out = xs.slice();
  const u = rng(seed);
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(u() * (i + 1));
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}

/**
 * Seeded stratified split: each class contributes round(n_c × testFraction) samples to the test
 * set, clamped to [1, n_c − 1] so both splits see both classes. Needs ≥ 2 samples per class.
 */
export function stratifiedSplit(
  labels: readonly number[],
  testFraction: number,
  seed: number,
): { train: number[]; test: number[] } {
  const train: number[] = [];
  const test: number[] = [];
  for (const cls of [0, 1]) {
    const members = labels.map((l, i) => (l === cls ? i : -1)).filter((i) => i >= 0);
    if (members.length < 2) throw new Error(`class ${cls} has ${members.length} sample(s); at least 2 are needed`);
    const order = shuffled(members, seed * 2 + cls + 1);
    const k = Math.min(members.length - 1, Math.max(1, Math.round(members.length * testFraction)));
    test.push(...order.slice(0, k));
    train.push(...order.slice(k));
  }
  train.sort((a, b) => a - b);
  test.sort((a, b) => a - b);
  return { train, test };
}

/** per-feature mean and standard deviation over the chosen rows (sd floored so constant features get weight 0) */
export function featureStats(
  X: Float64Array | Float32Array,
  d: number,
  rows: readonly number[],
): { mean: Float64Array; sd: Float64Array } {
  const mean = new Float64Array(d);
  const sd = new Float64Array(d);
  for (const i of rows) for (let j = 0; j < d; j++) mean[j] += X[i * d + j];
  for (let j = 0; j < d; j++) mean[j] /= rows.length;
  for (const i of rows)
    for (let j = 0; j < d; j++) {
      const t = X[i * d + j] - mean[j];
      sd[j] += t * t;
    }
  for (let j = 0; j < d; j++) {
    const s = Math.sqrt(sd[j] / rows.length);
    sd[j] = s > 1e-8 ? s : Infinity; // 1/∞ = 0: a constant feature contributes nothing
  }
  return { mean, sd };
}
