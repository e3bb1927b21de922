/**
 * The few tensor helpers the library's examples need, over the engine's own dense row-major
 * `Tensor` ({dims, data: Float32Array}): indexing and slicing along leading axes, a 2-D matrix
 * product and Frobenius norms accumulated in float64, and small reductions. No tensor library:
 * what a researcher writes on top is loops over `data`, and these keep those loops short.
 */
import { LoupeError } from '../engine/errors';
import { numel, type Tensor } from '../engine/tensor';

export type { Tensor } from '../engine/tensor';

const bad = (msg: string, hint?: string) => new LoupeError('BAD_INPUT', msg, hint);

/** a tensor of `dims` from a flat array (copied to float32) or filled with zeros */
export function tensor(dims: number[], data?: ArrayLike<number>): Tensor {
  const n = numel(dims);
  if (data && data.length !== n) throw bad(`${data.length} values do not fill a tensor of shape [${dims}] (${n}).`);
  return { dims: [...dims], data: data ? Float32Array.from(data) : new Float32Array(n) };
}

function strides(dims: number[]): number[] {
  const s = new Array<number>(dims.length);
  let acc = 1;
  for (let a = dims.length - 1; a >= 0; a--) {
    s[a] = acc;
    acc *= dims[a];
  }
  return s;
}

function checkIndex(t: Tensor, axis: number, i: number): number {
  const n = t.dims[axis];
  const j = i < 0 ? n + i : i;
  if (!Number.isInteger(j) || j < 0 || j >= n)
    throw bad(`index ${i} is out of range for axis ${axis} of a tensor of shape [${t.dims}].`);
  return j;
}

/**
 * `t[i0, i1, …]` for leading indices (negative counts from the end): a number when every axis is
 * indexed, else the sub-tensor (a view into `t.data`: writing to it writes to `t`)
 */
export function at(t: Tensor, ...idx: number[]): Tensor {
  if (idx.length > t.dims.length) throw bad(`${idx.length} indices for a tensor of shape [${t.dims}].`);
  const s = strides(t.dims);
  let off = 0;
  idx.forEach((i, a) => (off += checkIndex(t, a, i) * s[a]));
  const dims = t.dims.slice(idx.length);
  return { dims, data: t.data.subarray(off, off + numel(dims)) };
}

/** the single value at a full index */
export function item(t: Tensor, ...idx: number[]): number {
  if (idx.length !== t.dims.length) throw bad(`item needs ${t.dims.length} indices for shape [${t.dims}].`);
  return at(t, ...idx).data[0];
}

/** `t` with index `i` taken along `axis` (that axis removed; a copy): heads of hook_z, positions of a cache entry */
export function select(t: Tensor, axis: number, i: number): Tensor {
  if (axis < 0) axis += t.dims.length;
  if (axis < 0 || axis >= t.dims.length) throw bad(`axis ${axis} is out of range for shape [${t.dims}].`);
  const j = checkIndex(t, axis, i);
  const outer = numel(t.dims.slice(0, axis));
  const inner = numel(t.dims.slice(axis + 1));
  const out = new Float32Array(outer * inner);
  for (let o = 0; o < outer; o++)
    out.set(t.data.subarray((o * t.dims[axis] + j) * inner, (o * t.dims[axis] + j + 1) * inner), o * inner);
  return { dims: t.dims.filter((_, a) => a !== axis), data: out };
}

/** 2-D matrix product a [n, k] · b [k, m] → [n, m], each sum in float64 */
export function matmul(a: Tensor, b: Tensor): Tensor {
  if (a.dims.length !== 2 || b.dims.length !== 2 || a.dims[1] !== b.dims[0])
    throw bad(`matmul needs [n, k] · [k, m]; got [${a.dims}] · [${b.dims}].`);
  const [n, k] = a.dims;
  const m = b.dims[1];
  const out = new Float32Array(n * m);
  const row = new Float64Array(m);
  for (let i = 0; i < n; i++) {
    row.fill(0);
    for (let p = 0; p < k; p++) {
      const x = a.data[i * k + p];
      if (x === 0) continue;
      const off = p * m;
      for (let j = 0; j < m; j++) row[j] += x * b.data[off + j];
    }
    out.set(row, i * m);
  }
  return { dims: [n, m], data: out };
}

/** the 2-D transpose */
export function transpose(t: Tensor): Tensor {
  if (t.dims.length !== 2) throw bad(`transpose takes a matrix; got shape [${t.dims}].`);
  const [n, m] = t.dims;
  const out = new Float32Array(n * m);
  for (let i = 0; i < n; i++) for (let j = 0; j < m; j++) out[j * n + i] = t.data[i * m + j];
  return { dims: [m, n], data: out };
}

/** the Frobenius (L2) norm of all entries, in float64 */
export function norm(t: Tensor | ArrayLike<number>): number {
  const d = 'data' in t ? t.data : t;
  let s = 0;
  for (let i = 0; i < d.length; i++) s += d[i] * d[i];
  return Math.sqrt(s);
}

/** the mean of all entries, in float64 */
export function mean(t: Tensor | ArrayLike<number>): number {
  const d = 'data' in t ? t.data : t;
  let s = 0;
  for (let i = 0; i < d.length; i++) s += d[i];
  return s / d.length;
}

/** the flat index of the largest entry (first on ties) */
export function argmax(t: Tensor | ArrayLike<number>): number {
  const d = 'data' in t ? t.data : t;
  let best = 0;
  for (let i = 1; i < d.length; i++) if (d[i] > d[best]) best = i;
  return best;
}

/** a copy with its own buffer */
export function clone(t: Tensor): Tensor {
  return { dims: [...t.dims], data: t.data.slice() };
}

/** entry-wise f(x) into a new tensor */
export function map(t: Tensor, f: (x: number, i: number) => number): Tensor {
  const out = new Float32Array(t.data.length);
  for (let i = 0; i < out.length; i++) out[i] = f(t.data[i], i);
  return { dims: [...t.dims], data: out };
}
