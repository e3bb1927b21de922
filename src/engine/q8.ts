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
 * The quantised weights are one safetensors file (`loupe-q8.safetensors` in the WeightSet the
 * sessions are built from, so the Node and web session factories take it like any other weight
 * file): per matrix its int8 values then its float16 scales (as `<name>#q8_scale`), each 8-byte
 * aligned, then an 8-byte check value (`loupe.q8.check`). The header's metadata names the format
 * and the entry's key. Where a Q8Store is given (a Hub model's byte cache: IndexedDB in the page,
 * a directory in Node; src/node/q8-cache.ts for folders) the file is written there once, tensor
 * by tensor, and later loads read it back instead of quantising again; otherwise it is built in
 * memory. See `q8WeightSet` for what makes an entry valid.
 */
import type { ModelSpec, LinearRef } from './spec';
import type { Q8Layout, TensorEntry, WeightSet } from './safetensors-types';

export type { Q8Layout } from './safetensors-types';
import { decodeValues, f16Values, f32ToF16, readEntryRange, type ReadableWeightSet } from './safetensors';
import { absMax, dequantizeQ4Rows, Q4_BLOCK, q4Fits, quantizeQ4Rows } from './q4';
import type { RangedFile } from './safetensors-types';
import { LoupeError } from './errors';

export const Q8_BLOCK = 32;

export function q8BlockSize(inDim: number): number {
  return inDim % Q8_BLOCK === 0 ? Q8_BLOCK : inDim;
}

/** a quantised load's scheme: q8 for every matrix, or q4 for the Linears (q4.ts) with q8 for the rest */
export type QuantScheme = 'q8' | 'q4';

/** A matrix a quantised load stores in fewer bits: its input axis, and whether it is a Linear's weight (q4 takes those). */
interface Target {
  axis: 0 | 1;
  linear: boolean;
}

/** The tensors a quantised load stores in fewer bits. */
function quantTargets(spec: ModelSpec): Map<string, Target> {
  const out = new Map<string, Target>([
    [spec.embed.w, { axis: 1, linear: false }],
    [spec.unembed.w, { axis: 1, linear: false }],
  ]);
  if (spec.posEmbed) out.set(spec.posEmbed.w, { axis: 1, linear: false });
  const lin = (r: LinearRef | undefined) => {
    if (r && !out.has(r.w)) out.set(r.w, { axis: r.layout === 'out_in' ? 1 : 0, linear: true });
  };
  // Gemma 4's per-layer token table [V', L·P] (E2B: 2.3B of its 5.1B parameters), read by rows as the embedding is
  if (spec.perLayerInput) {
    out.set(spec.perLayerInput.embed, { axis: 1, linear: false });
    lin(spec.perLayerInput.projection);
  }
  for (const l of spec.layers) {
    if (l.attn) {
      const { qkv, o } = l.attn;
      if (qkv.kind === 'separate') {
        lin(qkv.q);
        lin(qkv.k);
        lin(qkv.v);
      } else lin(qkv.qkv);
      lin(o);
    }
    if (l.linearAttn) for (const r of ['qkv', 'z', 'b', 'a', 'out'] as const) lin(l.linearAttn[r]);
    lin(l.perLayer?.gate);
    lin(l.perLayer?.proj);
    lin(l.mlp?.up);
    lin(l.mlp?.gate);
    lin(l.mlp?.down);
    if (l.moe) {
      // the experts only: the router ([E, D], small) stays as stored, since a rounded logit can change which experts run
      for (const ex of [...l.moe.experts, ...(l.moe.shared ? [l.moe.shared.mlp] : [])]) {
        lin(ex.gate);
        lin(ex.up);
        lin(ex.down);
      }
    }
  }
  return out;
}

/** The matrices --weights q4 stores 4-bit (the rest of its targets are q8): budget.ts weightStats counts them. */
export function q4Names(spec: ModelSpec, tensors: Map<string, Pick<TensorEntry, 'shape'>>): Set<string> {
  const out = new Set<string>();
  for (const [name, { axis, linear }] of quantTargets(spec)) {
    const shape = tensors.get(name)?.shape;
    if (linear && shape?.length === 2 && q4Fits(shape[axis === 1 ? 1 : 0])) out.add(name);
  }
  return out;
}

// ---------------------------------------------------------------- number formats

export { f32ToF16 } from './safetensors';

// ---------------------------------------------------------------- quantise

/** elements quantised per slab: bounds the working buffers (16 MiB of float32) whatever the matrix */
const SLAB_ELEMS = 1 << 22;

/** Reusable working buffers of one build, so no slab, row or block allocates. */
class Scratch {
  w = new Float32Array(SLAB_ELEMS);
  q = new Int8Array(SLAB_ELEMS);
  /** q4: a Conv1D matrix transposed to output-channel rows */
  t = new Float32Array(0);
  colMax = new Float32Array(0);
  colScale = new Float64Array(0);
  cols(C: number) {
    if (this.colMax.length < C) {
      this.colMax = new Float32Array(C);
      this.colScale = new Float64Array(C);
    }
  }
}

/** a block's scale: float16 bits of float32(max |w|)/127 */
const scaleBits = (m: number): number => f32ToF16(Math.fround(m / 127));

/** the divisor a scale gives: its value, ∞ for a zero scale (so every q is 0) */
const divisorOf = (h: number, t: Float32Array): number => (t[h] > 0 ? t[h] : Infinity);

/** q = clamp(round_half_away(x), ±127): x ± 0.5 truncated (|x| < 2^31); NaN → 0 */
function q8Of(x: number): number {
  const r = (x < 0 ? x - 0.5 : x + 0.5) | 0;
  return r > 127 ? 127 : r < -127 ? -127 : r;
}

/**
 * [rows, C] values along axis 1 (blocks of `block` consecutive values of a row): int8 into `q`,
 * scale bits into `sc` from `k`; returns the next scale index.
 */
function quantizeRows(
  w: Float32Array,
  rows: number,
  C: number,
  block: number,
  q: Int8Array,
  sc: Uint16Array,
  k: number,
): number {
  const t = f16Values();
  for (let base = 0, n = rows * C; base < n; base += block) {
    const end = base + block;
    const h = scaleBits(absMax(w, base, end));
    sc[k++] = h;
    const sv = divisorOf(h, t);
    for (let j = base; j < end; j++) q[j] = q8Of(w[j] / sv);
  }
  return k;
}

/** [nBlocks · block, C] values along axis 0 (blocks of `block` rows, one scale per column each) */
function quantizeCols(
  w: Float32Array,
  nBlocks: number,
  C: number,
  block: number,
  q: Int8Array,
  sc: Uint16Array,
  k: number,
  s: Scratch,
): number {
  const t = f16Values();
  s.cols(C);
  const mx = s.colMax,
    sv = s.colScale;
  for (let b = 0; b < nBlocks; b++) {
    const first = b * block * C;
    mx.fill(0, 0, C);
    for (let r = 0, a = first; r < block; r++)
      for (let c = 0; c < C; c++, a++) {
        const v = Math.abs(w[a]);
        if (v > mx[c]) mx[c] = v;
      }
    for (let c = 0; c < C; c++) {
      const h = scaleBits(mx[c]);
      sc[k++] = h;
      sv[c] = divisorOf(h, t);
    }
    for (let r = 0, a = first; r < block; r++) for (let c = 0; c < C; c++, a++) q[a] = q8Of(w[a] / sv[c]);
  }
  return k;
}

/** One matrix to be quantised and where its bytes go in the file (offsets from the data start). */
interface Q8Item {
  src: TensorEntry;
  axis: 0 | 1;
  /** 8: q8 (int8 values, float16 scales); 4: q4.ts (packed nibbles, float32 scales) */
  bits: 8 | 4;
  block: number;
  begin: number;
  scaleBegin: number;
  scaleShape: number[];
  nScales: number;
  /** bytes of the values and of the scales */
  valueBytes: number;
  scaleBytes: number;
}

/**
 * Quantise one matrix slab by slab (whole rows at axis 1, whole blocks of rows at axis 0; a q4
 * matrix at axis 0 whole, as its bytes are in output-channel order), each slab's value bytes
 * handed to `put` as soon as they exist (the buffer is reused: `put` copies); returns the scales'
 * bytes (float16 bits at q8, float32 at q4).
 */
async function quantizeItem(
  weights: ReadableWeightSet,
  it: Q8Item,
  s: Scratch,
  put: (bytes: Uint8Array) => void | Promise<void>,
): Promise<Uint8Array> {
  const { src, axis, block, bits } = it;
  const [R, C] = src.shape;
  const esize = src.dtype === 'F32' ? 4 : 2;
  const unit = axis === 1 ? 1 : block; // rows a slab is a multiple of
  const rowsPer = bits === 4 && axis === 0 ? R : Math.max(unit, Math.floor(SLAB_ELEMS / C / unit) * unit);
  if (rowsPer * C > s.w.length) {
    s.w = new Float32Array(rowsPer * C);
    s.q = new Int8Array(rowsPer * C);
  }
  const sc = bits === 4 ? new Float32Array(it.nScales) : new Uint16Array(it.nScales);
  let k = 0;
  for (let r0 = 0; r0 < R; r0 += rowsPer) {
    const rows = Math.min(rowsPer, R - r0),
      n = rows * C;
    const raw = readEntryRange(weights, src, r0 * C * esize, n * esize);
    if (raw.byteLength !== n * esize)
      throw new LoupeError(
        'SAFETENSORS_TRUNCATED',
        `${src.file}: read ${raw.byteLength} of ${n * esize} bytes of tensor "${src.name}".`,
        'The file is damaged or incomplete: delete it (or clear the cache) and download it again.',
        { file: src.file, tensor: src.name },
      );
    decodeValues(src.dtype, raw, 0, n, s.w);
    if (bits === 4) {
      const packed = new Uint8Array(s.q.buffer, 0, n / 2);
      const to = { packed, scales: sc as Float32Array };
      k = quantizeQ4Rows(axis === 1 ? s.w : transposed(s.w, R, C, s), n, to, k);
      await put(packed);
    } else {
      k =
        axis === 1
          ? quantizeRows(s.w, rows, C, block, s.q, sc as Uint16Array, k)
          : quantizeCols(s.w, rows / block, C, block, s.q, sc as Uint16Array, k, s);
      await put(new Uint8Array(s.q.buffer, 0, n));
    }
  }
  return new Uint8Array(sc.buffer);
}

/** [R, C] row-major → [C, R], into the scratch's buffer */
function transposed(w: Float32Array, R: number, C: number, s: Scratch): Float32Array {
  if (s.t.length < R * C) s.t = new Float32Array(R * C);
  for (let r = 0; r < R; r++) for (let c = 0; c < C; c++) s.t[c * R + r] = w[r * C + c];
  return s.t;
}

/**
 * Quantise one stored [r, c] Linear matrix along `axis` in memory: its values (q8: int8, same
 * layout; q4: packed nibbles, output-channel major) then its scales (float16 at q8, float32 at
 * q4), in one buffer.
 */
export async function quantizeMatrix(
  dtype: string,
  raw: Uint8Array,
  shape: number[],
  axis: 0 | 1,
  scheme: QuantScheme = 'q8',
): Promise<{ bytes: Uint8Array; block: number; scaleShape: number[]; nScales: number; bits: 8 | 4 }> {
  const [it] = q8Items(
    new Map([
      [
        'm',
        {
          name: 'm',
          dtype: dtype as TensorEntry['dtype'],
          shape,
          fileOffset: 0,
          byteLength: raw.byteLength,
          file: 'm',
        },
      ],
    ]),
    new Map([['m', { axis, linear: true }]]),
    scheme,
  );
  const n = it.valueBytes;
  const bytes = new Uint8Array(n + it.scaleBytes);
  let at = 0;
  const sc = await quantizeItem(
    { files: new Map([['m', raw]]), paths: new Map(), tensors: new Map(), metadata: {} },
    it,
    new Scratch(),
    (b) => {
      bytes.set(b, at);
      at += b.byteLength;
    },
  );
  bytes.set(sc, n);
  return { bytes, block: it.block, scaleShape: it.scaleShape, nScales: it.nScales, bits: it.bits };
}

// ---------------------------------------------------------------- the file

/** the WeightSet's name for the quantised weights (in memory or a cache entry's file) */
export const Q8_FILE = 'loupe-q8.safetensors';
export const Q4_FILE = 'loupe-q4.safetensors';
/**
 * Per scheme: its file's name, the format (the scheme and layout's version: an entry of another
 * one is not read, its key differs too), the check tensor, the check value's tag and the prefix
 * of its store entries. The q8 file holds q8 matrices only; the q4 file q4 Linears and q8 others.
 */
const FILES: Record<QuantScheme, { file: string; format: string; check: string; tag: number; entry: string }> = {
  q8: { file: Q8_FILE, format: 'loupe-q8/1', check: 'loupe.q8.check', tag: 0x38, entry: '.loupe/q8-' },
  q4: { file: Q4_FILE, format: 'loupe-q4/1', check: 'loupe.q4.check', tag: 0x34, entry: '.loupe/q4-' },
};
export const Q8_FORMAT = FILES.q8.format;
/** whether a store entry's name is a quantised file of some scheme, and which */
export const quantEntryScheme = (file: string): QuantScheme | undefined =>
  (Object.keys(FILES) as QuantScheme[]).find((k) => file.startsWith(FILES[k].entry));
/** the name a WeightSet gives the quantised file of a load at this scheme */
export const quantFile = (scheme: QuantScheme): string => FILES[scheme].file;
/**
 * The check value hashes SAMPLE_BYTES at every `stride` of the file before it: about MAX_SAMPLES
 * windows whatever the size (a whole read back would cost a cached load as much as the session's
 * own read of the weights), at least every 4 KiB.
 */
const SAMPLE_BYTES = 256,
  MAX_SAMPLES = 1024,
  MIN_STRIDE = 4096;
const strideFor = (end: number) => MIN_STRIDE * Math.max(1, Math.ceil(end / MAX_SAMPLES / MIN_STRIDE));

const align8 = (x: number) => Math.ceil(x / 8) * 8;

/** The target tensors in order, validated, with their scheme (q4 for fitting Linears at q4, else q8) and places in the file's data. */
function q8Items(tensors: Map<string, TensorEntry>, targets: Map<string, Target>, scheme: QuantScheme): Q8Item[] {
  const out: Q8Item[] = [];
  let off = 0;
  for (const [name, { axis, linear }] of targets) {
    const e = tensors.get(name);
    if (!e) continue;
    if (e.shape.length !== 2 || !['F16', 'BF16', 'F32'].includes(e.dtype)) {
      throw new LoupeError(
        'UNSUPPORTED_CONFIG',
        `--weights ${scheme} quantises float matrices; ${name} is ${e.dtype} [${e.shape}].`,
        'Load this model with --weights stored or f32.',
        { tensor: name, dtype: e.dtype },
      );
    }
    const [R, C] = e.shape;
    const inDim = axis === 1 ? C : R,
      outDim = axis === 1 ? R : C;
    const bits = scheme === 'q4' && linear && q4Fits(inDim) ? 4 : 8;
    const block = bits === 4 ? Q4_BLOCK : q8BlockSize(inDim),
      nb = inDim / block,
      nScales = outDim * nb;
    const valueBytes = bits === 4 ? (R * C) / 2 : R * C,
      scaleBytes = (bits === 4 ? 4 : 2) * nScales;
    const begin = off;
    const scaleBegin = align8(begin + valueBytes);
    off = align8(scaleBegin + scaleBytes);
    out.push({
      src: e,
      axis,
      bits,
      block,
      begin,
      scaleBegin,
      nScales,
      valueBytes,
      scaleBytes,
      scaleShape: bits === 4 ? [nScales] : axis === 1 ? [outDim, nb, 1] : [nb, 1, outDim],
    });
  }
  return out;
}

/** 53-bit string hash (cyrb53), as 14 hex digits: an entry's key */
function hash53(str: string, seed = 0): string {
  let h1 = 0xdeadbeef ^ seed,
    h2 = 0x41c6ce57 ^ seed;
  for (let i = 0; i < str.length; i++) {
    const ch = str.charCodeAt(i);
    h1 = Math.imul(h1 ^ ch, 2654435761);
    h2 = Math.imul(h2 ^ ch, 1597334677);
  }
  h1 = Math.imul(h1 ^ (h1 >>> 16), 2246822507) ^ Math.imul(h2 ^ (h2 >>> 13), 3266489909);
  h2 = Math.imul(h2 ^ (h2 >>> 16), 2246822507) ^ Math.imul(h1 ^ (h1 >>> 13), 3266489909);
  return (4294967296 * (2097151 & h2) + (h1 >>> 0)).toString(16).padStart(14, '0');
}

/** The q8 file's header and size, for these items under this key. */
interface Q8Plan {
  scheme: QuantScheme;
  key: string;
  header: Uint8Array;
  dataStart: number;
  checkAt: number;
  size: number;
  items: Q8Item[];
}

function planFile(items: Q8Item[], key: string, scheme: QuantScheme): Q8Plan {
  const json: Record<string, unknown> = { __metadata__: { format: FILES[scheme].format, key } };
  let end = 0;
  for (const it of items) {
    const [R, C] = it.src.shape;
    const q4 = it.bits === 4;
    json[it.src.name] = {
      dtype: q4 ? 'U8' : 'I8',
      shape: q4 ? [it.axis === 1 ? R : C, it.nScales / (it.axis === 1 ? R : C), Q4_BLOCK / 2] : it.src.shape,
      data_offsets: [it.begin, it.begin + it.valueBytes],
    };
    json[`${it.src.name}#${q4 ? 'q4' : 'q8'}_scale`] = {
      dtype: q4 ? 'F32' : 'F16',
      shape: it.scaleShape,
      data_offsets: [it.scaleBegin, it.scaleBegin + it.scaleBytes],
    };
    end = align8(it.scaleBegin + it.scaleBytes);
  }
  json[FILES[scheme].check] = { dtype: 'U8', shape: [8], data_offsets: [end, end + 8] };
  let text = JSON.stringify(json);
  text += ' '.repeat((8 - ((8 + text.length) % 8)) % 8); // the data starts 8-byte aligned
  const body = new TextEncoder().encode(text);
  const header = new Uint8Array(8 + body.byteLength);
  new DataView(header.buffer).setBigUint64(0, BigInt(body.byteLength), true);
  header.set(body, 8);
  const dataStart = header.byteLength;
  return { scheme, key, header, dataStart, checkAt: dataStart + end, size: dataStart + end + 8, items };
}

/** FNV-1a over the sampled windows of a file's bytes [0, end), fed in order as they are written or read. */
class SampledHash {
  h = 0x811c9dc5;
  readonly stride: number;
  constructor(
    private readonly end: number,
    private readonly tag: number,
  ) {
    this.stride = strideFor(end);
  }
  /** `bytes` are the file's bytes from `pos` */
  update(bytes: Uint8Array, pos: number): void {
    const stop = Math.min(pos + bytes.byteLength, this.end);
    const st = this.stride;
    for (let w = Math.floor(pos / st) * st; w < stop; w += st) {
      const from = Math.max(w, pos),
        to = Math.min(w + SAMPLE_BYTES, stop);
      let h = this.h;
      for (let i = from; i < to; i++) {
        h ^= bytes[i - pos];
        h = Math.imul(h, 16777619);
      }
      this.h = h;
    }
  }
  /** the check tensor's 8 bytes: the hash, then 'LQ8' ('LQ4') and the format's version */
  value(): Uint8Array {
    const out = new Uint8Array(8);
    new DataView(out.buffer).setUint32(0, this.h >>> 0, true);
    out.set([0x4c, 0x51, this.tag, 1], 4);
    return out;
  }
}

/** Whether a stored file is this plan's q8 file, whole: its size, its header byte for byte, and the check value of the sampled windows. */
function entryIsWhole(file: RangedFile, plan: Q8Plan): boolean {
  if (file.size !== plan.size) return false;
  const head = file.read(0, plan.dataStart);
  if (head.byteLength !== plan.dataStart || head.some((b, i) => b !== plan.header[i])) return false;
  const hash = new SampledHash(plan.checkAt, FILES[plan.scheme].tag);
  hash.update(head, 0);
  for (let w = Math.floor(plan.dataStart / hash.stride) * hash.stride; w < plan.checkAt; w += hash.stride) {
    if (w + SAMPLE_BYTES <= plan.dataStart) continue; // inside the header, already hashed
    const from = Math.max(w, plan.dataStart);
    hash.update(file.read(from, Math.min(w + SAMPLE_BYTES, plan.checkAt) - from), from);
  }
  const want = hash.value(),
    got = file.read(plan.checkAt, 8);
  return got.byteLength === 8 && got.every((b, i) => b === want[i]);
}

/** Where the bytes of a file being written go (a cache sink, or one buffer in memory). */
export interface Q8Sink {
  append(bytes: Uint8Array): void;
  /** resolves when what was appended is stored (a cache that writes asynchronously: IndexedDB); lets the build hold little */
  drain?(): Promise<void>;
}

/** Write the q8 file of `plan` into `sink`, tensor by tensor. */
async function writeFile(weights: ReadableWeightSet, plan: Q8Plan, sink: Q8Sink): Promise<void> {
  const hash = new SampledHash(plan.checkAt, FILES[plan.scheme].tag);
  let pos = 0;
  const put = async (bytes: Uint8Array) => {
    hash.update(bytes, pos);
    sink.append(bytes);
    pos += bytes.byteLength;
    await sink.drain?.();
  };
  const padTo = (at: number) => (at > pos ? put(new Uint8Array(at - pos)) : undefined);
  await put(plan.header);
  const s = new Scratch();
  for (const it of plan.items) {
    await padTo(plan.dataStart + it.begin);
    const sc = await quantizeItem(weights, it, s, put);
    await padTo(plan.dataStart + it.scaleBegin);
    // the file is little-endian, as are the typed arrays of every platform onnxruntime-web runs on
    await put(sc);
  }
  await padTo(plan.checkAt);
  await put(hash.value());
}

/**
 * Where quantised weights are kept between loads (source/q8-store.ts over a ByteCache; Node's
 * folders: src/node/q8-cache.ts). Entries are named by `q8WeightSet`; a name encodes its key.
 */
export interface Q8Store {
  /** what identifies the stored bytes of these source weight files (sizes, modification or storage times): part of the key */
  identity(files: string[]): Promise<string>;
  /** a complete entry, read by range (and its path on disk, which onnxruntime-node reads itself), or undefined */
  open(name: string): Promise<{ file: RangedFile; path?: string } | undefined>;
  /** a new entry, started empty; only `commit` makes it one that `open` finds */
  create(name: string): Promise<Q8Sink & { commit(): Promise<void>; abort(): Promise<void> }>;
  drop(name: string): Promise<void>;
  /** after `name` is written: drop this model's other q8 entries (and any other bound the store keeps) */
  retain(name: string): Promise<void>;
}

/** how the q8 weights of a load were had: quantised at load (and kept or not) or read from a store's entry */
export type Q8Source = 'cache' | 'built+cached' | 'built';

/**
 * The q8 file's plan for these items and its entry's name in `store`: a key over the format, the
 * scheme's block, the target tensors and the store's identity of the source files (q8WeightSet).
 */
async function entryPlan(
  items: Q8Item[],
  store: Q8Store,
  scheme: QuantScheme,
): Promise<{ plan: Q8Plan; name: string }> {
  // a tensor derived at load (GPT-OSS's experts, mxfp4.ts) is known by the file it is derived from
  const identity = await store.identity([...new Set(items.map((i) => i.src.derived?.srcFile ?? i.src.file))]);
  const material = JSON.stringify([
    FILES[scheme].format,
    scheme === 'q8' ? Q8_BLOCK : [Q8_BLOCK, Q4_BLOCK],
    identity,
    items.map((i) => [i.src.name, i.axis, i.src.file, i.src.dtype, i.src.shape, i.src.fileOffset]),
  ]);
  const plan = planFile(items, hash53(material) + hash53(material, 1), scheme);
  return { plan, name: `${FILES[scheme].entry}${plan.key}.safetensors` };
}

/**
 * The bytes a q8 load of these weights will write into `store`, judged before the download (the
 * page's storage check, source/storage.ts): the whole entry, or 0 where an entry of this key and
 * size is there already (its full check comes at load). A source file not yet complete in the
 * cache changes the key, so a model still to download always needs its entry written.
 */
export async function q8EntryBytesToWrite(
  tensors: Map<string, TensorEntry>,
  spec: ModelSpec,
  store: Q8Store,
  scheme: QuantScheme = 'q8',
): Promise<number> {
  const { plan, name } = await entryPlan(q8Items(tensors, quantTargets(spec), scheme), store, scheme);
  const found = await store.open(name).catch(() => undefined);
  return found?.file.size === plan.size ? 0 : plan.size;
}

/** a store's own failure (not the source weights'): the load goes on in memory */
class StoreFailure extends Error {
  constructor(reason: unknown) {
    super(`q8 cache: ${reason instanceof Error ? reason.message : String(reason)}`);
  }
}

/**
 * The WeightSet sessions are built from at q8: the target tensors replaced by I8 entries (with
 * their Q8Layout) in the q8 file; everything else as it was.
 *
 * With a store, the file's entry is named by a key over the format, the scheme's block, the
 * target tensors (name, axis, source file, dtype, shape, offset) and the store's identity of the
 * source files, so changed weights or a new scheme never read an old entry. An entry is used only
 * when whole (`entryIsWhole`: exact size, the expected header byte for byte, the check value of
 * 256-byte windows spread over the file, about 1024 of them); a write that fails or is cancelled never commits, a broken entry is dropped
 * and built again, and a store that cannot write (a full disk, a quota) leaves the load to build
 * in memory. Quantising is deterministic, so the entry's bytes are the ones a build in memory gives.
 */
export async function q8WeightSet(
  weights: ReadableWeightSet,
  spec: ModelSpec,
  store?: Q8Store,
  scheme: QuantScheme = 'q8',
): Promise<ReadableWeightSet & { q8Source: Q8Source; q8StoreFailure?: string }> {
  const items = q8Items(weights.tensors, quantTargets(spec), scheme);
  const FILE = FILES[scheme].file;
  let plan: Q8Plan | undefined;
  let found: { file: RangedFile; path?: string } | undefined;
  let q8Source: Q8Source = 'built';
  let q8StoreFailure: string | undefined;
  if (store) {
    try {
      let name: string;
      ({ plan, name } = await entryPlan(items, store, scheme));
      found = await store.open(name);
      if (found && !entryIsWhole(found.file, plan)) {
        await store.drop(name);
        found = undefined;
      }
      if (found) q8Source = 'cache';
      else {
        const sink = await store.create(name);
        try {
          await writeFile(weights, plan, {
            append: (b) => {
              try {
                sink.append(b);
              } catch (e) {
                throw new StoreFailure(e);
              }
            },
            drain: () =>
              sink.drain?.().catch((e) => {
                throw new StoreFailure(e);
              }) ?? Promise.resolve(),
          });
          await sink.commit().catch((e) => {
            throw new StoreFailure(e);
          });
        } catch (e) {
          await sink.abort().catch(() => undefined);
          throw e;
        }
        found = await store.open(name);
        if (found && entryIsWhole(found.file, plan)) {
          q8Source = 'built+cached';
          await store.retain(name).catch(() => undefined);
        } else {
          found = undefined;
          await store.drop(name).catch(() => undefined);
        }
      }
    } catch (e) {
      if (e instanceof LoupeError) throw e; // the source weights' own errors
      found = undefined; // the store failed: build in memory
      q8StoreFailure = e instanceof Error ? e.message : String(e);
    }
  }
  plan ??= planFile(items, '', scheme);
  const files = new Map(weights.files);
  const paths = new Map(weights.paths);
  const ranged = new Map(weights.ranged ?? []);
  if (found) {
    ranged.set(FILE, found.file);
    if (found.path) paths.set(FILE, found.path);
  } else {
    const bytes = new Uint8Array(plan.size);
    let at = 0;
    await writeFile(weights, plan, {
      append: (b) => {
        bytes.set(b, at);
        at += b.byteLength;
      },
    });
    files.set(FILE, bytes);
  }
  const tensors = new Map(weights.tensors);
  for (const it of plan.items) {
    const { name, shape } = it.src;
    const q4 = it.bits === 4;
    const scale: TensorEntry = {
      name: `${name}#${q4 ? 'q4' : 'q8'}_scale`,
      dtype: q4 ? 'F32' : 'F16',
      shape: it.scaleShape,
      fileOffset: plan.dataStart + it.scaleBegin,
      byteLength: it.scaleBytes,
      file: FILE,
    };
    const [n, k] = it.axis === 1 ? shape : [shape[1], shape[0]];
    tensors.set(name, {
      name,
      dtype: q4 ? 'U8' : 'I8',
      shape: [...shape],
      fileOffset: plan.dataStart + it.begin,
      byteLength: it.valueBytes,
      file: FILE,
      ...(q4
        ? { q4: { axis: it.axis, block: it.block, n, k, scale } }
        : { q8: { axis: it.axis, block: it.block, scale } }),
    });
  }
  return { ...weights, files, paths, ranged, tensors, q8Source, ...(q8StoreFailure ? { q8StoreFailure } : {}) };
}

/** A q8 or q4 tensor's values as the session uses them (q · s; (u − 8) · s), as float32, in its stored layout. */
export function dequantizeQ8(weights: ReadableWeightSet, name: string): Float32Array {
  const e = weights.tensors.get(name);
  if (e?.q4) return dequantizeQ4Rows(weights, e, 0, e.shape[0]);
  if (!e?.q8) throw new Error(`dequantizeQ8: ${name} is not a quantised tensor`);
  return dequantizeQ8Rows(weights, e, 0, e.shape[0]);
}

/**
 * Rows [start, start + n) of a q8 matrix as the session uses them, q · s, without the rest of the
 * matrix (into `out` when given: a reused buffer; `scratch`: one for the int8 bytes read, see
 * RangeReader). Either layout: blocked along its rows (axis 1:
 * [out, in], the vocabulary tables among them; a row's scales follow it) or along its columns
 * (axis 0: [in, out], GPT-2's Conv1D; `block` consecutive rows share one scale per column). The
 * product of an int8 and a float16 is exact in float32, so these equal the graph's values bit for bit.
 */
export function dequantizeQ8Rows(
  weights: ReadableWeightSet,
  e: TensorEntry,
  start: number,
  n: number,
  out: Float32Array = new Float32Array(n * e.shape[1]),
  scratch?: Uint8Array,
): Float32Array {
  if (!e.q8) throw new Error(`dequantizeQ8Rows: ${e.name} is not a q8 tensor`);
  const C = e.shape[1],
    block = e.q8.block;
  const qb = readEntryRange(weights, e, start * C, n * C, scratch);
  const q = new Int8Array(qb.buffer, qb.byteOffset, n * C);
  // the scales these rows use: axis 1, n · C/block of them (one per block of a row); axis 0, C per block of rows touched
  const first = e.q8.axis === 1 ? start * (C / block) : Math.floor(start / block) * C;
  const count = e.q8.axis === 1 ? n * (C / block) : (Math.floor((start + n - 1) / block) + 1) * C - first;
  const s = q8Scales(weights, e.q8.scale, first, count);
  if (e.q8.axis === 1) {
    for (let k = 0; k < s.length; k++) {
      const sv = s[k];
      for (let i = k * block; i < (k + 1) * block; i++) out[i] = q[i] * sv;
    }
  } else {
    for (let r = 0; r < n; r++) {
      const so = Math.floor((start + r) / block) * C - first;
      for (let c = 0, i = r * C; c < C; c++, i++) out[i] = q[i] * s[so + c];
    }
  }
  return out;
}

/** scales [first, first + count) of a q8 tensor as float32: float16 bits, or float32 in the WebGPU form (q8ForWebGpu) */
function q8Scales(weights: ReadableWeightSet, scale: TensorEntry, first: number, count: number): Float32Array {
  const out = new Float32Array(count);
  if (scale.dtype === 'F32') {
    out.set(new Float32Array(readEntryRange(weights, scale, 4 * first, 4 * count).slice().buffer));
    return out;
  }
  const raw = readEntryRange(weights, scale, 2 * first, 2 * count);
  const t = f16Values();
  for (let k = 0; k < count; k++) out[k] = t[raw[2 * k] | (raw[2 * k + 1] << 8)];
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
 * The float32 tensors are files widened as they are read (`widenedFile`), never held in JS: the
 * session reads each once as it copies it to the GPU, and DLA's reads take the rows they need.
 */
export function q8ForWebGpu(weights: ReadableWeightSet): ReadableWeightSet {
  const tensors = new Map(weights.tensors);
  const ranged = new Map(weights.ranged ?? []);
  let i = 0;
  for (const [name, e] of weights.tensors) {
    if (!e.q8 && (e.dtype === 'F16' || e.dtype === 'BF16')) {
      const file = `loupe-q8-f32-${i++}.bin`;
      ranged.set(file, widenedFile(weights, e));
      tensors.set(name, { ...e, dtype: 'F32', fileOffset: 0, byteLength: 2 * e.byteLength, file });
    }
    if (!e.q8) continue;
    const src = e.q8.scale;
    const file = `loupe-q8-scales-${i++}.bin`;
    ranged.set(file, widenedFile(weights, src));
    const scale: TensorEntry = { ...src, dtype: 'F32', fileOffset: 0, byteLength: 2 * src.byteLength, file };
    tensors.set(name, { ...e, q8: { ...e.q8, scale, dequantize: true } });
  }
  return { ...weights, ranged, tensors };
}

/** A float16 / bfloat16 tensor `e` as a file of its float32 values, widened from its bytes range by range as it is read. */
function widenedFile(weights: ReadableWeightSet, e: TensorEntry): RangedFile {
  const read = (offset: number, length: number): Uint8Array => {
    const first = Math.max(0, Math.floor(offset / 4)),
      end = Math.min(e.byteLength / 2, Math.ceil((offset + length) / 4));
    if (end <= first) return new Uint8Array(0);
    const f32 = new Float32Array(end - first);
    decodeValues(e.dtype, readEntryRange(weights, e, 2 * first, 2 * (end - first)), 0, end - first, f32);
    const at = offset - 4 * first;
    return new Uint8Array(f32.buffer, at, Math.min(length, f32.byteLength - at));
  };
  return { size: 2 * e.byteLength, read, readAsync: async (o, n) => read(o, n) };
}
