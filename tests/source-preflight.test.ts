/**
 * Judge before download: architecture, tokenizer, tensors and the memory budget are decided from
 * config.json and the safetensors headers (two Range requests per weight file), and every refusal
 * happens before the first tensor byte — the loopback Hub counts the bytes it served. Also: the
 * budget's arithmetic against hand-computed sizes, remembered misses (a cached load makes no
 * request), and the CLI's exit codes for a model too large (3) and a malformed id (2).
 * Big models are sparse files (a valid header, then a hole) > 2 GiB and > 4 GiB, deleted afterwards.
 */
import 'fake-indexeddb/auto';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkBudget, estimateMemory, GiB, weightStats, WASM_HEAP_BYTES, type WeightStats } from '../src/engine/budget';
import { LoupeError } from '../src/engine/errors';
import { loadModelFiles } from '../src/engine/source/files';
import { HubSource } from '../src/engine/source/hub-source';
import { IdbCache } from '../src/engine/source/idb-cache';
import { judgeModel, planModel } from '../src/engine/source/preflight';
import type { ByteCache } from '../src/engine/source/types';
import { DirCache } from '../src/node/dir-cache';
import { FolderSource } from '../src/node/folder-source';
import { loadModelNode } from '../src/node/load';
import { startHubServer, type HubServer } from './helpers/hub-server';
import { shardModel } from './helpers/safetensors-writer';
import { gpt2Tensors, writeSparseGpt2 } from './helpers/sparse-model';
import { SHARED } from './helpers/shared';

const GPT2 = SHARED + '/models/induction-gpt2';
const BIN = path.resolve(__dirname, '../bin/loupe.mjs');
const tmp = mkdtempSync(path.join(tmpdir(), 'loupe-preflight-'));
let hub: HubServer;
let cdn: HubServer;

/** GPT-2 XL's shape: 1.56B parameters, 6.2 GB in F32 (one file > 4 GiB) */
const XL = { nLayer: 48, nEmbd: 1600, nHead: 25 };
let xl: ReturnType<typeof writeSparseGpt2>;

beforeAll(async () => {
  hub = await startHubServer();
  cdn = await startHubServer();
  xl = writeSparseGpt2(tmp, 'gpt2-xl', XL, 'F32', GPT2);
  hub.addRepo('big/gpt2-xl', xl.dir);
});
afterAll(async () => {
  await hub?.close();
  await cdn?.close();
  rmSync(tmp, { recursive: true, force: true });
});

async function failure(p: Promise<unknown>): Promise<LoupeError> {
  try {
    await p;
  } catch (e) {
    expect(e, String(e)).toBeInstanceOf(LoupeError);
    return e as LoupeError;
  }
  throw new Error('expected a LoupeError');
}

/** bytes served for weight files, and whether every request for them stayed inside the header */
function weightTraffic(h: HubServer, id: string, file = 'model.safetensors', headerBytes: number) {
  const reqs = h.log.filter((r) => r.id === id && r.file === file);
  const insideHeader = reqs.every((r) => {
    const m = /^bytes=(\d+)-(\d+)$/.exec(r.range);
    return !!m && Number(m[2]) < headerBytes;
  });
  return { requests: reqs.length, bytes: reqs.reduce((a, r) => a + r.bytes, 0), insideHeader };
}

describe('budget arithmetic (hand-computed sizes)', () => {
  // GPT-2 small: 124,439,808 parameters (wte 50257x768 + wpe 1024x768 + 12 blocks + ln_f)
  const small = weightStats(
    gpt2Tensors({ nLayer: 12, nEmbd: 768, nHead: 12 }, 'F16').map((t) => ({
      ...t,
      byteLength: t.shape.reduce((a, b) => a * b, 1) * 2,
    })),
  );

  it('counts parameters and bytes per precision', () => {
    expect(small.nParams).toBe(124_439_808);
    expect(small.storedBytes).toBe(124_439_808 * 2);
    expect(estimateMemory(small, 'wasm', 'f32').weightBytes).toBe(124_439_808 * 4);
    expect(estimateMemory(small, 'wasm', 'stored').weightBytes).toBe(124_439_808 * 2);
    expect(estimateMemory(small, 'wasm', 'q8').weightBytes).toBeCloseTo(124_439_808 * (1 + 2 / 32), 0);
  });

  it('the WASM heap is 4 GiB whatever the host; node is limited by host memory only', () => {
    // 1.2B F16 parameters: 4.8 GB at f32 (over the heap), 2.4 GB stored (fits)
    const w: WeightStats = { nParams: 1.2e9, byDtype: { F16: 1.2e9 }, storedBytes: 2.4e9 };
    expect(estimateMemory(w, 'wasm', 'f32', { hostBytes: 1e12 }).fits).toBe(false);
    expect(estimateMemory(w, 'wasm', 'stored').fits).toBe(true);
    expect(estimateMemory(w, 'node', 'f32').fits).toBe(true);
    expect(estimateMemory(w, 'node', 'f32', { hostBytes: 8 * GiB }).fits).toBe(false);
    const e = (() => {
      try {
        checkBudget(w, 'wasm', 'f32', {});
      } catch (x) {
        return x as LoupeError;
      }
    })()!;
    expect(e.code).toBe('TOO_LARGE');
    expect(e.message).toMatch(/4 GiB WebAssembly heap/);
    expect(e.hint).toMatch(/--weights stored on wasm/);
    expect(e.hint).toMatch(/node backend/);
    expect((e.details as { limit_bytes: number }).limit_bytes).toBe(WASM_HEAP_BYTES);
  });
});

describe('refusals before the first weight byte', () => {
  it('TOO_LARGE for a 6.2 GB F32 model on WASM: only the header was read (two Range requests)', async () => {
    expect(xl.size).toBeGreaterThan(4 * GiB);
    hub.resetCounters();
    const cache = new DirCache(path.join(tmp, 'cache-xl'));
    const e = await failure(loadModelNode('big/gpt2-xl', { endpoint: hub.url, cache, backend: 'wasm' }));
    expect(e.code).toBe('TOO_LARGE');
    expect(e.message).toMatch(/1\.56B parameters/);
    expect(e.hint).toMatch(/node backend/);
    const t = weightTraffic(hub, 'big/gpt2-xl', 'model.safetensors', xl.headerBytes);
    expect(t).toEqual({ requests: 2, bytes: xl.headerBytes, insideHeader: true });
    // the cache holds only the header, as a partial entry of the right total
    const part = await cache.getPartial({
      endpoint: hub.url,
      id: 'big/gpt2-xl',
      revision: 'main',
      file: 'model.safetensors',
    });
    expect(part?.bytes.byteLength).toBe(xl.headerBytes);
    expect(part?.total).toBe(xl.size);
  });

  it('TOO_LARGE on node when host memory is short; the same model passes the judge with enough', async () => {
    hub.resetCounters();
    const e = await failure(
      loadModelNode('big/gpt2-xl', {
        endpoint: hub.url,
        cache: false,
        backend: 'node',
        memory: { hostBytes: 8 * GiB },
      }),
    );
    expect(e.code).toBe('TOO_LARGE');
    expect(e.message).toMatch(/host memory/);
    expect(weightTraffic(hub, 'big/gpt2-xl', 'model.safetensors', xl.headerBytes)).toEqual({
      requests: 2,
      bytes: xl.headerBytes,
      insideHeader: true,
    });
    // judged only (no download): 6.2 GB x 2.5 fits 64 GiB
    const plan = await planModel(new HubSource('big/gpt2-xl', { endpoint: hub.url }));
    const j = (await judgeModel(plan, 'node', 'f32', { hostBytes: 64 * GiB }))!;
    expect(j.stats.nParams).toBe(xl.nParams);
    expect(j.estimate.fits).toBe(true);
    expect(plan.weightBytes).toBe(xl.size);
    expect(plan.downloadBytes).toBe(xl.size - xl.headerBytes);
  });

  it('UNSUPPORTED_ARCHITECTURE from config.json alone: no other file is requested', async () => {
    hub.addRepo('test/bert', GPT2);
    hub.addFile('test/bert', 'config.json', JSON.stringify({ model_type: 'bert', architectures: ['BertModel'] }));
    hub.resetCounters();
    const e = await failure(loadModelNode('test/bert', { endpoint: hub.url, cache: false }));
    expect(e.code).toBe('UNSUPPORTED_ARCHITECTURE');
    expect(e.hint).toMatch(/gpt2/);
    expect(hub.log.map((r) => r.file)).toEqual(['config.json']);
  });

  it('MISSING_TOKENIZER before any weight request', async () => {
    hub.addRepo('test/notok', GPT2);
    hub.removeFile('test/notok', 'tokenizer.json');
    hub.resetCounters();
    const e = await failure(loadModelFiles(new HubSource('test/notok', { endpoint: hub.url })));
    expect(e.code).toBe('MISSING_TOKENIZER');
    expect(hub.log.filter((r) => r.file === 'model.safetensors')).toHaveLength(0);
  });

  it('a tensor the architecture needs but the header lacks: MISSING_TENSOR from the header alone', async () => {
    const tensors = gpt2Tensors({ nLayer: 12, nEmbd: 768, nHead: 12 }, 'F16').filter(
      (t) => t.name !== 'transformer.h.3.mlp.c_fc.weight',
    );
    const m = writeSparseGpt2(tmp, 'gpt2-holes', { nLayer: 12, nEmbd: 768, nHead: 12 }, 'F16', GPT2, tensors);
    hub.addRepo('test/holes', m.dir);
    hub.resetCounters();
    const e = await failure(loadModelNode('test/holes', { endpoint: hub.url, cache: false }));
    expect(e.code).toBe('MISSING_TENSOR');
    expect(e.message).toMatch(/h\.3\.mlp\.c_fc\.weight/);
    expect(weightTraffic(hub, 'test/holes', 'model.safetensors', m.headerBytes)).toEqual({
      requests: 2,
      bytes: m.headerBytes,
      insideHeader: true,
    });
    rmSync(m.dir, { recursive: true, force: true });
  });

  it('through a 302 to a CDN origin: the header is read with Range across the redirect, still nothing more', async () => {
    cdn.addRepo('cdn/xl', xl.dir);
    hub.addRepo('test/xl-cdn', xl.dir);
    hub.redirect('test/xl-cdn', 'model.safetensors', `${cdn.url}/cdn/xl/resolve/main/model.safetensors`);
    cdn.resetCounters();
    const e = await failure(
      loadModelNode('test/xl-cdn', { endpoint: hub.url, cache: false, backend: 'wasm', token: 'hf_tok' }),
    );
    expect(e.code).toBe('TOO_LARGE');
    expect(cdn.log.map((r) => r.range)).toEqual(['bytes=0-7', `bytes=8-${xl.headerBytes - 1}`]);
    expect(cdn.log.every((r) => r.authorization === '')).toBe(true);
    expect(weightTraffic(cdn, 'cdn/xl', 'model.safetensors', xl.headerBytes).bytes).toBe(xl.headerBytes);
  });
});

describe('plans of local folders, files > 2 GiB and > 4 GiB (sparse)', () => {
  it('reads only the headers of a 3.1 GB and a 6.2 GB file', async () => {
    const large = writeSparseGpt2(tmp, 'gpt2-large', { nLayer: 36, nEmbd: 1280, nHead: 20 }, 'F32', GPT2);
    try {
      expect(large.size).toBeGreaterThan(2 * GiB);
      for (const m of [large, xl]) {
        const plan = await planModel(new FolderSource(m.dir));
        expect(plan.weightBytes).toBe(m.size);
        expect(plan.downloadBytes).toBe(0);
        expect(plan.stats!.nParams).toBe(m.nParams);
        expect(statSync(path.join(m.dir, 'model.safetensors')).blocks * 512).toBeLessThan(1 << 20); // still a hole
      }
      expect(large.nParams).toBe(774_030_080); // GPT-2 large
    } finally {
      rmSync(large.dir, { recursive: true, force: true });
    }
  });
});

describe.each<[string, () => ByteCache]>([
  ['IdbCache', () => new IdbCache({ dbName: `miss-${Math.random()}` })],
  ['DirCache', () => new DirCache(path.join(tmp, `miss-${Math.random()}`))],
])('remembered misses with %s', (_n, makeCache) => {
  it('absent optional files (generation_config.json, the single-file layout) are not asked again: a cached load makes zero requests', async () => {
    const dir = path.join(tmp, 'sharded-nogen');
    shardModel(GPT2, dir, 2);
    rmSync(path.join(dir, 'generation_config.json'), { force: true });
    hub.addRepo('test/nogen', dir);
    const cache = makeCache();
    const src = new HubSource('test/nogen', { endpoint: hub.url });
    hub.resetCounters();
    const a = await loadModelFiles(src, { cache });
    expect(a.generationConfig).toBeNull();
    expect(hub.stats('test/nogen', 'generation_config.json').statuses).toEqual([404]);
    hub.resetCounters();
    const b = await loadModelFiles(src, { cache });
    expect(hub.log).toEqual([]);
    expect(b.generationConfig).toBeNull();
    expect(b.weightFiles).toEqual(a.weightFiles);
    // a plan of a fully cached model downloads nothing
    const plan = await planModel(src, { cache });
    expect(plan.downloadBytes).toBe(0);
    expect(hub.log).toEqual([]);
    // misses are not listed as cache entries
    expect((await cache.list()).some((e) => e.file === 'generation_config.json')).toBe(false);
  });
});

describe('CLI exit codes', () => {
  const run = (args: string[]) =>
    new Promise<{ code: number; stdout: string }>((res) => {
      execFile(
        process.execPath,
        [BIN, ...args],
        {
          cwd: tmpdir(),
          env: { ...process.env, NO_COLOR: '1', HF_ENDPOINT: hub.url, LOUPE_CACHE_DIR: path.join(tmp, 'cli-cache') },
        },
        (err, stdout) => {
          res({
            code: err ? (typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : 1) : 0,
            stdout,
          });
        },
      );
    });

  it('3 for a model too large for the backend, 2 for an id that cannot exist (no request)', async () => {
    const big = await run(['trace', xl.dir, 'hello', '--backend', 'wasm', '--json']);
    expect(big.code).toBe(3);
    expect(JSON.parse(big.stdout).error.code).toBe('TOO_LARGE');
    hub.resetCounters();
    const bad = await run(['trace', 'not a valid id!!', 'hello', '--json']);
    expect(bad.code).toBe(2);
    expect(JSON.parse(bad.stdout).error.code).toBe('BAD_INPUT');
    const badHub = await run(['trace', 'owner/na..me', 'hello', '--json']);
    expect(badHub.code).toBe(2);
    expect(hub.log).toEqual([]);
  }, 60_000);

  it('HubSource refuses a malformed id before any request', () => {
    for (const id of ['not a valid id!!', 'a/b/c', '-x/y', 'o/..', '']) {
      expect(() => new HubSource(id, { endpoint: hub.url }), id).toThrow(/not a valid Hub model id/);
    }
    expect(() => new HubSource('openai-community/gpt2', { endpoint: hub.url })).not.toThrow();
  });
});
