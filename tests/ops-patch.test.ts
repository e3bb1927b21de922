// patch: heatmap cells equal the float64 reference doing the same patch (within 1e-4), and on
// induction-gpt2 the picture agrees with the circuit: layer-1 attention at the last position
// carries the answer; patching the layer-1 heads' outputs restores most of the metric.
import { describe, it, expect, beforeAll } from 'vitest';
import type { LoadedModel } from '../src/engine/api';
import { LoupeError } from '../src/engine/errors';
import { operation as patch, patchOutput } from '../src/ops/patch';
import type { RefModel } from './reference/forward64';
import { refRun, countingModel, byteRng, meanOf, type RefEdit, distinctBytes } from './ops-ablate-reference';
import { schemaErrors, viaJson } from './schema-helpers';
import { useSharedModels } from './helpers/shared-models';
import type { OperationDocument } from '../src/ops/index';
type PatchDocument = OperationDocument<'patch'>;

const TOL = 1e-4;

let gpt2: LoadedModel, stories: LoadedModel, gpt2Ref: RefModel, storiesRef: RefModel;
useSharedModels((m) => ({ gpt2, stories, gpt2Ref, storiesRef } = m));

/**
 * The reference's normalised metric for patching cells (hook, positions, head) from the clean run
 * into the corrupted run, with the document's answer and counterfactual. The clean and corrupted
 * reference runs are done once per document.
 */
function refPatcher(ref: RefModel, doc: PatchDocument, L: number) {
  const clean = doc.tokens.map((t) => t.id);
  const corr = doc.corrupted_tokens.map((t) => t.id);
  const hooks: string[] = [];
  for (let l = 0; l < L; l++)
    hooks.push(
      `blocks.${l}.hook_resid_pre`,
      `blocks.${l}.hook_attn_out`,
      `blocks.${l}.hook_mlp_out`,
      `blocks.${l}.attn.hook_z`,
    );
  const c = refRun(ref, clean, [], hooks);
  const k = refRun(ref, corr).last;
  const a = doc.answer.token_id;
  const cf = doc.counterfactual.token_id;
  const ld = (l: Float64Array) => l[a] - l[cf];
  return (cells: { hook: string; positions: 'all' | number[]; head?: number }[]) => {
    const edits: RefEdit[] = cells.map((x) => ({ ...x, source: c.hooks[x.hook].data }));
    const p = refRun(ref, corr, edits).last;
    return (ld(p) - ld(k)) / (ld(c.last) - ld(k));
  };
}

function checkCells(doc: PatchDocument, ref: RefModel, T: number, L: number, H: number): number {
  let worst = 0;
  const metric = refPatcher(ref, doc, L);
  const cmp = (engine: number, cells: Parameters<typeof metric>[0]) => {
    const r = metric(cells);
    worst = Math.max(worst, Math.abs(engine - r));
    expect(Math.abs(engine - r)).toBeLessThan(TOL);
  };
  const positions = [0, 1, Math.floor(T / 2), T - 2, T - 1];
  for (let l = 0; l < L; l++) {
    for (const p of positions) {
      cmp(doc.resid_pre![l][p], [{ hook: `blocks.${l}.hook_resid_pre`, positions: [p] }]);
      cmp(doc.attn_out![l][p], [{ hook: `blocks.${l}.hook_attn_out`, positions: [p] }]);
      cmp(doc.mlp_out![l][p], [{ hook: `blocks.${l}.hook_mlp_out`, positions: [p] }]);
    }
    for (let h = 0; h < H; h++)
      cmp(doc.head_out![l][h]!, [{ hook: `blocks.${l}.attn.hook_z`, positions: 'all', head: h }]);
    cmp(doc.attn_out_all_pos![l], [{ hook: `blocks.${l}.hook_attn_out`, positions: 'all' }]);
    cmp(doc.mlp_out_all_pos![l], [{ hook: `blocks.${l}.hook_mlp_out`, positions: 'all' }]);
  }
  return worst;
}

function validDocument(doc: PatchDocument) {
  expect(patchOutput.safeParse(doc).success).toBe(true);
  expect(viaJson(doc)).toEqual(doc);
  expect(schemaErrors('patch', viaJson(doc))).toEqual([]);
}

describe("patch on induction-gpt2: clean [256]+R+R, corrupted [256]+R'+R (first copy replaced)", () => {
  // the final token R[29] occurs earlier only in the clean prompt, so only there can the
  // induction heads find "what came next" (R[0]); R, R' = 30 distinct random bytes each
  const N = 4;
  const u = byteRng(5);
  const pairs = Array.from({ length: N }, () => ({ R: distinctBytes(u, 30), R2: distinctBytes(u, 30) }));
  const docs: PatchDocument[] = [];
  const T = 61;

  beforeAll(async () => {
    for (const { R, R2 } of pairs) {
      docs.push(
        await patch.run(
          gpt2,
          { token_ids: [256, ...R, ...R], corrupted_token_ids: [256, ...R2, ...R], answer: `#${R[0]}` },
          {},
        ),
      );
    }
  });

  it('documents are valid, shaped [layer][position] / [layer][head], and cells equal the reference', () => {
    for (const [i, d] of docs.entries()) {
      validDocument(d);
      expect(d.resid_pre!.length).toBe(2);
      expect(d.resid_pre![0].length).toBe(T);
      expect(d.attn_out![1].length).toBe(T);
      expect(d.head_out!.map((r) => r.length)).toEqual([4, 4]);
      expect(d.answer).toMatchObject({ token_id: pairs[i].R[0], source: 'answer' });
      expect(d.counterfactual.source).toBe('corrupted_prediction');
      const { R, R2 } = pairs[i];
      expect(d.differing_positions).toEqual(R.flatMap((b, j) => (b !== R2[j] ? [j + 1] : [])));
      expect(d.n_variants).toBe(3 * 2 * T + 2 * 4 + 2 * 2);
    }
    const worst = docs.slice(0, 2).map((d) => checkCells(d, gpt2Ref, T, 2, 4));
    console.log(
      `patch cells vs float64 reference (${2 * (15 + 6)} cells per sequence): max |Δ metric| ${worst.map((w) => w.toExponential(2)).join(', ')}`,
    );
  });

  it('agrees with the circuit: layer-1 attention restores the answer, spread over the four heads', () => {
    const at = (f: (d: PatchDocument) => number) => docs.map(f);
    const fmt = (xs: number[]) => `mean ${meanOf(xs).toFixed(3)} [${xs.map((x) => x.toFixed(2)).join(' ')}]`;
    const attnAll1 = at((d) => d.attn_out_all_pos![1]);
    const attnLast1 = at((d) => d.attn_out![1][T - 1]);
    const heads1 = [0, 1, 2, 3].map((h) => at((d) => d.head_out![1][h]!));
    const heads0 = [0, 1, 2, 3].map((h) => at((d) => d.head_out![0][h]!));
    const sum1 = at((d) => d.head_out![1].reduce<number>((a, b) => a + b!, 0));
    const r0at30 = at((d) => d.resid_pre![0][30]);
    const r1at31 = at((d) => d.resid_pre![1][31]);
    console.log(
      [
        `induction-gpt2 patching, ${N} sequences; normalised logit difference (0 corrupted, 1 clean); clean LD ${fmt(at((d) => d.clean_logit_diff))}, corrupted LD ${fmt(at((d) => d.corrupted_logit_diff))}`,
        `  layer-1 attn_out, all positions:  ${fmt(attnAll1)}`,
        `  layer-1 attn_out, last position:  ${fmt(attnLast1)}`,
        `  layer-0 attn_out, all positions:  ${fmt(at((d) => d.attn_out_all_pos![0]))}`,
        ...heads1.map((xs, h) => `  L1H${h} output (all positions):     ${fmt(xs)}`),
        `  Σ of the four L1 heads:           ${fmt(sum1)}`,
        ...heads0.map((xs, h) => `  L0H${h} output (all positions):     ${fmt(xs)}`),
        `  resid_pre L0 @30 (R[29] in copy 1): ${fmt(r0at30)}`,
        `  resid_pre L1 @31 (R[0] in copy 2):  ${fmt(r1at31)}`,
      ].join('\n'),
    );

    expect(meanOf(attnAll1)).toBeGreaterThan(0.9); // patching all layer-1 heads' outputs restores most of the metric
    expect(meanOf(attnLast1)).toBeGreaterThan(0.9); // … and it is their output at the last position that matters
    // every induction head restores a part (redundant copies of the same signal), none alone most of it
    for (const xs of heads1) {
      expect(meanOf(xs)).toBeGreaterThan(0.05);
      expect(meanOf(xs)).toBeLessThan(0.7);
    }
    expect(meanOf(sum1)).toBeGreaterThan(0.6);
    // the layer-0 heads that are neither previous-token nor induction heads do nothing
    for (const h of [2, 3]) expect(Math.abs(meanOf(heads0[h]))).toBeLessThan(0.05);
    // the K-composition path: the earlier occurrence of the final token (pos 30) at layer 0,
    // and the token after it (pos 31) at layer 1, which received the previous-token information
    expect(meanOf(r0at30)).toBeGreaterThan(0.3);
    expect(meanOf(r1at31)).toBeGreaterThan(0.3);
    // positions of the second copy before the last have identical tokens → layer-0 resid_pre is identical
    for (const d of docs) for (let p = 31; p < T; p++) expect(Math.abs(d.resid_pre![0][p])).toBeLessThan(1e-4);
  });
});

describe('patch on stories260K and input checks', () => {
  const clean = 'Once upon a time, there was a little girl named Lily. She';
  const corrupted = 'Once upon a time, there was a little boy named Tim. He';

  it('cells equal the reference; scans can be chosen', async () => {
    const doc = await patch.run(
      stories,
      { prompt: clean, corrupted_prompt: corrupted, answer: ' lo', counterfactual: ' was' },
      {},
    );
    validDocument(doc);
    const T = doc.tokens.length;
    expect(doc.corrupted_tokens.length).toBe(T);
    const worst = checkCells(doc, storiesRef, T, 5, 8);
    console.log(
      `stories260K patch: T = ${T}, ${doc.n_variants} variants in ${doc.n_engine_runs} engine runs, max |engine − reference| over ${5 * (15 + 10)} cells = ${worst.toExponential(2)}; clean LD ${doc.clean_logit_diff.toFixed(3)}, corrupted LD ${doc.corrupted_logit_diff.toFixed(3)}`,
    );
    // layer-0 resid_pre at a position whose token is the same in both prompts is the same: patching it is a no-op
    for (let p = 0; p < T; p++)
      if (!doc.differing_positions.includes(p)) expect(Math.abs(doc.resid_pre![0][p])).toBeLessThan(1e-4);

    const only = await patch.run(
      stories,
      { prompt: clean, corrupted_prompt: corrupted, answer: ' lo', counterfactual: ' was', scans: ['head_out'] },
      {},
    );
    validDocument(only);
    expect(only.resid_pre).toBeNull();
    expect(only.attn_out).toBeNull();
    expect(only.attn_out_all_pos).toBeNull();
    expect(only.n_variants).toBe(40);
    expect(only.head_out).toEqual(doc.head_out);

    // one head: one variant, patching that head's hook_z only, the same number as in the full scan
    const one = await patch.run(
      stories,
      {
        prompt: clean,
        corrupted_prompt: corrupted,
        answer: ' lo',
        counterfactual: ' was',
        scans: ['head_out'],
        heads: [{ layer: 1, head: 2 }],
      },
      {},
    );
    validDocument(one);
    expect(one.n_variants).toBe(1);
    expect(one.interventions).toEqual([
      { hook: 'blocks.1.attn.hook_z', op: 'patch', head: 2, positions: 'all', from: "the clean prompt's run" },
    ]);
    expect(one.head_out![1][2]).toBeCloseTo(doc.head_out![1][2]!, 5);
    expect(one.head_out!.flat().filter((v) => v !== null)).toHaveLength(1);
    const noScan = await patch
      .run(
        stories,
        { prompt: clean, corrupted_prompt: corrupted, scans: ['resid_pre'], heads: [{ layer: 0, head: 0 }] },
        {},
      )
      .catch((e) => e);
    expect(noScan.code).toBe('BAD_INPUT');
    const noHead = await patch
      .run(
        stories,
        { prompt: clean, corrupted_prompt: corrupted, scans: ['head_out'], heads: [{ layer: 0, head: 99 }] },
        {},
      )
      .catch((e) => e);
    expect(noHead.code).toBe('BAD_INPUT');
  });

  it('refuses unequal lengths, equal answer and counterfactual, bad tokens; cancels; reports progress', async () => {
    const counted = countingModel(stories);
    const err = await patch
      .run(counted.model, { prompt: clean, corrupted_prompt: 'Once upon a time' }, {})
      .catch((e) => e);
    expect(err).toBeInstanceOf(LoupeError);
    expect(err.code).toBe('BAD_INPUT');
    expect(err.message).toMatch(/equal token lengths/);
    const bad = await patch
      .run(counted.model, { prompt: clean, corrupted_prompt: corrupted, answer: 'qqqqzzzz' }, {})
      .catch((e) => e);
    expect(bad.code).toBe('UNKNOWN_TOKEN');
    const tooLong = await patch
      .run(gpt2, { token_ids: Array(65).fill(65), corrupted_token_ids: Array(65).fill(66) }, {})
      .catch((e) => e);
    expect(tooLong.code).toBe('PROMPT_TOO_LONG');
    expect(counted.runs()).toBe(0);

    const same = await patch.run(stories, { prompt: clean, corrupted_prompt: clean }, {}).catch((e) => e);
    expect(same).toBeInstanceOf(LoupeError);
    expect(same.code).toBe('BAD_INPUT');
    const flat = await patch
      .run(stories, { prompt: clean, corrupted_prompt: clean, answer: ' lo', counterfactual: ' was' }, {})
      .catch((e) => e);
    expect(flat.code).toBe('BAD_INPUT'); // identical runs: the normalised metric is undefined
    expect(flat.message).toMatch(/undefined/);

    const ac = new AbortController();
    const p = patch.run(
      gpt2,
      {
        token_ids: [
          256,
          ...Array(40)
            .fill(0)
            .map((_, i) => i + 40),
        ],
        corrupted_token_ids: [
          256,
          ...Array(40)
            .fill(0)
            .map((_, i) => i + 100),
        ],
        answer: '#41',
        counterfactual: '#42',
      },
      {
        signal: ac.signal,
        onProgress: (x) => {
          if (x.stage === 'patching' && x.done > 0) ac.abort();
        },
      },
    );
    await expect(p).rejects.toMatchObject({ code: 'ABORTED' });

    const seen: { stage: string; done: number; total: number }[] = [];
    await patch.run(
      stories,
      { prompt: clean, corrupted_prompt: corrupted, answer: ' lo', counterfactual: ' was', scans: ['resid_pre'] },
      { onProgress: (x) => seen.push(x) },
    );
    const last = seen.filter((s) => s.stage === 'patching').at(-1)!;
    expect(last.done).toBe(last.total);
  });
});
