/**
 * integrated_gradients — IG (Sundararajan et al. 2017) over the input positions: attribution of
 * M = logit[answer] − logit[counterfactual] (last position, raw logits; lib/metric.ts, the same
 * metric and defaults as patch and attribution_patching) to each position of
 * x = blocks.0.hook_resid_pre (token + positional embeddings), from a baseline x' along the
 * straight path, right Riemann sum:
 *     a[pos] = Σ_d (x − x')[pos,d] · (1/n) Σ_{k=1..n} ∂M/∂x (x' + α_k·(x − x'))[pos,d],   α_k = k/n.
 * Baselines: zero (x' = 0: each α_k scales the hook, an ordinary `scale` intervention), or the
 * corrupted prompt's x (its hook patched with the interpolated values, one batched source): then
 * Σ a = M(clean) − M(corrupted), the quantity patching normalises by, and a position whose token
 * the two prompts share gets 0. Each α_k is one batch row, and the backward pass returns ∂M/∂x at
 * the edited value. Completeness: Σ_pos a[pos] ≈ M(x) − M(x'); the gap is reported.
 */
import { z } from 'zod';
import type { DeviceTensor, Intervention, LogitRow, RunResult } from '../engine/api';
import type { Tensor } from '../engine/tensor';
import { defineOperation } from './types';
import { documentBase, documentHead, interventionList, tokenEntry } from '../schema/common';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { CAPS, finite } from '../engine/caps';
import { argmax } from './lib/math';
import { corruptedIds, inputIds, promptOrIdsFields } from './lib/ablation';
import { metricOf, metricSeed } from './lib/gradients';
import { checkOneSource, datasetFields, datasetReport, forEachPair, hasDataset, pairInputOf } from './lib/dataset';
import { DatasetStats, componentStats, statisticsBlock, statsFields } from './lib/stats';
import type { LoadedModel } from '../engine/api';
import type { OpContext } from './types';
import {
  answerField,
  counterfactualField,
  gapWarnings,
  givenMetricTokens,
  metricTokenSchemas,
  warningsSchema,
  type MetricTokens,
} from './lib/metric';
import { tokenEntries, tokenText } from './lib/tokens';

export const MAX_IG_STEPS = 512;
const HOOK = 'blocks.0.hook_resid_pre';

export const integratedGradientsInput = z.object({
  ...promptOrIdsFields,
  ...datasetFields,
  ...statsFields,
  corrupted_prompt: z
    .string()
    .default('')
    .describe(
      'Optional corrupted prompt of as many tokens: its prediction is the default counterfactual, ' +
        'and with baseline "corrupted" (the default when it is given) its embedding is the baseline.',
    ),
  corrupted_token_ids: z
    .array(z.number().int().min(0))
    .min(1)
    .optional()
    .describe('Corrupted token ids, used exactly instead of corrupted_prompt.'),
  answer: answerField,
  counterfactual: counterfactualField.describe(
    'Token (text or "#id") whose logit counts negatively; default the corrupted prediction (without a corrupted prompt: none, and M is logit[answer] alone).',
  ),
  baseline: z
    .enum(['auto', 'zero', 'corrupted'])
    .default('auto')
    .describe(
      "The path's start x': zero, or the corrupted prompt's blocks.0.hook_resid_pre (then Σ attributions " +
        '= M(clean) − M(corrupted)); auto = corrupted when a corrupted prompt is given, else zero.',
    ),
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
  answer: metricTokenSchemas.answer,
  counterfactual: metricTokenSchemas.counterfactual
    .nullable()
    .describe('null: no counterfactual (no corrupted prompt either), M is logit[answer] alone'),
  corrupted_prompt: z.string().nullable(),
  corrupted_tokens: z.array(tokenEntry).nullable(),
  baseline: z.enum(['zero', 'corrupted']),
  metric: z.object({
    clean: z.number().describe('M on the prompt'),
    corrupted: z.number().nullable().describe('M on the corrupted prompt (null without one)'),
  }),
  warnings: warningsSchema,
  hook: z.literal(HOOK),
  steps: z.number().int(),
  attributions: z
    .array(z.object({ position: z.number().int(), token: z.string(), attribution: z.number() }))
    .describe('per position, in units of M'),
  completeness: z.object({
    sum: z.number().describe('Σ over positions of the attributions'),
    metric_input: z.number().describe('M at the input (α = 1)'),
    metric_baseline: z
      .number()
      .describe("M at the baseline (α = 0): zero at blocks.0.hook_resid_pre, or the corrupted prompt's"),
    error: z
      .number()
      .describe("sum − (metric_input − metric_baseline): the Riemann sum's error (more steps shrink it)"),
  }),
  interventions: interventionList.describe("one edit per step (batch row): x → α_k·x, or x' + α_k·(x − x') patched in"),
  n_engine_runs: z.number().int(),
  dataset: datasetReport
    .optional()
    .describe('dataset mode: the pairs (their clean prompts; attributions are then means per position)'),
  statistics: statisticsBlock
    .extend({ components: z.array(componentStats.extend({ position: z.number().int() })) })
    .optional()
    .describe('dataset mode: each position’s mean attribution, per-pair values, bootstrap 95% CI, sign-flip p-value'),
});

export const operation = defineOperation({
  name: 'integrated_gradients',
  title: 'Integrated gradients',
  description:
    'Integrated gradients to each input position: attribution of M = logit[answer] − logit[counterfactual] ' +
    'at the last position (raw logits; the same metric and defaults as patch and attribution_patching: ' +
    'counterfactual = the corrupted prediction; logit[answer] alone without a corrupted prompt or ' +
    'counterfactual) to each position of blocks.0.hook_resid_pre (after token and positional embeddings), ' +
    'from a zero baseline or from the corrupted prompt (then the attributions sum to M(clean) − M(corrupted)), ' +
    'right Riemann sum with `steps` steps (α_k = k/n), each step one batch row of a forward + backward run. ' +
    'Returns per-position attributions and a completeness check (Σ attributions vs M(input) − M(baseline)). ' +
    'Cost: one row of forward + backward per step, plus the baseline row (and one forward of the corrupted ' +
    'prompt). Dataset mode (dataset, dataset_text or generate; pairs of one token length): per pair’s clean ' +
    'prompt, with each position’s mean attribution, per-pair values, seeded bootstrap 95% CI and ' +
    'sign-flip p-value.',
  input: integratedGradientsInput,
  output: integratedGradientsOutput,
  long: true,
}).implement((model, input, ctx) => (hasDataset(input) ? igDataset(model, input, ctx) : igPair(model, input, ctx)));

type IgParsed = z.output<typeof integratedGradientsInput>;
type IgDoc = z.input<typeof integratedGradientsOutput>;

async function igPair(model: LoadedModel, input: IgParsed, ctx: OpContext): Promise<IgDoc> {
  const { ids, prompt } = inputIds(model, input);
  const T = ids.length;
  const given = givenMetricTokens(model, input);
  const corrupted =
    input.corrupted_prompt || input.corrupted_token_ids
      ? corruptedIds(model, input, T, {
          clean: 'The prompt',
          needs: 'integrated gradients from the corrupted prompt',
          hint: 'Change the corrupted prompt so it tokenizes to the same number of tokens, or leave it out (zero baseline).',
        })
      : null;
  if (input.baseline === 'corrupted' && !corrupted)
    throw new LoupeError(
      'BAD_INPUT',
      'baseline "corrupted" needs a corrupted prompt.',
      'Give corrupted_prompt (or corrupted_token_ids), or use baseline "zero".',
    );
  const baseline: 'zero' | 'corrupted' =
    input.baseline === 'auto' ? (corrupted ? 'corrupted' : 'zero') : input.baseline;
  const n = input.steps;
  const { a, cfId, refs, base, corrRun, sums, mInput, mBaseline, runs } = await igSteps(
    model,
    ids,
    corrupted?.ids ?? null,
    given,
    baseline,
    n,
    ctx,
  );
  const alphas = Array.from({ length: n + 1 }, (_, k) => k / n);
  const texts = model.tokenStrings(ids);
  const attributions = Array.from({ length: T }, (_, p) => ({
    position: p,
    token: texts[p],
    attribution: finite(sums[p]),
  }));
  const sum = attributions.reduce((s, r) => s + r.attribution, 0);
  const mClean = metricOf(base.logits.data, a, cfId);
  const mCorr = corrRun ? metricOf(corrRun.logits.data, a, cfId) : null;
  const path =
    baseline === 'zero'
      ? `a zero baseline at ${HOOK} (token + positional embeddings), right Riemann sum ` +
        `over α_k = k/${n}, k = 1..${n}: a[pos] = Σ_d x[pos,d] · mean_k ∂M/∂x(α_k·x)[pos,d]`
      : `the corrupted prompt's ${HOOK} as baseline x', right Riemann sum over α_k = k/${n}, k = 1..${n}: ` +
        "a[pos] = Σ_d (x − x')[pos,d] · mean_k ∂M/∂x(x' + α_k·(x − x'))[pos,d]; the attributions sum to M(clean) " +
        '− M(corrupted) up to the Riemann error, and a position with the same token in both prompts gets 0';
  return {
    ...documentHead('integrated_gradients', model, prompt, ids),
    method:
      `Integrated gradients from ${path}; ` +
      "gradients from the engine's reverse-mode backward graph (float32), the steps as batch rows. " +
      'M = logit[answer] − logit[counterfactual] at the last position, raw logits (answer: ' +
      'the clean prediction unless given; counterfactual: the corrupted prediction unless given, ' +
      'as in patch and attribution_patching; without a corrupted prompt or a counterfactual, ' +
      'logit[answer] alone). ' +
      (baseline === 'zero'
        ? 'The baseline scales every position, BOS included. In pre-norm models each block reads LN(α·x), ' +
          "which barely depends on α until α·|x| nears √eps, so the blocks' share of M changes abruptly near " +
          "α = 0 while the residual stream's direct share changes smoothly: the zero baseline is rough, " +
          'and a coarse Riemann sum misses that jump. Read the completeness error before the attributions.'
        : 'Read the completeness error before the attributions.'),
    answer: refs.answer,
    counterfactual: refs.counterfactual,
    corrupted_prompt: corrupted ? corrupted.prompt : null,
    corrupted_tokens: corrupted ? tokenEntries(model, corrupted.ids) : null,
    baseline,
    metric: { clean: finite(mClean), corrupted: mCorr === null ? null : finite(mCorr) },
    warnings: mCorr === null ? [] : gapWarnings(mClean, mCorr),
    hook: HOOK,
    steps: n,
    attributions,
    completeness: {
      sum: finite(sum),
      metric_input: finite(mInput),
      metric_baseline: finite(mBaseline),
      error: finite(sum - (mInput - mBaseline)),
    },
    interventions:
      baseline === 'zero'
        ? alphas.map((alpha) => ({ hook: HOOK, op: 'scale' as const, alpha }))
        : alphas.map((alpha) => ({
            hook: HOOK,
            op: 'patch' as const,
            positions: 'all' as const,
            alpha,
            from: "x' + α·(x − x'), x' = the corrupted prompt's run",
          })),
    n_engine_runs: runs,
  };
}

/**
 * The runs of one pair: x (and x'), then the steps in batches, each batch's gradients reduced to
 * Σ over its rows of (x − x') · ∂M/∂x per position where they are (runtime/reduce.ts), its metric
 * rows to the answer's and counterfactual's logits
 */
async function igSteps(
  model: LoadedModel,
  ids: number[],
  corruptedIds: number[] | null,
  given: ReturnType<typeof givenMetricTokens>,
  baseline: 'zero' | 'corrupted',
  n: number,
  ctx: OpContext,
) {
  const T = ids.length;
  const V = model.info.d_vocab;
  // the input x and the prediction (for a default answer); the corrupted run's x and prediction. x
  // and x' stay on the device where the backend keeps values there: the steps are made and reduced there
  const held = { hooks: [HOOK], logitPositions: [T - 1], hooksOnDevice: true, signal: ctx.signal };
  const base = await model.run(ids, held);
  const owned = [base];
  const hookOf = (r: RunResult): Tensor | DeviceTensor => r.deviceHooks?.[HOOK] ?? r.hooks[HOOK]; // [1, T, D]
  let along: DeviceTensor | undefined;
  try {
    const corrRun = corruptedIds ? await model.run(corruptedIds, held) : null;
    if (corrRun) owned.push(corrRun);
    let runs = corrRun ? 2 : 1;
    let a: number;
    let cfId: number | null;
    let refs: {
      answer: MetricTokens['refs']['answer'];
      counterfactual: MetricTokens['refs']['counterfactual'] | null;
    };
    if (corrRun || given.counterfactual !== undefined) {
      const mt = given.tokens(base.logits.data, corrRun?.logits.data ?? []);
      a = mt.answer;
      cfId = mt.counterfactual;
      refs = mt.refs;
    } else {
      a = given.answer ?? argmax(base.logits.data);
      cfId = null;
      refs = {
        answer: {
          token: tokenText(model, a),
          token_id: a,
          source: given.answer !== undefined ? 'answer' : 'clean_prediction',
        },
        counterfactual: null,
      };
    }
    const x = hookOf(base);
    const x0 = baseline === 'corrupted' ? hookOf(corrRun!) : null; // x' (zero when null)
    // x − x', the direction every step's gradient is taken along (made where x and x' are)
    let dir: Tensor | DeviceTensor = x;
    if (x0 && 'data' in x && 'data' in x0) dir = { dims: x.dims, data: x.data.map((v, i) => v - x0.data[i]) };
    else if (x0 && !('data' in x) && !('data' in x0)) dir = along = await model.deviceDifference(x, x0, 0);

    // rows α_0 = 0 (baseline), α_1 … α_n; batched forward + backward. Each row's seed is weighted by
    // the right sum's 1/n (0 for α_0, whose metric alone is read), so Σ over the rows of
    // (x − x') · ∂M/∂x, reduced where the gradients are, is the attributions' share of the batch
    const alphas = Array.from({ length: n + 1 }, (_, k) => k / n);
    const sums = new Float64Array(T);
    let mInput = NaN,
      mBaseline = NaN;
    const metricIds = cfId === null ? [a] : [a, cfId];
    const metric = (r: LogitRow) => r.at[0] - (cfId !== null ? r.at[1] : 0);
    ctx.onProgress?.({ stage: 'integrated gradients steps', done: 0, total: alphas.length });
    for (let start = 0; start < alphas.length; start += CAPS.maxBatch) {
      throwIfAborted(ctx.signal);
      const chunk = alphas.slice(start, start + CAPS.maxBatch);
      const B = chunk.length;
      // zero baseline: α·x; else α·x + (1 − α)·x' = x' + α·(x − x'), x' added from where it is
      const interventions: Intervention[] = chunk.flatMap((alpha, row) => [
        { hook: HOOK, op: 'scale' as const, alpha, batch: [row] },
        ...(x0 ? [{ hook: HOOK, op: 'add' as const, source: x0, alpha: 1 - alpha, batch: [row] }] : []),
      ]);
      const seed = metricSeed(V, B, a, cfId);
      chunk.forEach((_, row) => {
        const w = start + row === 0 ? 0 : 1 / n;
        for (let v = 0; v < V; v++) seed.data[row * V + v] *= w;
      });
      const res = await model.run(ids, {
        batch: B,
        interventions,
        logitPositions: [T - 1],
        grad: { hooks: [HOOK], seed },
        attribution: { against: { [HOOK]: dir }, keep: { [HOOK]: 1 }, subtract: false },
        reduceLogits: { ids: metricIds },
        signal: ctx.signal,
      });
      runs++;
      const part = res.attribution![HOOK]; // [T]
      for (let p = 0; p < T; p++) sums[p] += part[p];
      chunk.forEach((_, row) => {
        const k = start + row;
        if (k === 0) mBaseline = metric(res.logitRows![row]);
        if (k === n) mInput = metric(res.logitRows![row]);
      });
      ctx.onProgress?.({
        stage: 'integrated gradients steps',
        done: Math.min(start + B, alphas.length),
        total: alphas.length,
      });
    }
    return { a, cfId, refs, base, corrRun, sums, mInput, mBaseline, runs };
  } finally {
    along?.release();
    for (const r of owned) for (const t of Object.values(r.deviceHooks ?? {})) t.release();
  }
}
/**
 * Dataset mode: igPair on every pair's clean prompt (its answer and counterfactual; the corrupted
 * prompt is not used: the baseline is zero), then each position's mean attribution with its
 * per-pair values, CI and p-value; positions line up only for pairs of one token length.
 */
async function igDataset(model: LoadedModel, input: IgParsed, ctx: OpContext): Promise<IgDoc> {
  checkOneSource(input, ['prompt', 'token_ids', 'answer', 'counterfactual']);
  const { dataset, docs } = await forEachPair(
    model,
    input,
    ctx,
    (ex, c) => {
      const { token_ids, answer, counterfactual } = pairInputOf(ex);
      return igPair(model, { ...input, prompt: '', token_ids, answer, counterfactual }, c);
    },
    (d) => {
      if (new Set(d.examples.map((e) => e.clean.length)).size > 1)
        throw new LoupeError(
          'BAD_INPUT',
          'Integrated gradients per position over a dataset needs pairs of one token length (positions must line up).',
          'Give pairs whose clean prompts have one token length.',
        );
    },
  );
  const stats = new DatasetStats(docs.length, input.bootstrap_seed);
  const first = docs[0];
  const components: NonNullable<IgDoc['statistics']>['components'] = [];
  const attributions = first.attributions.map((a, p) => {
    const st = stats.of(
      docs.map((d) => d.attributions[p].attribution),
      true,
    );
    components.push({ position: p, ...st });
    return { ...a, attribution: st.mean };
  });
  const meanOf = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const c = (k: 'sum' | 'metric_input' | 'metric_baseline' | 'error') =>
    finite(meanOf(docs.map((d) => d.completeness[k])));
  return {
    ...first,
    method:
      `Dataset mode over ${docs.length} pairs (their clean prompts, answers and counterfactuals): ` +
      "each as the single-pair form computes it, every position's attribution the mean over the pairs, " +
      'with per-pair values, bootstrap CI and sign-flip p-value in statistics; ' +
      `completeness numbers are means. Tokens shown are the first pair's. ${first.method}`,
    attributions,
    completeness: {
      sum: c('sum'),
      metric_input: c('metric_input'),
      metric_baseline: c('metric_baseline'),
      error: c('error'),
    },
    n_engine_runs: docs.reduce((s, d) => s + d.n_engine_runs, 0),
    dataset: dataset.report,
    statistics: stats.table(components),
  };
}
