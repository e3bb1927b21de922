/**
 * The unembedding's readout products, in JavaScript (WeightProducts unembedRows, unembedSum,
 * unembedDots): W_U[:, t] for a few ids is a read of those rows, Σ_v W_U[:, v] is needed once per
 * model, and x · W_U for a few vectors x (the direct logit effect of a steering direction or a
 * feature) is one pass over the table, a chunk of rows at a time, so no operation needs a float32
 * copy of W_U, the largest tensor, in JavaScript or in a second session.
 */
import type { ModelSpec } from '../spec';
import type { TensorEntry } from '../safetensors-types';
import type { WeightProducts, WeightProductsInput } from '../api';
import { LoupeError, throwIfAborted } from '../errors';
import { bf16Values, f16Values, readEntryRange, type ReadableWeightSet } from '../safetensors';
import { matrixRows } from './stream';

/** rows of the table read at once for the vocabulary sum and dot products: about 16 MB of float32 */
const CHUNK_BYTES = 16 * 1024 ** 2;

/**
 * How a pass over the table runs: cancelled between chunks by `signal`, yielding the thread before
 * each chunk; `chunkBytes` is for tests that split a small vocabulary.
 */
export interface TablePassOptions {
  signal?: AbortSignal;
  yieldTurn?: () => Promise<void>;
  chunkBytes?: number;
}

/**
 * The table [V, D] a chunk of rows at a time: `each(start, n)` for consecutive row ranges, so that
 * a pass over the whole vocabulary never holds more than a chunk of it (W_U is the largest tensor:
 * 2.4 GB as float32 on Gemma 2, where one pass takes seconds: a cancel is heard between chunks).
 */
async function forEachTableChunk(
  e: TensorEntry,
  each: (start: number, n: number) => void,
  opts: TablePassOptions,
): Promise<void> {
  const [V, D] = e.shape;
  const chunk = Math.max(1, Math.floor((opts.chunkBytes ?? CHUNK_BYTES) / (4 * D)));
  for (let start = 0; start < V; start += chunk) {
    if (opts.yieldTurn) await opts.yieldTurn();
    throwIfAborted(opts.signal);
    each(start, Math.min(chunk, V - start));
  }
}

/**
 * A 16-bit table's values: its 65536-value lookup (F16, BF16 not quantised), so a pass reads the
 * stored bits straight through it rather than decoding each chunk into float32 first (up to 590M
 * values are read per pass: Gemma 2's 256000 × 2304); undefined for F32 and q8 tables.
 */
function sixteenBitValues(e: TensorEntry): Float32Array | undefined {
  return e.q8 ? undefined : e.dtype === 'F16' ? f16Values() : e.dtype === 'BF16' ? bf16Values() : undefined;
}

/**
 * Rows [start, start + n) of the table: their 16-bit bits where `sixteenBitValues` has a lookup,
 * float32 values otherwise. `scratch`: bytes a read from disk may fill, reused chunk after chunk
 * (the result may be a view of it, valid until the next chunk is read).
 */
function tableChunk(
  weights: ReadableWeightSet,
  e: TensorEntry,
  start: number,
  n: number,
  bits: boolean,
  scratch: Uint8Array,
): Float32Array | Uint16Array {
  if (!bits && (e.q8 || e.dtype !== 'F32')) return matrixRows(weights, e, start, n);
  const D = e.shape[1];
  const width = bits ? 2 : 4;
  const raw = readEntryRange(weights, e, start * D * width, n * D * width, scratch);
  // an aligned view where the bytes allow it, else a copy
  const bytes = raw.byteOffset % width === 0 ? raw : raw.slice();
  return bits
    ? new Uint16Array(bytes.buffer, bytes.byteOffset, n * D)
    : new Float32Array(bytes.buffer, bytes.byteOffset, n * D);
}

/** scratch for tableChunk: a chunk's bytes as stored, where they are read from disk (none where the file is in memory, or q8) */
function chunkScratch(weights: ReadableWeightSet, e: TensorEntry, opts: TablePassOptions): Uint8Array {
  if (e.q8 || weights.files.has(e.file)) return new Uint8Array(0);
  const [V, D] = e.shape;
  const rows = Math.min(V, Math.max(1, Math.floor((opts.chunkBytes ?? CHUNK_BYTES) / (4 * D))));
  return new Uint8Array(rows * D * 4);
}

/** Σ_v W_U[v, :] in float64, a chunk of rows at a time (16-bit rows through their lookup) */
async function unembedTableSum(
  weights: ReadableWeightSet,
  e: TensorEntry,
  opts: TablePassOptions,
): Promise<Float64Array> {
  const D = e.shape[1];
  const sum = new Float64Array(D);
  const t = sixteenBitValues(e);
  const scratch = chunkScratch(weights, e, opts);
  await forEachTableChunk(
    e,
    (start, n) => {
      const w = tableChunk(weights, e, start, n, !!t, scratch);
      // four rows per pass over the accumulator, each still added in row order
      let r = 0;
      for (; r + 4 <= n; r += 4) {
        const o0 = r * D,
          o1 = o0 + D,
          o2 = o1 + D,
          o3 = o2 + D;
        if (t) for (let d = 0; d < D; d++) sum[d] = sum[d] + t[w[o0 + d]] + t[w[o1 + d]] + t[w[o2 + d]] + t[w[o3 + d]];
        else for (let d = 0; d < D; d++) sum[d] = sum[d] + w[o0 + d] + w[o1 + d] + w[o2 + d] + w[o3 + d];
      }
      for (; r < n; r++) {
        const o = r * D;
        if (t) for (let d = 0; d < D; d++) sum[d] += t[w[o + d]];
        else for (let d = 0; d < D; d++) sum[d] += w[o + d];
      }
    },
    opts,
  );
  return sum;
}

/**
 * x [S, D] → [S, V]: x_s · W_U[:, v] for every token, each a float64 sum over d in order of the
 * float32 values the sessions use (so the same numbers as a float64 product with a float32 copy of
 * W_U, which this replaces), the table read a chunk of rows at a time, 16-bit rows through their
 * lookup. Four rows at once, each still its own sum in order over d: one sum's adds wait on each
 * other, four interleave (faster than one row at a time; `npm run bench` measures it).
 */
async function unembedTableDots(
  weights: ReadableWeightSet,
  e: TensorEntry,
  x: Float64Array,
  S: number,
  opts: TablePassOptions,
): Promise<Float64Array> {
  const [V, D] = e.shape;
  const out = new Float64Array(S * V);
  const t = sixteenBitValues(e);
  const scratch = chunkScratch(weights, e, opts);
  await forEachTableChunk(
    e,
    (start, n) => {
      const w = tableChunk(weights, e, start, n, !!t, scratch);
      for (let s = 0; s < S; s++) {
        const xo = s * D,
          oo = s * V + start;
        let r = 0;
        for (; r + 4 <= n; r += 4) {
          let a0 = 0,
            a1 = 0,
            a2 = 0,
            a3 = 0;
          const o0 = r * D,
            o1 = o0 + D,
            o2 = o1 + D,
            o3 = o2 + D;
          if (t) {
            for (let d = 0; d < D; d++) {
              const xd = x[xo + d];
              a0 += xd * t[w[o0 + d]];
              a1 += xd * t[w[o1 + d]];
              a2 += xd * t[w[o2 + d]];
              a3 += xd * t[w[o3 + d]];
            }
          } else {
            for (let d = 0; d < D; d++) {
              const xd = x[xo + d];
              a0 += xd * w[o0 + d];
              a1 += xd * w[o1 + d];
              a2 += xd * w[o2 + d];
              a3 += xd * w[o3 + d];
            }
          }
          out[oo + r] = a0;
          out[oo + r + 1] = a1;
          out[oo + r + 2] = a2;
          out[oo + r + 3] = a3;
        }
        for (; r < n; r++) {
          let acc = 0;
          const o = r * D;
          if (t) for (let d = 0; d < D; d++) acc += x[xo + d] * t[w[o + d]];
          else for (let d = 0; d < D; d++) acc += x[xo + d] * w[o + d];
          out[oo + r] = acc;
        }
      }
    },
    opts,
  );
  return out;
}

/** unembedDots' vectors [n, D] (else BAD_INPUT) */
export function checkUnembedDots(spec: ModelSpec, x: WeightProductsInput['unembedDots']): void {
  const D = spec.dModel;
  if (x && (x.dims.length !== 2 || x.dims[1] !== D || x.data.length !== x.dims[0] * D))
    throw new LoupeError('BAD_INPUT', `weightProducts: unembedDots must be [n, ${D}], got [${x.dims}].`);
}

/** token ids of unembedIds, each in the vocabulary (else BAD_TOKEN_ID) */
export function checkUnembedIds(spec: ModelSpec, ids: number[]): void {
  const V = spec.dVocab;
  for (const id of ids)
    if (!Number.isInteger(id) || id < 0 || id >= V)
      throw new LoupeError('BAD_TOKEN_ID', `Token id ${id} is outside the vocabulary (0..${V - 1}).`);
}

/**
 * The unembedding's products, in JavaScript: unembedRows [I, D] = W_U[:, id] for each id (ids
 * validated: BAD_TOKEN_ID), unembedSum [D] = Σ_v W_U[:, v] (accumulated in float64, the table read
 * a chunk of rows at a time; zeros when not asked for), unembedDots [S, V] = x_s · W_U (float64,
 * streamed the same way; [0, V] when not asked for). `opts`: see TablePassOptions.
 */
export async function unembedProducts(
  spec: ModelSpec,
  weights: ReadableWeightSet,
  input: WeightProductsInput,
  opts: TablePassOptions = {},
): Promise<Pick<WeightProducts, 'unembedRows' | 'unembedSum' | 'unembedDots'>> {
  const { dModel: D, dVocab: V } = spec;
  const ids = input.unembedIds ?? [];
  checkUnembedIds(spec, ids);
  const x = input.unembedDots;
  checkUnembedDots(spec, x);
  const e = weights.tensors.get(spec.unembed.w)!;
  const rows = new Float32Array(ids.length * D);
  ids.forEach((id, i) => rows.set(matrixRows(weights, e, id, 1), i * D));
  const sum = input.unembedSum ? await unembedTableSum(weights, e, opts) : new Float64Array(D);
  const S = x ? x.dims[0] : 0;
  const dots =
    x && S > 0 ? await unembedTableDots(weights, e, Float64Array.from(x.data), S, opts) : new Float64Array(0);
  return {
    unembedRows: { dims: [ids.length, D], data: rows },
    unembedSum: { dims: [D], data: Float32Array.from(sum) },
    unembedDots: { dims: [S, V], data: dots },
  };
}
