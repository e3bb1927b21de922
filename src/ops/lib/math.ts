/** Small numeric helpers shared by the operations (float64 accumulation on float32 data). */

export function logSumExp(x: ArrayLike<number>, start = 0, n = x.length - start): number {
  let m = -Infinity;
  for (let i = 0; i < n; i++) m = Math.max(m, x[start + i]);
  if (m === -Infinity) return -Infinity;
  let s = 0;
  for (let i = 0; i < n; i++) s += Math.exp(x[start + i] - m);
  return m + Math.log(s);
}

/** log-softmax of a row of length n starting at `start` */
export function logSoftmax(x: ArrayLike<number>, start = 0, n = x.length - start): Float64Array {
  const lse = logSumExp(x, start, n);
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) out[i] = x[start + i] - lse;
  return out;
}

export function softmax(x: ArrayLike<number>, start = 0, n = x.length - start): Float64Array {
  const l = logSoftmax(x, start, n);
  for (let i = 0; i < n; i++) l[i] = Math.exp(l[i]);
  return l;
}

export function argmax(x: ArrayLike<number>, start = 0, n = x.length - start): number {
  let best = 0;
  let bv = -Infinity;
  for (let i = 0; i < n; i++)
    if (x[start + i] > bv) {
      bv = x[start + i];
      best = i;
    }
  return best;
}

/** indices of the k largest values (descending) */
/** indices (relative to start) of the k largest values, largest first, ties lower index first */
export function topK(x: ArrayLike<number>, k: number, start = 0, n = x.length - start): number[] {
  return topIndices(n, (i) => x[start + i], k);
}

/**
 * The indices i < n of the k largest score(i), largest first, ties lower index first (as a stable
 * sort). Small k (the usual top-10 of a vocabulary or of every neuron): one pass keeping the best
 * k in order, instead of sorting all n.
 */
export function topIndices(n: number, score: (i: number) => number, k: number): number[] {
  if (k <= 0) return [];
  if (k > 64) {
    const s = Float64Array.from({ length: n }, (_, i) => score(i));
    const idx = Array.from({ length: n }, (_, i) => i);
    idx.sort((a, b) => s[b] - s[a]);
    return idx.slice(0, Math.min(k, n));
  }
  const top: number[] = [];
  const val: number[] = [];
  for (let i = 0; i < n; i++) {
    const v = score(i);
    if (top.length === k && !(v > val[k - 1])) continue;
    let j = top.length === k ? k - 1 : top.length;
    while (j > 0 && v > val[j - 1]) {
      top[j] = top[j - 1];
      val[j] = val[j - 1];
      j--;
    }
    top[j] = i;
    val[j] = v;
  }
  return top;
}

/** KL(p || q) from two log-prob rows */
export function klDivergence(logP: ArrayLike<number>, logQ: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < logP.length; i++) {
    const p = Math.exp(logP[i]);
    if (p > 0) s += p * (logP[i] - logQ[i]);
  }
  return s;
}

export function dot(a: ArrayLike<number>, b: ArrayLike<number>, aStart = 0, bStart = 0, n = a.length - aStart): number {
  let s = 0;
  for (let i = 0; i < n; i++) s += a[aStart + i] * b[bStart + i];
  return s;
}

export function norm(a: ArrayLike<number>, start = 0, n = a.length - start): number {
  return Math.sqrt(dot(a, a, start, start, n));
}

export function mean(a: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i];
  return a.length ? s / a.length : 0;
}

/** seeded PRNG (mulberry32) so that random baselines and sampling are reproducible from a document */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** standard normal from a uniform generator (Box–Muller) */
export function gaussian(u: () => number): number {
  const a = Math.max(u(), 1e-12);
  return Math.sqrt(-2 * Math.log(a)) * Math.cos(2 * Math.PI * u());
}
