/**
 * Documents an operation keeps between calls (the dashboard's, under SHA-256 of model + corpus +
 * subject), written through the surface's byte cache: the page worker's IndexedDB (a database of
 * its own, so documents never show among the cached models) and, in Node, a folder beside the model
 * cache (`<cache dir>/documents`, below the depth the model cache lists). A surface without one
 * keeps documents in the process only.
 *
 * An entry answers to what it was written for: a header line names the operation, the key and the
 * SHA-256 of the document's text that follows it, and a read checks all three. A file put there
 * by hand, copied from another key, cut short or edited reads as absent, and the document is
 * computed again. (The hash finds damage and substitution; whoever can write the cache and
 * compute a SHA-256 can also write a matching header.)
 */
import type { ByteCache } from './types';

export interface DocumentCache {
  /** where documents are kept, in words (documents say which store answered) */
  where: string;
  get(op: string, key: string): Promise<unknown | undefined>;
  put(op: string, key: string, doc: unknown): Promise<void>;
}

const ENDPOINT = 'loupe-documents';
const FORMAT = 1;

async function sha256Hex(text: string): Promise<string> {
  const d = await globalThis.crypto.subtle.digest('SHA-256', new TextEncoder().encode(text));
  return [...new Uint8Array(d)].map((b) => b.toString(16).padStart(2, '0')).join('');
}

/** a DocumentCache on a ByteCache; unreadable entries read as absent, failed writes are dropped */
export function documentCacheOn(cache: ByteCache, where: string): DocumentCache {
  const keyOf = (op: string, key: string) => ({ endpoint: ENDPOINT, id: op, revision: '', file: `${key}.json` });
  return {
    where,
    async get(op, key) {
      try {
        const bytes = await cache.get(keyOf(op, key));
        if (!bytes) return undefined;
        const text = new TextDecoder().decode(bytes);
        const nl = text.indexOf('\n');
        const head = JSON.parse(text.slice(0, nl)) as {
          loupe_document?: unknown;
          op?: unknown;
          key?: unknown;
          sha256?: unknown;
        };
        const body = text.slice(nl + 1);
        const ok = nl > 0 && head.loupe_document === FORMAT && head.op === op && head.key === key;
        return ok && head.sha256 === (await sha256Hex(body)) ? JSON.parse(body) : undefined;
      } catch {
        return undefined;
      }
    },
    async put(op, key, doc) {
      // a full disk or a refused quota costs the next call a recomputation, never this call's result
      try {
        const body = JSON.stringify(doc);
        const head = JSON.stringify({ loupe_document: FORMAT, op, key, sha256: await sha256Hex(body) });
        await cache.put(keyOf(op, key), new TextEncoder().encode(`${head}\n${body}`));
      } catch {
        /* kept in the process only */
      }
    },
  };
}
