/**
 * The engine's browser entry (also usable in any JS runtime with fetch): load a model from the
 * bundled folder, a Hub id or a URL, on onnxruntime-web with WebGPU when an adapter exists, else
 * WASM. Node code uses src/node/load.ts (onnxruntime-node, weights read from disk).
 */
import type { Backend, LoadedModel, LoadOptions } from './api';
import { LoupeError } from './errors';
import { env, gpuCaps, type GpuCaps } from './env';
import { createModel, modelPartsFrom } from './model';
import { parseWeightsMode, OFFERED_PRECISIONS } from './precision';
import type { LoadDecision } from './plan';
import { webSessionFactory, type OrtModule } from './runtime/ort-session';
import { loadModelFiles } from './source/files';
import { judgeModel, type ModelJudgement, type ModelPlan } from './source/preflight';
import { createSource } from './source/create-source';
import { isBundledSpec, resolveModelRef } from './source/ref';
import type { ByteCache, ModelSource } from './source/types';
import { HttpSource } from './source/http-source';
import { cacheQ8Store } from './source/q8-store';
import { checkStorage, storageEstimate } from './source/storage';
import { q8EntryBytesToWrite } from './q8';
import { describeModel } from './arch/index';

export type { LoadedModel, LoadOptions, Backend } from './api';
export { LoupeError } from './errors';

export interface BrowserLoadOptions extends LoadOptions {
  /** the onnxruntime-web module (injected so the page controls wasmPaths and threads) */
  ort: OrtModule;
  cache?: ByteCache;
  /** base URL the bundled model folder is relative to (default: the page's location) */
  baseUrl?: string;
  endpoint?: string;
  token?: string;
  /** asked after the plan is judged and before the download (the page asks a person above 1 GB); throw to stop */
  confirm?: (plan: ModelPlan, judgement: ModelJudgement | null) => void | Promise<void>;
  /** on WebGPU, DLA's readout and the logit lens in the forward graph's If (default true; JSEP: false) */
  readoutInForward?: boolean;
}

/** WebGPU when the browser gives us an adapter, else WASM (transformers.js-style capability check). */
export async function detectBackend(): Promise<'webgpu' | 'wasm'> {
  return (await env.webgpu()).adapter ? 'webgpu' : 'wasm';
}

/** What a user typed as a model (id, URL, 'default') → a source; the bundled model is relative to the page. */
export function sourceFor(
  spec: string,
  opts: { baseUrl?: string; endpoint?: string; token?: string } = {},
): ModelSource {
  return createSource(resolveModelRef(spec, { endpoint: opts.endpoint, names: true }), opts);
}

export async function loadModelBrowser(spec: string | ModelSource, opts: BrowserLoadOptions): Promise<LoadedModel> {
  const source = typeof spec === 'string' ? sourceFor(spec, opts) : spec;
  const bundled = typeof spec === 'string' && isBundledSpec(spec);
  const wanted: Backend = opts.backend && opts.backend !== 'auto' ? opts.backend : await detectBackend();
  if (wanted === 'node')
    throw new LoupeError(
      'BACKEND_UNAVAILABLE',
      "The 'node' backend exists only in Node.",
      'Use webgpu or wasm in the browser.',
    );
  let gpu: GpuCaps | undefined;
  if (wanted === 'webgpu') {
    const { adapter } = await env.webgpu();
    if (adapter) gpu = gpuCaps(adapter);
  }
  const cache = bundled ? undefined : opts.cache;
  // q8 weights kept next to the model's files in its cache (IndexedDB in the page)
  const q8Store = cache && source instanceof HttpSource ? cacheQ8Store(cache, (f) => source.cacheKey(f)) : undefined;
  let decision: LoadDecision | undefined;
  const files = await loadModelFiles(source, {
    cache,
    signal: opts.signal,
    onProgress: opts.onProgress,
    // architecture, tensors, precision, memory and storage judged from the headers, before any weight byte
    judge: async (plan) => {
      const offer = { backends: ['wasm', 'webgpu'] as ('wasm' | 'webgpu')[], precisions: OFFERED_PRECISIONS };
      const j = await judgeModel(plan, wanted, parseWeightsMode(opts.weights), opts.memory, offer, gpu);
      decision = j?.decision;
      const judged = j?.choice;
      if (cache) {
        const q8Bytes =
          (judged?.precision === 'q8' || judged?.precision === 'q4') && q8Store && plan.tensors
            ? await q8EntryBytesToWrite(
                plan.tensors,
                describeModel({ config: plan.config, tensors: plan.tensors }),
                q8Store,
                judged.precision,
              )
            : 0;
        const refused = checkStorage(
          { downloadBytes: plan.downloadBytes, q8Bytes },
          plan.downloadBytes + q8Bytes > 0 ? await storageEstimate() : undefined,
          plan.ref.id,
        );
        if (refused) throw refused;
      }
      await opts.confirm?.(plan, j);
    },
  });
  const parts = { ...modelPartsFrom(files, { bundled, memory: opts.memory, weightsMode: opts.weights }), q8Store };

  try {
    return await createModel(
      { ...parts, decision },
      webSessionFactory(opts.ort, wanted, gpu, {}, opts.readoutInForward ?? true),
    );
  } catch (e) {
    // A WebGPU device can fail at session creation (limits, lost device): fall back to WASM, unless asked explicitly.
    // The load decided for WebGPU does not hold there: createModel decides it for WASM.
    if (wanted === 'webgpu' && (!opts.backend || opts.backend === 'auto') && !(e instanceof LoupeError)) {
      return createModel(parts, webSessionFactory(opts.ort, 'wasm'));
    }
    throw e;
  }
}
