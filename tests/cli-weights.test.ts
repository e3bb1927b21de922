/**
 * `--weights` on the CLI: the document records the precision that ran; a bad value is a usage
 * error (exit 2) before anything loads.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { execFile } from 'node:child_process';
import { tmpdir } from 'node:os';
import { resolve } from 'node:path';
import { ALL_FAMILY_CASES, makeCaseModel, type RandomModel } from './reference';

const BIN = resolve(__dirname, '../bin/loupe.mjs');

function loupe(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((res) => {
    execFile(
      process.execPath,
      [BIN, ...args],
      { cwd: tmpdir(), maxBuffer: 64 << 20, env: { ...process.env, NO_COLOR: '1' } },
      (err, stdout, stderr) => {
        res({ code: err ? (typeof (err as any).code === 'number' ? (err as any).code : 1) : 0, stdout, stderr });
      },
    );
  });
}

describe('loupe --weights', () => {
  let rm: RandomModel;
  beforeAll(() => {
    rm = makeCaseModel(
      ALL_FAMILY_CASES.find((c) => c.name === 'gpt2-tied')!,
      { dtype: 'F16' },
    );
  });
  afterAll(() => rm?.cleanup());

  it('--weights stored / f32: the document names the precision; the trace (DLA included) is the same', async () => {
    const docs: Record<string, any> = {};
    for (const w of ['stored', 'f32']) {
      const r = await loupe(['trace', rm.dir, 'hello world', '--weights', w, '--json', '--quiet']);
      expect(r.code, r.stderr).toBe(0);
      docs[w] = JSON.parse(r.stdout);
      expect(docs[w].model.weights).toBe(w);
      expect(docs[w].model.dtype).toBe('F16');
    }
    const a = docs.stored.head_attribution.flat(),
      b = docs.f32.head_attribution.flat();
    expect(a.length).toBeGreaterThan(0);
    expect(Math.max(...a.map((x: number, i: number) => Math.abs(x - b[i])))).toBeLessThan(1e-4);
    expect(docs.stored.predicted_token).toBe(docs.f32.predicted_token);
  });

  it('--weights q8 on both backends: the document says q8; the DLA moves, by far less than its scale', async () => {
    const docs: Record<string, any> = {};
    for (const [k, args] of [
      ['stored', ['--weights', 'stored']],
      ['node', ['--weights', 'q8']],
      ['wasm', ['--weights', 'q8', '--backend', 'wasm']],
    ] as const) {
      const r = await loupe(['trace', rm.dir, 'hello world', ...args, '--json', '--quiet']);
      expect(r.code, r.stderr).toBe(0);
      docs[k] = JSON.parse(r.stdout);
    }
    expect(docs.node.model.weights).toBe('q8');
    expect(docs.wasm.model.weights).toBe('q8');
    expect(docs.wasm.model.backend).toBe('wasm');
    const s = docs.stored.head_attribution.flat(),
      q = docs.node.head_attribution.flat(),
      w = docs.wasm.head_attribution.flat();
    const maxAbs = (a: number[], b: number[]) => Math.max(...a.map((x, i) => Math.abs(x - b[i])));
    // the two backends run the same 8-bit weights
    expect(maxAbs(q, w)).toBeLessThan(1e-4);
    const scale = Math.max(...s.map(Math.abs));
    expect(maxAbs(s, q)).toBeGreaterThan(0);
    expect(maxAbs(s, q)).toBeLessThan(0.1 * scale);
  });

  it('auto on onnxruntime-node picks f32 for a small F16 model; a bad value exits 2', async () => {
    const r = await loupe(['trace', rm.dir, 'hello', '--json', '--quiet']);
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout).model.weights).toBe('f32');
    const bad = await loupe(['trace', rm.dir, 'hello', '--weights', 'fp8', '--json']);
    expect(bad.code).toBe(2);
    expect(bad.stdout).toMatch(/--weights must be/);
  });
});
