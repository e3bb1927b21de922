/**
 * Where a Node load keeps its q8 weights between starts (q8.ts), so a second `loupe … --weights
 * q8` reads them instead of quantising again (the qwen2.5-0.5b shape: minutes under load):
 *
 *   Hub / URL models   next to the model's files in the directory cache (source/q8-store.ts):
 *                      deleting the model's folder there deletes its q8 entry.
 *   local folders      under $LOUPE_CACHE_DIR/q8/, keyed by the folder and each weight file's
 *                      path, size, mtime and inode; at most MAX_FOLDER_ENTRIES folders' entries
 *                      (the ones used last) and none whose folder is gone.
 *
 * onnxruntime-node reads an entry from disk itself (it is hard-linked beside the graph, as every
 * weight file), so the quantised bytes are not held in JS. LOUPE_Q8_CACHE=0 turns this off.
 */
import { existsSync, statSync, utimesSync } from 'node:fs';
import * as path from 'node:path';
import type { Q8Store } from '../engine/q8';
import type { ByteCache, ModelSource } from '../engine/source/types';
import { HttpSource } from '../engine/source/http-source';
import { cacheQ8Store, isQ8Entry } from '../engine/source/q8-store';
import { DirCache, defaultCacheDir } from './dir-cache';
import { FolderSource } from './folder-source';
import { diskFile } from './load-files-node';

/** local folders whose q8 entries are kept (each is about half the model's 16-bit bytes) */
export const MAX_FOLDER_ENTRIES = 3;

export function q8CacheRoot(): string {
  return path.join(defaultCacheDir(), 'q8');
}

/** `cache`: the load's byte cache (false: none, as `loadModelFilesNode` takes it) */
export function nodeQ8Store(source: ModelSource, cache?: ByteCache | false): Q8Store | undefined {
  if (process.env.LOUPE_Q8_CACHE === '0') return undefined;
  if (source instanceof FolderSource) return folderStore(source);
  if (source instanceof HttpSource && cache !== false) {
    const c = cache ?? new DirCache();
    const base = cacheQ8Store(c, (f) => source.cacheKey(f), diskFile);
    // a directory cache's files are stat'ed, not listed with the whole cache
    return base && c.localPath ? { ...base, identity: statIdentity((f) => c.localPath!(source.cacheKey(f))) } : base;
  }
  return undefined;
}

/** each weight file's path, size, mtime and inode: a file written again (or replaced) changes it */
function statIdentity(pathOf: (file: string) => string | undefined): Q8Store['identity'] {
  return async (files) =>
    JSON.stringify(
      files.map((f) => {
        const p = pathOf(f);
        const s = p ? statSync(p) : undefined;
        return s ? [f, p, s.size, s.mtimeMs, s.ino, s.dev] : [f];
      }),
    );
}

function folderStore(source: FolderSource): Q8Store | undefined {
  const dir = new DirCache(q8CacheRoot());
  const keyOf = (file: string) => ({ endpoint: 'folder', id: source.dir, revision: '', file });
  const base = cacheQ8Store(dir, keyOf, diskFile)!;
  return {
    ...base,
    identity: statIdentity((f) => source.localPath(f)),
    async open(name) {
      const hit = await base.open(name);
      // used-last order for the bound below
      if (hit?.path)
        try {
          const now = new Date();
          utimesSync(hit.path, now, now);
        } catch {
          /* order only */
        }
      return hit;
    },
    async retain(name) {
      await base.retain(name);
      const entries = (await dir.list()).filter((e) => e.complete && isQ8Entry(e.file));
      const live = entries.filter((e) => e.endpoint === 'folder' && existsSync(e.id));
      for (const e of entries) if (!live.includes(e)) await dir.delete(e);
      live.sort((a, b) => b.storedAt - a.storedAt);
      for (const e of live.slice(MAX_FOLDER_ENTRIES)) await dir.delete(e);
    },
  };
}
