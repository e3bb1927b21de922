/**
 * The real Hub's habits, mimicked on 127.0.0.1: X-Repo-Commit names the commit a branch resolved
 * to (documents and share links carry it, and a load fetches every file at that commit), LFS files
 * answer with a 302 to a CDN on another origin (Range and no token across it; the CDN's headers
 * speak for no commit), refusals name the token, and a branch that moves leaves old commits
 * loadable.
 */
import 'fake-indexeddb/auto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LoupeError } from '../src/engine/errors';
import { loadModelFiles } from '../src/engine/source/files';
import { HubSource } from '../src/engine/source/hub-source';
import { IdbCache } from '../src/engine/source/idb-cache';
import { planModel } from '../src/engine/source/preflight';
import { decodeShare, encodeShare } from '../src/share/codec';
import { DirCache } from '../src/node/dir-cache';
import { loadModelNode } from '../src/node/load';
import { operations } from '../src/ops/index';
import { startHubServer, type HubServer } from './helpers/hub-server';
import { shardModel } from './helpers/safetensors-writer';
import { SHARED } from './helpers/shared';

const GPT2 = SHARED + '/models/induction-gpt2';
const tmp = mkdtempSync(path.join(tmpdir(), 'loupe-commit-'));
const sharded = path.join(tmp, 'sharded');
let hub: HubServer;
let cdn: HubServer;

beforeAll(async () => {
  shardModel(GPT2, sharded, 2);
  hub = await startHubServer();
  cdn = await startHubServer();
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

describe('X-Repo-Commit', () => {
  it('a load records the commit; after main moves, a cached load still names the old one and a load by that commit gets the old files', async () => {
    hub.addRepo('c/moving', GPT2);
    const first = hub.commitOf('c/moving');
    const cache = new IdbCache({ dbName: `commit-${Math.random()}` });
    const a = await loadModelFiles(new HubSource('c/moving', { endpoint: hub.url }), { cache });
    expect(a.commit).toBe(first);
    expect(a.weightFiles).toEqual(['model.safetensors']);

    const second = hub.moveRevision('c/moving', sharded);
    expect(second).not.toBe(first);
    // cached: no request, and the commit is the one the cached bytes came from
    hub.resetCounters();
    const b = await loadModelFiles(new HubSource('c/moving', { endpoint: hub.url }), { cache });
    expect(hub.log).toEqual([]);
    expect(b.commit).toBe(first);
    // main itself now serves the sharded snapshot
    const c = await loadModelFiles(new HubSource('c/moving', { endpoint: hub.url }));
    expect(c.commit).toBe(second);
    expect(c.weightFiles).toHaveLength(2);
    // the old commit, asked for by name, is still the single-file snapshot
    hub.resetCounters();
    const d = await loadModelFiles(new HubSource('c/moving', { endpoint: hub.url, revision: first }));
    expect(d.commit).toBe(first);
    expect(d.weightFiles).toEqual(['model.safetensors']);
    expect(hub.log.every((r) => r.revision === first)).toBe(true);
  });

  it('one load fetches every file at the commit config.json resolved to, even if main moves meanwhile', async () => {
    hub.addRepo('c/race', GPT2);
    const first = hub.commitOf('c/race');
    const src = new HubSource('c/race', { endpoint: hub.url });
    const plan = await planModel(src);
    expect(plan.commit).toBe(first);
    hub.moveRevision('c/race', sharded);
    hub.resetCounters();
    const files = await loadModelFiles(src);
    expect(files.weightFiles).toEqual(['model.safetensors']);
    expect(files.commit).toBe(first);
    expect(hub.log.every((r) => r.revision === first)).toBe(true);
  });

  it('documents carry the commit (CLI path: loadModelNode + an operation)', async () => {
    hub.addRepo('c/doc', GPT2);
    const model = await loadModelNode('c/doc', { endpoint: hub.url, cache: new DirCache(path.join(tmp, 'doc-cache')) });
    try {
      expect(model.info.commit).toBe(hub.commitOf('c/doc'));
      const doc = (await operations.trace.run(model, { prompt: 'abcab' }, {})) as {
        model: { commit?: string; revision: string };
      };
      expect(doc.model.revision).toBe('main');
      expect(doc.model.commit).toBe(hub.commitOf('c/doc'));
    } finally {
      await model.dispose();
    }
  });

  it('share links keep a well-formed commit and drop anything else', () => {
    const commit = 'a'.repeat(40);
    const state = {
      v: 1 as const,
      model: { kind: 'hub' as const, id: 'o/m', revision: 'main', commit },
      op: 'trace',
      input: { prompt: 'x' },
    };
    expect(decodeShare(encodeShare(state).text).model).toEqual({ kind: 'hub', id: 'o/m', revision: 'main', commit });
    const bad = { ...state, model: { ...state.model, commit: 'not-a-commit' } };
    expect(decodeShare(encodeShare(bad).text).model).toEqual({ kind: 'hub', id: 'o/m', revision: 'main' });
  });
});

describe('302 to a CDN origin', () => {
  it("weights come from the CDN with Range and no token; the commit is the Hub's, not the CDN's", async () => {
    hub.addRepo('c/lfs', GPT2, { token: 'hf_ok' });
    cdn.addRepo('cdn/lfs', GPT2);
    hub.redirect('c/lfs', 'model.safetensors', `${cdn.url}/cdn/lfs/resolve/main/model.safetensors`);
    cdn.resetCounters();
    const files = await loadModelFiles(new HubSource('c/lfs', { endpoint: hub.url, token: 'hf_ok' }));
    expect(files.commit).toBe(hub.commitOf('c/lfs'));
    expect(files.commit).not.toBe(cdn.commitOf('cdn/lfs'));
    const ranges = cdn.log.map((r) => r.range);
    expect(ranges).toHaveLength(3);
    expect(ranges[0]).toBe('bytes=0-7');
    expect(ranges[2]).toMatch(/^bytes=\d+-$/);
    expect(cdn.log.every((r) => r.authorization === '' && r.status === 206)).toBe(true);
  });
});

describe('refusals name the token', () => {
  it('401 without a token and with a wrong one: HTTP_ERROR whose hint says where a token goes', async () => {
    hub.addRepo('c/gated', GPT2, { token: 'hf_right' });
    const none = await failure(loadModelFiles(new HubSource('c/gated', { endpoint: hub.url })));
    expect(none.code).toBe('HTTP_ERROR');
    expect((none.details as { status: number }).status).toBe(401);
    expect(none.hint).toMatch(/HF_TOKEN/);
    expect(none.hint).toMatch(/Access token field/);
    const wrong = await failure(loadModelFiles(new HubSource('c/gated', { endpoint: hub.url, token: 'hf_wrong' })));
    expect(wrong.hint).toMatch(/token given was refused/);
    hub.fault('c/gated', 'config.json', { status: 403 });
    const forbidden = await failure(loadModelFiles(new HubSource('c/gated', { endpoint: hub.url, token: 'hf_right' })));
    expect(forbidden.code).toBe('HTTP_ERROR');
    expect(forbidden.hint).toMatch(/access token was refused/);
  });
});
