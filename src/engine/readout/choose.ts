/**
 * How DLA's readout products with W_O and W_out run, decided once per model load: streamed in
 * JavaScript from the weight bytes (stream.ts: no second copy of W_O and W_out), or in a second
 * onnxruntime session (graph.ts), which holds them again but runs the products faster. Streamed
 * wherever that second copy is real memory the backend may not have; the session where it is not
 * (`tsx bench/memory.ts SHAPE --readouts session,stream` measures both; docs/BENCHMARKS.md):
 *  - WASM: every onnxruntime-web session has its own copy of its weights in the one heap (4 GiB
 *    at most, never shrinking): the session while the weights with the second copy (budget.ts
 *    estimateMemory) stay within HEAP_ROOM of the heap, streamed above it.
 *  - WebGPU, in Node and in the page: in the forward graph itself, behind an If (graph.ts
 *    addForwardReadout): the forward's own weights, no second copy in GPU memory (whose size the
 *    browser does not tell), and a forward computes none of it → 'forward'.
 *  - onnxruntime-node with weights widened to float32 at load: a second session folds its own
 *    float32 copies of W_O and W_out. As `auto` widens only where float32 fits host memory, the
 *    readout follows the same rule: the session where the weights with that second copy still
 *    fit (`secondCopy`), streamed where they would not or host memory is unknown.
 *  - onnxruntime-node with weights held in JavaScript (a q8 set built in memory, a bundled
 *    model): each session writes them out for onnxruntime to map, a copy per session → stream.
 *  - onnxruntime-node mapping the weight files as stored: a second session maps the same file
 *    pages (RSS counts them twice, physical memory does not) → the session.
 */
import { mixerOut, type ModelSpec } from '../spec';
import { q4Names } from '../q8';
import type { TensorEntry, WeightSet } from '../safetensors-types';
import {
  estimateMemory,
  fmtGB,
  weightStats,
  type BudgetLimits,
  type MemoryBackend,
  type MemoryEstimate,
  type WeightPrecision,
} from '../budget';

/**
 * The share of the WASM heap the weights with a readout session's second copy may fill. The
 * estimate (budget.ts) leaves out what runs add beside the weights (hooks returned, a vocabulary
 * chunk's logits, onnxruntime's arena), and a lens or gradient session may come on top
 * (EngineModel.makeRoom releases sessions for those): a fifth of the heap kept free covers it.
 */
export const HEAP_ROOM = 0.8;

/** how DLA's readout products with W_O and W_out run (LoadedModel.weightProducts) */
export type ReadoutMode = 'session' | 'stream' | 'forward';

export interface ReadoutChoice {
  readout: ReadoutMode;
  readout_reason: string;
}

/** the weights DLA's readout multiplies: every layer's W_O (a linear-attention layer's out_proj) and W_out */
export const readoutNames = (spec: ModelSpec): string[] =>
  spec.layers.flatMap((l) => [mixerOut(l).w, ...(l.mlp ? [l.mlp.down.w] : [])]);

/**
 * The readout a model gets (see the top of this file). `used`: the tensors the forward uses, as
 * stored; `held`: the weight set the sessions get (the quantised one at q8); `forced`: the bench
 * and tests run either.
 */
export function readoutFor(
  spec: ModelSpec,
  o: {
    stored: WeightSet;
    held: WeightSet;
    used: TensorEntry[];
    backend: MemoryBackend;
    precision: WeightPrecision;
    memory: BudgetLimits;
    forced?: ReadoutMode;
    /** the backend runs the forward graph's If on the device (WebGPU) */
    inForward?: boolean;
  },
): ReadoutChoice {
  // the weights as held plus a readout session's second copy of W_O and W_out, judged as a load is
  const readoutUsed = readoutNames(spec).map((n) => o.stored.tensors.get(n)!);
  const secondCopy = estimateMemory(
    weightStats([...o.used, ...readoutUsed], q4Names(spec, o.stored.tensors)),
    o.backend,
    o.precision,
    o.memory,
  );
  return chooseReadout(o.backend, { ...readoutWeights(spec, o.held, o.precision), secondCopy }, o.forced, o.inForward);
}

/** what chooseReadout weighs about the readout's weights, W_O and W_out, as the sessions get them */
function readoutWeights(
  spec: ModelSpec,
  weights: WeightSet,
  precision: WeightPrecision,
): { widened: boolean; mapped: boolean } {
  const used = readoutNames(spec).map((n) => weights.tensors.get(n)!);
  return {
    widened: precision === 'f32' && used.some((e) => e.dtype !== 'F32'),
    mapped: used.every((e) => weights.paths.has(e.file) && !weights.files.has(e.file)),
  };
}

/** The choice from what it weighs (see the top of this file). */
export function chooseReadout(
  backend: MemoryBackend,
  weights: { widened: boolean; mapped: boolean; secondCopy?: MemoryEstimate },
  forced?: ReadoutMode,
  inForward = false,
): ReadoutChoice {
  if (forced === 'session')
    return {
      readout: 'session',
      readout_reason: 'asked for the session: a second onnxruntime session holds W_O and W_out',
    };
  if (forced === 'stream')
    return {
      readout: 'stream',
      readout_reason: 'asked for streaming: W_O and W_out read from the weight bytes a slab at a time, no second copy',
    };
  const stream = (why: string): ReadoutChoice => ({
    readout: 'stream',
    readout_reason: `streamed from the weight bytes in JavaScript: ${why}`,
  });
  if (backend === 'webgpu' && inForward)
    return {
      readout: 'forward',
      readout_reason:
        "in the forward graph, behind an If that only the readout's run takes: the products use the " +
        "forward's weights on the GPU (no second copy) and cost a one-token forward",
    };
  if (backend === 'webgpu')
    return stream(
      "onnxruntime's WebGPU provider gives each session its own copy of its weights in GPU memory, " +
        'whose size WebGPU does not tell, so a readout session would hold W_O and W_out again',
    );
  if (backend === 'wasm') {
    const est = weights.secondCopy;
    if (est?.limitBytes != null && est.poolBytes <= HEAP_ROOM * est.limitBytes) {
      return {
        readout: 'session',
        readout_reason:
          'a second onnxruntime-web session with its own copy of W_O and W_out: with it the WASM ' +
          `heap needs about ${fmtGB(est.poolBytes)}, within ${Math.round(HEAP_ROOM * 100)} % of ` +
          `${est.limitName} (${fmtGB(est.limitBytes)}), and it runs the products faster than JavaScript`,
      };
    }
    const over =
      est?.limitBytes != null
        ? `, which with it would need about ${fmtGB(est.poolBytes)}, ` +
          `more than ${Math.round(HEAP_ROOM * 100)} % of ${est.limitName} (${fmtGB(est.limitBytes)})`
        : '';
    return stream(`a readout session would hold W_O and W_out again in the WASM heap${over}`);
  }
  if (weights.widened) {
    const est = weights.secondCopy;
    if (est?.fits && est.limitBytes != null) {
      return {
        readout: 'session',
        readout_reason:
          'a second onnxruntime-node session with its own float32 copies of W_O and W_out: ' +
          `with them the weights need about ${fmtGB(est.poolBytes)} at peak, ` +
          `which fits ${est.limitName} (${fmtGB(est.limitBytes)}), and it runs the products faster than JavaScript`,
      };
    }
    const over =
      est?.limitBytes != null
        ? `, and with them the weights would need about ${fmtGB(est.poolBytes)}, ` +
          `more than ${est.limitName} (${fmtGB(est.limitBytes)})`
        : ' (host memory unknown)';
    return stream(`a readout session would keep its own float32 copies of W_O and W_out${over}`);
  }
  if (!weights.mapped) return stream('the weights are held in memory, and each onnxruntime-node session copies them');
  return {
    readout: 'session',
    readout_reason:
      'a second onnxruntime-node session: it maps the same weight file pages (no second copy ' +
      'in physical memory; RSS counts them twice) and runs the products faster than JavaScript',
  };
}
