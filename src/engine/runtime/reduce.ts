/**
 * Reductions of a run's outputs, each defined once as a small weightless ONNX graph and run in a
 * helper session beside the model's (SessionFactory.helper): on the device, fed the outputs the
 * session kept there, where it keeps them (WebGPU in Node), so only the reduced numbers are read
 * back; else on the host provider, fed the outputs already in JS memory. One definition for every
 * backend, so the numbers do not depend on where the reduction ran.
 *
 * logit rows (RunOptions.reduceLogits): each row of the logits [B, P, V] → its logits at K token
 * ids, its log-normaliser, its argmax and largest logit, and, given a reference row of
 * log-probabilities, KL(reference ‖ row). A scan of many variants that reads a metric (a logit
 * difference, the answer's log-prob, KL from the clean run) reads 4·(K + 3) bytes a row instead of 4·V.
 *
 * attribution products (RunOptions.attribution): Σ (against − value) · ∂M/∂value per hook over
 * every axis but one (AtP's estimates per head, per position, per neuron), or Σ against · ∂M/∂value
 * with `against` a fixed direction broadcast over the batch (integrated gradients: x − x' against
 * each step's gradient, the steps' weights in the seed); float64 on the host.
 *
 * hook statistics (RunOptions.hookStats): each hook → mean, population std, min, max, the first
 * argmax and the L2 norm at each position. On the host in float64 (hostStats, which the CPU
 * paths keep: exact to the float32 values); on the device the same statistics in float32
 * (statsGraph: a two-pass variance), since a float64 sum there would cost a second copy of the values.
 */
import type { HookStats, LogitReduce, LogitRow } from '../api';
import type { Tensor } from '../tensor';
import { OnnxGraph } from '../graph/onnx-builder';
import type { OrtModule, OrtTensorLike } from './ort-session';

/** the helper graph's outputs, in this order */
const LOGIT_OUTPUTS = ['at', 'logsumexp', 'top', 'top_logit'];

/** which helper a logit reduction needs (one graph each) */
export const logitReduceKey = (r: LogitReduce): string => (r.ref ? 'logit-rows+kl' : 'logit-rows');

/**
 *   at        [N, K]  logits[n, ids[k]]  (N = B·P rows)
 *   logsumexp [N]     log Σ_v exp(logit_v), max-shifted
 *   top       [N]     argmax (int64, first on ties), top_logit [N] its logit
 *   kl        [N]     Σ_v exp(ref_v)·(ref_v − (logit_v − logsumexp)), with input ref [V] (log-probs)
 */
export function logitReduceGraph(withRef: boolean): Uint8Array {
  const g = new OnnxGraph(() => '');
  const x = g.o('Flatten', [g.input('logits', 'float', ['B', 'P', 'V'])], { axis: 2 }); // [N, V]
  g.rename(g.o('Gather', [x, g.input('ids', 'int64', ['K'])], { axis: 1 }), 'at');
  g.output('at');
  const max = g.o('ReduceMax', [x], { axes: [1], keepdims: 1 }); // [N, 1]
  const sum = g.o('ReduceSum', [g.o('Exp', [g.o('Sub', [x, max])]), g.constI([1])], { keepdims: 1 });
  const lse = g.o('Add', [max, g.o('Log', [sum])]); // [N, 1]
  g.rename(g.o('Squeeze', [lse, g.constI([1])]), 'logsumexp');
  g.output('logsumexp');
  g.rename(g.o('ArgMax', [x], { axis: 1, keepdims: 0 }), 'top');
  g.output('top', 'int64');
  g.rename(g.o('Squeeze', [max, g.constI([1])]), 'top_logit');
  g.output('top_logit');
  if (withRef) {
    const ref = g.input('ref', 'float', ['V']);
    const diff = g.o('Sub', [ref, g.o('Sub', [x, lse])]); // ref − log-probs of the row
    g.rename(g.o('ReduceSum', [g.o('Mul', [g.o('Exp', [ref]), diff]), g.constI([1])], { keepdims: 0 }), 'kl');
    g.output('kl');
  }
  return g.encode();
}

/** the helper's feeds besides the logits */
export function logitReduceFeeds(ort: OrtModule, r: LogitReduce): Record<string, OrtTensorLike> {
  const feeds: Record<string, OrtTensorLike> = {
    ids: new ort.Tensor('int64', BigInt64Array.from(r.ids, BigInt), [r.ids.length]),
  };
  if (r.ref) feeds.ref = new ort.Tensor('float32', r.ref, [r.ref.length]);
  return feeds;
}

export const logitReduceFetches = (r: LogitReduce): string[] => (r.ref ? [...LOGIT_OUTPUTS, 'kl'] : LOGIT_OUTPUTS);

/** the helper's outputs as one LogitRow per logits row */
export function logitRows(out: Record<string, OrtTensorLike>, K: number): LogitRow[] {
  const at = out.at.data as Float32Array;
  const lse = out.logsumexp.data as Float32Array;
  const top = out.top.data as BigInt64Array;
  const topLogit = out.top_logit.data as Float32Array;
  const kl = out.kl?.data as Float32Array | undefined;
  return Array.from(lse, (l, n) => ({
    at: at.slice(n * K, (n + 1) * K),
    logsumexp: l,
    top: Number(top[n]),
    topLogit: topLogit[n],
    ...(kl ? { kl: kl[n] } : {}),
  }));
}

/** one hook's attribution products to reduce: its rank, the axis kept (null: none), whether the value is subtracted */
export interface AttributionSpec {
  rank: number;
  keep: number | null;
  subtract: boolean;
}

export const attributionKey = (specs: AttributionSpec[]): string =>
  'atp:' + specs.map((x) => `${x.rank}@${x.keep ?? '-'}${x.subtract ? '' : '*'}`).join(',');

/**
 * inputs c{i} (against), v{i} (value; not with subtract false), g{i} (gradient); r{i} = Σ (c − v) · g
 * (subtract false: Σ c · g, c broadcast over g's batch) over every axis but keep ([1] for none)
 */
export function attributionGraph(specs: AttributionSpec[]): Uint8Array {
  const g = new OnnxGraph(() => '');
  specs.forEach((sp, i) => {
    const dims = Array.from({ length: sp.rank }, (_, k) => `d${i}_${k}`);
    const gr = g.input(`g${i}`, 'float', dims);
    const c = g.input(`c${i}`, 'float', sp.subtract ? dims : ['c0', ...dims.slice(1)]);
    const dir = sp.subtract ? g.o('Sub', [c, g.input(`v${i}`, 'float', dims)]) : c;
    const axes = Array.from({ length: sp.rank }, (_, k) => k).filter((k) => k !== sp.keep);
    const sum = g.o('ReduceSum', [g.o('Mul', [dir, gr]), g.constI(axes)], { keepdims: 0 });
    g.rename(sp.keep === null ? g.o('Reshape', [sum, g.constI([1])]) : sum, `r${i}`);
    g.output(`r${i}`);
  });
  return g.encode();
}

/** The same products in JS memory, in float64 (v null: subtract false, c repeated over g's batch). */
export function hostAttribution(c: Tensor, v: Tensor | null, g: Tensor, keep: number | null): Float64Array {
  const dims = g.dims;
  const n = keep === null ? 1 : dims[keep];
  const inner = keep === null ? 1 : dims.slice(keep + 1).reduce((a, b) => a * b, 1);
  const out = new Float64Array(n);
  const cd = c.data,
    gd = g.data,
    C = cd.length;
  const at = (i: number) => (keep === null ? 0 : Math.floor(i / inner) % n);
  if (v) for (let i = 0; i < gd.length; i++) out[at(i)] += (cd[i] - v.data[i]) * gd[i];
  else for (let i = 0; i < gd.length; i++) out[at(i)] += cd[i % C] * gd[i];
  return out;
}

/** one hook to reduce to statistics: its rank and position axis */
export interface StatsSpec {
  rank: number;
  posAxis: number;
}

export const statsKey = (specs: StatsSpec[]): string => 'stats:' + specs.map((x) => `${x.rank}@${x.posAxis}`).join(',');

/**
 * inputs x0… (float, each with its rank); per input i, over every element:
 *   s{i} [4]  mean, population std (around the mean: two passes), min, max
 *   a{i} [1]  the flat index of the first largest element (int64)
 *   n{i} [T]  the L2 norm of everything at each position of its position axis
 */
export function statsGraph(specs: StatsSpec[]): Uint8Array {
  const g = new OnnxGraph(() => '');
  const one = (x: string) => g.o('Reshape', [x, g.constI([1])]);
  specs.forEach((sp, i) => {
    const x = g.input(
      `x${i}`,
      'float',
      Array.from({ length: sp.rank }, (_, k) => `d${i}_${k}`),
    );
    const mean = g.o('ReduceMean', [x], { keepdims: 1 });
    const d = g.o('Sub', [x, mean]);
    const std = g.o('Sqrt', [g.o('ReduceMean', [g.o('Mul', [d, d])], { keepdims: 0 })]);
    const mn = g.o('ReduceMin', [x], { keepdims: 0 });
    const mx = g.o('ReduceMax', [x], { keepdims: 0 });
    g.rename(g.o('Concat', [one(mean), one(std), one(mn), one(mx)], { axis: 0 }), `s${i}`);
    g.output(`s${i}`);
    const flat = g.o('Reshape', [x, g.constI([-1])]);
    g.rename(g.o('ArgMax', [flat], { axis: 0, keepdims: 1 }), `a${i}`);
    g.output(`a${i}`, 'int64');
    const others = Array.from({ length: sp.rank }, (_, k) => k).filter((k) => k !== sp.posAxis);
    const sq = g.o('ReduceSum', [g.o('Mul', [x, x]), g.constI(others)], { keepdims: 0 });
    g.rename(g.o('Sqrt', [sq]), `n${i}`);
    g.output(`n${i}`);
  });
  return g.encode();
}

export const statsFetches = (n: number): string[] =>
  Array.from({ length: n }, (_, i) => [`s${i}`, `a${i}`, `n${i}`]).flat();

/** the helper's outputs for input i, with the hook's shape */
export function statsOf(out: Record<string, OrtTensorLike>, i: number, shape: readonly number[]): HookStats {
  const s = out[`s${i}`].data as Float32Array;
  return {
    shape: [...shape],
    mean: s[0],
    std: s[1],
    min: s[2],
    max: s[3],
    argmax: Number((out[`a${i}`].data as BigInt64Array)[0]),
    norms: Array.from(out[`n${i}`].data as Float32Array),
  };
}

/** The same statistics of a hook in JS memory, accumulated in float64 in one pass. */
export function hostStats(t: Tensor, posAxis: number): HookStats {
  const dims = t.dims;
  const T = dims[posAxis];
  const x = t.data;
  const n = x.length;
  // the row-major layout as [outer, T, inner] around the position axis: one pass over every element
  // gives the sum, extremes and per-position sums of squares (no index arithmetic per element).
  // Four elements a step with their own accumulators, so the additions do not wait on each other,
  // and the extremes kept per row, the argmax found by rescanning only a row that raised the
  // maximum, rather than one accumulator and a test per element
  const inner = dims.slice(posAxis + 1).reduce((a, b) => a * b, 1);
  const outer = n / (T * inner);
  let s = 0,
    mn = Infinity,
    mx = -Infinity,
    arg = 0;
  const norms = new Float64Array(T);
  for (let o = 0, i = 0; o < outer; o++) {
    for (let p = 0; p < T; p++) {
      let s0 = 0,
        s1 = 0,
        s2 = 0,
        s3 = 0,
        q0 = 0,
        q1 = 0,
        q2 = 0,
        q3 = 0;
      let lo = Infinity,
        hi = -Infinity;
      const start = i,
        end = i + inner;
      for (const end4 = i + (inner & ~3); i < end4; i += 4) {
        const v0 = x[i],
          v1 = x[i + 1],
          v2 = x[i + 2],
          v3 = x[i + 3];
        s0 += v0;
        s1 += v1;
        s2 += v2;
        s3 += v3;
        q0 += v0 * v0;
        q1 += v1 * v1;
        q2 += v2 * v2;
        q3 += v3 * v3;
        const a = v0 < v1 ? v0 : v1,
          b = v2 < v3 ? v2 : v3,
          m = a < b ? a : b;
        if (m < lo) lo = m;
        const c = v0 > v1 ? v0 : v1,
          d = v2 > v3 ? v2 : v3,
          M = c > d ? c : d;
        if (M > hi) hi = M;
      }
      for (; i < end; i++) {
        const v = x[i];
        s0 += v;
        q0 += v * v;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      }
      s += s0 + s1 + (s2 + s3);
      norms[p] += q0 + q1 + (q2 + q3);
      if (lo < mn) mn = lo;
      // strictly larger than every earlier row's, and the first such element of this row: argmax
      // is the first largest element
      if (hi > mx) {
        mx = hi;
        for (let j = start; j < end; j++)
          if (x[j] === hi) {
            arg = j;
            break;
          }
      }
    }
  }
  const mean = s / n;
  // the variance from the same pass, Σx²/n − mean², in float64: its relative error is about
  // n·2⁻⁵³·(1 + mean²/var) at worst, below float32's own unless the values sit on an offset large
  // against their spread; then (mean² > 1000·var) a second pass around the mean is taken instead
  let sumSq = 0;
  for (let p = 0; p < T; p++) sumSq += norms[p];
  let variance = Math.max(0, sumSq / n - mean * mean);
  if (mean * mean > 1000 * variance) {
    let ss = 0;
    for (let i = 0; i < n; i++) {
      const d = x[i] - mean;
      ss += d * d;
    }
    variance = ss / n;
  }
  return {
    shape: [...dims],
    mean,
    std: Math.sqrt(variance),
    min: mn,
    max: mx,
    argmax: arg,
    norms: Array.from(norms, Math.sqrt),
  };
}
