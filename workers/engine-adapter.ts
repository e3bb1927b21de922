/**
 * The one place the worker touches the engine's loading API: turn a LoadRequest into a model
 * source + cache, resolve the 'auto' backend, point onnxruntime-web at our own copy of its
 * runtime (the build: ort-runtime.ts, native WebGPU first, JSEP as the fallback), and list/delete
 * the IndexedDB weight cache.
 */
import { ORT_BUILDS, ORT_BUILD_NAMES, buildRefuses, ortModule, type OrtBuild } from './ort-runtime';
import type { OrtModule } from '../src/engine/runtime/ort-session';
import { loadModelBrowser } from '../src/engine/index';
import { LoupeError } from '../src/engine/errors';
import type { Backend } from '../src/engine/api';
import type { ModelSource } from '../src/engine/source/types';
import { HubSource } from '../src/engine/source/hub-source';
import { UrlSource } from '../src/engine/source/url-source';
import { resolveModelRef, BUNDLED_MODEL_ID } from '../src/engine/source/ref';
import { FolderSource } from '../src/engine/source/folder-source';
import { IdbCache } from '../src/engine/source/idb-cache';
import { workerBlobReader } from './blob-reader';
import { documentCacheOn, type DocumentCache } from '../src/engine/source/document-cache';
import { createSaeLoaders, type SaeLoaders } from '../src/engine/source/sae-loader';
import { gpuInfo } from './doctor';
import { env } from '../src/engine/env';
import { watchWasmHeaps } from '../src/engine/runtime/wasm-heap';
import type { BackendChoice, CachedModel, LoadRequest, LoadedModelSummary } from './protocol';
import { cachedModelsOf, fileTally, previewOf, saeNeedsDownloadIn } from './engine-api';
import type { OpenModel } from './engine-host';

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
const WASM_THREADS = chooseWasmThreads(env.isolated, env.threads, named ? Number(named[1]) : null);

/** a build's module as the page runs it: its runtime (.mjs glue + .wasm) from our own ort/ (vite.config.ts), never a CDN */
const ortOf = (build: OrtBuild): Promise<OrtModule> =>
  ortModule(build, (ort) => {
    ort.env.wasm.wasmPaths = new URL('ort/', BASE).href;
    ort.env.wasm.numThreads = WASM_THREADS;
  });

/** `tensor_bytes=N` in the worker's name (the page's ?tensor_bytes=N): split the vocabulary tables as if one tensor could take at most N bytes */
const tensorBytes = /tensor_bytes=(\d+)/.exec(typeof self.name === 'string' ? self.name : '');

export function wasmThreads(): number | null {
  return WASM_THREADS;
}

/** the build the last model was loaded on, and why it is not the first choice (the Doctor's line) */
let lastRuntime: LoadedModelSummary['runtime'] | null = null;
/**
 * A test seam (e2e/device-lost.spec.ts): the GPUDevice onnxruntime-web runs the last model on, for
 * a test to destroy (a device loss); read by Playwright from the worker's global, called by nothing here.
 */
(self as any).__loupeGpuDevice = async () =>
  lastRuntime ? ((await ortOf(lastRuntime.build)).env as any).webgpu?.device : undefined;

export function ortRuntime(): string | null {
  if (!lastRuntime) return null;
  const f = lastRuntime.fallback;
  return `${lastRuntime.name}${f ? `: fallback, ${ORT_BUILD_NAMES[f.from]} failed (${f.code}: ${f.message})` : ''}`;
}

/** A load that failed on one build and may be tried on the next: its runtime or session failed, not the model or the person. */
export function fallsBack(e: unknown): boolean {
  return !(e instanceof LoupeError) || e.code === 'RUNTIME_ERROR';
}

let cache: IdbCache | null = null;
function idb(): IdbCache {
  cache ??= new IdbCache({ readBlob: workerBlobReader() });
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

/** Would loading this SAE download anything (engine-api.ts saeNeedsDownloadIn, over the IndexedDB cache)? */
export function saeNeedsDownload(ref: { source: string; path: string }, req: LoadRequest | null): Promise<boolean> {
  return saeNeedsDownloadIn(idb(), ref, req);
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
    case 'folder':
      if ('files' in r) {
        // judged, refused and cached as a URL model, under a key made from its files' names, sizes and times
        const src = new FolderSource(r.name, new Map(Object.entries(r.files)));
        return { source: src, ref: { kind: 'url', id: src.ref.id, revision: src.ref.revision }, useCache: true };
      }
    // falls through: a folder by path is the CLI's
    default:
      throw new LoupeError(
        'BAD_INPUT',
        `The page cannot load a ${(r as { kind: string }).kind} model.`,
        'Use the bundled model, a Hub id or an http(s) URL.',
      );
  }
}

export const openModel: OpenModel = async (req, opts) => {
  const t0 = performance.now();
  const plan = planSource(req.model);
  const { backend, reason } = opts.backend
    ? { backend: opts.backend, reason: 'forced' }
    : await resolveBackend(req.backend);
  // the agreement twin (a forced backend) runs on the loaded model's build first
  const last = opts.backend ? lastRuntime?.build : undefined;
  const builds = last ? [last, ...ORT_BUILDS.filter((b) => b !== last)] : ORT_BUILDS;
  let confirmed = false;
  // one tally over both builds' attempts: a fallback reads from the cache what the first downloaded
  const files = fileTally();
  let fallback: NonNullable<LoadedModelSummary['runtime']>['fallback'];
  for (let i = 0; ; i++) {
    const build = builds[i];
    try {
      const ort = await ortOf(build);
      const opened = await openOn(
        build,
        ort,
        req,
        opts,
        plan,
        backend,
        files,
        () => confirmed,
        () => (confirmed = true),
      );
      const runtime = { build, name: ORT_BUILD_NAMES[build], ...(fallback ? { fallback } : {}) };
      if (!opts.backend) lastRuntime = runtime;
      return {
        model: opened.model,
        summary: { ...opened.summary, loadMs: performance.now() - t0, backendReason: reason, runtime },
      };
    } catch (e) {
      if (i + 1 >= builds.length || !fallsBack(e) || opts.signal.aborted) throw e;
      const err = e instanceof LoupeError ? e : null;
      fallback = {
        from: build,
        code: err?.code ?? 'RUNTIME_ERROR',
        message: (e as Error).message ?? String(e),
      };
      console.warn(
        `[loupe] ${ORT_BUILD_NAMES[build]} could not load ${plan.ref.id} on ${backend} (${fallback.code}: ` +
          `${fallback.message}); loading it on ${ORT_BUILD_NAMES[builds[i + 1]]}`,
      );
    }
  }
};

/** One load on one onnxruntime-web build; `confirmed` skips the download question a failed build already asked. */
async function openOn(
  build: OrtBuild,
  ort: OrtModule,
  req: LoadRequest,
  opts: Parameters<OpenModel>[1],
  plan: SourcePlan,
  backend: Backend,
  files: ReturnType<typeof fileTally>,
  confirmed: () => boolean,
  confirm: () => void,
): Promise<{
  model: Awaited<ReturnType<typeof loadModelBrowser>>;
  summary: Omit<LoadedModelSummary, 'loadMs' | 'backendReason' | 'runtime'>;
}> {
  const model = await loadModelBrowser(plan.source, {
    ort,
    baseUrl: BASE.href,
    backend,
    // JSEP's Gemm fails inside the forward graph's readout If ("invalid shape specified"): its readout streams
    readoutInForward: build === 'native',
    weights: req.weights,
    ...(tensorBytes ? { memory: { tensorBytes: Number(tensorBytes[1]) } } : {}),
    signal: opts.signal,
    cache: plan.useCache ? idb() : undefined,
    confirm: async (p, j) => {
      // a load this build cannot run is refused here, before the download (the caller falls back)
      const refused = j && buildRefuses(build, j.decision);
      if (refused)
        throw new LoupeError(
          'RUNTIME_ERROR',
          `${refused}.`,
          ORT_BUILDS.includes('jsep')
            ? 'It is loaded on JSEP instead.'
            : 'Load it with weights f32 (widened at load), or on a page built with JSEP.',
        );
      if (!opts.onPreview || backend === 'node' || confirmed()) return;
      const ok = await opts.onPreview(previewOf(p, j, backend, plan.ref.id));
      if (!ok)
        throw new LoupeError(
          'CANCELLED',
          'The download was declined.',
          'Load a smaller model, or accept the download to go on.',
        );
      confirm();
    },
    onProgress: (p) => {
      files.note(p);
      opts.onProgress(p);
    },
  });
  // the same folder's older contents (another fingerprint) are not read again: their copy goes
  if (plan.source instanceof FolderSource) {
    const { id, revision } = plan.source.ref;
    for (const m of await listCachedModels().catch(() => []))
      if (m.endpoint === 'folder' && m.id === id && m.revision !== revision) await deleteCachedModel(m).catch(() => {});
  }
  return {
    model,
    summary: {
      info: model.info,
      ref: { ...plan.ref, ...(model.info.commit ? { commit: model.info.commit } : {}) },
      ...files.result(),
    },
  };
}

export async function listCachedModels(): Promise<CachedModel[]> {
  return cachedModelsOf(await idb().list());
}

export async function deleteCachedModel(key: { endpoint: string; id: string; revision: string }): Promise<void> {
  await idb().delete(key);
}
