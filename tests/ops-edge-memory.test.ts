/**
 * edge_attribution's memory judgement (ops/lib/edge-memory.ts): a Qwen3-30B-A3B-shaped model
 * (experts as nodes; a fake model, nothing but its ModelInfo and a budget from headers-only weight
 * stats) is refused as TOO_LARGE before any run or large allocation; on induction-gpt2 a budget that
 * fits fewer rows per run gives the same scores with a warning, and the default budget changes nothing.
 */
import { describe, it, expect, afterAll } from 'vitest';
import { realpathSync } from 'node:fs';
import path from 'node:path';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { getOperation, type OperationDocument } from '../src/ops/index';
import { budgetOf, estimateMemory, GiB, weightStats } from '../src/engine/budget';
import { edgeGraphOf } from '../src/ops/lib/edge-circuits';
import { edgeCount, edgeMemory, layoutOf } from '../src/ops/lib/edge-memory';
import { SHARED } from './helpers/shared';

type Doc = OperationDocument<'edge_attribution'>;
const op = { run: (m: LoadedModel, x: unknown): Promise<Doc> => getOperation('edge_attribution')!.run(m, x) };
const INDUCTION = realpathSync(path.join(SHARED, 'models/induction-gpt2'));

/** Qwen3-30B-A3B's shape (config.json: 48 layers, 32 query heads, 128 experts, d_model 2048, vocab 151,936) */
const QWEN3_MOE = {
  n_layers: 48,
  n_heads: 32,
  parallel_attn_mlp: false,
  num_experts: 128,
  shared_expert: false,
  d_model: 2048,
  d_vocab: 151_936,
};

function fakeModel(calls: string[]): LoadedModel {
  // 30.5B BF16 parameters, headers only, judged on Node with 256 GiB of host memory
  const w = weightStats([{ dtype: 'BF16', shape: [30_532_122_624], byteLength: 2 * 30_532_122_624 }]);
  const budget = budgetOf(estimateMemory(w, 'node', 'stored', { hostBytes: 256 * GiB }));
  const no = (what: string) => () => {
    calls.push(what);
    throw new Error(`${what} must not be called`);
  };
  return {
    info: {
      ...QWEN3_MOE,
      id: 'fake/qwen3-30b-a3b-shape',
      post_norms: false,
      n_ctx: 4096,
      n_kv_heads: 4,
      d_head: 128,
    },
    memory: () => ({
      weight_bytes: 0,
      precision: 'stored',
      js_weight_bytes: 0,
      param_bytes: 0,
      sessions: 0,
      hooks_bytes: 0,
      budget,
    }),
    run: no('run'),
    toDevice: no('toDevice'),
    deviceDifference: no('deviceDifference'),
    tokenize: no('tokenize'),
    tokenId: () => undefined,
    hookNames: () => [],
    decode: () => '',
  } as unknown as LoadedModel;
}

const pairs = (n: number, T: number) =>
  Array.from({ length: n }, (_, i) => ({
    clean_token_ids: Array.from({ length: T }, (_, t) => 1 + ((i + t) % 100)),
    corrupted_token_ids: Array.from({ length: T }, (_, t) => 2 + ((i + 3 * t) % 100)),
    answer: '#5',
    counterfactual: '#7',
  }));

describe('edge_attribution memory: a large graph is refused before any run', () => {
  it("the layout's count equals the edge list's, and Qwen3-30B-A3B's weight matrix is 519 MB", () => {
    for (const shape of [
      { n_layers: 2, n_heads: 4, parallel_attn_mlp: false },
      { n_layers: 3, n_heads: 2, parallel_attn_mlp: true },
      { n_layers: 2, n_heads: 2, parallel_attn_mlp: false, n_experts: 4, shared_expert: true },
    ])
      expect(edgeCount(layoutOf(shape))).toBe(edgeGraphOf(shape).edges.length);
    const lay = layoutOf({ ...QWEN3_MOE, n_experts: 128 });
    expect([lay.nForward, lay.nBackward]).toEqual([7681, 16897]);
    expect(lay.nForward * lay.nBackward * 4).toBe(519_143_428);
  });

  it('Qwen3-30B-A3B shape, experts as nodes: TOO_LARGE in well under a second, no run, no large allocation', async () => {
    const calls: string[] = [];
    const model = fakeModel(calls);
    const before = process.memoryUsage();
    const t0 = performance.now();
    const err = await op.run(model, { dataset: pairs(4, 16), method: 'eap_ig_inputs' }).catch((e) => e);
    const ms = performance.now() - t0;
    const after = process.memoryUsage();
    expect(err).toMatchObject({ code: 'TOO_LARGE' });
    // the edge count (65M) is over the document cap: refused before the edge list (~14 GB of JS objects) is made
    expect(err.message).toMatch(/numbers, more than the cap/);
    expect(calls).toEqual([]);
    expect(ms).toBeLessThan(1000);
    expect(after.arrayBuffers - before.arrayBuffers).toBeLessThan(16 * 2 ** 20);
    expect(after.heapUsed - before.heapUsed).toBeLessThan(64 * 2 ** 20);
  });

  it('a model under the document cap whose runs do not fit: TOO_LARGE naming the estimate and the room', async () => {
    const calls: string[] = [];
    const model = fakeModel(calls);
    // 16 layers of Qwen3-30B-A3B's width with 8 experts each: 0.6M edges, but 2,048 tokens of node stacks
    Object.assign(model.info, { n_layers: 16, num_experts: 8 });
    const err = await op.run(model, { dataset: pairs(2, 2048), method: 'eap' }).catch((e) => e);
    expect(err).toMatchObject({ code: 'TOO_LARGE' });
    expect(err.message).toMatch(
      /would hold about [\d.]+ GB with one row per run .* more than the [\d.]+ GB that host memory/,
    );
    expect(err.hint).toMatch(/fewer pairs or shorter prompts/);
    expect(err.details.estimate_bytes).toBeGreaterThan(err.details.room_bytes);
    console.log(`${err.message}\n${err.hint}`);
    expect(calls).toEqual([]);
  });
});

describe('edge_attribution memory on induction-gpt2: a fitting case runs unchanged', () => {
  const models: LoadedModel[] = [];
  afterAll(async () => {
    for (const m of models) await m.dispose();
  });
  const GEN = { task: 'induction' as const, n: 4, seed: 3, length: 8 };

  it('the default budget: no memory warning; a budget for 2 rows per run: the same scores, batch cut, a warning', async () => {
    const full = await loadModelNode(INDUCTION, { backend: 'node' });
    models.push(full);
    const a = await op.run(full, { generate: GEN, method: 'eap_ig_inputs', batch_size: 4 });
    expect(a.warnings.filter((w) => w.startsWith('Memory'))).toEqual([]);
    // the room for 2.5 rows of this work (its fixed and per-row bytes, edge-memory.ts) beside the model
    const shape = { n_layers: full.info.n_layers, n_heads: full.info.n_heads, parallel_attn_mlp: false };
    const layout = layoutOf(shape);
    const mem = edgeMemory(
      {
        layout,
        nEdges: edgeCount(layout),
        dModel: full.info.d_model,
        T: 17,
        pairs: 4,
        gradient: true,
        weightedForward: false,
        keptNodes: 2,
        igRows: 5,
        circuits: 0,
      },
      { limit_name: 'host memory', limit_bytes: 0, held_bytes: 0 },
    );
    const held = full.memory().budget!.held_bytes;
    const small = await loadModelNode(INDUCTION, {
      backend: 'node',
      memory: { hostBytes: held + mem.fixedBytes + 2.5 * mem.rowBytes },
    });
    models.push(small);
    const b = await op.run(small, { generate: GEN, method: 'eap_ig_inputs', batch_size: 4 });
    expect(b.warnings.find((w) => w.startsWith('Memory'))).toMatch(/at most 2 rows \(batch_size 4 → 2\)/);
    expect(b.cost.engine_runs).toBeGreaterThan(a.cost.engine_runs);
    let worst = 0;
    let scale = 0;
    a.edges.forEach((e, i) => {
      worst = Math.max(worst, Math.abs(e.score - b.edges[i].score));
      scale = Math.max(scale, Math.abs(e.score));
    });
    expect(worst).toBeLessThan(1e-5 * scale);
    console.log(
      `edge memory: 2 rows per run vs 4: scores differ by ${worst.toExponential(2)} (max |score| ${scale.toFixed(3)})`,
    );
  }, 120_000);
});
