/**
 * One metric across the causal methods (issue 27, item 2): patch, attribution_patching and
 * integrated_gradients default to M = logit[answer] − logit[counterfactual] with the answer the
 * clean prediction and the counterfactual the corrupted prediction, and report the same M(clean)
 * and M(corrupted). AtP's validation patches every head and site where that is cheap, and its
 * actual effects are the patch operation's (raw ΔM = normalised × gap). IG from the corrupted
 * prompt sums to M(clean) − M(corrupted) and gives 0 where the prompts share the token. A small
 * gap is flagged by all three.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { getOperation } from '../src/ops/index';
import { mulberry32 } from './reference';
import { SHARED } from './helpers/shared';

let gpt: LoadedModel;
let stories: LoadedModel;
beforeAll(async () => {
  gpt = await loadModelNode(SHARED + '/models/induction-gpt2');
  stories = await loadModelNode(SHARED + '/models/stories260K');
}, 120_000);
afterAll(async () => {
  await gpt?.dispose();
  await stories?.dispose();
});

const r = mulberry32(5);
const R = Array.from({ length: 12 }, () => Math.floor(r() * 256));
const R2 = Array.from({ length: 12 }, () => Math.floor(r() * 256));
const CLEAN = [256, ...R, ...R.slice(0, -1)];
const CORR = [256, ...R2, ...R.slice(0, -1)];
const run = (m: LoadedModel, op: string, input: Record<string, unknown>) => getOperation(op)!.run(m, input, {}) as any;

describe('the default metric is the same in the three methods', () => {
  it('induction-gpt2: answer = clean prediction, counterfactual = corrupted prediction; M(clean), M(corrupted) agree', async () => {
    const pair = { token_ids: CLEAN, corrupted_token_ids: CORR };
    const patch = await run(gpt, 'patch', { ...pair, scans: ['head_out', 'resid_pre', 'attn_out', 'mlp_out'] });
    const atp = await run(gpt, 'attribution_patching', pair);
    const ig = await run(gpt, 'integrated_gradients', { ...pair, steps: 32 });
    expect(patch.counterfactual.source).toBe('corrupted_prediction');
    for (const d of [atp, ig]) {
      expect(d.answer.token_id).toBe(patch.answer.token_id);
      expect(d.counterfactual.token_id).toBe(patch.counterfactual.token_id);
      expect(d.counterfactual.source).toBe('corrupted_prediction');
      expect(d.metric.clean).toBeCloseTo(patch.clean_logit_diff, 4);
      expect(d.metric.corrupted).toBeCloseTo(patch.corrupted_logit_diff, 4);
    }
    // AtP validates every head and every site by default here (8 + 3·2·24 = 152 ≤ 512 variants)
    const gap = patch.clean_logit_diff - patch.corrupted_logit_diff;
    const v = atp.validation;
    expect(v.scope).toBe('all');
    expect(v.heads).toHaveLength(8);
    expect(v.sites).toHaveLength(3 * 2 * CLEAN.length);
    for (const h of v.heads) expect(h.actual).toBeCloseTo(patch.head_out[h.layer][h.head] * gap, 3);
    for (const s of v.sites) {
      const kind = s.hook.replace(/^blocks\.\d+\.hook_/, '');
      expect(s.actual, `${s.hook}@${s.position}`).toBeCloseTo(patch[kind][s.layer][s.position] * gap, 3);
    }
    expect(v.sign_agreement.sites).toBeGreaterThanOrEqual(0);
    console.log(
      `AtP vs real patching, every site: ρ heads ${v.rank_correlation.heads?.toFixed(3)}, sites ${v.rank_correlation.sites?.toFixed(3)}; same sign heads ${v.sign_agreement.heads?.toFixed(2)}, sites ${v.sign_agreement.sites?.toFixed(2)}`,
    );
    // IG from the corrupted prompt: Σ attributions ≈ M(clean) − M(corrupted); 0 where the tokens agree
    expect(ig.baseline).toBe('corrupted');
    expect(ig.completeness.metric_baseline).toBeCloseTo(patch.corrupted_logit_diff, 3);
    expect(ig.completeness.metric_input).toBeCloseTo(patch.clean_logit_diff, 3);
    expect(Math.abs(ig.completeness.error)).toBeLessThan(0.05 * Math.abs(gap));
    for (const a of ig.attributions) if (CLEAN[a.position] === CORR[a.position]) expect(a.attribution).toBe(0);
    // with no corrupted prompt IG keeps its zero baseline and logit[answer] alone (as before)
    const ig0 = await run(gpt, 'integrated_gradients', { token_ids: CLEAN, steps: 8 });
    expect(ig0.baseline).toBe('zero');
    expect(ig0.counterfactual).toBeNull();
  });

  it.each([
    ['Once upon a time, there was a little', 'Once upon a time, there was a big', true],
    ['One day, a girl went to the park.', 'One day, a boy went to the park.', false],
  ])(
    'She/He on stories260K: a gap below 1 logit is flagged by all three (%s / %s)',
    async (clean, corrupted, small) => {
      const pair = { prompt: clean, corrupted_prompt: corrupted, answer: ' She', counterfactual: ' He' };
      const patch = await run(stories, 'patch', { ...pair, scans: ['head_out'] });
      const gap = patch.clean_logit_diff - patch.corrupted_logit_diff;
      expect(Math.abs(gap) < 1).toBe(small);
      const atp = await run(stories, 'attribution_patching', { ...pair, validate: 4, validate_scope: 'top' });
      const ig = await run(stories, 'integrated_gradients', { ...pair, steps: 8 });
      for (const d of [patch, atp, ig]) {
        if (small) expect(d.warnings.join(' ')).toMatch(/below 1: the normalised recovery/);
        else expect(d.warnings).toEqual([]);
      }
      expect(atp.validation.scope).toBe('top');
      expect(atp.validation.heads).toHaveLength(4);
      console.log(`stories260K She/He ${JSON.stringify(clean)}: gap ${gap.toFixed(3)}`);
    },
  );
});
