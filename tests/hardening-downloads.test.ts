/**
 * Issue 22, downloads bounded by the plan and by time: each case here failed before its fix (the
 * load succeeded with more bytes than the plan, cached a file that failed its check, waited
 * forever, or ended in INTERNAL). A hostile Hub stand-in on 127.0.0.1 (tests/helpers/hostile-hub.ts)
 * serves the attacks; every load reads through a DirCache in a fresh folder, whose size is then
 * compared with what the plan judged.
 */
import { mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { toLoupeError, type LoupeError } from '../src/engine/errors';
import { CAPS } from '../src/engine/caps';
import { makeSaeLoaders } from '../src/engine/source/sae-loader';
import { HubSource } from '../src/engine/source/hub-source';
import { DirCache } from '../src/node/dir-cache';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { loadModelNode } from '../src/node/load';
import { startHostileHub, type HostileHub } from './helpers/hostile-hub';
import { SHARED } from './helpers/shared';

let hub: HostileHub;
const dirs: string[] = [];
const fresh = () => {
  const d = mkdtempSync(path.join(os.tmpdir(), 'loupe-dl-'));
  dirs.push(d);
  return d;
};
/** bytes under a folder, every file (complete, .partial, metadata) */
const du = (d: string): number =>
  readdirSync(d, { withFileTypes: true }).reduce(
    (n, e) => n + (e.isDirectory() ? du(path.join(d, e.name)) : statSync(path.join(d, e.name)).size),
    0,
  );
const filesUnder = (d: string): string[] =>
  readdirSync(d, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? filesUnder(path.join(d, e.name)) : [decodeURIComponent(e.name)],
  );
const failure = (p: Promise<unknown>): Promise<LoupeError> =>
  p.then(
    () => {
      throw new Error('expected the load to fail');
    },
    (e) => toLoupeError(e),
  );
const STORIES = () => path.join(SHARED, 'models/stories260K');
const SIZE = () => statSync(path.join(STORIES(), 'model.safetensors')).size;

beforeAll(async () => {
  hub = await startHostileHub(STORIES());
  process.env.LOUPE_IDLE_TIMEOUT = '2';
  process.env.LOUPE_REQUEST_DEADLINE = '3';
});
afterAll(async () => {
  delete process.env.LOUPE_IDLE_TIMEOUT;
  delete process.env.LOUPE_REQUEST_DEADLINE;
  await hub?.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const load = (id: string, cache: string | false) =>
  loadModelFilesNode(id, { endpoint: hub.url, cache: cache === false ? false : new DirCache(cache), retries: 0 });

describe('a weight file may not exceed the size the plan judged (failure 6)', () => {
  for (const kind of ['gzip-weights', 'chunked-weights']) {
    for (const cache of [true, false]) {
      it(`${kind}: 200 to the resume, ${cache ? 'into the DirCache' : 'in memory'}`, async () => {
        const d = fresh();
        const e = await failure(load(`attack/${kind}-3000000`, cache ? d : false));
        expect(e.code).toBe('TOO_LARGE');
        expect(e.details).toMatchObject({ file: 'model.safetensors', maxBytes: SIZE() });
        // nothing of the weights is kept (the partial entry was deleted); the small files are
        expect(filesUnder(d).filter((f) => f.startsWith('model.safetensors'))).toEqual([]);
        expect(du(d)).toBeLessThan(SIZE());
      });
    }
  }
  it('Content-Length 2^50 is TOO_LARGE, not "Invalid typed array length"', async () => {
    for (const cache of [fresh(), false] as const) {
      const e = await failure(load('attack/huge-length', cache));
      expect([e.code, e.details]).toMatchObject(['TOO_LARGE', { bytes: 2 ** 50 }]);
    }
  });
  it('the honest model still loads, and its cache holds exactly the plan', async () => {
    const d = fresh();
    const f = await load('attack/plain', d);
    expect(f.weights.tensors.size).toBeGreaterThan(10);
    const weights = filesUnder(d).filter((x) => x.startsWith('model.safetensors'));
    expect(weights).toEqual(['model.safetensors', 'model.safetensors@sha256']);
  });
});

describe('small files are read with a hard cap and validated before they are cached (failure 7)', () => {
  it('a gzip bomb of config.json (300 MB decoded from 300 KB) is TOO_LARGE and leaves nothing', async () => {
    const d = fresh();
    const before = process.memoryUsage().rss;
    const e = await failure(load('attack/gzip-config-300000000', d));
    expect([e.code, e.details]).toMatchObject(['TOO_LARGE', { file: 'config.json', maxBytes: CAPS.maxConfigBytes }]);
    expect(process.memoryUsage().rss - before).toBeLessThan(200 * 1024 ** 2);
    expect(filesUnder(d)).toEqual([]);
  });
  it('a gzip bomb of tokenizer.json past its cap', async () => {
    const d = fresh();
    const e = await failure(load(`attack/gzip-tokenizer-${CAPS.maxTokenizerBytes + (8 << 20)}`, d));
    expect([e.code, e.details]).toMatchObject(['TOO_LARGE', { file: 'tokenizer.json' }]);
    expect(filesUnder(d).filter((f) => f.startsWith('tokenizer.json'))).toEqual([]);
  });
  it('a config.json that is not JSON is not kept, so the next load asks again', async () => {
    const d = fresh();
    expect((await failure(load('attack/badjson', d))).code).toBe('BAD_CONFIG');
    expect(filesUnder(d).filter((f) => f.startsWith('config.json'))).toEqual([]);
  });
  it('a tokenizer.json whose regex backtracks exponentially is refused before it is cached', async () => {
    const d = fresh();
    expect((await failure(load('attack/regex', d))).code).toBe('UNSUPPORTED_CONFIG');
    expect(filesUnder(d).filter((f) => f.startsWith('tokenizer.json'))).toEqual([]);
  });
});

describe('sharded headers are bounded by count and total bytes before they are read (failure 2)', () => {
  it('20 shards with 10 MB headers each: TOO_LARGE once 128 MiB of headers were counted', async () => {
    const d = fresh();
    const e = await failure(load('attack/shards-20-10000000', d));
    expect(e.code).toBe('TOO_LARGE');
    expect(e.message).toContain('maxHeaderBytesTotal');
    expect(du(d)).toBeLessThan(CAPS.maxHeaderBytesTotal + 16 * 1024 ** 2);
  });
  it('an index naming more shards than the limit is TOO_LARGE before any header', async () => {
    const id = `attack/shards-${CAPS.maxShards + 1}-0`;
    const e = await failure(load(id, fresh()));
    expect([e.code, e.message.includes('maxShards')]).toEqual(['TOO_LARGE', true]);
    // this repository's requests only: the test before's aborted header reads can be logged late
    expect(hub.log.filter((r) => r.id === id && r.file.startsWith('model-'))).toEqual([]);
  });
});

describe('every request has an idle timeout and a deadline (failure 10)', () => {
  it('a config.json that trickles a byte every 300 ms fails at its deadline', async () => {
    const t0 = Date.now();
    const e = await failure(load('attack/trickle-300', fresh()));
    expect(e.code).toBe('DEADLINE_EXCEEDED');
    expect(Date.now() - t0).toBeLessThan(15_000);
  });
  it('a server that stops sending fails after the idle timeout', async () => {
    const t0 = Date.now();
    const e = await failure(load('attack/stall', fresh()));
    expect(e.code).toBe('NETWORK_ERROR');
    expect(e.message).toContain('No byte');
    expect(Date.now() - t0).toBeLessThan(15_000);
  });
});

describe('an SAE is judged by its weights header, not its cfg.json alone (failure 8)', () => {
  const loaders = (d: string) =>
    makeSaeLoaders(() => ({ source: new HubSource(SRC, { endpoint: hub.url, retries: 0 }), cache: new DirCache(d) }));
  let SRC = '';
  it('cfg.json says 64×16, the header holds 200 MB of W_enc: refused before a weight byte', async () => {
    const d = fresh();
    SRC = 'attack/sae-header-200000000';
    hub.log.length = 0;
    const e = await failure(loaders(d).loadSae({ source: SRC, path: '' }));
    expect(['SAE_MISMATCH', 'TOO_LARGE']).toContain(e.code);
    const weightReqs = hub.log.filter((r) => r.file === 'sae_weights.safetensors');
    expect(weightReqs.every((r) => /^bytes=\d+-\d+$/.test(r.range))).toBe(true);
    expect(du(d)).toBeLessThan(1 << 20);
  });
  it('an honest small header whose body runs 20 MB past it: TOO_LARGE, nothing kept', async () => {
    const d = fresh();
    SRC = 'attack/sae-body-20000000';
    const e = await failure(loaders(d).loadSae({ source: SRC, path: '' }));
    expect(e.code).toBe('TOO_LARGE');
    expect(filesUnder(d).filter((f) => f.startsWith('sae_weights'))).toEqual([]);
  });
});

describe('structured errors for the minor cases', () => {
  it('I32 weights are refused from the headers, before the download', async () => {
    hub.log.length = 0;
    const e = await failure(loadModelNode('attack/i32', { endpoint: hub.url, cache: new DirCache(fresh()) } as never));
    expect(e.code).toBe('SAFETENSORS_UNKNOWN_DTYPE');
    // only the header's two range reads touched the weights
    expect(hub.log.filter((r) => r.file === 'model.safetensors').map((r) => /^bytes=\d+-\d+$/.test(r.range))).toEqual([
      true,
      true,
    ]);
  });
  it("a revision of '.', '..' or over 200 characters is BAD_INPUT before any request", async () => {
    for (const rev of ['.', '..', 'r'.repeat(300)]) {
      hub.log.length = 0;
      const e = await failure(load(`attack/plain@${rev}`, fresh()));
      expect(e.code).toBe('BAD_INPUT');
      expect(hub.log).toEqual([]);
    }
  });
});
