/**
 * IndexedDB as a streaming sink (fake-indexeddb): a download is written chunk by chunk, each whole
 * chunk with its record in one transaction, so a tab closed mid-download resumes from its last
 * whole chunk; the whole file is never one buffer during the download.
 */
import 'fake-indexeddb/auto';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadModelFiles } from '../src/engine/source/files';
import { HubSource } from '../src/engine/source/hub-source';
import { IdbCache } from '../src/engine/source/idb-cache';
import { startHubServer, type HubServer } from './helpers/hub-server';
import { SHARED } from './helpers/shared';

const GPT2 = SHARED + '/models/induction-gpt2';
const key = { endpoint: 'http://x', id: 'o/m', revision: 'main', file: 'w.bin' };
let hub: HubServer;

beforeAll(async () => {
  hub = await startHubServer();
  hub.addRepo('s/gpt2', GPT2);
});
afterAll(async () => {
  await hub?.close();
});

const pattern = (n: number, seed = 1) => Uint8Array.from({ length: n }, (_, i) => (i * 31 + seed) & 255);
const tick = () => new Promise((r) => setTimeout(r, 20));

describe('IdbCache.openSink', () => {
  it('whole chunks are stored as they fill: a sink dropped without suspend (a closed tab) resumes from the last whole chunk', async () => {
    const cache = new IdbCache({ dbName: `sink-${Math.random()}`, chunkBytes: 10_000 });
    const data = pattern(35_000);
    const a = await cache.openSink(key);
    a.setMeta({ etag: '"e1"', total: data.byteLength });
    a.append(data.subarray(0, 25_000)); // two whole chunks + 5,000 pending
    // the chunk writes run in the background: wait for them (bounded), then check nothing more was stored
    for (let i = 0; i < 250 && (await cache.getPartial(key))?.bytes.byteLength !== 20_000; i++) await tick();
    await tick();
    const mid = await cache.getPartial(key);
    expect(mid?.bytes.byteLength).toBe(20_000);
    expect(mid?.total).toBe(35_000);
    expect(mid?.etag).toBe('"e1"');
    // never suspended: a new sink starts at the last whole chunk
    const b = await cache.openSink(key);
    expect(b.length).toBe(20_000);
    expect(b.etag).toBe('"e1"');
    b.append(data.subarray(20_000, 27_000));
    await b.suspend(); // the unfinished chunk is kept too
    const c = await cache.openSink(key);
    expect(c.length).toBe(27_000);
    c.append(data.subarray(27_000));
    await c.commit();
    expect(await cache.getPartial(key)).toBeUndefined();
    const whole = await cache.get(key);
    expect(Buffer.compare(Buffer.from(whole!), Buffer.from(data))).toBe(0);
    expect(await cache.hasComplete(key)).toBe(true);
    const r = await cache.readRange(key, 9_995, 20);
    expect(Array.from(r!.bytes)).toEqual(Array.from(data.subarray(9_995, 10_015)));
    expect((await cache.list()).find((e) => e.file === 'w.bin')).toMatchObject({ size: 35_000, complete: true });
  });

  it('a write refused for want of room (QuotaExceededError, empty message in Chromium) is TOO_LARGE naming the file, with a hint', async () => {
    const cache = new IdbCache({ dbName: `sink-${Math.random()}`, chunkBytes: 1000 });
    const sink = await cache.openSink(key);
    sink.setMeta({ total: 2_471_645_456 });
    const put = IDBObjectStore.prototype.put;
    IDBObjectStore.prototype.put = function () {
      throw new DOMException('', 'QuotaExceededError');
    };
    try {
      sink.append(pattern(2500));
      const err = await sink.drain!().then(
        () => null,
        (e) => e,
      );
      expect(err).toMatchObject({ code: 'TOO_LARGE', details: { file: 'w.bin', bytes: 2_471_645_456 } });
      expect(err.message).toMatch(/refused to store w\.bin \(2\.5 GB\).*quota/);
      expect(err.hint).toMatch(/private or incognito window/);
      // the next bytes of the download are refused at once (the download stops there)
      expect(() => sink.append(pattern(10))).toThrow(expect.objectContaining({ code: 'TOO_LARGE' }));
    } finally {
      IDBObjectStore.prototype.put = put;
    }
  });

  it('reset drops what was stored (another version of the file)', async () => {
    const cache = new IdbCache({ dbName: `sink-${Math.random()}`, chunkBytes: 1000 });
    const a = await cache.openSink(key);
    a.append(pattern(2500));
    await a.suspend();
    const b = await cache.openSink(key);
    b.reset();
    b.append(pattern(1200, 7));
    await b.commit();
    expect(Array.from((await cache.get(key))!)).toEqual(Array.from(pattern(1200, 7)));
  });

  it('a model load streams its weights into IndexedDB in chunks; the next load reads them with no request', async () => {
    const cache = new IdbCache({ dbName: `sink-${Math.random()}`, chunkBytes: 64 * 1024 });
    const src = new HubSource('s/gpt2', { endpoint: hub.url });
    const a = await loadModelFiles(src, { cache });
    const size = readFileSync(`${GPT2}/model.safetensors`).byteLength;
    // read back as its chunks, by range, never one buffer (source-idb-ranged.test.ts)
    expect(a.weights.files.size).toBe(0);
    expect(a.weights.ranged!.get('model.safetensors')!.size).toBe(size);
    const entry = (await cache.list()).find((e) => e.file === 'model.safetensors')!;
    expect(entry).toMatchObject({ size, complete: true });
    hub.resetCounters();
    const b = await loadModelFiles(src, { cache });
    expect(hub.log).toEqual([]);
    expect(
      Buffer.compare(
        Buffer.from(b.weights.ranged!.get('model.safetensors')!.read(0, size)),
        readFileSync(`${GPT2}/model.safetensors`),
      ),
    ).toBe(0);
  });
});
