/**
 * The engine's host in Node, for `loupe serve`: models load through src/node (onnxruntime-node
 * on the CPU, its WebGPU provider, or onnxruntime-web's WASM), are judged there before any
 * download and cached in the Node cache folder ($LOUPE_CACHE_DIR or ~/.cache/loupe), as the CLI's
 * are. The page's requests arrive as workers/protocol.ts ModelRequests.
 */
import os from 'node:os';
import { statfs } from 'node:fs/promises';
import { LoupeError } from '../engine/errors';
import type { Backend } from '../engine/api';
import { BUNDLED_MODEL_ID } from '../engine/source/ref';
import { HubSource } from '../engine/source/hub-source';
import { UrlSource } from '../engine/source/url-source';
import { wasmHeapBytes } from '../engine/runtime/wasm-heap';
import type { SaeLoaders } from '../engine/source/sae-loader';
import type { DocumentCache } from '../engine/source/document-cache';
import { loadModelNode } from '../node/load';
import { sourceFromSpec } from '../node/load-files-node';
import { DirCache, defaultCacheDir } from '../node/dir-cache';
import { createNodeSaeLoaders } from '../node/load-sae';
import { nodeDocumentCache } from '../node/document-cache';
import { NODE_BACKENDS, type NodeBackend } from '../node/backends';
import { NO_LOCAL, type LocalAccess } from '../node/local-access';
import type { NetAccess } from '../node/net-access';
import { requireOrtNode } from '../node/ort-node';
import { webGpuRoute } from '../node/webgpu-node';
import { packageVersion } from '../node/package';
import type { OrtModule } from '../engine/runtime/ort-session';
import { cachedModelsOf, fileTally, previewOf, saeNeedsDownloadIn } from '../../workers/engine-api';
import type { EngineHost } from '../../workers/engine-host';
import type { GpuInfo, LoadRequest, LoadedModelSummary, ModelRequest } from '../../workers/protocol';

export interface NodeHostOptions {
  /** what the page's 'auto' runs on */
  backend: NodeBackend;
  /** local folders a request may name (none by default: the page is another machine's) */
  local?: LocalAccess;
  /** hosts a request may make the engine fetch from (loupe serve: the Hub's by default, --allow-host) */
  net?: NetAccess;
}

/** A ModelRequest as a spec string and the Hub options it carries. */
function specOf(m: ModelRequest): { spec: string; endpoint?: string; token?: string } {
  if (typeof m === 'string') return { spec: m };
  if (m.kind === 'bundled') return { spec: 'default' };
  if (m.kind === 'hub') return { spec: `${m.id}@${m.revision || 'main'}`, endpoint: m.endpoint, token: m.token };
  if (m.kind === 'url') return { spec: m.id };
  throw new LoupeError('BAD_INPUT', 'Not a model request.', 'Load the bundled model, a Hub id or an http(s) URL.');
}

/** 'auto' is the server's own backend; the page's WebGPU and WASM are the Node ones of those names. */
function backendOf(choice: LoadRequest['backend'], own: NodeBackend): { backend: NodeBackend; reason: string } {
  if (choice === 'webgpu' || choice === 'wasm') return { backend: choice, reason: 'chosen' };
  return { backend: own, reason: `auto: the engine's own backend (loupe serve --backend ${own})` };
}

function ortNodeVersion(): string {
  try {
    return (requireOrtNode<{ env?: { versions?: { node?: string } } }>().env?.versions?.node ?? '').trim();
  } catch {
    return '';
  }
}

export function nodeEngineHost(o: NodeHostOptions): EngineHost {
  const cache = new DirCache();
  let sae: { key: string; loaders: SaeLoaders } | null = null;
  let documents: DocumentCache | null = null;
  let gpu: Promise<GpuInfo> | null = null;
  const gpuInfo = (): Promise<GpuInfo> =>
    (gpu ??= (async (): Promise<GpuInfo> => {
      if (o.backend !== 'webgpu')
        return { available: false, reason: `this engine runs on the CPU (loupe serve --backend ${o.backend})` };
      try {
        const r = await webGpuRoute(requireOrtNode<OrtModule>());
        if (!r.caps) return { available: false, reason: r.error ?? 'no WebGPU adapter' };
        return {
          available: true,
          description: `onnxruntime-node WebGPU (Dawn); ${r.not_exposed}`,
          features: r.caps.shaderF16 ? ['shader-f16'] : [],
          limits: { maxStorageBufferBindingSize: r.caps.maxBufferBytes },
        };
      } catch (e) {
        return { available: false, reason: (e as Error).message };
      }
    })());

  return {
    async openModel(req, opts) {
      const t0 = performance.now();
      const { spec, endpoint, token } = specOf(req.model);
      const { backend, reason } = opts.backend
        ? { backend: opts.backend as NodeBackend, reason: 'forced' }
        : backendOf(req.backend, o.backend);
      const source = sourceFromSpec(spec, { endpoint, token, local: o.local ?? NO_LOCAL, net: o.net, names: true });
      const ref: LoadedModelSummary['ref'] =
        source instanceof HubSource
          ? { kind: 'hub', id: source.ref.id, revision: source.ref.revision, endpoint: source.ref.endpoint }
          : source instanceof UrlSource
            ? { kind: 'url', id: source.ref.id, revision: '' }
            : { kind: 'bundled', id: BUNDLED_MODEL_ID, revision: '' };
      const files = fileTally();
      const model = await loadModelNode(spec, {
        source,
        backend,
        weights: req.weights,
        cache,
        endpoint,
        token,
        local: o.local ?? NO_LOCAL,
        signal: opts.signal,
        onProgress: (p) => {
          files.note(p);
          opts.onProgress(p);
        },
        confirm: opts.onPreview
          ? async (plan, j) => {
              if (!(await opts.onPreview!(previewOf(plan, j, backend, ref.id, NODE_BACKENDS))))
                throw new LoupeError(
                  'CANCELLED',
                  'The download was declined.',
                  'Load a smaller model, or accept the download to go on.',
                );
            }
          : undefined,
      });
      return {
        model,
        summary: {
          info: model.info,
          ref: { ...ref, ...(model.info.commit ? { commit: model.info.commit } : {}) },
          ...files.result(),
          loadMs: performance.now() - t0,
          backendReason: reason,
        },
      };
    },
    async listCachedModels() {
      return cachedModelsOf(await cache.list());
    },
    deleteCachedModel: (key) => cache.delete(key),
    saeLoadersFor(req) {
      // a Hub id as sae_source resolves against the loaded model's endpoint, with its token (as in the page)
      const m = req?.model;
      const hub = m && typeof m === 'object' && m.kind === 'hub' ? m : null;
      const key = JSON.stringify([hub?.endpoint ?? '', hub?.token ?? '']);
      if (sae?.key !== key)
        sae = {
          key,
          loaders: createNodeSaeLoaders({
            cache,
            local: o.local ?? NO_LOCAL,
            ...(o.net ? { net: o.net } : {}),
            ...(hub?.endpoint ? { endpoint: hub.endpoint } : {}),
            ...(hub?.token ? { token: hub.token } : {}),
          }),
        };
      return sae.loaders;
    },
    saeNeedsDownload: (ref, req) => saeNeedsDownloadIn(cache, ref, req),
    documentCache: () => (documents ??= nodeDocumentCache()),
    async storageInfo() {
      try {
        const s = await statfs(defaultCacheDir()).catch(() => statfs(os.homedir()));
        return { usage: null, quota: s.bavail * s.bsize, persisted: true };
      } catch {
        return { usage: null, quota: null, persisted: null };
      }
    },
    async environment() {
      const ort = ortNodeVersion();
      return {
        crossOriginIsolated: true,
        hardwareConcurrency: os.availableParallelism?.() ?? os.cpus().length,
        wasmThreads: 1,
        userAgent:
          `Loupe engine ${packageVersion()} (loupe serve --backend ${o.backend}) · Node ${process.version} · ` +
          `${process.platform}-${process.arch}${ort ? ` · onnxruntime-node ${ort}` : ''} · ${os.hostname()}`,
        gpu: await gpuInfo(),
      };
    },
    wasmHeapBytes,
    jsHeapBytes: () => process.memoryUsage().heapUsed,
    async twinBackend(current: Backend): Promise<Backend> {
      // node ↔ webgpu where the engine has a GPU, node ↔ wasm (onnxruntime-web in Node) otherwise
      if (current !== 'node') return 'node';
      return o.backend === 'webgpu' && (await gpuInfo()).available ? 'webgpu' : 'wasm';
    },
  };
}
