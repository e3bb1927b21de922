/**
 * The Hub layout end to end, against a local server on 127.0.0.1: sharded download, progress,
 * abort/cut + resume with byte counts, tokens, caches, and a distinct error for each corruption.
 */
import 'fake-indexeddb/auto';
import {
  closeSync,
  copyFileSync,
  ftruncateSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  statSync,
  writeSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LoupeError } from '../src/engine/errors';
import { readTensorF32 } from '../src/engine/safetensors';
import { loadModelFiles } from '../src/engine/source/files';
import { HubSource } from '../src/engine/source/hub-source';
import { IdbCache } from '../src/engine/source/idb-cache';
import type { ByteCache, FileProgress } from '../src/engine/source/types';
import { UrlSource } from '../src/engine/source/url-source';
import { DirCache } from '../src/node/dir-cache';
import { loadModelFilesNode, readFileRange } from '../src/node/load-files-node';
import { startHubServer, type HubServer } from './helpers/hub-server';
import {
  f32Bytes,
  rawSafetensors,
  readSafetensorsSimple,
  shardModel,
  writeSafetensors,
} from './helpers/safetensors-writer';
import { SHARED } from './helpers/shared';

const GPT2 = SHARED + '/models/induction-gpt2';
const tmp = mkdtempSync(path.join(tmpdir(), 'loupe-hub-'));
const sharded = path.join(tmp, 'sharded');
let shards: string[] = [];
let hub: HubServer;
let other: HubServer; // a second origin
/** every file of the sharded repo and its size */
let sizes: Record<string, number> = {};
/** the original tensors, read by the test-side reader */
const original = readSafetensorsSimple(new Uint8Array(readFileSync(path.join(GPT2, 'model.safetensors'))));

beforeAll(async () => {
  ({ shards } = shardModel(GPT2, sharded, 3));
  for (const f of [
    'config.json',
    'tokenizer.json',
    'tokenizer_config.json',
    'generation_config.json',
    'model.safetensors.index.json',
    ...shards,
  ]) {
    sizes[f] = statSync(path.join(sharded, f)).size;
  }
  hub = await startHubServer();
  other = await startHubServer();
  hub.addRepo('test/sharded', sharded);
  hub.addRepo('test/single', GPT2);
});
afterAll(async () => {
  await hub?.close();
  await other?.close();
  rmSync(tmp, { recursive: true, force: true });
});

/** 8 + N: the bytes of a safetensors file's length prefix and JSON header */
function headerBytes(file: string): number {
  return 8 + Number(readFileSync(file).readBigUInt64LE(0));
}

/** the two Range requests with which the preflight reads a weight file's header before downloading */
function headerRanges(file: string): string[] {
  return ['bytes=0-7', `bytes=8-${headerBytes(file) - 1}`];
}

async function failure(p: Promise<unknown>): Promise<LoupeError> {
  try {
    await p;
  } catch (e) {
    expect(e, String(e)).toBeInstanceOf(LoupeError);
    return e as LoupeError;
  }
  throw new Error('expected a LoupeError');
}

function expectSameTensors(weights: Parameters<typeof readTensorF32>[0]): void {
  expect(weights.tensors.size).toBe(original.tensors.length);
  for (const t of original.tensors) {
    expect(weights.tensors.get(t.name)!.shape).toEqual(t.shape);
    // byte-exact (F32 -> F32): compare the bit patterns, fast
    const mine = readTensorF32(weights, t.name);
    expect(
      Buffer.compare(Buffer.from(mine.buffer, mine.byteOffset, mine.byteLength), Buffer.from(t.data)),
      t.name,
    ).toBe(0);
  }
}

/** per-file loaded never goes down (no restarts here) and overall.loaded never goes down */
function checkProgress(events: FileProgress[], expectSizes: Record<string, number>): void {
  const last = new Map<string, number>();
  let overall = -1;
  for (const e of events) {
    expect(e.restarted).toBeFalsy();
    expect(e.loaded).toBeGreaterThanOrEqual(last.get(e.file) ?? 0);
    last.set(e.file, e.loaded);
    if (e.total != null) expect(e.loaded).toBeLessThanOrEqual(e.total);
    expect(e.overall!.loaded).toBeGreaterThanOrEqual(overall);
    overall = e.overall!.loaded;
  }
  for (const [f, size] of Object.entries(expectSizes)) {
    const done = events.filter((e) => e.file === f && e.done);
    expect(done.length, f).toBe(1);
    expect(done[0]).toMatchObject({ loaded: size, total: size });
  }
  const end = events[events.length - 1].overall!;
  const sum = Object.values(expectSizes).reduce((a, b) => a + b, 0);
  expect(end).toEqual({
    loaded: sum,
    total: sum,
    files: Object.keys(expectSizes).length,
    filesDone: Object.keys(expectSizes).length,
  });
}

describe('Hub layout: sharded model', () => {
  it('loads through HubSource with the same tensors; progress monotone and reaching the total', async () => {
    hub.resetCounters();
    const events: FileProgress[] = [];
    const src = new HubSource('test/sharded', { endpoint: hub.url });
    const f = await loadModelFiles(src, { onProgress: (p) => events.push(p) });
    expect(f.weightFiles).toEqual(shards);
    expect(f.config.model_type).toBe('gpt2');
    expect(f.index!.weight_map['transformer.wte.weight']).toMatch(/^model-0000\d-of-00003\.safetensors$/);
    expectSameTensors(f.weights);
    checkProgress(events, sizes);
    // each file fetched once (a shard: its header first, then the rest), plus one 404 for the absent model.safetensors
    for (const file of Object.keys(sizes)) {
      const shard = shards.includes(file);
      const ranges = shard
        ? [...headerRanges(path.join(sharded, file)), `bytes=${headerBytes(path.join(sharded, file))}-`]
        : [''];
      expect(hub.stats('test/sharded', file), file).toMatchObject({
        requests: ranges.length,
        ranges,
        bytes: sizes[file],
      });
    }
    expect(hub.stats('test/sharded', 'model.safetensors').statuses).toEqual([404]);
    expect(hub.totalBytes()).toBe(Object.values(sizes).reduce((a, b) => a + b, 0));
    console.log(
      `sharded load: ${events.length} progress events, ${hub.log.length} requests, ${hub.totalBytes()} bytes`,
    );
  });

  it('loads a single-file model through UrlSource (any base URL)', async () => {
    const f = await loadModelFiles(new UrlSource(`${hub.url}/test/single/resolve/main/`));
    expect(f.weightFiles).toEqual(['model.safetensors']);
    expectSameTensors(f.weights);
  });
});

describe.each<[string, () => ByteCache]>([
  ['IdbCache', () => new IdbCache({ dbName: `hub-${Math.random()}` })],
  ['DirCache', () => new DirCache(path.join(tmp, `cache-${Math.random()}`))],
])('resume and cache with %s', (_name, makeCache) => {
  it('an aborted download resumes without re-fetching finished bytes; a cached load makes no request', async () => {
    const cache = makeCache();
    const src = new HubSource('test/sharded', { endpoint: hub.url });
    const victim = shards[1];
    const cutAt = 50_000;
    hub.resetCounters();
    const H = headerBytes(path.join(sharded, victim));
    hub.throttle('test/sharded', victim, { chunkSize: 10_000, chunkDelayMs: 0 });
    // the download resumes after the preflight's header bytes: stall it when cutAt bytes are in
    hub.fault('test/sharded', victim, { stallAfter: cutAt - H, skip: 2 });
    const ctl = new AbortController();
    const err = await failure(
      loadModelFiles(src, {
        cache,
        signal: ctl.signal,
        concurrency: 1,
        onProgress: (p) => {
          if (p.file === victim && p.loaded >= cutAt) ctl.abort();
        },
      }),
    );
    expect(err.code).toBe('ABORTED');
    expect(hub.stats('test/sharded', victim).bytes).toBe(cutAt);
    const partial = await cache.getPartial({ endpoint: hub.url, id: 'test/sharded', revision: 'main', file: victim });
    expect(partial?.bytes.byteLength).toBe(cutAt);
    expect(partial?.total).toBe(sizes[victim]);
    const servedFirst = hub.totalBytes();

    // Second try: finished files come from the cache, the victim resumes at cutAt.
    const events: FileProgress[] = [];
    const f = await loadModelFiles(src, { cache, onProgress: (p) => events.push(p) });
    expectSameTensors(f.weights);
    const st = hub.stats('test/sharded', victim);
    // first try: header, then the rest until the abort; second: the header comes from the partial entry, the rest resumes at cutAt
    expect(st.ranges).toEqual([...headerRanges(path.join(sharded, victim)), `bytes=${H}-`, `bytes=${cutAt}-`]);
    expect(st.statuses).toEqual([206, 206, 206, 206]);
    expect(st.bytes).toBe(sizes[victim]); // cutAt + the rest, nothing twice
    const total = Object.values(sizes).reduce((a, b) => a + b, 0);
    expect(hub.totalBytes()).toBe(total);
    console.log(
      `abort+resume: first try served ${servedFirst} B, both tries ${hub.totalBytes()} B = the ${total} B of the files`,
    );
    checkProgress(events, sizes);

    // Third: everything cached, no request at all.
    hub.resetCounters();
    const again = await loadModelFiles(src, { cache });
    expect(hub.log.length).toBe(0);
    expectSameTensors(again.weights);
  });

  it('a connection cut mid-file: with retries it resumes in the same call; without, the next call resumes', async () => {
    const cache = makeCache();
    const src = new HubSource('test/single', { endpoint: hub.url, retryDelayMs: 1 });
    const size = statSync(path.join(GPT2, 'model.safetensors')).size;
    const head = headerRanges(path.join(GPT2, 'model.safetensors'));
    const H = headerBytes(path.join(GPT2, 'model.safetensors'));
    hub.resetCounters();
    hub.fault('test/single', 'model.safetensors', { cutAfter: 100_000, skip: 2 });
    const f = await loadModelFiles(src, { cache });
    expectSameTensors(f.weights);
    let st = hub.stats('test/single', 'model.safetensors');
    expect(st.ranges).toEqual([...head, `bytes=${H}-`, `bytes=${H + 100_000}-`]);
    expect(st.bytes).toBe(size);

    await cache.delete({ endpoint: hub.url, id: 'test/single', revision: 'main' });
    hub.resetCounters();
    hub.fault('test/single', 'model.safetensors', { cutAfter: 200_000, skip: 2 });
    const err = await failure(loadModelFiles(src, { cache, retries: 0 }));
    expect(err.code).toBe('NETWORK_ERROR');
    expect(err.hint).toMatch(/resume/);
    const g = await loadModelFiles(src, { cache, retries: 0 });
    expectSameTensors(g.weights);
    st = hub.stats('test/single', 'model.safetensors');
    // the second call reads the header from the partial entry: no request for it
    expect(st.ranges).toEqual([...head, `bytes=${H}-`, `bytes=${H + 200_000}-`]);
    expect(st.bytes).toBe(size);
  });
});

describe('resume edge cases', () => {
  it('a changed file (etag mismatch on If-Range) restarts cleanly from a 200', async () => {
    const cache = new IdbCache({ dbName: `etag-${Math.random()}` });
    const file = writeSafetensors([
      { name: 'x', dtype: 'F32', shape: [1000], data: f32Bytes(Array.from({ length: 1000 }, (_, i) => i)) },
    ]);
    const stale = writeSafetensors([
      { name: 'x', dtype: 'F32', shape: [1000], data: f32Bytes(new Array(1000).fill(-1)) },
    ]);
    const key = { endpoint: hub.url, id: 'test/etag', revision: 'main', file: 'model.safetensors' };
    await cache.putPartial(key, stale.slice(0, 2000), { etag: '"old"', total: stale.byteLength });
    hub.addRepo('test/etag', GPT2);
    hub.addFile('test/etag', 'model.safetensors', file);
    hub.resetCounters();
    const events: FileProgress[] = [];
    const f = await loadModelFiles(new HubSource('test/etag', { endpoint: hub.url }), {
      cache,
      onProgress: (p) => events.push(p),
    });
    expect(Array.from(readTensorF32(f.weights, 'x').slice(0, 3))).toEqual([0, 1, 2]);
    const st = hub.stats('test/etag', 'model.safetensors');
    expect(st.ranges).toEqual(['bytes=2000-']);
    expect(st.statuses).toEqual([200]);
    expect(events.some((e) => e.file === 'model.safetensors' && e.restarted)).toBe(true);
  });

  it('a 5xx is retried; an unreachable server is NETWORK_ERROR', async () => {
    hub.resetCounters();
    hub.fault('test/single', 'config.json', { status: 503 });
    const f = await loadModelFiles(new HubSource('test/single', { endpoint: hub.url, retryDelayMs: 1 }));
    expect(f.config.model_type).toBe('gpt2');
    expect(hub.stats('test/single', 'config.json').statuses).toEqual([503, 200]);

    const closed = await startHubServer();
    const deadUrl = closed.url;
    await closed.close();
    const e = await failure(loadModelFiles(new HubSource('test/single', { endpoint: deadUrl, retryDelayMs: 1 })));
    expect(e.code).toBe('NETWORK_ERROR');
  });

  it('abort before any byte, and abort while waiting for a slow server', async () => {
    const ctl = new AbortController();
    ctl.abort();
    expect(
      (await failure(loadModelFiles(new HubSource('test/single', { endpoint: hub.url }), { signal: ctl.signal }))).code,
    ).toBe('ABORTED');
    hub.fault('test/single', 'config.json', { delayMs: 2000 });
    const ctl2 = new AbortController();
    setTimeout(() => ctl2.abort(), 50);
    const t0 = Date.now();
    expect(
      (await failure(loadModelFiles(new HubSource('test/single', { endpoint: hub.url }), { signal: ctl2.signal })))
        .code,
    ).toBe('ABORTED');
    expect(Date.now() - t0).toBeLessThan(1500);
  });
});

describe('tokens', () => {
  it('the token goes to the endpoint and not to another origin', async () => {
    hub.addRepo('test/redirected', GPT2);
    other.addRepo('cdn/blob', GPT2);
    hub.redirect('test/redirected', 'model.safetensors', `${other.url}/cdn/blob/resolve/main/model.safetensors`);
    hub.resetCounters();
    other.resetCounters();
    const f = await loadModelFiles(new HubSource('test/redirected', { endpoint: hub.url, token: 'hf_secret' }));
    expectSameTensors(f.weights);
    const hubReqs = hub.log.filter((r) => r.id === 'test/redirected');
    expect(hubReqs.length).toBeGreaterThanOrEqual(5);
    expect(hubReqs.every((r) => r.authorization === 'Bearer hf_secret')).toBe(true);
    // the CDN origin gets the header's two Range requests and the rest of the file, never the token
    expect(other.log.map((r) => r.range)).toEqual([
      ...headerRanges(path.join(GPT2, 'model.safetensors')),
      `bytes=${headerBytes(path.join(GPT2, 'model.safetensors'))}-`,
    ]);
    expect(other.log.every((r) => r.authorization === '')).toBe(true);
    // and no token without one
    hub.resetCounters();
    await loadModelFiles(new HubSource('test/single', { endpoint: hub.url }));
    expect(hub.log.every((r) => r.authorization === '')).toBe(true);
  });

  it('a gated model: HTTP_ERROR with a token hint without it, loads with it', async () => {
    hub.addRepo('test/gated', GPT2, { token: 'hf_good' });
    const e = await failure(loadModelFiles(new HubSource('test/gated', { endpoint: hub.url })));
    expect(e.code).toBe('HTTP_ERROR');
    expect(e.hint).toMatch(/gated/i);
    expect(e.hint).toMatch(/token/i);
    const bad = await failure(loadModelFiles(new HubSource('test/gated', { endpoint: hub.url, token: 'hf_wrong' })));
    expect(bad.code).toBe('HTTP_ERROR');
    const f = await loadModelFiles(new HubSource('test/gated', { endpoint: hub.url, token: 'hf_good' }));
    expectSameTensors(f.weights);
  });
});

describe('Node loader with a DirCache: weights used from disk', () => {
  it('downloads once into the cache, then loads by path with zero requests', async () => {
    const cache = new DirCache(path.join(tmp, 'node-cache'));
    hub.resetCounters();
    const a = await loadModelFilesNode('test/sharded', { endpoint: hub.url, cache });
    expect([...a.weights.paths.keys()].sort()).toEqual(shards);
    expect(a.weights.files.size).toBe(0);
    expectSameTensors(a.weights);
    hub.resetCounters();
    const b = await loadModelFilesNode('test/sharded', { endpoint: hub.url, cache });
    expect(hub.log.length).toBe(0);
    expect(b.weights.files.size).toBe(0);
    for (const s of shards) expect(b.weights.paths.get(s)!.startsWith(cache.root)).toBe(true);
    expectSameTensors(b.weights);
  });
});

describe('Node loader streams downloads to disk', () => {
  it('an aborted shard resumes from its .partial file; nothing is fetched twice', async () => {
    const cache = new DirCache(path.join(tmp, 'stream-cache'));
    const victim = shards[0];
    const cutAt = 60_000;
    hub.resetCounters();
    const H = headerBytes(path.join(sharded, victim));
    hub.throttle('test/sharded', victim, { chunkSize: 10_000, chunkDelayMs: 0 });
    hub.fault('test/sharded', victim, { stallAfter: cutAt - H, skip: 2 });
    const ctl = new AbortController();
    const err = await failure(
      loadModelFilesNode('test/sharded', {
        endpoint: hub.url,
        cache,
        signal: ctl.signal,
        concurrency: 1,
        onProgress: (p) => {
          if (p.file === victim && p.loaded >= cutAt) ctl.abort();
        },
      }),
    );
    expect(err.code).toBe('ABORTED');
    const part = path.join(
      path.dirname(cache.localPath({ endpoint: hub.url, id: 'test/sharded', revision: 'main', file: 'config.json' })!),
      `${victim}.partial`,
    );
    expect(statSync(part).size).toBe(cutAt);
    const events: FileProgress[] = [];
    const f = await loadModelFilesNode('test/sharded', { endpoint: hub.url, cache, onProgress: (p) => events.push(p) });
    expect(f.weights.files.size).toBe(0);
    expectSameTensors(f.weights);
    const st = hub.stats('test/sharded', victim);
    expect(st.ranges).toEqual([...headerRanges(path.join(sharded, victim)), `bytes=${H}-`, `bytes=${cutAt}-`]);
    expect(st.bytes).toBe(sizes[victim]);
    expect(hub.totalBytes()).toBe(Object.values(sizes).reduce((a, b) => a + b, 0));
    checkProgress(events, sizes);
  });

  it('a corrupt download is dropped from the cache so the next load fetches it again', async () => {
    const cache = new DirCache(path.join(tmp, 'corrupt-cache'));
    const good = new Uint8Array(readFileSync(path.join(GPT2, 'model.safetensors')));
    hub.addRepo('test/fixed-later', GPT2);
    hub.addFile('test/fixed-later', 'model.safetensors', good.slice(0, 1000));
    expect((await failure(loadModelFilesNode('test/fixed-later', { endpoint: hub.url, cache }))).code).toBe(
      'SAFETENSORS_TRUNCATED',
    );
    hub.addFile('test/fixed-later', 'model.safetensors', good);
    const f = await loadModelFilesNode('test/fixed-later', { endpoint: hub.url, cache });
    expectSameTensors(f.weights);
  });

  it('a 128 MB weight file downloads with little memory (control: the in-memory loader holds it)', async () => {
    const dir = path.join(tmp, 'big-remote');
    mkdirSync(dir, { recursive: true });
    for (const f of ['config.json', 'tokenizer.json']) copyFileSync(path.join(GPT2, f), path.join(dir, f));
    const n = 32_000_000; // one F32 tensor of 128 MB; data left sparse (zeros) except a marker
    let json = JSON.stringify({ big: { dtype: 'F32', shape: [n], data_offsets: [0, n * 4] } });
    while ((8 + json.length) % 8) json += ' ';
    const fd = openSync(path.join(dir, 'model.safetensors'), 'w');
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(json.length));
    writeSync(fd, len, 0, 8, 0);
    writeSync(fd, Buffer.from(json), 0, json.length, 8);
    ftruncateSync(fd, 8 + json.length + n * 4);
    writeSync(fd, Buffer.from(new Float32Array([7.25]).buffer), 0, 4, 8 + json.length + (n - 1) * 4);
    closeSync(fd);
    hub.addRepo('test/big', dir);

    const rss = () => process.memoryUsage().rss;
    const cache = new DirCache(path.join(tmp, 'big-cache'));
    let peak = 0;
    const before = rss();
    const f = await loadModelFilesNode('test/big', {
      endpoint: hub.url,
      cache,
      onProgress: () => {
        peak = Math.max(peak, rss());
      },
    });
    const streamed = Math.max(peak, rss()) - before;
    const t = f.weights.tensors.get('big')!;
    expect(f.weights.files.size).toBe(0);
    expect(statSync(f.weights.paths.get('model.safetensors')!).size).toBe(8 + json.length + n * 4);
    expect(
      Array.from(
        new Float32Array(
          readFileRange(f.weights.paths.get('model.safetensors')!, t.fileOffset + (n - 1) * 4, 4).slice().buffer,
        ),
      ),
    ).toEqual([7.25]);

    peak = 0;
    const before2 = rss();
    const g = await loadModelFiles(new HubSource('test/big', { endpoint: hub.url }), {
      onProgress: () => {
        peak = Math.max(peak, rss());
      },
    });
    const inMemory = Math.max(peak, rss()) - before2;
    expect(g.weights.files.get('model.safetensors')!.byteLength).toBe(8 + json.length + n * 4);
    console.log(
      `128 MB download: peak RSS growth streamed to DirCache ${(streamed / 1e6).toFixed(0)} MB, in memory ${(inMemory / 1e6).toFixed(0)} MB`,
    );
    expect(inMemory).toBeGreaterThan(90e6); // the measurement sees a file held in memory
    expect(streamed).toBeLessThan(50e6);
  });
});

describe('corrupt models: a distinct structured error each', () => {
  /** a repo like test/single with some files replaced or removed */
  function repo(id: string, files: Record<string, Uint8Array | string | null>): HubSource {
    hub.addRepo(id, GPT2);
    for (const [f, b] of Object.entries(files)) {
      if (b === null) hub.removeFile(id, f);
      else hub.addFile(id, f, b);
    }
    return new HubSource(id, { endpoint: hub.url });
  }
  const goodBytes = new Uint8Array(readFileSync(path.join(GPT2, 'model.safetensors')));
  const twoTensors = (h: Record<string, unknown>) => rawSafetensors(h, f32Bytes([1, 2, 3, 4, 5, 6, 7, 8]));
  const w = { dtype: 'F32', shape: [4], data_offsets: [0, 16] };

  it('each corruption has its own code', async () => {
    const cases: [string, HubSource, string][] = [
      ['unknown model', new HubSource('nobody/nothing', { endpoint: hub.url }), 'MODEL_NOT_FOUND'],
      ['missing config.json', repo('c/noconfig', { 'config.json': null }), 'MISSING_CONFIG'],
      ['missing tokenizer.json', repo('c/notok', { 'tokenizer.json': null }), 'MISSING_TOKENIZER'],
      ['config not JSON', repo('c/badconfig', { 'config.json': '{"model_type": "gpt2",' }), 'BAD_CONFIG'],
      ['no weights', repo('c/noweights', { 'model.safetensors': null }), 'FILE_NOT_FOUND'],
      [
        'truncated file',
        repo('c/trunc', { 'model.safetensors': goodBytes.slice(0, goodBytes.byteLength - 1000) }),
        'SAFETENSORS_TRUNCATED',
      ],
      [
        'offsets past the end',
        repo('c/oor', {
          'model.safetensors': twoTensors({ w, v: { dtype: 'F32', shape: [4], data_offsets: [64, 80] } }),
        }),
        'SAFETENSORS_OFFSET_OUT_OF_RANGE',
      ],
      [
        'overlapping tensors',
        repo('c/overlap', {
          'model.safetensors': twoTensors({ w, v: { dtype: 'F32', shape: [4], data_offsets: [8, 24] } }),
        }),
        'SAFETENSORS_OVERLAP',
      ],
      [
        'wrong dtype size',
        repo('c/size', {
          'model.safetensors': twoTensors({
            w: { dtype: 'BF16', shape: [4], data_offsets: [0, 16] },
            v: { dtype: 'F32', shape: [4], data_offsets: [16, 32] },
          }),
        }),
        'SAFETENSORS_SIZE_MISMATCH',
      ],
      [
        'unknown dtype',
        repo('c/dtype', {
          'model.safetensors': twoTensors({ w: { dtype: 'Q4_K', shape: [4], data_offsets: [0, 16] } }),
        }),
        'SAFETENSORS_UNKNOWN_DTYPE',
      ],
      [
        'oversized header',
        repo('c/bighead', {
          'model.safetensors': rawSafetensors({ w }, f32Bytes([1, 2, 3, 4]), { headerLength: 200_000_000n }),
        }),
        'SAFETENSORS_HEADER_TOO_LARGE',
      ],
      [
        'header not JSON',
        repo('c/badjson', {
          'model.safetensors': (() => {
            const b = twoTensors({ w });
            b[8] = 0x7b;
            b[9] = 0x7b;
            return b;
          })(),
        }),
        'SAFETENSORS_BAD_HEADER',
      ],
      [
        'malformed index',
        repo('c/badindex', { 'model.safetensors': null, 'model.safetensors.index.json': '{"weight_map": {"a": 3}}' }),
        'BAD_INDEX',
      ],
      [
        'index lists a missing shard',
        repo('c/missingshard', {
          'model.safetensors': null,
          'model.safetensors.index.json': JSON.stringify({
            weight_map: { 'transformer.wte.weight': 'model-00001-of-00001.safetensors' },
          }),
        }),
        'BAD_INDEX',
      ],
    ];
    const seen = new Map<string, string>();
    for (const [what, src, expected] of cases) {
      const e = await failure(loadModelFiles(src));
      expect(e.code, `${what}: ${e.message}`).toBe(expected);
      expect(e.message.length).toBeGreaterThan(10);
      expect(JSON.parse(JSON.stringify(e.toJSON())).error.code).toBe(expected);
      if (expected !== 'BAD_INDEX') expect(seen.has(expected), `${expected} reused`).toBe(false);
      seen.set(expected, what);
      console.log(`${what.padEnd(28)} -> ${e.code}: ${e.message}`);
    }
    expect(seen.size).toBe(13);
  });
});
