/**
 * The q4 scheme (src/engine/q4.ts) written out from its definition, in float64, for tests that judge
 * the engine's q4 weights independently (engine-q4): each Linear matrix whose input dimension is a
 * multiple of 32 is quantised here (blocks of 32 inputs of one output channel; scale =
 * float16(float32(max|w|)/7); q = round half away from zero of w/scale, clamped to [−8, 7]),
 * packed as com.microsoft MatMulNBits defines its B (bits 4, block_size 32: [N][K/32][16] bytes, the
 * even input of a pair in the low nibble) and dequantised back from those bytes as the op
 * defines it, (nibble − zero point) · scale with the default zero point 2^(bits−1) = 8. Every other
 * matrix (embeddings, unembedding, Linears of other input dims) is q8 (q8-reference.ts).
 */
import { f32ToF16Bits, f16BitsToF32, type RefModel } from '../reference';
import { q8Reference } from './q8-reference';

/** GPT-2's Conv1D weights are stored [in, out]; every other matrix is [out, in]. */
const CONV1D = /\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$/;
/** the vocabulary and position tables: q8 under q4 */
const TABLE = /(embed|wte|wpe|lm_head)/;

/** One matrix as MatMulNBits' inputs, from the definition: B [N][K/32][16] bytes and scales [N · K/32]. */
export function q4Pack(w: ArrayLike<number>, N: number, K: number, at: (n: number, k: number) => number) {
  const nb = K / 32;
  const B = new Uint8Array(N * nb * 16);
  const scales = new Float64Array(N * nb);
  for (let n = 0; n < N; n++)
    for (let b = 0; b < nb; b++) {
      let m = 0;
      for (let k = b * 32; k < (b + 1) * 32; k++) if (Math.abs(w[at(n, k)]) > m) m = Math.abs(w[at(n, k)]);
      const s = f16BitsToF32(f32ToF16Bits(Math.fround(m / 7)));
      scales[n * nb + b] = s;
      for (let k = b * 32; k < (b + 1) * 32; k++) {
        const x = s > 0 ? w[at(n, k)] / s : 0;
        const q = Number.isNaN(x) ? 0 : Math.max(-8, Math.min(7, Math.sign(x) * Math.floor(Math.abs(x) + 0.5)));
        const byte = (n * nb + b) * 16 + ((k % 32) >> 1);
        B[byte] |= (q + 8) << (k % 2 === 0 ? 0 : 4);
      }
    }
  return { B, scales };
}

/** W [N, K] from MatMulNBits' B and scales, as the op defines it (no zero points: 8), in float64 */
export function q4Unpack(B: Uint8Array, scales: ArrayLike<number>, N: number, K: number): Float64Array {
  const nb = K / 32;
  const W = new Float64Array(N * K);
  for (let n = 0; n < N; n++)
    for (let k = 0; k < K; k++) {
      const byte = B[(n * nb + Math.floor(k / 32)) * 16 + ((k % 32) >> 1)];
      const nib = k % 2 === 0 ? byte & 15 : byte >> 4;
      W[n * K + k] = (nib - 8) * scales[n * nb + Math.floor(k / 32)];
    }
  return W;
}

/** The q4 scheme from its definition, in float64: the values the engine's session should compute with. */
export function q4Reference(rm: RefModel & { family?: string }): RefModel {
  const q8 = q8Reference(rm);
  const tensors: RefModel['tensors'] = { ...q8.tensors };
  for (const [name, t] of Object.entries(rm.tensors)) {
    if (t.dims.length !== 2 || TABLE.test(name)) continue;
    const [R, C] = t.dims;
    const conv = CONV1D.test(name) && (rm.family ?? rm.config.model_type) === 'gpt2';
    const [N, K] = conv ? [C, R] : [R, C];
    if (K % 32 !== 0) continue; // stays q8
    const at = (n: number, k: number) => (conv ? k * C + n : n * C + k);
    const { B, scales } = q4Pack(t.data, N, K, at);
    const W = q4Unpack(B, scales, N, K);
    const out = new Float64Array(R * C);
    for (let n = 0; n < N; n++) for (let k = 0; k < K; k++) out[at(n, k)] = W[n * K + k];
    tensors[name] = { dims: t.dims, data: out };
  }
  return { config: rm.config, tensors };
}
