/**
 * A Hub or URL model's q8 (or q4) weights (q8.ts) kept in its own byte cache, next to its files: an entry
 * `.loupe/q8-<key>.safetensors` (`.loupe/q4-…`) of the same model (IndexedDB in the page, the directory cache in
 * Node). So clearing the model from the cache clears its q8 entry with it, and the page's cache
 * list counts its bytes.
 *
 * Written through the cache's streaming sink (`openSink`), whose entry is complete only after
 * `commit`: an interrupted write leaves a partial entry, which `open` never returns and the next
 * write replaces. The source files' identity is what the cache says of them (size, time stored),
 * so a file downloaded again makes a new key. One entry per model and scheme: writing one drops the
 * others of its scheme.
 */
import { quantEntryScheme, type Q8Store } from '../q8';
import type { ByteCache, CacheKey } from './types';
import type { RangedFile } from '../safetensors-types';

/** whether a cache entry's file is a quantised (q8 or q4) entry, not one of the model's own files */
export const isQ8Entry = (file: string): boolean => quantEntryScheme(file) !== undefined;

/** `fileAt`: a file on disk read by range (Node), for a cache whose entries have a local path */
export function cacheQ8Store(
  cache: ByteCache,
  keyOf: (file: string) => CacheKey,
  fileAt?: (path: string) => RangedFile,
): Q8Store | undefined {
  if (!cache.openSink || !(cache.openFile || (cache.localPath && fileAt))) return undefined;
  const model = keyOf('');
  const ofModel = (e: CacheKey) => e.endpoint === model.endpoint && e.id === model.id && e.revision === model.revision;
  return {
    async identity(files) {
      const entries = (await cache.list()).filter(ofModel);
      return JSON.stringify(
        files.map((f) => {
          const e = entries.find((x) => x.file === f);
          return e ? [f, e.size, e.storedAt, e.complete] : [f];
        }),
      );
    },
    async open(name) {
      const key = keyOf(name);
      let path: string | undefined;
      try {
        path = fileAt && cache.localPath?.(key);
      } catch (e) {
        // an entry whose bytes are not the ones written (CACHE_MISMATCH) is rebuilt, like a broken one
        if ((e as { code?: unknown }).code !== 'CACHE_MISMATCH') throw e;
        await cache.delete(key);
        return undefined;
      }
      if (path && fileAt) return { file: fileAt(path), path };
      const file = await cache.openFile?.(key);
      return file ? { file } : undefined;
    },
    async create(name) {
      const key = keyOf(name);
      await cache.delete(key); // a partial entry of an earlier try is not resumed: start empty
      const sink = await cache.openSink!(key);
      return {
        append: (b) => sink.append(b),
        drain: () => sink.drain?.() ?? Promise.resolve(),
        commit: () => sink.commit(),
        abort: () => cache.delete(key),
      };
    },
    drop: (name) => cache.delete(keyOf(name)),
    async retain(name) {
      const scheme = quantEntryScheme(name);
      for (const e of await cache.list())
        if (ofModel(e) && quantEntryScheme(e.file) === scheme && e.file !== name) await cache.delete(e);
    },
  };
}
