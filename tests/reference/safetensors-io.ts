// A tiny, self-contained safetensors writer and reader for the test oracle.
// Written from the format description (8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__"?: {...}}, then the raw
// little-endian bytes). It shares no code with src/.

/** U8: raw bytes (GPT-OSS's MXFP4 blocks and scales), written as given */
export type StDtype = 'F32' | 'F16' | 'BF16' | 'F64' | 'U8';

export interface StTensor {
  dims: number[];
  /** values (after rounding to the stored dtype when read back) */
  data: Float32Array | Float64Array;
}

const BYTES: Record<StDtype, number> = { F32: 4, F16: 2, BF16: 2, F64: 8, U8: 1 };

// ---------------------------------------------------------------- f16 / bf16 conversions

const f32buf = new Float32Array(1);
const u32buf = new Uint32Array(f32buf.buffer);

/** float → IEEE half bits, round to nearest even (handles subnormals, inf, nan). */
export function f32ToF16Bits(value: number): number {
  f32buf[0] = value;
  const x = u32buf[0];
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0); // inf / nan
  let e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00; // overflow → inf
  if (e <= 0) {
    // subnormal half (or zero)
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e; // 24-bit mantissa → 10-bit at exponent e
    const half = 1 << (shift - 1);
    const rest = mant & ((1 << shift) - 1);
    let m = mant >>> shift;
    if (rest > half || (rest === half && m & 1)) m += 1;
    return sign | m; // a carry into the exponent field is still the right encoding
  }
  const rest = mant & 0x1fff;
  let m = mant >>> 13;
  if (rest > 0x1000 || (rest === 0x1000 && m & 1)) {
    m += 1;
    if (m === 0x400) {
      m = 0;
      e += 1;
      if (e >= 0x1f) return sign | 0x7c00;
    }
  }
  return sign | (e << 10) | m;
}

export function f16BitsToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >>> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return sign * m * 2 ** -24;
  if (e === 0x1f) return m ? NaN : sign * Infinity;
  return sign * (1 + m / 1024) * 2 ** (e - 15);
}

/** float → bfloat16 bits, round to nearest even. */
export function f32ToBf16Bits(value: number): number {
  f32buf[0] = value;
  const x = u32buf[0];
  if ((x & 0x7f800000) === 0x7f800000 && x & 0x7fffff) return (x >>> 16) | 0x40; // nan
  const lsb = (x >>> 16) & 1;
  return ((x + 0x7fff + lsb) >>> 16) & 0xffff;
}

export function bf16BitsToF32(b: number): number {
  u32buf[0] = (b & 0xffff) << 16;
  return f32buf[0];
}

/** The value a number takes once stored as `dtype` and read back. */
export function roundToDtype(data: ArrayLike<number>, dtype: StDtype): Float32Array | Float64Array {
  if (dtype === 'F64') return Float64Array.from(data);
  const out = new Float32Array(data.length);
  for (let i = 0; i < data.length; i++) {
    const v = data[i];
    out[i] = dtype === 'F32' ? v : dtype === 'F16' ? f16BitsToF32(f32ToF16Bits(v)) : bf16BitsToF32(f32ToBf16Bits(v));
  }
  return out;
}

// ---------------------------------------------------------------- writer

export interface WriteEntry {
  dims: number[];
  data: ArrayLike<number>;
  dtype?: StDtype;
}

/** Serialise tensors (in insertion order) to safetensors bytes. */
export function encodeSafetensors(
  tensors: Record<string, WriteEntry>,
  defaultDtype: StDtype = 'F32',
  metadata: Record<string, string> = { format: 'pt' },
): Uint8Array {
  const header: Record<string, unknown> = {};
  if (metadata) header.__metadata__ = metadata;
  let offset = 0;
  const names = Object.keys(tensors);
  for (const name of names) {
    const t = tensors[name];
    const dtype = t.dtype ?? defaultDtype;
    const n = t.dims.reduce((a, b) => a * b, 1);
    if (n !== t.data.length)
      throw new Error(`encodeSafetensors: ${name}: dims ${t.dims} hold ${n} values, data has ${t.data.length}`);
    const len = n * BYTES[dtype];
    header[name] = { dtype, shape: t.dims, data_offsets: [offset, offset + len] };
    offset += len;
  }
  let json = JSON.stringify(header);
  // pad the header with spaces so the data starts 8-byte aligned (as the reference writer does)
  while ((8 + new TextEncoder().encode(json).length) % 8 !== 0) json += ' ';
  const hbytes = new TextEncoder().encode(json);
  const out = new Uint8Array(8 + hbytes.length + offset);
  const dv = new DataView(out.buffer);
  dv.setBigUint64(0, BigInt(hbytes.length), true);
  out.set(hbytes, 8);
  let p = 8 + hbytes.length;
  for (const name of names) {
    const t = tensors[name];
    const dtype = t.dtype ?? defaultDtype;
    for (let i = 0; i < t.data.length; i++) {
      const v = t.data[i];
      switch (dtype) {
        case 'F32':
          dv.setFloat32(p, v, true);
          p += 4;
          break;
        case 'F64':
          dv.setFloat64(p, v, true);
          p += 8;
          break;
        case 'F16':
          dv.setUint16(p, f32ToF16Bits(v), true);
          p += 2;
          break;
        case 'BF16':
          dv.setUint16(p, f32ToBf16Bits(v), true);
          p += 2;
          break;
        case 'U8':
          dv.setUint8(p, v);
          p += 1;
          break;
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------- reader

export interface ReadResult {
  tensors: Record<string, StTensor & { dtype: StDtype }>;
  metadata: Record<string, string> | undefined;
}

/** Parse safetensors bytes; every tensor is decoded to Float32Array (F64 → Float64Array). */
export function decodeSafetensors(bytes: Uint8Array): ReadResult {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.byteLength < 8) throw new Error('safetensors: file shorter than 8 bytes');
  const hlen = Number(dv.getBigUint64(0, true));
  if (8 + hlen > bytes.byteLength) throw new Error('safetensors: header length past end of file');
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + hlen))) as Record<string, any>;
  const base = 8 + hlen;
  const tensors: ReadResult['tensors'] = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const dtype = info.dtype as StDtype;
    if (!(dtype in BYTES)) throw new Error(`safetensors: ${name}: unsupported dtype ${dtype}`);
    const dims = info.shape as number[];
    const n = dims.reduce((a, b) => a * b, 1);
    const [b, e] = info.data_offsets as [number, number];
    if (e - b !== n * BYTES[dtype])
      throw new Error(`safetensors: ${name}: byte length ${e - b} != ${n} × ${BYTES[dtype]}`);
    if (base + e > bytes.byteLength) throw new Error(`safetensors: ${name}: data past end of file`);
    let p = base + b;
    const data = dtype === 'F64' ? new Float64Array(n) : new Float32Array(n);
    for (let i = 0; i < n; i++) {
      switch (dtype) {
        case 'F32':
          data[i] = dv.getFloat32(p, true);
          p += 4;
          break;
        case 'F64':
          data[i] = dv.getFloat64(p, true);
          p += 8;
          break;
        case 'F16':
          data[i] = f16BitsToF32(dv.getUint16(p, true));
          p += 2;
          break;
        case 'BF16':
          data[i] = bf16BitsToF32(dv.getUint16(p, true));
          p += 2;
          break;
        case 'U8':
          data[i] = dv.getUint8(p);
          p += 1;
          break;
      }
    }
    tensors[name] = { dims, data, dtype };
  }
  return { tensors, metadata: header.__metadata__ };
}
