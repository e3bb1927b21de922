/**
 * What the engine (engine-api.ts) needs from the place it runs in: the page's worker
 * (engine.worker.ts over engine-adapter.ts) or `loupe serve` in Node (src/serve/node-host.ts).
 */
import type { Backend, LoadedModel } from '../src/engine/api';
import type { FileProgress } from '../src/engine/source/types';
import type { SaeLoaders } from '../src/engine/source/sae-loader';
import type { DocumentCache } from '../src/engine/source/document-cache';
import type {
  BlobReadCounts,
  CachedModel,
  DoctorInfo,
  LoadRequest,
  LoadedModelSummary,
  PreviewFn,
  StorageInfo,
} from './protocol';

export interface OpenOptions {
  signal: AbortSignal;
  onProgress: (p: FileProgress) => void;
  /** force a backend (the Doctor's checks load the same model on another one) */
  backend?: Backend;
  /** sees the judged plan before any weight byte; false stops the load (CANCELLED) */
  onPreview?: PreviewFn;
}

export type OpenModel = (
  req: LoadRequest,
  opts: OpenOptions,
) => Promise<{ model: LoadedModel; summary: LoadedModelSummary }>;

/** What the engine needs from the place it runs in. */
export interface EngineHost {
  openModel: OpenModel;
  listCachedModels(): Promise<CachedModel[]>;
  deleteCachedModel(key: { endpoint: string; id: string; revision: string }): Promise<void>;
  /** SAE loaders over the model cache, for the model request loaded now */
  saeLoadersFor(req: LoadRequest | null): SaeLoaders;
  saeNeedsDownload(ref: { source: string; path: string }, req: LoadRequest | null): Promise<boolean>;
  documentCache(): DocumentCache;
  storageInfo(): Promise<StorageInfo>;
  /** the Doctor's lines about the place itself */
  environment(): Promise<Omit<DoctorInfo, 'backend' | 'model' | 'storage' | 'memory'>>;
  wasmHeapBytes(): number | null;
  jsHeapBytes(): number | null;
  /** how cached Blob ranges were read, where the host reads them (the browser worker) */
  blobReads?(): BlobReadCounts;
  /** the backend the agreement check runs the loaded model on next to its own (BACKEND_UNAVAILABLE if none) */
  twinBackend(current: Backend): Promise<Backend>;
}
