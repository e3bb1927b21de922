// layer_ablation: every per-layer damage number equals the float64 reference (within 1e-4), and
// on induction-gpt2 with repeated random byte sequences layer-1 attention (the induction heads)
// is the most damaging component to remove, as the circuit and patching tests say.
import { describe, it, expect, beforeAll } from 'vitest';
import type { LoadedModel } from '../src/engine/api';
import { LoupeError } from '../src/engine/errors';
import { operation as layerAblation, layerAblationOutput } from '../src/ops/layer_ablation';
import type { RefModel } from './reference/forward64';
import { refRun, refEffect, meanSource, countingModel, byteRng, meanOf, distinctBytes } from './ops-ablate-reference';
import { schemaErrors, viaJson } from './schema-helpers';
import { useSharedModels } from './helpers/shared-models';
import type { OperationDocument } from '../src/ops/index';
type LayerAblationDocument = OperationDocument<'layer_ablation'>;

const TOL = 1e-4;

let gpt2: LoadedModel, stories: LoadedModel, gpt2Ref: RefModel, storiesRef: RefModel;
useSharedModels((m) => ({ gpt2, stories, gpt2Ref, storiesRef } = m));

function checkAgainstReference(doc: LayerAblationDocument, ref: RefModel, method: 'zero' | 'mean'): number {
  const ids = doc.tokens.map((t) => t.id);
  const hooks = doc.entries.map((e) => `blocks.${e.layer}.hook_${e.component}`);
  const clean = refRun(ref, ids, [], hooks);
  let worst = 0;
  for (const e of doc.entries) {
    const hook = `blocks.${e.layer}.hook_${e.component}`;
    const source = method === 'mean' ? meanSource([clean.hooks[hook]], ids.length) : undefined;
    const r = refEffect(clean.last, refRun(ref, ids, [{ hook, source }]).last, doc.answer.token_id);
    const err = Math.max(
      Math.abs(r.logprob_delta - e.logprob_delta),
      Math.abs(r.kl - e.kl),
      Math.abs(r.logit_delta - e.logit_delta),
    );
    worst = Math.max(worst, err);
  }
  expect(worst).toBeLessThan(TOL);
  return worst;
}

function validDocument(doc: LayerAblationDocument) {
  expect(layerAblationOutput.safeParse(doc).success).toBe(true);
  expect(viaJson(doc)).toEqual(doc);
  expect(schemaErrors('layer_ablation', viaJson(doc))).toEqual([]);
}

describe('layer_ablation on induction-gpt2', () => {
  // [256] + R + R, R = 30 distinct random bytes, target R[0]; 12 sequences, fixed seed
  const N = 12;
  const u = byteRng(21);
  const seqs = Array.from({ length: N }, () => distinctBytes(u, 30));
  const docs: LayerAblationDocument[] = [];
  beforeAll(async () => {
    for (const R of seqs)
      docs.push(await layerAblation.run(gpt2, { token_ids: [256, ...R, ...R], answer: `#${R[0]}` }, {}));
  });

  it('valid documents; zero and mean numbers equal the reference', async () => {
    for (const d of docs) validDocument(d);
    expect(docs[0].entries.map((e) => e.label)).toEqual(['L0.attn_out', 'L0.mlp_out', 'L1.attn_out', 'L1.mlp_out']);
    const z = checkAgainstReference(docs[0], gpt2Ref, 'zero');
    const R = seqs[0];
    const mean = await layerAblation.run(
      gpt2,
      { token_ids: [256, ...R, ...R], answer: `#${R[0]}`, method: 'mean' },
      {},
    );
    validDocument(mean);
    const m = checkAgainstReference(mean, gpt2Ref, 'mean');
    console.log(
      `induction-gpt2 layer_ablation vs float64 reference: zero ${z.toExponential(2)}, mean ${m.toExponential(2)}`,
    );
  });

  it('layer-1 attention is the most damaging on average (zero ablation)', () => {
    const labels = docs[0].entries.map((e) => e.label);
    const lp = labels.map((_, i) => docs.map((d) => d.entries[i].logprob_delta));
    const kl = labels.map((_, i) => docs.map((d) => d.entries[i].kl));
    const wins = labels.map(
      (l) => docs.filter((d) => `L${d.most_damaging.layer}.${d.most_damaging.component}` === l).length,
    );
    console.log(
      [
        `induction-gpt2 layer_ablation (zero), ${N} sequences, last position, target = correct next token:`,
        ...labels.map(
          (l, i) =>
            `  ${l.padEnd(12)} Δ log p mean ${meanOf(lp[i]).toFixed(3)}   KL mean ${meanOf(kl[i]).toFixed(3)}   most damaging in ${wins[i]}/${N}   [${lp[i].map((x) => x.toFixed(1)).join(' ')}]`,
        ),
      ].join('\n'),
    );
    const i1 = labels.indexOf('L1.attn_out');
    for (let i = 0; i < labels.length; i++) {
      if (i === i1) continue;
      expect(meanOf(lp[i1])).toBeLessThan(meanOf(lp[i]));
      expect(meanOf(kl[i1])).toBeGreaterThan(meanOf(kl[i]));
    }
    expect(meanOf(lp[i1])).toBeLessThan(-5);
    // the layer-1 MLP matters little for copying
    expect(Math.abs(meanOf(lp[labels.indexOf('L1.mlp_out')]))).toBeLessThan(1.5);
    for (const d of docs) for (const e of d.entries) expect(e.kl).toBeGreaterThanOrEqual(0);
  });
});

describe('layer_ablation on stories260K', () => {
  const prompt = 'Once upon a time, there was a little girl named Lily. She loved to';

  it('zero and mean equal the reference; per-layer table matches the entries', async () => {
    for (const method of ['zero', 'mean'] as const) {
      const doc = await layerAblation.run(stories, { prompt, method }, {});
      validDocument(doc);
      expect(doc.entries.length).toBe(10);
      expect(doc.layers.length).toBe(5);
      doc.layers.forEach((row, l) => {
        expect(row.attn_logprob_delta).toBe(doc.entries[2 * l].logprob_delta);
        expect(row.mlp_kl).toBe(doc.entries[2 * l + 1].kl);
      });
      const worst = doc.entries.reduce((a, b) => (b.logprob_delta < a.logprob_delta ? b : a));
      expect(doc.most_damaging).toMatchObject({ layer: worst.layer, component: worst.component });
      const err = checkAgainstReference(doc, storiesRef, method);
      console.log(
        `stories260K layer_ablation (${method}): max |engine − reference| ${err.toExponential(2)}; ${doc.entries.map((e) => `${e.label} ${e.logprob_delta.toFixed(2)}`).join(', ')}`,
      );
    }
  });

  it('bad input before any run; cancellation; progress', async () => {
    const counted = countingModel(stories);
    const e1 = await layerAblation.run(counted.model, { prompt, method: 'resample' as any }, {}).catch((e) => e);
    expect(e1).toBeInstanceOf(LoupeError);
    expect(e1.code).toBe('BAD_INPUT');
    const e2 = await layerAblation.run(counted.model, { prompt, answer: 'qqqqzzzz' }, {}).catch((e) => e);
    expect(e2.code).toBe('UNKNOWN_TOKEN');
    const e3 = await layerAblation.run(counted.model, { prompt: '' }, {}).catch((e) => e);
    expect(e3.code).toBe('EMPTY_PROMPT');
    expect(counted.runs()).toBe(0);

    const ac = new AbortController();
    ac.abort();
    await expect(layerAblation.run(stories, { prompt }, { signal: ac.signal })).rejects.toMatchObject({
      code: 'ABORTED',
    });
    const seen: { stage: string; done: number; total: number }[] = [];
    await layerAblation.run(stories, { prompt }, { onProgress: (p) => seen.push(p) });
    expect(seen.filter((s) => s.stage === 'ablating layers').at(-1)).toMatchObject({ done: 10, total: 10 });
  });
});
