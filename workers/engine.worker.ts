/**
 * The model worker: the engine (engine-api.ts) over the browser's host — IndexedDB caches,
 * onnxruntime-web on WebGPU or WASM (engine-adapter.ts) — so the page never blocks on a forward
 * pass. Exposed to the page with comlink; the contract is workers/protocol.ts.
 */
import * as Comlink from 'comlink';
import { LoupeError } from '../src/engine/errors';
import { env } from '../src/engine/env';
import { wasmHeapBytes } from '../src/engine/runtime/wasm-heap';
import { createEngineApi } from './engine-api';
import { blobReadCounts } from './blob-reader';
import { gpuInfo, storageInfo, jsHeapBytes } from './doctor';
import {
  openModel,
  listCachedModels,
  deleteCachedModel,
  wasmThreads,
  ortRuntime,
  saeLoadersFor,
  saeNeedsDownload,
  documentCache,
} from './engine-adapter';

Comlink.expose(
  createEngineApi({
    openModel,
    listCachedModels,
    deleteCachedModel,
    saeLoadersFor,
    saeNeedsDownload,
    documentCache,
    storageInfo,
    wasmHeapBytes,
    jsHeapBytes,
    blobReads: blobReadCounts,
    async environment() {
      return {
        crossOriginIsolated: env.isolated,
        hardwareConcurrency: env.threads,
        wasmThreads: wasmThreads(),
        ortRuntime: ortRuntime(),
        userAgent: navigator.userAgent,
        gpu: await gpuInfo(),
      };
    },
    async twinBackend(current) {
      const gpu = await gpuInfo();
      if (!gpu.available)
        throw new LoupeError(
          'BACKEND_UNAVAILABLE',
          `The agreement check needs WebGPU and WASM; WebGPU is unavailable: ${gpu.reason}`,
        );
      return current === 'webgpu' ? 'wasm' : 'webgpu';
    },
  }),
);
