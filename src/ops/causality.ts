/**
 * `causality` (after openinterp's causality protocol): is a direction's effect on the next token
 * special, or would any direction of the same norm do as much?
 *
 *  1. effect = normalized_effect of adding α·d at blocks.{layer}.hook_resid_pre (target log-prob
 *     change minus control log-prob change at the final prompt position; see steer.ts);
 *  2. the same effect for N random Gaussian directions scaled to d's norm (seeded), measured on
 *     the same targets and controls → the percentile of d's effect among them;
 *  3. d's effect over an α-sweep (multiples of α) → is it monotone increasing?
 *  4. a verdict from the rule below, with the numbers that decided it, in the document.
 *
 * Every variant (d, the random directions, the sweep) is one row of a batched engine run.
 *
 * Targets must be independent of d: when d is not a token direction, the caller names them (a
 * target picked as "the tokens d promotes most" would make d look special by construction).
 */
import { z } from 'zod';
import type { LoadedModel } from '../engine/api';
import { LoupeError } from '../engine/errors';
import { documentBase, documentHead } from '../schema/common';
import { defineOperation } from './types';
import { finite } from './lib/caps';
import { rng } from './lib/math';
import { directionBlock, directionBlockSchema, parseDirectionSpec, randomVector, vecNorm } from './lib/directions';
import {
  evaluateVariants, interventionRecord, rowsPerRun, METRIC_DEFINITIONS, metricDefinitionsSchema, prepareSteering, steeringFields, steeringMetrics,
  tokenRef, tokenRefs, type Variant,
  DEFAULT_MULTIPLES, MAX_SWEEP_ALPHAS, trend,
} from './lib/steering';

/** most random directions one call may evaluate */
export const MAX_RANDOM_DIRECTIONS = 512;
/** fewer random directions than this cannot resolve the 95th percentile */
export const MIN_RANDOM_FOR_VERDICT = 20;

export const VERDICT_RULE =
  `undetermined: fewer than ${MIN_RANDOM_FOR_VERDICT} random directions, a non-finite effect, or all random effects equal (degenerate). ` +
  'causal: percentile ≥ 95 AND normalized_effect over the α-sweep is increasing. ' +
  'weak: percentile ≥ 80 but not causal (80 ≤ percentile < 95, or percentile ≥ 95 without a monotone rise). ' +
  'not_distinguishable: percentile < 80. ' +
  'percentile = 100 × (#random effects below d\'s effect + ½ #equal) / N. ' +
  'Monotonicity alone never counts: effects are smooth in α, so about half of all random directions rise monotonically on any fixed target.';

const input = z.object({
  ...steeringFields,
  alpha: z.number().optional().describe('α of the comparison (default: alpha_multiple × resid_norm)'),
  alpha_multiple: z.number().default(1).describe('α = alpha_multiple × the layer\'s mean residual norm when alpha is absent'),
  n_random: z.number().int().min(1).default(64).describe('random directions of equal norm to compare against'),
  seed: z.number().int().default(0).describe('seed of the random directions'),
  sweep_multiples: z.array(z.number()).min(2).default(DEFAULT_MULTIPLES).describe('the monotonicity sweep: α × each multiple'),
});
export type CausalityInput = z.input<typeof input>;

const output = documentBase('causality').extend({
  layer: z.number().int(),
  hook: z.string(),
  positions: z.union([z.literal('all'), z.array(z.number().int())]),
  direction: directionBlockSchema,
  resid_norm: z.number(),
  alpha: z.number(),
  targets: z.array(tokenRef),
  controls: z.array(tokenRef),
  targets_rule: z.string(),
  controls_rule: z.string(),
  effect: z.object({ target_logprob_delta: z.number(), control_logprob_delta: z.number(), normalized_effect: z.number(), kl_from_base: z.number() }),
  random: z.object({
    n: z.number().int(),
    seed: z.number().int(),
    norm: z.number().describe('norm of every random direction (equal to the applied norm of d)'),
    effects: z.array(z.number()).describe('normalized_effect of each random direction at α'),
    mean: z.number(),
    sd: z.number(),
    max: z.number(),
  }),
  percentile: z.number().describe('percent of random directions whose effect is below d\'s (ties count half)'),
  z_score: z.number().nullable(),
  sweep: z.object({
    multiples: z.array(z.number()),
    alphas: z.array(z.number()),
    normalized_effect: z.array(z.number()),
    target_logprob_delta: z.array(z.number()),
    trend: z.enum(['increasing', 'decreasing', 'flat', 'not_monotone']),
    monotone: z.boolean().describe('trend is increasing'),
  }),
  verdict: z.enum(['causal', 'weak', 'not_distinguishable', 'undetermined']),
  verdict_reason: z.string(),
  verdict_rule: z.string(),
  interventions: z.array(interventionRecord),
  metric_definitions: metricDefinitionsSchema,
  engine_runs: z.number().int(),
});
export type CausalityDocument = z.infer<typeof output>;

export function decideVerdict(p: { n: number; percentile: number; monotone: boolean; finite: boolean; degenerate: boolean }): { verdict: CausalityDocument['verdict']; reason: string } {
  if (p.n < MIN_RANDOM_FOR_VERDICT) return { verdict: 'undetermined', reason: `only ${p.n} random directions (need ≥ ${MIN_RANDOM_FOR_VERDICT})` };
  if (!p.finite) return { verdict: 'undetermined', reason: 'an effect was not finite' };
  if (p.degenerate) return { verdict: 'undetermined', reason: 'every random direction had the same effect' };
  const pc = p.percentile.toFixed(1);
  if (p.percentile >= 95 && p.monotone) return { verdict: 'causal', reason: `percentile ${pc} ≥ 95 and the α-sweep rises monotonically` };
  if (p.percentile >= 95) return { verdict: 'weak', reason: `percentile ${pc} ≥ 95 but the α-sweep does not rise monotonically` };
  if (p.percentile >= 80) return { verdict: 'weak', reason: `percentile ${pc} is in [80, 95)` };
  return { verdict: 'not_distinguishable', reason: `percentile ${pc} < 80` };
}


export const operation = defineOperation({
  name: 'causality',
  description:
    'Causality test for a steering direction at blocks.{layer}.hook_resid_pre (openinterp protocol): the control-normalised effect of α·d on target tokens (target log-prob Δ − control log-prob Δ at the final prompt position) against N seeded random directions of equal norm (percentile, z-score), plus a monotonicity check over an α-sweep; verdict causal / weak / not_distinguishable / undetermined from the rule stated in `verdict_rule`, with the deciding numbers. ' +
    `Non-token directions need explicit targets. All variants run as rows of batched engine runs. Caps: ${MAX_RANDOM_DIRECTIONS} random directions, ${MAX_SWEEP_ALPHAS} sweep values.`,
  input,
  output,
  long: true,
}).implement(async (model, inp, ctx) => {
  // caps and the targets requirement before any engine run
  if (inp.n_random > MAX_RANDOM_DIRECTIONS) {
    throw new LoupeError('TOO_LARGE', `n_random = ${inp.n_random} exceeds the cap of ${MAX_RANDOM_DIRECTIONS}.`, `Use at most ${MAX_RANDOM_DIRECTIONS} random directions.`);
  }
  if (inp.sweep_multiples.length > MAX_SWEEP_ALPHAS) {
    throw new LoupeError('TOO_LARGE', `${inp.sweep_multiples.length} sweep values exceed the cap of ${MAX_SWEEP_ALPHAS}.`);
  }
  if (parseDirectionSpec(inp.direction).kind !== 'tokens' && !inp.targets) {
    throw new LoupeError('BAD_INPUT', 'causality needs `targets` for a direction that is not made of tokens.',
      'Name the tokens the direction should promote (e.g. ["#432"] or [" happy"]); targets chosen from the direction itself would make it look special by construction.');
  }
  ctx.onProgress?.({ stage: 'base run', done: 0, total: 1 });
  const setup = await prepareSteering(model, inp, ctx);
  const { ids, hook, dir, targets, controls } = setup;
  const alpha = inp.alpha ?? inp.alpha_multiple * setup.residNorm;
  const norm = vecNorm(dir.vector);
  const seeds = rng(inp.seed);
  const randoms: Variant[] = [];
  for (let i = 0; i < inp.n_random; i++) {
    const v = randomVector(model.info.d_model, Math.floor(seeds() * 2 ** 31));
    const s = norm / vecNorm(v);
    for (let j = 0; j < v.length; j++) v[j] *= s;
    randoms.push({ vector: v, alpha });
  }
  const sweepAlphas = inp.sweep_multiples.map((m) => m * alpha);
  const variants: Variant[] = [{ vector: dir.vector, alpha }, ...randoms, ...sweepAlphas.map((a) => ({ vector: dir.vector, alpha: a }))];
  const lps = await evaluateVariants(model, ids, hook, inp.positions, variants, ctx, 'measuring directions');
  const metric = (i: number) => steeringMetrics(setup.baseLogprobs, lps[i], targets, controls);
  const main = metric(0);
  const randomEffects = randoms.map((_, i) => metric(1 + i).normalized_effect);
  const sweepMetrics = sweepAlphas.map((_, i) => metric(1 + randoms.length + i));

  const e = main.normalized_effect;
  const n = randomEffects.length;
  const below = randomEffects.filter((r) => r < e).length;
  const equal = randomEffects.filter((r) => r === e).length;
  const percentile = (100 * (below + 0.5 * equal)) / n;
  const mean = randomEffects.reduce((a, b) => a + b, 0) / n;
  const sd = Math.sqrt(randomEffects.reduce((a, b) => a + (b - mean) ** 2, 0) / Math.max(1, n - 1));
  const sweepEffects = sweepMetrics.map((m) => m.normalized_effect);
  const tr = trend(sweepAlphas, sweepEffects);
  const allFinite = [e, ...randomEffects, ...sweepEffects].every(Number.isFinite);
  const degenerate = randomEffects.every((r) => r === randomEffects[0]);
  const { verdict, reason } = decideVerdict({ n, percentile, monotone: tr === 'increasing', finite: allFinite, degenerate });
  const safe = (x: number) => (Number.isFinite(x) ? x : 0);

  return {
    ...documentHead('causality', model, inp.prompt, ids),
    layer: inp.layer,
    hook,
    positions: inp.positions,
    direction: directionBlock(dir),
    resid_norm: finite(setup.residNorm),
    alpha,
    targets: tokenRefs(model, targets),
    controls: tokenRefs(model, controls),
    targets_rule: setup.targetsRule,
    controls_rule: setup.controlsRule,
    effect: {
      target_logprob_delta: safe(main.target_logprob_delta), control_logprob_delta: safe(main.control_logprob_delta),
      normalized_effect: safe(e), kl_from_base: safe(main.kl_from_base),
    },
    random: { n, seed: inp.seed, norm, effects: randomEffects.map(safe), mean: safe(mean), sd: safe(sd), max: safe(Math.max(...randomEffects)) },
    percentile,
    z_score: sd > 0 && Number.isFinite(e) ? (e - mean) / sd : null,
    sweep: {
      multiples: inp.sweep_multiples, alphas: sweepAlphas, normalized_effect: sweepEffects.map(safe),
      target_logprob_delta: sweepMetrics.map((m) => safe(m.target_logprob_delta)), trend: tr, monotone: tr === 'increasing',
    },
    verdict,
    verdict_reason: reason,
    verdict_rule: VERDICT_RULE,
    interventions: [{ hook, op: 'add', positions: inp.positions, alpha, direction: dir.spec, normalize: inp.normalize }],
    metric_definitions: METRIC_DEFINITIONS,
    // the base run plus evaluateVariants' batched runs (a mean_diff direction's own runs not counted)
    engine_runs: 1 + Math.ceil(variants.length / rowsPerRun(model, ids.length)),
  };
});

