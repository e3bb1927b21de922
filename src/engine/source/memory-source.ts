/**
 * A model held in memory: file name -> bytes, text or Blob. For tests that generate models, and
 * for a folder the user picks in the page (<input webkitdirectory> / File System Access gives Files).
 *
 *   new MemorySource({ 'config.json': JSON.stringify(cfg), 'tokenizer.json': tok, 'model.safetensors': bytes }, 'my-model')
 */
import { fileTooLarge } from '../caps';
import { LoupeError } from '../errors';
import type { FetchOptions, ModelRef, ModelSource, RangeRead } from './types';

export type MemoryFile = Uint8Array | string | Blob;

export class MemorySource implements ModelSource {
  readonly ref: ModelRef;
  private readonly files: Map<string, MemoryFile>;

  /** `scheme`: what the id says the bytes are ('folder': a folder picked in the page) */
  constructor(files: Map<string, MemoryFile> | Record<string, MemoryFile>, name = 'memory', scheme = 'memory') {
    this.files = files instanceof Map ? files : new Map(Object.entries(files));
    // 'url' is the closest kind: bytes that came from somewhere other than the Hub or a folder.
    this.ref = { kind: 'url', id: `${scheme}:${name}`, revision: '' };
  }

  /** the file's contents; null when absent and `optional` */
  private entry(file: string, opts: FetchOptions): MemoryFile | null {
    if (opts.signal?.aborted) throw new LoupeError('ABORTED', 'The operation was cancelled.');
    const f = this.files.get(file);
    if (f !== undefined) return f;
    if (opts.optional) return null;
    throw new LoupeError('FILE_NOT_FOUND', `${file} is not among the model's files.`, undefined, {
      file,
      modelExists: true,
    });
  }

  async fetchFile(file: string, opts: FetchOptions = {}): Promise<Uint8Array | null> {
    const f = this.entry(file, opts);
    if (f === null) return null;
    const size = typeof f === 'string' ? f.length : f instanceof Uint8Array ? f.byteLength : f.size;
    if (opts.maxBytes != null && size > opts.maxBytes) throw fileTooLarge(file, size, opts.maxBytes, true);
    const bytes =
      typeof f === 'string'
        ? new TextEncoder().encode(f)
        : f instanceof Uint8Array
          ? f
          : new Uint8Array(await f.arrayBuffer());
    opts.onProgress?.({ file, loaded: bytes.byteLength, total: bytes.byteLength, done: true });
    return bytes;
  }

  async readRange(file: string, offset: number, length: number, opts: FetchOptions = {}): Promise<RangeRead | null> {
    const f = this.entry(file, opts);
    if (f === null) return null;
    if (f instanceof Blob)
      return {
        bytes: new Uint8Array(await f.slice(offset, offset + length).arrayBuffer()),
        size: f.size,
        cached: true,
      };
    const bytes = typeof f === 'string' ? new TextEncoder().encode(f) : f;
    return { bytes: bytes.subarray(offset, offset + length), size: bytes.byteLength, cached: true };
  }
}
