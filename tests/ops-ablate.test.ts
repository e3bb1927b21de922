// ablate: every delta equals the float64 reference forward with the same edit (within 1e-4),
// on induction-gpt2 (LayerNorm, learned positions) and stories260K (RMSNorm, rotary, GQA);
// batched variants equal one-at-a-time runs; caps and bad input fail before any engine run.
import { describe, it, expect, afterAll } from 'vitest';
import type { LoadedModel } from '../src/engine/api';
import { LoupeError } from '../src/engine/errors';
import { operation as ablate, ablateOutput, type AblateInput } from '../src/ops/ablate';
import { Ablator, resampleTokens, runVariants } from '../src/ops/lib/ablation';
import { resolveToken } from '../src/ops/lib/tokens';
import { type RefModel, type HookValue } from './reference/forward64';
import { refRun, refEffect, refSites, meanSource, countingModel, type RefEdit } from './ops-ablate-reference';
import { schemaErrors, viaJson } from './schema-helpers';
import { useSharedModels } from './helpers/shared-models';
import type { OperationDocument } from '../src/ops/index';
type AblateDocument = OperationDocument<'ablate'>;

const TOL = 1e-4;

type Target = { layer: number; head?: number; neuron?: number; component?: string };

interface Case {
  name: string;
  model: () => LoadedModel;
  ref: () => RefModel;
  /** input fields selecting the prompt */
  promptInput: Partial<AblateInput>;
  /** every kind of target, for this model's shapes */
  targets: Target[];
  meanPrompts: string[];
  resamplePrompt: string;
}

let gpt2: LoadedModel, stories: LoadedModel, gpt2Ref: RefModel, storiesRef: RefModel;
useSharedModels((m) => ({ gpt2, stories, gpt2Ref, storiesRef } = m));

// a repeated byte sequence (not valid text: given as ids) for induction-gpt2
const R = [201, 17, 99, 140, 3, 250, 77, 64, 180, 33, 129, 8];
const cases: Case[] = [
  {
    name: 'induction-gpt2',
    model: () => gpt2,
    ref: () => gpt2Ref,
    promptInput: { token_ids: [256, ...R, ...R.slice(0, 7)] },
    targets: [
      { layer: 0, head: 0 },
      { layer: 1, head: 3 },
      { layer: 0, neuron: 5 },
      { layer: 1, neuron: 255 },
      { layer: 0, component: 'resid_pre' },
      { layer: 1, component: 'resid_pre' },
      { layer: 0, component: 'resid_mid' },
      { layer: 1, component: 'resid_post' },
      { layer: 1, component: 'attn_out' },
      { layer: 0, component: 'mlp_out' },
      { layer: 1, component: 'mlp_post' },
      { layer: 0, component: 'layer' },
      { layer: 1 },
    ],
    meanPrompts: ['The cat sat on the mat.', 'abcabcabc', 'Hello, world! How are you today?'],
    resamplePrompt: 'A quick brown fox jumps over the lazy dog.',
  },
  {
    name: 'stories260K',
    model: () => stories,
    ref: () => storiesRef,
    promptInput: { prompt: 'Once upon a time, there was a little girl named Lily. She loved to' },
    targets: [
      { layer: 0, head: 0 },
      { layer: 2, head: 5 },
      { layer: 4, head: 7 },
      { layer: 1, neuron: 17 },
      { layer: 4, neuron: 171 },
      { layer: 0, component: 'resid_pre' },
      { layer: 3, component: 'resid_mid' },
      { layer: 4, component: 'resid_post' },
      { layer: 2, component: 'attn_out' },
      { layer: 3, component: 'mlp_out' },
      { layer: 1, component: 'mlp_post' },
      { layer: 2, component: 'layer' },
    ],
    meanPrompts: ['Tom had a big red ball.', 'The sun was shining and the birds sang.'],
    resamplePrompt: 'One day, a little boy named Tim went to the park with his mom and dad to play.',
  },
];

/** the reference's effect of ablating `targets` together, with sources built from reference runs */
function referenceDelta(
  ref: RefModel,
  ids: number[],
  targets: Target[],
  method: 'zero' | 'mean' | 'resample',
  positions: 'all' | number[],
  answer: number,
  extra: { meanIds?: number[][]; resampleIds?: number[] },
) {
  const sites = targets.flatMap(refSites);
  const hooks = [...new Set(sites.map((s) => s.hook))];
  const clean = refRun(ref, ids, [], hooks);
  let sources: Record<string, Float64Array> = {};
  if (method === 'mean') {
    const runs: Record<string, HookValue>[] = extra.meanIds
      ? extra.meanIds.map((m) => refRun(ref, m, [], hooks).hooks)
      : [clean.hooks];
    for (const h of hooks)
      sources[h] = meanSource(
        runs.map((r) => r[h]),
        ids.length,
      );
  } else if (method === 'resample') {
    const rs = refRun(ref, extra.resampleIds!, [], hooks).hooks;
    for (const h of hooks) sources[h] = rs[h].data;
  }
  const edits: RefEdit[] = sites.map((s) => ({
    ...s,
    positions,
    ...(method === 'zero' ? {} : { source: sources[s.hook] }),
  }));
  const edited = refRun(ref, ids, edits);
  return refEffect(clean.last, edited.last, answer);
}

function expectMatchesReference(
  doc: AblateDocument,
  c: Case,
  targets: Target[],
  method: 'zero' | 'mean' | 'resample',
  positions: 'all' | number[],
  extra: { meanIds?: number[][]; resampleIds?: number[] },
  log: string[],
) {
  const ids = doc.tokens.map((t) => t.id);
  const answer = doc.answer.token_id;
  let worst = 0;
  targets.forEach((t, i) => {
    const r = referenceDelta(c.ref(), ids, [t], method, positions, answer, extra);
    const e = doc.entries[i];
    expect(e.layer).toBe(t.layer);
    const err = Math.max(
      Math.abs(e.logit_delta - r.logit_delta),
      Math.abs(e.logprob_delta - r.logprob_delta),
      Math.abs(e.kl - r.kl),
    );
    worst = Math.max(worst, err);
    if (err > TOL) log.push(`MISMATCH ${e.label}: engine ${e.logit_delta} vs reference ${r.logit_delta}`);
    expect(Math.abs(e.logit_delta - r.logit_delta)).toBeLessThan(TOL);
    expect(Math.abs(e.logprob_delta - r.logprob_delta)).toBeLessThan(TOL);
    expect(Math.abs(e.kl - r.kl)).toBeLessThan(TOL);
  });
  if (targets.length > 1) {
    const r = referenceDelta(c.ref(), ids, targets, method, positions, answer, extra);
    expect(doc.combined).not.toBeNull();
    expect(Math.abs(doc.combined!.logit_delta - r.logit_delta)).toBeLessThan(TOL);
    expect(Math.abs(doc.combined!.logprob_delta - r.logprob_delta)).toBeLessThan(TOL);
    worst = Math.max(worst, Math.abs(doc.combined!.logit_delta - r.logit_delta));
  }
  // the ablations must actually do something, or agreement proves nothing
  expect(doc.entries.some((e) => Math.abs(e.logit_delta) > 0.01)).toBe(true);
  log.push(
    `${c.name} ${method} positions=${JSON.stringify(positions)}: ${targets.length} targets + combined, max |engine − reference| = ${worst.toExponential(2)}; deltas ${doc.entries.map((e) => `${e.label}:${e.logit_delta.toFixed(3)}`).join(' ')}`,
  );
}

function validDocument(doc: AblateDocument) {
  expect(ablateOutput.safeParse(doc).success).toBe(true);
  expect(viaJson(doc)).toEqual(doc); // plain JSON numbers only
  expect(schemaErrors('ablate', viaJson(doc))).toEqual([]);
}

describe.each(cases)('ablate on $name equals the float64 reference', (c) => {
  const log: string[] = [];
  afterAll(() => console.log(log.join('\n')));

  it('zero ablation of heads (hook_z), neurons, every component and whole layers, singly and together', async () => {
    const [first, ...rest] = c.targets;
    const doc = await ablate.run(
      c.model(),
      { ...c.promptInput, ...first, targets: rest, method: 'zero' } as AblateInput,
      {},
    );
    validDocument(doc);
    expect(doc.entries.length).toBe(c.targets.length);
    expect(doc.logit_delta).toBeUndefined(); // several targets: no top-level delta
    expectMatchesReference(doc, c, c.targets, 'zero', 'all', {}, log);
  });

  it("mean ablation over the prompt's positions", async () => {
    const ts = c.targets.slice(0, 6);
    const doc = await ablate.run(
      c.model(),
      { ...c.promptInput, layer: ts[0].layer, head: ts[0].head, targets: ts.slice(1), method: 'mean' } as AblateInput,
      {},
    );
    validDocument(doc);
    expectMatchesReference(doc, c, ts, 'mean', 'all', {}, log);
  });

  it('mean ablation over a supplied set of prompts', async () => {
    const ts = [c.targets[1], c.targets[3], c.targets[9]];
    const doc = await ablate.run(
      c.model(),
      { ...c.promptInput, targets: ts, method: 'mean', mean_prompts: c.meanPrompts } as AblateInput,
      {},
    );
    const meanIds = c.meanPrompts.map((p) => c.model().tokenize(p));
    expectMatchesReference(doc, c, ts, 'mean', 'all', { meanIds }, log);
    expect(doc.interventions[0].from).toContain(`${c.meanPrompts.length} supplied prompts`);
  });

  it('resample ablation from a given prompt and from seeded random tokens', async () => {
    const ts = [c.targets[0], c.targets[2], c.targets[4], c.targets[8]];
    const doc = await ablate.run(
      c.model(),
      { ...c.promptInput, targets: ts, method: 'resample', resample_prompt: c.resamplePrompt } as AblateInput,
      {},
    );
    const ids = doc.tokens.map((t) => t.id);
    const resampleIds = c.model().tokenize(c.resamplePrompt).slice(0, ids.length);
    expectMatchesReference(doc, c, ts, 'resample', 'all', { resampleIds }, log);

    const seeded = await ablate.run(
      c.model(),
      { ...c.promptInput, targets: ts, method: 'resample', seed: 7 } as AblateInput,
      {},
    );
    const rnd = resampleTokens(c.model(), ids, 7).ids;
    expect(rnd.length).toBe(ids.length);
    expectMatchesReference(seeded, c, ts, 'resample', 'all', { resampleIds: rnd }, log);
    // another seed draws other tokens, hence other numbers; the same seed repeats exactly
    const again = await ablate.run(
      c.model(),
      { ...c.promptInput, targets: ts, method: 'resample', seed: 7 } as AblateInput,
      {},
    );
    expect(again.entries).toEqual(seeded.entries);
    const other = await ablate.run(
      c.model(),
      { ...c.promptInput, targets: ts, method: 'resample', seed: 8 } as AblateInput,
      {},
    );
    expect(other.entries.map((e) => e.logit_delta)).not.toEqual(seeded.entries.map((e) => e.logit_delta));
  });

  it('a subset of positions (zero and mean)', async () => {
    const ts = [c.targets[0], c.targets[2], c.targets[5], c.targets[8], c.targets[9]];
    const positions = [1, 2, 5];
    for (const method of ['zero', 'mean'] as const) {
      const doc = await ablate.run(c.model(), { ...c.promptInput, targets: ts, method, positions } as AblateInput, {});
      expect(doc.positions).toEqual(positions);
      expect(doc.interventions.every((iv) => JSON.stringify(iv.positions) === JSON.stringify(positions))).toBe(true);
      expectMatchesReference(doc, c, ts, method, positions, {}, log);
    }
  });

  it('one target: top-level logit_delta (ablated − clean logit of the clean prediction)', async () => {
    const t = c.targets[8];
    const doc = await ablate.run(c.model(), { ...c.promptInput, ...t, method: 'zero' } as AblateInput, {});
    validDocument(doc);
    expect(doc.answer.source).toBe('clean_prediction');
    expect(doc.answer.token_id).toBe(doc.clean.predicted_token_id);
    expect(doc.combined).toBeNull();
    expect(doc.logit_delta).toBe(doc.entries[0].logit_delta);
    const ids = doc.tokens.map((x) => x.id);
    const r = referenceDelta(c.ref(), ids, [t], 'zero', 'all', doc.answer.token_id, {});
    expect(Math.abs(doc.logit_delta! - r.logit_delta)).toBeLessThan(TOL);
    log.push(
      `${c.name} single ${doc.entries[0].label}: logit_delta ${doc.logit_delta!.toFixed(5)} (reference ${r.logit_delta.toFixed(5)}), new prediction ${JSON.stringify(doc.new_predicted_token)}`,
    );
  });

  it('a batch of variants equals the variants run one at a time', async () => {
    const model = c.model();
    const multi = await ablate.run(model, { ...c.promptInput, targets: c.targets, method: 'mean' } as AblateInput, {});
    let worst = 0;
    for (let i = 0; i < c.targets.length; i++) {
      const one = await ablate.run(
        model,
        { ...c.promptInput, targets: [c.targets[i]], method: 'mean' } as AblateInput,
        {},
      );
      worst = Math.max(
        worst,
        Math.abs(one.entries[0].logit_delta - multi.entries[i].logit_delta),
        Math.abs(one.entries[0].kl - multi.entries[i].kl),
      );
    }
    expect(worst).toBeLessThan(1e-5);
    // the library directly: the same variants with maxBatch 64 and maxBatch 1, all logits compared
    const ids = multi.tokens.map((t) => t.id);
    const hooks = c.targets.flatMap(refSites).map((s) => s.hook);
    const { ablator } = await Ablator.prepare(model, ids, hooks, { method: 'mean', positions: [0, 2, 3] }, {});
    const variants = [
      [],
      ...c.targets.map((t) => ablator.interventions([t as any])),
      ablator.interventions(c.targets as any),
    ];
    // every token's logit kept by the reduction: the whole rows compared
    const reduce = { ids: Array.from({ length: model.info.d_vocab }, (_, i) => i) };
    const batched = await runVariants(model, ids, variants, { ctx: {}, maxBatch: 64, reduce });
    const single = await runVariants(model, ids, variants, { ctx: {}, maxBatch: 1, reduce });
    const split = await runVariants(model, ids, variants, { ctx: {}, maxBatch: 5, reduce });
    let diff = 0;
    for (let v = 0; v < variants.length; v++)
      for (let k = 0; k < batched[v].at.length; k++)
        diff = Math.max(diff, Math.abs(batched[v].at[k] - single[v].at[k]), Math.abs(split[v].at[k] - single[v].at[k]));
    expect(diff).toBeLessThan(1e-5);
    log.push(
      `${c.name}: ${variants.length} variants batched vs one at a time: max |Δ logit| = ${diff.toExponential(2)}; via ablate: ${worst.toExponential(2)}`,
    );
  });
});

describe('ablate: input checks, caps, cancellation, progress', () => {
  async function rejects(input: Partial<AblateInput>, code: string, model: LoadedModel = stories) {
    const counted = countingModel(model);
    let err: unknown;
    try {
      await ablate.run(counted.model, input as AblateInput, {});
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(LoupeError);
    expect((err as LoupeError).code).toBe(code);
    expect((err as LoupeError).hint ?? '').not.toBe('');
    expect(counted.runs()).toBe(0); // refused before any engine run
    return err as LoupeError;
  }

  it('refuses bad targets, positions, tokens and over-long prompts before running', async () => {
    const p = { prompt: 'Once upon a time' };
    expect((await rejects({ ...p, layer: 5, head: 0 }, 'BAD_INPUT')).message).toMatch(/5 layers/);
    expect((await rejects({ ...p, layer: 0, head: 8 }, 'BAD_INPUT')).message).toMatch(/8 heads/);
    await rejects({ ...p, layer: 0, neuron: 172 }, 'BAD_INPUT');
    await rejects({ ...p, layer: 0, head: 1, neuron: 2 }, 'BAD_INPUT');
    await rejects({ ...p, head: 1 }, 'BAD_INPUT');
    await rejects({ ...p }, 'BAD_INPUT');
    await rejects({ ...p, layer: 0, component: 'resid_pre', positions: [1, 99] }, 'BAD_INPUT');
    await rejects({ ...p, layer: 0, component: 'bogus' as any }, 'BAD_INPUT');
    await rejects({ ...p, layer: 0, method: 'zero', mean_prompts: ['x'] }, 'BAD_INPUT');
    await rejects({ ...p, layer: 0, method: 'resample', resample_prompt: 'Hi' }, 'BAD_INPUT');
    await rejects({ ...p, layer: 0, answer: 'notasingletokenatall' }, 'UNKNOWN_TOKEN');
    await rejects({ prompt: '', layer: 0 }, 'EMPTY_PROMPT');
    await rejects({ token_ids: [256, ...Array(64).fill(65)], layer: 0 }, 'PROMPT_TOO_LONG', gpt2);
    await rejects({ token_ids: [257], layer: 0 }, 'BAD_TOKEN_ID', gpt2);
    await rejects({ ...p, targets: Array(300).fill({ layer: 0 }) }, 'BAD_INPUT');
  });

  it('honours cancellation and reports progress', async () => {
    const ac = new AbortController();
    ac.abort();
    await expect(
      ablate.run(stories, { prompt: 'Once upon a time', layer: 0 }, { signal: ac.signal }),
    ).rejects.toMatchObject({ code: 'ABORTED' });
    const seen: { stage: string; done: number; total: number }[] = [];
    await ablate.run(
      stories,
      { prompt: 'Once upon a time', layer: 0, targets: [{ layer: 1, head: 2 }] },
      { onProgress: (p) => seen.push(p) },
    );
    const last = seen.filter((s) => s.stage === 'ablating').at(-1)!;
    expect(last.done).toBe(last.total);
    expect(last.total).toBe(3); // two singles + together
  });

  it('answer: reports the given token instead of the prediction', async () => {
    const doc = await ablate.run(
      stories,
      { prompt: 'Once upon a time', layer: 1, component: 'attn_out', answer: ' there' },
      {},
    );
    expect(doc.answer.source).toBe('answer');
    expect(doc.answer.token_id).toBe(resolveToken(stories, ' there'));
    const r = referenceDelta(
      storiesRef,
      doc.tokens.map((t) => t.id),
      [{ layer: 1, component: 'attn_out' }],
      'zero',
      'all',
      doc.answer.token_id,
      {},
    );
    expect(Math.abs(doc.logit_delta! - r.logit_delta)).toBeLessThan(TOL);
  });
});
