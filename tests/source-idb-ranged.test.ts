/**
 * A weight file cached in IndexedDB is read back as its chunk list, by range, never as one
 * ArrayBuffer (source/chunked-file.ts, IdbCache.openFile): the session's pieces and param() read
 * just their bytes. Checked on ranges that straddle chunks (bytes and Blob chunks), and on a
 * model loaded through a loopback Hub into fake IndexedDB with 4 KiB chunks, whose forward on
 * onnxruntime-web's WASM agrees with the float64 reference. In Chromium (a worker) the chunks are
 * Blobs, read through the worker's reader thread (workers/blob-reader.ts); the e2e load from the
 * cache covers that.
 */
import 'fake-indexeddb/auto';
import { readFileSync } from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chunkedFile } from '../src/engine/source/chunked-file';
import { IdbCache } from '../src/engine/source/idb-cache';
import { loadModelFiles } from '../src/engine/source/files';
import { HubSource } from '../src/engine/source/hub-source';
import { createModel, modelPartsFrom } from '../src/engine/model';
import { nodeFactory } from '../src/node/load';
import { readTensorF32 } from '../src/engine/safetensors';
import { startHubServer, type HubServer } from './helpers/hub-server';
import {
  ALL_FAMILY_CASES,
  caseTokens,
  makeCaseModel,
  maxAbsDiff,
  referenceForward,
  type RandomModel,
} from './reference';

const pattern = (n: number, seed = 1) => Uint8Array.from({ length: n }, (_, i) => (i * 31 + seed) & 255);

describe('chunkedFile', () => {
  const data = pattern(10_000);
  const split = (cb: number) =>
    Array.from({ length: Math.ceil(data.byteLength / cb) }, (_, i) => data.slice(i * cb, (i + 1) * cb));
  const ranges: [number, number][] = [
    [0, 8],
    [995, 20],
    [1000, 1000],
    [999, 3002],
    [9990, 10],
    [9990, 100],
    [0, 10_000],
    [5000, 0],
  ];

  it('byte chunks: every range, within and across chunks, clamped at the end', async () => {
    const f = chunkedFile(split(1000), 1000, data.byteLength);
    for (const [o, n] of ranges) {
      const want = Array.from(data.subarray(o, o + n));
      expect(Array.from(f.read(o, n)), `${o}+${n}`).toEqual(want);
      expect(Array.from(await f.readAsync(o, n)), `async ${o}+${n}`).toEqual(want);
    }
  });

  it('Blob chunks: read synchronously through the given reader (FileReaderSync in a worker), asynchronously through Blob', async () => {
    const held = new Map<Blob, Uint8Array>();
    const blobs = split(1000).map((b) => {
      const blob = new Blob([b]);
      held.set(blob, b);
      return blob;
    });
    let syncReads = 0;
    const f = chunkedFile(blobs, 1000, data.byteLength, (blob, s, into) => {
      syncReads++;
      into.set(held.get(blob)!.subarray(s, s + into.byteLength));
      return into.byteLength;
    });
    for (const [o, n] of ranges) {
      const want = Array.from(data.subarray(o, o + n));
      expect(Array.from(f.read(o, n)), `${o}+${n}`).toEqual(want);
      expect(Array.from(await f.readAsync(o, n)), `async ${o}+${n}`).toEqual(want);
    }
    // only the chunks a range touches are read: 999+3002 touches chunks 0..4
    syncReads = 0;
    f.read(999, 3002);
    expect(syncReads).toBe(5);
  });

  it("Blob chunks read into the caller's buffer: the reader writes each piece in place, and a short read is an error", () => {
    const held = new Map<Blob, Uint8Array>();
    const blobs = split(1000).map((b) => {
      const blob = new Blob([b]);
      held.set(blob, b);
      return blob;
    });
    const intos: Uint8Array[] = [];
    const f = chunkedFile(blobs, 1000, data.byteLength, (blob, s, into) => {
      intos.push(into);
      into.set(held.get(blob)!.subarray(s, s + into.byteLength));
      return into.byteLength;
    });
    const scratch = new Uint8Array(4000).fill(7);
    const got = f.read(999, 3002, scratch);
    expect(got.buffer).toBe(scratch.buffer);
    expect(Array.from(got)).toEqual(Array.from(data.subarray(999, 999 + 3002)));
    // every piece was handed a view of the scratch, none a buffer of its own
    expect(intos).toHaveLength(5);
    for (const v of intos) expect(v.buffer).toBe(scratch.buffer);
    expect(scratch[3002]).toBe(7);
    const short = chunkedFile(blobs, 1000, data.byteLength, (_blob, _s, into) => into.byteLength - 1);
    expect(() => short.read(10, 20)).toThrowError(expect.objectContaining({ code: 'SAFETENSORS_TRUNCATED' }));
  });

  it('chunks that do not add up to the size are refused', () => {
    expect(() => chunkedFile(split(1000), 1000, 9_000)).toThrowError(expect.objectContaining({ code: 'INTERNAL' }));
    expect(() => chunkedFile([data.slice(0, 900), data.slice(900, 2000)], 1000, 2000)).toThrowError(
      expect.objectContaining({ code: 'INTERNAL' }),
    );
  });
});

describe('IdbCache.openFile', () => {
  it.each([false, true])(
    'blobs=%s: a complete entry read by range; partial or missing entries give nothing',
    async (blobs) => {
      const cache = new IdbCache({ dbName: `ranged-${Math.random()}`, chunkBytes: 1000, blobs });
      const key = { endpoint: 'http://x', id: 'o/m', revision: 'main', file: 'w.bin' };
      const data = pattern(4321, 3);
      expect(await cache.openFile(key)).toBeUndefined();
      await cache.putPartial(key, data.subarray(0, 2000), { total: 4321 });
      expect(await cache.openFile(key)).toBeUndefined();
      await cache.put(key, data);
      const f = (await cache.openFile(key))!;
      expect(f.size).toBe(4321);
      expect(Array.from(await f.readAsync(990, 2020))).toEqual(Array.from(data.subarray(990, 3010)));
      if (!blobs) expect(Array.from(f.read(3999, 400))).toEqual(Array.from(data.subarray(3999, 4321)));
      // the other readers take Blob chunks too
      expect(Array.from((await cache.readRange(key, 995, 10))!.bytes)).toEqual(Array.from(data.subarray(995, 1005)));
      expect(Array.from((await cache.get(key))!)).toEqual(Array.from(data));
    },
  );
});

describe('a model cached in IndexedDB runs from its chunks', () => {
  let hub: HubServer;
  let rm: RandomModel;
  const c = ALL_FAMILY_CASES.find((x) => x.name === 'llama3-rope-untied-bias')!;
  beforeAll(async () => {
    rm = makeCaseModel(c, { dtype: 'F16' });
    hub = await startHubServer();
    hub.addRepo('r/llama', rm.dir);
  });
  afterAll(async () => {
    await hub?.close();
    rm?.cleanup();
  });

  it('no weight file is held whole; the WASM forward and param() read the chunks and agree with the reference', async () => {
    const cache = new IdbCache({ dbName: `ranged-model-${Math.random()}`, chunkBytes: 4096 });
    const src = new HubSource('r/llama', { endpoint: hub.url });
    await loadModelFiles(src, { cache }); // first load: download into the cache
    hub.resetCounters();
    const files = await loadModelFiles(src, { cache });
    expect(hub.log).toEqual([]);
    expect(files.weights.files.size).toBe(0);
    const ranged = files.weights.ranged!.get('model.safetensors')!;
    const onDisk = readFileSync(path.join(rm.dir, 'model.safetensors'));
    expect(ranged.size).toBe(onDisk.byteLength);

    const model = await createModel(
      modelPartsFrom(files, { bundled: false, weightsMode: 'stored' }),
      await nodeFactory('wasm'),
    );
    try {
      const tokens = caseTokens(rm, c.seqLen);
      const out = await model.run(tokens);
      expect(maxAbsDiff(referenceForward(rm, tokens).logits.data, out.logits.data).maxAbs).toBeLessThan(1e-4);
      // param() reads its tensor's range from the chunks: the same values as reading the file
      const name = [...files.weights.tensors.keys()].find((n) => n.includes('embed'))!;
      const fromDisk = readTensorF32(
        {
          files: new Map([['model.safetensors', new Uint8Array(onDisk)]]),
          paths: new Map(),
          tensors: files.weights.tensors,
          metadata: {},
        },
        name,
      );
      expect(Array.from(readTensorF32(files.weights, name))).toEqual(Array.from(fromDisk));
      expect(model.param('embed.W_E').data.length).toBe(fromDisk.length);
    } finally {
      await model.dispose();
    }
  });
});

describe('the memory report', () => {
  it('weights in the precision used, none held in JS, the hooks the last run returned, and the WASM heap', async () => {
    const { loadModelNode } = await import('../src/node/load');
    const { wasmHeapBytes } = await import('../src/engine/runtime/wasm-heap');
    const rm = makeCaseModel(
      ALL_FAMILY_CASES.find((x) => x.name === 'llama3-rope-untied-bias')!,
      { dtype: 'F16' },
    );
    try {
      const m = await loadModelNode(rm.dir, { backend: 'wasm', weights: 'stored' });
      try {
        const before = m.memory();
        expect(before).toMatchObject({
          weight_bytes: m.info.weight_bytes,
          precision: 'stored',
          js_weight_bytes: 0,
          hooks_bytes: 0,
        });
        expect(before.sessions).toBeGreaterThanOrEqual(1);
        // stored F16: two bytes per parameter
        expect(before.weight_bytes).toBe(2 * m.info.n_params);
        const out = await m.run(caseTokens(rm, 5), { hooks: 'all' });
        const returned = Object.values(out.hooks).reduce((s, t) => s + t.data.byteLength, 0);
        expect(returned).toBeGreaterThan(0);
        expect(m.memory().hooks_bytes).toBe(returned);
        await m.run(caseTokens(rm, 5));
        expect(m.memory().hooks_bytes).toBe(0);
        // the heap holds the weights (and more): the number is the runtime's, not an estimate
        expect(wasmHeapBytes()!).toBeGreaterThan(before.weight_bytes);
        m.param('blocks.0.attn.W_Q');
        expect(m.memory().param_bytes).toBe(4 * m.param('blocks.0.attn.W_Q').data.length);
      } finally {
        await m.dispose();
      }
    } finally {
      rm.cleanup();
    }
  });
});
