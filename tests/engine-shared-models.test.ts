/**
 * The engine on the two real models in ../shared, against outputs of programs nobody here wrote:
 *  - stories260K vs llama2.c's run.c (final logits, 64 greedy ids), on onnxruntime-node and
 *    onnxruntime-web WASM;
 *  - induction-gpt2's induction and previous-token scores vs its README (an independent PyTorch
 *    implementation), from the engine's hook_pattern.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { readFileSync, mkdtempSync, writeFileSync, copyFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { LoupeError } from '../src/engine/errors';
import { SHARED } from './helpers/shared';

const INDUCTION = path.join(SHARED, 'models/induction-gpt2');
const ref = JSON.parse(readFileSync(path.join(SHARED, 'references/stories260K-run-c.json'), 'utf8'));

function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>) {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

async function greedyWithCache(model: LoadedModel, ids: number[], n: number): Promise<number[]> {
  const V = model.info.d_vocab;
  let out = await model.run(ids, { returnCache: true });
  const gen: number[] = [];
  for (let i = 0; i < n; i++) {
    const T = out.logits.dims[1];
    const row = out.logits.data.subarray((T - 1) * V, T * V);
    let best = 0;
    for (let v = 1; v < V; v++) if (row[v] > row[best]) best = v;
    gen.push(best);
    out = await model.run([best], { past: out.present, returnCache: true });
  }
  return gen;
}

describe.each(['node', 'wasm'] as const)('stories260K vs llama2.c run.c (%s backend)', (backend) => {
  let model: LoadedModel;
  beforeAll(async () => {
    model = await loadModelNode('default', { backend });
  });
  afterAll(async () => {
    await model?.dispose();
  });

  it('tokenizes the prompt as llama2.c does (BOS prepended)', () => {
    expect(model.tokenize(ref.prompt)).toEqual(ref.prompt_ids);
    expect(model.info).toMatchObject({
      id: 'stories260K',
      source: 'bundled',
      architecture: 'llama',
      n_layers: 5,
      n_heads: 8,
      n_kv_heads: 4,
      d_model: 64,
    });
  });

  it('final-position logits within 1e-4', async () => {
    const out = await model.run(ref.prompt_ids);
    const V = model.info.d_vocab;
    const T = ref.prompt_ids.length;
    const d = maxDiff(out.logits.data.subarray((T - 1) * V, T * V), ref.final_position_logits);
    console.log(`stories260K ${backend}: max |Δ logits| vs llama2.c = ${d.toExponential(2)}`);
    expect(d).toBeLessThan(1e-4);
  });

  it('64 greedy tokens (KV cache) equal llama2.c exactly', async () => {
    expect(await greedyWithCache(model, ref.prompt_ids, 64)).toEqual(ref.greedy_next_64_ids);
  });
});

describe('induction-gpt2: attention scores from hook_pattern vs the README', () => {
  let model: LoadedModel;
  beforeAll(async () => {
    model = await loadModelNode(INDUCTION);
  });
  afterAll(async () => {
    await model?.dispose();
  });

  // README table, random bytes 0–255, R = 30
  const README_INDUCTION = [0.0, 0.0, 0.027, 0.003, 0.785, 0.805, 0.804, 0.816];
  const README_PREV = [0.657, 0.679, 0.071, 0.224, 0.039, 0.033, 0.031, 0.034];

  it('induction and previous-token scores within 0.05 of the independent measurement', async () => {
    let seed = 12345;
    const rand = () => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      return seed / 2 ** 31;
    };
    const N = 20,
      R = 30,
      H = 4;
    const ind = new Array(8).fill(0),
      prev = new Array(8).fill(0);
    const rows: number[][] = [];
    for (let s = 0; s < N; s++) {
      const r = Array.from({ length: R }, () => Math.floor(rand() * 256));
      rows.push([256, ...r, ...r]);
    }
    // one batched run for all sequences
    const out = await model.run(rows, { hooks: ['blocks.0.attn.hook_pattern', 'blocks.1.attn.hook_pattern'] });
    const T = 1 + 2 * R;
    for (let l = 0; l < 2; l++) {
      const p = out.hooks[`blocks.${l}.attn.hook_pattern`];
      expect(p.dims).toEqual([N, H, T, T]);
      for (let b = 0; b < N; b++)
        for (let h = 0; h < H; h++) {
          const at = (q: number, k: number) => p.data[((b * H + h) * T + q) * T + k];
          let si = 0,
            sp = 0;
          for (let q = 1 + R; q < T; q++) si += at(q, q - R + 1); // token after the earlier occurrence
          for (let q = 1; q < T; q++) sp += at(q, q - 1);
          ind[l * H + h] += si / R / N;
          prev[l * H + h] += sp / (T - 1) / N;
        }
    }
    const fmt = (a: number[]) => a.map((v) => v.toFixed(3)).join(' ');
    console.log(
      `induction-gpt2 (engine, ${N} seqs)\n  induction: ${fmt(ind)}\n  readme:    ${fmt(README_INDUCTION)}\n  prev-tok:  ${fmt(prev)}\n  readme:    ${fmt(README_PREV)}`,
    );
    for (let i = 0; i < 8; i++) {
      expect(Math.abs(ind[i] - README_INDUCTION[i])).toBeLessThan(0.05);
      expect(Math.abs(prev[i] - README_PREV[i])).toBeLessThan(0.05);
    }
  });

  it('refuses prompts longer than its 64-token context with a clear error', async () => {
    const long = Array.from({ length: 65 }, (_, i) => i % 256);
    await expect(model.run(long)).rejects.toMatchObject({ code: 'PROMPT_TOO_LONG' });
    const err = await model.run(long).catch((e) => e);
    expect(err).toBeInstanceOf(LoupeError);
    expect(err.hint).toMatch(/64/);
    // the model keeps working after the error
    expect((await model.run([256, 97, 98])).logits.dims).toEqual([1, 3, 257]);
  });

  it('rejects bad hooks, interventions and token ids with structured errors', async () => {
    await expect(model.run([256, 97], { hooks: ['blocks.9.hook_resid_pre'] })).rejects.toMatchObject({
      code: 'UNKNOWN_HOOK',
    });
    await expect(
      model.run([256, 97], { interventions: [{ hook: 'blocks.0.attn.hook_z', op: 'zero', head: 7 }] }),
    ).rejects.toMatchObject({ code: 'BAD_INTERVENTION' });
    await expect(
      model.run([256, 97], { interventions: [{ hook: 'blocks.0.hook_resid_pre', op: 'add', value: [1, 2, 3] }] }),
    ).rejects.toMatchObject({ code: 'BAD_INTERVENTION' });
    await expect(
      model.run([256, 97], { interventions: [{ hook: 'blocks.0.attn.hook_attn_scores', op: 'zero' }] }),
    ).rejects.toMatchObject({ code: 'BAD_INTERVENTION' });
    await expect(model.run([256, 999])).rejects.toMatchObject({ code: 'BAD_TOKEN_ID' });
    await expect(model.run([])).rejects.toMatchObject({ code: 'EMPTY_PROMPT' });
  });

  it("a lean run (only its sites and hooks in the graph) gives the full graph's numbers", async () => {
    const ids = model.tokenize('abcdefabcdef');
    const ivs = [
      { hook: 'blocks.1.attn.hook_z', op: 'zero' as const, head: 2, batch: [1] },
      { hook: 'blocks.0.hook_mlp_out', op: 'zero' as const, batch: [2] },
    ];
    const opts = {
      batch: 3,
      interventions: ivs,
      hooks: ['blocks.1.hook_resid_post'],
      logitPositions: [ids.length - 1],
    };
    const full = await model.run(ids, opts);
    const lean = await model.run(ids, { ...opts, lean: true });
    expect(lean.logits.dims).toEqual([3, 1, 257]);
    expect(maxDiff(full.logits.data, lean.logits.data)).toBeLessThan(1e-5);
    expect(
      maxDiff(full.hooks['blocks.1.hook_resid_post'].data, lean.hooks['blocks.1.hook_resid_post'].data),
    ).toBeLessThan(1e-5);
    // the rows differ from each other, so the edits really happened in the lean graph
    expect(maxDiff(lean.logits.data.subarray(0, 257), lean.logits.data.subarray(257, 514))).toBeGreaterThan(1e-3);
    // hook names are still checked against the model
    await expect(model.run(ids, { lean: true, hooks: ['blocks.5.hook_resid_post'] })).rejects.toMatchObject({
      code: 'UNKNOWN_HOOK',
    });
  });

  it('tokenizes bytes and prepends <|endoftext|> as BOS', () => {
    expect(model.tokenize('ab')).toEqual([256, 97, 98]);
    expect(model.tokenize('ab', { prependBos: false })).toEqual([97, 98]);
    expect(model.tokenStrings([256, 97])).toEqual(['<|endoftext|>', 'a']);
  });
});

describe('unsupported architectures', () => {
  it('an unknown model_type is UNSUPPORTED_ARCHITECTURE listing what is supported', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'loupe-bert-'));
    try {
      for (const f of ['model.safetensors', 'tokenizer.json', 'tokenizer_config.json'])
        copyFileSync(path.join(INDUCTION, f), path.join(dir, f));
      writeFileSync(path.join(dir, 'config.json'), JSON.stringify({ model_type: 'bert', hidden_size: 64 }));
      const err = await loadModelNode(dir).catch((e) => e);
      expect(err).toMatchObject({ code: 'UNSUPPORTED_ARCHITECTURE' });
      expect(err.hint).toMatch(/gpt2.*llama.*gemma2/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('GPT-2 checkpoints without the transformer. prefix (as openai-community/gpt2 stores them)', () => {
  it('load and give the same logits as the prefixed original', async () => {
    const { decodeSafetensors, encodeSafetensors } = await import('./reference');
    const dir = mkdtempSync(path.join(tmpdir(), 'loupe-gpt2-noprefix-'));
    try {
      const { tensors } = decodeSafetensors(readFileSync(path.join(INDUCTION, 'model.safetensors')));
      const renamed: Record<string, { dims: number[]; data: ArrayLike<number> }> = {};
      for (const [name, t] of Object.entries(tensors))
        renamed[name.replace(/^transformer\./, '')] = { dims: t.dims, data: t.data };
      expect(Object.keys(renamed).some((n) => n.startsWith('transformer.'))).toBe(false);
      writeFileSync(path.join(dir, 'model.safetensors'), encodeSafetensors(renamed));
      for (const f of ['config.json', 'tokenizer.json', 'tokenizer_config.json'])
        copyFileSync(path.join(INDUCTION, f), path.join(dir, f));
      const a = await loadModelNode(INDUCTION);
      const b = await loadModelNode(dir);
      const ids = a.tokenize('abcabc');
      expect(maxDiff((await a.run(ids)).logits.data, (await b.run(ids)).logits.data)).toBe(0);
      await a.dispose();
      await b.dispose();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
