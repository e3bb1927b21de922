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
 */
import {
  closeSync,
  existsSync,
  ftruncateSync,
  lstatSync,
  openSync,
  promises as fsp,
  statSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { LoupeError } from '../engine/errors';
import { isRegularFile, openRegular, readAt, readRegular } from './file-range';
import type { ByteCache, CacheEntryInfo, CacheKey, CacheSink, RangeRead } from '../engine/source/types';
import { cacheSink, knownMeta } from '../engine/source/sink';

const PARTIAL = '.partial';
const META = '.partial.json';
/** an empty marker: the file does not exist upstream (an optional file's 404, remembered) */
const MISSING = '.missing';

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
    try {
      return await readRegular(this.filePath(key), { within: this.root, maxBytes: opts.maxBytes, tooLarge });
    } catch (e) {
      if (e instanceof LoupeError) throw e;
      return undefined;
    }
  }

  /** whether a complete entry exists, without reading it (NOT_A_FILE when it is not a regular file) */
  has(key: CacheKey): boolean {
    return isRegularFile(this.filePath(key), this.root);
  }

  async hasComplete(key: CacheKey): Promise<boolean> {
    return this.has(key);
  }

  localPath(key: CacheKey): string | undefined {
    const p = this.filePath(key);
    return this.has(key) ? p : undefined;
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
        },
        reset() {
          ftruncateSync(fd, 0);
          length = 0;
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
        async commit() {
          close();
          await fsp.rename(part, p);
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
            if (!d.isFile() || d.name.endsWith(META) || d.name.endsWith(MISSING) || d.name.includes('.tmp-')) continue;
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
      await this.dropPartial(k);
      return;
    }
    await fsp.rm(this.modelDir(key), { recursive: true, force: true });
  }
}
