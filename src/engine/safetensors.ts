/**
 * safetensors reader that validates before it trusts.
 *
 * Layout of a file: 8 bytes little-endian u64 N, N bytes of JSON header, then the data buffer.
 * The header maps tensor name -> {dtype, shape, data_offsets: [begin, end]} (offsets relative
 * to the data buffer) plus an optional "__metadata__" string map.
 *
 * API (browser-safe, no Node imports):
 *  - `safetensorsHeaderLength(prefix, fileName, fileSize)`  N from the first 8 bytes (checked against the cap and file size)
 *  - `parseSafetensorsHeader(headerBytes, fileName, fileSize)` validate a header, given the file's first 8 + N bytes
 *       (or more) and the total file size -> { tensors, metadata, dataStart }
 *  - `parseSafetensors(bytes, fileName)`  the same on a whole file in memory
 *  - `readTensorBytes(weights, name)` / `readTensorF32(weights, name, into?)`  a tensor's raw bytes / its values as float32
 *       (F16, BF16, F64 and integer dtypes converted). Bytes come from `weights.files`, else from
 *       `weights.ranged` (a file on disk in Node, IndexedDB chunks in the browser: just that byte range
 *       is read), else `weights.readRange` over `weights.paths`.
 *
 * Every broken rule throws a LoupeError with its own code, naming the file and the tensor:
 *  SAFETENSORS_TRUNCATED (file shorter than the header, or than the data a well-formed header describes),
 *  SAFETENSORS_HEADER_TOO_LARGE (N above MAX_HEADER_BYTES), SAFETENSORS_BAD_HEADER (not JSON, wrong
 *  field types, negative/non-integer dims or offsets), SAFETENSORS_UNKNOWN_DTYPE,
 *  SAFETENSORS_SIZE_MISMATCH (end - begin != numel x dtype size), SAFETENSORS_OVERLAP,
 *  SAFETENSORS_OFFSET_OUT_OF_RANGE (a tensor's data lies past the end of the file).
 */
import { CAPS } from './caps';
import { LoupeError } from './errors';
import type { SafetensorsDtype, TensorEntry, WeightSet } from './safetensors-types';

/** Same cap as the reference Rust implementation (100 MB): a larger header is a broken or hostile file (caps.ts). */
export const MAX_HEADER_BYTES = CAPS.maxHeaderBytes;

export const DTYPE_BYTES: Record<SafetensorsDtype, number> = {
  F64: 8,
  F32: 4,
  F16: 2,
  BF16: 2,
  I64: 8,
  I32: 4,
  I16: 2,
  I8: 1,
  U8: 1,
  BOOL: 1,
};

export interface SafetensorsHeader {
  tensors: TensorEntry[];
  metadata: Record<string, string>;
  /** file offset where the data buffer starts (8 + N) */
  dataStart: number;
}

/**
 * A reader for a byte range of a weight file; Node injects one that reads from disk. `into`: a
 * scratch buffer of at least `length` bytes it may read into and return a view of (the caller is
 * done with the bytes before its next read), so a pass over a whole matrix leaves no garbage.
 */
export type RangeReader = (file: string, offset: number, length: number, into?: Uint8Array) => Uint8Array;

/** WeightSet plus the optional range reader used when a file is only known by its path. */
export type ReadableWeightSet = WeightSet & { readRange?: RangeReader };

const HINT_REDOWNLOAD = 'The file is damaged or incomplete: delete it (or clear the cache) and download it again.';

/** N, the header length, from the first 8 bytes of a file. */
export function safetensorsHeaderLength(prefix: Uint8Array, fileName: string, fileSize: number): number {
  if (fileSize < 8 || prefix.byteLength < 8) {
    throw new LoupeError(
      'SAFETENSORS_TRUNCATED',
      `${fileName}: file is ${fileSize} bytes, too short to hold a safetensors header length (8 bytes).`,
      HINT_REDOWNLOAD,
      { file: fileName },
    );
  }
  const dv = new DataView(prefix.buffer, prefix.byteOffset, 8);
  const n = dv.getBigUint64(0, true);
  if (n > BigInt(MAX_HEADER_BYTES)) {
    throw new LoupeError(
      'SAFETENSORS_HEADER_TOO_LARGE',
      `${fileName}: header length ${n} bytes exceeds the ${MAX_HEADER_BYTES}-byte cap.`,
      'This is not a valid safetensors file (or it is corrupted).',
      { file: fileName, headerLength: n.toString() },
    );
  }
  const len = Number(n);
  if (8 + len > fileSize) {
    throw new LoupeError(
      'SAFETENSORS_TRUNCATED',
      `${fileName}: header says ${len} bytes of JSON but the file is only ${fileSize} bytes.`,
      HINT_REDOWNLOAD,
      { file: fileName },
    );
  }
  return len;
}

function bad(fileName: string, msg: string, tensor?: string): never {
  throw new LoupeError(
    'SAFETENSORS_BAD_HEADER',
    `${fileName}: ${tensor ? `tensor "${tensor}": ` : ''}${msg}`,
    HINT_REDOWNLOAD,
    { file: fileName, ...(tensor ? { tensor } : {}) },
  );
}

function isNonNegInt(x: unknown): x is number {
  return typeof x === 'number' && Number.isSafeInteger(x) && x >= 0;
}

/**
 * Validate a header. `headerBytes` is the start of the file (at least 8 + N bytes); `fileSize` the
 * size of the whole file, against which offsets are checked.
 */
export function parseSafetensorsHeader(headerBytes: Uint8Array, fileName: string, fileSize: number): SafetensorsHeader {
  const n = safetensorsHeaderLength(headerBytes, fileName, fileSize);
  if (headerBytes.byteLength < 8 + n) {
    throw new LoupeError(
      'SAFETENSORS_TRUNCATED',
      `${fileName}: only ${headerBytes.byteLength} of the ${8 + n} header bytes are available.`,
      HINT_REDOWNLOAD,
      { file: fileName },
    );
  }
  let json: unknown;
  try {
    const text = new TextDecoder('utf-8', { fatal: true }).decode(headerBytes.subarray(8, 8 + n));
    json = JSON.parse(text);
  } catch (e) {
    bad(fileName, `header is not valid UTF-8 JSON (${e instanceof Error ? e.message : String(e)}).`);
  }
  if (!json || typeof json !== 'object' || Array.isArray(json)) bad(fileName, 'header is not a JSON object.');

  const dataStart = 8 + n;
  const dataLength = fileSize - dataStart;
  const metadata: Record<string, string> = {};
  const tensors: TensorEntry[] = [];
  const ranges: { name: string; begin: number; end: number }[] = [];

  for (const [name, raw] of Object.entries(json as Record<string, unknown>)) {
    if (name === '__metadata__') {
      if (!raw || typeof raw !== 'object' || Array.isArray(raw)) bad(fileName, '"__metadata__" is not an object.');
      for (const [k, v] of Object.entries(raw as Record<string, unknown>)) {
        if (typeof v !== 'string') bad(fileName, `"__metadata__.${k}" is not a string.`);
        metadata[k] = v;
      }
      continue;
    }
    if (!raw || typeof raw !== 'object' || Array.isArray(raw)) bad(fileName, 'entry is not an object.', name);
    const { dtype, shape, data_offsets } = raw as Record<string, unknown>;
    if (typeof dtype !== 'string') bad(fileName, '"dtype" is missing or not a string.', name);
    if (!Object.prototype.hasOwnProperty.call(DTYPE_BYTES, dtype)) {
      throw new LoupeError(
        'SAFETENSORS_UNKNOWN_DTYPE',
        `${fileName}: tensor "${name}" has dtype ${dtype}, which Loupe does not read.`,
        `Supported dtypes: ${Object.keys(DTYPE_BYTES).join(', ')}. Convert the weights (e.g. to float16 or float32) and save them again.`,
        { file: fileName, tensor: name, dtype },
      );
    }
    if (!Array.isArray(shape) || !shape.every(isNonNegInt))
      bad(fileName, `"shape" must be a list of non-negative integers, got ${JSON.stringify(shape)}.`, name);
    if (
      !Array.isArray(data_offsets) ||
      data_offsets.length !== 2 ||
      !data_offsets.every(isNonNegInt) ||
      data_offsets[0] > data_offsets[1]
    ) {
      bad(
        fileName,
        `"data_offsets" must be [begin, end] with 0 <= begin <= end, got ${JSON.stringify(data_offsets)}.`,
        name,
      );
    }
    const dt = dtype as SafetensorsDtype;
    const [begin, end] = data_offsets as [number, number];
    const numel = (shape as number[]).reduce((a, b) => a * b, 1);
    const expected = numel * DTYPE_BYTES[dt];
    if (!Number.isSafeInteger(expected) || end - begin !== expected) {
      throw new LoupeError(
        'SAFETENSORS_SIZE_MISMATCH',
        `${fileName}: tensor "${name}" (${dt} [${(shape as number[]).join(', ')}]) ` +
          `needs ${expected} bytes but its data_offsets [${begin}, ${end}] span ${end - begin}.`,
        HINT_REDOWNLOAD,
        { file: fileName, tensor: name },
      );
    }
    ranges.push({ name, begin, end });
    tensors.push({
      name,
      dtype: dt,
      shape: [...(shape as number[])],
      fileOffset: dataStart + begin,
      byteLength: end - begin,
      file: fileName,
    });
  }

  // Overlaps: sort by start; an empty tensor overlaps nothing.
  const sorted = ranges.filter((r) => r.end > r.begin).sort((a, b) => a.begin - b.begin || a.end - b.end);
  for (let i = 1; i < sorted.length; i++) {
    const prev = sorted[i - 1],
      cur = sorted[i];
    if (cur.begin < prev.end) {
      throw new LoupeError(
        'SAFETENSORS_OVERLAP',
        `${fileName}: tensors "${prev.name}" [${prev.begin}, ${prev.end}) and "${cur.name}" [${cur.begin}, ${cur.end}) share bytes.`,
        HINT_REDOWNLOAD,
        { file: fileName, tensors: [prev.name, cur.name] },
      );
    }
  }

  // Past the end: when the tensors tile [0, maxEnd) without gaps (as every writer lays them out),
  // the header is sound and the file was cut short; otherwise a tensor's offsets point outside.
  const beyond = sorted.filter((r) => r.end > dataLength);
  if (beyond.length > 0) {
    const contiguous =
      sorted.length > 0 && sorted[0].begin === 0 && sorted.every((r, i) => i === 0 || r.begin === sorted[i - 1].end);
    const maxEnd = sorted[sorted.length - 1].end;
    if (contiguous) {
      throw new LoupeError(
        'SAFETENSORS_TRUNCATED',
        `${fileName}: file is ${fileSize} bytes but its header describes ${dataStart + maxEnd}; tensor "${beyond[0].name}" is cut off.`,
        HINT_REDOWNLOAD,
        { file: fileName, tensor: beyond[0].name, fileSize, expectedSize: dataStart + maxEnd },
      );
    }
    const r = beyond[0];
    throw new LoupeError(
      'SAFETENSORS_OFFSET_OUT_OF_RANGE',
      `${fileName}: tensor "${r.name}" data_offsets [${r.begin}, ${r.end}] end past the data buffer (${dataLength} bytes).`,
      HINT_REDOWNLOAD,
      { file: fileName, tensor: r.name },
    );
  }
  return { tensors, metadata, dataStart };
}

/** Validate a whole safetensors file held in memory. */
export function parseSafetensors(bytes: Uint8Array, fileName: string): SafetensorsHeader {
  return parseSafetensorsHeader(bytes, fileName, bytes.byteLength);
}

/** Build a WeightSet from whole files in memory (browser path), validating every file. */
export function weightSetFromFiles(files: Map<string, Uint8Array>): WeightSet {
  const ws: WeightSet = { files, paths: new Map(), tensors: new Map(), metadata: {} };
  for (const [file, bytes] of files) addHeader(ws, parseSafetensors(bytes, file));
  return ws;
}

/** Merge one file's validated header into a WeightSet; a tensor in two files is a BAD_INDEX. */
export function addHeader(ws: WeightSet, header: SafetensorsHeader): void {
  for (const t of header.tensors) {
    const prev = ws.tensors.get(t.name);
    if (prev) {
      throw new LoupeError(
        'BAD_INDEX',
        `Tensor "${t.name}" appears in both ${prev.file} and ${t.file}.`,
        'The shards of this model disagree; download them again.',
        { tensor: t.name },
      );
    }
    ws.tensors.set(t.name, t);
  }
  Object.assign(ws.metadata, header.metadata);
}

function entryOf(weights: WeightSet, name: string): TensorEntry {
  const e = weights.tensors.get(name);
  if (!e)
    throw new LoupeError('MISSING_TENSOR', `The model has no tensor named "${name}".`, undefined, { tensor: name });
  return e;
}

/** Raw bytes of one tensor (a view into `files` when held in memory, else read via `readRange`). */
export function readTensorBytes(weights: ReadableWeightSet, name: string): Uint8Array {
  const e = entryOf(weights, name);
  return readEntryRange(weights, e, 0, e.byteLength);
}

/**
 * Bytes [offset, offset + length) of a tensor's data (rows of a table without the whole table).
 * `into`: scratch a reader from disk may fill (RangeReader); the result may be a view of it.
 */
export function readEntryRange(
  weights: ReadableWeightSet,
  e: TensorEntry,
  offset: number,
  length: number,
  into?: Uint8Array,
): Uint8Array {
  const start = e.fileOffset + offset;
  const bytes = weights.files.get(e.file);
  if (bytes) return bytes.subarray(start, start + length);
  const ranged = weights.ranged?.get(e.file);
  const read = ranged
    ? (o: number, n: number) => ranged.read(o, n, into)
    : weights.readRange && weights.paths.has(e.file)
      ? (o: number, n: number) => weights.readRange!(e.file, o, n, into)
      : undefined;
  if (read) {
    const out = read(start, length);
    if (out.byteLength !== length) {
      throw new LoupeError(
        'SAFETENSORS_TRUNCATED',
        `${e.file}: read ${out.byteLength} of ${length} bytes of tensor "${e.name}".`,
        HINT_REDOWNLOAD,
        { file: e.file, tensor: e.name },
      );
    }
    return out;
  }
  throw new LoupeError(
    'INTERNAL',
    `Bytes of ${e.file} (tensor "${e.name}") are not loaded and no reader is available.`,
    'Load the model with loadModelFilesNode in Node, or keep the file bytes in WeightSet.files.',
  );
}

/** float16 bits -> float32 value (handles subnormals, inf, NaN). */
export function f16ToF32(h: number): number {
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

const f32Box = new Float32Array(1);
const u32Box = new Uint32Array(f32Box.buffer);
/** float32 value → float16 bits, round half to even (|v| ≥ 65520 → ∞) */
export function f32ToF16(v: number): number {
  f32Box[0] = v;
  const x = u32Box[0];
  const sign = (x >>> 16) & 0x8000,
    abs = x & 0x7fffffff;
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

let f16Table: Float32Array | null = null;
/** float16 bits → value, all 65536 of them (decoding a 2B-parameter model value by value is ~10× slower) */
export function f16Values(): Float32Array {
  if (f16Table) return f16Table;
  const t = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) t[h] = f16ToF32(h);
  return (f16Table = t);
}

let bf16Table: Float32Array | null = null;
/** bfloat16 bits → value, all 65536 of them (the top half of a float32) */
export function bf16Values(): Float32Array {
  return (bf16Table ??= new Float32Array(Uint32Array.from({ length: 65536 }, (_, h) => h << 16).buffer));
}

/**
 * decode `n` values of a stored dtype (F16, BF16, F32) starting at element `from` of `raw` (any
 * alignment) into `out`; 16-bit formats through a 65536-entry table
 */
export function decodeValues(dtype: string, raw: Uint8Array, from: number, n: number, out: Float32Array): void {
  if (dtype === 'F32') {
    new Uint8Array(out.buffer, out.byteOffset, 4 * n).set(raw.subarray(4 * from, 4 * (from + n)));
    return;
  }
  const at = raw.byteOffset + 2 * from;
  const h =
    at % 2 === 0 ? new Uint16Array(raw.buffer, at, n) : new Uint16Array(raw.slice(2 * from, 2 * (from + n)).buffer);
  if (dtype === 'F16') {
    const t = f16Values();
    for (let i = 0; i < n; i++) out[i] = t[h[i]];
  } else {
    // BF16 is the top half of a float32
    const u = new Uint32Array(out.buffer, out.byteOffset, n);
    for (let i = 0; i < n; i++) u[i] = h[i] << 16;
  }
}

/** A tensor's values as float32 (a fresh array, safe to keep and modify). */
export function readTensorF32(weights: ReadableWeightSet, name: string, into?: Uint8Array): Float32Array {
  const e = entryOf(weights, name);
  const n = e.byteLength / DTYPE_BYTES[e.dtype];
  const raw = readEntryRange(weights, e, 0, e.byteLength, into);
  // float32 bytes read into the caller's scratch, aligned: a view of it
  if (e.dtype === 'F32' && into && raw.buffer === into.buffer && raw.byteOffset % 4 === 0)
    return new Float32Array(raw.buffer, raw.byteOffset, n);
  // A fresh, aligned buffer: tensors in a file need not be aligned to their element size, and bytes
  // held in memory are the model's own. A read by range (a file on disk, IndexedDB chunks) is already one.
  const fresh = !weights.files.has(e.file) && raw.byteOffset === 0 && raw.byteLength === raw.buffer.byteLength;
  const buf = fresh ? raw.buffer : raw.slice().buffer;
  switch (e.dtype) {
    case 'F32':
      return new Float32Array(buf, 0, n);
    case 'F64':
      return Float32Array.from(new Float64Array(buf, 0, n));
    case 'F16':
    case 'BF16': {
      const out = new Float32Array(n);
      decodeValues(e.dtype, new Uint8Array(buf), 0, n, out);
      return out;
    }
    case 'I64':
      return Float32Array.from(new BigInt64Array(buf, 0, n), (v) => Number(v));
    case 'I32':
      return Float32Array.from(new Int32Array(buf, 0, n));
    case 'I16':
      return Float32Array.from(new Int16Array(buf, 0, n));
    case 'I8':
      return Float32Array.from(new Int8Array(buf, 0, n));
    case 'U8':
    case 'BOOL':
      return Float32Array.from(new Uint8Array(buf, 0, n));
  }
}
