/**
 * SAEs in this round's layouts, on a Gemma-3-shaped random model (gemma3-text-bf16: sandwich norms,
 * 5:1 sliding pattern), each checked against a float64 computation written from the public source
 * (tests/helpers/random-sae.ts saeEncode64: SAELens's inference classes, Gemma Scope 2's tutorial):
 *  - Gemma Scope 2's own files (config.json + params.safetensors) at hook_resid_post, hook_mlp_out
 *    and attn.hook_z (its "attn_out" SAEs read o_proj's input);
 *  - SAELens batchtopk (stored threshold: JumpReLU), matryoshka_batchtopk (a training checkpoint's
 *    float64 topk_threshold, broadcast), batchtopk with neither (TopK, round k) and
 *    rescale_acts_by_decoder_norm, at hook_attn_out, hook_resid_post and hook_mlp_out.
 * decompose: sae_features' activations equal the float64 encoding of the float64 forward's hook;
 * steer: sae_steer's log-probs equal the float64 forward with α·(decoder row) added at the hook.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { rmSync, writeFileSync, readFileSync } from 'node:fs';
import * as path from 'node:path';
import { loadModelNode } from '../src/node/load';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import type { LoadedModel } from '../src/engine/api';
import { operations } from '../src/ops/index';
import { makeRandomSae, type RandomSae } from './helpers/random-sae';
import { ALL_FAMILY_CASES, makeCaseModel, logSoftmax64, type RandomModel } from './reference';
import { saeReference, steeredForward } from './sae-ref';
import { schemaErrors, viaJson } from './schema-helpers';

const loaders = createNodeSaeLoaders({ cache: false });
const ctx = { loadSae: loaders.loadSae, loadSaeFile: loaders.loadSaeFile };
const PROMPT = 'abcab cabba acbcb';

let rm: RandomModel;
let model: LoadedModel;
beforeAll(async () => {
  rm = makeCaseModel(ALL_FAMILY_CASES.find((c) => c.name === 'gemma3-text-bf16')!);
  model = await loadModelNode(rm.dir);
});
afterAll(async () => {
  await model?.dispose();
  rm?.cleanup();
});

// d_model 56, H·Dh 64, 7 layers
const CASES: {
  name: string;
  hook: string;
  dIn: number;
  opts: Partial<Parameters<typeof makeRandomSae>[0]>;
  layout: string;
  architecture: string;
  activation: string;
}[] = [
  {
    name: 'Gemma Scope 2 resid_post',
    hook: 'blocks.3.hook_resid_post',
    dIn: 56,
    opts: { layout: 'gemma_scope_2', hfHook: 'model.layers.3.output' },
    layout: 'gemma_scope_2',
    architecture: 'jump_relu',
    activation: 'jumprelu',
  },
  {
    name: 'Gemma Scope 2 mlp_out',
    hook: 'blocks.5.hook_mlp_out',
    dIn: 56,
    opts: { layout: 'gemma_scope_2', hfHook: 'model.layers.5.post_feedforward_layernorm.output' },
    layout: 'gemma_scope_2',
    architecture: 'jump_relu',
    activation: 'jumprelu',
  },
  {
    name: 'Gemma Scope 2 attn_out (o_proj input)',
    hook: 'blocks.2.attn.hook_z',
    dIn: 64,
    opts: { layout: 'gemma_scope_2', hfHook: 'model.language_model.layers.2.self_attn.o_proj.input' },
    layout: 'gemma_scope_2',
    architecture: 'jump_relu',
    activation: 'jumprelu',
  },
  {
    name: 'SAELens batchtopk, stored threshold',
    hook: 'blocks.1.hook_attn_out',
    dIn: 56,
    opts: { architecture: 'batchtopk', batchThreshold: 'threshold', k: 6 },
    layout: 'saelens',
    architecture: 'batchtopk',
    activation: 'jumprelu',
  },
  {
    name: 'SAELens matryoshka_batchtopk, float64 topk_threshold',
    hook: 'blocks.4.hook_resid_post',
    dIn: 56,
    opts: { architecture: 'matryoshka_batchtopk', batchThreshold: 'topk_threshold', k: 6 },
    layout: 'saelens',
    architecture: 'matryoshka_batchtopk',
    activation: 'jumprelu',
  },
  {
    name: 'SAELens batchtopk without a threshold, rescaled by decoder norm',
    hook: 'blocks.6.hook_mlp_out',
    dIn: 56,
    opts: { architecture: 'batchtopk', batchThreshold: 'none', k: 5.4, rescale: true },
    layout: 'saelens',
    architecture: 'batchtopk',
    activation: 'topk',
  },
];

describe.each(CASES)('$name at $hook', ({ hook, dIn, opts, layout, architecture, activation }) => {
  let sae: RandomSae;
  beforeAll(() => {
    sae = makeRandomSae({ hook, dIn, dSae: 40, seed: 31, applyBDec: false, ...opts });
  });
  afterAll(() => {
    if (sae) rmSync(sae.dir, { recursive: true, force: true });
  });

  it("decomposes: every position's activations equal the float64 encoding of the float64 forward (1e-5)", async () => {
    const doc = await operations.sae_features.run(model, { prompt: PROMPT, sae_source: sae.dir, top_k: 40 }, ctx);
    expect(schemaErrors('sae_features', viaJson(doc))).toEqual([]);
    expect(doc.sae).toMatchObject({ layout, architecture, activation, hook, d_in: dIn, d_sae: 40 });
    if (activation === 'topk') expect(doc.sae.k).toBe(5);
    const ids = doc.tokens.map((t: { id: number }) => t.id);
    const r = saeReference(rm, sae, ids);
    let worst = 0,
      active = 0;
    for (const p of doc.positions) {
      const a = r.acts[p.position];
      const mine = new Map<number, number>(
        p.features.map((e: { feature: number; activation: number }) => [e.feature, e.activation]),
      );
      for (let f = 0; f < 40; f++) {
        const v = mine.get(f) ?? 0;
        worst = Math.max(worst, Math.abs(v - a[f]) / Math.max(1, Math.abs(a[f])));
        if (a[f] > 0) active++;
      }
      expect(p.l0).toBe(Array.from(a).filter((v) => v > 0).length);
    }
    console.log(
      `${hook} (${architecture}): ${active} active (position, feature) pairs, max relative |Δ activation| ${worst.toExponential(2)}`,
    );
    expect(active).toBeGreaterThan(ids.length); // features fire
    expect(active).toBeLessThan(ids.length * 40); // and not all of them
    expect(worst).toBeLessThan(1e-5);
  });

  it('steers: log-probs with α·(decoder row) added at the hook equal the float64 forward (1e-4)', async () => {
    const F = 7,
      alpha = 4;
    const doc = await operations.sae_steer.run(
      model,
      {
        prompt: PROMPT,
        sae_source: sae.dir,
        feature: F,
        alpha,
        max_new_tokens: 3,
        // hook_z reaches the stream through Gemma 3's post-norm, so no direct logit effect picks them: given
        ...(hook.endsWith('hook_z') ? { targets: ['#10', '#11', '#12'], controls: ['#20', '#21'] } : {}),
      },
      ctx,
    );
    expect(schemaErrors('sae_steer', viaJson(doc))).toEqual([]);
    const ids = doc.tokens.map((t: { id: number }) => t.id);
    const lp = (v: number | null) => {
      const res = steeredForward(rm, sae, ids, F, 'add', v ?? 0, v === null ? [] : undefined);
      const V = res.logits.dims[2];
      return logSoftmax64(res.logits.data, (ids.length - 1) * V, V);
    };
    const base = lp(null),
      steered = lp(alpha);
    let worst = 0,
      moved = 0;
    for (const t of [...doc.targets, ...doc.controls]) {
      worst = Math.max(
        worst,
        Math.abs(t.base_logprob - base[t.token_id]),
        Math.abs(t.steered_logprob! - steered[t.token_id]),
      );
      moved = Math.max(moved, Math.abs(t.delta!));
    }
    console.log(
      `${hook} (${architecture}) steer α=${alpha}: max |Δ log-prob| vs float64 ${worst.toExponential(2)}, largest delta ${moved.toFixed(3)}`,
    );
    expect(worst).toBeLessThan(1e-4);
    expect(moved).toBeGreaterThan(1e-2); // the edit did something
  });
});

describe('Gemma Scope 2 files that are not an SAE Loupe can attach', () => {
  it('a transcoder folder (hf_hook_point_out) is SAE_MISMATCH, pointing at transcoder sets', async () => {
    const sae = makeRandomSae({ hook: 'blocks.2.hook_mlp_out', dIn: 56, dSae: 8, layout: 'gemma_scope_2' });
    try {
      const cfg = JSON.parse(readFileSync(path.join(sae.dir, 'config.json'), 'utf8'));
      cfg.hf_hook_point_in = 'model.layers.2.pre_feedforward_layernorm.output';
      cfg.hf_hook_point_out = 'model.layers.2.post_feedforward_layernorm.output';
      writeFileSync(path.join(sae.dir, 'config.json'), JSON.stringify(cfg));
      const e = await operations.sae_features.run(model, { prompt: PROMPT, sae_source: sae.dir }, ctx).catch((x) => x);
      expect(e.code).toBe('SAE_MISMATCH');
      expect(e.hint).toMatch(/transcoder set/);
    } finally {
      rmSync(sae.dir, { recursive: true, force: true });
    }
  });

  it('an unknown hook point is UNSUPPORTED_CONFIG naming hf_hook_point_in', async () => {
    const sae = makeRandomSae({
      hook: 'blocks.2.hook_resid_pre',
      dIn: 56,
      dSae: 8,
      layout: 'gemma_scope_2',
      hfHook: 'model.layers.2.input_layernorm.input',
    });
    try {
      const e = await operations.sae_features.run(model, { prompt: PROMPT, sae_source: sae.dir }, ctx).catch((x) => x);
      expect(e.code).toBe('UNSUPPORTED_CONFIG');
      expect(e.details).toMatchObject({ field: 'hf_hook_point_in', value: 'model.layers.2.input_layernorm.input' });
    } finally {
      rmSync(sae.dir, { recursive: true, force: true });
    }
  });
});
