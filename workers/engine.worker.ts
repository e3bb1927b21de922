/**
 * The model worker: holds one loaded model and runs the same operation modules as the CLI and the
 * bridge, so the page never blocks on a forward pass. Exposed to the page with comlink; the
 * contract is workers/protocol.ts.
 *
 * Every method catches and rethrows errors as LoupeError JSON, because comlink would otherwise
 * reduce an Error to {name, message} and lose the code and hint.
 */
import * as Comlink from 'comlink';
import { LoupeError, toLoupeError } from '../src/engine/errors';
import { env } from '../src/engine/env';
import type { LoadedModel } from '../src/engine/api';
import { operations, parseOperationInput, requireOperation } from '../src/ops/index';
import { operationSchemas } from '../src/ops/schemas';
import { checkForeignDocument } from './documents';
import { JobTable, throttle, fileDone, stepDone } from './jobs';
import { instanceHandleStore, newInstanceId } from '../src/ops/lib/handles';
import { gpuInfo, storageInfo, jsHeapBytes } from './doctor';
import {
  openModel,
  listCachedModels,
  deleteCachedModel,
  wasmThreads,
  saeLoadersFor,
  saeNeedsDownload,
  documentCache,
} from './engine-adapter';
import { compareBackends } from './agreement';
import { q8Cost } from './q8-cost';
import { wasmHeapBytes } from '../src/engine/runtime/wasm-heap';
import type {
  EngineWorkerApi,
  LoadRequest,
  LoadedModelSummary,
  OperationInfo,
  FileProgressFn,
  ProgressFn,
  MemoryInfo,
  PreviewFn,
} from './protocol';

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
    wasmHeapBytes: wasmHeapBytes(),
    jsWeightBytes: m?.js_weight_bytes ?? null,
    jsWeightsWhy: m?.js_weights_why ?? null,
    paramBytes: m?.param_bytes ?? null,
    hooksBytes: m?.hooks_bytes ?? null,
    jsHeapBytes: jsHeapBytes(),
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

const api: EngineWorkerApi = {
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
        const opened = await openModel(req, { signal, onProgress: throttle(onProgress, 80, fileDone), onPreview });
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
        const sae = saeLoadersFor(modelReq);
        // SAE download progress arrives through onProgress too (ops/lib/sae.ts turns file bytes into steps)
        return await op.run(m, parsed, {
          signal,
          onProgress: throttle(onProgress, 50, stepDone),
          store,
          loadSae: sae.loadSae,
          loadSaeFile: sae.loadSaeFile,
          loadTranscoders: sae.loadTranscoders,
          documents: documentCache(),
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
    return withErrorJson(() => listCachedModels());
  },

  saeNeedsDownload(ref) {
    return withErrorJson(() => saeNeedsDownload(ref, modelReq));
  },

  deleteCache(key) {
    return withErrorJson(() => deleteCachedModel(key));
  },

  storage() {
    return withErrorJson(() => storageInfo());
  },

  memory() {
    return withErrorJson(async () => memory());
  },

  doctor() {
    return withErrorJson(async () => ({
      crossOriginIsolated: env.isolated,
      hardwareConcurrency: env.threads,
      wasmThreads: wasmThreads(),
      userAgent: navigator.userAgent,
      gpu: await gpuInfo(),
      backend: model?.info.backend ?? null,
      model: model ? model.info.id : null,
      storage: await storageInfo(),
      memory: memory(),
    }));
  },

  agreement(jobId: string, prompt: string, onProgress: ProgressFn) {
    return modelJob(jobId, onProgress, (m, req, o) => compareBackends(m, req, prompt, o));
  },

  q8Cost(jobId: string, prompt: string, onProgress: ProgressFn) {
    return modelJob(jobId, onProgress, (m, req, o) => q8Cost(m, req, prompt, o));
  },
};

Comlink.expose(api);
