/**
 * The one place the worker touches the engine's loading API: turn a LoadRequest into a model
 * source + cache, resolve the 'auto' backend, point onnxruntime-web at our own copy of its
 * runtime, and list/delete the IndexedDB weight cache.
 */
import * as ort from 'onnxruntime-web';
import { loadModelBrowser } from '../src/engine/index';
import { LoupeError } from '../src/engine/errors';
import type { Backend, LoadedModel } from '../src/engine/api';
import type { ModelSource, FileProgress } from '../src/engine/source/types';
import { HubSource } from '../src/engine/source/hub-source';
import { UrlSource } from '../src/engine/source/url-source';
import { resolveModelRef, BUNDLED_MODEL_ID } from '../src/engine/source/ref';
import { createSource } from '../src/engine/source/create-source';
import type { CacheKey } from '../src/engine/source/types';
import { IdbCache } from '../src/engine/source/idb-cache';
import { isQ8Entry } from '../src/engine/source/q8-store';
import { documentCacheOn, type DocumentCache } from '../src/engine/source/document-cache';
import { createSaeLoaders, type SaeLoaders } from '../src/engine/source/sae-loader';
import { gpuInfo } from './doctor';
import { env } from '../src/engine/env';
import { watchWasmHeaps } from '../src/engine/runtime/wasm-heap';
import {
  CONFIRM_DOWNLOAD_BYTES,
  type BackendChoice,
  type CachedModel,
  type LoadPreview,
  type LoadRequest,
  type LoadedModelSummary,
  type PreviewFn,
} from './protocol';
import type { ModelPlan, ModelJudgement } from '../src/engine/source/preflight';

/**
 * The page's base URL (where index.html, ort/ and models/ are), from ` base=<encoded URL>` in the worker's name; the
 * worker's own URL is under assets/, so a relative BASE_URL cannot be resolved against it.
 */
export function pageBase(name: string, fallback: string): URL {
  const m = / base=(\S+)/.exec(name);
  if (m) {
    try {
      return new URL(decodeURIComponent(m[1]));
    } catch {
      /* a name someone else made: fall back */
    }
  }
  return new URL(fallback, self.location.href);
}
const BASE = pageBase(typeof self.name === 'string' ? self.name : '', import.meta.env.BASE_URL);

// before the runtime makes its heap, so the memory report can say how big it is
watchWasmHeaps();

// The runtime (.mjs glue + .wasm) is copied into the build under ort/ (vite.config.ts): never a CDN.
ort.env.wasm.wasmPaths = new URL('ort/', BASE).href;

/**
 * WASM threads: under cross-origin isolation every core the browser reports (onnxruntime-web's own
 * default is half of them, at most 4: one thread on a 2-core machine), else 1 (no SharedArrayBuffer).
 * `wasm_threads=N` in the worker's name (the page's ?wasm_threads=N) overrides, for measuring.
 */
export function chooseWasmThreads(isolated: boolean, cores: number, override: number | null): number {
  if (!isolated) return 1;
  return Math.max(1, Math.min(override ?? cores, 16));
}
const named = /wasm_threads=(\d+)/.exec(typeof self.name === 'string' ? self.name : '');
ort.env.wasm.numThreads = chooseWasmThreads(env.isolated, env.threads, named ? Number(named[1]) : null);

/** `tensor_bytes=N` in the worker's name (the page's ?tensor_bytes=N): split the vocabulary tables as if one tensor could take at most N bytes */
const tensorBytes = /tensor_bytes=(\d+)/.exec(typeof self.name === 'string' ? self.name : '');

export function wasmThreads(): number | null {
  const n = ort.env.wasm.numThreads;
  return typeof n === 'number' ? n : null;
}

let cache: IdbCache | null = null;
function idb(): IdbCache {
  cache ??= new IdbCache();
  return cache;
}

/** documents operations keep between calls (dashboards): a database apart from the model cache */
let documents: DocumentCache | null = null;
export function documentCache(): DocumentCache {
  documents ??= documentCacheOn(
    new IdbCache({ dbName: 'loupe-documents' }),
    "this browser's IndexedDB (loupe-documents)",
  );
  return documents;
}

let sae: { key: string; loaders: SaeLoaders } | null = null;

/**
 * SAE loaders over the same IndexedDB cache as the models. A Hub id given as sae_source resolves
 * against the endpoint of the model loaded now (a mirror the user chose) with its token; the
 * loaders are kept while that stays the same, so their memory of absent optional files
 * (explanations.json) spares the server repeated 404s.
 */
export function saeLoadersFor(req: LoadRequest | null): SaeLoaders {
  const m = req?.model;
  const hub = m && typeof m === 'object' && m.kind === 'hub' ? m : null;
  const endpoint = hub?.endpoint || undefined;
  const token = hub?.token || undefined;
  const key = JSON.stringify([endpoint ?? '', token ?? '']);
  if (sae?.key !== key) sae = { key, loaders: createSaeLoaders({ cache: idb(), endpoint, token }) };
  return sae.loaders;
}

/**
 * Would loading this SAE download anything? False when its cfg.json and weights are complete in
 * this browser's cache — and when the ref cannot name a download at all (a folder, a bad id: the
 * operation reports that itself). A shared link re-runs on its own only when the SAE's weights
 * need no download (a missing optional explanations.json may still be asked for: a few bytes).
 */
export async function saeNeedsDownload(
  ref: { source: string; path: string },
  req: LoadRequest | null,
): Promise<boolean> {
  const m = req?.model;
  const hub = m && typeof m === 'object' && m.kind === 'hub' ? m : null;
  let keyOf: (file: string) => CacheKey;
  try {
    const r = resolveModelRef(ref.source, { endpoint: hub?.endpoint || undefined });
    if (r.kind !== 'hub' && r.kind !== 'url') return false;
    const src = createSource(r, { endpoint: hub?.endpoint || undefined }) as unknown as {
      cacheKey?: (file: string) => CacheKey;
    };
    if (typeof src.cacheKey !== 'function') return false;
    keyOf = src.cacheKey.bind(src);
  } catch {
    return false;
  }
  const dir = ref.path.replace(/^\/+|\/+$/g, '');
  const same = (a: CacheKey, b: CacheKey) =>
    a.endpoint === b.endpoint && a.id === b.id && a.revision === b.revision && a.file === b.file;
  const entries = (await idb().list()).filter((e) => e.complete);
  return !['cfg.json', 'sae_weights.safetensors'].every((f) =>
    entries.some((e) => same(e, keyOf(dir ? `${dir}/${f}` : f))),
  );
}

/**
 * 'auto' = WebGPU when a hardware adapter exists, else WASM. A *fallback* (software) adapter such
 * as SwiftShader is far slower than WASM, so auto does not pick it; choosing
 * 'webgpu' explicitly still uses it.
 */
export async function resolveBackend(choice: BackendChoice): Promise<{ backend: Backend; reason: string }> {
  if (choice === 'wasm') return { backend: 'wasm', reason: 'chosen' };
  const gpu = await gpuInfo();
  if (choice === 'webgpu') {
    if (!gpu.available)
      throw new LoupeError(
        'BACKEND_UNAVAILABLE',
        `WebGPU is not available here: ${gpu.reason}`,
        "Choose the 'wasm' backend (or 'auto').",
      );
    return { backend: 'webgpu', reason: 'chosen' };
  }
  if (!gpu.available) return { backend: 'wasm', reason: `auto: no WebGPU (${gpu.reason?.replace(/\.$/, '')})` };
  if (gpu.isFallbackAdapter)
    return { backend: 'wasm', reason: 'auto: the only WebGPU adapter is a software fallback, slower than WASM' };
  return { backend: 'webgpu', reason: 'auto: WebGPU adapter found' };
}

interface SourcePlan {
  /** 'default' (the bundled model, resolved by the engine against the page's base URL) or a source */
  source: ModelSource | 'default';
  ref: LoadedModelSummary['ref'];
  /** the bundled model is served by our own origin: caching it in IndexedDB would only double it */
  useCache: boolean;
}

export function planSource(req: LoadRequest['model']): SourcePlan {
  const r = typeof req === 'string' ? resolveModelRef(req, { names: true }) : req;
  switch (r.kind) {
    case 'bundled':
      return {
        source: 'default',
        ref: { kind: 'bundled', id: BUNDLED_MODEL_ID, revision: '' },
        useCache: false,
      };
    case 'hub': {
      const token = 'token' in r ? r.token : undefined;
      const src = new HubSource(r.id, {
        revision: r.revision || 'main',
        endpoint: r.endpoint,
        token,
        requested: r.requested,
      });
      return {
        source: src,
        ref: { kind: 'hub', id: src.ref.id, revision: src.ref.revision, endpoint: src.ref.endpoint },
        useCache: true,
      };
    }
    case 'url': {
      const src = new UrlSource(r.id);
      return { source: src, ref: { kind: 'url', id: src.ref.id, revision: '' }, useCache: true };
    }
    default:
      throw new LoupeError(
        'BAD_INPUT',
        `The page cannot load a ${(r as { kind: string }).kind} model.`,
        'Use the bundled model, a Hub id or an http(s) URL.',
      );
  }
}

export interface OpenOptions {
  signal: AbortSignal;
  onProgress: (p: FileProgress) => void;
  /** force a backend (the agreement check loads the same model on the other one) */
  backend?: Backend;
  /** sees the judged plan before any weight byte; false stops the load (CANCELLED) */
  onPreview?: PreviewFn;
}

/** The page's view of a judged plan (protocol.ts LoadPreview). */
export function previewOf(
  plan: ModelPlan,
  j: ModelJudgement | null,
  backend: 'wasm' | 'webgpu',
  id: string,
): LoadPreview {
  const dtypes = Object.keys(j?.stats.byDtype ?? plan.stats?.byDtype ?? {});
  return {
    id,
    revision: plan.ref.revision,
    ...(plan.commit ? { commit: plan.commit } : {}),
    architecture: plan.architecture,
    n_params: j?.stats.nParams ?? plan.stats?.nParams ?? 0,
    dtype: dtypes.join('+'),
    weightBytes: plan.weightBytes,
    downloadBytes: plan.downloadBytes,
    cachedBytes: plan.cachedBytes,
    backend,
    needs: (j?.estimates ?? [])
      .filter((e) => e.backend !== 'node')
      .map((e) => ({
        backend: e.backend as 'wasm' | 'webgpu',
        precision: e.precision,
        bytes: e.peakBytes,
        fits: e.fits,
      })),
    confirm: plan.downloadBytes > CONFIRM_DOWNLOAD_BYTES,
  };
}

export async function openModel(
  req: LoadRequest,
  opts: OpenOptions,
): Promise<{ model: LoadedModel; summary: LoadedModelSummary }> {
  const t0 = performance.now();
  const plan = planSource(req.model);
  const { backend, reason } = opts.backend
    ? { backend: opts.backend, reason: 'forced' }
    : await resolveBackend(req.backend);
  const files = new Map<string, FileProgress>();
  const model = await loadModelBrowser(plan.source, {
    ort,
    baseUrl: BASE.href,
    backend,
    weights: req.weights,
    ...(tensorBytes ? { memory: { tensorBytes: Number(tensorBytes[1]) } } : {}),
    signal: opts.signal,
    cache: plan.useCache ? idb() : undefined,
    confirm:
      opts.onPreview && backend !== 'node'
        ? async (p, j) => {
            const ok = await opts.onPreview!(previewOf(p, j, backend, plan.ref.id));
            if (!ok)
              throw new LoupeError(
                'CANCELLED',
                'The download was declined.',
                'Load a smaller model, or accept the download to go on.',
              );
          }
        : undefined,
    onProgress: (p) => {
      files.set(p.file, p);
      opts.onProgress(p);
    },
  });
  let downloadedBytes = 0;
  const cachedFiles: string[] = [];
  for (const p of files.values()) {
    if (p.cached) cachedFiles.push(p.file);
    else downloadedBytes += p.loaded;
  }
  return {
    model,
    summary: {
      info: model.info,
      ref: { ...plan.ref, ...(model.info.commit ? { commit: model.info.commit } : {}) },
      downloadedBytes,
      cachedFiles,
      loadMs: performance.now() - t0,
      backendReason: reason,
    },
  };
}

export async function listCachedModels(): Promise<CachedModel[]> {
  const entries = await idb().list();
  const byModel = new Map<string, CachedModel>();
  for (const e of entries) {
    // a q8 entry whose write was cut off is rebuilt at the next q8 load: the model's files are whole
    if (isQ8Entry(e.file) && !e.complete) continue;
    const k = JSON.stringify([e.endpoint, e.id, e.revision]);
    const m = byModel.get(k) ?? {
      endpoint: e.endpoint,
      id: e.id,
      revision: e.revision,
      files: 0,
      bytes: 0,
      complete: true,
      storedAt: 0,
    };
    m.files++;
    m.bytes += e.size;
    m.complete &&= e.complete;
    m.storedAt = Math.max(m.storedAt, e.storedAt);
    byModel.set(k, m);
  }
  return [...byModel.values()].sort((a, b) => b.storedAt - a.storedAt);
}

export async function deleteCachedModel(key: { endpoint: string; id: string; revision: string }): Promise<void> {
  await idb().delete(key);
}
