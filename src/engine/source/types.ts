/**
 * Where model files come from and where their bytes are kept.
 *
 * A ModelSource knows how to fetch one named file of a model (Hub id, base URL, local folder,
 * the bundled model). A ByteCache keeps bytes between sessions (IndexedDB in the browser, a
 * directory in Node). `loadModelFiles` (files.ts) combines the two: it fetches config, tokenizer
 * and safetensors (single or sharded), reports progress and honours an AbortSignal.
 */

import type { RangedFile } from '../safetensors-types';

export interface ModelRef {
  /** 'hub' = {endpoint}/{id}/resolve/{revision}/{file}; 'url' = {base}/{file}; 'folder' = a local directory (Node). */
  kind: 'hub' | 'url' | 'folder';
  /** Hub id (owner/name), base URL, or folder path. */
  id: string;
  /** Git revision for the Hub (default 'main'); '' for url/folder. */
  revision: string;
  /** Hub endpoint, e.g. https://huggingface.co (hub only). */
  endpoint?: string;
  /** the name asked for when it was a catalog name other than the id (engine/catalog.ts), e.g. 'gemma-3-270m' */
  requested?: string;
}

export interface FileProgress {
  file: string;
  /** bytes received so far, including bytes resumed from a partial cache entry */
  loaded: number;
  /** total bytes when known (Content-Length / Content-Range), else null */
  total: number | null;
  /** true when the bytes came from the cache with no request */
  cached?: boolean;
  done?: boolean;
  /** true when a resume was refused (the server sent the whole file again): `loaded` restarts from 0 */
  restarted?: boolean;
  /** aggregate over every file of the model load (set by loadModelFiles) */
  overall?: OverallProgress;
}

/** Aggregate progress of a model load. `total` grows as files are discovered (shards after the
 * index); `loaded` is monotone (unless a file restarted) and equals `total` when the load is done. */
export interface OverallProgress {
  loaded: number;
  /** sum of the known sizes of the files met so far (a file of unknown size counts its loaded bytes) */
  total: number;
  /** files met so far / finished */
  files: number;
  filesDone: number;
}

export interface FetchOptions {
  signal?: AbortSignal;
  onProgress?: (p: FileProgress) => void;
  /** when true a missing file (404) resolves to null instead of throwing FILE_NOT_FOUND */
  optional?: boolean;
  /** byte cache: complete entries are returned with no request, partial ones are resumed with Range */
  cache?: ByteCache;
  /** only look in the cache: resolve to null (no request) when the file is not cached complete */
  cacheOnly?: boolean;
  /** retries after a network failure or 5xx, each resuming where the last stopped (default 2) */
  retries?: number;
  /**
   * The file's first bytes, already read (the preflight's safetensors header): a download with
   * nothing cached resumes after them (Range + If-Range on the etag) instead of fetching them again.
   */
  head?: FileHead;
  /**
   * The most bytes the file may have (decoded): the size the plan judged, or a small file's cap
   * (caps.ts). A larger declared size or body is TOO_LARGE, and its partial entry is deleted.
   */
  maxBytes?: number;
  /** Check a file's bytes before they are cached (fetchFile): a file that fails is not kept. */
  validate?: (bytes: Uint8Array) => void;
}

export interface FileHead {
  bytes: Uint8Array;
  /** the file's validator when the bytes were read (a changed file then answers 200 and restarts) */
  etag?: string;
  /** the file's full size */
  total: number;
}

export interface ModelSource {
  readonly ref: ModelRef;
  /** Fetch one file. Throws LoupeError (FILE_NOT_FOUND, HTTP_ERROR, NETWORK_ERROR, ABORTED). */
  fetchFile(file: string, opts?: FetchOptions): Promise<Uint8Array | null>;
  /** Local path of a file when the source is a folder (Node), so the runtime can hand ORT a path. */
  localPath?(file: string): string | undefined;
  /**
   * `length` bytes at `offset` of a file and the file's full size, without reading the rest
   * (an HTTP Range request, a positioned read, or a complete cache entry's chunks). Used to read
   * safetensors headers before deciding to download. Null for an optional file that is missing.
   */
  readRange?(file: string, offset: number, length: number, opts?: FetchOptions): Promise<RangeRead | null>;
}

export interface RangeRead {
  bytes: Uint8Array;
  /** size of the whole file; null when the server did not say */
  size: number | null;
  /** true when the bytes came from the cache with no request */
  cached?: boolean;
  /** the file's validator (206 answers only) */
  etag?: string;
  /** bytes of the file already in the cache (the size when complete, less for a partial entry) */
  stored?: number;
}

export interface CacheKey {
  endpoint: string;
  id: string;
  revision: string;
  file: string;
}

export interface CacheEntryInfo extends CacheKey {
  size: number;
  complete: boolean;
  storedAt: number;
}

export interface ByteCache {
  /** complete bytes or undefined; undefined too for an entry over `maxBytes` (not read) */
  get(key: CacheKey, opts?: { maxBytes?: number }): Promise<Uint8Array | undefined>;
  put(key: CacheKey, bytes: Uint8Array): Promise<void>;
  /** bytes of an interrupted download (to resume with a Range request) */
  getPartial(key: CacheKey): Promise<{ bytes: Uint8Array; etag?: string; total?: number } | undefined>;
  putPartial(key: CacheKey, bytes: Uint8Array, meta: { etag?: string; total?: number }): Promise<void>;
  list(): Promise<CacheEntryInfo[]>;
  /** delete every file of a model (endpoint+id+revision), or one file when key.file is given */
  delete(key: Omit<CacheKey, 'file'> & { file?: string }): Promise<void>;
  /**
   * `length` bytes at `offset` of an entry, reading only the chunks that hold them: from a
   * complete entry, or from a partial one of known total that already holds those bytes.
   */
  readRange?(key: CacheKey, offset: number, length: number): Promise<RangeRead | undefined>;
  /** A complete entry as a file read by byte range, never assembled whole (IdbCache). */
  openFile?(key: CacheKey): Promise<RangedFile | undefined>;
  /** whether a complete entry exists, without reading its bytes */
  hasComplete?(key: CacheKey): Promise<boolean>;
  /** Remember that a file does not exist (an optional file's 404), so a cached load asks no more. */
  putMissing?(key: CacheKey): Promise<void>;
  isMissing?(key: CacheKey): Promise<boolean>;
  /** Local path of a cached complete file, when the cache is a directory (Node). */
  localPath?(key: CacheKey): string | undefined;
  /**
   * Write a download straight into the cache, chunk by chunk, instead of holding it in memory
   * (DirCache). The sink starts at the partial entry's bytes, if any.
   */
  openSink?(key: CacheKey): Promise<CacheSink>;
}

/** A download being written into a cache (see ByteCache.openSink). */
export interface CacheSink {
  /** bytes stored so far (a partial entry's length when resuming) */
  readonly length: number;
  /** validator and size of the version being written, as stored with the partial entry */
  readonly etag?: string;
  readonly total?: number;
  append(chunk: Uint8Array): void;
  /** resolves when what was appended is stored (a sink that writes asynchronously holds it until then) */
  drain?(): Promise<void>;
  /** forget the stored bytes (the server sent a different version or refused the range) */
  reset(): void;
  /** remember which version these bytes belong to (kept for the next resume) */
  setMeta(meta: { etag?: string; total?: number }): void;
  /** stop, keeping the bytes as a partial entry */
  suspend(): Promise<void>;
  /** the file is whole: make it the complete entry */
  commit(): Promise<void>;
}
