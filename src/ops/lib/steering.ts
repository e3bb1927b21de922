/**
 * The steering machinery `steer`, `sweep`, `sae_steer` and `causality` share: input fields, the
 * setup (tokens, direction, targets, controls, base run), the metric definitions, batched
 * evaluation of many (direction, α) variants in as few engine runs as the batch cap allows, and
 * the trend of a metric curve.
 *
 * Metrics (at the final prompt position, natural-log probabilities):
 *   target_logprob_delta  = mean over targets  of log p_steered(t) − log p_base(t)
 *   control_logprob_delta = mean over controls of log p_steered(c) − log p_base(c)
 *   normalized_effect     = target_logprob_delta − control_logprob_delta
 *     (control-normalised: an edit that merely sharpens or flattens the distribution moves the
 *      controls too, and is subtracted out)
 *   relative_change       = exp(normalized_effect) − 1
 *     (the targets' probability ratio relative to the controls' ratio, minus one; geometric means)
 *   kl_from_base          = KL(p_base ‖ p_steered)
 */
import { z } from 'zod';
import type { Intervention, LoadedModel, LogitReduce, LogitRow } from '../../engine/api';
import { LoupeError, throwIfAborted } from '../../engine/errors';
import type { OpContext } from '../types';
import { CAPS, checkNewTokens } from '../../engine/caps';
import { promptFields, promptIds, resolveToken } from './tokens';
import { klDivergence, logSoftmax } from './math';
import { storeOf } from './handle-store';
import { vocabFilter } from './vocab';
import {
  directionBlock,
  directionBlockSchema,
  directionSpec,
  directLogitScores,
  resolveDirection,
  unembedCosines,
  type ResolvedDirection,
} from './directions';
import { finite } from '../../engine/caps';

// ------------------------------------------------------------------ shared input fields

export const positionsField = z
  .union([z.literal('all'), z.array(z.number().int().min(0)).min(1).max(4096)])
  .default('all')
  .describe('positions that receive α·d ("all" also steers every generated token); 0-based, BOS included');

export const steeringFields = {
  ...promptFields,
  layer: z.number().int().min(0).describe('the edit is added to blocks.{layer}.hook_resid_pre'),
  direction: directionSpec,
  normalize: z
    .boolean()
    .default(true)
    .describe('scale d to unit norm so α is in residual-stream units (the raw norm is reported)'),
  positions: positionsField,
  targets: z
    .array(z.string())
    .min(1)
    .max(64)
    .optional()
    .describe(
      "tokens the direction should promote (default: the direction's positive tokens; for other directions, the 5 tokens with the largest direct logit effect)",
    ),
  controls: z
    .array(z.string())
    .min(1)
    .max(64)
    .optional()
    .describe(
      'unrelated tokens used to normalise (default: of the 50 most likely base tokens, ' +
        "the 5 whose unembedding is least aligned with the targets'; never chosen from d)",
    ),
};

export const METRIC_DEFINITIONS = {
  position: 'final prompt position; natural-log probabilities',
  target_logprob_delta: 'mean over targets of log p_steered(t) − log p_base(t)',
  control_logprob_delta: 'mean over controls of log p_steered(c) − log p_base(c)',
  normalized_effect: 'target_logprob_delta − control_logprob_delta',
  relative_change:
    "exp(normalized_effect) − 1: the targets' probability ratio relative to the controls' ratio, minus one",
  kl_from_base: 'KL(p_base ‖ p_steered) in nats',
};
/**
 * Below this base probability of the targets (their geometric mean at the final position) the
 * relative change is no headline: a ratio of tiny probabilities reads as thousands of percent
 * (the controls' fall divides it) while the targets' own log-prob may even fall.
 */
export const RELATIVE_CHANGE_MIN_PROB = 0.01;

/** why relative_change is not the headline of this run (null: it is), in words with the numbers */
export function relativeChangeNote(base: Float64Array, targets: number[]): string | null {
  const lp = targets.reduce((a, t) => a + base[t], 0) / Math.max(targets.length, 1);
  const p = Math.exp(lp);
  if (!(p < RELATIVE_CHANGE_MIN_PROB)) return null;
  return (
    `the targets' base probability is ${p.toExponential(2)} (geometric mean, ` +
    `below ${RELATIVE_CHANGE_MIN_PROB * 100}%): a ratio of such small probabilities says little, ` +
    'so read the change of log-probability (target_logprob_delta, normalized_effect) instead of relative_change'
  );
}

export const relativeChangeNoteSchema = z
  .string()
  .nullable()
  .describe(
    `why relative_change is not the headline (the targets' base probability below ${RELATIVE_CHANGE_MIN_PROB * 100}%); null when it is`,
  );

/** the metrics, in the order documents list them */
export const METRICS = [
  'target_logprob_delta',
  'control_logprob_delta',
  'normalized_effect',
  'relative_change',
  'kl_from_base',
] as const;
export type MetricName = (typeof METRICS)[number];

/** one field per metric, each `v`: a schema (a number, a nullable number, a curve) or a value */
export function metricFields<T>(v: T): Record<MetricName, T> {
  return Object.fromEntries(METRICS.map((m) => [m, v])) as Record<MetricName, T>;
}

export const metricDefinitionsSchema = z.object({ position: z.string(), ...metricFields(z.string()) });

export const tokenRef = z.object({ token: z.string(), token_id: z.number().int() });

/** where and along what a residual-steering operation edits: the fields its document leads with */
export const steeringSiteSchema = {
  layer: z.number().int(),
  hook: z.string(),
  positions: z.union([z.literal('all'), z.array(z.number().int())]),
  direction: directionBlockSchema,
  resid_norm: z
    .number()
    .describe("mean ‖resid_pre‖ at the layer over the prompt's positions (BOS excluded), for scale"),
};

// ------------------------------------------------------------------ setup

export interface SteeringSetupInput {
  prompt: string;
  prepend_bos: boolean;
  layer: number;
  direction: z.infer<typeof directionSpec>;
  normalize: boolean;
  positions: 'all' | number[];
  targets?: string[];
  controls?: string[];
}

export interface SteeringSetup {
  ids: number[];
  hook: string;
  dir: ResolvedDirection;
  targets: number[];
  controls: number[];
  targetsRule: string;
  controlsRule: string;
  /** targets chosen from the direction itself (biases any comparison with other directions) */
  targetsFromDirection: boolean;
  baseLogprobs: Float64Array;
  /** mean over positions (BOS excluded) of ‖resid_pre‖ at the layer, from the base run */
  residNorm: number;
  /** the fields a document leads with (steeringSiteSchema): layer, hook, positions, direction, resid_norm */
  site: SteeringSite;
  /** the edit α·d at the hook and positions (on batch rows `batch`, default all) */
  edit(alpha: number, batch?: number[]): Intervention;
  /** the metrics of steered final-position log-probs against the base run, on the targets and controls */
  metrics(steered: Float64Array): SteeringMetrics;
  /** what a steered row's logits are reduced to for them (runtime/reduce.ts): the targets' and controls' logits, KL from the base */
  reduce: LogitReduce;
  /** the same metrics from a row reduced by `reduce` (steeredLogprobs then holds only the targets' and controls') */
  metricsOfRow(row: LogitRow): SteeringMetrics;
}

type SteeringSite = { [K in keyof typeof steeringSiteSchema]: z.infer<(typeof steeringSiteSchema)[K]> };

export const DEFAULT_TARGETS = 5;
export const DEFAULT_CONTROLS = 5;
export const CONTROL_POOL = 50;

type Chosen = { ids: number[]; rule: string };

/** tokens the caller gave (rule 'given'), or the default `choose` picks with the rule it used (run only when needed) */
export async function givenOr(given: number[] | undefined, choose: () => Chosen | Promise<Chosen>): Promise<Chosen> {
  return given ? { ids: given, rule: 'given' } : choose();
}

/** the k tokens with the largest score (ties: the lower id first), among those `keep` accepts */
export function topTokens(scores: ArrayLike<number>, k: number, keep: (id: number) => boolean = () => true): number[] {
  return Array.from({ length: scores.length }, (_, i) => i)
    .filter(keep)
    .sort((a, b) => scores[b] - scores[a] || a - b)
    .slice(0, k);
}

/**
 * where default controls are chosen from: the CONTROL_POOL most likely base tokens (ties: the lower
 * id first), leaving out the targets, whatever else `exclude` names (BOS, EOS, negatives) and the
 * tokens `keep` refuses (lib/vocab.ts: special, undecodable, untrained)
 */
export function controlPool(
  baseLogprobs: Float64Array,
  exclude: Iterable<number | undefined>,
  keep: (id: number) => boolean = () => true,
): number[] {
  const out = new Set(exclude);
  return Array.from({ length: baseLogprobs.length }, (_, i) => i)
    .filter((i) => !out.has(i) && keep(i))
    .sort((a, b) => baseLogprobs[b] - baseLogprobs[a] || a - b)
    .slice(0, CONTROL_POOL);
}

/** edited positions inside the prompt of T tokens (BAD_INPUT naming those outside) */
export function checkEditPositions(positions: 'all' | number[], T: number): void {
  if (positions === 'all') return;
  const bad = positions.filter((p) => p >= T);
  if (bad.length)
    throw new LoupeError(
      'BAD_INPUT',
      `positions ${bad.join(', ')} are outside the prompt (${T} tokens, BOS included).`,
      `Use positions 0–${T - 1}, or "all".`,
    );
}

/** the targets and controls the caller gave, resolved before any engine run so a typo fails at once */
export function givenTokens(
  model: LoadedModel,
  inp: { targets?: string[]; controls?: string[] },
): { targets?: number[]; controls?: number[] } {
  return {
    targets: inp.targets?.map((t) => resolveToken(model, t, 'targets')),
    controls: inp.controls?.map((t) => resolveToken(model, t, 'controls')),
  };
}

export async function prepareSteering(
  model: LoadedModel,
  inp: SteeringSetupInput,
  ctx: OpContext,
  extraTokens = 0,
): Promise<SteeringSetup> {
  const L = model.info.n_layers;
  if (inp.layer >= L)
    throw new LoupeError('BAD_INPUT', `layer ${inp.layer} does not exist; the model has ${L} layers (0–${L - 1}).`);
  const ids = promptIds(model, inp.prompt, { prependBos: inp.prepend_bos, extra: extraTokens });
  checkEditPositions(inp.positions, ids.length);
  const { targets: givenTargets, controls: givenControls } = givenTokens(model, inp);
  const hook = `blocks.${inp.layer}.hook_resid_pre`;
  const dir = await resolveDirection(model, inp.direction, {
    layer: inp.layer,
    normalize: inp.normalize,
    prependBos: inp.prepend_bos,
    store: storeOf(ctx),
    signal: ctx.signal,
    onProgress: (done, total) => ctx.onProgress?.({ stage: 'reading direction prompts', done, total }),
  });
  throwIfAborted(ctx.signal);
  const T = ids.length;
  // the last position's logits, and the hook's norm at each position (reduced where the hook is)
  const base = await model.run(ids, { hookStats: [hook], logitPositions: [T - 1], signal: ctx.signal });
  const V = model.info.d_vocab;
  const baseLogprobs = logSoftmax(base.logits.data, 0, V);
  const reduce: LogitReduce = { ids: [], ref: Float32Array.from(baseLogprobs) };
  const norms = base.hookStats![hook].norms;
  const t0 = inp.prepend_bos && T > 1 && model.bosTokenId !== undefined && ids[0] === model.bosTokenId ? 1 : 0;
  let residNorm = 0;
  for (let t = t0; t < T; t++) residNorm += norms[t] / (T - t0);

  const targetsFromDirection = !givenTargets && !dir.positive_ids.length;
  // defaults name only tokens the model can produce and a page can show (lib/vocab.ts)
  const needsVocab = (!givenTargets && !dir.positive_ids.length) || !givenControls;
  const vocab = needsVocab ? await vocabFilter(model, ctx.signal) : null;
  const { ids: targets, rule: targetsRule } = await givenOr(givenTargets, async () =>
    dir.positive_ids.length
      ? { ids: dir.positive_ids, rule: "the direction's positive tokens" }
      : {
          ids: topTokens(await directLogitScores(model, dir.vector, ctx.signal), DEFAULT_TARGETS, vocab!.usable),
          rule:
            `the ${DEFAULT_TARGETS} tokens with the largest direct logit effect (w_lnf ⊙ d)·W_U[:, ` +
            `t] — chosen from d itself, so comparisons with other directions favour d; ${vocab!.rule}`,
        },
  );
  const { ids: controls, rule: controlsRule } = await givenOr(givenControls, async () => {
    // Controls depend on the targets only, never on d: causality compares d with random directions
    // on the same controls, and controls picked from d would make d's effect non-exchangeable.
    const pool = controlPool(
      baseLogprobs,
      [...targets, ...dir.negative_ids, model.bosTokenId, model.eosTokenId],
      vocab!.usable,
    );
    const cos = await unembedCosines(model, targets, pool, ctx.signal);
    return {
      ids: pool
        .map((id, k) => ({ id, c: Math.abs(cos[k]) }))
        .sort((a, b) => a.c - b.c || a.id - b.id)
        .slice(0, DEFAULT_CONTROLS)
        .map((x) => x.id),
      rule:
        `of the ${CONTROL_POOL} most likely base tokens (targets, negatives, BOS, EOS excluded), ` +
        `the ${DEFAULT_CONTROLS} whose unembedding W_U[:, c] is least aligned (smallest |cosine|) ` +
        `with the targets' mean unembedding; independent of d; ${vocab!.rule}`,
    };
  });
  reduce.ids = [...targets, ...controls];
  return {
    ids,
    hook,
    dir,
    targets,
    controls,
    targetsRule,
    controlsRule,
    targetsFromDirection,
    baseLogprobs,
    residNorm,
    site: {
      layer: inp.layer,
      hook,
      positions: inp.positions,
      direction: directionBlock(dir),
      resid_norm: finite(residNorm),
    },
    edit: (alpha, batch) => steerIntervention(hook, dir.vector, alpha, inp.positions, batch),
    metrics: (steered) => steeringMetrics(baseLogprobs, steered, targets, controls),
    reduce,
    metricsOfRow: (row) => {
      // the targets' and controls' steered log-probs (the rest of the row NaN: never read)
      const steered = new Float64Array(V).fill(NaN);
      reduce.ids.forEach((id, k) => (steered[id] = row.at[k] - row.logsumexp));
      return { ...steeringMetrics(baseLogprobs, steered, targets, controls, true), kl_from_base: Math.max(0, row.kl!) };
    },
  };
}

// ------------------------------------------------------------------ metrics

export interface SteeringMetrics {
  target_logprob_delta: number;
  control_logprob_delta: number;
  normalized_effect: number;
  relative_change: number;
  kl_from_base: number;
  steeredLogprobs: Float64Array;
}

/** a run's metrics as a document lists them (finite numbers) */
export function metricValues(m: SteeringMetrics): Record<MetricName, number> {
  return Object.fromEntries(METRICS.map((k) => [k, finite(m[k])])) as Record<MetricName, number>;
}

/** per metric, its value for each run, in run order */
export function metricCurves(ms: SteeringMetrics[]): Record<MetricName, number[]> {
  return Object.fromEntries(METRICS.map((k) => [k, ms.map((m) => finite(m[k]))])) as Record<MetricName, number[]>;
}

export function steeringMetrics(
  base: Float64Array,
  steered: Float64Array,
  targets: number[],
  controls: number[],
  /** KL is the caller's (a row reduced on the device): not taken over the row */
  noKl = false,
): SteeringMetrics {
  const meanDelta = (ids: number[]) => ids.reduce((a, t) => a + (steered[t] - base[t]), 0) / ids.length;
  const td = meanDelta(targets);
  const cd = meanDelta(controls);
  return {
    target_logprob_delta: td,
    control_logprob_delta: cd,
    normalized_effect: td - cd,
    relative_change: Math.expm1(td - cd),
    kl_from_base: noKl ? NaN : Math.max(0, klDivergence(base, steered)),
    steeredLogprobs: steered,
  };
}

export interface Variant {
  vector: ArrayLike<number>;
  alpha: number;
}

export function steerIntervention(
  hook: string,
  vector: ArrayLike<number>,
  alpha: number,
  positions: 'all' | number[],
  batch?: number[],
): Intervention {
  return { hook, op: 'add', alpha, value: Float32Array.from(vector), positions, ...(batch ? { batch } : {}) };
}

/** rows per engine run: the batch cap, and at most ~64 MiB of logits per run */
export function rowsPerRun(model: LoadedModel, T: number): number {
  const perRow = T * model.info.d_vocab * 4;
  return Math.max(1, Math.min(CAPS.maxBatch, Math.floor((64 * 1024 * 1024) / perRow)));
}

/**
 * Final-position log-probs of many steered variants, batched: each row carries one variant's
 * edit (its intervention addresses that row through `batch`). Checks the signal between runs.
 */
export async function evaluateVariants(
  model: LoadedModel,
  ids: number[],
  hook: string,
  positions: 'all' | number[],
  variants: Variant[],
  ctx: OpContext,
  stage: string,
): Promise<Float64Array[]> {
  const T = ids.length;
  const V = model.info.d_vocab;
  const per = rowsPerRun(model, T);
  const out: Float64Array[] = [];
  for (let s = 0; s < variants.length; s += per) {
    throwIfAborted(ctx.signal);
    const chunk = variants.slice(s, s + per);
    const ivs = chunk.map((v, r) =>
      steerIntervention(hook, v.vector, v.alpha, positions, chunk.length > 1 ? [r] : undefined),
    );
    const res = await model.run(ids, {
      interventions: ivs,
      batch: chunk.length > 1 ? chunk.length : undefined,
      signal: ctx.signal,
    });
    for (let r = 0; r < chunk.length; r++) out.push(logSoftmax(res.logits.data, (r * T + T - 1) * V, V));
    ctx.onProgress?.({ stage, done: Math.min(s + per, variants.length), total: variants.length });
  }
  return out;
}

export function tokenRefs(model: LoadedModel, ids: number[]) {
  const s = model.tokenStrings(ids);
  return ids.map((id, i) => ({ token: s[i], token_id: id }));
}

interface TokenDelta<S> {
  token: string;
  token_id: number;
  base_logprob: number;
  steered_logprob: S;
  delta: S;
}

/** each token's base and steered log-prob and their change (null without a steered run) */
export function tokenDeltas(
  model: LoadedModel,
  ids: number[],
  base: Float64Array,
  steered: Float64Array,
): TokenDelta<number>[];
export function tokenDeltas(
  model: LoadedModel,
  ids: number[],
  base: Float64Array,
  steered: Float64Array | null,
): TokenDelta<number | null>[];
export function tokenDeltas(model: LoadedModel, ids: number[], base: Float64Array, steered: Float64Array | null) {
  return tokenRefs(model, ids).map((r) => ({
    ...r,
    base_logprob: finite(base[r.token_id]),
    steered_logprob: steered ? finite(steered[r.token_id]) : null,
    delta: steered ? finite(steered[r.token_id] - base[r.token_id]) : null,
  }));
}

// ------------------------------------------------------------------ sampling

/** generated tokens one steer/sweep call may ask for (per row) */
export const MAX_STEER_NEW_TOKENS = 256;

const samplingSchema = z.object({
  max_new_tokens: z.number().int(),
  temperature: z.number(),
  top_k: z.number().int(),
  top_p: z.number(),
  seed: z.number().int(),
  stop_at_eos: z.boolean(),
});
type SamplingInput = z.infer<typeof samplingSchema>;

/**
 * How steer, sweep and sae_steer generate: their input fields, the block their documents list,
 * and the options the generation loop (lib/generation.ts) takes.
 */
export const sampling = {
  fields: {
    max_new_tokens: z.number().int().min(0).default(20),
    temperature: z.number().min(0).default(0).describe('0 = greedy'),
    top_k: z.number().int().min(0).default(0).describe('0 = no top-k filter'),
    top_p: z.number().gt(0).max(1).default(1),
    seed: z
      .number()
      .int()
      .default(0)
      .describe('sampling seed (each row samples with its own generator seeded with this)'),
    stop_at_eos: z.boolean().default(true),
  },
  schema: samplingSchema,
  block(inp: SamplingInput): SamplingInput {
    const { max_new_tokens, temperature, top_k, top_p, seed, stop_at_eos } = inp;
    return { max_new_tokens, temperature, top_k, top_p, seed, stop_at_eos };
  },
  options(inp: SamplingInput) {
    return {
      maxNewTokens: inp.max_new_tokens,
      temperature: inp.temperature,
      topK: inp.top_k,
      topP: inp.top_p,
      seed: inp.seed,
      stopAtEos: inp.stop_at_eos,
    };
  },
};

export function checkSteerTokens(n: number): void {
  checkNewTokens(n);
  if (n > MAX_STEER_NEW_TOKENS)
    throw new LoupeError(
      'TOO_LARGE',
      `max_new_tokens = ${n} exceeds the steering cap of ${MAX_STEER_NEW_TOKENS}.`,
      `Ask for at most ${MAX_STEER_NEW_TOKENS} tokens.`,
    );
}

// ------------------------------------------------------------------ sweeps

/** most α values one sweep may evaluate */
export const MAX_SWEEP_ALPHAS = 32;
export const DEFAULT_MULTIPLES = [-1, -0.5, -0.25, 0, 0.25, 0.5, 1];

export const TRENDS = ['increasing', 'decreasing', 'flat', 'not_monotone'] as const;
export type Trend = (typeof TRENDS)[number];

/**
 * Trend of ys (in the order of increasing xs): 'increasing' when no step goes down by more than
 * tol and the last value exceeds the first by more than tol; 'decreasing' mirrored; 'flat' when no
 * step moves more than tol. tol = 1e-6 · max(1, max |y|) absorbs float32 noise only.
 */
export function trend(xs: number[], ys: number[]): Trend {
  const order = xs.map((_, i) => i).sort((a, b) => xs[a] - xs[b]);
  const y = order.map((i) => ys[i]);
  const tol = 1e-6 * Math.max(1, ...y.map(Math.abs));
  let up = true;
  let down = true;
  let flat = true;
  for (let i = 1; i < y.length; i++) {
    const d = y[i] - y[i - 1];
    if (d < -tol) up = false;
    if (d > tol) down = false;
    if (Math.abs(d) > tol) flat = false;
  }
  if (flat) return 'flat';
  if (up && y[y.length - 1] - y[0] > tol) return 'increasing';
  if (down && y[0] - y[y.length - 1] > tol) return 'decreasing';
  return 'not_monotone';
}

const TREND_RULE =
  'over α sorted ascending: increasing = no step down by more than tol and last > first + tol; ' +
  'decreasing mirrored; flat = no step beyond tol; tol = 1e-6·max(1, max|y|)';

/** the trends of a sweep's curves, as sweep and sae_steer documents list them */
export const monotoneSchema = z.object({
  target_logprob_delta: z.enum(TRENDS),
  control_logprob_delta: z.enum(TRENDS),
  normalized_effect: z.enum(TRENDS),
  rule: z.string(),
});

export function monotone(alphas: number[], curves: Record<MetricName, number[]>): z.infer<typeof monotoneSchema> {
  return {
    target_logprob_delta: trend(alphas, curves.target_logprob_delta),
    control_logprob_delta: trend(alphas, curves.control_logprob_delta),
    normalized_effect: trend(alphas, curves.normalized_effect),
    rule: TREND_RULE,
  };
}
