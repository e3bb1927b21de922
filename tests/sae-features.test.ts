/**
 * `sae_features` and `feature` on induction-gpt2 (SAE at blocks.1.hook_resid_pre, ReLU) and
 * stories260K (SAE at blocks.2.attn.hook_z, TopK, mapped through W_O), with random SAEs in
 * SAELens layout written by the test, against float64 oracles (tests/reference forward + the
 * SAE's float64 encode/decode; tests/sae-ref.ts):
 *  - top-K features and their activations, per-position and overall MSE/FVU within 1e-5;
 *  - final-position logit attribution = act_f · W_dec[f] · e (float64 readout) within 1e-5, and
 *    Σ features + b_dec + error = the hook's direct term;
 *  - `feature`: promoted/suppressed token weights and per-token activations within 1e-5;
 *  - descriptions next to the SAE appear, absent ones are null; mismatched SAEs are SAE_MISMATCH;
 *  - every document validates against its published JSON Schema.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { rmSync, writeFileSync } from 'node:fs';
import * as path from 'node:path';
import { loadModelNode } from '../src/node/load';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import type { LoadedModel } from '../src/engine/api';
import { operations } from '../src/ops/index';
import { makeRandomSae, saeEncode64, type RandomSae } from './helpers/random-sae';
import { loadModelDir, type RefModel } from './reference';
import { INDUCTION, STORIES, argmax64, logitWeights64, pullThroughWO, readout64, saeReference } from './sae-ref';
import { schemaErrors, viaJson } from './schema-helpers';
import type { OperationDocument } from '../src/ops/index';
type SaeFeaturesDocument = OperationDocument<'sae_features'>;
type FeatureDocument = OperationDocument<'feature'>;

const loaders = createNodeSaeLoaders({ cache: false });
const ctx = { loadSae: loaders.loadSae, loadSaeFile: loaders.loadSaeFile };
const close = (a: number, b: number, tol = 1e-5) => Math.abs(a - b) <= tol * Math.max(1, Math.abs(b));

const CASES = [
  {
    name: 'induction-gpt2',
    dir: INDUCTION,
    hook: 'blocks.1.hook_resid_pre',
    architecture: 'standard' as const,
    layer: 1,
    prompt: 'abcdefabcdef',
    prompts: ['xyzxyz', 'hello hello'],
  },
  {
    name: 'stories260K',
    dir: STORIES,
    hook: 'blocks.2.attn.hook_z',
    architecture: 'topk' as const,
    layer: 2,
    prompt: 'Once upon a time, there was a little',
    prompts: ['The cat sat', 'Lily was happy'],
  },
];

describe.each(CASES)('SAE operations on $name at $hook', ({ dir, hook, architecture, layer, prompt, prompts }) => {
  let model: LoadedModel;
  let ref: RefModel;
  let sae: RandomSae;
  let doc: SaeFeaturesDocument;
  const dSae = 96;
  /** hook-space → residual-space, float64, from the model files */
  let pullE: (e: Float64Array) => Float64Array;
  let pushV: (v: Float64Array) => Float64Array;

  beforeAll(async () => {
    model = await loadModelNode(dir);
    ref = loadModelDir(dir);
    sae = makeRandomSae({ hook, dIn: 64, dSae, architecture, k: 8, seed: 11 });
    // descriptions for the even features only, in Neuronpedia's export layout
    const records = Array.from({ length: dSae / 2 }, (_, i) => ({
      modelId: 'test-model',
      layer: `${layer}-test`,
      index: String(2 * i),
      description: `even feature ${2 * i}`,
      explanationModelName: 'none',
      typeName: 'test',
    }));
    writeFileSync(path.join(sae.dir, 'explanations.json'), JSON.stringify(records));
    if (hook.endsWith('hook_z')) {
      pullE = (e) => pullThroughWO(ref, layer, e);
      pushV = (v) => {
        // r = Σ_r v_r W_O[r, :], via the transpose of pullThroughWO applied to unit vectors
        const D = 64;
        const out = new Float64Array(D);
        for (let d = 0; d < D; d++) {
          const u = new Float64Array(D);
          u[d] = 1;
          const col = pullThroughWO(ref, layer, u);
          out[d] = col.reduce((a, c, r) => a + c * v[r], 0);
        }
        return out;
      };
    } else {
      pullE = (e) => e;
      pushV = (v) => Float64Array.from(v);
    }
    doc = await operations.sae_features.run(model, { prompt, sae_source: sae.dir, top_k: 10 }, ctx);
  });
  afterAll(async () => {
    await model?.dispose();
    if (sae) rmSync(sae.dir, { recursive: true, force: true });
  });

  it('top-K features and activations equal the float64 SAELens encoding of the float64 forward within 1e-5', () => {
    const ids = doc.tokens.map((t) => t.id);
    const r = saeReference(ref, sae, ids);
    expect(doc.positions).toHaveLength(ids.length);
    let worst = 0,
      listed = 0;
    for (const p of doc.positions) {
      const a = r.acts[p.position];
      const expected = Array.from(a.keys())
        .filter((f) => a[f] > 1e-4)
        .sort((x, y) => a[y] - a[x])
        .slice(0, 10);
      const strong = p.features.filter((e) => e.activation > 1e-4).map((e) => e.feature);
      expect(strong).toEqual(expected.slice(0, strong.length));
      expect(strong.length).toBe(Math.min(10, expected.length));
      for (const e of p.features) {
        worst = Math.max(worst, Math.abs(e.activation - a[e.feature]));
        listed++;
      }
      expect(p.l0).toBeGreaterThanOrEqual(p.features.length);
      if (architecture === 'topk') expect(p.l0).toBeLessThanOrEqual(8);
    }
    console.log(`${hook}: ${listed} listed features, max |Δ activation| ${worst.toExponential(2)}`);
    expect(listed).toBeGreaterThan(ids.length);
    expect(worst).toBeLessThan(1e-5);
  });

  it('MSE and FVU per position and overall equal the float64 reference within 1e-5', () => {
    const ids = doc.tokens.map((t) => t.id);
    const T = ids.length;
    const r = saeReference(ref, sae, ids);
    const mean = new Float64Array(64);
    for (let t = 0; t < T; t++) for (let i = 0; i < 64; i++) mean[i] += r.x[t * 64 + i] / T;
    let errAll = 0,
      totAll = 0;
    for (let t = 0; t < T; t++) {
      let err = 0,
        dev = 0;
      for (let i = 0; i < 64; i++) {
        err += (r.x[t * 64 + i] - r.recons[t][i]) ** 2;
        dev += (r.x[t * 64 + i] - mean[i]) ** 2;
      }
      errAll += err;
      totAll += dev;
      const got = doc.positions[t].reconstruction;
      expect(close(got.mse, err / 64)).toBe(true);
      expect(close(got.fvu!, err / dev)).toBe(true);
    }
    console.log(
      `${hook}: FVU ${doc.reconstruction.fvu} (float64 ${errAll / totAll}), MSE ${doc.reconstruction.mse} (float64 ${errAll / (T * 64)})`,
    );
    expect(close(doc.reconstruction.fvu!, errAll / totAll)).toBe(true);
    expect(close(doc.reconstruction.explained_variance!, 1 - errAll / totAll)).toBe(true);
    expect(close(doc.reconstruction.mse, errAll / (T * 64))).toBe(true);
    expect(doc.reconstruction.without_bos?.positions).toBe(T - 1);
  });

  it('final-position logit attribution = act_f · W_dec[f] · e (float64 readout, frozen scale) within 1e-5; the split is exact', () => {
    const ids = doc.tokens.map((t) => t.id);
    const T = ids.length;
    const r = saeReference(ref, sae, ids);
    const pred = argmax64(r.logits, (T - 1) * r.V, r.V);
    expect(doc.prediction.token_id).toBe(pred);
    const eHook = pullE(readout64(ref, pred, r.scale[T - 1]));
    const last = doc.positions[T - 1];
    let worst = 0;
    for (const e of last.features) {
      const dec = sae.W_dec.subarray(e.feature * 64, (e.feature + 1) * 64);
      const want = r.acts[T - 1][e.feature] * dec.reduce((a, v, i) => a + v * eHook[i], 0);
      worst = Math.max(worst, Math.abs(e.logit_attribution! - want));
    }
    for (const p of doc.positions.slice(0, -1)) for (const e of p.features) expect(e.logit_attribution).toBeNull();
    const la = doc.logit_attribution;
    const xe = eHook.reduce((a, v, i) => a + v * r.x[(T - 1) * 64 + i], 0);
    console.log(
      `${hook}: max |Δ feature DLA| ${worst.toExponential(2)}; x·e ${la.hook_direct_term} (float64 ${xe}); split residual ${la.check_abs_diff}`,
    );
    expect(la.available).toBe(true);
    expect(worst).toBeLessThan(1e-5);
    expect(close(la.hook_direct_term!, xe, 1e-5)).toBe(true);
    expect(la.check_abs_diff!).toBeLessThan(1e-4);
    expect(doc.method).toMatch(/frozen/);
  });

  it('descriptions from explanations.json next to the SAE appear next to features; absent ones are null', () => {
    expect(doc.descriptions.source).toMatch(/explanations\.json$/);
    expect(doc.descriptions.count).toBe(dSae / 2);
    expect(doc.descriptions.neuronpedia_layer).toBe(`${layer}-test`);
    let withDesc = 0,
      without = 0;
    for (const p of doc.positions)
      for (const e of p.features) {
        if (e.feature % 2 === 0) {
          expect(e.description).toBe(`even feature ${e.feature}`);
          withDesc++;
        } else {
          expect(e.description).toBeNull();
          without++;
        }
      }
    expect(withDesc).toBeGreaterThan(0);
    expect(without).toBeGreaterThan(0);
  });

  it('one position only; the document validates against the published schema', async () => {
    const one = await operations.sae_features.run(model, { prompt, sae_source: sae.dir, position: 2, top_k: 3 }, ctx);
    expect(one.positions.map((p: any) => p.position)).toEqual([2]);
    expect(one.positions[0].features).toEqual(doc.positions[2].features.slice(0, 3));
    expect(one.reconstruction).toEqual(doc.reconstruction);
    expect(schemaErrors('sae_features', viaJson(doc))).toEqual([]);
    expect(schemaErrors('sae_features', viaJson(one))).toEqual([]);
    expect(model.saes()).toHaveLength(1); // attached once, reused
  });

  it('feature: promoted/suppressed tokens and per-token activations equal the float64 reference within 1e-5', async () => {
    const f = doc.positions[doc.positions.length - 1].features[0].feature;
    const fd: FeatureDocument = await operations.feature.run(
      model,
      { prompt, prompts, sae_source: sae.dir, feature: f, top_k: 5 },
      ctx,
    );
    expect(schemaErrors('feature', viaJson(fd))).toEqual([]);
    const w = logitWeights64(ref, pushV(sae.W_dec.slice(f * 64, (f + 1) * 64)));
    const order = Array.from(w.keys()).sort((a, b) => w[b] - w[a]);
    expect(fd.logit_weights.promoted.map((t) => t.token_id)).toEqual(order.slice(0, 5));
    expect(fd.logit_weights.suppressed.map((t) => t.token_id)).toEqual(order.slice(-5).reverse());
    let worstW = 0;
    for (const t of [...fd.logit_weights.promoted, ...fd.logit_weights.suppressed])
      worstW = Math.max(worstW, Math.abs(t.weight - w[t.token_id]));
    expect(worstW).toBeLessThan(1e-5);
    expect(fd.logit_weights.final_norm_weight_applied).toBe(true);
    expect(fd.feature.description).toBe(f % 2 === 0 ? `even feature ${f}` : null);

    expect(fd.activations).toHaveLength(1 + prompts.length);
    let worstA = 0;
    for (const a of fd.activations) {
      const r = saeReference(
        ref,
        sae,
        a.tokens.map((t) => t.id),
      );
      a.values.forEach((v, t) => {
        worstA = Math.max(worstA, Math.abs(v - r.acts[t][f]));
      });
      expect(a.max).toBe(Math.max(...a.values));
      expect(a.values[a.max_position]).toBe(a.max);
    }
    console.log(
      `feature ${f}: max |Δ weight| ${worstW.toExponential(2)}, max |Δ activation| ${worstA.toExponential(2)}, max ${fd.max_activation}`,
    );
    expect(worstA).toBeLessThan(1e-5);
    expect(fd.activations[0].max).toBeGreaterThan(0);
  });
});

describe('SAE validation through the operations', () => {
  let model: LoadedModel;
  const dirs: string[] = [];
  beforeAll(async () => {
    model = await loadModelNode(INDUCTION);
  });
  afterAll(async () => {
    await model?.dispose();
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });
  const sae = (o: Parameters<typeof makeRandomSae>[0]) => {
    const s = makeRandomSae(o);
    dirs.push(s.dir);
    return s;
  };

  it('a mismatched d_in is SAE_MISMATCH naming both sizes', async () => {
    const s = sae({ hook: 'blocks.0.hook_resid_post', dIn: 32, dSae: 16, modelName: 'gpt2-small' });
    const err = await operations.sae_features
      .run(model, { prompt: 'abc', sae_source: s.dir }, ctx)
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'SAE_MISMATCH' });
    expect((err as Error).message).toMatch(/32.*64/);
    expect((err as { hint?: string }).hint).toMatch(/gpt2-small/);
  });

  it('a hook the model lacks is SAE_MISMATCH, for every SAE operation', async () => {
    const s = sae({ hook: 'blocks.9.hook_resid_post', dIn: 64, dSae: 16 });
    for (const [op, extra] of [
      ['sae_features', {}],
      ['feature', { feature: 0 }],
      ['sae_steer', { feature: 0, alpha: 1, targets: ['a'], max_new_tokens: 1 }],
    ] as const) {
      await expect(
        operations[op].run(model, { prompt: 'abc', sae_source: s.dir, ...extra }, ctx),
      ).rejects.toMatchObject({ code: 'SAE_MISMATCH' });
    }
  });

  it('a feature index past d_sae, a missing SAE folder and a missing loader are clear errors', async () => {
    const s = sae({ hook: 'blocks.0.hook_resid_post', dIn: 64, dSae: 16 });
    await expect(
      operations.feature.run(model, { prompt: 'abc', sae_source: s.dir, feature: 16 }, ctx),
    ).rejects.toMatchObject({ code: 'BAD_INPUT', message: expect.stringMatching(/16 features/) });
    await expect(
      operations.sae_features.run(model, { prompt: 'abc', sae_source: s.dir, sae_path: 'nope' }, ctx),
    ).rejects.toMatchObject({ code: 'FILE_NOT_FOUND' });
    await expect(
      operations.sae_features.run(model, { prompt: 'abc', sae_source: '/nonexistent/sae' }, ctx),
    ).rejects.toMatchObject({ code: 'MODEL_NOT_FOUND', hint: expect.stringMatching(/sae_source/) });
    await expect(operations.sae_features.run(model, { prompt: 'abc', sae_source: 'x/y@z' }, {})).rejects.toMatchObject({
      code: 'INTERNAL',
    });
    await expect(
      operations.sae_features.run(model, { prompt: 'abc', sae_source: s.dir, top_k: 5000 }, ctx),
    ).rejects.toMatchObject({ code: 'TOO_LARGE' });
    await expect(
      operations.sae_features.run(model, { prompt: 'abc', sae_source: s.dir, position: 99 }, ctx),
    ).rejects.toMatchObject({ code: 'BAD_INPUT' });
  });

  it('descriptions for another SAE are refused; inline descriptions work; cancellation is honoured', async () => {
    const s = sae({ hook: 'blocks.0.hook_resid_post', dIn: 64, dSae: 16 });
    await expect(
      operations.sae_features.run(
        model,
        { prompt: 'abc', sae_source: s.dir, descriptions: [{ index: '40', description: 'x' }] },
        ctx,
      ),
    ).rejects.toMatchObject({ code: 'BAD_INPUT', message: expect.stringMatching(/feature 40.*16 features/) });
    const d = await operations.sae_features.run(
      model,
      { prompt: 'abc', sae_source: s.dir, descriptions: JSON.stringify([{ index: 3, description: 'three' }]) },
      ctx,
    );
    expect(d.descriptions).toMatchObject({ source: 'inline', count: 1 });
    const ac = new AbortController();
    ac.abort();
    await expect(
      operations.sae_features.run(model, { prompt: 'abc', sae_source: s.dir }, { ...ctx, signal: ac.signal }),
    ).rejects.toMatchObject({ code: 'ABORTED' });
  });

  it('the SAE hook value reaching the residual stream non-linearly gives no attribution, with the reason', async () => {
    const s = sae({ hook: 'blocks.0.attn.hook_q', dIn: 64, dSae: 16 });
    const d = await operations.sae_features.run(model, { prompt: 'abcabc', sae_source: s.dir }, ctx);
    expect(d.logit_attribution).toMatchObject({ available: false, reason: expect.stringMatching(/non-linear/) });
    for (const p of d.positions) for (const e of p.features) expect(e.logit_attribution).toBeNull();
    expect(schemaErrors('sae_features', viaJson(d))).toEqual([]);
    // its activations still equal the float64 encoding of the engine's own hook value
    const run = await model.run(
      d.tokens.map((t: { id: number }) => t.id),
      { hooks: ['blocks.0.attn.hook_q'] },
    );
    const x = run.hooks['blocks.0.attn.hook_q'].data;
    for (const p of d.positions)
      for (const e of p.features) {
        expect(
          Math.abs(e.activation - saeEncode64(s, x.subarray(p.position * 64, (p.position + 1) * 64)).acts[e.feature]),
        ).toBeLessThan(1e-5);
      }
  });
});
