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
import type { ByteCache, CacheEntryInfo, CacheKey, RangeRead } from './types';

export const CHUNK_BYTES = 32 * 1024 * 1024;

interface EntryRecord extends CacheEntryInfo {
  key: string;
  model: string;
  chunks: number;
  /** size of every chunk but the last (absent in entries written before it was recorded) */
  chunkBytes?: number;
  etag?: string;
  total?: number;
  /** a remembered miss: the file does not exist (an optional file's 404); no chunks */
  missing?: boolean;
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
    if (!rec || rec.missing || rec.complete !== complete) { await tx.done; return undefined; }
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
      size: bytes.byteLength, complete, storedAt: Date.now(), chunks: n, chunkBytes: this.chunkBytes,
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

  async readRange(key: CacheKey, offset: number, length: number): Promise<RangeRead | undefined> {
    const db = await this.db();
    const k = fileKey(key);
    const tx = db.transaction(['entries', 'chunks'], 'readonly');
    const rec = await tx.objectStore('entries').get(k);
    // A partial entry answers when it holds the bytes and knows the file's size (a header read on resume).
    const size = rec?.complete ? rec.size : rec?.total;
    if (!rec || rec.missing || size == null || (!rec.complete && offset + length > rec.size)) { await tx.done; return undefined; }
    const end = Math.min(offset + length, rec.size);
    const out = new Uint8Array(Math.max(0, end - offset));
    if (out.byteLength > 0) {
      // Old entries do not say their chunk size: that of the first chunk is everyone's but the last's.
      const cb = rec.chunkBytes ?? (await tx.objectStore('chunks').get([k, 0]))?.byteLength;
      if (!cb) { await tx.done; return undefined; }
      const first = Math.floor(offset / cb), last = Math.floor((end - 1) / cb);
      const chunks = await tx.objectStore('chunks').getAll(IDBKeyRange.bound([k, first], [k, last]));
      if (chunks.length !== last - first + 1) { await tx.done; return undefined; }
      for (let i = 0; i < chunks.length; i++) {
        const at = (first + i) * cb;
        const from = Math.max(offset, at), to = Math.min(end, at + chunks[i].byteLength);
        if (to > from) out.set(chunks[i].subarray(from - at, to - at), from - offset);
      }
    }
    await tx.done;
    return { bytes: out, size, stored: rec.size };
  }

  async putMissing(key: CacheKey): Promise<void> {
    const db = await this.db();
    const k = fileKey(key);
    const tx = db.transaction(['entries', 'chunks'], 'readwrite');
    await tx.objectStore('chunks').delete(chunkRange(k));
    await tx.objectStore('entries').put({
      key: k, model: modelKey(key), endpoint: key.endpoint, id: key.id, revision: key.revision, file: key.file,
      size: 0, complete: false, storedAt: Date.now(), chunks: 0, missing: true,
    });
    await tx.done;
  }

  async isMissing(key: CacheKey): Promise<boolean> {
    const db = await this.db();
    return !!(await db.get('entries', fileKey(key)))?.missing;
  }

  async list(): Promise<CacheEntryInfo[]> {
    const db = await this.db();
    const recs = (await db.getAll('entries')).filter((r) => !r.missing);
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
