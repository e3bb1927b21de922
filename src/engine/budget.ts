/**
 * How much memory a model needs on each backend and weight precision, and whether that fits the
 * backend's budget. Computed from safetensors headers alone (dtype + shape per tensor), so a model
 * is judged before any weight byte is downloaded (source/preflight.ts) and again, for sources
 * that skip the preflight, when the model is created (model.ts).
 *
 *   const w = weightStats(tensors);                     // params per stored dtype
 *   estimateMemory(w, 'wasm', 'f32')                    // { weightBytes, peakBytes, poolBytes, limitBytes, fits, ... }
 *   checkBudget(w, 'wasm', 'f32', { hostBytes })        // throws TOO_LARGE with a hint naming what would fit
 *
 * The numbers are a model of today's engine, not a promise: the per-backend factors below come
 * from measurements (peak RSS / fp32 weight bytes: docs/BENCHMARKS.md), and whoever changes how weights
 * reach onnxruntime (precision, external data, no second copy) updates them here, in one place.
 */
import { LoupeError } from './errors';
import type { SafetensorsDtype, TensorEntry } from './safetensors-types';

/** how the runtime holds weights: widened to float32, kept in the stored 16-bit dtype, 8-bit blocks, or 4-bit Linears (q4.ts) */
export type WeightPrecision = 'f32' | 'stored' | 'q8' | 'q4';
export type MemoryBackend = 'node' | 'wasm' | 'webgpu';

export const GiB = 1024 ** 3;

/** Parameters of a model by stored dtype, and the bytes they take on disk. */
export interface WeightStats {
  nParams: number;
  /** numel per stored dtype */
  byDtype: Partial<Record<SafetensorsDtype, number>>;
  /** tensor data bytes as stored (sum of byteLength) */
  storedBytes: number;
  /**
   * parameters --weights q4 stores 4-bit (q8.ts q4Names: the Linears whose input dimension is a
   * multiple of 32); absent where the model's structure is not known (headers read without its
   * config), and then q4 is judged at q8's bytes
   */
  q4Params?: number;
}

export function weightStats(
  tensors: Iterable<Pick<TensorEntry, 'dtype' | 'shape' | 'byteLength'> & { name?: string }>,
  q4Names?: ReadonlySet<string>,
): WeightStats {
  const byDtype: WeightStats['byDtype'] = {};
  let nParams = 0,
    storedBytes = 0,
    q4Params = 0;
  for (const t of tensors) {
    const n = t.shape.reduce((a, b) => a * b, 1);
    nParams += n;
    storedBytes += t.byteLength;
    byDtype[t.dtype] = (byDtype[t.dtype] ?? 0) + n;
    if (t.name !== undefined && q4Names?.has(t.name)) q4Params += n;
  }
  return { nParams, byDtype, storedBytes, ...(q4Names ? { q4Params } : {}) };
}

/** q8: one int8 per weight plus one f16 scale per block of 32 (MatMulNBits-style blocks). */
const Q8_BYTES_PER_PARAM = 1 + 2 / 32;
/** q4's 4-bit Linears: half a byte per weight plus one float32 scale per block of 32 (q4.ts) */
export const Q4_BYTES_PER_PARAM = 0.5 + 4 / 32;

/** bytes one parameter of `dtype` takes in the runtime at `precision` (q4: those q4 leaves at q8, see weightBytesAt) */
export function bytesPerParam(dtype: SafetensorsDtype, precision: WeightPrecision): number {
  if (precision === 'f32') return 4;
  if (precision === 'q8' || precision === 'q4') return Q8_BYTES_PER_PARAM;
  // stored: 16-bit stays 16-bit; anything else is widened to float32 (F32 is already 4)
  return dtype === 'F16' || dtype === 'BF16' ? 2 : 4;
}

/** bytes of the weights as the runtime holds them at `precision` */
export function weightBytesAt(w: WeightStats, precision: WeightPrecision): number {
  if (precision === 'q4' && w.q4Params)
    return w.q4Params * Q4_BYTES_PER_PARAM + (w.nParams - w.q4Params) * Q8_BYTES_PER_PARAM;
  let b = 0;
  for (const [dt, n] of Object.entries(w.byDtype) as [SafetensorsDtype, number][])
    b += n * bytesPerParam(dt, precision);
  return b;
}

/**
 * Peak process (or renderer) memory per byte of weights held by the runtime, per backend, as
 * `npm run bench` and `bench:scale` measure it with f32 weights (docs/BENCHMARKS.md). WebGPU holds
 * the weights in GPU buffers but builds them from the same JS bytes first, so the page peaks like WASM.
 */
export const PEAK_FACTOR: Record<MemoryBackend, number> = { node: 2.5, wasm: 3.4, webgpu: 3.4 };

/**
 * WebAssembly heap per byte of weights held, by precision. f32: onnxruntime-web widens (folds)
 * and pre-packs the matmul weights inside the heap, so the heap needs about twice the float32
 * bytes. stored: the 16-bit weights once; the widened copy of the tensor in use counts in
 * RUNTIME_SLACK_BYTES. q8: the int8 + scale bytes once, the same way; q4 likewise (its packed
 * bytes go straight to MatMulNBits; not yet checked against a measured heap). `npm run bench:scale` and
 * bench/q8-start.ts check the factors against the heap they measure (docs/BENCHMARKS.md, Big models).
 */
export const WASM_HEAP_FACTOR: Record<WeightPrecision, number> = { f32: 2.2, stored: 1, q8: 1, q4: 1 };

/** Working memory beyond the weights inside the limiting pool: activations, KV cache, hooks, ORT arenas. */
export const RUNTIME_SLACK_BYTES = 256 * 1024 ** 2;

/** A wasm32 heap cannot grow past 4 GiB; onnxruntime-web copies every weight into it. */
export const WASM_HEAP_BYTES = 4 * GiB;

export interface BudgetLimits {
  /** host RAM the process may use (Node: os.totalmem(); the page: unknown, not enforced) */
  hostBytes?: number;
  /** GPU memory for WebGPU; browsers do not expose it, so it is only enforced when given */
  gpuBytes?: number;
  /**
   * the largest one weight tensor may be as float32 (WebGPU: the adapter's
   * maxStorageBufferBindingSize / maxBufferSize); vocabulary tables above it are split
   * (precision.ts chooseVocabSplit). A caller may set it lower to force the split (tests).
   */
  tensorBytes?: number;
  /**
   * the WASM heap the sessions of one model share (default WASM_HEAP_BYTES); a caller may set it
   * lower to make a model release sessions to make room (EngineModel.makeRoom; tests)
   */
  wasmHeapBytes?: number;
}

export interface MemoryEstimate {
  backend: MemoryBackend;
  precision: WeightPrecision;
  /** weights as the runtime holds them */
  weightBytes: number;
  /** estimated peak memory of the process / renderer during load */
  peakBytes: number;
  /** what must fit the limiting pool: the wasm heap, GPU memory, or host RAM for node */
  poolBytes: number;
  /** size of that pool, when known */
  limitBytes: number | null;
  limitName: string;
  fits: boolean;
}

export function estimateMemory(
  w: WeightStats,
  backend: MemoryBackend,
  precision: WeightPrecision,
  limits: BudgetLimits = {},
): MemoryEstimate {
  const weightBytes = weightBytesAt(w, precision);
  const peakBytes = Math.round(weightBytes * PEAK_FACTOR[backend]);
  let poolBytes: number, limitBytes: number | null, limitName: string;
  if (backend === 'wasm') {
    poolBytes = Math.round(weightBytes * WASM_HEAP_FACTOR[precision]) + RUNTIME_SLACK_BYTES;
    limitBytes = limits.wasmHeapBytes ?? WASM_HEAP_BYTES;
    limitName = limits.wasmHeapBytes ? 'the WebAssembly heap' : 'the 4 GiB WebAssembly heap';
  } else if (backend === 'webgpu') {
    poolBytes = weightBytes + RUNTIME_SLACK_BYTES;
    limitBytes = limits.gpuBytes ?? null;
    limitName = 'GPU memory';
  } else {
    poolBytes = peakBytes;
    limitBytes = limits.hostBytes ?? null;
    limitName = 'host memory';
  }
  // WASM and WebGPU also need the page's peak in host RAM, when that is known.
  if (
    backend !== 'node' &&
    limits.hostBytes != null &&
    (limitBytes == null || poolBytes <= limitBytes) &&
    peakBytes > limits.hostBytes
  ) {
    poolBytes = peakBytes;
    limitBytes = limits.hostBytes;
    limitName = 'host memory';
  }
  const fits = limitBytes == null || poolBytes <= limitBytes;
  return { backend, precision, weightBytes, peakBytes, poolBytes, limitBytes, limitName, fits };
}

export function fmtGB(bytes: number): string {
  return bytes >= 1e9
    ? `${(bytes / 1e9).toFixed(bytes >= 1e10 ? 0 : 1)} GB`
    : `${Math.max(1, Math.round(bytes / 1e6))} MB`;
}

const PRECISIONS: WeightPrecision[] = ['f32', 'stored', 'q8', 'q4'];
const BACKENDS: MemoryBackend[] = ['node', 'wasm', 'webgpu'];

/**
 * Throw TOO_LARGE (before anything big is downloaded or allocated) when the model does not fit
 * `backend` at `precision`; the hint names the precisions / backends that would fit.
 * `precisions`/`backends` limit the suggestions to what the surface can actually offer.
 */
export function checkBudget(
  w: WeightStats,
  backend: MemoryBackend,
  precision: WeightPrecision,
  limits: BudgetLimits = {},
  offer: { precisions?: WeightPrecision[]; backends?: MemoryBackend[] } = {},
): MemoryEstimate {
  const est = estimateMemory(w, backend, precision, limits);
  if (est.fits) return est;
  const alts: string[] = [];
  for (const p of offer.precisions ?? PRECISIONS) {
    if (p !== precision && estimateMemory(w, backend, p, limits).fits) alts.push(`--weights ${p} on ${backend}`);
  }
  for (const b of offer.backends ?? BACKENDS) {
    if (b !== backend && estimateMemory(w, b, precision, limits).fits) alts.push(`the ${b} backend`);
  }
  const source = LIMIT_SOURCES[est.limitName] ?? 'the 4 GiB a wasm32 heap can address';
  throw new LoupeError(
    'TOO_LARGE',
    `The model has ${(w.nParams / 1e9).toFixed(2)}B parameters: at ${precision} its weights ` +
      `take ${fmtGB(est.weightBytes)} and it needs about ${fmtGB(est.poolBytes)}, ` +
      `more than ${est.limitName}${/GiB/.test(est.limitName) ? '' : ` (${fmtGB(est.limitBytes!)}, ${source})`} ` +
      `on ${backend}.`,
    alts.length ? `It would fit with ${alts.join(' or ')}.` : 'Pick a smaller model.',
    {
      n_params: w.nParams,
      backend,
      precision,
      weight_bytes: est.weightBytes,
      needed_bytes: est.poolBytes,
      limit_bytes: est.limitBytes,
      limit_source: source,
    },
  );
}

/** where each pool's size comes from, as a refusal says it */
const LIMIT_SOURCES: Record<string, string> = {
  'GPU memory':
    "as the caller gave it (memory.gpuBytes): neither WebGPU nor onnxruntime-node exposes an adapter's memory",
  'host memory': "the machine's RAM (Node: os.totalmem(); elsewhere as the caller gave it, memory.hostBytes)",
};

/** a load's judgement as ModelMemory.budget: the limiting pool and what the load was judged to need of it */
export const budgetOf = (e: MemoryEstimate) => ({
  limit_name: e.limitName,
  limit_bytes: e.limitBytes,
  held_bytes: e.poolBytes,
});
