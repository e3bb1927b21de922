/**
 * `causality` (after openinterp's causality protocol): does a direction d move the target tokens
 * because of what it encodes, or is its effect an artefact? Three checks, each with its numbers,
 * then one verdict from the rule in `VERDICT_RULE`.
 *
 *  1. Random baseline. The edit α·d at blocks.{layer}.hook_resid_pre against N seeded random
 *     directions of the same norm, on the RAW effect (target log-prob Δ at the final prompt
 *     position) and on the CONTROL-NORMALISED effect (target Δ − control Δ): percentile and
 *     z-score of d for both. Why normalise by control tokens: a direction that only sharpens or
 *     flattens the distribution (entropy, temperature, residual norm) moves the target and the
 *     tokens of similar probability together: raw significant, normalised not →
 *     epiphenomenal-softmax. The default
 *     controls are therefore probability-matched (tokens whose base log-prob is nearest the
 *     targets'), not merely likely tokens: a temperature change moves a token by an amount that
 *     depends on its logit, so only controls of similar logit cancel it.
 *  2. Template control. The same edit on control prompts that share the prompt's template but
 *     not its concept (`control_prompts`; or the prompt with the `concept_tokens` replaced; or, by
 *     default, the prompt with every word replaced by another of its own words, keeping its
 *     punctuation, spacing and repetition structure: real words, not letter salad).
 *     edit_ratio = mean effect on the control prompts / effect on the concept prompt.
 *     An additive edit moves its targets on any prompt (that is what steering is), so edit_ratio
 *     alone is ≈ 1 — or above, when the concept prompt already makes the target likely — for a
 *     direction that carries the concept as much as for one that carries the format. What makes
 *     the effect the template's is that the target does not need the concept: concept_gain = the
 *     target's base log-prob on the concept prompt − its mean on the control prompts. Both must
 *     hold: edit_ratio ≥ 0.5 and concept_gain < ln 2 (the concept does not even double the
 *     target's probability).
 *  3. Structural rigidity over the α-sweep: the normalised effect per α, the log-prob of the base
 *     continuation (greedy, unsteered) under each edit, and the repetition of a greedy
 *     continuation generated under each edit; the α range around 0 where the continuation has not
 *     collapsed and the dose-response does not fall. It runs first: without a given α the checks
 *     are made at the largest α of the sweep inside that range (`defaultAlpha`), and a verdict
 *     decided outside it says so.
 *
 * Every variant of one prompt runs as a row of a batched engine run.
 * Targets must be independent of d: when d is not a token direction, the caller names them (a
 * target picked as "the tokens d promotes most" would make d look special by construction).
 */
import { z } from 'zod';
import type { Intervention, LoadedModel } from '../engine/api';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { documentBase, documentHead, interventionRecord } from '../schema/common';
import { defineOperation, type OpContext } from './types';
import { CAPS, finite } from '../engine/caps';
import { logSoftmax, rng } from './lib/math';
import { promptIds } from './lib/tokens';
import { generateBatch } from './lib/generation';
import { parseDirectionSpec, randomVector, unembedCosines, vecNorm } from './lib/directions';
import { vocabFilter } from './lib/vocab';
import {
  evaluateVariants,
  rowsPerRun,
  METRIC_DEFINITIONS,
  metricDefinitionsSchema,
  prepareSteering,
  steeringFields,
  steeringMetrics,
  steeringSiteSchema,
  steerIntervention,
  tokenRef,
  tokenRefs,
  type Variant,
  DEFAULT_MULTIPLES,
  MAX_SWEEP_ALPHAS,
  TRENDS,
  trend,
} from './lib/steering';

/** most random directions one call may evaluate */
export const MAX_RANDOM_DIRECTIONS = 512;
/** fewer random directions than this cannot resolve the 95th percentile */
export const MIN_RANDOM_FOR_VERDICT = 20;
/** most control prompts of the template check */
export const MAX_CONTROL_PROMPTS = 16;
/** percentile at or above which an effect counts as significant against the random baseline */
export const SIGNIFICANT = 95;
/** percentile at or above which a normalised effect counts as weak evidence */
export const WEAK = 80;
/** edit_ratio at or above which the control prompts respond like the concept prompt */
export const TEMPLATE_RATIO = 0.5;
/** concept_gain (nats) below which the target does not need the concept: ln 2, less than a doubling */
export const CONCEPT_GAIN = Math.LN2;
/** a continuation whose tokens repeat more than this much more than the unsteered one has collapsed */
export const REPETITION_RISE = 0.5;

const VERDICTS = [
  'causal',
  'weak-causal',
  'epiphenomenal-softmax',
  'epiphenomenal-template',
  'not_distinguishable',
  'undetermined',
] as const;
export type Verdict = (typeof VERDICTS)[number];

export const VERDICT_RULE =
  `Significant = percentile ≥ ${SIGNIFICANT} among the random directions (percentile = 100 × (#random below + ½ #equal) / N). In order: ` +
  `(1) undetermined: fewer than ${MIN_RANDOM_FOR_VERDICT} random directions, a non-finite effect, all random effects equal, or no control prompt. ` +
  '(2) epiphenomenal-softmax: exactly one of the raw and the control-normalised effect is significant — ' +
  'the target moves only as the whole distribution moves (raw yes, normalised no), ' +
  'or its lead over the controls comes from the controls moving (normalised yes, raw no). ' +
  `(3) epiphenomenal-template: both significant, edit_ratio ≥ ${TEMPLATE_RATIO} (the same edit ` +
  'moves the target on control prompts of the same template at least half as much as on the concept prompt) ' +
  `and concept_gain < ln 2 = ${CONCEPT_GAIN.toFixed(3)} nats (the control prompts, without the concept, ` +
  "make the target about as likely: the effect is on a format token, not a concept's). " +
  '(4) causal: both significant and structural rigidity holds — the tested α lies in the α range around ' +
  '0 where the continuation has not collapsed and the normalised effect never falls, and the normalised ' +
  'effect increases over that range; a verdict decided at an α outside that range says so in its reason. ' +
  `(5) weak-causal: both significant but rigidity fails, or the normalised percentile is in [${WEAK}, ${SIGNIFICANT}). ` +
  `(6) not_distinguishable: otherwise (normalised percentile < ${WEAK}). ` +
  "Collapse at an α: the base continuation's mean log-prob per token under the edit is below −ln(d_vocab) " +
  '(worse than a uniform guess), or the repetition (1 − distinct/generated tokens) ' +
  `of the continuation generated under the edit exceeds the unsteered one's by more than ${REPETITION_RISE}. ` +
  'Why a sixth name, not_distinguishable: the five protocol names describe a direction ' +
  'with an effect (or a failed run); a direction whose effect random directions match is ' +
  'neither undetermined (the protocol did decide) nor weak-causal (there is no evidence).';

const input = z.object({
  ...steeringFields,
  controls: steeringFields.controls.describe(
    'unrelated tokens used to normalise (default: of the 20 tokens whose base log-prob is nearest the ' +
      "targets' mean, the 5 whose unembedding is least aligned with the targets'; never chosen from d)",
  ),
  alpha: z
    .number()
    .optional()
    .describe(
      'α of the comparison (default: alpha_multiple × resid_norm; without either, the largest α of the rigidity sweep inside its stable range)',
    ),
  alpha_multiple: z
    .number()
    .optional()
    .describe(
      "α = alpha_multiple × the layer's mean residual norm when alpha is absent; " +
        'without it the sweep runs in units of resid_norm and α is its largest stable positive value',
    ),
  n_random: z.number().int().min(1).default(64).describe('random directions of equal norm to compare against'),
  seed: z.number().int().default(0).describe('seed of the random directions and of derived control prompts'),
  sweep_multiples: z
    .array(z.number())
    .min(2)
    .default(DEFAULT_MULTIPLES)
    .describe('the rigidity sweep: α × each multiple (0 is added when missing)'),
  control_prompts: z
    .array(z.string().min(1))
    .min(1)
    .max(MAX_CONTROL_PROMPTS)
    .optional()
    .describe(
      'template control: prompts of the same template without the concept (default: derived from the prompt, see concept_tokens)',
    ),
  concept_tokens: z
    .array(z.string().min(1))
    .min(1)
    .max(16)
    .optional()
    .describe(
      'substrings of the prompt that carry the concept; control prompts replace their ' +
        "words with the prompt's other words (default without them: every word of the prompt " +
        'is replaced by another of its words, keeping punctuation, spacing and repetition)',
    ),
  n_control_prompts: z.number().int().min(1).max(MAX_CONTROL_PROMPTS).default(4).describe('derived control prompts'),
  rigidity_tokens: z
    .number()
    .int()
    .min(1)
    .max(64)
    .default(12)
    .describe('length of the base continuation and of each steered continuation in the rigidity check'),
});
export type CausalityInput = z.input<typeof input>;

const stats = z.object({
  effects: z.array(z.number()).describe("each random direction's effect at α"),
  mean: z.number(),
  sd: z.number(),
  max: z.number(),
  value: z.number().describe("d's effect"),
  percentile: z.number().describe("percent of random directions whose effect is below d's (ties count half)"),
  z_score: z.number().nullable(),
  significant: z.boolean(),
});
const promptEffect = z.object({
  prompt: z.string(),
  n_tokens: z.number().int(),
  edit_effect: z.number().describe('normalised effect of adding α·d'),
  target_logprob: z.number().describe('mean over targets of the unsteered log-prob at the final position'),
});

const output = documentBase('causality').extend({
  ...steeringSiteSchema,
  alpha: z.number(),
  alpha_rule: z.string().describe('how α was chosen'),
  targets: z.array(tokenRef),
  controls: z.array(tokenRef),
  targets_rule: z.string(),
  controls_rule: z.string(),
  effect: z.object({
    target_logprob_delta: z.number(),
    control_logprob_delta: z.number(),
    normalized_effect: z.number(),
    kl_from_base: z.number(),
  }),
  random_baseline: z.object({
    n: z.number().int(),
    seed: z.number().int(),
    norm: z.number().describe('norm of every random direction (equal to the applied norm of d)'),
    raw: stats.describe('raw effect: target_logprob_delta'),
    normalized: stats.describe('control-normalised effect: normalized_effect'),
  }),
  control_normalization: z.object({
    targets: z.array(tokenRef.extend({ base_logprob: z.number(), delta: z.number() })),
    controls: z.array(tokenRef.extend({ base_logprob: z.number(), delta: z.number() })),
    target_logprob_delta: z.number(),
    control_logprob_delta: z.number(),
    normalized_effect: z.number(),
    raw_significant: z.boolean(),
    normalized_significant: z.boolean(),
    softmax_epiphenomenon: z.boolean().describe('exactly one of the raw and the normalised effect is significant'),
    reason: z.string(),
  }),
  template_control: z.object({
    source: z.enum(['given', 'concept_tokens', 'neutral']),
    concept_tokens: z.array(z.string()),
    concept: promptEffect,
    prompts: z.array(promptEffect),
    edit_ratio: z
      .number()
      .nullable()
      .describe(
        "mean edit_effect on control prompts / edit_effect on the concept prompt; null when the concept prompt's effect is 0",
      ),
    concept_gain: z
      .number()
      .describe('target base log-prob on the concept prompt − its mean on the control prompts (nats)'),
    concept_gain_threshold: z.number(),
    threshold: z.number(),
    template_epiphenomenon: z.boolean(),
    reason: z.string(),
  }),
  structural_rigidity: z.object({
    multiples: z.array(z.number()),
    alphas: z.array(z.number()),
    normalized_effect: z.array(z.number()),
    target_logprob_delta: z.array(z.number()),
    base_text_logprob: z
      .array(z.number())
      .describe('mean log-prob per token of the base (unsteered, greedy) continuation under each edit'),
    repetition: z
      .array(z.number())
      .describe('1 − distinct/generated tokens of the greedy continuation generated under each edit'),
    collapsed: z.array(z.boolean()),
    base_continuation: z.object({ token_ids: z.array(z.number().int()), text: z.string() }),
    steered_continuations: z.array(z.string()),
    collapse_logprob: z.number().describe('−ln(d_vocab): the uniform guess'),
    alpha_range: z
      .tuple([z.number(), z.number()])
      .nullable()
      .describe('α range around 0 where no collapse and the normalised effect never falls'),
    trend: z.enum(TRENDS).describe('trend of the normalised effect over alpha_range'),
    alpha_in_range: z.boolean(),
    holds: z.boolean(),
    reason: z.string(),
  }),
  verdict: z.enum(VERDICTS),
  verdict_reason: z.string(),
  verdict_rule: z.string(),
  deciding: z
    .object({
      raw_percentile: z.number(),
      normalized_percentile: z.number(),
      edit_ratio: z.number().nullable(),
      concept_gain: z.number(),
      rigidity_holds: z.boolean(),
    })
    .describe('the numbers the rule read'),
  interventions: z.array(interventionRecord),
  metric_definitions: metricDefinitionsSchema,
  engine_runs: z.number().int(),
});

export interface VerdictInputs {
  n: number;
  finite: boolean;
  degenerate: boolean;
  controlPrompts: number;
  rawPercentile: number;
  normalizedPercentile: number;
  editRatio: number | null;
  conceptGain: number;
  rigidityHolds: boolean;
}

/** the rule of VERDICT_RULE, from its numbers */
export function decideVerdict(p: VerdictInputs): { verdict: Verdict; reason: string } {
  if (p.n < MIN_RANDOM_FOR_VERDICT)
    return { verdict: 'undetermined', reason: `only ${p.n} random directions (need ≥ ${MIN_RANDOM_FOR_VERDICT})` };
  if (!p.finite) return { verdict: 'undetermined', reason: 'an effect was not finite' };
  if (p.degenerate) return { verdict: 'undetermined', reason: 'every random direction had the same effect' };
  if (p.controlPrompts < 1) return { verdict: 'undetermined', reason: 'no control prompt for the template check' };
  const r = p.rawPercentile;
  const n = p.normalizedPercentile;
  const rs = r >= SIGNIFICANT;
  const ns = n >= SIGNIFICANT;
  const pc = (x: number) => x.toFixed(1);
  if (rs && !ns)
    return {
      verdict: 'epiphenomenal-softmax',
      reason:
        `raw effect significant (percentile ${pc(r)} ≥ ${SIGNIFICANT}) ` +
        `but the control-normalised effect is not (${pc(n)}): the controls move with the target`,
    };
  if (ns && !rs)
    return {
      verdict: 'epiphenomenal-softmax',
      reason:
        `control-normalised effect significant (percentile ${pc(n)}) but the raw effect is not ` +
        `(${pc(r)} < ${SIGNIFICANT}): the lead over the controls comes from the controls moving`,
    };
  if (rs && ns) {
    const er = p.editRatio === null ? 'n/a' : p.editRatio.toFixed(2);
    if (p.editRatio !== null && p.editRatio >= TEMPLATE_RATIO && p.conceptGain < CONCEPT_GAIN) {
      return {
        verdict: 'epiphenomenal-template',
        reason:
          `raw and normalised effects significant (${pc(r)}, ${pc(n)}), but the edit moves the target ` +
          `on control prompts of the same template ${er} × as much (≥ ${TEMPLATE_RATIO}) ` +
          `and the concept raises the target's base log-prob by only ${p.conceptGain.toFixed(2)} nats (< ln 2)`,
      };
    }
    const tmpl = `template control passed (edit ratio ${er}, concept gain ${p.conceptGain.toFixed(2)} nats)`;
    if (p.rigidityHolds)
      return {
        verdict: 'causal',
        reason:
          `raw and normalised percentiles ${pc(r)}, ${pc(n)} ≥ ${SIGNIFICANT}, ${tmpl}, ` +
          'and the dose-response is monotone over a stable α range that contains α',
      };
    return {
      verdict: 'weak-causal',
      reason: `raw and normalised percentiles ${pc(r)}, ${pc(n)} ≥ ${SIGNIFICANT} and ${tmpl}, but structural rigidity fails`,
    };
  }
  if (n >= WEAK)
    return { verdict: 'weak-causal', reason: `normalised percentile ${pc(n)} is in [${WEAK}, ${SIGNIFICANT})` };
  return {
    verdict: 'not_distinguishable',
    reason: `normalised percentile ${pc(n)} < ${WEAK}: random directions of equal norm do as much`,
  };
}

function statsOf(value: number, effects: number[]): z.infer<typeof stats> {
  const n = effects.length;
  const below = effects.filter((r) => r < value).length;
  const equal = effects.filter((r) => r === value).length;
  const percentile = (100 * (below + 0.5 * equal)) / n;
  const mean = effects.reduce((a, b) => a + b, 0) / n;
  const sd = Math.sqrt(effects.reduce((a, b) => a + (b - mean) ** 2, 0) / Math.max(1, n - 1));
  const safe = (x: number) => (Number.isFinite(x) ? x : 0);
  return {
    effects: effects.map(safe),
    mean: safe(mean),
    sd: safe(sd),
    max: safe(Math.max(...effects)),
    value: safe(value),
    percentile,
    z_score: sd > 0 && Number.isFinite(value) ? (value - mean) / sd : null,
    significant: percentile >= SIGNIFICANT,
  };
}

// ------------------------------------------------------------------ controls and control prompts

const CONTROL_POOL = 20;
const N_CONTROLS = 5;

/** probability-matched controls (see the module note), least aligned with the targets' unembedding */
async function matchedControls(
  model: LoadedModel,
  base: Float64Array,
  targets: number[],
  exclude: number[],
  keep: (id: number) => boolean,
  signal?: AbortSignal,
): Promise<number[]> {
  const V = model.info.d_vocab;
  const skip = new Set([...targets, ...exclude]);
  const mean = targets.reduce((a, t) => a + base[t], 0) / targets.length;
  const pool = Array.from({ length: V }, (_, i) => i)
    .filter((i) => !skip.has(i) && keep(i) && Number.isFinite(base[i]))
    .sort((a, b) => Math.abs(base[a] - mean) - Math.abs(base[b] - mean) || a - b)
    .slice(0, CONTROL_POOL);
  const cos = await unembedCosines(model, targets, pool, signal);
  return pool
    .map((id, k) => ({ id, c: Math.abs(cos[k]) }))
    .sort((a, b) => a.c - b.c || a.id - b.id)
    .slice(0, N_CONTROLS)
    .map((x) => x.id);
}

/**
 * Control prompts of the same template, made of the prompt's own words: every distinct word (run
 * of letters) of the concept spans — or, without them, every word the prompt uses once (a word it
 * repeats is the template's skeleton, as "the" in "the cat, the dog,", and stays) — is replaced by
 * another word of the prompt, the same word by the same replacement within one control,
 * punctuation and spacing kept, a capital kept a capital. Without concept spans each control is a
 * seeded cyclic permutation of those words (no word keeps its place); concept words are replaced by
 * the prompt's words outside the spans (when there are none, by a permutation of the concept words).
 */
export function deriveControlPrompts(
  _model: LoadedModel,
  prompt: string,
  concepts: string[] | undefined,
  n: number,
  seed: number,
): string[] {
  for (const c of concepts ?? []) {
    if (!prompt.includes(c))
      throw new LoupeError(
        'BAD_INPUT',
        `concept_tokens: ${JSON.stringify(c)} does not occur in the prompt.`,
        'Mark substrings of the prompt (e.g. a word with its leading space).',
      );
  }
  const list = (t: string) => (t.match(/[A-Za-z]+/g) ?? []).map((w) => w.toLowerCase());
  const all = [...new Set(list(prompt))];
  const once = all.filter((w) => list(prompt).filter((x) => x === w).length === 1);
  const replaced = concepts?.length ? [...new Set(list(concepts.join(' ')))] : once.length >= 2 ? once : all;
  const others = concepts?.length ? all.filter((w) => !replaced.includes(w)) : [];
  const pool = others.length ? others : replaced;
  if (pool.length < 2 && !others.length)
    throw new LoupeError(
      'BAD_INPUT',
      `The ${concepts?.length ? 'concept spans have' : 'prompt has'} fewer than two distinct words to build control prompts from.`,
      'Give control_prompts (prompts of the same template without the concept), or a longer prompt.',
    );
  const u = rng(seed + 7919);
  const shaped = (w: string, like: string) =>
    like[0] === like[0].toUpperCase() && like[0] !== like[0].toLowerCase() ? w[0].toUpperCase() + w.slice(1) : w;
  const out: string[] = [];
  // distinct controls while the prompt's words allow (a few draws each), then repeats
  for (let tries = 0; out.length < n; tries++) {
    const map = new Map<string, string>();
    if (pool === replaced) {
      // Sattolo: a uniformly random cyclic permutation, so no word maps to itself
      const p = replaced.slice();
      for (let i = p.length - 1; i > 0; i--) {
        const j = Math.floor(u() * i);
        [p[i], p[j]] = [p[j], p[i]];
      }
      replaced.forEach((w, i) => map.set(w, p[i]));
    } else {
      for (const w of replaced) map.set(w, pool[Math.floor(u() * pool.length)]);
    }
    const words = (t: string) => t.replace(/[A-Za-z]+/g, (w) => shaped(map.get(w.toLowerCase()) ?? w, w));
    let p = prompt;
    if (concepts?.length) for (const c of concepts) p = p.split(c).join(words(c));
    else p = words(prompt);
    if (!out.includes(p) || tries >= 8 * n) out.push(p);
  }
  return out;
}

// ------------------------------------------------------------------ the operation

function clean(e: z.infer<typeof promptEffect>): z.infer<typeof promptEffect> {
  const s = (x: number) => (Number.isFinite(x) ? x : 0);
  return { ...e, edit_effect: s(e.edit_effect), target_logprob: s(e.target_logprob) };
}

/** One prompt of the template check: one run of two rows — row 0 unsteered, row 1 with α·d added. */
async function templateEffects(
  model: LoadedModel,
  ids: number[],
  hook: string,
  positions: 'all' | number[],
  vector: ArrayLike<number>,
  alpha: number,
  targets: number[],
  controls: number[],
  ctx: OpContext,
): Promise<{ edit_effect: number; target_logprob: number }> {
  const T = ids.length;
  const V = model.info.d_vocab;
  const iv = steerIntervention(hook, vector, alpha, positions, [1]);
  const res = await model.run(ids, { interventions: [iv], batch: 2, logitPositions: [T - 1], signal: ctx.signal });
  const baseLp = logSoftmax(res.logits.data, 0, V);
  const edit = steeringMetrics(baseLp, logSoftmax(res.logits.data, V, V), targets, controls);
  return {
    edit_effect: edit.normalized_effect,
    target_logprob: targets.reduce((a, t) => a + baseLp[t], 0) / targets.length,
  };
}

/**
 * The rigidity sweep: every α is a row. One batched run over prompt + base continuation gives the
 * normalised effect at the final prompt position and the base continuation's log-prob under the
 * edit; one batched greedy generation under the edits gives the repetition.
 */
async function rigidity(
  model: LoadedModel,
  ids: number[],
  hook: string,
  positions: 'all' | number[],
  vector: ArrayLike<number>,
  alphasIn: number[],
  k: number,
  baseLp: Float64Array,
  targets: number[],
  controls: number[],
  ctx: OpContext,
) {
  const V = model.info.d_vocab;
  const T = ids.length;
  const alphas = [...alphasIn].sort((a, b) => a - b);
  let runs = 0;
  ctx.onProgress?.({ stage: 'rigidity: base continuation', done: 0, total: alphas.length });
  const baseGen = await generateBatch(model, ids, 1, { maxNewTokens: k, stopAtEos: false, signal: ctx.signal });
  runs += baseGen.runs;
  const cont = baseGen.rows[0].ids;
  const full = [...ids, ...cont];
  const L = full.length;
  const per = Math.min(rowsPerRun(model, L), CAPS.maxBatch);
  const normalized: number[] = [];
  const targetDelta: number[] = [];
  const textLp: number[] = [];
  const repetition: number[] = [];
  const steeredText: string[] = [];
  const distinct = (xs: number[]) => (xs.length ? 1 - new Set(xs).size / xs.length : 0);
  for (let s = 0; s < alphas.length; s += per) {
    throwIfAborted(ctx.signal);
    const chunk = alphas.slice(s, s + per);
    const ivs = chunk.map((a, r) => steerIntervention(hook, vector, a, positions, chunk.length > 1 ? [r] : undefined));
    const res = await model.run(full, {
      interventions: ivs,
      batch: chunk.length > 1 ? chunk.length : undefined,
      logitPositions: Array.from({ length: k + 1 }, (_, j) => T - 1 + j).filter((p) => p < L),
      signal: ctx.signal,
    });
    runs++;
    const P = Math.min(k + 1, L - T + 1);
    for (let r = 0; r < chunk.length; r++) {
      const first = logSoftmax(res.logits.data, r * P * V, V);
      const m = steeringMetrics(baseLp, first, targets, controls);
      normalized.push(m.normalized_effect);
      targetDelta.push(m.target_logprob_delta);
      let lp = 0;
      for (let j = 0; j < cont.length; j++) lp += logSoftmax(res.logits.data, (r * P + j) * V, V)[cont[j]];
      textLp.push(cont.length ? lp / cont.length : 0);
    }
    const gen = await generateBatch(model, ids, chunk.length, {
      maxNewTokens: k,
      stopAtEos: false,
      interventions: ivs,
      signal: ctx.signal,
    });
    runs += gen.runs;
    for (const row of gen.rows) {
      repetition.push(distinct(row.ids));
      steeredText.push(row.text);
    }
    ctx.onProgress?.({ stage: 'rigidity sweep', done: Math.min(s + per, alphas.length), total: alphas.length });
  }
  const baseRep = distinct(cont);
  const floor = -Math.log(V);
  const collapsed = alphas.map((_, i) => textLp[i] < floor || repetition[i] - baseRep > REPETITION_RISE);
  // grow the range from α = 0 while no collapse and the normalised effect does not fall
  const tol = (i: number, j: number) => 1e-6 * Math.max(1, Math.abs(normalized[i]), Math.abs(normalized[j]));
  const z = alphas.indexOf(0);
  let lo = z;
  let hi = z;
  if (!collapsed[z]) {
    while (lo > 0 && !collapsed[lo - 1] && normalized[lo] - normalized[lo - 1] >= -tol(lo, lo - 1)) lo--;
    while (hi < alphas.length - 1 && !collapsed[hi + 1] && normalized[hi + 1] - normalized[hi] >= -tol(hi, hi + 1))
      hi++;
  }
  const range: [number, number] | null = collapsed[z] ? null : [alphas[lo], alphas[hi]];
  const tr = range ? trend(alphas.slice(lo, hi + 1), normalized.slice(lo, hi + 1)) : 'flat';
  return {
    alphas,
    normalized_effect: normalized,
    target_logprob_delta: targetDelta,
    base_text_logprob: textLp,
    repetition,
    collapsed,
    base_continuation: { token_ids: cont, text: baseGen.rows[0].text },
    steered_continuations: steeredText,
    range,
    lo,
    hi,
    trend: tr,
    runs,
  };
}
type Sweep = Awaited<ReturnType<typeof rigidity>>;

/**
 * The α of the comparison when neither alpha nor alpha_multiple is given: the largest positive α of
 * the rigidity sweep inside its stable range, so that the verdict is read where the edit holds; when
 * no positive α of the sweep is stable, 1 × resid_norm, and the rule says that it lies outside.
 */
export function defaultAlpha(alphas: number[], range: [number, number] | null, residNorm: number) {
  const stable = range ? alphas.filter((a) => a > 0 && a >= range[0] && a <= range[1]) : [];
  if (stable.length) {
    const a = Math.max(...stable);
    return {
      alpha: a,
      rule:
        `the largest α of the rigidity sweep inside its stable range [${range![0].toPrecision(3)}, ` +
        `${range![1].toPrecision(3)}]: ${(a / residNorm).toPrecision(3)} × resid_norm (neither alpha nor ` +
        'alpha_multiple given)',
    };
  }
  return {
    alpha: residNorm,
    rule:
      '1 × resid_norm: no positive α of the rigidity sweep is stable ' +
      `(${range ? `stable range [${range[0].toPrecision(3)}, ${range[1].toPrecision(3)}]` : 'the continuation collapses even without the edit'}), ` +
      'so the comparison is made outside it',
  };
}

/** whether the tested α lies in the sweep's stable range, and whether rigidity holds there */
function judgeRigidity(sw: Sweep, alpha: number) {
  const { range, alphas, collapsed, lo, hi } = sw;
  const alphaInRange = range !== null && alpha >= range[0] && alpha <= range[1];
  const holds = alphaInRange && sw.trend === 'increasing';
  // what ends the range on the tested α's side: a collapse, or a fall of the normalised effect
  const edge = alpha > (range?.[1] ?? 0) ? hi + 1 : lo - 1;
  const why =
    edge >= 0 && edge < alphas.length
      ? collapsed[edge]
        ? `the continuation collapses at α = ${alphas[edge].toPrecision(3)}`
        : `the normalised effect falls at α = ${alphas[edge].toPrecision(3)}`
      : 'the sweep ends';
  const reason = !range
    ? 'the continuation collapses even without the edit'
    : !alphaInRange
      ? `α = ${alpha.toPrecision(3)} is outside the stable range [${range[0].toPrecision(3)}, ${range[1].toPrecision(3)}]: ${why}`
      : sw.trend !== 'increasing'
        ? `the normalised effect is ${sw.trend} over the stable range [${range[0].toPrecision(3)}, ${range[1].toPrecision(3)}]`
        : `the normalised effect increases over [${range[0].toPrecision(3)}, ` +
          `${range[1].toPrecision(3)}] with no collapse, and α = ${alpha.toPrecision(3)} lies inside`;
  return { alphaInRange, holds, reason };
}

export const operation = defineOperation({
  name: 'causality',
  title: 'Causality',
  description:
    'Causality protocol (after openinterp) for a steering direction d at blocks.{layer}.hook_resid_pre, in three checks with their numbers: ' +
    "(1) random baseline — d's raw effect (target log-prob Δ at the final prompt position) " +
    'and control-normalised effect (target Δ − control Δ, probability-matched controls) ' +
    'against N seeded random directions of equal norm: percentiles and z-scores; ' +
    '(2) template control — the same direction on control prompts of the same template ' +
    'without the concept (given, derived by replacing concept_tokens, or neutral): ' +
    "the ratio of the edit's effects and how much the concept raises the target's base log-prob; " +
    '(3) structural rigidity — over an α-sweep, the normalised effect, ' +
    "the base continuation's log-prob and the repetition of a steered continuation, " +
    'and the α range where the continuation holds and the dose-response is monotone. ' +
    'Verdict: causal / weak-causal / epiphenomenal-softmax / epiphenomenal-template / not_distinguishable ' +
    '/ undetermined, by the rule in `verdict_rule`, with the deciding numbers in `deciding`. ' +
    `Non-token directions need explicit targets. Caps: ${MAX_RANDOM_DIRECTIONS} random directions, ` +
    `${MAX_SWEEP_ALPHAS} sweep values, ${MAX_CONTROL_PROMPTS} control prompts.`,
  input,
  output,
  long: true,
}).implement(async (model, inp, ctx) => {
  // caps and the targets requirement before any engine run
  if (inp.n_random > MAX_RANDOM_DIRECTIONS) {
    throw new LoupeError(
      'TOO_LARGE',
      `n_random = ${inp.n_random} exceeds the cap of ${MAX_RANDOM_DIRECTIONS}.`,
      `Use at most ${MAX_RANDOM_DIRECTIONS} random directions.`,
    );
  }
  const multiples = inp.sweep_multiples.includes(0) ? inp.sweep_multiples : [...inp.sweep_multiples, 0];
  if (multiples.length > MAX_SWEEP_ALPHAS) {
    throw new LoupeError('TOO_LARGE', `${multiples.length} sweep values exceed the cap of ${MAX_SWEEP_ALPHAS}.`);
  }
  if (parseDirectionSpec(inp.direction).kind !== 'tokens' && !inp.targets) {
    throw new LoupeError(
      'BAD_INPUT',
      'causality needs `targets` for a direction that is not made of tokens.',
      'Name the tokens the direction should promote (e.g. ["#432"] or [" happy"]); ' +
        'targets chosen from the direction itself would make it look special by construction.',
    );
  }
  const controlPrompts =
    inp.control_prompts ?? deriveControlPrompts(model, inp.prompt, inp.concept_tokens, inp.n_control_prompts, inp.seed);
  const controlIds = controlPrompts.map((p) =>
    promptIds(model, p, { prependBos: inp.prepend_bos, field: 'control prompt' }),
  );
  if (inp.positions !== 'all') {
    const bad = controlIds.findIndex((c) => (inp.positions as number[]).some((p) => p >= c.length));
    if (bad >= 0)
      throw new LoupeError(
        'BAD_INPUT',
        `control prompt ${bad} (${controlIds[bad].length} tokens) is shorter than the edited positions.`,
        'Use positions "all", or control prompts at least as long.',
      );
  }
  let runs = 0;
  ctx.onProgress?.({ stage: 'base run', done: 0, total: 1 });
  const setup = await prepareSteering(model, inp, ctx, inp.rigidity_tokens);
  runs++;
  const { ids, hook, dir } = setup;
  const targets = setup.targets;
  const given = !!inp.controls;
  const vocab = given ? null : await vocabFilter(model, ctx.signal);
  const controls = given
    ? setup.controls
    : await matchedControls(
        model,
        setup.baseLogprobs,
        targets,
        [...dir.negative_ids, ...[model.bosTokenId, model.eosTokenId].filter((x): x is number => x !== undefined)],
        vocab!.usable,
        ctx.signal,
      );
  const controlsRule = given
    ? 'given'
    : `of the ${CONTROL_POOL} tokens whose base log-prob is nearest the targets' mean (targets, ` +
      `negatives, BOS, EOS excluded), the ${N_CONTROLS} whose unembedding W_U[:, c] is least aligned ` +
      "(smallest |cosine|) with the targets' mean unembedding; probability-matched so that a " +
      `change of temperature moves them as it moves the targets; independent of d; ${vocab!.rule}`;
  const norm = vecNorm(dir.vector);
  const V = model.info.d_vocab;

  // 4 first: the structural-rigidity sweep, in units of the given α (or alpha_multiple × resid_norm,
  // else resid_norm); without either, the tested α is chosen inside the range it finds stable
  const unit = inp.alpha ?? (inp.alpha_multiple ?? 1) * setup.residNorm;
  const sweep = await rigidity(
    model,
    ids,
    hook,
    inp.positions,
    dir.vector,
    multiples.map((m) => m * unit),
    inp.rigidity_tokens,
    setup.baseLogprobs,
    targets,
    controls,
    ctx,
  );
  runs += sweep.runs;
  const chosen =
    inp.alpha !== undefined
      ? { alpha: inp.alpha, rule: 'given (alpha)' }
      : inp.alpha_multiple !== undefined
        ? { alpha: unit, rule: `alpha_multiple ${inp.alpha_multiple} × resid_norm` }
        : defaultAlpha(sweep.alphas, sweep.range, setup.residNorm);
  const alpha = chosen.alpha;
  const rig = { ...sweep, ...judgeRigidity(sweep, alpha) };

  // 1–2. d and the random directions at α, final position
  const seeds = rng(inp.seed);
  const randoms: Variant[] = [];
  for (let i = 0; i < inp.n_random; i++) {
    const v = randomVector(model.info.d_model, Math.floor(seeds() * 2 ** 31));
    const s = norm / vecNorm(v);
    for (let j = 0; j < v.length; j++) v[j] *= s;
    randoms.push({ vector: v, alpha });
  }
  const variants: Variant[] = [{ vector: dir.vector, alpha }, ...randoms];
  const lps = await evaluateVariants(model, ids, hook, inp.positions, variants, ctx, 'measuring directions');
  runs += Math.ceil(variants.length / rowsPerRun(model, ids.length));
  const metric = (lp: Float64Array) => steeringMetrics(setup.baseLogprobs, lp, targets, controls);
  const main = metric(lps[0]);
  const rm = lps.slice(1).map(metric);
  const rawStats = statsOf(
    main.target_logprob_delta,
    rm.map((m) => m.target_logprob_delta),
  );
  const nrm = statsOf(
    main.normalized_effect,
    rm.map((m) => m.normalized_effect),
  );
  const softmax = rawStats.significant !== nrm.significant;

  // 3. template control
  const prompts = [inp.prompt, ...controlPrompts];
  const allIds = [ids, ...controlIds];
  const effects: z.infer<typeof promptEffect>[] = [];
  for (let k = 0; k < prompts.length; k++) {
    throwIfAborted(ctx.signal);
    const pe = await templateEffects(model, allIds[k], hook, inp.positions, dir.vector, alpha, targets, controls, ctx);
    runs++;
    effects.push({ prompt: prompts[k], n_tokens: allIds[k].length, ...pe });
    ctx.onProgress?.({ stage: 'template control', done: k + 1, total: prompts.length });
  }
  const [concept, ...others] = effects;
  const meanOf = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(xs.length, 1);
  const editRatio =
    Math.abs(concept.edit_effect) > 1e-9 ? meanOf(others.map((o) => o.edit_effect)) / concept.edit_effect : null;
  const safeRatio = editRatio !== null && Number.isFinite(editRatio) ? editRatio : null;
  const conceptGain = concept.target_logprob - meanOf(others.map((o) => o.target_logprob));
  const template = editRatio !== null && editRatio >= TEMPLATE_RATIO && conceptGain < CONCEPT_GAIN;

  const allFinite = [
    main.normalized_effect,
    main.target_logprob_delta,
    ...rm.map((m) => m.normalized_effect),
    ...rm.map((m) => m.target_logprob_delta),
    ...rig.normalized_effect,
  ].every(Number.isFinite);
  const degenerate = rm.every((m) => m.normalized_effect === rm[0].normalized_effect);
  const { verdict, reason } = decideVerdict({
    n: randoms.length,
    finite: allFinite,
    degenerate,
    controlPrompts: others.length,
    rawPercentile: rawStats.percentile,
    normalizedPercentile: nrm.percentile,
    editRatio: safeRatio,
    conceptGain,
    rigidityHolds: rig.holds,
  });
  // a verdict read where the edit does not hold says so
  const outside =
    !rig.alphaInRange && rig.range
      ? `; decided at α = ${alpha.toPrecision(3)}, outside the stable range ` +
        `[${rig.range[0].toPrecision(3)}, ${rig.range[1].toPrecision(3)}] of the rigidity sweep`
      : '';
  const safe = (x: number) => (Number.isFinite(x) ? x : 0);
  const deltas = (list: number[]) =>
    tokenRefs(model, list).map((r) => ({
      ...r,
      base_logprob: finite(setup.baseLogprobs[r.token_id]),
      delta: safe(lps[0][r.token_id] - setup.baseLogprobs[r.token_id]),
    }));
  const pc = (x: number) => x.toFixed(1);

  return {
    ...documentHead('causality', model, inp.prompt, ids),
    ...setup.site,
    alpha,
    alpha_rule: chosen.rule,
    targets: tokenRefs(model, targets),
    controls: tokenRefs(model, controls),
    targets_rule: setup.targetsRule,
    controls_rule: controlsRule,
    effect: {
      target_logprob_delta: safe(main.target_logprob_delta),
      control_logprob_delta: safe(main.control_logprob_delta),
      normalized_effect: safe(main.normalized_effect),
      kl_from_base: safe(main.kl_from_base),
    },
    random_baseline: { n: randoms.length, seed: inp.seed, norm, raw: rawStats, normalized: nrm },
    control_normalization: {
      targets: deltas(targets),
      controls: deltas(controls),
      target_logprob_delta: safe(main.target_logprob_delta),
      control_logprob_delta: safe(main.control_logprob_delta),
      normalized_effect: safe(main.normalized_effect),
      raw_significant: rawStats.significant,
      normalized_significant: nrm.significant,
      softmax_epiphenomenon: softmax,
      reason: softmax
        ? `raw percentile ${pc(rawStats.percentile)} and normalised percentile ${pc(nrm.percentile)} disagree about significance (≥ ${SIGNIFICANT})`
        : `raw percentile ${pc(rawStats.percentile)} and normalised percentile ${pc(nrm.percentile)} ` +
          `agree (${rawStats.significant ? 'both' : 'neither'} ≥ ${SIGNIFICANT})`,
    },
    template_control: {
      source: inp.control_prompts ? 'given' : inp.concept_tokens ? 'concept_tokens' : 'neutral',
      concept_tokens: inp.concept_tokens ?? [],
      concept: clean(concept),
      prompts: others.map(clean),
      edit_ratio: safeRatio,
      concept_gain: finite(conceptGain),
      concept_gain_threshold: CONCEPT_GAIN,
      threshold: TEMPLATE_RATIO,
      template_epiphenomenon: template,
      reason:
        `edit effect ${concept.edit_effect.toFixed(3)} nats on the concept prompt, ` +
        `mean ${meanOf(others.map((o) => o.edit_effect)).toFixed(3)} on ${others.length} control prompts (ratio ` +
        `${safeRatio === null ? 'n/a' : safeRatio.toFixed(2)}); target base log-prob ` +
        `${concept.target_logprob.toFixed(2)} with the concept, ` +
        `mean ${meanOf(others.map((o) => o.target_logprob)).toFixed(2)} without (gain ${conceptGain.toFixed(2)} ` +
        `nats) → ${template ? "the effect is the template's" : 'not a template effect'}`,
    },
    structural_rigidity: {
      multiples,
      alphas: rig.alphas,
      normalized_effect: rig.normalized_effect.map(safe),
      target_logprob_delta: rig.target_logprob_delta.map(safe),
      base_text_logprob: rig.base_text_logprob.map(safe),
      repetition: rig.repetition,
      collapsed: rig.collapsed,
      base_continuation: rig.base_continuation,
      steered_continuations: rig.steered_continuations,
      collapse_logprob: -Math.log(V),
      alpha_range: rig.range,
      trend: rig.trend,
      alpha_in_range: rig.alphaInRange,
      holds: rig.holds,
      reason: rig.reason,
    },
    verdict,
    verdict_reason: reason + outside,
    verdict_rule: VERDICT_RULE,
    deciding: {
      raw_percentile: rawStats.percentile,
      normalized_percentile: nrm.percentile,
      edit_ratio: safeRatio,
      concept_gain: finite(conceptGain),
      rigidity_holds: rig.holds,
    },
    interventions: [
      { hook, op: 'add', positions: inp.positions, alpha, direction: dir.spec, normalize: inp.normalize },
    ],
    metric_definitions: METRIC_DEFINITIONS,
    engine_runs: runs,
  };
});
