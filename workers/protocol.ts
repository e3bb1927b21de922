/**
 * The contract between the page and the model worker (workers/engine.worker.ts), spoken through
 * comlink. Only plain data crosses: errors cross as LoupeError JSON ({error:{code,message,hint}}),
 * callbacks are comlink proxies.
 */
import type { Backend, ModelInfo, TransferCounts } from '../src/engine/api';
import type { ErrorDocument } from '../src/engine/errors';
import type { FileProgress } from '../src/engine/source/types';
import type { Feeds, Progress } from '../src/ops/types';
import type { WeightsMode } from '../src/engine/precision';
import type { PrecisionCost } from '../src/ops/lib/precision-cost';

export type BackendChoice = 'auto' | 'webgpu' | 'wasm';

/** What the page asks the worker to load. A string is what a person types ('default', 'owner/name@rev', a URL). */
export type ModelRequest =
  | string
  | { kind: 'bundled' }
  | { kind: 'hub'; id: string; revision?: string; endpoint?: string; token?: string; requested?: string }
  | { kind: 'url'; id: string }
  /** a folder the person picked in the page: its files by name (the in-page worker only: Files do not cross a socket) */
  | { kind: 'folder'; name: string; files: Record<string, Blob> };

export interface LoadRequest {
  model: ModelRequest;
  backend: BackendChoice;
  /** weight precision (src/engine/precision.ts); default auto */
  weights?: WeightsMode;
}

export interface LoadedModelSummary {
  info: ModelInfo;
  /** how the page should name this model in links and the recent list (never carries a token) */
  ref: { kind: 'bundled' | 'hub' | 'url'; id: string; revision: string; commit?: string; endpoint?: string };
  /** bytes of weights fetched over the network in this load (0 when everything came from a cache) */
  downloadedBytes: number;
  /** files that came from the IndexedDB cache */
  cachedFiles: string[];
  loadMs: number;
  /** why 'auto' picked the backend it did */
  backendReason: string;
  /**
   * the page's onnxruntime-web build the model runs on (workers/ort-runtime.ts): the native WebGPU
   * one, or JSEP with the reason the native one failed; absent where the engine is not onnxruntime-web's
   */
  runtime?: {
    build: 'native' | 'jsep';
    name: string;
    fallback?: { from: 'native' | 'jsep'; code: string; message: string };
  };
}

/**
 * What a load will cost, judged from config.json and the safetensors headers before any weight
 * byte is downloaded (src/engine/source/preflight.ts). The page shows it and, above
 * CONFIRM_DOWNLOAD_BYTES, waits for a click.
 */
export interface LoadPreview {
  id: string;
  revision: string;
  /** the commit the Hub resolved the revision to, when known */
  commit?: string;
  architecture: string;
  n_params: number;
  /** stored dtypes, e.g. 'F16' */
  dtype: string;
  /** size of the weight files */
  weightBytes: number;
  /** weight bytes not yet in this browser's cache */
  downloadBytes: number;
  /** weight bytes already in this browser's cache before the load */
  cachedBytes: number;
  /** the backend the load will run on ('node': a served engine's onnxruntime-node) */
  backend: Backend;
  /** estimated peak memory per backend the engine offers, at the precision that will run */
  needs: { backend: Backend; precision: string; bytes: number; fits: boolean }[];
  /** the download waits for a person's click */
  confirm: boolean;
}

/** Downloads above this wait for a click. */
export const CONFIRM_DOWNLOAD_BYTES = 1e9;

/** The page's answer to a preview: true to download, false to stop the load. */
export type PreviewFn = (p: LoadPreview) => Promise<boolean>;

/** An operation as the page sees it, in the registry's order (the page's tab order). */
export interface OperationInfo {
  name: string;
  /** the tab's title */
  title: string;
  description: string;
  long: boolean;
  /** document fields that fill other operations' forms after a run (ops/types.ts Feeds) */
  feeds?: Feeds;
  /** the input schema as JSON Schema (zod → JSON Schema, input side: defaulted fields optional) */
  inputSchema: Record<string, unknown>;
}

export interface CachedModel {
  endpoint: string;
  id: string;
  revision: string;
  files: number;
  bytes: number;
  complete: boolean;
  storedAt: number;
}

export interface StorageInfo {
  usage: number | null;
  quota: number | null;
  persisted: boolean | null;
}

export interface GpuInfo {
  available: boolean;
  reason?: string;
  vendor?: string;
  architecture?: string;
  device?: string;
  description?: string;
  isFallbackAdapter?: boolean;
  features?: string[];
  limits?: Record<string, number>;
}

export interface DoctorInfo {
  crossOriginIsolated: boolean;
  hardwareConcurrency: number;
  wasmThreads: number | null;
  userAgent: string;
  gpu: GpuInfo;
  backend: string | null;
  /** the onnxruntime-web build the model runs on, and why when it is the fallback (the page's worker) */
  ortRuntime?: string | null;
  model: string | null;
  storage: StorageInfo;
  memory: MemoryInfo;
}

export interface MemoryInfo {
  /** bytes of the weights as the session holds them, in `precision` (f32, or 16-bit 'stored') */
  weightBytes: number | null;
  precision: string | null;
  /** onnxruntime-web's WASM heap (the sessions: weights, pre-packed copies, activations); null on WebGPU before a WASM session */
  wasmHeapBytes: number | null;
  /** weight file bytes the worker holds in JS (0 when read by range from IndexedDB) */
  jsWeightBytes: number | null;
  /** why some weight bytes are held in JS (ModelMemory.js_weights_why), null when none are */
  jsWeightsWhy: string | null;
  /** float32 copies of parameters kept for operations that read weights in JS */
  paramBytes: number | null;
  /** hook values the last run returned */
  hooksBytes: number | null;
  /** JS heap of the worker where the browser exposes it (Chromium) */
  jsHeapBytes: number | null;
  /** how weight ranges cached as Blobs were read synchronously (workers/blob-reader.ts); null where none are */
  blobReads: BlobReadCounts | null;
  /** what crossed between JS and the device since load (ModelMemory.transfers) */
  transfers?: TransferCounts | null;
}

/** reads through the shared window of the worker's Blob reader thread, and through FileReaderSync (a new buffer each) */
export interface BlobReadCounts {
  shared: number;
  fileReaderSync: number;
}

export interface AgreementResult {
  prompt: string;
  model: string;
  tokens: number;
  backends: [string, string];
  /** max |Δ| of final-position probabilities */
  maxProbDiff: number;
  /** max |Δ| of logits over every position */
  maxLogitDiff: number;
  /** max |Δ| over every hook value, and the hook where it occurred */
  maxHookDiff: number;
  worstHook: string | null;
  hooksCompared: number;
  top1Match: boolean;
  top1: [number, number];
  ms: [number, number];
  /** agreement within 1e-4 on logits and hooks, and the same top-1 */
  pass: boolean;
}

/** The Doctor's q8 cost (workers/q8-cost.ts): stored vs q8 on WASM, as `loupe doctor` reports it */
export interface Q8CostResult extends PrecisionCost {
  prompt: string;
  model: string;
  /** time of the two runs and traces */
  ms: number;
  /** how the q8 side got its weights (quantised at load, or read from the q8 cache) */
  q8_weights: string;
}

export type ProgressFn = (p: Progress) => void;
export type FileProgressFn = (p: FileProgress) => void;

export interface EngineWorkerApi {
  ping(): Promise<'pong'>;
  /** the page instance id that handles are minted with (src/ops/lib/handles.ts) */
  configure(opts: { instanceId: string }): Promise<void>;
  listOperations(): Promise<OperationInfo[]>;
  /**
   * documents from outside (a link's result, a session file's entries) checked against their
   * operation's output schema and Loupe's limits: per item, null or why it is refused
   */
  checkDocuments(items: { op: string; doc: unknown; what: string }[]): Promise<(ErrorDocument['error'] | null)[]>;
  /** onPreview (optional) sees the judged plan before any weight byte and may stop the load */
  loadModel(
    jobId: string,
    req: LoadRequest,
    onProgress: FileProgressFn,
    onPreview?: PreviewFn,
  ): Promise<LoadedModelSummary>;
  runOperation(jobId: string, name: string, input: unknown, onProgress: ProgressFn): Promise<unknown>;
  /** abort a job (load or operation); returns whether it was running */
  cancel(jobId: string): Promise<boolean>;
  listCache(): Promise<CachedModel[]>;
  /** whether loading this SAE would fetch anything (false when it is complete in the IndexedDB cache) */
  saeNeedsDownload(ref: { source: string; path: string }): Promise<boolean>;
  deleteCache(key: { endpoint: string; id: string; revision: string }): Promise<void>;
  storage(): Promise<StorageInfo>;
  doctor(): Promise<DoctorInfo>;
  agreement(jobId: string, prompt: string, onProgress: ProgressFn): Promise<AgreementResult>;
  /** what q8 weights cost on the loaded model (max |Δ| on logits and DLA vs stored precision) */
  q8Cost(jobId: string, prompt: string, onProgress: ProgressFn): Promise<Q8CostResult>;
  memory(): Promise<MemoryInfo>;
}
