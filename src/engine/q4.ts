/**
 * q4: 4-bit weight storage for the Linear matrices, the one definition of the scheme (precision.ts
 * chooses it; q8.ts writes and caches its file with q8's machinery; the graph multiplies by it with
 * onnxruntime's com.microsoft MatMulNBits, onnx-builder.ts linear(), or widens it at use,
 * onnx-builder.ts weight()).
 *
 * Symmetric 4-bit in blocks along a matrix's input dimension, as MatMulNBits defines its B with
 * bits = 4, block_size = 32 and no zero_points (so the zero point is 8):
 *
 *   block   Q4_BLOCK (32) consecutive inputs of one output channel; a matrix whose input
 *           dimension is not a multiple of 32 is stored q8 instead (no partial blocks)
 *   scale   s = float16(float32(max |w| over the block) / 7), held as float32 (MatMulNBits'
 *           scales have the type of its float input)
 *   value   q = clamp(round_half_away(w / s), −8, 7) (w / s in float64; q = 0 when s = 0),
 *           stored as the nibble u = q + 8
 *   packed  [n, k/32, 16] bytes (n output channels, k inputs): byte j of a block holds inputs
 *           2j (low nibble) and 2j + 1 (high nibble); scales [n · k/32], output channel major
 *   used    w' = (u − 8) · s, exact in float32 (a 4-bit integer times an 11-bit significand)
 *
 * Which tensors: the Linear / Conv1D weights whose input dimension is a multiple of 32. The
 * token and position embeddings, the unembedding and any other matrix are q8 (q8.ts): the tables
 * are gathered by rows and read whole by DLA, and 8 bits keep the logits' own matrix close to the
 * model's. Norm weights and biases stay in their stored precision. About 0.625 bytes per Linear
 * weight (budget.ts Q4_BYTES_PER_PARAM).
 */
import { f16Values, f32ToF16, readEntryRange, type ReadableWeightSet } from './safetensors';
import type { TensorEntry } from './safetensors-types';

export const Q4_BLOCK = 32;
/** bytes of one packed block: 32 nibbles */
export const Q4_BLOB = Q4_BLOCK / 2;

/** whether a matrix with this input dimension is stored 4-bit (else q8) */
export const q4Fits = (inDim: number): boolean => inDim > 0 && inDim % Q4_BLOCK === 0;

/** max |w[j]| over j in [from, to) (NaN ignored; 0 for none): a block's range, q4's and q8's */
export function absMax(w: Float32Array, from: number, to: number): number {
  let m = 0;
  for (let j = from; j < to; j++) {
    const v = Math.abs(w[j]);
    if (v > m) m = v;
  }
  return m;
}

/** a block's scale as float32: the float16 value of float32(max |w|) / 7 */
const scaleOf = (m: number, t: Float32Array): number => t[f32ToF16(Math.fround(m / 7))];

/** u = clamp(round_half_away(x), −8, 7) + 8; NaN → 8 (q = 0) */
function nibbleOf(x: number): number {
  const r = (x < 0 ? x - 0.5 : x + 0.5) | 0;
  return (r > 7 ? 7 : r < -8 ? -8 : r) + 8;
}

/**
 * Quantise the first `count` values of `w` (whole output channels, row-major, so every 32 are one
 * block): their packed bytes into `to.packed` from 0, their scales into `to.scales` from `at`;
 * returns the next scale index.
 */
export function quantizeQ4Rows(
  w: Float32Array,
  count: number,
  to: { packed: Uint8Array; scales: Float32Array },
  at: number,
): number {
  const t = f16Values();
  for (let base = 0; base < count; base += Q4_BLOCK) {
    const s = scaleOf(absMax(w, base, base + Q4_BLOCK), t);
    to.scales[at++] = s;
    const d = s > 0 ? s : Infinity;
    for (let j = base, p = base / 2; j < base + Q4_BLOCK; j += 2, p++)
      to.packed[p] = nibbleOf(w[j] / d) | (nibbleOf(w[j + 1] / d) << 4);
  }
  return at;
}

/**
 * Rows [start, start + n) of a q4 matrix in its stored layout, as the session uses them,
 * (u − 8) · s (into `out` when given). Axis 1 ([out, in]: a row is one output channel, its bytes
 * and scales contiguous); axis 0 ([in, out], GPT-2's Conv1D: a stored row is one input of every
 * channel, so the whole packed matrix is read).
 */
export function dequantizeQ4Rows(
  weights: ReadableWeightSet,
  e: TensorEntry,
  start: number,
  n: number,
  out: Float32Array = new Float32Array(n * e.shape[1]),
): Float32Array {
  if (!e.q4) throw new Error(`dequantizeQ4Rows: ${e.name} is not a q4 tensor`);
  const { k: K, n: N, axis, scale } = e.q4;
  const nb = K / Q4_BLOCK;
  const f32 = (b: Uint8Array) => new Float32Array(b.slice().buffer);
  if (axis === 1) {
    const p = readEntryRange(weights, e, (start * K) / 2, (n * K) / 2);
    const s = f32(readEntryRange(weights, scale, 4 * start * nb, 4 * n * nb));
    for (let i = 0; i < n * K; i += 2) {
      const b = p[i >> 1],
        sv = s[(i / Q4_BLOCK) | 0];
      out[i] = ((b & 15) - 8) * sv;
      out[i + 1] = ((b >> 4) - 8) * sv;
    }
    return out;
  }
  const p = readEntryRange(weights, e, 0, (N * K) / 2);
  const s = f32(readEntryRange(weights, scale, 0, 4 * N * nb));
  for (let r = 0; r < n; r++) {
    const kk = start + r,
      shift = (kk & 1) * 4,
      blk = (kk / Q4_BLOCK) | 0;
    for (let c = 0; c < N; c++) out[r * N + c] = (((p[c * (K / 2) + (kk >> 1)] >> shift) & 15) - 8) * s[c * nb + blk];
  }
  return out;
}
