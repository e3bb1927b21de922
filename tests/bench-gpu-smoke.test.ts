/**
 * bench/gpu.ts's core at its tiny shape (a 2-layer random Llama) on the webgpu backend (SwiftShader here and in
 * CI) and node: every operation the GPU bench times completes on both, each moved something through the
 * transfer counter, and the backends' final logits agree within 1e-4. The next run on a lent GPU has minutes of
 * device time; this is what catches an engine change that breaks the bench before then (bench/gpu-session.sh).
 */
import { describe, it, expect, afterAll } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { ALL_OPS, TINY, runShape } from '../bench/gpu';

const root = mkdtempSync(path.join(tmpdir(), 'loupe-bench-gpu-smoke-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe('bench:gpu at the tiny shape', () => {
  it('runs every operation on webgpu and node, the logits within 1e-4', async () => {
    const r = await runShape(TINY, ['webgpu', 'node'], {
      Ts: [8],
      reps: 1,
      genN: 4,
      threads: 1,
      ops: ALL_OPS,
      log: () => undefined,
      root,
    });
    for (const b of ['webgpu', 'node']) {
      const run = r.backends[b];
      expect(run.error, b).toBeUndefined();
      expect(run.plain_error, b).toBeUndefined();
      for (const k of ['plain', 'hooked_none', 'hooked_all'])
        expect(run.forward[8][k].median_ms, `${b} ${k}`).toBeGreaterThan(0);
      // every hook read back more than the logits alone
      const ft = run.forward_transfers[8];
      expect(ft.hooked_all!.read_bytes, b).toBeGreaterThan(ft.hooked_none!.read_bytes);
      for (const op of ALL_OPS) {
        expect(typeof run.ops[op], `${b} ${op}: ${run.ops[op]}`).toBe('number');
        expect(run.op_transfers[op]!.runs, `${b} ${op}`).toBeGreaterThan(0);
      }
      expect(run.gen_tok_s, b).toBeGreaterThan(0);
    }
    // the profiler's placement is reported on WebGPU only
    expect(r.backends.webgpu.op_transfers.trace!.off_device_nodes).toBeGreaterThanOrEqual(0);
    expect(r.agreement_final_logits_maxabs[8]).toBeLessThan(1e-4);
  }, 120_000);
});
