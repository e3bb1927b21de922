/**
 * The `loupe` command, spawned as a user would (node bin/loupe.mjs, from another directory):
 * every exit code, --json documents equal to calling the operation in-process and valid against
 * the published JSON Schema, help from the registry, schema export, doctor.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { execFile } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { operations, getOperation } from '../src/ops/index';
import { allSchemas, schemasOf } from '../src/ops/schemas';
import { schemaErrors, viaJson } from './schema-helpers';
import { SHARED } from './helpers/shared';

const BIN = resolve(__dirname, '../bin/loupe.mjs');
const INDUCTION = SHARED + '/models/induction-gpt2';

interface Result {
  code: number;
  stdout: string;
  stderr: string;
}

function loupe(args: string[], cwd = tmpdir()): Promise<Result> {
  return new Promise((res) => {
    execFile(
      process.execPath,
      [BIN, ...args],
      { cwd, maxBuffer: 64 << 20, env: { ...process.env, NO_COLOR: '1' } },
      (err, stdout, stderr) => {
        const code = err ? (typeof (err as any).code === 'number' ? (err as any).code : 1) : 0;
        res({ code, stdout, stderr });
      },
    );
  });
}

/** stdout of a --json call is exactly one JSON document */
function onlyJson(r: Result) {
  const lines = r.stdout.trim().split('\n');
  expect(lines).toHaveLength(1);
  return JSON.parse(lines[0]);
}

describe('loupe CLI', () => {
  let stories: LoadedModel;
  let induction: LoadedModel;
  let scratch: string;
  beforeAll(async () => {
    stories = await loadModelNode('default');
    induction = await loadModelNode(INDUCTION);
    scratch = mkdtempSync(join(tmpdir(), 'loupe-cli-'));
  });
  afterAll(async () => {
    await stories?.dispose();
    await induction?.dispose();
    rmSync(scratch, { recursive: true, force: true });
  });

  it('--help lists every registered operation (exit 0); no arguments is a usage error (exit 2)', async () => {
    const r = await loupe(['--help']);
    expect(r.code).toBe(0);
    for (const name of Object.keys(operations)) expect(r.stdout).toMatch(new RegExp(`^  ${name} `, 'm'));
    expect(r.stdout).toContain('doctor');
    const none = await loupe([]);
    expect(none.code).toBe(2);
  });

  it('<op> --help shows the fields of its input schema as flags', async () => {
    const r = await loupe(['trace', '--help']);
    expect(r.code).toBe(0);
    for (const f of [
      '--top-k',
      '--convention',
      '--answer',
      '--counterfactual',
      '--no-prepend-bos',
      '--json',
      '--backend',
      '--input',
    ])
      expect(r.stdout).toContain(f);
    const g = await loupe(['generate', '--help']);
    for (const f of ['--max-new-tokens', '--temperature', '--seed', '--top-p']) expect(g.stdout).toContain(f);
  });

  it('trace --json prints only the document, equal to the in-process call and valid against the schema; progress on stderr', async () => {
    const r = await loupe(['trace', 'default', 'Once upon a time', '--top-k', '5', '--json']);
    expect(r.code).toBe(0);
    const doc = onlyJson(r);
    expect(schemaErrors('trace', doc)).toEqual([]);
    const mine = viaJson(await getOperation('trace')!.run(stories, { prompt: 'Once upon a time', top_k: 5 }, {}));
    expect(doc).toEqual(mine);
    expect(doc.predicted_token).toBe(',');
    expect(r.stderr).toMatch(/trace: /);
  });

  it("generate on a folder model --json equals the in-process document (the issue's example)", async () => {
    const r = await loupe(['generate', INDUCTION, 'abcabc', '--max-new-tokens', '8', '--json']);
    expect(r.code).toBe(0);
    const doc = onlyJson(r);
    expect(schemaErrors('generate', doc)).toEqual([]);
    expect(doc).toEqual(
      viaJson(await getOperation('generate')!.run(induction, { prompt: 'abcabc', max_new_tokens: 8 }, {})),
    );
    expect(doc.generated_token_ids).toHaveLength(8);
  });

  it('generic flags: comma lists, --no- booleans, JSON values and --input merged over flags', async () => {
    const r = await loupe([
      'logit_lens',
      'default',
      'Once upon a time',
      '--positions',
      '1,4',
      '--top-k',
      '7',
      '--input',
      '{"top_k": 2}',
      '--json',
    ]);
    expect(r.code).toBe(0);
    const doc = onlyJson(r);
    expect(doc.positions).toEqual([1, 4]);
    expect(doc.layers[0].positions[0].top).toHaveLength(2);
    expect(doc).toEqual(
      viaJson(
        await getOperation('logit_lens')!.run(stories, { prompt: 'Once upon a time', positions: [1, 4], top_k: 2 }, {}),
      ),
    );
    const a = await loupe([
      'attention',
      INDUCTION,
      'abab',
      '--heads',
      '[{"layer":1,"head":2}]',
      '--no-prepend-bos',
      '--json',
    ]);
    expect(a.code).toBe(0);
    const ad = onlyJson(a);
    expect(ad.tokens.map((t: any) => t.id)).toEqual([97, 98, 97, 98]);
    expect(ad.heads.map((h: any) => [h.layer, h.head])).toEqual([[1, 2]]);
    expect(ad).toEqual(
      viaJson(
        await getOperation('attention')!.run(
          induction,
          { prompt: 'abab', heads: [{ layer: 1, head: 2 }], prepend_bos: false },
          {},
        ),
      ),
    );
  });

  it('tables by default', async () => {
    const r = await loupe(['trace', 'default', 'Once upon a time', '--top-k', '3']);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/predicted at position 4: "," \(#432\)/);
    expect(r.stdout).toMatch(/L\d+H\d+/);
    expect(() => JSON.parse(r.stdout)).toThrow();
  });

  it('exit 2 for usage errors, with a JSON error document under --json', async () => {
    const cases: string[][] = [
      ['frobnicate', 'default', 'x'],
      ['trace', 'default', 'x', '--bogus', '1'],
      ['trace', 'default', 'x', '--top-k', 'many'],
      ['trace', 'default', 'x', '--convention', 'folded'],
      ['trace', 'default'],
      ['trace'],
      ['trace', 'default', 'x', 'y'],
      ['trace', 'default', 'x', '--input', '{not json'],
      ['trace', 'default', 'x', '--backend', 'cuda'],
      ['schema', 'frobnicate'],
    ];
    for (const args of cases) {
      const r = await loupe([...args, '--json']);
      expect(r.code, args.join(' ')).toBe(2);
      expect(onlyJson(r).error.code).toBe('BAD_INPUT');
      expect(r.stderr).toMatch(/loupe: /);
    }
    const plain = await loupe(['trace', 'default', 'x', '--bogus', '1']);
    expect(plain.code).toBe(2);
    expect(plain.stdout).toBe('');
    expect(plain.stderr).toMatch(/Unknown option --bogus/);
    expect(plain.stderr).toMatch(/--top-k/);
  });

  it('exit 1 for runtime errors, as {error: {code, message, hint}}', async () => {
    const unk = await loupe(['trace', 'default', 'Once upon a time', '--answer', 'dragonfly', '--json']);
    expect(unk.code).toBe(1);
    const e = onlyJson(unk).error;
    expect(e.code).toBe('UNKNOWN_TOKEN');
    expect(e.hint).toMatch(/tokenizes as/);
    const long = await loupe(['generate', INDUCTION, 'a'.repeat(40), '--max-new-tokens', '40', '--json']);
    expect(long.code).toBe(1);
    expect(onlyJson(long).error.code).toBe('PROMPT_TOO_LONG');
    const missing = await loupe(['trace', join(scratch, 'nothing-here'), 'x', '--json']);
    expect(missing.code).toBe(1);
    expect(onlyJson(missing).error.code).toBe('MODEL_NOT_FOUND');
    const plain = await loupe(['trace', 'default', 'Once', '--answer', 'dragonfly']);
    expect(plain.code).toBe(1);
    expect(plain.stdout).toBe('');
    expect(plain.stderr).toMatch(/UNKNOWN_TOKEN/);
  });

  it('exit 3 for an unsupported model', async () => {
    const dir = join(scratch, 'bert');
    cpSync(INDUCTION, dir, { recursive: true });
    const cfg = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'));
    writeFileSync(
      join(dir, 'config.json'),
      JSON.stringify({ ...cfg, model_type: 'bert', architectures: ['BertModel'] }),
    );
    const r = await loupe(['trace', dir, 'hello', '--json']);
    expect(r.code).toBe(3);
    expect(onlyJson(r).error.code).toBe('UNSUPPORTED_ARCHITECTURE');
  });

  it('schema prints the published JSON Schemas', async () => {
    const one = await loupe(['schema', 'trace']);
    expect(one.code).toBe(0);
    expect(JSON.parse(one.stdout)).toEqual(viaJson(schemasOf('trace')));
    const all = await loupe(['schema']);
    expect(all.code).toBe(0);
    const parsed = JSON.parse(all.stdout);
    expect(Object.keys(parsed).sort()).toEqual(Object.keys(operations).sort());
    expect(parsed).toEqual(viaJson(allSchemas()));
  });

  it('mcp dispatches to the bridge (its help, and its own usage error code)', async () => {
    const h = await loupe(['mcp', '--help']);
    expect(h.code).toBe(0);
    expect(h.stdout + h.stderr).toMatch(/loupe mcp/);
    const bad = await loupe(['mcp', '--no-such-option']);
    expect(bad.code).toBe(2);
  });

  it('doctor: backends, threads, node vs wasm and webgpu vs node agreement on the bundled model, cache', async () => {
    const cache = join(scratch, 'cache');
    const r = await new Promise<Result>((res) => {
      execFile(
        process.execPath,
        [BIN, 'doctor', '--json'],
        { cwd: tmpdir(), env: { ...process.env, LOUPE_CACHE_DIR: cache } },
        (err, stdout, stderr) => res({ code: err ? (err as any).code : 0, stdout, stderr }),
      );
    });
    expect(r.code).toBe(0);
    const d = onlyJson(r).doctor;
    expect(d.runtime.node).toBe(process.version);
    expect(d.backends.node.available).toBe(true);
    expect(d.backends.wasm.available).toBe(true);
    expect(d.backends.node.version).toMatch(/^\d+\.\d+\.\d+/);
    expect(d.backends.wasm.version).toMatch(/^\d+\.\d+\.\d+/);
    expect(d.threads.available).toBeGreaterThan(0);
    expect(d.agreement.ok).toBe(true);
    expect(d.agreement.max_abs_logit_diff).toBeGreaterThanOrEqual(0);
    expect(d.agreement.max_abs_logit_diff).toBeLessThan(1e-4);
    // q8's cost is reported, never silent: the 8-bit weights move the logits, by far less than their scale
    expect(d.q8_cost.candidate).toBe('q8');
    expect(d.q8_cost.max_abs_logit_diff).toBeGreaterThan(1e-4);
    expect(d.q8_cost.max_abs_logit_diff).toBeLessThan(0.1 * d.q8_cost.max_abs_logit);
    expect(d.q8_cost.max_abs_dla_diff).toBeGreaterThan(0);
    expect(d.q8_cost.max_abs_dla_diff).toBeLessThan(0.1 * d.q8_cost.max_abs_dla);
    // and q4's: 4-bit Linears move them further than 8-bit ones (on a 64-wide model, by a good part of their scale)
    expect(d.q4_cost.candidate).toBe('q4');
    expect(d.q4_cost.baseline).toBe(d.q8_cost.baseline);
    expect(d.q4_cost.max_abs_logit_diff).toBeGreaterThan(d.q8_cost.max_abs_logit_diff);
    expect(d.q4_cost.max_abs_logit_diff).toBeLessThan(d.q4_cost.max_abs_logit);
    expect(d.q4_cost.max_abs_dla_diff).toBeGreaterThan(d.q8_cost.max_abs_dla_diff);
    expect(d.cache.location).toBe(cache);
    // the memory report: weights read from disk (none in JS), hooks returned, the WASM heap holds at least the weights
    for (const b of ['node', 'wasm']) {
      const m = d.memory[b];
      expect(m.weight_bytes, b).toBeGreaterThan(0);
      expect(m.precision, b).toMatch(/^(f32|stored)$/);
      expect(m.js_weight_bytes, b).toBe(0);
      expect(m.hooks_bytes, b).toBeGreaterThan(0);
      expect(m.rss_bytes, b).toBeGreaterThan(m.weight_bytes);
    }
    expect(d.memory.wasm.wasm_heap_bytes).toBeGreaterThan(d.memory.wasm.weight_bytes);
    // the WebGPU route (SwiftShader here and in CI): what it found, what onnxruntime-node does not expose, agreement with node
    expect(d.backends.webgpu.available).toBe(true);
    expect(d.backends.webgpu.vulkan.icd.length).toBeGreaterThan(0);
    expect(d.backends.webgpu.adapter).toMatch(/does not expose the adapter's vendor, architecture, limits or features/);
    expect(typeof d.backends.webgpu.shader_f16).toBe('boolean');
    expect(d.backends.webgpu.max_buffer_bytes).toBeGreaterThan(0);
    expect(d.webgpu_agreement.ok).toBe(true);
    expect(d.webgpu_agreement.max_abs_logit_diff).toBeLessThan(1e-4);
    expect(d.paths.webgpu.vocab_reason).toMatch(/within/);
    expect(d.ok).toBe(true);
  });
});
