/**
 * q8 weights kept between loads (q8.ts Q8Store; src/node/q8-cache.ts; source/q8-store.ts): the
 * first q8 load writes an entry, a second reads it instead of quantising again, and the numbers
 * with the cache equal the uncached q8 numbers exactly (and the uncached build equals the scheme's
 * independent reference: engine-q8.test.ts). A broken entry (truncated, a changed byte in a
 * checked window, a header for other weights) is not read: it is rebuilt. A write that fails
 * leaves no entry that reads as whole, and the load goes on in memory. In the page's IndexedDB
 * (fake-indexeddb here) the entry lives with the model's files, so deleting the model deletes it.
 */
import 'fake-indexeddb/auto';
import { readdirSync, readFileSync, rmSync, statSync, truncateSync, utimesSync, writeFileSync } from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadModelNode, nodeFactory } from '../src/node/load';
import { loadModelBrowser } from '../src/engine/index';
import { IdbCache } from '../src/engine/source/idb-cache';
import { LoupeError } from '../src/engine/errors';
import { HubSource } from '../src/engine/source/hub-source';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { describeModel } from '../src/engine/arch';
import { q8EntryBytesToWrite, q8WeightSet, Q8_FILE, type Q8Store } from '../src/engine/q8';
import { cacheQ8Store, isQ8Entry } from '../src/engine/source/q8-store';
import { readEntryRange } from '../src/engine/safetensors';
import type { TensorEntry } from '../src/engine/safetensors-types';
import { q8CacheRoot } from '../src/node/q8-cache';
import type { LoadedModel } from '../src/engine/api';
import { startHubServer, type HubServer } from './helpers/hub-server';
import { ownCacheDir } from './helpers/scratch-cache';
import { ALL_FAMILY_CASES, caseTokens, makeCaseModel, maxAbsDiff, type RandomModel } from './reference';

const c = ALL_FAMILY_CASES.find((x) => x.name === 'llama3-rope-untied-bias')!;
let rm: RandomModel;
let cache: ReturnType<typeof ownCacheDir>;

beforeAll(() => {
  cache = ownCacheDir('loupe-q8cache-');
  rm = makeCaseModel(c, { dtype: 'F16' });
});
afterAll(() => {
  cache?.restore();
  rm?.cleanup();
});

/** the q8 entry files under $LOUPE_CACHE_DIR/q8 (any depth) */
function entryFiles(): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    try {
      for (const e of readdirSync(d, { withFileTypes: true }))
        // (not the integrity records beside them, dir-cache.ts)
        e.isDirectory() ? walk(path.join(d, e.name)) : e.name.endsWith('@sha256') || out.push(path.join(d, e.name));
    } catch {
      /* none */
    }
  };
  walk(q8CacheRoot());
  return out.sort();
}

const bytesOf = (w: Parameters<typeof readEntryRange>[0], e: TensorEntry) => readEntryRange(w, e, 0, e.byteLength);

async function run(m: LoadedModel): Promise<{ logits: number[]; resid: number[] }> {
  const out = await m.run(caseTokens(rm, c.seqLen), { hooks: ['blocks.1.hook_resid_post'] });
  return { logits: Array.from(out.logits.data), resid: Array.from(out.hooks['blocks.1.hook_resid_post'].data) };
}

async function loadAndRun(backend: 'node' | 'wasm', env: Record<string, string> = {}, weights: 'q8' | 'q4' = 'q8') {
  const prev = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  Object.assign(process.env, env);
  try {
    const m = await loadModelNode(rm.dir, { backend, weights });
    try {
      return {
        reason: m.info.weights_reason,
        js: m.memory().js_weight_bytes,
        why: m.memory().js_weights_why,
        ...(await run(m)),
        W_E: Array.from(m.param('embed.W_E').data),
      };
    } finally {
      await m.dispose();
    }
  } finally {
    for (const [k, v] of Object.entries(prev))
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
  }
}

describe('the q8 cache in Node (a local folder)', () => {
  it('the first load writes an entry, the second reads it; the numbers equal the uncached ones exactly, on both backends', async () => {
    const uncached = await loadAndRun('node', { LOUPE_Q8_CACHE: '0' });
    expect(uncached.reason).toMatch(/quantised at load$/);
    expect(entryFiles()).toEqual([]);
    const first = await loadAndRun('node');
    expect(first.reason).toMatch(/kept in the q8 cache/);
    // the first load too reads the entry it wrote (onnxruntime-node from disk): no quantised copy in JS
    expect(first.js).toBe(0);
    expect(uncached.js).toBeGreaterThan(0);
    expect(uncached.why).toMatch(/q8 weights are held in JS: this load has no q8 cache/);
    const [entry, ...rest] = entryFiles();
    expect(rest).toEqual([]);
    expect(path.basename(entry)).toMatch(/q8-[0-9a-f]{28}\.safetensors$/);
    const second = await loadAndRun('node');
    expect(second.reason).toMatch(/read from the q8 cache/);
    // the session reads the entry from disk: no quantised copy in JS
    expect(second.js).toBe(0);
    for (const r of [first, second]) {
      expect(r.logits).toEqual(uncached.logits);
      expect(r.resid).toEqual(uncached.resid);
      expect(r.W_E).toEqual(uncached.W_E);
    }
    const wasmUncached = await loadAndRun('wasm', { LOUPE_Q8_CACHE: '0' });
    const wasm = await loadAndRun('wasm');
    expect(wasm.reason).toMatch(/read from the q8 cache/);
    expect(wasm.logits).toEqual(wasmUncached.logits);
    expect(entryFiles()).toEqual([entry]);
    // a cold load on onnxruntime-web in Node: it reads the entry it wrote back from disk, tensor by tensor
    rmSync(entry);
    const wasmCold = await loadAndRun('wasm');
    expect(wasmCold.reason).toMatch(/kept in the q8 cache/);
    expect(wasmCold.js).toBe(0);
    expect(wasmCold.logits).toEqual(wasmUncached.logits);
  });

  it('q4 entries go through the same machinery, beside the q8 entry (neither drops the other), with equal numbers', async () => {
    const uncached = await loadAndRun('node', { LOUPE_Q8_CACHE: '0' }, 'q4');
    expect(uncached.why).toMatch(/q4 weights are held in JS: this load has no q4 cache/);
    await loadAndRun('node');
    const first = await loadAndRun('node', {}, 'q4');
    expect(first.reason).toMatch(/kept in the q4 cache/);
    const second = await loadAndRun('wasm', {}, 'q4');
    expect(second.reason).toMatch(/read from the q4 cache/);
    expect(second.js).toBe(0);
    expect(first.logits).toEqual(uncached.logits);
    expect(maxAbsDiff(second.logits, uncached.logits).maxAbs).toBeLessThan(1e-5);
    const names = entryFiles().map((f) => path.basename(f).replace(/^.*(q[48])-[0-9a-f]{28}/, '$1-KEY'));
    expect(names).toEqual(['q4-KEY.safetensors', 'q8-KEY.safetensors']);
    expect((await loadAndRun('node')).reason).toMatch(/read from the q8 cache/);
    for (const f of entryFiles()) if (/q4-[0-9a-f]{28}/.test(f)) rmSync(f);
  });

  it('a truncated entry, a changed byte in a checked window, or a header for other weights is rebuilt, never read', async () => {
    const want = (await loadAndRun('node', { LOUPE_Q8_CACHE: '0' })).logits;
    await loadAndRun('node');
    const [entry] = entryFiles();
    const good = readFileSync(entry);
    const damage: [string, (b: Buffer) => void][] = [
      ['truncated', () => truncateSync(entry, good.byteLength - 100)],
      // the windows are at multiples of 4 KiB in a file this small: byte 8192 + 10 is in one
      [
        'a changed byte',
        () => {
          const b = Buffer.from(good);
          b[8192 + 10] ^= 0x55;
          writeFileSync(entry, b);
        },
      ],
      [
        'another header',
        () => {
          const b = Buffer.from(good);
          const i = b.indexOf('"key":"') + 7;
          b[i] = b[i] === 0x30 ? 0x31 : 0x30;
          writeFileSync(entry, b);
        },
      ],
    ];
    for (const [what, hurt] of damage) {
      hurt(good);
      const r = await loadAndRun('node');
      expect(r.reason, what).toMatch(/quantised at load, kept in the q8 cache/);
      expect(r.logits, what).toEqual(want);
      expect(readFileSync(entryFiles()[0]).equals(good), what).toBe(true);
    }
    // a changed weight file makes a new key: the old entry is not read (and is replaced)
    const w = path.join(rm.dir, 'model.safetensors');
    const t = statSync(w).mtime;
    utimesSync(w, t, new Date(t.getTime() + 5000));
    expect((await loadAndRun('node')).reason).toMatch(/kept in the q8 cache/);
    expect(entryFiles()).toHaveLength(1);
    expect(entryFiles()[0]).not.toBe(entry);
  });

  it('a store that fails mid-write leaves no entry read as whole; the load goes on in memory', async () => {
    const files = await loadModelFilesNode(rm.dir);
    const spec = describeModel({ config: files.config as Record<string, any>, tensors: files.weights.tensors });
    const mem = await q8WeightSet(files.weights, spec);
    const written = new Map<string, Uint8Array>();
    let dropped = 0;
    const failing: Q8Store = {
      identity: async () => 'x',
      open: async (name) => {
        const b = written.get(name);
        return (
          b && {
            file: {
              size: b.byteLength,
              read: (o, n) => b.slice(o, o + n),
              readAsync: async (o, n) => b.slice(o, o + n),
            },
          }
        );
      },
      async create(name) {
        const parts: Uint8Array[] = [];
        let n = 0;
        return {
          append(b) {
            if ((n += b.byteLength) > 3000) throw new Error('disk full');
            parts.push(b.slice());
          },
          commit: async () => {
            written.set(name, Buffer.concat(parts));
          },
          abort: async () => {
            dropped++;
          },
        };
      },
      drop: async () => {},
      retain: async () => {},
    };
    const ws = await q8WeightSet(files.weights, spec, failing);
    expect(ws.q8Source).toBe('built');
    expect(ws.q8StoreFailure).toMatch(/disk full/);
    expect(written.size).toBe(0);
    expect(dropped).toBe(1);
    // the same int8 values and scales as a build without a store (the headers differ by the key)
    const q8 = [...mem.tensors.values()].filter((e) => e.q8);
    expect(q8.length).toBeGreaterThan(5);
    for (const e of q8)
      for (const t of [e, e.q8!.scale]) {
        expect(ws.tensors.get(e.name)!.file).toBe(Q8_FILE);
        expect(
          Array.from(bytesOf(ws, t === e ? ws.tensors.get(e.name)! : ws.tensors.get(e.name)!.q8!.scale)),
          t.name,
        ).toEqual(Array.from(bytesOf(mem, t)));
      }
  });
});

describe('the q8 cache in IndexedDB (the page)', () => {
  let hub: HubServer;
  beforeAll(async () => {
    hub = await startHubServer();
    hub.addRepo('r/llama', rm.dir);
  });
  afterAll(async () => {
    await hub?.close();
  });

  it("kept with the model's files: read back on the next load with the same numbers, deleted with the model", async () => {
    const cache = new IdbCache({ dbName: `q8-${Math.random()}`, chunkBytes: 4096 });
    const ort = (await nodeFactory('wasm')).ort;
    const src = () => new HubSource('r/llama', { endpoint: hub.url });
    const load = () => loadModelBrowser(src(), { ort, backend: 'wasm', weights: 'q8', cache });
    const uncached = await loadModelBrowser(src(), { ort, backend: 'wasm', weights: 'q8' });
    const want = await run(uncached);
    await uncached.dispose();

    const first = await load();
    expect(first.info.weights_reason).toMatch(/kept in the q8 cache/);
    expect(await run(first)).toEqual(want);
    // the cold load reads the entry it wrote back by range, as a cached load does: no quantised bytes in JS
    expect(first.memory()).toMatchObject({ js_weight_bytes: 0 });
    expect(first.memory().js_weights_why).toBeUndefined();
    await first.dispose();
    const q8Entries = async () => (await cache.list()).filter((e) => isQ8Entry(e.file));
    expect((await q8Entries()).map((e) => e.complete)).toEqual([true]);
    // judged before a download: the entry's exact size while there is none, nothing once it is there
    const files = await loadModelFilesNode(rm.dir);
    const spec = describeModel({ config: files.config as Record<string, any>, tensors: files.weights.tensors });
    const store = cacheQ8Store(cache, (f) => src().cacheKey(f))!;
    const [written] = await q8Entries();
    expect(await q8EntryBytesToWrite(files.weights.tensors, spec, store)).toBe(0);
    await store.drop(written.file);
    expect(await q8EntryBytesToWrite(files.weights.tensors, spec, store)).toBe(written.size);
    const rebuilt = await load();
    expect(rebuilt.info.weights_reason).toMatch(/kept in the q8 cache/);
    await rebuilt.dispose();

    const second = await load();
    expect(second.info.weights_reason).toMatch(/read from the q8 cache/);
    expect(await run(second)).toEqual(want);
    expect(second.memory().js_weight_bytes).toBe(0);
    await second.dispose();

    // a write cut off (the tab closed mid-way) leaves a partial entry, never read: the next load rebuilds
    const [e] = await q8Entries();
    await store.drop(e.file);
    const sink = await cache.openSink!(e);
    sink.append(new Uint8Array(5000));
    await sink.suspend();
    expect((await q8Entries()).map((x) => x.complete)).toEqual([false]);
    expect(await store.open(e.file)).toBeUndefined();
    const third = await load();
    expect(third.info.weights_reason).toMatch(/kept in the q8 cache/);
    expect(await run(third)).toEqual(want);
    await third.dispose();

    await cache.delete({ endpoint: e.endpoint, id: e.id, revision: e.revision });
    expect(await cache.list()).toEqual([]);
  });

  it('an entry the quota refuses: the load goes on with the q8 weights in JS, and the memory report says why', async () => {
    const cache = new IdbCache({ dbName: `q8-${Math.random()}`, chunkBytes: 4096 });
    const ort = (await nodeFactory('wasm')).ort;
    const want = await (async () => {
      const m = await loadModelBrowser(new HubSource('r/llama', { endpoint: hub.url }), {
        ort,
        backend: 'wasm',
        weights: 'q8',
      });
      try {
        return await run(m);
      } finally {
        await m.dispose();
      }
    })();
    const refusing: IdbCache = Object.create(cache);
    refusing.openSink = async (key) => {
      const sink = await cache.openSink(key);
      if (!isQ8Entry(key.file)) return sink;
      return {
        ...sink,
        append() {
          throw new LoupeError(
            'TOO_LARGE',
            'This browser refused to store the q8 weights in its cache: the storage quota for this site is used up.',
          );
        },
      };
    };
    const m = await loadModelBrowser(new HubSource('r/llama', { endpoint: hub.url }), {
      ort,
      backend: 'wasm',
      weights: 'q8',
      cache: refusing,
    });
    try {
      expect(m.info.weights_reason).toMatch(/quantised at load$/);
      expect(await run(m)).toEqual(want);
      const mem = m.memory();
      expect(mem.js_weight_bytes).toBeGreaterThan(0);
      expect(mem.js_weights_why).toMatch(
        /q8 weights are held in JS: their cache entry could not be written \(q8 cache: This browser refused .*quota/,
      );
    } finally {
      await m.dispose();
    }
    expect((await cache.list()).filter((e) => isQ8Entry(e.file) && e.complete)).toEqual([]);
  });
});
