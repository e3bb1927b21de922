/**
 * The load decision: a model's precision, memory budget, vocabulary split and largest GPU buffer,
 * decided once per load from its tensors' headers, at the precision it will run at. The loaders
 * decide it before any weight byte (source/preflight.ts judgeModel), createModel runs at it
 * (ModelParts.decision), and nothing after re-decides; a source without headers is decided in
 * createModel, once, the same way.
 *
 *   const d = await decideLoad({ spec, tensors, backend: 'webgpu', mode: 'auto', gpu });
 *   d.precision, d.reason, d.estimate (checked: TOO_LARGE), d.vocab, d.buffer (checked: TOO_LARGE)
 *
 * On WebGPU a run needs every tensor it touches in one GPU buffer. The largest is judged at what
 * the graph makes of a weight at the chosen precision: a 16-bit weight kept 16-bit (shader-f16)
 * is held at 2 bytes a parameter, but the graph widens it to float32 before each product (a Cast
 * next to each Gemm: onnx-builder.ts weight), so its float32 copy is the buffer that must fit; a
 * q4 Linear is multiplied as held (MatMulNBits), so its packed bytes are; the vocabulary tables
 * are split to fit (chooseVocabSplit). The limit is the adapter's (GpuCaps: the page reads
 * GPUAdapter.limits; Node probes it, src/node/gpu-buffer-probe.ts), with its source named.
 */
import { LoupeError } from './errors';
import type { GpuCaps } from './env';
import type { ModelSpec } from './spec';
import type { TensorEntry } from './safetensors-types';
import { specTensorNames } from './params';
import { q4Names } from './q8';
import {
  checkBudget,
  estimateMemory,
  fmtGB,
  weightStats,
  type BudgetLimits,
  type MemoryBackend,
  type MemoryEstimate,
  type WeightPrecision,
  type WeightStats,
} from './budget';
import {
  choosePrecision,
  choosePrecisionOnGpu,
  chooseVocabSplit,
  parseWeightsMode,
  OFFERED_PRECISIONS,
  type VocabSplit,
  type WeightsMode,
} from './precision';

/** the largest buffer one run makes of a weight, and what it is */
export interface GpuBuffer {
  tensor: string;
  shape: number[];
  bytes: number;
  /** 'float32 copy at use' | 'held as float32' | 'held as 4-bit blocks' */
  form: string;
}

export interface GpuBufferJudgement {
  largest: GpuBuffer | null;
  /** the limit it was judged against, and where that limit comes from */
  limitBytes: number;
  source: string;
}

export interface LoadDecision {
  backend: MemoryBackend;
  precision: WeightPrecision;
  /** why this precision (ModelInfo.weights_reason) */
  reason: string;
  /** the parameters the model uses, by stored dtype */
  stats: WeightStats;
  /** the memory budget at this precision on this backend, checked */
  estimate: MemoryEstimate;
  /** the vocabulary tables' row chunks (one chunking for both) */
  vocab: VocabSplit;
  /** WebGPU: the adapter's caps the decision read */
  gpu?: GpuCaps;
  /** WebGPU: the largest buffer a run makes, checked against the adapter's limit */
  buffer?: GpuBufferJudgement;
}

export interface DecideInput {
  spec: ModelSpec;
  tensors: Map<string, TensorEntry>;
  backend: MemoryBackend;
  /** what the caller asked for (default auto) */
  mode?: WeightsMode | string;
  gpu?: GpuCaps;
  memory?: BudgetLimits;
  /** what a TOO_LARGE hint may suggest (the surface's backends and precisions) */
  offer?: { precisions?: WeightPrecision[]; backends?: MemoryBackend[] };
}

/** the vocabulary tables: split to fit, so not judged as one buffer */
const vocabNames = (spec: ModelSpec) => new Set([spec.embed.w, spec.unembed.w]);

/** The largest buffer a run makes of the model's other weights at `precision` (see the header). */
export function largestGpuBuffer(
  spec: ModelSpec,
  tensors: Map<string, Pick<TensorEntry, 'name' | 'dtype' | 'shape'>>,
  precision: WeightPrecision,
): GpuBuffer | null {
  const vocab = vocabNames(spec);
  const q4 = precision === 'q4' ? q4Names(spec, tensors) : new Set<string>();
  let best: GpuBuffer | null = null;
  for (const name of specTensorNames(spec)) {
    const e = tensors.get(name);
    if (!e || vocab.has(name)) continue;
    const n = e.shape.reduce((a, b) => a * b, 1);
    const b: GpuBuffer = q4.has(name)
      ? { tensor: name, shape: e.shape, bytes: n / 2, form: 'held as 4-bit blocks' }
      : {
          tensor: name,
          shape: e.shape,
          bytes: n * 4,
          form:
            precision === 'f32' || (precision === 'stored' && e.dtype === 'F32')
              ? 'held as float32'
              : 'float32 copy at use',
        };
    if (!best || b.bytes > best.bytes) best = b;
  }
  return best;
}

/** Decide the load (see the header); TOO_LARGE when the budget or the adapter's buffers cannot hold it. */
export async function decideLoad(input: DecideInput): Promise<LoadDecision> {
  const { spec, tensors, backend, gpu } = input;
  const memory = input.memory ?? {};
  const offer = { precisions: OFFERED_PRECISIONS, ...input.offer };
  const mode = parseWeightsMode(input.mode);
  const used = [...specTensorNames(spec)].map((n) => tensors.get(n)!);
  const stats = weightStats(used, q4Names(spec, tensors));
  const choice =
    backend === 'webgpu' && gpu
      ? choosePrecisionOnGpu(mode, stats, gpu, memory)
      : choosePrecision(mode, stats, backend, memory);
  const estimate = checkBudget(stats, backend, choice.precision, memory, offer);
  // one chunking for both tables (tied or not): the finer; on WebGPU no chunk exceeds the adapter's buffer
  const tensorBytes = Math.min(memory.tensorBytes ?? Infinity, gpu?.maxBufferBytes ?? Infinity);
  const vocab = [spec.embed.w, spec.unembed.w]
    .map((n) =>
      chooseVocabSplit(tensors.get(n)!, choice.precision, Number.isFinite(tensorBytes) ? tensorBytes : undefined),
    )
    .reduce((a, b) => (b.rows < a.rows ? b : a));
  const d: LoadDecision = { backend, precision: choice.precision, reason: choice.reason, stats, estimate, vocab };
  if (backend === 'webgpu' && gpu) {
    d.gpu = gpu;
    d.buffer = await judgeGpuBuffer(spec, tensors, choice.precision, gpu, stats, memory, offer);
    const b = d.buffer;
    if (b.largest)
      d.reason +=
        `; largest GPU buffer ${fmtGB(b.largest.bytes)} (${b.largest.tensor}, ${b.largest.form}) ` +
        `within ${fmtGB(b.limitBytes)} (${b.source})`;
  }
  return d;
}

/**
 * The largest buffer against the adapter's limit: within the known limit, it passes; above it,
 * where the runtime can probe a size (Node: gpu-buffer-probe.ts), the probe decides; otherwise,
 * or when the probe fails, TOO_LARGE naming the limit, its source and what would fit.
 */
async function judgeGpuBuffer(
  spec: ModelSpec,
  tensors: Map<string, TensorEntry>,
  precision: WeightPrecision,
  gpu: GpuCaps,
  stats: WeightStats,
  memory: BudgetLimits,
  offer: { precisions?: WeightPrecision[]; backends?: MemoryBackend[] },
): Promise<GpuBufferJudgement> {
  const largest = largestGpuBuffer(spec, tensors, precision);
  const source = gpu.limitSource ?? "the adapter's GPUAdapter.limits";
  if (!largest || largest.bytes <= gpu.maxBufferBytes) return { largest, limitBytes: gpu.maxBufferBytes, source };
  const probed = gpu.probeBuffer ? await gpu.probeBuffer(largest.bytes) : undefined;
  if (probed?.ok) return { largest, limitBytes: largest.bytes, source: probed.source };
  const limitSource = probed ? `${source}; ${probed.source}` : source;
  const alts: string[] = [];
  for (const p of offer.precisions ?? OFFERED_PRECISIONS) {
    const b = largestGpuBuffer(spec, tensors, p);
    if (p !== precision && (!b || b.bytes <= gpu.maxBufferBytes) && estimateMemory(stats, 'webgpu', p, memory).fits)
      alts.push(`--weights ${p} (largest buffer ${fmtGB(b?.bytes ?? 0)})`);
  }
  for (const other of offer.backends ?? ['node', 'wasm']) {
    if (other !== 'webgpu' && estimateMemory(stats, other, precision, memory).fits)
      alts.push(`the ${other} backend (no GPU buffer limit)`);
  }
  throw new LoupeError(
    'TOO_LARGE',
    `Weight ${largest.tensor} [${largest.shape.join('×')}] needs a ${fmtGB(largest.bytes)} GPU buffer at ${precision} ` +
      `(${largest.form}), more than this WebGPU adapter's largest buffer: ` +
      `${fmtGB(gpu.maxBufferBytes)} (min of maxStorageBufferBindingSize and maxBufferSize; ${limitSource}).`,
    `A buffer limit of at least ${largest.bytes} bytes would fit it. ` +
      (alts.length ? `It would fit with ${alts.join(' or ')}.` : 'Pick a smaller model.'),
    {
      tensor: largest.tensor,
      bytes: largest.bytes,
      precision,
      limit: 'maxStorageBufferBindingSize',
      limit_bytes: gpu.maxBufferBytes,
      limit_source: limitSource,
    },
  );
}
