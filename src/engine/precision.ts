/**
 * Weight precision: what the graph keeps in memory for each weight, chosen once per model load.
 *
 *  - f32     every weight widened to float32 when the session is created (ORT folds the graph's
 *            Cast into a float32 copy). Fastest per run; 2× the bytes of F16/BF16 checkpoints.
 *  - stored  F16/BF16 weights stay 16-bit in the session and are widened at use, a Cast next to
 *            each MatMul (the embedding table: only the gathered rows). Same numbers as f32 (a
 *            Cast is exact); half the weight memory, and each run pays the casts.
 *  - q8      explicit opt-in only: matrices (linears, embeddings, unembedding) as symmetric int8
 *            in blocks of 32 along the input dimension with a float16 scale each (float32 on
 *            WebGPU: q8.ts q8ForWebGpu), widened at use like stored; other weights as stored. About half of stored's bytes; the
 *            numbers change (the doctor and `npm run bench` report by how much).
 *  - q4      explicit opt-in only: the Linear matrices as 4-bit blocks of 32 with a scale each
 *            (q4.ts), multiplied by onnxruntime's MatMulNBits without widening; embeddings, the
 *            unembedding and other matrices as q8. About a third of stored's bytes for a Llama.
 *  - auto    f32 when the checkpoint is already float32, or when float32 weights fit the
 *            backend's memory budget (budget.ts); otherwise stored. Never q8 or q4.
 *
 * Computation is float32 in every mode. The chosen precision and why are in ModelInfo
 * (`weights`, `weights_reason`) and so in every document.
 *
 * Vocabulary tables (embedding / unembedding) are split into row chunks when one piece would be
 * too big (chooseVocabSplit; the graph side is graph/vocab.ts), also in ModelInfo (`vocab_chunks`,
 * `vocab_reason`).
 */
import { LoupeError } from './errors';
import {
  estimateMemory,
  fmtGB,
  weightBytesAt,
  type BudgetLimits,
  type MemoryBackend,
  type WeightStats,
} from './budget';
import type { WeightPrecision } from './budget';

export type { WeightPrecision } from './budget';
/** what a caller may ask for */
export type WeightsMode = 'auto' | 'f32' | 'stored' | 'q8' | 'q4';

export const WEIGHTS_MODES: readonly WeightsMode[] = ['auto', 'f32', 'stored', 'q8', 'q4'];
/** the precisions a model can run at, for TOO_LARGE hints */
export const OFFERED_PRECISIONS: WeightPrecision[] = ['f32', 'stored', 'q8', 'q4'];
/** what each mode does, in one line each (CLI help, MCP schema, the page's selector) */
export const WEIGHTS_HELP =
  'auto: float32 when it fits, else the stored 16-bit precision; f32: widen every weight up front; ' +
  'stored: keep F16/BF16 weights 16-bit and widen at use; q8: 8-bit matrices (int8, ' +
  'a float16 scale per 32), widened at use (changes the numbers slightly; opt-in only); ' +
  'q4: 4-bit Linear weights (a scale per 32, MatMulNBits), other matrices q8 (changes the numbers more; opt-in only).';

export function parseWeightsMode(v: unknown): WeightsMode {
  if (v === undefined || v === null || v === '') return 'auto';
  if (typeof v === 'string' && (WEIGHTS_MODES as readonly string[]).includes(v)) return v as WeightsMode;
  throw new LoupeError(
    'BAD_INPUT',
    `weights must be one of ${WEIGHTS_MODES.join(', ')} (got '${String(v)}').`,
    WEIGHTS_HELP,
  );
}

export interface PrecisionChoice {
  precision: WeightPrecision;
  reason: string;
}

/** The precision a model runs at on `backend`, and why. */
export function choosePrecision(
  mode: WeightsMode,
  w: WeightStats,
  backend: MemoryBackend,
  limits: BudgetLimits = {},
): PrecisionChoice {
  const f32 = weightBytesAt(w, 'f32');
  const stored = weightBytesAt(w, 'stored');
  const sixteen = stored < f32;
  if (mode === 'f32')
    return {
      precision: 'f32',
      reason: sixteen
        ? `asked for f32: weights widened to float32 (${fmtGB(f32)}) at load`
        : 'asked for f32; the weights are stored as float32',
    };
  if (mode === 'q8')
    return {
      precision: 'q8',
      reason: `asked for q8: matrices as int8 with a float16 scale per block (${fmtGB(weightBytesAt(w, 'q8'))}), widened at use`,
    };
  if (mode === 'q4')
    return {
      precision: 'q4',
      reason:
        'asked for q4: Linear matrices as 4-bit with a scale per block, other matrices as q8 ' +
        `(${fmtGB(weightBytesAt(w, 'q4'))}), multiplied by MatMulNBits`,
    };
  if (mode === 'stored')
    return {
      precision: 'stored',
      reason: sixteen
        ? `asked for stored: 16-bit weights (${fmtGB(stored)}) widened at use`
        : 'asked for stored; the weights are stored as float32, so nothing is widened',
    };
  if (!sixteen) return { precision: 'f32', reason: 'auto: the weights are stored as float32' };
  const est = estimateMemory(w, backend, 'f32', limits);
  if (est.fits)
    return {
      precision: 'f32',
      reason:
        `auto: float32 weights (${fmtGB(f32)}) ` +
        `fit ${backend}${est.limitBytes ? ` (${est.limitName}, ${fmtGB(est.limitBytes)})` : ''} and run faster ` +
        'than widening at use',
    };
  return {
    precision: 'stored',
    reason:
      `auto: float32 weights would need about ${fmtGB(est.poolBytes)}, more than ${est.limitName} ` +
      `(${fmtGB(est.limitBytes!)}) on ${backend}; 16-bit weights (${fmtGB(stored)}) widened at use`,
  };
}

/**
 * The precision on a WebGPU adapter. 16-bit weights stay 16-bit in GPU buffers only where shaders
 * can read them: float16 needs the adapter's shader-f16 feature, and WGSL has no bfloat16 at all.
 * With shader-f16, `auto` keeps F16 weights 16-bit (half the GPU memory and upload); without it
 * (or for BF16), 16-bit weights are widened to float32 at load, `stored` included, and the reason
 * says so.
 */
export function choosePrecisionOnGpu(
  mode: WeightsMode,
  w: WeightStats,
  gpu: { shaderF16: boolean },
  limits: BudgetLimits = {},
): PrecisionChoice {
  // q8 needs no shader-f16: its WebGPU form has float32 scales (q8.ts q8ForWebGpu), 2 bytes per 32 weights more
  if (mode === 'q8')
    return {
      precision: 'q8',
      reason:
        'asked for q8: matrices as int8 with a float32 scale per block ' +
        `(${fmtGB(weightBytesAt(w, 'q8') + (2 * w.nParams) / 32)}; float32 scales need no shader-f16), ` +
        'widened at use on the GPU',
    };
  // q4's scales are float32 already; the matrices it leaves at q8 take q8's WebGPU form
  if (mode === 'q4') {
    const q8Part = w.nParams - (w.q4Params ?? 0);
    return {
      precision: 'q4',
      reason:
        'asked for q4: Linear matrices as 4-bit with a float32 scale per block, other matrices as q8 with float32 scales ' +
        `(${fmtGB(weightBytesAt(w, 'q4') + (2 * q8Part) / 32)}), multiplied by MatMulNBits on the GPU`,
    };
  }
  const c = choosePrecision(mode, w, 'webgpu', limits);
  const f16 = w.byDtype.F16 ?? 0,
    bf16 = w.byDtype.BF16 ?? 0;
  if (f16 + bf16 === 0 || mode === 'f32') return c;
  const f32 = fmtSize(weightBytesAt(w, 'f32'));
  if (bf16 > 0)
    return {
      precision: 'f32',
      reason: `${mode}: WebGPU shaders have no bfloat16, so the BF16 weights are widened to float32 (${f32}) at load`,
    };
  if (!gpu.shaderF16)
    return {
      precision: 'f32',
      reason: `${mode}: this WebGPU adapter has no shader-f16, so shaders cannot read float16 weights; widened to float32 (${f32}) at load`,
    };
  if (c.precision === 'stored') return c;
  return {
    precision: 'stored',
    reason:
      `auto: the adapter has shader-f16, so the float16 weights (${fmtSize(weightBytesAt(w, 'stored'))}) ` +
      'stay 16-bit in GPU buffers and are widened at use',
  };
}

/**
 * onnxruntime session options per precision. logSeverityLevel 3 for stored and q8: onnxruntime
 * warns once per weight that an initializer listed as a graph input "will not be treated as
 * constant", which is the point (onnx-builder.ts rawWeight).
 */
export function precisionSessionOptions(p: WeightPrecision): Record<string, unknown> {
  return p !== 'f32' ? { logSeverityLevel: 3 } : {};
}

/**
 * Float32 bytes of one widened chunk of a vocabulary table when weights are widened at use: the
 * unembedding then never holds a float32 copy of more than this many bytes of W_U at a time.
 */
export const WIDEN_CHUNK_BYTES = 64 * 1024 ** 2;

/** fmtGB, with small sizes (test models, forced limits) in KB rather than rounded up to 1 MB */
const fmtSize = (b: number) => (b < 1e6 ? `${Math.max(1, Math.round(b / 1e3))} KB` : fmtGB(b));

export interface VocabSplit {
  /** rows per chunk (the whole vocabulary when unsplit) */
  rows: number;
  chunks: number;
  reason: string;
}

/**
 * Whether (and how finely) the vocabulary tables are split, and why. A chunk's float32 bytes stay
 * within the widening chunk when the table is widened at use, and within `maxTensorBytes` (WebGPU:
 * the adapter's largest buffer binding; a caller may force it lower, e.g. tests).
 */
export function chooseVocabSplit(
  table: { dtype: string; shape: number[] },
  precision: WeightPrecision,
  maxTensorBytes?: number,
): VocabSplit {
  const [V, D] = [table.shape[0], table.shape.slice(1).reduce((a, b) => a * b, 1)];
  const f32Bytes = V * D * 4;
  // q8 tables (q4 keeps its tables q8) are widened at use whatever their stored dtype
  const widened = precision === 'q8' || precision === 'q4' || (precision !== 'f32' && table.dtype !== 'F32');
  const caps: { bytes: number; why: string }[] = [];
  if (widened)
    caps.push({
      bytes: WIDEN_CHUNK_BYTES,
      why: `it is widened to float32 at use, ${fmtGB(WIDEN_CHUNK_BYTES)} at a time`,
    });
  if (maxTensorBytes !== undefined)
    caps.push({ bytes: maxTensorBytes, why: `a tensor may take at most ${fmtSize(maxTensorBytes)} here` });
  const cap = caps.reduce<{ bytes: number; why: string } | null>((a, c) => (!a || c.bytes < a.bytes ? c : a), null);
  const shape = `${V}×${D}`;
  if (!cap || f32Bytes <= cap.bytes)
    return {
      rows: V,
      chunks: 1,
      reason: `whole: the ${shape} vocabulary table is ${fmtSize(f32Bytes)} as float32${cap ? `, within ${fmtSize(cap.bytes)}` : ''}`,
    };
  const chunks = Math.ceil(V / Math.max(1, Math.floor(cap.bytes / (D * 4))));
  const rows = Math.ceil(V / chunks); // chunks as even as they can be
  return {
    rows,
    chunks,
    reason: `split into ${chunks} chunks of ${rows} rows: the ${shape} vocabulary table is ${fmtSize(f32Bytes)} as float32 and ${cap.why}`,
  };
}
