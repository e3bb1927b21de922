/**
 * Issue 9, item 2: callers over MCP name no local path, unless the companion's user allowed a
 * folder with --allow-local DIR; and the refusal is the same whether the path exists or not.
 * Runs the headless executor in this process (the MCP server hands it the tool's arguments as
 * they came).
 */
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HeadlessExecutor } from '../src/bridge/headless';
import { parseMcpArgs, UsageError } from '../src/bridge/main';
import { toLoupeError } from '../src/engine/errors';
import { allowLocal } from '../src/node/local-access';
import { makeRandomSae, type RandomSae } from './helpers/random-sae';

const SAE_HOOK = 'blocks.2.hook_resid_pre';
let sae: RandomSae;
let outside: string;
let allowed: string;
let closed: HeadlessExecutor;
let open: HeadlessExecutor;

async function err(ex: HeadlessExecutor, tool: string, args: Record<string, unknown>) {
  const e = await ex.execute(tool, args, { deadline: Date.now() + 60_000 }).then(
    () => undefined,
    (x) => toLoupeError(x),
  );
  return e ? { code: e.code, message: e.message, hint: e.hint } : undefined;
}

beforeAll(() => {
  sae = makeRandomSae({ hook: SAE_HOOK, dIn: 64, dSae: 32, seed: 3, modelName: 'stories260K' });
  outside = mkdtempSync(path.join(os.tmpdir(), 'loupe-private-'));
  writeFileSync(path.join(outside, 'secret.jsonl'), '{"index": "SECRET-LINE", "description": "private"}\n');
  allowed = mkdtempSync(path.join(os.tmpdir(), 'loupe-allowed-'));
  mkdirSync(path.join(allowed, 'sae'));
  for (const f of ['cfg.json', 'sae_weights.safetensors'])
    symlinkSync(path.join(sae.dir, f), path.join(allowed, 'sae', f));
  writeFileSync(path.join(allowed, 'desc.json'), JSON.stringify([{ index: '3', description: 'feature three' }]));
  symlinkSync(path.join(outside, 'secret.jsonl'), path.join(allowed, 'leak.jsonl'));
  closed = new HeadlessExecutor({});
  // the SAE's files are symlinks to another temp folder: allow that folder too
  open = new HeadlessExecutor({ local: allowLocal([allowed, sae.dir]) });
});
afterAll(async () => {
  await closed?.close();
  await open?.close();
  for (const d of [sae.dir, outside, allowed]) rmSync(d, { recursive: true, force: true });
});

describe('local paths over MCP (headless)', () => {
  it('without --allow-local: load_model, sae_source and descriptions refuse every local path, the same way whether it exists or not', async () => {
    const existing = [
      outside,
      path.join(outside, 'secret.jsonl'),
      '/etc',
      sae.dir,
      `file://${sae.dir}`,
      './node_modules',
      '~',
    ];
    const missing = [
      path.join(outside, 'nope'),
      '/no/such/dir',
      `file:///no/such/dir`,
      './no-such-dir',
      '~/no-such-dir',
    ];
    const shapes: [string, (p: string) => Record<string, unknown>][] = [
      ['load_model', (p) => ({ model: p })],
      ['sae_features', (p) => ({ prompt: 'Once upon a time', sae_source: p, sae_path: '' })],
      ['feature', (p) => ({ prompt: 'Once', sae_source: p, feature: 0 })],
      ['sae_steer', (p) => ({ prompt: 'Once', sae_source: p, feature: 0, alpha: 1 })],
    ];
    for (const [tool, args] of shapes) {
      const norm = (p: string, e: { code: string; message: string; hint?: string } | undefined) => ({
        ...e,
        message: e?.message.replace(JSON.stringify(p), '<p>'),
      });
      const seen = new Set<string>();
      for (const p of [...existing, ...missing]) {
        const e = await err(closed, tool, args(p));
        expect(e?.code, `${tool} ${p}`).toBe('LOCAL_PATH_REFUSED');
        seen.add(JSON.stringify(norm(p, e)));
      }
      expect([...seen], tool).toHaveLength(1);
    }
  });

  it('without --allow-local: a descriptions path is refused before anything is read (no line of the file comes back)', async () => {
    // a Hub-less SAE source is needed to reach the descriptions: allow only the SAE's own folder
    const saeOnly = new HeadlessExecutor({ local: allowLocal([sae.dir]) });
    try {
      for (const p of [
        path.join(outside, 'secret.jsonl'),
        path.join(outside, 'nope.jsonl'),
        '/etc/passwd',
        '/etc/nope',
      ]) {
        const e = await err(saeOnly, 'sae_features', {
          prompt: 'Once upon a time',
          sae_source: sae.dir,
          descriptions: p,
        });
        expect(e?.code, p).toBe('LOCAL_PATH_REFUSED');
        expect(JSON.stringify(e)).not.toContain('SECRET');
        expect(JSON.stringify(e)).not.toContain('root:');
      }
    } finally {
      await saeOnly.close();
    }
  });

  it('with --allow-local DIR: folders inside DIR work; symlinks out of it and paths beside it are refused', async () => {
    const ok = await open.execute(
      'sae_features',
      {
        prompt: 'Once upon a time',
        sae_source: path.join(allowed, 'sae'),
        descriptions: path.join(allowed, 'desc.json'),
        top_k: 3,
      },
      { deadline: Date.now() + 60_000 },
    );
    expect((ok.document as { descriptions: { count: number } }).descriptions.count).toBe(1);
    const leak = await err(open, 'sae_features', {
      prompt: 'Once upon a time',
      sae_source: path.join(allowed, 'sae'),
      descriptions: path.join(allowed, 'leak.jsonl'),
    });
    expect(leak?.code).toBe('LOCAL_PATH_REFUSED');
    expect(JSON.stringify(leak)).not.toContain('SECRET');
    expect((await err(open, 'load_model', { model: outside }))?.code).toBe('LOCAL_PATH_REFUSED');
    expect((await err(open, 'load_model', { model: path.join(allowed, '..', path.basename(outside)) }))?.code).toBe(
      'LOCAL_PATH_REFUSED',
    );
    // inside an allowed folder, a missing file is reported as missing (the user allowed that folder)
    expect((await err(open, 'sae_features', { prompt: 'Once', sae_source: path.join(allowed, 'none') }))?.code).toMatch(
      /NOT_FOUND/,
    );
  });

  it('--allow-local is a headless flag that needs a folder', () => {
    expect(parseMcpArgs(['mcp', '--headless', '--allow-local', '/tmp', '--allow-local=/var']).allowLocal).toEqual([
      '/tmp',
      '/var',
    ]);
    expect(() => parseMcpArgs(['mcp', '--allow-local', '/tmp'])).toThrow(UsageError);
    expect(() => parseMcpArgs(['mcp', '--headless', '--allow-local'])).toThrow(UsageError);
    expect(parseMcpArgs(['mcp', '--headless']).allowLocal).toEqual([]);
  });
});
