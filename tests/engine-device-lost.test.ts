/**
 * A GPU device lost mid-run (runtime/device-lost.ts), on onnxruntime-node's WebGPU provider
 * (SwiftShader here and in CI). Node cannot lose a Dawn device on purpose, so runs are made to fail
 * as a lost one does, through the test seam NodeModelOptions.wrapFactory: a wrapped session's run
 * throws Dawn's read-back failure (its text as in libonnxruntime.so 1.30) at the runs chosen. The
 * operation then recreates the model's sessions (counted: the factory's create and reset) and runs
 * again, its document the same as a run with no loss and with the notice; a second loss in one job
 * is DEVICE_LOST with its hint; any other failure is not taken for a loss.
 */
import { describe, it, expect, afterAll, beforeAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import { getOperation } from '../src/ops/index';
import { makeRandomModel, type RandomModel } from './reference';
import type { LoadedModel } from '../src/engine/api';
import type { SessionFactory } from '../src/engine/runtime/ort-session';
import { LoupeError } from '../src/engine/errors';
import { DEVICE_LOST_NOTICE } from '../src/engine/runtime/device-lost';

/** what onnxruntime-node's WebGPU provider throws when it reads back from a lost device */
const DAWN_LOST = 'Failed to download data from buffer. wgpu::MapAsyncStatus value: 3';

/** The factory with its sessions' runs counted, and failing with `fault` at the runs in `failAt`. */
function faulty() {
  const s = { runs: 0, fired: 0, creates: 0, resets: 0, failAt: new Set<number>(), fault: DAWN_LOST };
  const wrap = (f: SessionFactory): SessionFactory => ({
    ...f,
    async create(graph, weights) {
      s.creates++;
      const session = await f.create(graph, weights);
      return {
        ...session,
        run: async (feeds, fetches, opts) => {
          if (s.failAt.has(++s.runs)) {
            s.fired++;
            throw new Error(s.fault);
          }
          return session.run(feeds, fetches, opts);
        },
      };
    },
    reset: async () => {
      s.resets++;
      await f.reset?.();
    },
  });
  return { s, wrap };
}

describe('a GPU device lost mid-run (node webgpu)', () => {
  let rm: RandomModel;
  let gpu: LoadedModel;
  let fresh: LoadedModel;
  const f = faulty();
  beforeAll(async () => {
    rm = makeRandomModel('gpt2', { seed: 5, dModel: 32, nLayers: 2, nHeads: 4, dMlp: 128, vocabSize: 200 });
    gpu = await loadModelNode(rm.dir, { backend: 'webgpu', wrapFactory: f.wrap });
    fresh = await loadModelNode(rm.dir, { backend: 'webgpu' });
  });
  afterAll(async () => {
    await gpu?.dispose();
    await fresh?.dispose();
    rm?.cleanup();
  });

  const trace = { prompt: 'the cat sat on the mat', top_k: 3 };

  it('a run failing as on a lost device: the sessions recreated, run again, the document says so', async () => {
    const want = (await getOperation('trace')!.run(fresh, trace)) as any;
    const before = { ...f.s };
    f.s.failAt = new Set([f.s.runs + 1]); // the job's first forward
    const stages: string[] = [];
    const doc = (await getOperation('trace')!.run(gpu, trace, {
      onProgress: (p) => stages.push(p.stage),
    })) as any;
    expect(f.s.fired - before.fired).toBe(1);
    expect(doc.notices).toEqual([DEVICE_LOST_NOTICE]);
    expect(stages.some((t) => /GPU device was lost/.test(t))).toBe(true);
    // the factory was reset and made the base session again (and the readout's, used by trace)
    expect(f.s.resets - before.resets).toBe(1);
    expect(f.s.creates - before.creates).toBeGreaterThanOrEqual(1);
    expect(gpu.memory().device_recoveries).toBe(1);
    // the same numbers as a model that lost nothing
    expect(doc.predicted_token_id).toBe(want.predicted_token_id);
    expect(doc.head_attribution).toEqual(want.head_attribution);
    expect(doc.decomposition).toEqual(want.decomposition);
    // and the next job runs without a notice
    const next = (await getOperation('trace')!.run(gpu, trace)) as any;
    expect(next.notices).toBeUndefined();
    expect(next.head_attribution).toEqual(want.head_attribution);
  });

  it('generate, its KV cache on the lost device, lost mid-generation: run again whole', async () => {
    const input = { prompt: 'the cat', max_new_tokens: 6, temperature: 0 };
    const want = (await getOperation('generate')!.run(fresh, input)) as any;
    f.s.failAt = new Set([f.s.runs + 4]); // the third step, after the prompt's forward
    const fired = f.s.fired;
    const doc = (await getOperation('generate')!.run(gpu, input)) as any;
    expect(f.s.fired - fired).toBe(1);
    expect(doc.notices).toEqual([DEVICE_LOST_NOTICE]);
    expect(doc.generated_tokens.length).toBe(6);
    expect(doc.generated_tokens).toEqual(want.generated_tokens);
    expect(gpu.memory().device_recoveries).toBe(2);
  });

  it('a second loss in the same job: DEVICE_LOST (code, message, hint), not a hang or a crash', async () => {
    f.s.failAt = new Set([f.s.runs + 1, f.s.runs + 2, f.s.runs + 3, f.s.runs + 4]);
    const fired = f.s.fired;
    const e = await getOperation('trace')!
      .run(gpu, trace)
      .then(
        () => null,
        (x) => x,
      );
    expect(e).toBeInstanceOf(LoupeError);
    expect(e.code).toBe('DEVICE_LOST');
    expect(e.message).toMatch(/lost again after Loupe recreated its sessions/);
    expect(e.hint).toMatch(/--backend node/);
    expect(e.details).toEqual({ again: true });
    expect(f.s.fired - fired).toBe(2); // once, and once more after the recovery: no third try
    // the model is not wedged: the next job runs (its device recovered once more)
    f.s.failAt = new Set();
    const want = (await getOperation('trace')!.run(fresh, trace)) as any;
    const doc = (await getOperation('trace')!.run(gpu, trace)) as any;
    expect(doc.head_attribution).toEqual(want.head_attribution);
  });

  it('another failure is not taken for a lost device: no recovery, no second run', async () => {
    const recovered = gpu.memory().device_recoveries;
    const resets = f.s.resets;
    f.s.fault = 'Non-zero status code returned while running MatMul node';
    f.s.failAt = new Set([f.s.runs + 1]);
    const e = await getOperation('trace')!
      .run(gpu, trace)
      .then(
        () => null,
        (x) => x,
      );
    f.s.fault = DAWN_LOST;
    expect(e?.code).toBe('RUNTIME_ERROR');
    expect(f.s.resets).toBe(resets);
    expect(gpu.memory().device_recoveries).toBe(recovered);
  });
});

describe('the notice on the surfaces that carry a document', () => {
  it('an MCP tool result says it as text beside the document (and in structuredContent)', async () => {
    const { okResult } = await import('../src/bridge/results');
    const doc = { operation: 'trace', notices: [DEVICE_LOST_NOTICE] };
    const r = okResult(doc);
    expect(r.content.map((c: any) => c.text)).toContain(`Notice: ${DEVICE_LOST_NOTICE}`);
    expect((r.structuredContent as any).notices).toEqual([DEVICE_LOST_NOTICE]);
    expect(okResult({ operation: 'trace' }).content).toHaveLength(1);
  });
});
