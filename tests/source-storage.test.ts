/**
 * The page's storage check before a download (source/storage.ts, called from the browser loader's
 * judge in src/engine/index.ts): the bytes a load will store (weights still to download, plus the
 * q8 entry it will write) against navigator.storage.estimate()'s quota − usage. Too little room is
 * TOO_LARGE before a weight byte is served; no estimate (or one that fails) changes nothing.
 */
import 'fake-indexeddb/auto';
import { readFileSync } from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkStorage } from '../src/engine/source/storage';
import { loadModelBrowser } from '../src/engine/index';
import { nodeFactory } from '../src/node/load';
import { IdbCache } from '../src/engine/source/idb-cache';
import { HubSource } from '../src/engine/source/hub-source';
import { startHubServer, type HubServer } from './helpers/hub-server';
import { ALL_FAMILY_CASES, makeCaseModel, type RandomModel } from './reference';

const GB = 1e9;

describe('checkStorage (the arithmetic)', () => {
  it('fits when download + q8 entry ≤ quota − usage', () => {
    expect(checkStorage({ downloadBytes: 2 * GB, q8Bytes: 1 * GB }, { quota: 10 * GB, usage: 7 * GB })).toBeNull();
  });
  it('TOO_LARGE naming the GB needed and available, by part, with a hint', () => {
    const e = checkStorage(
      { downloadBytes: 5.23 * GB, q8Bytes: 2.78 * GB },
      { quota: 10 * GB, usage: 4 * GB },
      'google/gemma-2-2b',
    )!;
    expect(e.code).toBe('TOO_LARGE');
    expect(e.message).toBe(
      "google/gemma-2-2b needs 8.0 GB of this browser's storage (5.2 GB of weights to download + 2.8 GB of q8 weights to keep), but only 6.0 GB is available to this site (4.0 GB used of 10 GB). No weight was downloaded.",
    );
    expect(e.hint).toMatch(
      /delete cached models.*private or incognito window.*weights "stored" \(no q8 entry to write: 2\.8 GB less\)/,
    );
    expect(e.details).toMatchObject({
      need_bytes: 8.01 * GB,
      download_bytes: 5.23 * GB,
      q8_bytes: 2.78 * GB,
      available_bytes: 6 * GB,
      usage: 4 * GB,
      quota: 10 * GB,
    });
  });
  it('without a q8 entry, or when the download alone does not fit, the way out is a smaller model', () => {
    expect(checkStorage({ downloadBytes: 3 * GB, q8Bytes: 0 }, { quota: 2 * GB, usage: 0 })!.hint).toMatch(
      /smaller model\.$/,
    );
    expect(checkStorage({ downloadBytes: 3 * GB, q8Bytes: 1 * GB }, { quota: 2 * GB, usage: 0 })!.hint).toMatch(
      /smaller model\.$/,
    );
  });
  it('usage above quota leaves 0 available; a missing usage counts as 0', () => {
    expect(checkStorage({ downloadBytes: 1, q8Bytes: 0 }, { quota: 1 * GB, usage: 2 * GB })!.details).toMatchObject({
      available_bytes: 0,
    });
    expect(checkStorage({ downloadBytes: 1 * GB, q8Bytes: 0 }, { quota: 1 * GB })).toBeNull();
  });
  it('says nothing without an estimate, without a quota, or when nothing is stored', () => {
    expect(checkStorage({ downloadBytes: 9 * GB, q8Bytes: 0 }, undefined)).toBeNull();
    expect(checkStorage({ downloadBytes: 9 * GB, q8Bytes: 0 }, {})).toBeNull();
    expect(checkStorage({ downloadBytes: 9 * GB, q8Bytes: 0 }, { quota: 0, usage: 0 })).toBeNull();
    expect(checkStorage({ downloadBytes: 0, q8Bytes: 0 }, { quota: 1, usage: 1 })).toBeNull();
  });
});

describe('the browser loader judges storage before the first weight byte', () => {
  let rm: RandomModel;
  let hub: HubServer;
  const REPO = 'r/llama-storage';
  beforeAll(async () => {
    rm = makeCaseModel(
      ALL_FAMILY_CASES.find((x) => x.name === 'llama3-rope-untied-bias')!,
      { dtype: 'F16' },
    );
    hub = await startHubServer();
    hub.addRepo(REPO, rm.dir);
  });
  afterAll(async () => {
    await hub?.close();
    rm?.cleanup();
  });

  /** run `fn` with navigator.storage.estimate answering `estimate` (Node has no navigator.storage) */
  async function withEstimate<T>(
    estimate: () => Promise<{ usage?: number; quota?: number }>,
    fn: () => Promise<T>,
  ): Promise<T> {
    const had = Object.getOwnPropertyDescriptor(globalThis, 'navigator');
    Object.defineProperty(globalThis, 'navigator', {
      value: { storage: { estimate } },
      configurable: true,
      writable: true,
    });
    try {
      return await fn();
    } finally {
      if (had) Object.defineProperty(globalThis, 'navigator', had);
      else delete (globalThis as { navigator?: unknown }).navigator;
    }
  }
  /** requests for the weight file */
  const weightRequests = () => hub.log.filter((r) => r.file?.endsWith('.safetensors'));
  const load = async (weights: 'stored' | 'q8', cache: IdbCache) =>
    loadModelBrowser(new HubSource(REPO, { endpoint: hub.url }), {
      ort: (await nodeFactory('wasm')).ort,
      backend: 'wasm',
      weights,
      cache,
    });

  it('too little room: TOO_LARGE, and only the header was read', async () => {
    hub.resetCounters();
    const cache = new IdbCache({ dbName: `st-${Math.random()}` });
    const err = await withEstimate(
      async () => ({ usage: 1000, quota: 5000 }),
      () => load('stored', cache),
    ).then(
      () => null,
      (e) => e,
    );
    expect(err).toMatchObject({ code: 'TOO_LARGE', details: { available_bytes: 4000, q8_bytes: 0 } });
    expect(err.message).toMatch(
      /^r\/llama-storage needs \d+ kB of this browser's storage, but only 4 kB is available to this site \(1 kB used of 5 kB\)/,
    );
    // the header's two ranged reads, nothing of a tensor
    // the header's two ranged reads (its length, then its JSON), nothing past it
    const file = readFileSync(path.join(rm.dir, 'model.safetensors'));
    const headerEnd = 8 + Number(file.readBigUInt64LE(0));
    expect(weightRequests().length).toBeGreaterThan(0);
    for (const r of weightRequests())
      expect(Number(/^bytes=\d+-(\d+)$/.exec(r.range)?.[1] ?? Infinity), r.range).toBeLessThan(headerEnd);
    // what the cache holds of the weights is the header it read (kept for the download to resume from)
    for (const e of (await cache.list()).filter((x) => x.file.endsWith('.safetensors')))
      expect(e).toMatchObject({ complete: false, size: headerEnd });
  });

  it('q8 counts the entry it will write: room for the download alone is not enough', async () => {
    const cache = new IdbCache({ dbName: `st-${Math.random()}` });
    // first the stored download, so the model's files are cached and only the q8 entry is left to write
    const m = await load('stored', cache);
    await m.dispose();
    hub.resetCounters();
    const err = await withEstimate(
      async () => ({ usage: 0, quota: 1000 }),
      () => load('q8', cache),
    ).then(
      () => null,
      (e) => e,
    );
    expect(err).toMatchObject({ code: 'TOO_LARGE', details: { download_bytes: 0 } });
    expect(err.details.q8_bytes).toBeGreaterThan(1000);
    expect(err.hint).toMatch(/weights "stored"/);
    expect(hub.log.filter((r) => r.file?.endsWith('.safetensors'))).toEqual([]);
  });

  it('no estimate, or one that throws: the load goes on as before', async () => {
    const cache = new IdbCache({ dbName: `st-${Math.random()}` });
    const m = await withEstimate(
      async () => {
        throw new Error('not allowed');
      },
      () => load('stored', cache),
    );
    await m.dispose();
    const m2 = await load('q8', new IdbCache({ dbName: `st-${Math.random()}` }));
    expect(m2.info.weights).toBe('q8');
    await m2.dispose();
  });
});
