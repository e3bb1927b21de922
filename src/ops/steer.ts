/**
 * `steer` (openinterp's steer): add α·d to blocks.{layer}.hook_resid_pre and generate, base and
 * steered side by side (one batched, KV-cached generation: row 0 base, row 1 steered), and measure
 * the edit's effect on the next-token distribution at the final prompt position.
 *
 * This module also holds the steering machinery `sweep` and `causality` share: input fields, the
 * setup (tokens, direction, targets, controls, base run), the metric definitions, and batched
 * evaluation of many (direction, α) variants in as few engine runs as the batch cap allows.
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
import { generationBlock } from '../schema/generation';
import type { Intervention, LoadedModel } from '../engine/api';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { documentBase, documentHead } from '../schema/common';
import type { Operation, OpContext } from './types';
import { CAPS, checkNewTokens, finite, parseInput } from './lib/caps';
import { promptFields, promptIds, resolveToken } from './lib/tokens';
import { klDivergence, logSoftmax } from './lib/math';
import { storeOf } from './lib/handle-store';
import { directionBlock, directionBlockSchema, directionSpec, directLogitScores, resolveDirection, unembedColumnsMean, type ResolvedDirection } from './lib/directions';
import { generateBatch } from './lib/generation';

// ------------------------------------------------------------------ shared input fields

export const positionsField = z.union([z.literal('all'), z.array(z.number().int().min(0)).min(1).max(4096)]).default('all')
  .describe('positions that receive α·d ("all" also steers every generated token); 0-based, BOS included');

export const steeringFields = {
  ...promptFields,
  layer: z.number().int().min(0).describe('the edit is added to blocks.{layer}.hook_resid_pre'),
  direction: directionSpec,
  normalize: z.boolean().default(true).describe('scale d to unit norm so α is in residual-stream units (the raw norm is reported)'),
  positions: positionsField,
  targets: z.array(z.string()).min(1).max(64).optional()
    .describe('tokens the direction should promote (default: the direction\'s positive tokens; for other directions, the 5 tokens with the largest direct logit effect)'),
  controls: z.array(z.string()).min(1).max(64).optional()
    .describe('unrelated tokens used to normalise (default: of the 50 most likely base tokens, the 5 whose unembedding is least aligned with the targets\'; never chosen from d)'),
};

export const METRIC_DEFINITIONS = {
  position: 'final prompt position; natural-log probabilities',
  target_logprob_delta: 'mean over targets of log p_steered(t) − log p_base(t)',
  control_logprob_delta: 'mean over controls of log p_steered(c) − log p_base(c)',
  normalized_effect: 'target_logprob_delta − control_logprob_delta',
  relative_change: 'exp(normalized_effect) − 1: the targets\' probability ratio relative to the controls\' ratio, minus one',
  kl_from_base: 'KL(p_base ‖ p_steered) in nats',
};
export const metricDefinitionsSchema = z.object({
  position: z.string(), target_logprob_delta: z.string(), control_logprob_delta: z.string(),
  normalized_effect: z.string(), relative_change: z.string(), kl_from_base: z.string(),
});

export const tokenRef = z.object({ token: z.string(), token_id: z.number().int() });

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
}

const DEFAULT_TARGETS = 5;
const DEFAULT_CONTROLS = 5;
const CONTROL_POOL = 50;

export async function prepareSteering(model: LoadedModel, inp: SteeringSetupInput, ctx: OpContext, extraTokens = 0): Promise<SteeringSetup> {
  const L = model.info.n_layers;
  if (inp.layer >= L) throw new LoupeError('BAD_INPUT', `layer ${inp.layer} does not exist; the model has ${L} layers (0–${L - 1}).`);
  const ids = promptIds(model, inp.prompt, { prependBos: inp.prepend_bos, extra: extraTokens });
  if (inp.positions !== 'all') {
    const bad = inp.positions.filter((p) => p >= ids.length);
    if (bad.length) throw new LoupeError('BAD_INPUT', `positions ${bad.join(', ')} are outside the prompt (${ids.length} tokens, BOS included).`, `Use positions 0–${ids.length - 1}, or "all".`);
  }
  // resolve token strings before any engine run so a typo fails at once
  const givenTargets = inp.targets?.map((t) => resolveToken(model, t, 'targets'));
  const givenControls = inp.controls?.map((t) => resolveToken(model, t, 'controls'));
  const hook = `blocks.${inp.layer}.hook_resid_pre`;
  const dir = await resolveDirection(model, inp.direction, {
    layer: inp.layer, normalize: inp.normalize, prependBos: inp.prepend_bos, store: storeOf(ctx), signal: ctx.signal,
    onProgress: (done, total) => ctx.onProgress?.({ stage: 'reading direction prompts', done, total }),
  });
  throwIfAborted(ctx.signal);
  const base = await model.run(ids, { hooks: [hook], signal: ctx.signal });
  const V = model.info.d_vocab;
  const T = ids.length;
  const baseLogprobs = logSoftmax(base.logits.data, (T - 1) * V, V);
  const D = model.info.d_model;
  const r = base.hooks[hook].data;
  const t0 = inp.prepend_bos && T > 1 && model.bosTokenId !== undefined && ids[0] === model.bosTokenId ? 1 : 0;
  let residNorm = 0;
  for (let t = t0; t < T; t++) {
    let s = 0;
    for (let j = 0; j < D; j++) s += r[t * D + j] ** 2;
    residNorm += Math.sqrt(s) / (T - t0);
  }

  let targets: number[];
  let targetsRule: string;
  let targetsFromDirection = false;
  if (givenTargets) {
    targets = givenTargets;
    targetsRule = 'given';
  } else if (dir.positive_ids.length) {
    targets = dir.positive_ids;
    targetsRule = 'the direction\'s positive tokens';
  } else {
    const s = directLogitScores(model, dir.vector);
    targets = Array.from({ length: V }, (_, i) => i).sort((a, b) => s[b] - s[a]).slice(0, DEFAULT_TARGETS);
    targetsRule = `the ${DEFAULT_TARGETS} tokens with the largest direct logit effect (w_lnf ⊙ d)·W_U[:, t] — chosen from d itself, so comparisons with other directions favour d`;
    targetsFromDirection = true;
  }
  let controls: number[];
  let controlsRule: string;
  if (givenControls) {
    controls = givenControls;
    controlsRule = 'given';
  } else {
    // Controls depend on the targets only, never on d: causality compares d with random directions
    // on the same controls, and controls picked from d would make d's effect non-exchangeable.
    const exclude = new Set([...targets, ...dir.negative_ids, model.bosTokenId, model.eosTokenId]);
    const pool = Array.from({ length: V }, (_, i) => i).filter((i) => !exclude.has(i))
      .sort((a, b) => baseLogprobs[b] - baseLogprobs[a]).slice(0, CONTROL_POOL);
    const cos = unembedCosines(model, targets, pool);
    controls = pool.map((id, k) => ({ id, c: Math.abs(cos[k]) })).sort((a, b) => a.c - b.c || a.id - b.id).slice(0, DEFAULT_CONTROLS).map((x) => x.id);
    controlsRule = `of the ${CONTROL_POOL} most likely base tokens (targets, negatives, BOS, EOS excluded), the ${DEFAULT_CONTROLS} whose unembedding W_U[:, c] is least aligned (smallest |cosine|) with the targets' mean unembedding; independent of d`;
  }
  return { ids, hook, dir, targets, controls, targetsRule, controlsRule, targetsFromDirection, baseLogprobs, residNorm };
}

/** cosine between each candidate's unembedding column and the targets' mean column */
function unembedCosines(model: LoadedModel, targets: number[], candidates: number[]): number[] {
  const t = unembedColumnsMean(model, targets);
  const W = model.param('unembed.W_U');
  const [D, V] = W.dims;
  let tn = 0;
  for (let j = 0; j < D; j++) tn += t[j] * t[j];
  return candidates.map((c) => {
    let dotp = 0;
    let cn = 0;
    for (let j = 0; j < D; j++) { const w = W.data[j * V + c]; dotp += w * t[j]; cn += w * w; }
    return dotp / Math.sqrt(Math.max(tn * cn, 1e-30));
  });
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

export function steeringMetrics(base: Float64Array, steered: Float64Array, targets: number[], controls: number[]): SteeringMetrics {
  const meanDelta = (ids: number[]) => ids.reduce((a, t) => a + (steered[t] - base[t]), 0) / ids.length;
  const td = meanDelta(targets);
  const cd = meanDelta(controls);
  return {
    target_logprob_delta: td,
    control_logprob_delta: cd,
    normalized_effect: td - cd,
    relative_change: Math.expm1(td - cd),
    kl_from_base: Math.max(0, klDivergence(base, steered)),
    steeredLogprobs: steered,
  };
}

export interface Variant {
  vector: ArrayLike<number>;
  alpha: number;
}

export function steerIntervention(hook: string, vector: ArrayLike<number>, alpha: number, positions: 'all' | number[], batch?: number[]): Intervention {
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
  model: LoadedModel, ids: number[], hook: string, positions: 'all' | number[], variants: Variant[],
  ctx: OpContext, stage: string,
): Promise<Float64Array[]> {
  const T = ids.length;
  const V = model.info.d_vocab;
  const per = rowsPerRun(model, T);
  const out: Float64Array[] = [];
  for (let s = 0; s < variants.length; s += per) {
    throwIfAborted(ctx.signal);
    const chunk = variants.slice(s, s + per);
    const ivs = chunk.map((v, r) => steerIntervention(hook, v.vector, v.alpha, positions, chunk.length > 1 ? [r] : undefined));
    const res = await model.run(ids, { interventions: ivs, batch: chunk.length > 1 ? chunk.length : undefined, signal: ctx.signal });
    for (let r = 0; r < chunk.length; r++) out.push(logSoftmax(res.logits.data, (r * T + T - 1) * V, V));
    ctx.onProgress?.({ stage, done: Math.min(s + per, variants.length), total: variants.length });
  }
  return out;
}

export function tokenRefs(model: LoadedModel, ids: number[]) {
  const s = model.tokenStrings(ids);
  return ids.map((id, i) => ({ token: s[i], token_id: id }));
}

// ------------------------------------------------------------------ the operation

/** generated tokens one steer/sweep call may ask for (per row) */
export const MAX_STEER_NEW_TOKENS = 256;

export const samplingFields = {
  max_new_tokens: z.number().int().min(0).default(20),
  temperature: z.number().min(0).default(0).describe('0 = greedy'),
  top_k: z.number().int().min(0).default(0).describe('0 = no top-k filter'),
  top_p: z.number().gt(0).max(1).default(1),
  seed: z.number().int().default(0).describe('sampling seed (each row samples with its own generator seeded with this)'),
  stop_at_eos: z.boolean().default(true),
};

export function checkSteerTokens(n: number): void {
  checkNewTokens(n);
  if (n > MAX_STEER_NEW_TOKENS) throw new LoupeError('TOO_LARGE', `max_new_tokens = ${n} exceeds the steering cap of ${MAX_STEER_NEW_TOKENS}.`, `Ask for at most ${MAX_STEER_NEW_TOKENS} tokens.`);
}

const input = z.object({
  ...steeringFields,
  alpha: z.number().describe('strength: the edit is α·d (with a unit d, α is the edit\'s norm)'),
  ...samplingFields,
});
export type SteerInput = z.input<typeof input>;

const tokenDelta = tokenRef.extend({ base_logprob: z.number(), steered_logprob: z.number(), delta: z.number() });

export const samplingSchema = z.object({ max_new_tokens: z.number().int(), temperature: z.number(), top_k: z.number().int(), top_p: z.number(), seed: z.number().int(), stop_at_eos: z.boolean() });

export const interventionRecord = z.object({
  hook: z.string(), op: z.literal('add'), positions: z.union([z.literal('all'), z.array(z.number().int())]),
  alpha: z.number(), direction: z.unknown(), normalize: z.boolean(),
});

const output = documentBase('steer').extend({
  layer: z.number().int(),
  hook: z.string(),
  alpha: z.number(),
  positions: z.union([z.literal('all'), z.array(z.number().int())]),
  direction: directionBlockSchema,
  interventions: z.array(interventionRecord).describe('the edit as data: re-running with it reproduces this document'),
  sampling: samplingSchema,
  base: generationBlock,
  steered: generationBlock,
  resid_norm: z.number().describe('mean ‖resid_pre‖ at the layer over the prompt\'s positions (BOS excluded), for scale'),
  targets: z.array(tokenDelta),
  controls: z.array(tokenDelta),
  targets_rule: z.string(),
  controls_rule: z.string(),
  target_logprob_delta: z.number(),
  control_logprob_delta: z.number(),
  normalized_effect: z.number(),
  relative_change: z.number(),
  kl_from_base: z.number(),
  metric_definitions: metricDefinitionsSchema,
  generation: z.object({ kv_cache: z.boolean(), engine_runs: z.number().int(), batched_rows: z.number().int() }),
});
export type SteerDocument = z.infer<typeof output>;

async function run(model: LoadedModel, raw: SteerInput, ctx: OpContext): Promise<SteerDocument> {
  const inp = parseInput(input, raw);
  checkSteerTokens(inp.max_new_tokens);
  ctx.onProgress?.({ stage: 'base run', done: 0, total: 1 });
  const setup = await prepareSteering(model, inp, ctx, inp.max_new_tokens);
  const { ids, hook, dir, targets, controls } = setup;
  const iv = steerIntervention(hook, dir.vector, inp.alpha, inp.positions, [1]);
  let produced = 0;
  const gen = await generateBatch(model, ids, 2, {
    maxNewTokens: inp.max_new_tokens, temperature: inp.temperature, topK: inp.top_k, topP: inp.top_p, seed: inp.seed,
    stopAtEos: inp.stop_at_eos, interventions: [iv], signal: ctx.signal,
    onToken: ({ row }) => { if (row === 1) ctx.onProgress?.({ stage: 'generating', done: ++produced, total: inp.max_new_tokens }); },
  });
  const V = model.info.d_vocab;
  const steered = logSoftmax(gen.promptLogits[1], 0, V);
  const m = steeringMetrics(setup.baseLogprobs, steered, targets, controls);
  const deltas = (list: number[]) => tokenRefs(model, list).map((r) => ({
    ...r, base_logprob: finite(setup.baseLogprobs[r.token_id]), steered_logprob: finite(steered[r.token_id]),
    delta: finite(steered[r.token_id] - setup.baseLogprobs[r.token_id]),
  }));
  const g = (r: (typeof gen.rows)[number]) => ({ generated_token_ids: r.ids, generated_text: r.text, stop_reason: r.stop_reason });
  return output.parse({
    ...documentHead('steer', model, inp.prompt, ids),
    layer: inp.layer,
    hook,
    alpha: inp.alpha,
    positions: inp.positions,
    direction: directionBlock(dir),
    interventions: [{ hook, op: 'add', positions: inp.positions, alpha: inp.alpha, direction: dir.spec, normalize: inp.normalize }],
    sampling: { max_new_tokens: inp.max_new_tokens, temperature: inp.temperature, top_k: inp.top_k, top_p: inp.top_p, seed: inp.seed, stop_at_eos: inp.stop_at_eos },
    base: g(gen.rows[0]),
    steered: g(gen.rows[1]),
    resid_norm: finite(setup.residNorm),
    targets: deltas(targets),
    controls: deltas(controls),
    targets_rule: setup.targetsRule,
    controls_rule: setup.controlsRule,
    target_logprob_delta: finite(m.target_logprob_delta),
    control_logprob_delta: finite(m.control_logprob_delta),
    normalized_effect: finite(m.normalized_effect),
    relative_change: finite(m.relative_change),
    kl_from_base: finite(m.kl_from_base),
    metric_definitions: METRIC_DEFINITIONS,
    generation: { kv_cache: true, engine_runs: gen.runs, batched_rows: 2 },
  });
}

export const steer: Operation<SteerInput, SteerDocument> = {
  name: 'steer',
  description:
    'Add α·d to the residual stream before a layer (blocks.{layer}.hook_resid_pre; all or chosen positions; with "all", every generated token too) and generate, base and steered side by side (greedy, or sampled with a seed; KV-cached, both rows in one batch). d comes from a token pair (unembedding columns W_U[:, a] − W_U[:, b]), the mean activation difference of two prompt sets, a probe handle ("probe:<handle>"), a random seed, or numbers; it is unit-normalised by default so α is in residual-norm units (resid_norm gives the scale). ' +
    'Reports, at the final prompt position, the change of target and control tokens\' log-probabilities, normalized_effect = target Δ − control Δ, relative_change = exp(normalized_effect) − 1, and KL(base ‖ steered).',
  input: input as unknown as z.ZodType<SteerInput>,
  output,
  run,
};

/** the registry's name for this module's operation */
export const operation = steer;
