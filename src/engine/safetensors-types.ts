/** A validated tensor entry of a safetensors file (see safetensors.ts for the rules). */
export type SafetensorsDtype = 'F32' | 'F16' | 'BF16' | 'F64' | 'I64' | 'I32' | 'I16' | 'I8' | 'U8' | 'BOOL';

export interface TensorEntry {
  name: string;
  dtype: SafetensorsDtype;
  shape: number[];
  /** byte offset of the tensor's data from the start of the FILE (8 + header length + data_offsets[0]) */
  fileOffset: number;
  byteLength: number;
  /** which file (shard) holds it, e.g. 'model.safetensors' or 'model-00001-of-00002.safetensors' */
  file: string;
  /** set on the 8-bit tensors the runtime builds for --weights q8 (q8.ts), never on a file's own entries */
  q8?: Q8Layout;
  /** set on the 4-bit tensors the runtime builds for --weights q4 (q4.ts), never on a file's own entries */
  q4?: Q4Layout;
  /** set on the tensors an adapter derives from a checkpoint's own at load (GPT-OSS's experts, mxfp4.ts) */
  derived?: DerivedRows;
}

/**
 * How a tensor derived at load is made (mxfp4.ts): rows start, start + step, … (count of them) of
 * expert `expert` of a stacked source
 */
export interface DerivedRows {
  /**
   * mxfp4: blocks + scales; dense: a stacked [E, in, R] matrix (its columns are the rows); rows: a
   * stacked [E, R, in] one (Gemma 4: its rows are the rows); bias: [E, R]
   */
  kind: 'mxfp4' | 'dense' | 'rows' | 'bias';
  src: string;
  scales?: string;
  expert: number;
  start: number;
  step: number;
  count: number;
  /** the file holding the source (set by deriveRows): a derived tensor's bytes change exactly when that file's do */
  srcFile?: string;
}

/** how a q8 tensor (dtype I8, the stored tensor's shape) is laid out (q8.ts has the scheme) */
export interface Q8Layout {
  /** the input axis of the stored matrix: 1 for [out, in] (torch Linear, embeddings), 0 for [in, out] (GPT-2 Conv1D) */
  axis: 0 | 1;
  block: number;
  /** float16 scales (float32 in the WebGPU form): [out, in/block, 1] for axis 1, [in/block, 1, out] for axis 0 (broadcast against the blocked view) */
  scale: TensorEntry;
  /** the WebGPU form (q8.ts q8ForWebGpu): int8 widened by DequantizeLinear, not Cast */
  dequantize?: true;
}

/**
 * how a q4 tensor (dtype U8, the stored tensor's shape; its bytes MatMulNBits' B [n, k/block, block/2])
 * is laid out (q4.ts has the scheme)
 */
export interface Q4Layout {
  /** the input axis of the stored matrix, as Q8Layout's */
  axis: 0 | 1;
  block: number;
  /** output channels (MatMulNBits' N) and inputs (its K) */
  n: number;
  k: number;
  /** float32 scales [n · k/block], output channel major */
  scale: TensorEntry;
}

/**
 * A weight file read by byte range, never held whole: a file on disk (Node, src/node/), or a
 * complete IndexedDB entry's chunk list (browser, source/chunked-file.ts). `read` is synchronous
 * (a positioned read; a synchronous Blob read of the stored chunks in a worker) so `param()` stays
 * synchronous; `readAsync` does not block the thread (session pieces read whole). Both give a fresh buffer;
 * `read`'s may instead be a view of `into`, scratch the caller reuses (a pass over a table reads
 * chunk after chunk into one buffer).
 */
export interface RangedFile {
  readonly size: number;
  read(offset: number, length: number, into?: Uint8Array): Uint8Array;
  readAsync(offset: number, length: number): Promise<Uint8Array>;
}

/** Weights of a model, possibly sharded: the raw bytes of each file plus a validated index. */
export interface WeightSet {
  /** file name -> raw file bytes (browser) ; may be absent when `paths` has the file (Node, loaded lazily) */
  files: Map<string, Uint8Array>;
  /** file name -> absolute local path (Node folder/directory cache), lets ORT read external data from disk */
  paths: Map<string, string>;
  /** file name -> a reader of byte ranges, for files held neither in `files` nor anywhere in JS memory */
  ranged?: Map<string, RangedFile>;
  tensors: Map<string, TensorEntry>;
  metadata: Record<string, string>;
}
