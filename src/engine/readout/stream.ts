/**
 * DLA's readout products with W_O and W_out (WeightProducts attnX, mlpX, attnDir, mlpDir; the
 * unembedding's are unembed.ts) computed in JavaScript straight from
 * the weight bytes, streamed: each matrix is read a slab of rows at a time in its stored layout
 * and precision (F32, F16, BF16, q8), decoded to the float32 values the sessions use, multiplied
 * into float64 accumulators and dropped. No session and no kept copy: the readout session this
 * replaces held W_O and W_out a second time (a second mapping of the file pages and its own arena
 * on onnxruntime-node, folded float32 copies at f32, a real second copy in the WASM heap). Which
 * of the two runs is chosen once per model (choose.ts); both give the same numbers within
 * float32 rounding (tests/engine-weight-products.test.ts, against float64 products).
 *
 * A stored matrix S is [R, C]: [in, out] for GPT-2's Conv1D ('in_out'), [out, in] for a torch
 * Linear ('out_in'). The products are of two kinds over its rows:
 *   row dots    y[r] = Σ_c S[r, c] v[c]          (x·W on out_in, W·e on in_out)
 *   row sums    y[c] = Σ_r u[r] S[r, c]          (x·W on in_out, W·e on out_in)
 * and one pass over S serves every vector of both kinds.
 */
import { readoutWidths, type LinearRef, type ModelSpec } from '../spec';
import type { TensorEntry } from '../safetensors-types';
import type { Tensor } from '../tensor';
import type { WeightProducts, WeightProductsInput } from '../api';
import { LoupeError, throwIfAborted } from '../errors';
import { decodeValues, readEntryRange, type ReadableWeightSet } from '../safetensors';
import { dequantizeQ8Rows } from '../q8';
import { dequantizeQ4Rows } from '../q4';
import { checkReadoutInput } from './input';

/**
 * Rows [start, start + n) of a stored 2-D weight as float32, as the sessions use them (into `out`
 * when given: a reused buffer): 16-bit values widened (exact, as the graph's Cast), q8 as q · s
 * and q4 as (u − 8) · s (exact as well). Without `out`, float32 rows may be a view of the weight bytes: callers only
 * read them. Read by range: a file on disk or in IndexedDB is never read whole; `scratch`, a
 * reused buffer a reader from disk may read the bytes into (RangeReader), with `out` only.
 */
export function matrixRows(
  weights: ReadableWeightSet,
  e: TensorEntry,
  start: number,
  n: number,
  out?: Float32Array,
  scratch?: Uint8Array,
): Float32Array {
  const C = e.shape[1];
  if (e.q8) return dequantizeQ8Rows(weights, e, start, n, out, out && scratch);
  if (e.q4) return dequantizeQ4Rows(weights, e, start, n, out);
  const width = e.dtype === 'F32' ? 4 : e.dtype === 'F16' || e.dtype === 'BF16' ? 2 : 0;
  if (!width)
    throw new LoupeError('INTERNAL', `Weight ${e.name} is ${e.dtype}; matrices are read as F32, F16, BF16 or q8.`);
  const raw = readEntryRange(weights, e, start * C * width, n * C * width, out && scratch);
  // float32 bytes 4-byte aligned (a read by range is a fresh buffer): a view, read-only to callers
  if (!out && width === 4 && raw.byteOffset % 4 === 0) return new Float32Array(raw.buffer, raw.byteOffset, n * C);
  const to = out ?? new Float32Array(n * C);
  decodeValues(e.dtype, raw, 0, n * C, to);
  return to;
}

/** float32 values decoded per slab: 4 MiB (the slab's bytes as stored are 1–4 MiB) */
const SLAB_FLOATS = 1 << 20;

/**
 * One pass over a stored matrix [R, C]: `dots` (k vectors of C) → [k, R] row dots; `sums` (k'
 * vectors of R) → [k', C] row sums. Accumulated in float64 (a product of two float32 values is
 * exact in float64), returned rounded to float32. `buf`: the decoded slab and `raw` its bytes as
 * read, both reused across matrices: the bytes read from disk leave no garbage behind for V8 to
 * collect. The loops are unrolled by four (four partial sums of a row dot; four rows per pass over
 * a row sum's accumulator): V8 does not vectorise them, and unrolled they take less time per element.
 */
function streamMatrix(
  weights: ReadableWeightSet,
  e: TensorEntry,
  dots: Float32Array,
  kd: number,
  sums: Float32Array,
  ks: number,
  buf: Float32Array,
  raw: Uint8Array,
): { dots: Float32Array; sums: Float32Array } {
  const [R, C] = e.shape;
  const outDots = new Float32Array(kd * R);
  const acc = new Float64Array(ks * C);
  const rows = slabRows(e);
  const C4 = C - (C % 4);
  for (let start = 0; start < R; start += rows) {
    const n = Math.min(rows, R - start);
    const x = matrixRows(weights, e, start, n, buf, raw);
    for (let j = 0; j < kd; j++) {
      const v = dots.subarray(j * C, (j + 1) * C);
      for (let r = 0; r < n; r++) {
        const o = r * C;
        let s0 = 0,
          s1 = 0,
          s2 = 0,
          s3 = 0;
        let c = 0;
        for (; c < C4; c += 4) {
          s0 += x[o + c] * v[c];
          s1 += x[o + c + 1] * v[c + 1];
          s2 += x[o + c + 2] * v[c + 2];
          s3 += x[o + c + 3] * v[c + 3];
        }
        for (; c < C; c++) s0 += x[o + c] * v[c];
        outDots[j * R + start + r] = s0 + s1 + s2 + s3;
      }
    }
    for (let j = 0; j < ks; j++) {
      const u = sums.subarray(j * R + start, j * R + start + n);
      const a = acc.subarray(j * C, (j + 1) * C);
      let r = 0;
      for (; r + 4 <= n; r += 4) {
        const u0 = u[r],
          u1 = u[r + 1],
          u2 = u[r + 2],
          u3 = u[r + 3];
        const o0 = r * C,
          o1 = o0 + C,
          o2 = o1 + C,
          o3 = o2 + C;
        for (let c = 0; c < C; c++) a[c] += u0 * x[o0 + c] + u1 * x[o1 + c] + u2 * x[o2 + c] + u3 * x[o3 + c];
      }
      for (; r < n; r++) {
        const w = u[r],
          o = r * C;
        for (let c = 0; c < C; c++) a[c] += w * x[o + c];
      }
    }
  }
  return { dots: outDots, sums: Float32Array.from(acc) };
}

/**
 * rows decoded per slab: whole rows, SLAB_FLOATS at most; at q8 along axis 0 whole blocks of rows,
 * so no block's scales are read twice; at q4 along axis 0 the whole matrix (its bytes are in
 * output-channel order, q4.ts)
 */
function slabRows(e: TensorEntry): number {
  const unit = e.q8?.axis === 0 ? e.q8.block : e.q4?.axis === 0 ? e.shape[0] : 1;
  return Math.min(e.shape[0], Math.max(unit, Math.floor(SLAB_FLOATS / e.shape[1] / unit) * unit));
}

/** Resolve after pending tasks have run, so a cancel can arrive between layers (the products block the thread) */
type Yield = () => Promise<void>;

/**
 * The readout products asked for, streamed from the weight bytes (see the top of this file);
 * absent inputs give zero-length outputs as the session does.
 */
export async function streamedReadout(
  spec: ModelSpec,
  weights: ReadableWeightSet,
  input: WeightProductsInput,
  signal?: AbortSignal,
  yieldTurn?: Yield,
): Promise<Pick<WeightProducts, 'attnX' | 'mlpX' | 'attnDir' | 'mlpDir'>> {
  checkReadoutInput(spec, input);
  const { nLayers: L, dModel: D } = spec;
  // per-layer widths hd[l], m[l]; the stacks are padded to HD, M (readoutWidths)
  const { hd, m, HD, M } = readoutWidths(spec);
  const rowsOf = (t: Tensor | undefined) => t?.dims[1] ?? 0;
  const N = rowsOf(input.z),
    P = rowsOf(input.post),
    K = rowsOf(input.attnDirs),
    Km = rowsOf(input.mlpDirs);
  const attnX = new Float32Array(L * N * D),
    mlpX = new Float32Array(L * P * D);
  const attnDir = new Float32Array(L * K * HD),
    mlpDir = new Float32Array(L * Km * M);
  let buf = new Float32Array(0),
    raw = new Uint8Array(0);
  /**
   * layer l of one weight: `fwd` [n, in] → [n, out] (x·W) and `bwd` [k, out] → [k, in] (W·e), W
   * in TL orientation [in, out], written into the outputs at layer l
   */
  const layer = (
    ref: LinearRef,
    l: number,
    fwd: { x?: Tensor; n: number; out: Float32Array },
    bwd: { e?: Tensor; k: number; out: Float32Array },
    inDim: number,
    outDim: number,
    inStride: number,
  ) => {
    if (!fwd.n && !bwd.k) return;
    const e = weights.tensors.get(ref.w);
    if (!e) throw new LoupeError('INTERNAL', `weightProducts: tensor ${ref.w} is not in the weight index.`);
    // the layer's rows of the padded stack, each its first inDim values
    const x = new Float32Array(fwd.x ? fwd.n * inDim : 0);
    for (let r = 0; fwd.x && r < fwd.n; r++) {
      const o = (l * fwd.n + r) * inStride;
      x.set(fwd.x.data.subarray(o, o + inDim), r * inDim);
    }
    const d = bwd.e ? bwd.e.data.subarray(l * bwd.k * outDim, (l + 1) * bwd.k * outDim) : new Float32Array(0);
    // in_out stores [in, out]: x·W sums rows weighted by x, W·e dots rows with e; out_in the other way round
    const inOut = ref.layout === 'in_out';
    const need = slabRows(e) * e.shape[1];
    if (buf.length < need) {
      buf = new Float32Array(need);
      raw = new Uint8Array(4 * need);
    }
    const r = inOut
      ? streamMatrix(weights, e, d, bwd.k, x, fwd.n, buf, raw)
      : streamMatrix(weights, e, x, fwd.n, d, bwd.k, buf, raw);
    fwd.out.set(inOut ? r.sums : r.dots, l * fwd.n * outDim);
    const back = inOut ? r.dots : r.sums;
    for (let k = 0; k < bwd.k; k++) bwd.out.set(back.subarray(k * inDim, (k + 1) * inDim), (l * bwd.k + k) * inStride);
  };
  for (let l = 0; l < L; l++) {
    if (yieldTurn) await yieldTurn();
    throwIfAborted(signal);
    const s = spec.layers[l];
    // a linear-attention layer has no W_O: its rows stay zero
    if (s.attn)
      layer(s.attn.o, l, { x: input.z, n: N, out: attnX }, { e: input.attnDirs, k: K, out: attnDir }, hd[l], D, HD);
    // a mixture-of-experts layer has no one W_out: its rows stay zero
    if (s.mlp)
      layer(s.mlp.down, l, { x: input.post, n: P, out: mlpX }, { e: input.mlpDirs, k: Km, out: mlpDir }, m[l], D, M);
  }
  return {
    attnX: { dims: [L, N, D], data: attnX },
    mlpX: { dims: [L, P, D], data: mlpX },
    attnDir: { dims: [L, K, HD], data: attnDir },
    mlpDir: { dims: [L, Km, M], data: mlpDir },
  };
}
