/**
 * Weight precision: what the graph keeps in memory for each weight, chosen once per model load.
 *
 *  - f32     every weight widened to float32 when the session is created (ORT folds the graph's
 *            Cast into a float32 copy). Fastest per run; 2× the bytes of F16/BF16 checkpoints.
 *  - stored  F16/BF16 weights stay 16-bit in the session and are widened at use, a Cast next to
 *            each MatMul (the embedding table: only the gathered rows). Same numbers as f32 (a
 *            Cast is exact); half the weight memory, and each run pays the casts.
 *  - auto    f32 when the checkpoint is already float32, or when float32 weights fit the
 *            backend's memory budget (budget.ts); otherwise stored.
 *
 * Measured on a 75M-parameter F16 llama (145 MB of weights), onnxruntime-node, 64 tokens, peak
 * RSS of the process (about 90 MB of it Node itself): f32 495 MB, stored 344 MB.
 *
 * Computation is float32 in every mode. The chosen precision and why are in ModelInfo
 * (`weights`, `weights_reason`) and so in every document.
 */
import { LoupeError } from './errors';
import { estimateMemory, fmtGB, weightBytesAt, type BudgetLimits, type MemoryBackend, type WeightStats } from './budget';
import type { WeightPrecision } from './budget';

export type { WeightPrecision } from './budget';
/** what a caller may ask for (q8 is a WeightPrecision budget.ts can estimate, not yet offered here) */
export type WeightsMode = 'auto' | 'f32' | 'stored';

export const WEIGHTS_MODES: readonly WeightsMode[] = ['auto', 'f32', 'stored'];
/** the precisions a model can run at, for TOO_LARGE hints */
export const OFFERED_PRECISIONS: WeightPrecision[] = ['f32', 'stored'];

export function parseWeightsMode(v: unknown): WeightsMode {
  if (v === undefined || v === null || v === '') return 'auto';
  if (typeof v === 'string' && (WEIGHTS_MODES as readonly string[]).includes(v)) return v as WeightsMode;
  throw new LoupeError('BAD_INPUT', `weights must be one of ${WEIGHTS_MODES.join(', ')} (got '${String(v)}').`, "auto: float32 when it fits, else the stored 16-bit precision; f32: widen every weight up front; stored: keep F16/BF16 weights 16-bit and widen at use.");
}

export interface PrecisionChoice {
  precision: WeightPrecision;
  reason: string;
}

/** The precision a model runs at on `backend`, and why. */
export function choosePrecision(mode: WeightsMode, w: WeightStats, backend: MemoryBackend, limits: BudgetLimits = {}): PrecisionChoice {
  const f32 = weightBytesAt(w, 'f32');
  const stored = weightBytesAt(w, 'stored');
  const sixteen = stored < f32;
  if (mode === 'f32') return { precision: 'f32', reason: sixteen ? `asked for f32: weights widened to float32 (${fmtGB(f32)}) at load` : 'asked for f32; the weights are stored as float32' };
  if (mode === 'stored') return { precision: 'stored', reason: sixteen ? `asked for stored: 16-bit weights (${fmtGB(stored)}) widened at use` : 'asked for stored; the weights are stored as float32, so nothing is widened' };
  if (!sixteen) return { precision: 'f32', reason: 'auto: the weights are stored as float32' };
  const est = estimateMemory(w, backend, 'f32', limits);
  if (est.fits) return { precision: 'f32', reason: `auto: float32 weights (${fmtGB(f32)}) fit ${backend}${est.limitBytes ? ` (${est.limitName}, ${fmtGB(est.limitBytes)})` : ''} and run faster than widening at use` };
  return { precision: 'stored', reason: `auto: float32 weights would need about ${fmtGB(est.poolBytes)}, more than ${est.limitName} (${fmtGB(est.limitBytes!)}) on ${backend}; 16-bit weights (${fmtGB(stored)}) widened at use` };
}

/**
 * onnxruntime session options per precision. logSeverityLevel 3 for stored: onnxruntime warns
 * once per weight that an initializer listed as a graph input "will not be treated as constant",
 * which is the point (onnx-builder.ts rawWeight).
 */
export function precisionSessionOptions(p: WeightPrecision): Record<string, unknown> {
  return p === 'stored' ? { logSeverityLevel: 3 } : {};
}
