/**
 * q8: 8-bit weight storage, the one definition of the scheme (precision.ts chooses it; the graph
 * builder widens it at use, onnx-builder.ts weight()/gatherRows()).
 *
 * Symmetric int8 in blocks along a matrix's input dimension (the dimension a matmul sums over;
 * an embedding's d_model), one float16 scale per block:
 *
 *   block   Q8_BLOCK (32) consecutive inputs when the input dimension is a multiple of 32, else
 *           the whole input dimension (one scale per output channel)
 *   scale   s = float16(float32(max |w| over the block) / 127)
 *   value   q = clamp(round_half_away(w / s), −127, 127)  (w / s in float64; q = 0 when s = 0)
 *   used    w' = q · s, exact in float32
 *
 * Which tensors: every Linear / Conv1D weight, the token and position embeddings and the
 * unembedding (the tied embedding once). Norm weights and biases stay in their stored precision,
 * as with 'stored'. 1 byte per weight + 2 bytes per 32 (budget.ts Q8_BYTES_PER_PARAM).
 *
 * The quantised bytes are computed in JS when the model is created and reach onnxruntime as
 * extra in-memory weight files (`loupe-q8-<i>.bin`) of the WeightSet that sessions are built
 * from, so the Node and web session factories take them like any other weight file.
 */
import type { ModelSpec, LinearRef } from './spec';
import type { Q8Layout, TensorEntry, WeightSet } from './safetensors-types';

export type { Q8Layout } from './safetensors-types';
import { f16ToF32, readEntryRange, readTensorBytes, type ReadableWeightSet } from './safetensors';
import { LoupeError } from './errors';

export const Q8_BLOCK = 32;

export function q8BlockSize(inDim: number): number {
  return inDim % Q8_BLOCK === 0 ? Q8_BLOCK : inDim;
}

/** The tensors q8 stores 8-bit, each with its input axis. */
export function q8Targets(spec: ModelSpec): Map<string, 0 | 1> {
  const out = new Map<string, 0 | 1>([[spec.embed.w, 1], [spec.unembed.w, 1]]);
  if (spec.posEmbed) out.set(spec.posEmbed.w, 1);
  const lin = (r: LinearRef | undefined) => { if (r) out.set(r.w, r.layout === 'out_in' ? 1 : 0); };
  for (const l of spec.layers) {
    const { qkv, o } = l.attn;
    if (qkv.kind === 'separate') { lin(qkv.q); lin(qkv.k); lin(qkv.v); } else lin(qkv.qkv);
    lin(o); lin(l.mlp.up); lin(l.mlp.gate); lin(l.mlp.down);
  }
  return out;
}

// ---------------------------------------------------------------- number formats

let f16Table: Float32Array | null = null;
/** float16 bits → value, all 65536 of them (decoding a 2B-parameter model value by value is ~10× slower) */
export function f16Values(): Float32Array {
  if (f16Table) return f16Table;
  const t = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) t[h] = f16ToF32(h);
  return (f16Table = t);
}

const f32Box = new Float32Array(1);
const u32Box = new Uint32Array(f32Box.buffer);
/** float32 value → float16 bits, round half to even (|v| ≥ 65520 → ∞) */
export function f32ToF16(v: number): number {
  f32Box[0] = v;
  const x = u32Box[0];
  const sign = (x >>> 16) & 0x8000, abs = x & 0x7fffffff;
  if (abs > 0x7f800000) return sign | 0x7e00; // NaN
  if (abs >= 0x477ff000) return sign | 0x7c00; // 65520 and up round to ∞
  // normal halves (|v| ≥ 2^-14): move the exponent bias from 127 to 15, then round the 13 dropped bits half to even
  if (abs >= 0x38800000) return sign | ((abs - 0x38000000 + 0xfff + ((abs >>> 13) & 1)) >>> 13);
  // subnormal halves are the multiples of 2^-24
  const y = Math.abs(f32Box[0]) * 2 ** 24;
  let r = Math.round(y);
  if (r - y === 0.5 && r & 1) r--;
  return sign | r;
}

/** decode `n` values of a stored dtype (F16, BF16, F32) starting at element `from` of `raw` into `out` */
export function decodeValues(dtype: string, raw: Uint8Array, from: number, n: number, out: Float32Array): void {
  if (dtype === 'F16') {
    const t = f16Values();
    for (let i = 0, b = 2 * from; i < n; i++, b += 2) out[i] = t[raw[b] | (raw[b + 1] << 8)];
  } else if (dtype === 'BF16') {
    const u = new Uint32Array(out.buffer, out.byteOffset, n);
    for (let i = 0, b = 2 * from; i < n; i++, b += 2) u[i] = ((raw[b] | (raw[b + 1] << 8)) << 16) >>> 0;
  } else {
    // F32: tensors in a file need not be 4-byte aligned, so copy the bytes
    new Uint8Array(out.buffer, out.byteOffset, 4 * n).set(raw.subarray(4 * from, 4 * (from + n)));
  }
}

// ---------------------------------------------------------------- quantise / dequantise

interface Quantised { bytes: Uint8Array; block: number; scaleShape: number[]; nScales: number }

/**
 * One block: `block` values of `w` from `src` (stride `ss`) to `q` from `dst` (stride `ds`);
 * returns the scale's float16 bits. `t`: float16 bits → value.
 */
function quantizeBlock(w: Float32Array, src: number, ss: number, q: Int8Array, dst: number, ds: number, block: number, t: Float32Array): number {
  let m = 0;
  for (let j = 0, a = src; j < block; j++, a += ss) { const v = w[a]; const av = v < 0 ? -v : v; if (av > m) m = av; }
  const h = f32ToF16(Math.fround(m / 127));
  const sv = t[h];
  if (!(sv > 0)) {
    for (let j = 0, d = dst; j < block; j++, d += ds) q[d] = 0;
    return h;
  }
  for (let j = 0, a = src, d = dst; j < block; j++, a += ss, d += ds) {
    const x = w[a] / sv;
    // round half away from zero: |x| + 0.5 truncated (|x| < 2^31), the sign put back
    const r = x < 0 ? -((0.5 - x) | 0) : (x + 0.5) | 0;
    q[d] = r > 127 ? 127 : r < -127 ? -127 : r;
  }
  return h;
}

/** Quantise one stored [r, c] matrix along `axis`: int8 values (same layout) then float16 scales, in one buffer. */
export function quantizeMatrix(dtype: string, raw: Uint8Array, shape: number[], axis: 0 | 1): Quantised {
  const [R, C] = shape;
  const inDim = axis === 1 ? C : R, outDim = axis === 1 ? R : C;
  const block = q8BlockSize(inDim);
  const nb = inDim / block, n = R * C, nScales = outDim * nb;
  const bytes = new Uint8Array(n + 2 * nScales);
  const q = new Int8Array(bytes.buffer, 0, n);
  const scales = new DataView(bytes.buffer, n, 2 * nScales);
  const t = f16Values();
  const put = (k: number, w: Float32Array, src: number, ss: number, dst: number, ds: number) => {
    scales.setUint16(2 * k, quantizeBlock(w, src, ss, q, dst, ds, block, t), true);
  };
  if (axis === 1) {
    // [out, in]: one row at a time; scale [out, nb, 1]
    const row = new Float32Array(C);
    for (let r = 0; r < R; r++) {
      decodeValues(dtype, raw, r * C, C, row);
      for (let b = 0; b < nb; b++) put(r * nb + b, row, b * block, 1, r * C + b * block, 1);
    }
  } else {
    // [in, out]: `block` rows at a time; scale [nb, 1, out]
    const rows = new Float32Array(block * C);
    for (let b = 0; b < nb; b++) {
      decodeValues(dtype, raw, b * block * C, block * C, rows);
      for (let c = 0; c < C; c++) put(b * C + c, rows, c, C, b * block * C + c, C);
    }
  }
  return { bytes, block, scaleShape: axis === 1 ? [outDim, nb, 1] : [nb, 1, outDim], nScales };
}

/**
 * The WeightSet sessions are built from at q8: the target tensors replaced by I8 entries (with
 * their Q8Layout) in new in-memory files; everything else as it was.
 */
export function q8WeightSet(weights: ReadableWeightSet, spec: ModelSpec): ReadableWeightSet {
  const tensors = new Map(weights.tensors);
  const files = new Map(weights.files);
  let i = 0;
  for (const [name, axis] of q8Targets(spec)) {
    const e = weights.tensors.get(name);
    if (!e) continue;
    if (e.shape.length !== 2 || !['F16', 'BF16', 'F32'].includes(e.dtype)) {
      throw new LoupeError('UNSUPPORTED_CONFIG', `--weights q8 quantises float matrices; ${name} is ${e.dtype} [${e.shape}].`, 'Load this model with --weights stored or f32.', { tensor: name, dtype: e.dtype });
    }
    const { bytes, block, scaleShape, nScales } = quantizeMatrix(e.dtype, readTensorBytes(weights, name), e.shape, axis);
    const file = `loupe-q8-${i++}.bin`;
    files.set(file, bytes);
    const n = e.shape[0] * e.shape[1];
    const scale: TensorEntry = { name: `${name}#q8_scale`, dtype: 'F16', shape: scaleShape, fileOffset: n, byteLength: 2 * nScales, file };
    tensors.set(name, { name, dtype: 'I8', shape: [...e.shape], fileOffset: 0, byteLength: n, file, q8: { axis, block, scale } });
  }
  return { ...weights, files, tensors };
}

/** A q8 tensor's values as the session uses them (q · s), as float32. */
export function dequantizeQ8(weights: WeightSet, name: string): Float32Array {
  const e = weights.tensors.get(name);
  if (!e?.q8) throw new Error(`dequantizeQ8: ${name} is not a q8 tensor`);
  const bytes = weights.files.get(e.file)!;
  const [R, C] = e.shape;
  const q = new Int8Array(bytes.buffer, bytes.byteOffset + e.fileOffset, R * C);
  const sRaw = weights.files.get(e.q8.scale.file)!.subarray(e.q8.scale.fileOffset, e.q8.scale.fileOffset + e.q8.scale.byteLength);
  const t = f16Values();
  const s32 = e.q8.scale.dtype === 'F32' ? new DataView(sRaw.buffer, sRaw.byteOffset, sRaw.byteLength) : null;
  const s = s32 ? (k: number) => s32.getFloat32(4 * k, true) : (k: number) => t[sRaw[2 * k] | (sRaw[2 * k + 1] << 8)];
  const { axis, block } = e.q8;
  if (axis === 1) return dequantizeQ8Rows(weights, e, 0, R);
  const out = new Float32Array(R * C);
  for (let r = 0; r < R; r++) for (let c = 0; c < C; c++) out[r * C + c] = q[r * C + c] * s(Math.floor(r / block) * C + c);
  return out;
}

/**
 * Rows [start, start + n) of a q8 matrix blocked along its rows (axis 1: [out, in], the vocabulary
 * tables among them) as the session uses them, q · s, without the rest of the matrix. The product
 * of an int8 and a float16 is exact in float32, so these equal the graph's values bit for bit.
 */
export function dequantizeQ8Rows(weights: ReadableWeightSet, e: TensorEntry, start: number, n: number): Float32Array {
  if (!e.q8 || e.q8.axis !== 1) throw new Error(`dequantizeQ8Rows: ${e.name} is not a q8 matrix blocked along its rows`);
  const C = e.shape[1], block = e.q8.block, nb = C / block;
  const qb = readEntryRange(weights, e, start * C, n * C);
  const q = new Int8Array(qb.buffer, qb.byteOffset, n * C);
  // float16 scales, or float32 in the WebGPU form (q8ForWebGpu)
  const sb = e.q8.scale.dtype === 'F32' ? 4 : 2;
  const sRaw = readEntryRange(weights, e.q8.scale, sb * start * nb, sb * n * nb);
  const s32 = sb === 4 ? new DataView(sRaw.buffer, sRaw.byteOffset, sRaw.byteLength) : null;
  const t = f16Values();
  const out = new Float32Array(n * C);
  for (let k = 0; k < n * nb; k++) {
    const sv = s32 ? s32.getFloat32(4 * k, true) : t[sRaw[2 * k] | (sRaw[2 * k + 1] << 8)];
    for (let i = k * block; i < (k + 1) * block; i++) out[i] = q[i] * sv;
  }
  return out;
}

/**
 * The q8 weight set in the form onnxruntime-web's WebGPU provider (JSEP, 1.30) runs on the GPU,
 * with the same numbers (every value q · s is exact in float32 either way):
 *   - its Cast has no int8 kernel (WGSL has no 8-bit type; Cast takes float16, float32, int32,
 *     uint32, bool), so Cast(int8) would run on the CPU provider with the weights in the WASM
 *     heap; DequantizeLinear (int8 packed four to a u32) does run on the GPU, so the int8 values
 *     are widened by DequantizeLinear(q, 1) (onnx-builder.ts);
 *   - float16 scales need the adapter's shader-f16 (SwiftShader has none: the shaders fail to
 *     compile), so the scales are float32: the float16 values widened, twice their bytes
 *     (2 bytes per 32 weights more).
 *   - the weights q8 leaves in their stored precision (norms, biases: small) are widened to
 *     float32 here for the same reason (float16 needs shader-f16; WGSL has no bfloat16).
 * Gather has no int8 kernel either: an embedding lookup gathers its int8 rows on the CPU provider.
 */
export function q8ForWebGpu(weights: ReadableWeightSet): ReadableWeightSet {
  const tensors = new Map(weights.tensors);
  const files = new Map(weights.files);
  const t = f16Values();
  let i = 0;
  for (const [name, e] of weights.tensors) {
    if (!e.q8 && (e.dtype === 'F16' || e.dtype === 'BF16')) {
      const n = e.shape.reduce((a, b) => a * b, 1);
      const f32 = new Float32Array(n);
      decodeValues(e.dtype, readTensorBytes(weights, name), 0, n, f32);
      const file = `loupe-q8-f32-${i++}.bin`;
      files.set(file, new Uint8Array(f32.buffer));
      tensors.set(name, { ...e, dtype: 'F32', fileOffset: 0, byteLength: 4 * n, file });
    }
    if (!e.q8) continue;
    const src = e.q8.scale;
    const raw = weights.files.get(src.file)!.subarray(src.fileOffset, src.fileOffset + src.byteLength);
    const n = src.byteLength / 2;
    const f32 = new Float32Array(n);
    for (let k = 0; k < n; k++) f32[k] = t[raw[2 * k] | (raw[2 * k + 1] << 8)];
    const file = `loupe-q8-scales-${i++}.bin`;
    files.set(file, new Uint8Array(f32.buffer));
    const scale: TensorEntry = { ...src, dtype: 'F32', fileOffset: 0, byteLength: 4 * n, file };
    tensors.set(name, { ...e, q8: { ...e.q8, scale, dequantize: true } });
  }
  return { ...weights, files, tensors };
}
