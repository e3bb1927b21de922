/**
 * Documents an operation keeps between calls (the dashboard's, under SHA-256 of model + corpus +
 * subject), written through the surface's byte cache: the page worker's IndexedDB (a database of
 * its own, so documents never show among the cached models) and, in Node, a folder beside the model
 * cache (`<cache dir>/documents`, below the depth the model cache lists). A surface without one
 * keeps documents in the process only.
 */
import type { ByteCache } from './types';

export interface DocumentCache {
  /** where documents are kept, in words (documents say which store answered) */
  where: string;
  get(op: string, key: string): Promise<unknown | undefined>;
  put(op: string, key: string, doc: unknown): Promise<void>;
}

const ENDPOINT = 'loupe-documents';

/** a DocumentCache on a ByteCache; unreadable entries read as absent, failed writes are dropped */
export function documentCacheOn(cache: ByteCache, where: string): DocumentCache {
  const keyOf = (op: string, key: string) => ({ endpoint: ENDPOINT, id: op, revision: '', file: `${key}.json` });
  return {
    where,
    async get(op, key) {
      try {
        const bytes = await cache.get(keyOf(op, key));
        return bytes ? JSON.parse(new TextDecoder().decode(bytes)) : undefined;
      } catch {
        return undefined;
      }
    },
    async put(op, key, doc) {
      // a full disk or a refused quota costs the next call a recomputation, never this call's result
      try {
        await cache.put(keyOf(op, key), new TextEncoder().encode(JSON.stringify(doc)));
      } catch {
        /* kept in the process only */
      }
    },
  };
}
