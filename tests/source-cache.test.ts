/** The two ByteCache implementations behave the same: put/get/list/delete and partial entries. */
import 'fake-indexeddb/auto';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { IdbCache } from '../src/engine/source/idb-cache';
import type { ByteCache, CacheKey } from '../src/engine/source/types';
import { DirCache } from '../src/node/dir-cache';

const tmp = mkdtempSync(path.join(tmpdir(), 'loupe-cache-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const model = { endpoint: 'https://huggingface.co', id: 'owner/name', revision: 'main' };
const other = { endpoint: 'http://127.0.0.1:9999', id: 'owner/name', revision: 'refs/pr/1' };
const k = (file: string, m = model): CacheKey => ({ ...m, file });

function bytesOf(n: number, seed = 1): Uint8Array {
  const b = new Uint8Array(n);
  for (let i = 0; i < n; i++) b[i] = (i * 31 + seed * 7) & 0xff;
  return b;
}

let dbCount = 0;
const impls: [string, () => ByteCache][] = [
  // 1000-byte chunks so the multi-chunk path runs on small test data
  ['IdbCache', () => new IdbCache({ dbName: `loupe-test-${dbCount++}`, chunkBytes: 1000 })],
  ['DirCache', () => new DirCache(path.join(tmp, `dir-${dbCount++}`))],
];

describe.each(impls)('%s', (_name, make) => {
  it('put / get / list / delete', async () => {
    const c = make();
    expect(await c.get(k('config.json'))).toBeUndefined();
    const big = bytesOf(4321);
    await c.put(k('model.safetensors'), big);
    await c.put(k('config.json'), new TextEncoder().encode('{"a":1}'));
    await c.put(k('config.json', other), bytesOf(10, 2));
    expect(await c.get(k('model.safetensors'))).toEqual(big);
    expect(new TextDecoder().decode(await c.get(k('config.json')))).toBe('{"a":1}');
    expect(await c.get(k('config.json', other))).toEqual(bytesOf(10, 2));
    expect(await c.get({ ...k('config.json'), revision: 'v2' })).toBeUndefined();

    const list = await c.list();
    const sizes = Object.fromEntries(
      list.map((e) => [`${e.endpoint}|${e.id}|${e.revision}|${e.file}`, [e.size, e.complete]]),
    );
    expect(sizes).toEqual({
      'https://huggingface.co|owner/name|main|model.safetensors': [4321, true],
      'https://huggingface.co|owner/name|main|config.json': [7, true],
      'http://127.0.0.1:9999|owner/name|refs/pr/1|config.json': [10, true],
    });
    expect(list.every((e) => e.storedAt > 0)).toBe(true);

    await c.delete(k('config.json'));
    expect(await c.get(k('config.json'))).toBeUndefined();
    expect(await c.get(k('model.safetensors'))).toEqual(big);
    await c.delete(model); // the whole model
    expect((await c.list()).map((e) => e.revision)).toEqual(['refs/pr/1']);
    await c.delete(other);
    expect(await c.list()).toEqual([]);
  });

  it('overwrites in place (a shorter file leaves no stale bytes)', async () => {
    const c = make();
    await c.put(k('w'), bytesOf(5000, 1));
    await c.put(k('w'), bytesOf(1500, 3));
    expect(await c.get(k('w'))).toEqual(bytesOf(1500, 3));
    expect((await c.list()).map((e) => e.size)).toEqual([1500]);
  });

  it('partial entries: stored with their etag/total, invisible to get, replaced by the complete file', async () => {
    const c = make();
    const full = bytesOf(3000, 5);
    await c.putPartial(k('model.safetensors'), full.slice(0, 1234), { etag: '"abc"', total: 3000 });
    expect(await c.get(k('model.safetensors'))).toBeUndefined();
    const p = await c.getPartial(k('model.safetensors'));
    expect(p).toEqual({ bytes: full.slice(0, 1234), etag: '"abc"', total: 3000 });
    expect((await c.list()).map((e) => [e.file, e.size, e.complete])).toEqual([['model.safetensors', 1234, false]]);
    await c.putPartial(k('model.safetensors'), full.slice(0, 2000), { etag: '"abc"', total: 3000 });
    expect((await c.getPartial(k('model.safetensors')))!.bytes).toEqual(full.slice(0, 2000));
    await c.put(k('model.safetensors'), full);
    expect(await c.getPartial(k('model.safetensors'))).toBeUndefined();
    expect(await c.get(k('model.safetensors'))).toEqual(full);
    expect((await c.list()).map((e) => [e.size, e.complete])).toEqual([[3000, true]]);
    await c.putPartial(k('other.safetensors'), bytesOf(10), {});
    await c.delete(model);
    expect(await c.list()).toEqual([]);
  });

  it('keys with awkward characters stay apart and inside the cache', async () => {
    const c = make();
    const weird = { endpoint: 'https://x.y/sub', id: '../..', revision: '..' };
    await c.put(k('../../escape.json', weird), bytesOf(5));
    await c.put(k('sub/dir/file.json', weird), bytesOf(6));
    expect(await c.get(k('../../escape.json', weird))).toEqual(bytesOf(5));
    expect(await c.get(k('sub/dir/file.json', weird))).toEqual(bytesOf(6));
    expect((await c.list()).map((e) => e.file).sort()).toEqual(['../../escape.json', 'sub/dir/file.json']);
    if (c instanceof DirCache) {
      expect(existsSync(path.join(tmp, 'escape.json'))).toBe(false);
      const p = c.localPath(k('sub/dir/file.json', weird))!;
      expect(p.startsWith(c.root + path.sep)).toBe(true);
      expect(readFileSync(p)).toEqual(Buffer.from(bytesOf(6)));
    }
  });
});

describe('DirCache specifics', () => {
  it('localPath only for complete files; partials are <file>.partial + meta', async () => {
    const c = new DirCache(path.join(tmp, 'specific'));
    await c.putPartial(k('model.safetensors'), bytesOf(100), { etag: '"e"', total: 400 });
    expect(c.localPath(k('model.safetensors'))).toBeUndefined();
    const dir = path.dirname(
      path.join(c.root, encodeURIComponent(model.endpoint), encodeURIComponent(model.id), 'main', 'x'),
    );
    expect(readdirSync(dir).sort()).toEqual(['model.safetensors.partial', 'model.safetensors.partial.json']);
    await c.put(k('model.safetensors'), bytesOf(400));
    // the file and its integrity record (dir-cache.ts)
    expect(readdirSync(dir).sort()).toEqual(['model.safetensors', 'model.safetensors@sha256']);
    expect(c.localPath(k('model.safetensors'))).toBe(path.join(dir, 'model.safetensors'));
  });

  it('defaults to $LOUPE_CACHE_DIR', () => {
    const old = process.env.LOUPE_CACHE_DIR;
    process.env.LOUPE_CACHE_DIR = path.join(tmp, 'envroot');
    try {
      expect(new DirCache().root).toBe(path.join(tmp, 'envroot'));
    } finally {
      if (old === undefined) delete process.env.LOUPE_CACHE_DIR;
      else process.env.LOUPE_CACHE_DIR = old;
    }
  });
});
