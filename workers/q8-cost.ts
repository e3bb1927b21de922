/**
 * The Doctor's q8 cost: the prompt through the loaded model at its stored precision and at q8,
 * both on WASM (as the CLI runs it), compared on every logit and on trace's direct logit
 * attribution (src/ops/lib/precision-cost.ts: what `loupe doctor` and `npm run bench` report), so
 * the page says how far 8-bit weights move a result on the model in front of the user. The
 * loaded model is used for the side it already is; the other side(s) are loaded for the check
 * (from the cache: no download) and released after it.
 */
import { throwIfAborted } from '../src/engine/errors';
import type { LoadedModel } from '../src/engine/api';
import type { WeightsMode } from '../src/engine/precision';
import { precisionCost } from '../src/ops/lib/precision-cost';
import type { OpenModel } from './engine-host';
import type { LoadRequest, ProgressFn, Q8CostResult } from './protocol';

export async function q8Cost(
  model: LoadedModel,
  req: LoadRequest,
  prompt: string,
  { signal, onProgress }: { signal: AbortSignal; onProgress: ProgressFn },
  openModel: OpenModel,
): Promise<Q8CostResult> {
  const opened: LoadedModel[] = [];
  const side = async (weights: WeightsMode, step: number): Promise<LoadedModel> => {
    if (model.info.backend === 'wasm' && model.info.weights === weights) return model;
    onProgress({ stage: `loading the model at ${weights} on wasm`, done: step, total: 3 });
    const { model: m } = await openModel({ ...req, weights }, { signal, onProgress: () => {}, backend: 'wasm' });
    opened.push(m);
    return m;
  };
  try {
    const base = await side('stored', 0);
    const cand = await side('q8', 1);
    throwIfAborted(signal);
    onProgress({ stage: 'running both', done: 2, total: 3 });
    const t0 = performance.now();
    const cost = await precisionCost(base, cand, prompt);
    onProgress({ stage: 'done', done: 3, total: 3 });
    return { ...cost, prompt, model: model.info.id, ms: performance.now() - t0, q8_weights: cand.info.weights_reason };
  } finally {
    for (const m of opened) await m.dispose().catch(() => {});
  }
}
