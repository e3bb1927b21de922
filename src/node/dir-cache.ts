/**
 * ByteCache in a directory (Node): `<root>/<endpoint>/<id>/<revision>/<file>`, each component
 * percent-encoded so no key can leave the root. Root: the constructor argument, else
 * $LOUPE_CACHE_DIR, else ~/.cache/loupe.
 *
 * Complete files are written to a temporary name and renamed, so a file that exists is whole.
 * An interrupted download is `<file>.partial` plus `<file>.partial.json` ({etag, total}).
 * `localPath(key)` gives the complete file's path, so ORT can read weights straight from disk.
 * Entries are read only as regular files resolving inside the root (file-range.ts): a FIFO, a
 * device or a link out of the cache in an entry's place is NOT_A_FILE, never a hang.
 *
 * Integrity: every complete file has a record beside it, `<file>@sha256` ('@' is never in an
 * encoded name): the key it was written for (endpoint, id, revision, file), the SHA-256 of its
 * bytes (hashed as they were written) and its size, mtime and inode then. A file answers to its
 * record, not its path: a record naming another key (a model folder linked to another model's)
 * is CACHE_MISMATCH. `get` (small files, documents) hashes every read: a file without a record or
 * with other bytes reads as absent, so it is fetched again. `localPath` (weights, read in place)
 * hashes only when size, mtime or inode moved since the record (sha256 runs at ~0.4–0.8 GB/s
 * here, below disk speed): other bytes are CACHE_MISMATCH; an entry from before records existed
 * is hashed once and recorded. `verify()` (`loupe doctor --verify-cache`) hashes every file.
 */
import {
  closeSync,
  existsSync,
  ftruncateSync,
  lstatSync,
  openSync,
  promises as fsp,
  readSync,
  renameSync,
  statSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { createHash, type Hash } from 'node:crypto';
import * as os from 'node:os';
import * as path from 'node:path';
import { LoupeError } from '../engine/errors';
import { isRegularFile, openRegular, openRegularSync, readAt, readRegular } from './file-range';
import type { ByteCache, CacheEntryInfo, CacheKey, CacheSink, RangeRead } from '../engine/source/types';
import { cacheSink, knownMeta } from '../engine/source/sink';

const PARTIAL = '.partial';
const META = '.partial.json';
/** an empty marker: the file does not exist upstream (an optional file's 404, remembered) */
const MISSING = '.missing';
/** a complete file's integrity record (see above) */
const RECORD = '@sha256';

interface FileRecord {
  endpoint: string;
  id: string;
  revision: string;
  file: string;
  sha256: string;
  size: number;
  mtimeMs: number;
  ino: number;
}

/** SHA-256 of a file, read in 8 MiB pieces */
function hashFile(p: string, within: string): string {
  const { fd } = openRegularSync(p, within);
  try {
    const h = createHash('sha256');
    const buf = Buffer.allocUnsafe(8 << 20);
    for (let n; (n = readSync(fd, buf, 0, buf.byteLength, null)) > 0;) h.update(buf.subarray(0, n));
    return h.digest('hex');
  } finally {
    closeSync(fd);
  }
}

function mismatch(key: CacheKey, what: string, dir: string): LoupeError {
  return new LoupeError(
    'CACHE_MISMATCH',
    `The cached ${key.file} of ${key.id}${key.revision ? '@' + key.revision : ''} ${what}.`,
    `Delete ${dir} and load the model again; Loupe downloads it afresh.`,
    { ...key, path: dir },
  );
}

export function defaultCacheDir(): string {
  return process.env.LOUPE_CACHE_DIR || path.join(os.homedir(), '.cache', 'loupe');
}

/** '.' and '..' are legal in keys but not as directory names: encode them too. ('' -> '', the
 * caller maps an empty revision to '@', which encodeURIComponent never produces.) */
function enc(s: string): string {
  const e = encodeURIComponent(s);
  // a file system's name limit is 255 bytes: a longer key is refused, not an ENAMETOOLONG later
  if (e.length > 255)
    throw new LoupeError(
      'BAD_INPUT',
      `"${s.slice(0, 60)}…" is too long to be a name in the model cache (${e.length} bytes encoded, at most 255).`,
      'A model id, revision or file name this long is not one the Hub serves.',
    );
  return e === '.' ? '%2E' : e === '..' ? '%2E%2E' : e;
}
const dec = decodeURIComponent;

/** whether `p` is absent or a regular file itself (not a link, a FIFO or a folder) */
function plainOrAbsent(p: string): boolean {
  try {
    return lstatSync(p).isFile();
  } catch {
    return true;
  }
}

export class DirCache implements ByteCache {
  readonly root: string;

  constructor(root: string = defaultCacheDir()) {
    this.root = path.resolve(root);
  }

  private modelDir(k: Omit<CacheKey, 'file'>): string {
    return path.join(this.root, enc(k.endpoint), enc(k.id), enc(k.revision) || '@');
  }
  private filePath(k: CacheKey): string {
    return path.join(this.modelDir(k), enc(k.file));
  }

  async get(key: CacheKey, opts: { maxBytes?: number } = {}): Promise<Uint8Array | undefined> {
    const tooLarge = () => new Error('over maxBytes');
    let bytes: Uint8Array;
    try {
      bytes = await readRegular(this.filePath(key), { within: this.root, maxBytes: opts.maxBytes, tooLarge });
    } catch (e) {
      if (e instanceof LoupeError) throw e;
      return undefined;
    }
    // a file without its record, or whose bytes are not the recorded ones, reads as absent: fetched again
    const rec = this.record(key);
    return rec && createHash('sha256').update(bytes).digest('hex') === rec.sha256 ? bytes : undefined;
  }

  /** the file's record; CACHE_MISMATCH when it was written for another key */
  private record(key: CacheKey): FileRecord | undefined {
    let rec: FileRecord;
    try {
      const { fd, size } = openRegularSync(this.filePath(key) + RECORD, this.root);
      try {
        const b = Buffer.alloc(Math.min(size, 64 * 1024));
        rec = JSON.parse(b.subarray(0, readSync(fd, b, 0, b.byteLength, 0)).toString('utf8')) as FileRecord;
      } finally {
        closeSync(fd);
      }
    } catch (e) {
      if (e instanceof LoupeError) throw e;
      return undefined;
    }
    if (!rec || typeof rec.sha256 !== 'string') return undefined;
    const { endpoint, id, revision, file } = rec;
    if (endpoint !== key.endpoint || id !== key.id || revision !== key.revision || file !== key.file)
      throw mismatch(
        key,
        `is recorded as ${file} of ${id}${revision ? '@' + revision : ''} (${endpoint})`,
        this.modelDir(key),
      );
    return rec;
  }

  /** record the complete file's hash (written beside it, then renamed into place) */
  private writeRecord(key: CacheKey, sha256: string): void {
    const p = this.filePath(key);
    const st = statSync(p);
    const rec: FileRecord = { ...key, sha256, size: st.size, mtimeMs: st.mtimeMs, ino: st.ino };
    const tmp = `${p}.tmp-${process.pid}-${Math.random().toString(36).slice(2)}`;
    writeFileSync(tmp, JSON.stringify(rec));
    renameSync(tmp, p + RECORD);
  }

  /**
   * The file's path once its bytes are the recorded ones: hashed again only when its size, mtime
   * or inode moved since the record (`full`: always); recorded now when it has no record.
   */
  private verified(key: CacheKey, full = false): string {
    const p = this.filePath(key);
    const rec = this.record(key);
    const st = statSync(p);
    if (rec && !full && rec.size === st.size && rec.mtimeMs === st.mtimeMs && rec.ino === st.ino) return p;
    const sha = hashFile(p, this.root);
    if (rec && sha !== rec.sha256)
      throw mismatch(
        key,
        `has other bytes than were downloaded (SHA-256 ${sha.slice(0, 12)}…, recorded ${rec.sha256.slice(0, 12)}…)`,
        this.modelDir(key),
      );
    this.writeRecord(key, sha);
    return p;
  }

  /**
   * Hash every complete file against its record (`loupe doctor --verify-cache`): the files
   * checked, their bytes, and each mismatch or missing record as a structured error.
   */
  async verify(): Promise<{
    files: number;
    bytes: number;
    problems: { file: string; code: string; message: string }[];
  }> {
    const out = { files: 0, bytes: 0, problems: [] as { file: string; code: string; message: string }[] };
    for (const e of await this.list()) {
      if (!e.complete) continue;
      const key = { endpoint: e.endpoint, id: e.id, revision: e.revision, file: e.file };
      out.files++;
      out.bytes += e.size;
      try {
        if (!this.record(key))
          throw mismatch(key, 'has no integrity record (written before records were kept)', this.modelDir(key));
        this.verified(key, true);
      } catch (err) {
        const l = err instanceof LoupeError ? err : new LoupeError('INTERNAL', (err as Error).message);
        out.problems.push({ file: this.filePath(key), code: l.code, message: l.message });
      }
    }
    return out;
  }

  /** whether a complete entry exists, without reading it (NOT_A_FILE when it is not a regular file) */
  has(key: CacheKey): boolean {
    return isRegularFile(this.filePath(key), this.root);
  }

  async hasComplete(key: CacheKey): Promise<boolean> {
    return this.has(key);
  }

  /** the complete file's path, its bytes checked against its record first (see above) */
  localPath(key: CacheKey): string | undefined {
    return this.has(key) ? this.verified(key) : undefined;
  }

  /**
   * A positioned read of a complete file, or of a `.partial` one of known total that already
   * holds the range; the rest of the file is never read.
   */
  async readRange(key: CacheKey, offset: number, length: number): Promise<RangeRead | undefined> {
    const p = this.filePath(key);
    let fh: fsp.FileHandle;
    let have: number;
    let total: number | undefined;
    try {
      ({ fh, size: have } = await openRegular(p, this.root));
    } catch (e) {
      if (e instanceof LoupeError) throw e;
      try {
        total = (await this.readMeta(key)).total;
        if (total == null) return undefined;
        ({ fh, size: have } = await openRegular(p + PARTIAL, this.root));
      } catch (e) {
        if (e instanceof LoupeError) throw e;
        return undefined;
      }
    }
    try {
      if (total != null && offset + length > have) return undefined;
      return { bytes: await readAt(fh, offset, length, have), size: total ?? have, stored: have };
    } finally {
      await fh.close();
    }
  }

  async putMissing(key: CacheKey): Promise<void> {
    const p = this.filePath(key);
    await fsp.mkdir(path.dirname(p), { recursive: true });
    await fsp.writeFile(p + MISSING, '');
  }

  async isMissing(key: CacheKey): Promise<boolean> {
    return existsSync(this.filePath(key) + MISSING);
  }

  async put(key: CacheKey, bytes: Uint8Array): Promise<void> {
    const p = this.filePath(key);
    await fsp.mkdir(path.dirname(p), { recursive: true });
    const tmp = `${p}.tmp-${process.pid}-${Math.random().toString(36).slice(2)}`;
    await fsp.writeFile(tmp, bytes);
    await fsp.rename(tmp, p);
    this.writeRecord(key, createHash('sha256').update(bytes).digest('hex'));
    await this.dropPartial(key);
  }

  async getPartial(key: CacheKey): Promise<{ bytes: Uint8Array; etag?: string; total?: number } | undefined> {
    const p = this.filePath(key);
    try {
      const [b, meta] = await Promise.all([readRegular(p + PARTIAL, { within: this.root }), this.readMeta(key)]);
      // The meta is written after the bytes: a size that disagrees means a torn write.
      if (meta.size !== undefined && meta.size !== b.byteLength) return undefined;
      return { bytes: b, ...knownMeta(meta) };
    } catch (e) {
      if (e instanceof LoupeError) throw e;
      return undefined;
    }
  }

  /** a partial download's meta ({etag, total, size}); throws when absent or unreadable */
  private async readMeta(key: CacheKey): Promise<{ etag?: string; total?: number; size?: number }> {
    const m = await readRegular(this.filePath(key) + META, { within: this.root, maxBytes: 64 * 1024 });
    return JSON.parse(new TextDecoder().decode(m)) as { etag?: string; total?: number; size?: number };
  }

  async putPartial(key: CacheKey, bytes: Uint8Array, meta: { etag?: string; total?: number }): Promise<void> {
    const p = this.filePath(key);
    await fsp.mkdir(path.dirname(p), { recursive: true });
    await fsp.writeFile(p + PARTIAL, bytes);
    await fsp.writeFile(p + META, JSON.stringify({ ...meta, size: bytes.byteLength }));
  }

  /**
   * Stream a download into `<file>.partial` (resuming its bytes when the meta says which version
   * they are); commit() renames it into place. Writes are synchronous, one chunk at a time, so
   * the partial file's length is always exactly the bytes received.
   */
  async openSink(key: CacheKey): Promise<CacheSink> {
    const p = this.filePath(key);
    const part = p + PARTIAL;
    await fsp.mkdir(path.dirname(p), { recursive: true });
    let meta: { etag?: string; total?: number } = {};
    let length = 0;
    // a partial file or meta that is not a plain regular file (a link, a FIFO) is not ours: start over
    for (const f of [part, p + META]) if (!plainOrAbsent(f)) await fsp.rm(f, { recursive: true, force: true });
    try {
      meta = await this.readMeta(key);
      length = statSync(part).size;
    } catch {
      meta = {};
      length = 0;
    }
    // Without its meta a partial file's version is unknown: start over.
    const fd = openSync(part, length > 0 ? 'r+' : 'w');
    if (length === 0) ftruncateSync(fd, 0);
    // the bytes hashed as they are written; a resumed file is hashed from disk at commit
    let hash: Hash | undefined = length === 0 ? createHash('sha256') : undefined;
    let open = true;
    const close = () => {
      if (open) {
        closeSync(fd);
        open = false;
      }
    };
    const writeMeta = () => writeFileSync(p + META, JSON.stringify({ ...meta }));
    return cacheSink(
      () => length,
      () => meta,
      {
        append(chunk) {
          let off = 0;
          while (off < chunk.byteLength) off += writeSync(fd, chunk, off, chunk.byteLength - off, length + off);
          length += chunk.byteLength;
          hash?.update(chunk);
        },
        reset() {
          ftruncateSync(fd, 0);
          length = 0;
          hash = createHash('sha256');
        },
        setMeta(m) {
          meta = knownMeta(m);
          writeMeta();
        },
        async suspend() {
          close();
          if (length === 0) {
            await fsp.rm(part, { force: true });
            await fsp.rm(p + META, { force: true });
            return;
          }
          writeMeta();
        },
        commit: async () => {
          close();
          const sha = hash ? hash.digest('hex') : hashFile(part, this.root);
          await fsp.rename(part, p);
          this.writeRecord(key, sha);
          await fsp.rm(p + META, { force: true });
          await fsp.rm(p + MISSING, { force: true });
        },
      },
    );
  }

  private async dropPartial(key: CacheKey): Promise<void> {
    const p = this.filePath(key);
    await Promise.all([
      fsp.rm(p + PARTIAL, { force: true }),
      fsp.rm(p + META, { force: true }),
      fsp.rm(p + MISSING, { force: true }),
    ]);
  }

  private async dropRecord(key: CacheKey): Promise<void> {
    await fsp.rm(this.filePath(key) + RECORD, { force: true });
  }

  async list(): Promise<CacheEntryInfo[]> {
    const out: CacheEntryInfo[] = [];
    const dirs = async (p: string) => {
      try {
        return (await fsp.readdir(p, { withFileTypes: true })).filter((d) => d.isDirectory()).map((d) => d.name);
      } catch {
        return [];
      }
    };
    for (const e of await dirs(this.root)) {
      for (const i of await dirs(path.join(this.root, e))) {
        for (const r of await dirs(path.join(this.root, e, i))) {
          const dir = path.join(this.root, e, i, r);
          for (const d of await fsp.readdir(dir, { withFileTypes: true })) {
            const ours =
              d.name.endsWith(META) || d.name.endsWith(MISSING) || d.name.includes('.tmp-') || d.name.includes('@');
            if (!d.isFile() || ours) continue;
            const partial = d.name.endsWith(PARTIAL);
            const name = partial ? d.name.slice(0, -PARTIAL.length) : d.name;
            const st = statSync(path.join(dir, d.name));
            out.push({
              endpoint: dec(e),
              id: dec(i),
              revision: r === '@' ? '' : dec(r),
              file: dec(name),
              size: st.size,
              complete: !partial,
              storedAt: st.mtimeMs,
            });
          }
        }
      }
    }
    return out.sort((a, b) =>
      (a.endpoint + a.id + a.revision + a.file).localeCompare(b.endpoint + b.id + b.revision + b.file),
    );
  }

  async delete(key: Omit<CacheKey, 'file'> & { file?: string }): Promise<void> {
    if (key.file !== undefined) {
      const k = key as CacheKey;
      await fsp.rm(this.filePath(k), { force: true });
      await this.dropRecord(k);
      await this.dropPartial(k);
      return;
    }
    await fsp.rm(this.modelDir(key), { recursive: true, force: true });
  }
}
