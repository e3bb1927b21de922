/**
 * SAEs spliced into the graph: encode/decode vs a float64 SAELens reference (1e-5), JumpReLU and
 * TopK semantics, no-edit runs equal the base model exactly, feature steering equals the float64
 * model reference with α·W_dec[f] added at the hook, and mismatched SAEs are rejected.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import * as path from 'node:path';
import { rmSync } from 'node:fs';
import { loadModelNode } from '../src/node/load';
import { FolderSource } from '../src/node/folder-source';
import { loadSaeFiles } from '../src/engine/sae';
import type { LoadedModel } from '../src/engine/api';
import { makeRandomSae, saeEncode64, saeDecode64, type RandomSae } from './helpers/random-sae';
import { loadModelDir, referenceForward, maxAbsDiff } from './reference';
import { SHARED } from './helpers/shared';

const INDUCTION = path.join(SHARED, 'models/induction-gpt2');
const STORIES = path.join(SHARED, 'models/stories260K');

async function attach(model: LoadedModel, sae: RandomSae, id: string) {
  return model.attachSae(await loadSaeFiles(new FolderSource(sae.dir), ''), id);
}

function checkAgainstReference(sae: RandomSae, x: Float32Array, acts: Float32Array, recons: Float32Array, T: number) {
  const { d_in: dIn, d_sae: dSae } = sae.cfg;
  let worstA = 0,
    worstR = 0,
    active = 0;
  for (let t = 0; t < T; t++) {
    const r = saeEncode64(sae, x.subarray(t * dIn, (t + 1) * dIn));
    worstA = Math.max(worstA, maxAbsDiff(r.acts, acts.subarray(t * dSae, (t + 1) * dSae)).maxAbs);
    worstR = Math.max(worstR, maxAbsDiff(saeDecode64(sae, r.acts), recons.subarray(t * dIn, (t + 1) * dIn)).maxAbs);
    active += r.acts.filter((v) => v > 0).length;
  }
  return { worstA, worstR, active };
}

describe.each([
  { model: 'induction-gpt2', dir: INDUCTION, hook: 'blocks.0.hook_resid_post', dIn: 64 },
  { model: 'stories260K', dir: STORIES, hook: 'blocks.2.attn.hook_z', dIn: 64 },
])('SAE on $model at $hook', ({ dir, hook, dIn }) => {
  let model: LoadedModel;
  const saes: RandomSae[] = [];
  let tokens: number[];
  beforeAll(async () => {
    model = await loadModelNode(dir);
    tokens = model.tokenize('abc abd abc abd');
    for (const architecture of ['standard', 'jumprelu', 'topk'] as const) {
      const s = makeRandomSae({ hook, dIn, dSae: 96, architecture, k: 6, seed: saes.length + 3 });
      saes.push(s);
      await attach(model, s, architecture);
    }
  });
  afterAll(async () => {
    await model?.dispose();
    for (const s of saes) rmSync(s.dir, { recursive: true, force: true });
  });

  it.each(['standard', 'jumprelu', 'topk'])(
    '%s: feature activations and reconstruction equal the float64 SAELens math within 1e-5',
    async (arch) => {
      const sae = saes.find((s) => s.cfg.architecture === arch)!;
      const out = await model.run(tokens, {
        sae: arch,
        hooks: [hook, `${hook}.hook_sae_acts_post`, `${hook}.hook_sae_recons`, `${hook}.hook_sae_error`],
      });
      const T = tokens.length;
      expect(out.hooks[`${hook}.hook_sae_acts_post`].dims).toEqual([1, T, 96]);
      const { worstA, worstR, active } = checkAgainstReference(
        sae,
        out.hooks[hook].data,
        out.hooks[`${hook}.hook_sae_acts_post`].data,
        out.hooks[`${hook}.hook_sae_recons`].data,
        T,
      );
      console.log(
        `${arch} at ${hook}: |Δ acts| ${worstA.toExponential(2)}, |Δ recons| ${worstR.toExponential(2)}, ${active} active of ${T * 96}`,
      );
      expect(worstA).toBeLessThan(1e-5);
      expect(worstR).toBeLessThan(1e-5);
      expect(active).toBeGreaterThan(0);
      if (arch === 'topk') expect(active).toBeLessThanOrEqual(T * 6);
      // error = x − recons
      const x = out.hooks[hook].data,
        rc = out.hooks[`${hook}.hook_sae_recons`].data,
        er = out.hooks[`${hook}.hook_sae_error`].data;
      for (let i = 0; i < x.length; i++) expect(Math.abs(x[i] - rc[i] - er[i])).toBeLessThan(1e-5);
    },
  );

  it('JumpReLU thresholds are respected: a feature with pre-activation in (0, threshold] is off', async () => {
    const sae = saes.find((s) => s.cfg.architecture === 'jumprelu')!;
    const out = await model.run(tokens, { sae: 'jumprelu', hooks: [hook, `${hook}.hook_sae_acts_post`] });
    const acts = out.hooks[`${hook}.hook_sae_acts_post`].data;
    let gated = 0;
    for (let t = 0; t < tokens.length; t++) {
      const { pre } = saeEncode64(sae, out.hooks[hook].data.subarray(t * dIn, (t + 1) * dIn));
      pre.forEach((p, j) => {
        if (p > 1e-4 && p < sae.threshold![j] - 1e-4) {
          gated++;
          expect(acts[t * 96 + j]).toBe(0);
        }
      });
    }
    expect(gated).toBeGreaterThan(0); // the test really exercised the threshold
  });

  it('with no feature edited the SAE run equals the base model exactly', async () => {
    const base = await model.run(tokens);
    const withSae = await model.run(tokens, { sae: 'standard' });
    expect(maxAbsDiff(base.logits.data, withSae.logits.data).maxAbs).toBe(0);
    const zeroAlpha = await model.run(tokens, {
      sae: 'standard',
      interventions: [{ hook: `${hook}.hook_sae_acts_post`, op: 'add', neuron: 3, alpha: 0, value: [1] }],
    });
    expect(maxAbsDiff(base.logits.data, zeroAlpha.logits.data).maxAbs).toBe(0);
  });

  it('adding α to feature f equals the float64 model reference with α·W_dec[f] added at the hook', async () => {
    const sae = saes.find((s) => s.cfg.architecture === 'standard')!;
    const f = 7,
      alpha = 2.5;
    const out = await model.run(tokens, {
      sae: 'standard',
      interventions: [{ hook: `${hook}.hook_sae_acts_post`, op: 'add', neuron: f, alpha, value: [1] }],
    });
    const ref = referenceForward(loadModelDir(dir), tokens, {
      hook: (name, v) => {
        if (name !== hook) return;
        const dec = sae.W_dec.subarray(f * dIn, (f + 1) * dIn);
        for (let i = 0; i < v.length; i++) v[i] += alpha * dec[i % dIn];
        return v;
      },
    });
    const d = maxAbsDiff(ref.logits.data, out.logits.data).maxAbs;
    console.log(`feature steering vs float64 reference: |Δ logits| ${d.toExponential(2)}`);
    expect(d).toBeLessThan(1e-4);
    // and it moved something
    const base = await model.run(tokens);
    expect(maxAbsDiff(base.logits.data, out.logits.data).maxAbs).toBeGreaterThan(1e-3);
  });
});

describe('SAE validation', () => {
  let model: LoadedModel;
  beforeAll(async () => {
    model = await loadModelNode(INDUCTION);
  });
  afterAll(async () => {
    await model?.dispose();
  });

  it('a mismatched d_in is SAE_MISMATCH and names both sizes', async () => {
    const s = makeRandomSae({ hook: 'blocks.0.hook_resid_post', dIn: 32, dSae: 16, modelName: 'gpt2-small' });
    const err = await attach(model, s, 'x').catch((e) => e);
    expect(err).toMatchObject({ code: 'SAE_MISMATCH' });
    expect(err.message).toMatch(/32.*64/);
    rmSync(s.dir, { recursive: true, force: true });
  });

  it('a hook the model lacks is SAE_MISMATCH', async () => {
    const s = makeRandomSae({ hook: 'blocks.7.hook_resid_post', dIn: 64, dSae: 16 });
    await expect(attach(model, s, 'y')).rejects.toMatchObject({ code: 'SAE_MISMATCH' });
    rmSync(s.dir, { recursive: true, force: true });
  });

  it('running with an SAE id that is not attached is a clear error', async () => {
    await expect(model.run([256, 97], { sae: 'nope' })).rejects.toMatchObject({ code: 'BAD_INPUT' });
  });
});
