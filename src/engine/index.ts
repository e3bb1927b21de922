/**
 * The engine's browser entry (also usable in any JS runtime with fetch): load a model from the
 * bundled folder, a Hub id or a URL, on onnxruntime-web with WebGPU when an adapter exists, else
 * WASM. Node code uses src/node/load.ts (onnxruntime-node, weights read from disk).
 */
import type { Backend, LoadedModel, LoadOptions } from './api';
import { LoupeError } from './errors';
import { createModel } from './model';
import { readTensorF32 } from './safetensors';
import { webSessionFactory, type OrtModule } from './runtime/session';
import { loadModelFiles } from './source/files';
import { HubSource } from './source/hub-source';
import { UrlSource } from './source/url-source';
import { BUNDLED_MODEL_ID, BUNDLED_MODEL_PATH, resolveModelRef } from './source/ref';
import type { ByteCache, ModelSource } from './source/types';

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
}

/** WebGPU when the browser gives us an adapter, else WASM (transformers.js-style capability check). */
export async function detectBackend(): Promise<'webgpu' | 'wasm'> {
  const gpu = (globalThis as any).navigator?.gpu;
  if (!gpu) return 'wasm';
  try {
    return (await gpu.requestAdapter()) ? 'webgpu' : 'wasm';
  } catch {
    return 'wasm';
  }
}

export function sourceFor(spec: string, opts: { baseUrl?: string; endpoint?: string; token?: string } = {}): ModelSource {
  const ref = resolveModelRef(spec, { endpoint: opts.endpoint });
  const base = opts.baseUrl ?? (globalThis as any).location?.href ?? 'http://127.0.0.1/';
  switch (ref.kind) {
    case 'bundled': return new UrlSource(new URL(BUNDLED_MODEL_PATH, base).href);
    case 'hub': return new HubSource(ref.id, { revision: ref.revision, endpoint: ref.endpoint, token: opts.token });
    case 'url': return new UrlSource(ref.id);
    case 'folder': throw new LoupeError('BAD_INPUT', `"${spec}" looks like a local folder; the page can load Hub ids and URLs only.`, 'Serve the folder over http(s), or use the CLI for local folders.');
  }
}

export async function loadModel(spec: string | ModelSource, opts: BrowserLoadOptions): Promise<LoadedModel> {
  const source = typeof spec === 'string' ? sourceFor(spec, opts) : spec;
  const bundled = typeof spec === 'string' && resolveModelRef(spec).kind === 'bundled';
  const files = await loadModelFiles(source, { cache: bundled ? undefined : opts.cache, signal: opts.signal, onProgress: opts.onProgress });
  const wanted: Backend = opts.backend && opts.backend !== 'auto' ? opts.backend : await detectBackend();
  if (wanted === 'node') throw new LoupeError('BACKEND_UNAVAILABLE', "The 'node' backend exists only in Node.", 'Use webgpu or wasm in the browser.');
  const parts = {
    config: files.config as Record<string, any>,
    tokenizerJson: files.tokenizerJson,
    tokenizerConfig: files.tokenizerConfig,
    weights: files.weights,
    readTensor: (name: string) => readTensorF32(files.weights, name),
    id: bundled ? BUNDLED_MODEL_ID : files.ref.id,
    revision: files.ref.revision ?? '',
    source: bundled ? ('bundled' as const) : files.ref.kind,
    maxParams: opts.maxParams,
  };
  try {
    return await createModel(parts, webSessionFactory(opts.ort, wanted));
  } catch (e) {
    // A WebGPU device can fail at session creation (limits, lost device): fall back to WASM, unless asked explicitly.
    if (wanted === 'webgpu' && (!opts.backend || opts.backend === 'auto') && !(e instanceof LoupeError)) {
      return createModel(parts, webSessionFactory(opts.ort, 'wasm'));
    }
    throw e;
  }
}
