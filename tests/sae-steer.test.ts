/**
 * `sae_steer` against the float64 reference forward with the feature's edit made at the SAE's
 * hook (tests/sae-ref.ts steeredForward):
 *  - α = 0 (add): the steered generation is the base generation, every delta is 0;
 *  - add α: base and steered log-probs of targets and controls within 1e-4 of the reference with
 *    α·W_dec[f] added at the hook (all positions, and chosen positions); the steered greedy text
 *    equals the reference's greedy decoding with the edit at every position;
 *  - clamp sweep: each curve point within 1e-4 of the reference with acts_f clamped (float64
 *    encoder), on stories260K (resid_post) and induction-gpt2 (mlp.hook_post);
 *  - bad inputs fail before any engine run; documents validate against the published schema.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { rmSync } from 'node:fs';
import { loadModelNode } from '../src/node/load';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import type { LoadedModel } from '../src/engine/api';
import { operations } from '../src/ops/index';
import { makeRandomSae, type RandomSae } from './helpers/random-sae';
import { loadModelDir, type RefModel } from './reference';
import { INDUCTION, STORIES, argmax64, steeredForward } from './sae-ref';
import { logSoftmax64 } from './reference';
import { schemaErrors, viaJson } from './schema-helpers';
import type { OperationDocument } from '../src/ops/index';
type SaeSteerDocument = OperationDocument<'sae_steer'>;

const loaders = createNodeSaeLoaders({ cache: false });
const ctx = { loadSae: loaders.loadSae, loadSaeFile: loaders.loadSaeFile };
const TOL = 1e-4;
const steer = operations.sae_steer;

/** final-position log-probs of the reference with the edit (none when v is null) */
function refLogprobs(
  ref: RefModel,
  sae: RandomSae,
  ids: number[],
  f: number,
  edit: 'add' | 'clamp',
  v: number | null,
  positions?: number[],
) {
  const res = steeredForward(ref, sae, ids, f, edit, v ?? 0, v === null ? [] : positions);
  const V = res.logits.dims[2];
  return logSoftmax64(res.logits.data, (ids.length - 1) * V, V);
}

function checkAgainstRef(doc: SaeSteerDocument, base: Float64Array, steered: Float64Array | null) {
  let worst = 0;
  for (const t of [...doc.targets, ...doc.controls]) {
    worst = Math.max(worst, Math.abs(t.base_logprob - base[t.token_id]));
    if (steered) {
      worst = Math.max(worst, Math.abs(t.steered_logprob! - steered[t.token_id]));
      worst = Math.max(worst, Math.abs(t.delta! - (steered[t.token_id] - base[t.token_id])));
    }
  }
  return worst;
}

describe('sae_steer on stories260K (SAE at blocks.2.hook_resid_post)', () => {
  let model: LoadedModel;
  let ref: RefModel;
  let sae: RandomSae;
  const PROMPT = 'Once upon a time, there was a';
  const F = 5;
  beforeAll(async () => {
    model = await loadModelNode(STORIES);
    ref = loadModelDir(STORIES);
    sae = makeRandomSae({ hook: 'blocks.2.hook_resid_post', dIn: 64, dSae: 48, seed: 21 });
  });
  afterAll(async () => {
    await model?.dispose();
    if (sae) rmSync(sae.dir, { recursive: true, force: true });
  });

  it('α = 0 gives the base generation and zero deltas', async () => {
    const doc: SaeSteerDocument = await steer.run(
      model,
      { prompt: PROMPT, sae_source: sae.dir, feature: F, alpha: 0, max_new_tokens: 8 },
      ctx,
    );
    expect(doc.mode).toBe('single');
    expect(doc.steered!.generated_token_ids).toEqual(doc.base.generated_token_ids);
    expect(doc.base.generated_token_ids).toHaveLength(8);
    for (const t of [...doc.targets, ...doc.controls]) expect(Math.abs(t.delta!)).toBeLessThan(1e-6);
    expect(doc.kl_from_base!).toBeLessThan(1e-9);
    // and the base is the plain model's greedy continuation (float64 reference)
    const seq = doc.tokens.map((t) => t.id);
    const out: number[] = [];
    for (let i = 0; i < 8; i++) {
      const r = steeredForward(ref, sae, seq, F, 'add', 0, []);
      const V = r.logits.dims[2];
      const next = argmax64(r.logits.data, (seq.length - 1) * V, V);
      out.push(next);
      seq.push(next);
    }
    expect(doc.base.generated_token_ids).toEqual(out);
    expect(schemaErrors('sae_steer', viaJson(doc))).toEqual([]);
  });

  it('add α: log-probs equal the float64 reference with α·W_dec[f] added at the hook within 1e-4; the greedy text too', async () => {
    const alpha = 6;
    const doc: SaeSteerDocument = await steer.run(
      model,
      { prompt: PROMPT, sae_source: sae.dir, feature: F, alpha, max_new_tokens: 5 },
      ctx,
    );
    const ids = doc.tokens.map((t) => t.id);
    const base = refLogprobs(ref, sae, ids, F, 'add', null);
    const steered = refLogprobs(ref, sae, ids, F, 'add', alpha);
    const worst = checkAgainstRef(doc, base, steered);
    // mean-delta metrics from the reference
    const mean = (list: { token_id: number }[]) =>
      list.reduce((a, t) => a + steered[t.token_id] - base[t.token_id], 0) / list.length;
    const td = mean(doc.targets),
      cd = mean(doc.controls);
    console.log(
      `add α=${alpha}: max |Δ log-prob| vs float64 ${worst.toExponential(2)}; target Δ ${doc.target_logprob_delta} (float64 ${td}), control Δ ${doc.control_logprob_delta} (float64 ${cd})`,
    );
    expect(worst).toBeLessThan(TOL);
    expect(Math.abs(doc.target_logprob_delta! - td)).toBeLessThan(TOL);
    expect(Math.abs(doc.normalized_effect! - (td - cd))).toBeLessThan(TOL);
    expect(Math.abs(doc.target_logprob_delta!)).toBeGreaterThan(1e-3); // the edit did something
    expect(doc.targets_rule).toMatch(/W_dec/);
    // steered greedy = the reference's greedy decoding with the edit at every position
    const seq = ids.slice();
    const out: number[] = [];
    for (let i = 0; i < 5; i++) {
      const r = steeredForward(ref, sae, seq, F, 'add', alpha);
      const V = r.logits.dims[2];
      const next = argmax64(r.logits.data, (seq.length - 1) * V, V);
      out.push(next);
      seq.push(next);
    }
    expect(doc.steered!.generated_token_ids).toEqual(out);
    expect(doc.interventions).toEqual([
      {
        hook: 'blocks.2.hook_resid_post.hook_sae_acts_post',
        op: 'add',
        neuron: F,
        positions: 'all',
        value: [1],
        alpha,
        sae: { source: sae.dir, path: '' },
      },
    ]);
  });

  it('add at chosen positions with given targets and controls equals the reference within 1e-4', async () => {
    const positions = [2, 4];
    const doc: SaeSteerDocument = await steer.run(
      model,
      {
        prompt: PROMPT,
        sae_source: sae.dir,
        feature: F,
        alpha: -8,
        positions,
        targets: ['#300', '#301'],
        controls: ['#50', '#60'],
        max_new_tokens: 0,
      },
      ctx,
    );
    const ids = doc.tokens.map((t) => t.id);
    const worst = checkAgainstRef(
      doc,
      refLogprobs(ref, sae, ids, F, 'add', null),
      refLogprobs(ref, sae, ids, F, 'add', -8, positions),
    );
    console.log(`add α=-8 at ${positions}: max |Δ log-prob| vs float64 ${worst.toExponential(2)}`);
    expect(worst).toBeLessThan(TOL);
    expect(doc.targets_rule).toBe('given');
    expect(doc.steered!.generated_token_ids).toEqual([]);
  });

  it('clamp sweep: every curve point equals the float64 reference with the activation clamped within 1e-4', async () => {
    const values = [0, 2, 5];
    const progress: string[] = [];
    const doc: SaeSteerDocument = await steer.run(
      model,
      { prompt: PROMPT, sae_source: sae.dir, feature: F, edit: 'clamp', alphas: values, max_new_tokens: 3 },
      { ...ctx, onProgress: (p) => progress.push(p.stage) },
    );
    expect(doc.mode).toBe('sweep');
    expect(doc.steered).toBeNull();
    expect(doc.sweep!.generations).toHaveLength(3);
    const ids = doc.tokens.map((t) => t.id);
    const base = refLogprobs(ref, sae, ids, F, 'clamp', null);
    let worst = checkAgainstRef(doc, base, null);
    values.forEach((v, i) => {
      const s = refLogprobs(ref, sae, ids, F, 'clamp', v);
      const mean = (list: { token_id: number }[]) =>
        list.reduce((a, t) => a + s[t.token_id] - base[t.token_id], 0) / list.length;
      worst = Math.max(
        worst,
        Math.abs(doc.sweep!.curves.target_logprob_delta[i] - mean(doc.targets)),
        Math.abs(doc.sweep!.curves.control_logprob_delta[i] - mean(doc.controls)),
      );
    });
    console.log(
      `clamp sweep ${values}: max |Δ| vs float64 ${worst.toExponential(2)}; target curve ${doc.sweep!.curves.target_logprob_delta.map((x) => x.toFixed(4))}`,
    );
    expect(worst).toBeLessThan(TOL);
    expect(progress).toContain('generating');
    expect(schemaErrors('sae_steer', viaJson(doc))).toEqual([]);
  });

  it('bad inputs fail before any engine run', async () => {
    const run = (inp: object) => steer.run(model, { prompt: PROMPT, sae_source: sae.dir, feature: F, ...inp }, ctx);
    await expect(run({})).rejects.toMatchObject({ code: 'BAD_INPUT', message: expect.stringMatching(/alpha/) });
    await expect(run({ alpha: 1, alphas: [1] })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await expect(run({ alphas: Array.from({ length: 40 }, (_, i) => i) })).rejects.toMatchObject({ code: 'TOO_LARGE' });
    await expect(run({ alpha: 1, max_new_tokens: 5000 })).rejects.toMatchObject({ code: 'TOO_LARGE' });
    await expect(run({ alpha: 1, positions: [99] })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await expect(run({ alpha: 1, targets: ['notasingletokenatall'] })).rejects.toMatchObject({ code: 'UNKNOWN_TOKEN' });
    await expect(run({ alpha: 1, feature: 48 })).rejects.toMatchObject({ code: 'BAD_INPUT' });
  });
});

describe('sae_steer on induction-gpt2 (SAE at blocks.0.mlp.hook_post, through W_out)', () => {
  let model: LoadedModel;
  let ref: RefModel;
  let sae: RandomSae;
  beforeAll(async () => {
    model = await loadModelNode(INDUCTION);
    ref = loadModelDir(INDUCTION);
    sae = makeRandomSae({ hook: 'blocks.0.mlp.hook_post', dIn: 256, dSae: 64, architecture: 'jumprelu', seed: 8 });
  });
  afterAll(async () => {
    await model?.dispose();
    if (sae) rmSync(sae.dir, { recursive: true, force: true });
  });

  it('add and clamp sweeps equal the float64 reference within 1e-4', async () => {
    const prompt = 'abcdeabcd';
    for (const edit of ['add', 'clamp'] as const) {
      const values = [-3, 1, 4];
      const doc: SaeSteerDocument = await steer.run(
        model,
        { prompt, sae_source: sae.dir, feature: 9, edit, alphas: values, max_new_tokens: 2 },
        ctx,
      );
      const ids = doc.tokens.map((t) => t.id);
      const base = refLogprobs(ref, sae, ids, 9, edit, null);
      let worst = checkAgainstRef(doc, base, null);
      values.forEach((v, i) => {
        const s = refLogprobs(ref, sae, ids, 9, edit, v);
        const mean = (list: { token_id: number }[]) =>
          list.reduce((a, t) => a + s[t.token_id] - base[t.token_id], 0) / list.length;
        worst = Math.max(
          worst,
          Math.abs(doc.sweep!.curves.target_logprob_delta[i] - mean(doc.targets)),
          Math.abs(doc.sweep!.curves.control_logprob_delta[i] - mean(doc.controls)),
        );
      });
      console.log(
        `${edit} sweep at mlp.hook_post: max |Δ| vs float64 ${worst.toExponential(2)}; trend ${doc.sweep!.monotone.target_logprob_delta}`,
      );
      expect(worst).toBeLessThan(TOL);
      expect(doc.feature.residual_norm).not.toBeNull();
      expect(schemaErrors('sae_steer', viaJson(doc))).toEqual([]);
    }
  });
});
