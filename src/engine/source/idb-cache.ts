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
 *
 * In a worker chunks are stored as Blobs: Chromium keeps a stored Blob's bytes on disk and a read
 * gives back a handle, so `openFile` yields a weight file (chunked-file.ts) whose ranges are read
 * on demand and which is never held in memory, whole or in chunks. Elsewhere (Node's fake
 * IndexedDB in tests) chunks are bytes; every reader takes either.
 */
import { openDB, type DBSchema, type IDBPDatabase } from 'idb';
import type { ByteCache, CacheEntryInfo, CacheKey, CacheSink, RangeRead } from './types';
import type { RangedFile } from '../safetensors-types';
import { canReadBlobsSync, chunkedFile, fileReaderSync, type BlobReaderSync, type Chunk } from './chunked-file';
import { LoupeError } from '../errors';
import { storageError } from './storage';
import { cacheSink, knownMeta } from './sink';

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
  chunks: { key: [string, number]; value: Chunk };
}

const fileKey = (k: CacheKey) => JSON.stringify([k.endpoint, k.id, k.revision, k.file]);
const modelKey = (k: Omit<CacheKey, 'file'>) => JSON.stringify([k.endpoint, k.id, k.revision]);
const chunkRange = (key: string) => IDBKeyRange.bound([key, 0], [key, Number.MAX_SAFE_INTEGER]);
const chunkSize = (c: Chunk) => (c instanceof Uint8Array ? c.byteLength : c.size);
/** a stored chunk's bytes (read outside the transaction: awaiting a Blob would end it) */
const bytesOf = async (c: Chunk): Promise<Uint8Array> =>
  c instanceof Uint8Array ? c : new Uint8Array(await c.arrayBuffer());
/** the record of `key`'s entry: `size` bytes stored in `chunks` chunks, with `more` of its fields */
const entryRecord = (
  key: CacheKey,
  size: number,
  complete: boolean,
  chunks: number,
  more: Pick<EntryRecord, 'chunkBytes' | 'etag' | 'total' | 'missing'>,
): EntryRecord => ({
  key: fileKey(key),
  model: modelKey(key),
  endpoint: key.endpoint,
  id: key.id,
  revision: key.revision,
  file: key.file,
  size,
  complete,
  storedAt: Date.now(),
  chunks,
  ...more,
});

export interface IdbCacheOptions {
  dbName?: string;
  /** chunk size in bytes (tests use small ones) */
  chunkBytes?: number;
  /** store chunks as Blobs (default: where they can be read synchronously, i.e. in a worker) */
  blobs?: boolean;
  /** how openFile's weight files read Blob chunks synchronously (default FileReaderSync; the engine worker's own: workers/blob-reader.ts) */
  readBlob?: BlobReaderSync;
}

export class IdbCache implements ByteCache {
  private dbp?: Promise<IDBPDatabase<CacheSchema>>;
  private readonly dbName: string;
  private readonly chunkBytes: number;
  private readonly blobs: boolean;
  private readonly readBlob: BlobReaderSync;

  constructor(opts: IdbCacheOptions = {}) {
    this.dbName = opts.dbName ?? 'loupe-cache';
    this.chunkBytes = opts.chunkBytes ?? CHUNK_BYTES;
    this.blobs = opts.blobs ?? canReadBlobsSync();
    this.readBlob = opts.readBlob ?? fileReaderSync;
  }

  /** what a chunk is stored as; `bytes` is a fresh copy (a view would clone its whole buffer into the database) */
  private stored(bytes: Uint8Array): Chunk {
    return this.blobs ? new Blob([bytes as BlobPart]) : bytes;
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

  private async read(
    key: CacheKey,
    complete: boolean,
    maxBytes = Infinity,
  ): Promise<{ bytes: Uint8Array; rec: EntryRecord } | undefined> {
    const db = await this.db();
    const k = fileKey(key);
    const tx = db.transaction(['entries', 'chunks'], 'readonly');
    const rec = await tx.objectStore('entries').get(k);
    if (!rec || rec.missing || rec.complete !== complete || rec.size > maxBytes) {
      await tx.done;
      return undefined;
    }
    const chunks = await tx.objectStore('chunks').getAll(chunkRange(k));
    await tx.done;
    const out = new Uint8Array(rec.size);
    let off = 0;
    for (const c of chunks) {
      if (off + chunkSize(c) > rec.size) return undefined;
      out.set(await bytesOf(c), off);
      off += chunkSize(c);
    }
    return off === rec.size ? { bytes: out, rec } : undefined;
  }

  private async write(
    key: CacheKey,
    bytes: Uint8Array,
    complete: boolean,
    meta: { etag?: string; total?: number } = {},
  ): Promise<void> {
    const db = await this.db();
    const k = fileKey(key);
    const tx = db.transaction(['entries', 'chunks'], 'readwrite');
    const chunks = tx.objectStore('chunks');
    await chunks.delete(chunkRange(k));
    let n = 0;
    for (let off = 0; off < bytes.byteLength; off += this.chunkBytes, n++) {
      // slice, not subarray: a view would clone its whole underlying buffer into the database
      await chunks.put(this.stored(bytes.slice(off, Math.min(off + this.chunkBytes, bytes.byteLength))), [k, n]);
    }
    await tx
      .objectStore('entries')
      .put(entryRecord(key, bytes.byteLength, complete, n, { chunkBytes: this.chunkBytes, ...knownMeta(meta) }));
    await tx.done;
  }

  async get(key: CacheKey, opts: { maxBytes?: number } = {}): Promise<Uint8Array | undefined> {
    return (await this.read(key, true, opts.maxBytes))?.bytes;
  }

  async put(key: CacheKey, bytes: Uint8Array): Promise<void> {
    await this.write(key, bytes, true);
  }

  async getPartial(key: CacheKey): Promise<{ bytes: Uint8Array; etag?: string; total?: number } | undefined> {
    const r = await this.read(key, false);
    if (!r) return undefined;
    return { bytes: r.bytes, ...knownMeta(r.rec) };
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
    if (!rec || rec.missing || size == null || (!rec.complete && offset + length > rec.size)) {
      await tx.done;
      return undefined;
    }
    const end = Math.min(offset + length, rec.size);
    const out = new Uint8Array(Math.max(0, end - offset));
    if (out.byteLength > 0) {
      // Old entries do not say their chunk size: that of the first chunk is everyone's but the last's.
      const c0 = rec.chunkBytes ? undefined : await tx.objectStore('chunks').get([k, 0]);
      const cb = rec.chunkBytes ?? (c0 && chunkSize(c0));
      if (!cb) {
        await tx.done;
        return undefined;
      }
      const first = Math.floor(offset / cb),
        last = Math.floor((end - 1) / cb);
      const chunks = await tx.objectStore('chunks').getAll(IDBKeyRange.bound([k, first], [k, last]));
      await tx.done;
      if (chunks.length !== last - first + 1) return undefined;
      try {
        const file = chunkedFile(
          chunks,
          cb,
          chunks.reduce((s, c) => s + chunkSize(c), 0),
        );
        out.set(await file.readAsync(offset - first * cb, out.byteLength));
      } catch {
        return undefined; // chunks of another size than the entry says: read nothing from it
      }
      return { bytes: out, size, stored: rec.size };
    }
    await tx.done;
    return { bytes: out, size, stored: rec.size };
  }

  /**
   * A complete entry as a weight file read by range (chunked-file.ts): never one buffer of the
   * whole file; with Blob chunks (a worker) not held in memory at all.
   */
  async openFile(key: CacheKey): Promise<RangedFile | undefined> {
    const db = await this.db();
    const k = fileKey(key);
    const tx = db.transaction(['entries', 'chunks'], 'readonly');
    const rec = await tx.objectStore('entries').get(k);
    if (!rec || rec.missing || !rec.complete) {
      await tx.done;
      return undefined;
    }
    const chunks = await tx.objectStore('chunks').getAll(chunkRange(k));
    await tx.done;
    const cb = rec.chunkBytes ?? (chunks.length ? chunkSize(chunks[0]) : 1);
    try {
      return chunkedFile(chunks, cb, rec.size, this.readBlob);
    } catch {
      return undefined; // chunks that do not add up: not a complete entry
    }
  }

  /** whether a complete entry exists (reads its small record only) */
  async hasComplete(key: CacheKey): Promise<boolean> {
    const rec = await (await this.db()).get('entries', fileKey(key));
    return !!rec && rec.complete && !rec.missing;
  }

  /**
   * Stream a download into IndexedDB chunk by chunk: each full chunk is written with the partial
   * entry's record in one transaction, so an interrupted download (a closed tab included) resumes
   * from its last whole chunk, and the file is never one buffer in memory. A partial entry written
   * with the same chunk size is resumed (its last, unfinished chunk read back); commit() marks
   * the entry complete.
   */
  async openSink(key: CacheKey): Promise<CacheSink> {
    const db = await this.db();
    const k = fileKey(key);
    const cb = this.chunkBytes;
    const rec = await db.get('entries', k);
    let meta: { etag?: string; total?: number } = {};
    let length = 0;
    let pending = new Uint8Array(0);
    if (rec && !rec.complete && !rec.missing && rec.size > 0 && (rec.chunkBytes === cb || rec.chunks <= 1)) {
      meta = knownMeta(rec);
      length = rec.size;
      const tail = length % cb;
      if (tail > 0) {
        const last = await db.get('chunks', [k, Math.floor(length / cb)]);
        if (!last || chunkSize(last) !== tail) {
          length -= tail;
        } else pending = (await bytesOf(last)).slice();
      }
    } else if (rec) {
      await this.delete(key);
    }
    const buf = new Uint8Array(cb);
    buf.set(pending);
    let fill = pending.byteLength;
    let written = length - fill; // bytes in whole chunks already stored
    let chain: Promise<void> = Promise.resolve();
    let failed: unknown;
    const record = (size: number, complete: boolean, chunks: number) =>
      entryRecord(key, size, complete, chunks, { chunkBytes: cb, ...knownMeta(meta) });
    // a refused write becomes its structured error here, so append() can stop the download at once
    const queue = (fn: () => Promise<void>) => {
      chain = chain.then(fn).catch(async (e) => {
        failed ??= await storageError(e, key.file, meta.total ?? length);
      });
    };
    /** write chunk `n` (`bytes`) and the record saying `size` bytes are stored, in one transaction */
    const writeChunk = (n: number, bytes: Uint8Array | null, size: number, complete: boolean) =>
      queue(async () => {
        const tx = db.transaction(['entries', 'chunks'], 'readwrite');
        if (bytes) await tx.objectStore('chunks').put(this.stored(bytes), [k, n]);
        await tx.objectStore('entries').put(record(size, complete, bytes ? n + 1 : n));
        await tx.done;
      });
    const flushTail = (complete: boolean) => {
      const n = Math.floor(written / cb);
      writeChunk(n, fill > 0 ? buf.slice(0, fill) : null, written + fill, complete);
    };
    const done = async () => {
      await chain;
      if (failed) throw failed;
    };
    return cacheSink(
      () => length,
      () => meta,
      {
        append(chunk) {
          // the storage quota ran out: stop the download now, not after every byte has arrived
          if (failed instanceof LoupeError) throw failed;
          let off = 0;
          while (off < chunk.byteLength) {
            const take = Math.min(cb - fill, chunk.byteLength - off);
            buf.set(chunk.subarray(off, off + take), fill);
            fill += take;
            off += take;
            length += take;
            if (fill === cb) {
              writeChunk(Math.floor(written / cb), buf.slice(), written + cb, false);
              written += cb;
              fill = 0;
            }
          }
        },
        drain: done,
        reset() {
          length = 0;
          fill = 0;
          written = 0;
          queue(async () => {
            const tx = db.transaction(['entries', 'chunks'], 'readwrite');
            await tx.objectStore('chunks').delete(chunkRange(k));
            await tx.objectStore('entries').delete(k);
            await tx.done;
          });
        },
        setMeta(m) {
          meta = knownMeta(m);
        },
        async suspend() {
          if (length > 0) flushTail(false);
          await done();
        },
        async commit() {
          flushTail(true);
          await done();
        },
      },
    );
  }

  async putMissing(key: CacheKey): Promise<void> {
    const db = await this.db();
    const k = fileKey(key);
    const tx = db.transaction(['entries', 'chunks'], 'readwrite');
    await tx.objectStore('chunks').delete(chunkRange(k));
    await tx.objectStore('entries').put(entryRecord(key, 0, false, 0, { missing: true }));
    await tx.done;
  }

  async isMissing(key: CacheKey): Promise<boolean> {
    const db = await this.db();
    return !!(await db.get('entries', fileKey(key)))?.missing;
  }

  async list(): Promise<CacheEntryInfo[]> {
    const db = await this.db();
    const recs = (await db.getAll('entries')).filter((r) => !r.missing);
    return recs.map(({ endpoint, id, revision, file, size, complete, storedAt }) => ({
      endpoint,
      id,
      revision,
      file,
      size,
      complete,
      storedAt,
    }));
  }

  async delete(key: Omit<CacheKey, 'file'> & { file?: string }): Promise<void> {
    const db = await this.db();
    const tx = db.transaction(['entries', 'chunks'], 'readwrite');
    const entries = tx.objectStore('entries');
    const keys =
      key.file !== undefined ? [fileKey(key as CacheKey)] : await entries.index('model').getAllKeys(modelKey(key));
    for (const k of keys) {
      await entries.delete(k);
      await tx.objectStore('chunks').delete(chunkRange(k));
    }
    await tx.done;
  }
}
