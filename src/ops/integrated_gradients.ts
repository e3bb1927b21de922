/**
 * integrated_gradients — IG (Sundararajan et al. 2017) over the input positions: attribution of
 * M = logit[answer] − logit[counterfactual] (last position, raw logits) to each position of
 * x = blocks.0.hook_resid_pre (token + positional embeddings), zero baseline, right Riemann sum:
 *     a[pos] = Σ_d x[pos,d] · (1/n) Σ_{k=1..n} ∂M/∂x (α_k·x)[pos,d],   α_k = k/n.
 * Each α_k is one batch row: the engine scales the hook by α_k (an ordinary `scale`
 * intervention) and its backward pass returns ∂M/∂x at the scaled value. Completeness:
 * Σ_pos a[pos] ≈ M(x) − M(0); the gap is reported.
 */
import { z } from 'zod';
import type { Intervention } from '../engine/api';
import { defineOperation } from './types';
import { documentBase, documentHead, interventionList } from '../schema/common';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { CAPS, finite } from '../engine/caps';
import { argmax } from './lib/math';
import { inputIds, promptOrIdsFields, resolveAnswer } from './lib/ablation';
import { metricOf, metricSeed, metricTokens, tokenRef } from './lib/gradients';
import { tokenText } from './lib/tokens';

export const MAX_IG_STEPS = 512;
const HOOK = 'blocks.0.hook_resid_pre';

export const integratedGradientsInput = z.object({
  ...promptOrIdsFields,
  answer: z
    .string()
    .optional()
    .describe('Token (text or "#id") whose logit counts positively; default the prediction at the last position.'),
  counterfactual: z
    .string()
    .optional()
    .describe('Token (text or "#id") whose logit counts negatively; without it the metric is logit[answer] alone.'),
  steps: z
    .number()
    .int()
    .min(1)
    .max(MAX_IG_STEPS)
    .default(32)
    .describe('Riemann steps n (α_k = k/n, k = 1..n); the steps run as batch rows.'),
});
export type IntegratedGradientsInput = z.input<typeof integratedGradientsInput>;

export const integratedGradientsOutput = documentBase('integrated_gradients').extend({
  method: z.string(),
  ...metricTokens.shape,
  hook: z.literal(HOOK),
  steps: z.number().int(),
  attributions: z
    .array(z.object({ position: z.number().int(), token: z.string(), attribution: z.number() }))
    .describe('per position, in units of M'),
  completeness: z.object({
    sum: z.number().describe('Σ over positions of the attributions'),
    metric_input: z.number().describe('M at the input (α = 1)'),
    metric_baseline: z.number().describe('M with hook_resid_pre of layer 0 set to zero (α = 0)'),
    error: z
      .number()
      .describe("sum − (metric_input − metric_baseline): the Riemann sum's error (more steps shrink it)"),
  }),
  interventions: interventionList.describe('one scaling per step (batch row): x → α_k·x at the hook'),
  n_engine_runs: z.number().int(),
});

export const operation = defineOperation({
  name: 'integrated_gradients',
  title: 'Integrated gradients',
  description:
    'Integrated gradients to each input position: attribution of M = logit[answer] − logit[counterfactual] at the last position (raw logits; logit[answer] alone without a counterfactual) to each position of blocks.0.hook_resid_pre (after token and positional embeddings), zero baseline, right Riemann sum with `steps` steps (α_k = k/n), each step one batch row of a forward + backward run. Returns per-position attributions and a completeness check (Σ attributions vs M(input) − M(baseline)). Cost: one row of forward + backward per step, plus the baseline row.',
  input: integratedGradientsInput,
  output: integratedGradientsOutput,
  long: true,
}).implement(async (model, input, ctx) => {
  const { ids, prompt } = inputIds(model, input);
  const T = ids.length;
  const { d_model: D, d_vocab: V } = model.info;
  const answerId = resolveAnswer(model, input.answer);
  const cfId = resolveAnswer(model, input.counterfactual, 'counterfactual') ?? null;
  const n = input.steps;

  // the input x and the prediction (for a default answer)
  const base = await model.run(ids, { hooks: [HOOK], logitPositions: [T - 1], signal: ctx.signal });
  const x = base.hooks[HOOK].data; // [1, T, D]
  const a = answerId ?? argmax(base.logits.data);
  if (cfId === a)
    throw new LoupeError(
      'BAD_INPUT',
      `The answer and the counterfactual are the same token (${JSON.stringify(tokenText(model, a))}), so the metric is always 0.`,
      'Give a different counterfactual, or none.',
    );

  // rows α_0 = 0 (baseline), α_1 … α_n; batched forward + backward
  const alphas = Array.from({ length: n + 1 }, (_, k) => k / n);
  const meanGrad = new Float64Array(T * D);
  let mInput = NaN,
    mBaseline = NaN;
  let runs = 1;
  ctx.onProgress?.({ stage: 'integrated gradients steps', done: 0, total: alphas.length });
  for (let start = 0; start < alphas.length; start += CAPS.maxBatch) {
    throwIfAborted(ctx.signal);
    const chunk = alphas.slice(start, start + CAPS.maxBatch);
    const B = chunk.length;
    const interventions: Intervention[] = chunk.map((alpha, row) => ({ hook: HOOK, op: 'scale', alpha, batch: [row] }));
    const res = await model.run(ids, {
      batch: B,
      interventions,
      logitPositions: [T - 1],
      grad: { hooks: [HOOK], seed: metricSeed(V, B, a, cfId) },
      signal: ctx.signal,
    });
    runs++;
    const g = res.grads![HOOK].data; // [B, T, D]
    chunk.forEach((alpha, row) => {
      const k = start + row;
      if (k === 0) mBaseline = metricOf(res.logits.data, a, cfId, row * V);
      if (k === n) mInput = metricOf(res.logits.data, a, cfId, row * V);
      if (k === 0) return; // the right sum uses k = 1..n
      for (let i = 0; i < T * D; i++) meanGrad[i] += g[row * T * D + i] / n;
    });
    ctx.onProgress?.({
      stage: 'integrated gradients steps',
      done: Math.min(start + B, alphas.length),
      total: alphas.length,
    });
  }
  const texts = model.tokenStrings(ids);
  const attributions = Array.from({ length: T }, (_, p) => {
    let s = 0;
    for (let d = 0; d < D; d++) s += x[p * D + d] * meanGrad[p * D + d];
    return { position: p, token: texts[p], attribution: finite(s) };
  });
  const sum = attributions.reduce((s, r) => s + r.attribution, 0);
  return {
    ...documentHead('integrated_gradients', model, prompt, ids),
    method:
      `Integrated gradients with a zero baseline at ${HOOK} (token + positional embeddings), right Riemann sum over α_k = k/${n}, k = 1..${n}: a[pos] = Σ_d x[pos,d] · mean_k ∂M/∂x(α_k·x)[pos,d]; ` +
      "gradients from the engine's reverse-mode backward graph (float32), the steps as batch rows. M = logit[answer] − logit[counterfactual] at the last position, raw logits (logit[answer] alone without a counterfactual). " +
      "The baseline scales every position, BOS included. In pre-norm models each block reads LN(α·x), which barely depends on α until α·|x| nears √eps, so the blocks' share of M changes abruptly near α = 0 while the residual stream's direct share changes smoothly: the zero baseline is rough, and a coarse Riemann sum misses that jump. Read the completeness error before the attributions.",
    answer: {
      ...tokenRef(model, a),
      source: answerId !== undefined ? ('answer' as const) : ('clean_prediction' as const),
    },
    counterfactual: cfId !== null ? tokenRef(model, cfId) : null,
    hook: HOOK,
    steps: n,
    attributions,
    completeness: {
      sum: finite(sum),
      metric_input: finite(mInput),
      metric_baseline: finite(mBaseline),
      error: finite(sum - (mInput - mBaseline)),
    },
    interventions: alphas.map((alpha) => ({ hook: HOOK, op: 'scale' as const, alpha })),
    n_engine_runs: runs,
  };
});
