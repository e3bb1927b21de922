/**
 * Loading SAEs through the sources and caches models use, against the local Hub mimic
 * (/{id}/resolve/{rev}/{path}/cfg.json …):
 *  - Node loaders (src/node/load-sae.ts): download with progress; a second load — a new model and
 *    new loaders on the same DirCache — makes zero requests and gives the same document;
 *  - browser loaders (src/engine/source/sae-loader.ts) with an IndexedDB cache: the same;
 *  - cancellation mid-download is ABORTED and a later call loads again;
 *  - descriptions in Neuronpedia's layouts (JSON array, {"explanations": …}, gzipped JSON Lines)
 *    from next to the SAE or a URL; descriptions of another SAE are refused.
 */
import 'fake-indexeddb/auto';
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { gzipSync } from 'fflate';
import { loadModelNode } from '../src/node/load';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import { DirCache } from '../src/node/dir-cache';
import { createSaeLoaders } from '../src/engine/source/sae-loader';
import { IdbCache } from '../src/engine/source/idb-cache';
import type { LoadedModel } from '../src/engine/api';
import type { Progress } from '../src/ops/types';
import { operations } from '../src/ops/index';
import { parseDescriptions, checkDescriptions } from '../src/ops/lib/feature-descriptions';
import type { SaeOpContext } from '../src/ops/lib/sae';
import type { SaeLoaders } from '../src/engine/source/sae-loader';

/** the context a surface gives the SAE operations (loaders + progress/signal) */
const ctxOf = (l: SaeLoaders, extra: Partial<SaeOpContext> = {}): SaeOpContext => ({
  loadSae: l.loadSae,
  loadSaeFile: l.loadSaeFile,
  ...extra,
});
import { startHubServer, type HubServer } from './helpers/hub-server';
import { makeRandomSae, type RandomSae } from './helpers/random-sae';
import { INDUCTION } from './sae-ref';
import { schemaErrors, viaJson } from './schema-helpers';

const REPO = 'acme/gpt2-saes';
const SAE_PATH = 'blocks.1.hook_resid_pre';
const BARE_PATH = 'blocks.0.hook_resid_post';
const tmp = mkdtempSync(path.join(tmpdir(), 'loupe-sae-load-'));
let hub: HubServer;
let sae: RandomSae;
let bare: RandomSae;
const models: LoadedModel[] = [];

async function freshModel(): Promise<LoadedModel> {
  const m = await loadModelNode(INDUCTION);
  models.push(m);
  return m;
}

beforeAll(async () => {
  hub = await startHubServer();
  sae = makeRandomSae({ hook: SAE_PATH, dIn: 64, dSae: 512, seed: 4 });
  bare = makeRandomSae({ hook: BARE_PATH, dIn: 64, dSae: 32, seed: 5 });
  const root = path.join(tmp, 'repo');
  for (const [s, p] of [
    [sae, SAE_PATH],
    [bare, BARE_PATH],
  ] as const) {
    mkdirSync(path.join(root, p), { recursive: true });
    for (const f of ['cfg.json', 'sae_weights.safetensors']) copyFileSync(path.join(s.dir, f), path.join(root, p, f));
  }
  // Neuronpedia's (former) export answer: a JSON array of explanation records, features 0–255 only
  const records = Array.from({ length: 256 }, (_, i) => ({
    modelId: 'induction-gpt2',
    layer: '1-res-test',
    index: String(i),
    description: `feature ${i} text`,
    explanationModelName: 'gpt-4o-mini',
    typeName: 'oai_token-act-pair',
  }));
  writeFileSync(path.join(root, SAE_PATH, 'explanations.json'), JSON.stringify(records));
  hub.addRepo(REPO, root);
});

afterAll(async () => {
  for (const m of models) await m.dispose();
  await hub?.close();
  for (const s of [sae, bare]) if (s) rmSync(s.dir, { recursive: true, force: true });
  rmSync(tmp, { recursive: true, force: true });
});

describe('Node SAE loaders against the Hub mimic', () => {
  const cacheDir = path.join(tmp, 'cache');
  const input = { prompt: 'abcabcab', sae_source: REPO, sae_path: SAE_PATH, top_k: 5 };

  it('first load downloads with progress; a second load (new model, same DirCache) makes zero requests and gives the same document', async () => {
    const progress: Progress[] = [];
    const l1 = createNodeSaeLoaders({ cache: new DirCache(cacheDir), endpoint: hub.url });
    const m1 = await freshModel();
    const d1 = await operations.sae_features.run(
      m1,
      input,
      ctxOf(l1, { onProgress: (p: Progress) => progress.push(p) }),
    );
    const weights = `${SAE_PATH}/sae_weights.safetensors`;
    const size = hub.stats(REPO, weights).bytes;
    // two range reads of the header (judged before the download: issue 22), then the rest after it
    expect(hub.stats(REPO, weights).ranges).toEqual([
      'bytes=0-7',
      expect.stringMatching(/^bytes=8-\d+$/),
      expect.stringMatching(/^bytes=\d+-$/),
    ]);
    expect(hub.stats(REPO, `${SAE_PATH}/cfg.json`).requests).toBe(1);
    expect(size).toBeGreaterThan(250_000);
    const wp = progress.filter((p) => p.stage === `loading SAE ${weights}`);
    expect(wp.length).toBeGreaterThan(1);
    expect(wp[wp.length - 1]).toMatchObject({ done: size, total: size });
    expect(d1.descriptions).toMatchObject({ count: 256, neuronpedia_model_id: 'induction-gpt2', format: 'json_array' });
    const described = d1.positions.flatMap((p: any) => p.features);
    expect(described.some((f: any) => f.feature < 256 && f.description === `feature ${f.feature} text`)).toBe(true);
    expect(described.filter((f: any) => f.feature >= 256).every((f: any) => f.description === null)).toBe(true);
    expect(schemaErrors('sae_features', viaJson(d1))).toEqual([]);

    hub.resetCounters();
    const progress2: Progress[] = [];
    const l2 = createNodeSaeLoaders({ cache: new DirCache(cacheDir), endpoint: hub.url });
    const m2 = await freshModel();
    const d2 = await operations.sae_features.run(
      m2,
      input,
      ctxOf(l2, { onProgress: (p: Progress) => progress2.push(p) }),
    );
    console.log(
      `first load: ${size} weight bytes, ${progress.length} progress events; second load: ${hub.log.length} requests`,
    );
    expect(hub.log).toHaveLength(0);
    expect(progress2.some((p) => p.stage === `loading SAE ${weights} (cached)`)).toBe(true);
    expect(JSON.stringify(d2)).toBe(JSON.stringify(d1));
  });

  it('an SAE without explanations.json: descriptions are null; the loaders remember the absence', async () => {
    hub.resetCounters();
    const l = createNodeSaeLoaders({ cache: new DirCache(cacheDir), endpoint: hub.url });
    const run = async () =>
      operations.sae_features.run(
        await freshModel(),
        { prompt: 'abcab', sae_source: REPO, sae_path: BARE_PATH },
        ctxOf(l),
      );
    const d = await run();
    expect(d.descriptions).toMatchObject({
      source: null,
      count: 0,
      looked_for: `${REPO}/${BARE_PATH}/explanations.json`,
    });
    for (const p of d.positions) for (const f of p.features) expect(f.description).toBeNull();
    expect(hub.stats(REPO, `${BARE_PATH}/explanations.json`).statuses).toEqual([404]);
    hub.resetCounters();
    await run(); // a new model, the same loaders: nothing is asked again
    expect(hub.log).toHaveLength(0);
  });

  it('an SAE above the size limit is TOO_LARGE before its weights are requested; a missing descriptions file is named', async () => {
    hub.resetCounters();
    const l = createNodeSaeLoaders({ cache: false, endpoint: hub.url, maxBytes: 100_000 });
    const model = await freshModel();
    await expect(
      operations.sae_features.run(model, { prompt: 'abc', sae_source: REPO, sae_path: SAE_PATH }, ctxOf(l)),
    ).rejects.toMatchObject({ code: 'TOO_LARGE', hint: expect.stringMatching(/fewer features/) });
    expect(hub.stats(REPO, `${SAE_PATH}/sae_weights.safetensors`).requests).toBe(0);
    const ok = createNodeSaeLoaders({ cache: false, endpoint: hub.url });
    await expect(
      operations.sae_features.run(
        model,
        {
          prompt: 'abc',
          sae_source: REPO,
          sae_path: BARE_PATH,
          descriptions: `${hub.url}/${REPO}/resolve/main/nope.json`,
        },
        ctxOf(ok),
      ),
    ).rejects.toMatchObject({
      code: 'FILE_NOT_FOUND',
      message: expect.stringMatching(/^descriptions: /),
      hint: expect.stringMatching(/URL or path/),
    });
  });

  it('cancelling mid-download is ABORTED, and the next call loads the SAE', async () => {
    const id = 'acme/slow';
    hub.addRepo(id, path.join(tmp, 'repo'));
    hub.throttle(id, `${SAE_PATH}/sae_weights.safetensors`, { chunkSize: 16 * 1024, chunkDelayMs: 30 });
    const l = createNodeSaeLoaders({ cache: new DirCache(path.join(tmp, 'cache-slow')), endpoint: hub.url });
    const model = await freshModel();
    const ac = new AbortController();
    const ctx = ctxOf(l);
    const p = operations.sae_features.run(
      model,
      { prompt: 'abc', sae_source: id, sae_path: SAE_PATH },
      {
        ...ctx,
        signal: ac.signal,
        onProgress: (q: Progress) => {
          if (q.stage.includes('sae_weights') && q.done > 0) ac.abort();
        },
      },
    );
    await expect(p).rejects.toMatchObject({ code: 'ABORTED' });
    const d = await operations.sae_features.run(model, { prompt: 'abc', sae_source: id, sae_path: SAE_PATH }, ctx);
    expect(d.sae.d_sae).toBe(512);
  });
});

describe('browser SAE loaders (HubSource + IndexedDB cache)', () => {
  it('downloads once; new loaders on the same IndexedDB make zero requests', async () => {
    const id = 'acme/idb';
    hub.addRepo(id, path.join(tmp, 'repo'));
    const cache = new IdbCache({ dbName: 'loupe-sae-test' });
    const ref = { source: id, path: SAE_PATH };
    hub.resetCounters();
    const events: string[] = [];
    const a = await createSaeLoaders({ cache, endpoint: hub.url }).loadSae(ref, {
      onProgress: (p) => events.push(`${p.file}${p.cached ? ' cached' : ''}`),
    });
    // cfg.json whole; the weights' header by two range reads, then the rest after it
    expect(hub.log.map((r) => r.status)).toEqual([200, 206, 206, 206]);
    expect(events).toContain(`${SAE_PATH}/sae_weights.safetensors`);
    hub.resetCounters();
    const b = await createSaeLoaders({ cache, endpoint: hub.url }).loadSae(ref);
    expect(hub.log).toHaveLength(0);
    expect(b.cfg).toEqual(a.cfg);
    expect(b.bytes.byteLength).toBe(a.bytes.byteLength);
    await cache.close();
  });

  it('refuses folders and the bundled model with clear errors', async () => {
    const l = createSaeLoaders();
    await expect(l.loadSae({ source: '/some/folder', path: '' })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await expect(l.loadSae({ source: 'default', path: '' })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await expect(l.loadSae({ source: 'a/b', path: '../x' })).rejects.toMatchObject({ code: 'BAD_INPUT' });
  });
});

describe('descriptions in Neuronpedia layouts', () => {
  it('gzipped JSON Lines (the S3 export) from a URL, {"explanations": …} inline, first explanation wins', async () => {
    const lines = [
      {
        modelId: 'induction-gpt2',
        layer: '0-res-test',
        index: '3',
        description: 'third',
        explanationModelName: 'm',
        typeName: 't',
      },
      { modelId: 'induction-gpt2', layer: '0-res-test', index: '3', description: 'a later explanation of 3' },
      { modelId: 'induction-gpt2', layer: '0-res-test', index: 5, description: '' },
    ]
      .map((r) => JSON.stringify(r))
      .join('\n');
    hub.addFile('acme/explanations', 'v1/batch-0.jsonl.gz', gzipSync(new TextEncoder().encode(lines)));
    const l = createNodeSaeLoaders({ cache: false, endpoint: hub.url });
    const model = await freshModel();
    const url = `${hub.url}/acme/explanations/resolve/main/v1/batch-0.jsonl.gz`;
    const d = await operations.feature.run(
      model,
      { prompt: 'abc', sae_source: REPO, sae_path: BARE_PATH, feature: 3, descriptions: url },
      ctxOf(l),
    );
    expect(d.feature.description).toBe('third');
    expect(d.descriptions).toMatchObject({ source: url, format: 'jsonl', gzip: true, records: 3, count: 1 });
    const d5 = await operations.feature.run(
      model,
      { prompt: 'abc', sae_source: REPO, sae_path: BARE_PATH, feature: 5, descriptions: url },
      ctxOf(l),
    );
    expect(d5.feature.description).toBeNull(); // an empty description is no description
    // a single feature's API answer
    const one = parseDescriptions(
      {
        modelId: 'm',
        layer: 'l',
        index: '7',
        explanations: [{ description: 'seven', explanationModelName: 'x', typeName: 'y' }],
      },
      'inline',
    );
    expect(one.byFeature.get(7)).toEqual({ description: 'seven', explanation_model: 'x', type: 'y' });
    expect(one.format).toBe('json_object');
  });

  it('refuses malformed files and files of another Neuronpedia SAE', () => {
    expect(() => parseDescriptions('{"nope": 1}', 'x')).toThrow(/explanation records/);
    expect(() => parseDescriptions('[{"description": "no index"}]', 'x')).toThrow(/index/);
    expect(() => parseDescriptions('not json\nat all', 'x')).toThrow(/line 1/);
    const set = parseDescriptions([{ modelId: 'gpt2-small', layer: '6-res-jb', index: '1', description: 'a' }], 'x');
    expect(() => checkDescriptions(set, { d_sae: 10, neuronpedia_id: 'gpt2-small/8-res-jb' }, 'x')).toThrow(/8-res-jb/);
    expect(() => checkDescriptions(set, { d_sae: 10, neuronpedia_id: 'gpt2-small/6-res-jb' }, 'x')).not.toThrow();
    expect(() => checkDescriptions(set, { d_sae: 1 }, 'x')).toThrow(/only 1 features/);
  });
});
