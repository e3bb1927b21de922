/**
 * GPT-OSS's and Gemma 4's stacked experts as Loupe's per-expert matrices, the one place their stored
 * layouts are read (Gemma 4's: `experts.gate_up_proj` [E, 2M, D], `experts.down_proj` [E, D, M],
 * each expert's rows in torch Linear's [out, in]: kind 'rows', copied as they are).
 *
 * A GPT-OSS checkpoint stores each layer's experts stacked, in one of two forms:
 *   MXFP4 (the published checkpoints, quantization_config.quant_method 'mxfp4'): `{proj}_blocks`
 *     U8 [E, R, G, 16] and `{proj}_scales` U8 [E, R, G], R the output rows, G = inputs / 32. Row r
 *     of expert e holds G blocks of 32 inputs: byte j of block g is inputs 32g + 2j (its low nibble)
 *     and 32g + 2j + 1 (its high nibble), each nibble an FP4 e2m1 code (the sign bit 8, then
 *     0, 0.5, 1, 1.5, 2, 3, 4, 6), times 2^(scale − 127) (an e8m0 scale per block). This is
 *     transformers' integrations/mxfp4.py convert_moe_packed_tensors, before its transpose.
 *   dense (a checkpoint saved dequantised): `{proj}` [E, inputs, R] (`gate_up_proj` [E, D, 2M],
 *     `down_proj` [E, M, D]).
 * gate_up_proj's rows interleave the two projections: row 2j is gate j, row 2j + 1 is up j
 * (modeling_gpt_oss.py: `gate, up = gate_up[..., ::2], gate_up[..., 1::2]`), as its bias does.
 *
 * The adapter (arch/gpt_oss.ts) names, per expert, a gate, up and down matrix [out, in] and their
 * biases: entries of one file made at load, EXPERTS_FILE, each with the `derived` recipe that
 * fills it (`deriveRows`, from the headers alone). `materializeDerived` makes that file, read by
 * range, before any session: MXFP4 is dequantised to BFloat16, which holds every value exactly (an FP4 value
 * has at most 2 significant bits; the scales' 2^−127…2^127 are within its exponent range bar the
 * subnormal end); a dense checkpoint's values are copied in their own dtype. The graph then holds
 * them as any stored BFloat16 weight: widened to float32 at load ('f32'), or at use ('stored'),
 * or quantised again (q8, q4).
 */
import { LoupeError } from './errors';
import { DTYPE_BYTES, readEntryRange, type ReadableWeightSet } from './safetensors';
import type { DerivedRows, SafetensorsDtype, TensorEntry } from './safetensors-types';

export type { DerivedRows } from './safetensors-types';

/** the file the derived expert tensors live in (held in JS: built at load, never downloaded) */
export const EXPERTS_FILE = 'loupe-experts.safetensors';

/** the FP4 e2m1 values by their 4-bit code */
export const FP4_VALUES = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6];

/** the next free byte of EXPERTS_FILE per tensor index, so that every entry of one index has its own range */
const cursor = new WeakMap<Map<string, TensorEntry>, number>();

/**
 * Register `name`, rows of expert `r.expert` of r.src, in the tensor index (the adapter calls this
 * with the headers alone: nothing is read) and return its name. Shapes: [count, in] for a matrix
 * (torch Linear's [out, in]), [count] for a bias. Idempotent per index.
 */
export function deriveRows(t: Map<string, TensorEntry>, name: string, r: DerivedRows): string {
  const have = t.get(name);
  if (have?.derived) return name;
  const src = t.get(r.src)!;
  const inputs =
    r.kind === 'mxfp4' ? src.shape[2] * 32 : r.kind === 'dense' ? src.shape[1] : r.kind === 'rows' ? src.shape[2] : 1;
  const dtype: SafetensorsDtype = r.kind === 'mxfp4' ? 'BF16' : src.dtype;
  const shape = r.kind === 'bias' ? [r.count] : [r.count, inputs];
  const byteLength = r.count * inputs * DTYPE_BYTES[dtype];
  const at = cursor.get(t) ?? 0;
  cursor.set(t, at + byteLength + ((8 - (byteLength % 8)) % 8));
  t.set(name, {
    name,
    dtype,
    shape,
    fileOffset: at,
    byteLength,
    file: EXPERTS_FILE,
    derived: { ...r, srcFile: src.file },
  });
  return name;
}

/**
 * MXFP4 blocks and scales of one stacked projection, checked from the headers before any weight
 * byte: blocks U8 [E, R, inputs / 32, 16], scales U8 [E, R, inputs / 32] (MISSING_TENSOR,
 * SAFETENSORS_UNKNOWN_DTYPE, BAD_TENSOR_SHAPE naming the tensor).
 */
export function checkMxfp4(t: Map<string, TensorEntry>, prefix: string, E: number, R: number, inputs: number): void {
  const expect: [string, number[]][] = [
    [`${prefix}_blocks`, [E, R, inputs / 32, 16]],
    [`${prefix}_scales`, [E, R, inputs / 32]],
  ];
  for (const [name, shape] of expect) {
    const e = t.get(name);
    if (!e)
      throw new LoupeError(
        'MISSING_TENSOR',
        `Tensor ${name} is missing from the weights (this GPT-OSS checkpoint stores its experts as MXFP4 blocks and scales).`,
        'The safetensors files do not match config.json (an incomplete download, or a different quantisation).',
        { tensor: name },
      );
    if (e.dtype !== 'U8')
      throw new LoupeError(
        'SAFETENSORS_UNKNOWN_DTYPE',
        `MXFP4 tensor ${name} is stored as ${e.dtype}; its blocks and scales are U8.`,
        'The checkpoint is not an MXFP4 GPT-OSS checkpoint as transformers writes it.',
        { tensor: name, dtype: e.dtype },
      );
    if (e.shape.length !== shape.length || e.shape.some((d, i) => d !== shape[i]))
      throw new LoupeError(
        'BAD_TENSOR_SHAPE',
        `MXFP4 tensor ${name} has shape [${e.shape}] but config.json implies [${shape}] ` +
          `(${E} experts, ${R} rows, ${inputs} inputs in blocks of 32).`,
        'config.json and the weights disagree, or the file is damaged.',
        { tensor: name, shape: e.shape, expected: shape },
      );
  }
}

/** MXFP4 row `row` of expert e (its `inputs` values) into `out` as float32, from the expert's blocks and scales */
function dequantRow(blocks: Uint8Array, scales: Uint8Array, row: number, G: number, out: Float32Array): void {
  for (let g = 0; g < G; g++) {
    const s = 2 ** (scales[row * G + g] - 127);
    const base = (row * G + g) * 16;
    for (let j = 0; j < 16; j++) {
      const byte = blocks[base + j];
      out[g * 32 + 2 * j] = FP4_VALUES[byte & 0x0f] * s;
      out[g * 32 + 2 * j + 1] = FP4_VALUES[byte >> 4] * s;
    }
  }
}

/**
 * EXPERTS_FILE as a RangedFile (WeightSet.ranged) over the entries that name it: a range read is
 * made then, entry by entry, from the checkpoint's own bytes, so no buffer of the whole file is
 * ever held (gpt-oss-20b's experts are ~38 GB as BF16; one JS array holds at most 4 GiB). Nothing
 * when no entry names it, or it is there already.
 */
export function materializeDerived(weights: ReadableWeightSet): void {
  const derived = [...weights.tensors.values()]
    .filter((e) => e.derived && e.file === EXPERTS_FILE)
    .sort((a, b) => a.fileOffset - b.fileOffset);
  if (derived.length === 0 || weights.files.has(EXPERTS_FILE) || weights.ranged?.has(EXPERTS_FILE)) return;
  const size = derived.reduce((m, e) => Math.max(m, e.fileOffset + e.byteLength), 0);
  // one expert's source bytes, read once for the entries that share them (gate and up rows of gate_up_proj)
  let slab: { key: string; bytes: Uint8Array } | undefined;
  const sourceOf = (name: string, expert: number): Uint8Array => {
    const key = `${name}#${expert}`;
    if (slab?.key !== key) {
      const e = weights.tensors.get(name)!;
      const per = e.byteLength / e.shape[0];
      slab = { key, bytes: readEntryRange(weights, e, expert * per, per).slice() };
    }
    return slab.bytes;
  };
  /** one entry's bytes */
  const make = (e: TensorEntry): Uint8Array => {
    const r = e.derived!;
    const out = new Uint8Array(e.byteLength);
    if (r.kind === 'mxfp4') {
      const G = weights.tensors.get(r.src)!.shape[2];
      const blocks = sourceOf(r.src, r.expert);
      const se = weights.tensors.get(r.scales!)!;
      const per = se.byteLength / se.shape[0];
      const sc = readEntryRange(weights, se, r.expert * per, per);
      const row = new Float32Array(G * 32);
      const bits = new Uint32Array(row.buffer);
      const dv = new DataView(out.buffer);
      for (let j = 0; j < r.count; j++) {
        dequantRow(blocks, sc, r.start + j * r.step, G, row);
        // exact in BFloat16: its high 16 bits
        for (let i = 0; i < row.length; i++) dv.setUint16((j * row.length + i) * 2, bits[i] >>> 16, true);
      }
      return out;
    }
    const src = weights.tensors.get(r.src)!;
    const b = DTYPE_BYTES[src.dtype];
    const bytes = sourceOf(r.src, r.expert);
    if (r.kind === 'rows') {
      // [R, in] → rows [count, in]: row start + j·step to j, whole
      const n = src.shape[2] * b;
      for (let j = 0; j < r.count; j++)
        out.set(bytes.subarray((r.start + j * r.step) * n, (r.start + j * r.step + 1) * n), j * n);
      return out;
    }
    const R = src.shape[src.shape.length - 1];
    const inputs = r.kind === 'dense' ? src.shape[1] : 1;
    // dense [in, R] → rows [count, in]: element (i, start + j·step) to (j, i); bias [R] → [count]
    for (let j = 0; j < r.count; j++)
      for (let i = 0; i < inputs; i++) {
        const from = (i * R + r.start + j * r.step) * b;
        out.set(bytes.subarray(from, from + b), (j * inputs + i) * b);
      }
    return out;
  };
  let last: { e: TensorEntry; bytes: Uint8Array } | undefined;
  const read = (offset: number, length: number, into?: Uint8Array): Uint8Array => {
    const out = into && into.byteLength >= length ? into.subarray(0, length) : new Uint8Array(length);
    out.fill(0); // the alignment gaps between entries
    // the first entry ending after offset (binary search), then every entry starting before the range's end
    let lo = 0;
    for (let hi = derived.length; lo < hi;) {
      const mid = (lo + hi) >> 1;
      if (derived[mid].fileOffset + derived[mid].byteLength <= offset) lo = mid + 1;
      else hi = mid;
    }
    for (let i = lo; i < derived.length && derived[i].fileOffset < offset + length; i++) {
      const e = derived[i];
      if (last?.e !== e) last = { e, bytes: make(e) };
      const from = Math.max(offset, e.fileOffset);
      const to = Math.min(offset + length, e.fileOffset + e.byteLength);
      out.set(last.bytes.subarray(from - e.fileOffset, to - e.fileOffset), from - offset);
    }
    return out;
  };
  (weights.ranged ??= new Map()).set(EXPERTS_FILE, {
    size,
    read,
    readAsync: async (o: number, n: number) => read(o, n),
  });
}
