/**
 * The Doctor's backend agreement check: the same prompt through the loaded model on its backend
 * and on the host's twin of it (WebGPU ↔ WASM in the page), comparing final-position
 * probabilities, logits at every position and every hook.
 */
import { throwIfAborted } from '../src/engine/errors';
import type { Backend, LoadedModel } from '../src/engine/api';
import type { Tensor } from '../src/engine/tensor';
import type { EngineHost } from './engine-host';
import type { AgreementResult, LoadRequest, ProgressFn } from './protocol';

const TOL = 1e-4;

function maxAbsDiff(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) return Infinity;
  let m = 0;
  for (let i = 0; i < a.length; i++) {
    // masked attention scores are -Infinity on both backends: equal, not NaN
    const d = a[i] === b[i] ? 0 : Math.abs(a[i] - b[i]);
    if (d > m || Number.isNaN(d)) m = Number.isNaN(d) ? Infinity : d;
  }
  return m;
}

function finalProbs(logits: Tensor): Float64Array {
  const V = logits.dims[logits.dims.length - 1];
  const T = logits.dims[1];
  const off = (T - 1) * V;
  let mx = -Infinity;
  for (let i = 0; i < V; i++) mx = Math.max(mx, logits.data[off + i]);
  const p = new Float64Array(V);
  let s = 0;
  for (let i = 0; i < V; i++) s += p[i] = Math.exp(logits.data[off + i] - mx);
  for (let i = 0; i < V; i++) p[i] /= s;
  return p;
}

function argmax(p: Float64Array): number {
  let best = 0;
  for (let i = 1; i < p.length; i++) if (p[i] > p[best]) best = i;
  return best;
}

export async function compareBackends(
  model: LoadedModel,
  req: LoadRequest,
  prompt: string,
  { signal, onProgress }: { signal: AbortSignal; onProgress: ProgressFn },
  host: Pick<EngineHost, 'openModel' | 'twinBackend'>,
): Promise<AgreementResult> {
  const other: Backend = await host.twinBackend(model.info.backend);
  onProgress({ stage: `loading the model on ${other}`, done: 0, total: 3 });
  const { model: twin } = await host.openModel(req, { signal, onProgress: () => {}, backend: other });
  try {
    const tokens = model.tokenize(prompt);
    throwIfAborted(signal);
    onProgress({ stage: `running on ${model.info.backend}`, done: 1, total: 3 });
    const t0 = performance.now();
    const a = await model.run(tokens, { hooks: 'all', signal });
    const t1 = performance.now();
    onProgress({ stage: `running on ${other}`, done: 2, total: 3 });
    const b = await twin.run(tokens, { hooks: 'all', signal });
    const t2 = performance.now();
    let maxHookDiff = 0;
    let worstHook: string | null = null;
    let hooksCompared = 0;
    for (const [name, ta] of Object.entries(a.hooks)) {
      const tb = b.hooks[name];
      if (!tb) continue;
      hooksCompared++;
      const d = maxAbsDiff(ta.data, tb.data);
      if (d > maxHookDiff || worstHook === null) {
        maxHookDiff = d;
        worstHook = name;
      }
    }
    const pa = finalProbs(a.logits);
    const pb = finalProbs(b.logits);
    let maxProbDiff = 0;
    for (let i = 0; i < pa.length; i++) maxProbDiff = Math.max(maxProbDiff, Math.abs(pa[i] - pb[i]));
    const maxLogitDiff = maxAbsDiff(a.logits.data, b.logits.data);
    const top1: [number, number] = [argmax(pa), argmax(pb)];
    onProgress({ stage: 'done', done: 3, total: 3 });
    return {
      prompt,
      model: model.info.id,
      tokens: tokens.length,
      backends: [model.info.backend, other],
      maxProbDiff,
      maxLogitDiff,
      maxHookDiff,
      worstHook,
      hooksCompared,
      top1Match: top1[0] === top1[1],
      top1,
      ms: [t1 - t0, t2 - t1],
      pass: top1[0] === top1[1] && maxLogitDiff <= TOL && maxHookDiff <= TOL,
    };
  } finally {
    await twin.dispose().catch(() => {});
  }
}
