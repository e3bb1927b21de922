/**
 * A model folder on this computer, picked in the page (File System Access or <input webkitdirectory>
 * give its files as Files): read as a URL model is (the same judging, refusals and cache), its
 * requests answered from the Files instead of a server.
 *
 * Cache key: endpoint = 'folder', id = 'folder:<name>', revision = a fingerprint of the files'
 * names, sizes and lastModified times. A folder's name says nothing about its contents (two
 * folders called "model" are different models), the fingerprint does: reopening the same folder
 * reads the cache, and a file whose size or time changed makes another revision, which misses it.
 */
import { LoupeError } from '../errors';
import { HttpSource, type HttpSourceOptions } from './http-source';
import { encodePath } from './hub-source';
import type { CacheKey, ModelRef } from './types';

/** a picked file: a Blob, with the lastModified time a File has */
type PickedFile = Blob & { lastModified?: number };

/** 'local-' and 16 hex digits: FNV-1a (64-bit, as two 32-bit halves) over name, size, lastModified of each file */
export function folderFingerprint(files: Map<string, PickedFile>): string {
  let h1 = 0x811c9dc5;
  let h2 = 0xcbf29ce4;
  const text = [...files]
    .map(([name, f]) => `${name}\u0000${f.size}\u0000${f.lastModified ?? ''}`)
    .sort()
    .join('\u0001');
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    h1 = Math.imul(h1 ^ c, 0x01000193) >>> 0;
    h2 = Math.imul(h2 ^ c ^ (h1 >>> 7), 0x01000193) >>> 0;
  }
  return `local-${h1.toString(16).padStart(8, '0')}${h2.toString(16).padStart(8, '0')}`;
}

export class FolderSource extends HttpSource {
  readonly ref: ModelRef;
  private readonly base: string;

  constructor(name: string, files: Map<string, PickedFile>, opts: HttpSourceOptions = {}) {
    const fingerprint = folderFingerprint(files);
    // an address no request leaves for: every request is answered from the Files
    const base = `https://folder.invalid/${fingerprint}/`;
    super({ ...opts, retries: 0, fetch: folderFetch(files, base) });
    this.base = base;
    this.ref = { kind: 'url', id: `folder:${name}`, revision: fingerprint };
  }

  url(file: string): string {
    return new URL(encodePath(file), this.base).href;
  }

  cacheKey(file: string): CacheKey {
    return { endpoint: 'folder', id: this.ref.id, revision: this.ref.revision, file };
  }

  protected override notFound(file: string): LoupeError {
    return new LoupeError('FILE_NOT_FOUND', `${file} is not in the folder ${this.ref.id}.`, undefined, {
      file,
      modelExists: true,
    });
  }
}

/** fetch over the Files: 200 with the whole file, 206 for a Range, 416 past the end, 404 for a name not picked */
function folderFetch(files: Map<string, PickedFile>, base: string): typeof fetch {
  return async (input, init) => {
    const url = typeof input === 'string' ? input : input instanceof URL ? input.href : input.url;
    if (init?.signal?.aborted) throw new DOMException('The operation was aborted.', 'AbortError');
    const name = url.startsWith(base) ? url.slice(base.length).split('/').map(decodeURIComponent).join('/') : '';
    const blob = files.get(name);
    if (!blob) return new Response(null, { status: 404 });
    const size = blob.size;
    const m = /^bytes=(\d+)-(\d*)$/.exec(new Headers(init?.headers).get('range') ?? '');
    if (!m) return new Response(blob, { status: 200, headers: { 'content-length': String(size) } });
    const start = Number(m[1]);
    if (start >= size) return new Response(null, { status: 416, headers: { 'content-range': `bytes */${size}` } });
    const end = m[2] ? Math.min(Number(m[2]) + 1, size) : size;
    return new Response(blob.slice(start, end), {
      status: 206,
      headers: { 'content-range': `bytes ${start}-${end - 1}/${size}`, 'content-length': String(end - start) },
    });
  };
}
