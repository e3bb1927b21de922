/**
 * Issue 39, F5–F8: work a model repository, a cache or a compressed file can make the engine do,
 * bounded at its cause. Each case failed before its fix (a hang, silently different numbers, or
 * memory far past a cap) and is refused fast with a structured error on the fixed code.
 */
import { execFileSync } from 'node:child_process';
import zlib from 'node:zlib';
import { createHash } from 'node:crypto';
import {
  copyFileSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  closeSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  symlinkSync,
  utimesSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, describe, expect, it, vi } from 'vitest';
import { renderChat } from '../src/engine/chat';
import { LoupeError, toLoupeError } from '../src/engine/errors';
import { DirCache } from '../src/node/dir-cache';
import { loadModelNode } from '../src/node/load';
import { nodeDocumentCache } from '../src/node/document-cache';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { startHostileHub } from './helpers/hostile-hub';
import { readSafetensorsHeaderFromDisk } from '../src/node/load-files-node';
import { CAPS } from '../src/engine/caps';
import { parseDescriptions } from '../src/ops/lib/feature-descriptions';
import { bomb } from './helpers/inflate-bomb';
import { SHARED } from './helpers/shared';

const STORIES = path.join(SHARED, 'models/stories260K');
const MODEL_FILES = ['config.json', 'tokenizer.json', 'tokenizer_config.json', 'model.safetensors'];
const tmp = mkdtempSync(path.join(os.tmpdir(), 'loupe-hostile-inputs-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** a copy of stories260K in a new folder under tmp */
function modelCopy(name: string, dir = path.join(tmp, name)): string {
  mkdirSync(dir, { recursive: true });
  for (const f of MODEL_FILES) copyFileSync(path.join(STORIES, f), path.join(dir, f));
  return dir;
}
const mkfifo = (p: string) => {
  rmSync(p, { force: true });
  execFileSync('mkfifo', [p]);
};
/** the structured error a promise rejects with, and how long it took */
async function refusal(p: Promise<unknown>): Promise<{ code: string; message: string; ms: number }> {
  const t0 = performance.now();
  try {
    await p;
  } catch (e) {
    const l = toLoupeError(e);
    return { code: l.code, message: l.message, ms: performance.now() - t0 };
  }
  throw new Error('expected a refusal');
}

/** the LoupeError a function throws (fails the test when it returns) */
function errorOf(f: () => unknown): LoupeError {
  try {
    f();
  } catch (e) {
    if (e instanceof LoupeError) return e;
    throw e;
  }
  throw new Error('expected a LoupeError');
}

describe('F5: a chat template is charged for its work, not its evaluations', () => {
  const render = (chat_template: string) => renderChat({ chat_template, bos_token: '<s>' }, 'hi');
  const stopped = (tpl: string, why: RegExp = /more steps/) => {
    const t0 = performance.now();
    const e = errorOf(() => render(tpl));
    expect([e.code, why.test(e.message)]).toEqual(['BAD_CHAT_TEMPLATE', true]);
    // well inside the deadline on an idle machine (0.3–0.5 s); the bound is for a loaded one
    expect(performance.now() - t0).toBeLessThan(10_000);
  };
  afterEach(() => vi.restoreAllMocks());

  it('nested empty loops (1e9 iterations ran with no step counted; 8 M took 32 s)', () => {
    stopped(
      '{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}' +
        '{% endfor %}{% endfor %}{% endfor %}x',
    );
    stopped('{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}');
  });
  it('a loop that breaks at once, over a long list, in a loop; a filtered loop that keeps nothing', () => {
    stopped('{% set l = range(150000) %}{% for a in l %}{% for b in l %}{% break %}{% endfor %}{% endfor %}');
    stopped('{% for a in range(1000) %}{% for b in range(1000) if false %}{% endfor %}{% endfor %}');
  });
  it('a macro that calls itself twice, 40 deep; a big list sorted in a loop', () => {
    stopped('{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(40) }}');
    stopped('{% set l = range(150000) %}{% for a in range(100000) %}{% set x = l|sort %}{% endfor %}');
  });
  it('the deadline stops a rendering whatever its steps', () => {
    let t = Date.now();
    vi.spyOn(Date, 'now').mockImplementation(() => (t += 1000));
    stopped('{% for a in range(10) %}{{ a }}{% endfor %}', /deadline of \d+ s/);
  });
  it('a real template still renders', () => {
    const tpl =
      "{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + " +
      "message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}" +
      "{{ '<|im_start|>assistant\\n' }}{% endif %}";
    expect(render(tpl)).toBe('<s><|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n');
  });
});

describe('F6: only regular files are opened from a model folder or the cache (a FIFO hung the CLI)', () => {
  for (const f of ['model.safetensors', 'config.json', 'tokenizer.json']) {
    it(`a named pipe as a folder's ${f}: NOT_A_FILE at once`, async () => {
      const dir = modelCopy(`fifo-${f}`);
      mkfifo(path.join(dir, f));
      const r = await refusal(loadModelNode(dir));
      expect([r.code, r.message.includes('named pipe')]).toEqual(['NOT_A_FILE', true]);
      expect(r.ms).toBeLessThan(5000);
    }, 10_000);
  }
  it('the cache: a FIFO entry, a FIFO partial download, a link out of the cache', async () => {
    const root = path.join(tmp, 'cache');
    const cache = new DirCache(root);
    const key = (file: string) => ({ endpoint: 'https://hub.test', id: 'o/m', revision: 'main', file });
    await cache.put(key('x.json'), new Uint8Array([1]));
    const dir = path.dirname(cache.localPath(key('x.json'))!);
    mkfifo(path.join(dir, 'config.json'));
    mkfifo(path.join(dir, 'model.safetensors'));
    const codes = [
      (await refusal(cache.get(key('config.json')))).code,
      (await refusal(cache.readRange(key('model.safetensors'), 0, 8))).code,
      (await refusal(Promise.resolve().then(() => cache.localPath(key('model.safetensors'))))).code,
      (
        await refusal(
          Promise.resolve().then(() => readSafetensorsHeaderFromDisk(path.join(dir, 'model.safetensors'), 'm')),
        )
      ).code,
    ];
    expect(codes).toEqual(['NOT_A_FILE', 'NOT_A_FILE', 'NOT_A_FILE', 'NOT_A_FILE']);
    // a link to a file outside the cache is refused; one inside it is read
    symlinkSync(path.join(STORIES, 'config.json'), path.join(dir, 'out.json'));
    symlinkSync(path.join(dir, 'x.json'), path.join(dir, 'in.json'));
    expect((await refusal(cache.get(key('out.json')))).message).toMatch(/outside the cache/);
    expect(cache.localPath(key('in.json'))).toBe(path.join(dir, 'in.json'));
    // a FIFO where a partial download goes is not ours: the download starts over in a regular file
    mkfifo(path.join(dir, 'w.bin.partial'));
    const sink = await cache.openSink(key('w.bin'));
    sink.append(new Uint8Array([7, 8]));
    await sink.commit();
    expect(await cache.get(key('w.bin'))).toEqual(new Uint8Array([7, 8]));
  }, 10_000);
});

describe('F8: compressed input is inflated in slices and stops at its cap', () => {
  it('the bombs are what they say (a valid gzip of 16 MiB of zeros; a small real file still reads)', () => {
    expect(zlib.gunzipSync(bomb(16, true)).byteLength).toBe(16 << 20);
    const gz = zlib.gzipSync(JSON.stringify([{ index: '3', description: 'dates' }]));
    expect(parseDescriptions(new Uint8Array(gz), 'a file').byFeature.get(3)?.description).toBe('dates');
  });
  it('1 GiB of zeros as a share link and as SAE descriptions: refused, peak RSS near the cap (was 3.2 GB)', () => {
    const out = execFileSync(
      process.execPath,
      ['--import', 'tsx', path.join(__dirname, 'helpers/inflate-bomb.ts'), 'run'],
      {
        encoding: 'utf8',
        timeout: 60_000,
      },
    );
    const r = JSON.parse(out.trim().split('\n').at(-1)!) as Record<string, { code: string; growth_mib: number }>;
    expect([r.link.code, r.descriptions.code]).toEqual(['BAD_INPUT', 'TOO_LARGE']);
    // the output kept up to the cap, and its copy into one buffer, plus a slice's output and slack
    expect(r.link.growth_mib).toBeLessThan(CAPS.maxLinkJsonBytes / 2 ** 20 + 64);
    expect(r.descriptions.growth_mib).toBeLessThan(CAPS.maxDescriptionsBytes / 2 ** 20 + 128);
  }, 60_000);
});

describe('F7: a cached file answers to its record (key and SHA-256), not its path', () => {
  const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');
  /** the cache folder of a repository: <root>/<endpoint>/<id>, as dir-cache.ts names it */
  const repoDir = (root: string, endpoint: string, id: string) =>
    path.join(root, encodeURIComponent(endpoint), encodeURIComponent(id));
  /** the one revision folder under a repository's */
  const revDir = (d: string) => path.join(d, readdirSync(d)[0]);

  it('flipped weights, an edited tokenizer, a folder linked to another model (the hostile Hub stand-in)', async () => {
    const hub = await startHostileHub(STORIES);
    try {
      const root = path.join(tmp, 'f7-cache');
      const load = (id: string) => loadModelFilesNode(id, { endpoint: hub.url, cache: new DirCache(root), retries: 0 });
      await load('attack/plain');
      const dir = revDir(repoDir(root, hub.url, 'attack/plain'));

      // the tokenizer's normalizer edited: the read hashes it, finds other bytes, and fetches it again
      const tok = path.join(dir, 'tokenizer.json');
      const honest = readFileSync(tok);
      writeFileSync(tok, honest.toString('utf8').replace('"normalizer":', '"normalizer": null, "x":'));
      const before = hub.log.length;
      await load('attack/plain');
      expect(hub.log.slice(before).map((r) => r.file)).toContain('tokenizer.json');
      expect(sha(readFileSync(tok))).toBe(sha(honest));

      // 4 KiB of the weights flipped in place (same size): CACHE_MISMATCH, not other logits
      const w = path.join(dir, 'model.safetensors');
      const size = statSync(w).size;
      const bytes = readFileSync(w).subarray(size - 8192, size - 4096);
      const fd = openSync(w, 'r+');
      writeSync(
        fd,
        bytes.map((b) => b ^ 0xff),
        0,
        4096,
        size - 8192,
      );
      closeSync(fd);
      const flipped = await refusal(load('attack/plain'));
      expect([flipped.code, /other bytes than were downloaded/.test(flipped.message)]).toEqual([
        'CACHE_MISMATCH',
        true,
      ]);
      // with its mtime put back, a load trusts the size/mtime/inode check; --verify-cache hashes it
      const { atime, mtime } = statSync(w);
      utimesSync(w, atime, mtime);
      const report = await new DirCache(root).verify();
      expect(report.problems.map((p) => [path.basename(p.file), p.code])).toEqual([
        ['model.safetensors', 'CACHE_MISMATCH'],
      ]);

      // another repository's folder is a link to this one: its records name attack/plain
      symlinkSync(repoDir(root, hub.url, 'attack/plain'), repoDir(root, hub.url, 'attack/i32'));
      const linked = await refusal(load('attack/i32'));
      expect([linked.code, /recorded as .* of attack\/plain/.test(linked.message)]).toEqual(['CACHE_MISMATCH', true]);
    } finally {
      await hub.close();
    }
  }, 30_000);

  it('a document planted, copied from another key or edited reads as absent (it is computed again)', async () => {
    const root = path.join(tmp, 'f7-documents');
    const docs = nodeDocumentCache(root);
    await docs.put('dashboard', 'k1', { top: [1, 2, 3] });
    expect(await docs.get('dashboard', 'k1')).toEqual({ top: [1, 2, 3] });
    const dir = revDir(repoDir(root, 'loupe-documents', 'dashboard'));
    const file = (k: string) => path.join(dir, `${k}.json`);
    // a record for a file as the cache would write it, so only the document's own header can refuse it
    const recordFor = (k: string) => {
      const r = JSON.parse(readFileSync(file('k1') + '@sha256', 'utf8'));
      const st = statSync(file(k));
      const rec = { ...r, file: `${k}.json`, sha256: sha(readFileSync(file(k))), size: st.size, mtimeMs: st.mtimeMs };
      writeFileSync(file(k) + '@sha256', JSON.stringify({ ...rec, ino: st.ino }));
    };
    // planted: a document written as is, with a record of the right form
    writeFileSync(file('k2'), JSON.stringify({ top: [9] }));
    recordFor('k2');
    // copied from k1 (its header names k1), with a record of its own
    copyFileSync(file('k1'), file('k3'));
    recordFor('k3');
    // edited in place
    writeFileSync(file('k1'), readFileSync(file('k1'), 'utf8').replace('[1,2,3]', '[1,2,4]'));
    expect([
      await docs.get('dashboard', 'k2'),
      await docs.get('dashboard', 'k3'),
      await docs.get('dashboard', 'k1'),
    ]).toEqual([undefined, undefined, undefined]);
  });
});
