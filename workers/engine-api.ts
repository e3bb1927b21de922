/**
 * The engine behind workers/protocol.ts's EngineWorkerApi: one loaded model, the same operation
 * modules as the CLI and the bridge, jobs that can be cancelled. It is built over an EngineHost —
 * what differs between where it runs: the page's worker (engine-adapter.ts: IndexedDB,
 * onnxruntime-web) or `loupe serve` in Node (src/serve/node-host.ts: the Node cache,
 * onnxruntime-node) — so both speak one protocol and make the same documents.
 *
 * Every method catches and rethrows errors as LoupeError JSON, because comlink would otherwise
 * reduce an Error to {name, message} and lose the code and hint.
 */
import { LoupeError, toLoupeError } from '../src/engine/errors';
import type { Backend, LoadedModel } from '../src/engine/api';
import type { ByteCache, CacheEntryInfo, CacheKey, FileProgress } from '../src/engine/source/types';
import { resolveModelRef } from '../src/engine/source/ref';
import { createSource } from '../src/engine/source/create-source';
import { isQ8Entry } from '../src/engine/source/q8-store';
import { operations, parseOperationInput, requireOperation } from '../src/ops/index';
import { operationSchemas } from '../src/ops/schemas';
import { checkForeignDocument } from './documents';
import type { EngineHost } from './engine-host';
import { JobTable, throttle, fileDone, stepDone } from './jobs';
import { instanceHandleStore, newInstanceId } from '../src/ops/lib/handles';
import { compareBackends } from './agreement';
import { q8Cost } from './q8-cost';
import type { ModelPlan, ModelJudgement } from '../src/engine/source/preflight';
import {
  CONFIRM_DOWNLOAD_BYTES,
  type CachedModel,
  type LoadPreview,
  type EngineWorkerApi,
  type LoadRequest,
  type LoadedModelSummary,
  type OperationInfo,
  type FileProgressFn,
  type ProgressFn,
  type MemoryInfo,
  type PreviewFn,
} from './protocol';

/** What a load's file progress says at its end: bytes fetched over the network, files from a cache. */
export function fileTally(): {
  note(p: FileProgress): void;
  result(): Pick<LoadedModelSummary, 'downloadedBytes' | 'cachedFiles'>;
} {
  const files = new Map<string, FileProgress>();
  return {
    note: (p) => void files.set(p.file, p),
    result() {
      let downloadedBytes = 0;
      const cachedFiles: string[] = [];
      for (const p of files.values()) {
        if (p.cached) cachedFiles.push(p.file);
        else downloadedBytes += p.loaded;
      }
      return { downloadedBytes, cachedFiles };
    },
  };
}

/** The page's view of a judged plan (protocol.ts LoadPreview); `shown`: the backends whose memory estimate it lists. */
export function previewOf(
  plan: ModelPlan,
  j: ModelJudgement | null,
  backend: Backend,
  id: string,
  shown: readonly Backend[] = ['wasm', 'webgpu'],
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
      .filter((e) => shown.includes(e.backend as Backend))
      .map((e) => ({ backend: e.backend as Backend, precision: e.precision, bytes: e.peakBytes, fits: e.fits })),
    confirm: plan.downloadBytes > CONFIRM_DOWNLOAD_BYTES,
  };
}

/**
 * Would loading this SAE download anything? False when its cfg.json and weights are complete in
 * the engine's cache — and when the ref cannot name a download at all (a folder, a bad id: the
 * operation reports that itself). A shared link re-runs on its own only when the SAE's weights
 * need no download (a missing optional explanations.json may still be asked for: a few bytes).
 */
export async function saeNeedsDownloadIn(
  cache: ByteCache,
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
  const entries = (await cache.list()).filter((e) => e.complete);
  return !['cfg.json', 'sae_weights.safetensors'].every((f) =>
    entries.some((e) => same(e, keyOf(dir ? `${dir}/${f}` : f))),
  );
}

/** A cache's files grouped by model, newest first (the model panel's cache list). */
export function cachedModelsOf(entries: CacheEntryInfo[]): CachedModel[] {
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

export function createEngineApi(host: EngineHost): EngineWorkerApi {
  let model: LoadedModel | null = null;
  let modelReq: LoadRequest | null = null;
  const jobs = new JobTable();
  // Handles (captures, probes) carry the page instance's id so the agent bridge can tell stale ones
  // (see src/ops/lib/handles.ts); the page sends its id with configure() right after start.
  let instanceId = newInstanceId();
  let store = instanceHandleStore(instanceId);

  /** Run fn; anything thrown leaves as LoupeError JSON. */
  async function withErrorJson<T>(fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (e) {
      throw toLoupeError(e).toJSON();
    }
  }

  function requireModel(): LoadedModel {
    if (!model)
      throw new LoupeError(
        'NO_MODEL',
        'No model is loaded.',
        'Load a model first (the bundled stories260K loads instantly).',
      );
    return model;
  }

  function memory(): MemoryInfo {
    const m = model?.memory();
    return {
      weightBytes: m?.weight_bytes ?? null,
      precision: m?.precision ?? null,
      wasmHeapBytes: host.wasmHeapBytes(),
      jsWeightBytes: m?.js_weight_bytes ?? null,
      jsWeightsWhy: m?.js_weights_why ?? null,
      paramBytes: m?.param_bytes ?? null,
      hooksBytes: m?.hooks_bytes ?? null,
      jsHeapBytes: host.jsHeapBytes(),
      blobReads: host.blobReads?.() ?? null,
      transfers: m?.transfers ?? null,
    };
  }

  /** A Doctor check on the loaded model: a job the page can cancel, its progress throttled. */
  function modelJob<T>(
    jobId: string,
    onProgress: ProgressFn,
    fn: (m: LoadedModel, req: LoadRequest, o: { signal: AbortSignal; onProgress: ProgressFn }) => Promise<T>,
  ): Promise<T> {
    return withErrorJson(async () => {
      const m = requireModel();
      const signal = jobs.start(jobId);
      try {
        return await fn(m, modelReq!, { signal, onProgress: throttle(onProgress, 50, stepDone) });
      } finally {
        jobs.end(jobId);
      }
    });
  }

  let opInfos: OperationInfo[] | null = null;

  return {
    async ping() {
      return 'pong';
    },

    async configure(opts: { instanceId: string }) {
      instanceId = opts.instanceId;
      store = instanceHandleStore(instanceId);
    },

    listOperations() {
      return withErrorJson(async () => {
        opInfos ??= Object.values(operations).map((op) => ({
          name: op.name,
          title: op.title,
          description: op.description,
          long: !!op.long,
          ...(op.feeds ? { feeds: op.feeds } : {}),
          inputSchema: operationSchemas(op).input,
        }));
        return opInfos;
      });
    },

    async checkDocuments(items) {
      return items.map(({ op, doc, what }) => {
        try {
          checkForeignDocument(op, doc, what);
          return null;
        } catch (e) {
          return toLoupeError(e).toJSON().error;
        }
      });
    },

    loadModel(jobId: string, req: LoadRequest, onProgress: FileProgressFn, onPreview?: PreviewFn) {
      return withErrorJson(async (): Promise<LoadedModelSummary> => {
        const signal = jobs.start(jobId);
        try {
          const opened = await host.openModel(req, {
            signal,
            onProgress: throttle(onProgress, 80, fileDone),
            onPreview,
          });
          // swap only once the new model is ready, so a failed load leaves the old one usable
          const old = model;
          model = opened.model;
          modelReq = req;
          // handles describe activations of the old model: drop them
          store = instanceHandleStore(instanceId);
          if (old && old !== model) void old.dispose().catch(() => {});
          return opened.summary;
        } finally {
          jobs.end(jobId);
        }
      });
    },

    runOperation(jobId: string, name: string, input: unknown, onProgress: ProgressFn) {
      return withErrorJson(async () => {
        const op = requireOperation(name);
        const m = requireModel();
        const parsed = parseOperationInput(op, input);
        const signal = jobs.start(jobId);
        try {
          const sae = host.saeLoadersFor(modelReq);
          // SAE download progress arrives through onProgress too (ops/lib/sae.ts turns file bytes into steps)
          return await op.run(m, parsed, {
            signal,
            onProgress: throttle(onProgress, 50, stepDone),
            store,
            loadSae: sae.loadSae,
            loadSaeFile: sae.loadSaeFile,
            loadTranscoders: sae.loadTranscoders,
            documents: host.documentCache(),
          });
        } finally {
          jobs.end(jobId);
        }
      });
    },

    async cancel(jobId: string) {
      return jobs.cancel(jobId);
    },

    listCache() {
      return withErrorJson(() => host.listCachedModels());
    },

    saeNeedsDownload(ref) {
      return withErrorJson(() => host.saeNeedsDownload(ref, modelReq));
    },

    deleteCache(key) {
      return withErrorJson(() => host.deleteCachedModel(key));
    },

    storage() {
      return withErrorJson(() => host.storageInfo());
    },

    memory() {
      return withErrorJson(async () => memory());
    },

    doctor() {
      return withErrorJson(async () => ({
        ...(await host.environment()),
        backend: model?.info.backend ?? null,
        model: model ? model.info.id : null,
        storage: await host.storageInfo(),
        memory: memory(),
      }));
    },

    agreement(jobId: string, prompt: string, onProgress: ProgressFn) {
      return modelJob(jobId, onProgress, (m, req, o) => compareBackends(m, req, prompt, o, host));
    },

    q8Cost(jobId: string, prompt: string, onProgress: ProgressFn) {
      return modelJob(jobId, onProgress, (m, req, o) => q8Cost(m, req, prompt, o, host.openModel));
    },
  };
}
