/**
 * ByteCache in IndexedDB (browser; tested in Node with fake-indexeddb).
 *
 *   const cache = new IdbCache();            // database 'loupe-cache'
 *   await cache.put(key, bytes); await cache.get(key); await cache.list(); await cache.delete({endpoint,id,revision});
 *
 * Two stores: `entries` holds one small record per file (key, size, complete, etag, total,
 * storedAt), so `list()` never touches the bytes; `chunks` holds the bytes in pieces of at most
 * CHUNK_BYTES (one huge structured-clone value per file would need the whole file twice in
 * memory and hits per-value limits). Entries and their chunks change in one transaction, so an
 * entry that exists always has all its chunks. A file has at most one entry, complete or partial.
 */
import { openDB, type DBSchema, type IDBPDatabase } from 'idb';
import type { ByteCache, CacheEntryInfo, CacheKey } from './types';

export const CHUNK_BYTES = 32 * 1024 * 1024;

interface EntryRecord extends CacheEntryInfo {
  key: string;
  model: string;
  chunks: number;
  etag?: string;
  total?: number;
}

interface CacheSchema extends DBSchema {
  entries: { key: string; value: EntryRecord; indexes: { model: string } };
  chunks: { key: [string, number]; value: Uint8Array };
}

const fileKey = (k: CacheKey) => JSON.stringify([k.endpoint, k.id, k.revision, k.file]);
const modelKey = (k: Omit<CacheKey, 'file'>) => JSON.stringify([k.endpoint, k.id, k.revision]);
const chunkRange = (key: string) => IDBKeyRange.bound([key, 0], [key, Number.MAX_SAFE_INTEGER]);

export interface IdbCacheOptions {
  dbName?: string;
  /** chunk size in bytes (tests use small ones) */
  chunkBytes?: number;
}

export class IdbCache implements ByteCache {
  private dbp?: Promise<IDBPDatabase<CacheSchema>>;
  private readonly dbName: string;
  private readonly chunkBytes: number;

  constructor(opts: IdbCacheOptions = {}) {
    this.dbName = opts.dbName ?? 'loupe-cache';
    this.chunkBytes = opts.chunkBytes ?? CHUNK_BYTES;
  }

  private db(): Promise<IDBPDatabase<CacheSchema>> {
    this.dbp ??= openDB<CacheSchema>(this.dbName, 1, {
      upgrade(db) {
        const entries = db.createObjectStore('entries', { keyPath: 'key' });
        entries.createIndex('model', 'model');
        db.createObjectStore('chunks');
      },
    });
    return this.dbp;
  }

  async close(): Promise<void> {
    if (this.dbp) (await this.dbp).close();
    this.dbp = undefined;
  }

  private async read(key: CacheKey, complete: boolean): Promise<{ bytes: Uint8Array; rec: EntryRecord } | undefined> {
    const db = await this.db();
    const k = fileKey(key);
    const tx = db.transaction(['entries', 'chunks'], 'readonly');
    const rec = await tx.objectStore('entries').get(k);
    if (!rec || rec.complete !== complete) { await tx.done; return undefined; }
    const chunks = await tx.objectStore('chunks').getAll(chunkRange(k));
    await tx.done;
    const out = new Uint8Array(rec.size);
    let off = 0;
    for (const c of chunks) {
      if (off + c.byteLength > rec.size) return undefined;
      out.set(c, off);
      off += c.byteLength;
    }
    return off === rec.size ? { bytes: out, rec } : undefined;
  }

  private async write(key: CacheKey, bytes: Uint8Array, complete: boolean, meta: { etag?: string; total?: number } = {}): Promise<void> {
    const db = await this.db();
    const k = fileKey(key);
    const tx = db.transaction(['entries', 'chunks'], 'readwrite');
    const chunks = tx.objectStore('chunks');
    await chunks.delete(chunkRange(k));
    let n = 0;
    for (let off = 0; off < bytes.byteLength; off += this.chunkBytes, n++) {
      // slice, not subarray: a view would clone its whole underlying buffer into the database
      await chunks.put(bytes.slice(off, Math.min(off + this.chunkBytes, bytes.byteLength)), [k, n]);
    }
    const rec: EntryRecord = {
      key: k, model: modelKey(key), endpoint: key.endpoint, id: key.id, revision: key.revision, file: key.file,
      size: bytes.byteLength, complete, storedAt: Date.now(), chunks: n,
      ...(meta.etag ? { etag: meta.etag } : {}), ...(meta.total != null ? { total: meta.total } : {}),
    };
    await tx.objectStore('entries').put(rec);
    await tx.done;
  }

  async get(key: CacheKey): Promise<Uint8Array | undefined> {
    return (await this.read(key, true))?.bytes;
  }

  async put(key: CacheKey, bytes: Uint8Array): Promise<void> {
    await this.write(key, bytes, true);
  }

  async getPartial(key: CacheKey): Promise<{ bytes: Uint8Array; etag?: string; total?: number } | undefined> {
    const r = await this.read(key, false);
    if (!r) return undefined;
    return { bytes: r.bytes, ...(r.rec.etag ? { etag: r.rec.etag } : {}), ...(r.rec.total != null ? { total: r.rec.total } : {}) };
  }

  async putPartial(key: CacheKey, bytes: Uint8Array, meta: { etag?: string; total?: number }): Promise<void> {
    await this.write(key, bytes, false, meta);
  }

  async list(): Promise<CacheEntryInfo[]> {
    const db = await this.db();
    const recs = await db.getAll('entries');
    return recs.map(({ endpoint, id, revision, file, size, complete, storedAt }) => ({ endpoint, id, revision, file, size, complete, storedAt }));
  }

  async delete(key: Omit<CacheKey, 'file'> & { file?: string }): Promise<void> {
    const db = await this.db();
    const tx = db.transaction(['entries', 'chunks'], 'readwrite');
    const entries = tx.objectStore('entries');
    const keys = key.file !== undefined
      ? [fileKey(key as CacheKey)]
      : await entries.index('model').getAllKeys(modelKey(key));
    for (const k of keys) {
      await entries.delete(k);
      await tx.objectStore('chunks').delete(chunkRange(k));
    }
    await tx.done;
  }
}
