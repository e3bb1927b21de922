/**
 * DLA's readout, in one folder: the weight products direct logit attribution needs once the
 * forward has run (LoadedModel.weightProducts; api.ts WeightProductsInput lists them).
 *
 *   choose.ts   which way W_O's and W_out's products run, decided once per model load
 *   stream.ts   those products streamed from the weight bytes in JavaScript (float64 sums)
 *   graph.ts    the same products as a second onnxruntime session's graph, or in the forward graph's If
 *   unembed.ts  the unembedding's products in JavaScript (float64 sums); in the forward graph W_U's
 *               columns and their sum are taken on the device, only the dots with every token here
 *   input.ts    what an input asks for, checked the same way whichever readout runs
 */
import type { WeightProducts, WeightProductsInput } from '../api';
import { throwIfAborted } from '../errors';
import type { EngineSession, OrtTensorLike } from '../runtime/ort-session';
import type { ReadableWeightSet } from '../safetensors';
import type { ModelSpec } from '../spec';
import type { ReadoutMode } from './choose';
import {
  READOUT_OUTPUTS,
  UNEMBED_DOTS,
  UNEMBED_SUM,
  UNEMBED_X,
  readoutFeeds,
  readoutResult,
  type MakeTensor,
} from './graph';
import { needsReadoutSession } from './input';
import { streamedReadout } from './stream';
import { checkUnembedDots, unembedProducts } from './unembed';

export { buildReadoutGraph, READOUT_OUTPUTS, FORWARD_READOUT_OUTPUTS } from './graph';
export { HEAP_ROOM, readoutFor, readoutNames, type ReadoutChoice, type ReadoutMode } from './choose';

export interface ReadoutRun {
  /** the model's readout (ModelInfo.readout) */
  mode: ReadoutMode;
  /** the readout graph's session, created on first use (mode 'session') */
  session: () => Promise<EngineSession>;
  /** mode 'forward': a run of the forward graph taking the products' feeds (graph.ts addForwardReadout) */
  forward?: (feeds: Record<string, OrtTensorLike>) => Promise<Record<string, OrtTensorLike>>;
  tensor: MakeTensor;
  /** WebGPU: its Gemm refuses zero-length inputs (graph.ts readoutFeeds) */
  noEmpty: boolean;
  signal?: AbortSignal;
  /** yields the thread between layers and vocabulary chunks, so that a cancel is heard */
  yieldTurn?: () => Promise<void>;
}

/** The products `input` asks for, by the model's readout. */
export async function readoutProducts(
  spec: ModelSpec,
  weights: ReadableWeightSet,
  input: WeightProductsInput,
  run: ReadoutRun,
): Promise<WeightProducts> {
  throwIfAborted(run.signal);
  const pass = { signal: run.signal, yieldTurn: run.yieldTurn };
  if (run.mode === 'stream') {
    const products = await streamedReadout(spec, weights, input, run.signal, run.yieldTurn);
    return { ...products, ...(await unembedProducts(spec, weights, input, pass)) };
  }
  // in the forward graph (WebGPU, Node and the page) the provider takes zero-length inputs
  const feeds = readoutFeeds(spec, input, run.tensor, run.noEmpty && run.mode !== 'forward');
  if (run.mode === 'forward') return forwardReadout(spec, weights, input, run, feeds);
  const unembed = await unembedProducts(spec, weights, input, pass);
  const out = needsReadoutSession(input) ? await (await run.session()).run(feeds, READOUT_OUTPUTS) : undefined;
  return readoutResult(spec, out, input, unembed);
}

/**
 * The readout in the forward graph (WebGPU): W_O's and W_out's products, Σ_v W_U[:, v] and
 * the dot products with every token (unembedDots; float32 sums there), each a pass over a whole
 * table, from one run of its Ifs (graph.ts addForwardReadout); W_U's columns for a few ids (a read of
 * those rows, no product) are read in JavaScript.
 */
async function forwardReadout(
  spec: ModelSpec,
  weights: ReadableWeightSet,
  input: WeightProductsInput,
  run: ReadoutRun,
  feeds: Record<string, OrtTensorLike>,
): Promise<WeightProducts> {
  const pass = { signal: run.signal, yieldTurn: run.yieldTurn };
  const sumOnDevice = !!input.unembedSum;
  const x = input.unembedDots;
  checkUnembedDots(spec, x);
  const dotsOnDevice = !!x && x.dims[0] > 0;
  const unembed = await unembedProducts(
    spec,
    weights,
    { ...input, unembedSum: input.unembedSum && !sumOnDevice, unembedDots: dotsOnDevice ? undefined : x },
    pass,
  );
  if (!needsReadoutSession(input) && !sumOnDevice && !dotsOnDevice)
    return readoutResult(spec, undefined, input, unembed);
  const flag = (on: boolean) => run.tensor('int64', BigInt64Array.from([on ? 1n : 0n]), []);
  feeds[UNEMBED_SUM] = flag(sumOnDevice);
  feeds[UNEMBED_DOTS] = flag(dotsOnDevice);
  if (dotsOnDevice) feeds[UNEMBED_X] = run.tensor('float32', Float32Array.from(x.data), [...x.dims]);
  const out = await run.forward!(feeds);
  if (sumOnDevice) unembed.unembedSum = { dims: [spec.dModel], data: out[UNEMBED_SUM].data as Float32Array };
  if (dotsOnDevice)
    unembed.unembedDots = {
      dims: [x.dims[0], spec.dVocab],
      data: Float64Array.from(out[UNEMBED_DOTS].data as Float32Array),
    };
  return readoutResult(spec, out, input, unembed);
}
