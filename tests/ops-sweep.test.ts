/**
 * `sweep` on stories260K:
 *  - on the unembedding direction of ' happy' at the last layer, the target log-prob and the
 *    normalised effect rise monotonically with α and KL grows with |α| on both sides of 0;
 *  - every curve value equals the float64 reference forward with the same edit within 1e-4;
 *  - the default α are multiples of the reference's mean residual norm;
 *  - the generated text at α = 0 is the plain generation, and at the largest α ' happy' dominates;
 *  - all α share one batched generation (engine runs ≤ 1 + max_new_tokens);
 *  - caps before any run.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel, RunOptions } from '../src/engine/api';
import { generateTokens } from '../src/ops/lib/generation';
import { operation as sweep } from '../src/ops/sweep';
import { trend } from '../src/ops/lib/steering';
import { loadModelDir, referenceForward, lastLogits, type RefModel, logSoftmax64 } from './reference';
import { schemaErrors, viaJson } from './schema-helpers';
import { SHARED } from './helpers/shared';

const DIR = SHARED + '/models/stories260K';
const PROMPT = 'Once upon a time, there was a';

let model: LoadedModel;
let ref: RefModel;
beforeAll(async () => {
  model = await loadModelNode(DIR);
  ref = loadModelDir(DIR);
});
afterAll(async () => {
  await model?.dispose();
});

describe('sweep', () => {
  it('unembedding direction: monotone curves that equal the float64 reference; text moves toward the target', async () => {
    const layer = model.info.n_layers - 1;
    const happy = model.tokenId(' happy')!;
    const doc = await sweep.run(
      model,
      {
        prompt: PROMPT,
        layer,
        direction: { kind: 'tokens', positive: ' happy' },
        max_new_tokens: 12,
        stop_at_eos: false,
      },
      {},
    );
    expect(schemaErrors('sweep', viaJson(doc))).toEqual([]);
    expect(doc.alpha_source).toBe('multiples');
    expect(doc.multiples).toEqual([-1, -0.5, -0.25, 0, 0.25, 0.5, 1]);

    // direction and α from the reference's own weights and activations
    const W = ref.tensors['lm_head.weight'];
    const D = W.dims[1];
    const raw = Float64Array.from({ length: D }, (_, j) => W.data[happy * D + j]);
    const norm = Math.sqrt(raw.reduce((a, b) => a + b * b, 0));
    const d = raw.map((x) => x / norm);
    const ids = doc.tokens.map((t) => t.id);
    const name = `blocks.${layer}.hook_resid_pre`;
    const run = (alpha: number) =>
      referenceForward(ref, ids, {
        record: (n) => n === name,
        hook: (n, v, dims) => {
          if (n !== name) return;
          const out = Float64Array.from(v);
          for (let t = 0; t < dims[1]; t++) for (let j = 0; j < D; j++) out[t * D + j] += alpha * d[j];
          return out;
        },
      });
    const base = run(0);
    const r = base.hooks[name];
    let residNorm = 0;
    for (let t = 1; t < ids.length; t++)
      residNorm +=
        Math.sqrt(Array.from({ length: D }, (_, j) => r.data[t * D + j] ** 2).reduce((a, b) => a + b, 0)) /
        (ids.length - 1);
    expect(Math.abs(doc.resid_norm - residNorm)).toBeLessThan(1e-4);
    doc.multiples!.forEach((m, i) => expect(Math.abs(doc.alphas[i] - m * residNorm)).toBeLessThan(1e-4));

    const baseLp = logSoftmax64(lastLogits(base));
    const controls = doc.controls.map((c) => c.token_id);
    let worst = 0;
    doc.alphas.forEach((a, i) => {
      const lp = logSoftmax64(lastLogits(run(a)));
      const td = lp[happy] - baseLp[happy];
      const cd = controls.reduce((s, c) => s + lp[c] - baseLp[c], 0) / controls.length;
      let kl = 0;
      for (let v = 0; v < lp.length; v++) kl += Math.exp(baseLp[v]) * (baseLp[v] - lp[v]);
      for (const [got, want] of [
        [doc.curves.target_logprob_delta[i], td],
        [doc.curves.control_logprob_delta[i], cd],
        [doc.curves.normalized_effect[i], td - cd],
        [doc.curves.kl_from_base[i], kl],
      ] as const) {
        worst = Math.max(worst, Math.abs(got - want));
        expect(Math.abs(got - want), `α=${a}: ${got} vs ${want}`).toBeLessThan(1e-4);
      }
    });

    // monotone where it should be, judged on the numbers themselves (not only the document's flag)
    const tdc = doc.curves.target_logprob_delta;
    for (let i = 1; i < tdc.length; i++) expect(tdc[i]).toBeGreaterThan(tdc[i - 1]);
    const ne = doc.curves.normalized_effect;
    for (let i = 1; i < ne.length; i++) expect(ne[i]).toBeGreaterThan(ne[i - 1]);
    expect(doc.monotone.target_logprob_delta).toBe('increasing');
    expect(doc.monotone.normalized_effect).toBe('increasing');
    const kl = doc.curves.kl_from_base;
    expect(kl[3]).toBeLessThan(1e-6);
    for (let i = 0; i < 3; i++) expect(kl[i]).toBeGreaterThan(kl[i + 1]);
    for (let i = 3; i < 6; i++) expect(kl[i + 1]).toBeGreaterThan(kl[i]);

    // generated text: α = 0 is the plain generation; at +1 × norm ' happy' takes over
    const plain = await generateTokens(model, ids, { maxNewTokens: 12, stopAtEos: false });
    expect(doc.generations[3].generated_token_ids).toEqual(plain.ids);
    const count = (g: number[]) => g.filter((x) => x === happy).length;
    expect(count(plain.ids)).toBe(0);
    expect(count(doc.generations[6].generated_token_ids)).toBeGreaterThanOrEqual(6);
    // one batched generation for all 7 α: the base run + 12 generation runs
    expect(doc.engine_runs).toBeLessThanOrEqual(1 + 12);
    console.log(
      `sweep ' happy' @L${layer}: target Δ ${tdc.map((x) => x.toFixed(2)).join(' ')}; worst |Δ| vs reference ${worst.toExponential(2)}; ` +
        `text at +1×norm ${JSON.stringify(doc.generations[6].generated_text)}`,
    );
  });

  it('explicit α list, no generation; trend() rules', async () => {
    const doc = await sweep.run(
      model,
      { prompt: PROMPT, layer: 2, direction: 'tokens: happy - big', alphas: [2, -2, 0], max_new_tokens: 0 },
      {},
    );
    expect(doc.alpha_source).toBe('alphas');
    expect(doc.multiples).toBeNull();
    expect(doc.alphas).toEqual([2, -2, 0]);
    expect(doc.generations.map((g) => g.generated_token_ids)).toEqual([[], [], []]);
    expect(Math.abs(doc.curves.target_logprob_delta[2])).toBeLessThan(1e-5);
    expect(schemaErrors('sweep', viaJson(doc))).toEqual([]);
    expect(trend([0, 1, 2], [0, 1, 1])).toBe('increasing');
    expect(trend([2, 1, 0], [0, 1, 2])).toBe('decreasing');
    expect(trend([0, 1, 2], [0, 2, 1])).toBe('not_monotone');
    expect(trend([0, 1, 2], [1, 1, 1])).toBe('flat');
  });

  it('caps fail before any engine run', async () => {
    let n = 0;
    const m = Object.create(model) as LoadedModel;
    m.run = (t: number[] | number[][], o?: RunOptions) => {
      n++;
      return model.run(t, o);
    };
    const base = { prompt: PROMPT, layer: 2, direction: 'tokens: happy - big' };
    await expect(sweep.run(m, { ...base, alphas: Array.from({ length: 33 }, (_, i) => i) }, {})).rejects.toMatchObject({
      code: 'TOO_LARGE',
    });
    await expect(sweep.run(m, { ...base, max_new_tokens: 1000 }, {})).rejects.toMatchObject({ code: 'TOO_LARGE' });
    await expect(sweep.run(m, { ...base, multiples: [] }, {})).rejects.toMatchObject({ code: 'BAD_INPUT' });
    expect(n).toBe(0);
  });
});
