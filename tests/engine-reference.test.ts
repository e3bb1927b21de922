/**
 * The engine (ONNX graph on onnxruntime-node) against the independent float64 reference forward
 * (tests/reference, no shared code) on random-weight models of every supported family: every
 * TransformerLens hook and the logits within 1e-4, plus interventions and batching.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { ALL_FAMILY_CASES, makeCaseModel, caseTokens, referenceForward, compareHooks, maxAbsDiff, type RandomModel } from './reference';

const TOL = 1e-4;

describe.each(ALL_FAMILY_CASES)('engine vs float64 reference: $name', (c) => {
  let rm: RandomModel;
  let model: LoadedModel;
  let tokens: number[];
  beforeAll(async () => {
    rm = makeCaseModel(c);
    model = await loadModelNode(rm.dir);
    tokens = caseTokens(rm, c.seqLen);
  });
  afterAll(async () => {
    await model?.dispose();
    rm?.cleanup();
  });

  it('every hook (hook_result included) and the logits agree within 1e-4', async () => {
    const ref = referenceForward(rm, tokens);
    const out = await model.run(tokens, { hooks: 'all', withResult: true });
    const names = model.hookNames({ withResult: true });
    const refNames = Object.keys(ref.hooks);
    // the engine offers TL hooks the reference computes, and nothing the reference lacks
    for (const n of names) if (!n.includes('hook_pre_linear') && !n.includes('_post.hook_scale')) expect(refNames, n).toContain(n);
    const cmp = compareHooks(ref.hooks, out.hooks, names.filter((n) => n in ref.hooks), TOL);
    const bad = cmp.filter((r) => !r.ok);
    expect(bad, JSON.stringify(bad.slice(0, 5))).toEqual([]);
    expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs).toBeLessThan(TOL);
    const worst = Math.max(...cmp.map((r) => r.maxAbs));
    console.log(`${c.name}: ${cmp.length} hooks, worst |Δ| ${worst.toExponential(2)}, logits |Δ| ${maxAbsDiff(ref.logits.data, out.logits.data).maxAbs.toExponential(2)}`);
  });

  it('zero-ablating one head equals the reference with that head of hook_z zeroed', async () => {
    const layer = model.info.n_layers - 1;
    const head = 1 % model.info.n_heads;
    const Dh = model.info.d_head;
    const ref = referenceForward(rm, tokens, {
      hook: (name, v, dims) => {
        if (name !== `blocks.${layer}.attn.hook_z`) return;
        const H = dims[2];
        for (let t = 0; t < dims[1]; t++) for (let d = 0; d < Dh; d++) v[(t * H + head) * Dh + d] = 0;
        return v;
      },
    });
    const out = await model.run(tokens, { interventions: [{ hook: `blocks.${layer}.attn.hook_z`, op: 'zero', head }] });
    expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs).toBeLessThan(TOL);
  });

  it('adding α·d at hook_resid_pre equals the reference doing the same; a batch of variants equals one-by-one runs', async () => {
    const D = model.info.d_model;
    const d = Array.from({ length: D }, (_, i) => Math.sin(i + 1));
    const alpha = 0.7;
    const hook = `blocks.${Math.min(1, model.info.n_layers - 1)}.hook_resid_pre`;
    const ref = referenceForward(rm, tokens, {
      hook: (name, v) => {
        if (name !== hook) return;
        for (let i = 0; i < v.length; i++) v[i] += alpha * d[i % D];
        return v;
      },
    });
    const single = await model.run(tokens, { interventions: [{ hook, op: 'add', value: d, alpha }] });
    expect(maxAbsDiff(ref.logits.data, single.logits.data).maxAbs).toBeLessThan(TOL);

    // row 0 clean, row 1 steered, row 2 a head ablation: one run
    const z = `blocks.0.attn.hook_z`;
    const batched = await model.run(tokens, { batch: 3, interventions: [{ hook, op: 'add', value: d, alpha, batch: [1] }, { hook: z, op: 'zero', head: 0, batch: [2] }] });
    const clean = await model.run(tokens);
    const abl = await model.run(tokens, { interventions: [{ hook: z, op: 'zero', head: 0 }] });
    const n = clean.logits.data.length;
    expect(maxAbsDiff(batched.logits.data.subarray(0, n), clean.logits.data).maxAbs).toBeLessThan(1e-5);
    expect(maxAbsDiff(batched.logits.data.subarray(n, 2 * n), single.logits.data).maxAbs).toBeLessThan(1e-5);
    expect(maxAbsDiff(batched.logits.data.subarray(2 * n), abl.logits.data).maxAbs).toBeLessThan(1e-5);
  });

  it('KV-cached continuation equals the full run', async () => {
    const split = Math.floor(tokens.length / 2);
    const first = await model.run(tokens.slice(0, split), { returnCache: true });
    const rest = await model.run(tokens.slice(split), { past: first.present, hooks: [`blocks.0.attn.hook_pattern`] });
    const full = await model.run(tokens, { hooks: [`blocks.0.attn.hook_pattern`] });
    const V = model.info.d_vocab;
    expect(maxAbsDiff(rest.logits.data, full.logits.data.subarray(split * V)).maxAbs).toBeLessThan(1e-5);
    const T = tokens.length;
    const H = model.info.n_heads;
    // the continuation's pattern rows are the full run's last rows
    const p = rest.hooks['blocks.0.attn.hook_pattern'];
    expect(p.dims).toEqual([1, H, T - split, T]);
    for (let h = 0; h < H; h++) {
      const a = p.data.subarray(h * (T - split) * T, (h + 1) * (T - split) * T);
      const b = full.hooks['blocks.0.attn.hook_pattern'].data.subarray((h * T + split) * T, (h + 1) * T * T);
      expect(maxAbsDiff(a, b).maxAbs).toBeLessThan(1e-5);
    }
  });
});
