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
}

/** Weights of a model, possibly sharded: the raw bytes of each file plus a validated index. */
export interface WeightSet {
  /** file name -> raw file bytes (browser) ; may be absent when `paths` has the file (Node, loaded lazily) */
  files: Map<string, Uint8Array>;
  /** file name -> absolute local path (Node folder/directory cache), lets ORT read external data from disk */
  paths: Map<string, string>;
  tensors: Map<string, TensorEntry>;
  metadata: Record<string, string>;
}
