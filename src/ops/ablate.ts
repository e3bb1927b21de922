/**
 * ablate (NeuronScope's patch): knock out a head, a neuron, a component or a whole layer — by
 * zero, mean or resample ablation, at all or chosen positions — and report what happened to the
 * clean prediction (logit, log-prob, probability) and what the model predicts instead.
 * Several targets may be listed: each is ablated singly (one batched run) and, when there are
 * several, all of them together too.
 */
import { z } from 'zod';
import { defineOperation } from './types';
import { documentBase, documentHead, interventionList } from '../schema/common';
import { LoupeError } from '../engine/errors';
import { promptIds } from './lib/tokens';
import { checkOneSource, datasetFields, datasetReport, forEachPair, hasDataset } from './lib/dataset';
import { DatasetStats, componentStats, statisticsBlock, statsFields } from './lib/stats';
import type { LoadedModel } from '../engine/api';
import type { OpContext } from './types';
import {
  Ablator,
  COMPONENTS,
  METHODS,
  effectFields,
  inputIds,
  positionsField,
  promptOrIdsFields,
  readoutFields,
  resampleTokens,
  resolveAnswer,
  targetFields,
  targetLabel,
  targetSchema,
  targetSites,
  checkVariants,
  type AblationTarget,
  type Effect,
} from './lib/ablation';

export const ablateInput = z.object({
  ...promptOrIdsFields,
  ...datasetFields,
  ...statsFields,
  layer: z
    .number()
    .int()
    .min(0)
    .optional()
    .describe(
      'Layer of the thing to ablate (with component, head or neuron; alone it ablates the whole layer: attn_out and mlp_out).',
    ),
  component: z
    .enum(COMPONENTS)
    .optional()
    .describe(
      'Component of the layer: resid_pre, resid_mid, resid_post, attn_out, mlp_out, mlp_post (all neurons), or layer (attn_out + mlp_out).',
    ),
  head: z.number().int().min(0).optional().describe('Attention head of the layer (ablates its attn.hook_z slice).'),
  neuron: z.number().int().min(0).optional().describe('MLP neuron of the layer (ablates its mlp.hook_post entry).'),
  expert: z
    .number()
    .int()
    .min(0)
    .optional()
    .describe(
      'Mixture-of-experts models: an expert of the layer (ablates its weighted output, mlp.experts.{e}.hook_out; zero removes it where it was routed).',
    ),
  route: z
    .enum(['forbid', 'force'])
    .optional()
    .describe(
      'With expert: edit its routing instead of its output, whatever the method: forbid adds −1e9 to its ' +
        'router logit (never chosen; the next expert takes its place), force adds +1e4 (chosen with weight ≈ 1, the others ≈ 0).',
    ),
  targets: z
    .array(targetSchema)
    .max(256)
    .optional()
    .describe(
      'More things to ablate, each {layer, component|head|neuron}: each is ablated singly, and all of them (with layer/component/head/neuron above) together.',
    ),
  method: z
    .enum(METHODS)
    .default('zero')
    .describe(
      "zero; mean (over the prompt's positions, or over mean_prompts); resample (the same position of resample_prompt, or of random tokens drawn with seed).",
    ),
  positions: positionsField,
  mean_prompts: z
    .array(z.string())
    .min(1)
    .optional()
    .describe('method=mean: average the activation over every position of these prompts instead of the prompt itself.'),
  resample_prompt: z
    .string()
    .optional()
    .describe(
      'method=resample: take activations from this prompt (at least as long as the prompt; ' +
        'its first T tokens are used). Default: random tokens drawn with seed.',
    ),
  seed: z.number().int().default(0).describe('Seed of the random resample tokens.'),
  answer: z
    .string()
    .optional()
    .describe('Report changes of this token (text or "#id") instead of the clean prediction.'),
});
export type AblateInput = z.input<typeof ablateInput>;

const entrySchema = z.object({
  layer: z.number().int(),
  head: z.number().int().optional(),
  neuron: z.number().int().optional(),
  expert: z.number().int().optional(),
  route: z.enum(['forbid', 'force']).optional(),
  component: z.enum(COMPONENTS).optional(),
  label: z.string(),
  ...effectFields,
});

export const ablateOutput = documentBase('ablate').extend({
  ablation: z.enum(METHODS).describe('the ablation method (input method)'),
  method: z.string().describe('exactly what was done'),
  positions: z.union([z.literal('all'), z.array(z.number().int())]),
  interventions: interventionList.describe('every site edited when all targets are ablated together'),
  ...readoutFields,
  entries: z.array(entrySchema).describe('one per target, each ablated singly'),
  combined: z.object(effectFields).nullable().describe('all targets ablated together (null with one target)'),
  logit_delta: z
    .number()
    .optional()
    .describe('with exactly one target: ablated − clean logit of the answer (the clean prediction by default)'),
  logprob_delta: z.number().optional(),
  prob_delta: z.number().optional(),
  new_predicted_token: z.string().optional(),
  new_predicted_token_id: z.number().int().optional(),
  dataset: datasetReport
    .optional()
    .describe('dataset mode: the pairs (entries and combined then hold mean deltas; the rest is the first pair’s)'),
  statistics: statisticsBlock
    .extend({
      components: z.array(
        componentStats.extend({
          label: z.string().describe('the target (or "combined")'),
          effect: z.enum(['logit_delta', 'logprob_delta', 'prob_delta']),
        }),
      ),
    })
    .optional()
    .describe('dataset mode: per target and effect the mean, per-pair values, bootstrap 95% CI and sign-flip p-value'),
});

function collectTargets(input: z.output<typeof ablateInput>): AblationTarget[] {
  const targets: AblationTarget[] = [];
  if (input.layer !== undefined) {
    targets.push({
      layer: input.layer,
      component: input.component,
      head: input.head,
      neuron: input.neuron,
      expert: input.expert,
      route: input.route,
    });
  } else if ([input.component, input.head, input.neuron, input.expert].some((x) => x !== undefined)) {
    throw new LoupeError(
      'BAD_INPUT',
      'component, head, neuron and expert need a layer.',
      'Add --layer L (JSON: "layer": L).',
    );
  }
  for (const t of input.targets ?? []) targets.push(t);
  if (targets.length === 0)
    throw new LoupeError(
      'BAD_INPUT',
      'Nothing to ablate.',
      'Give a layer (with component, head or neuron), or a list of targets.',
    );
  return targets;
}

export const operation = defineOperation({
  name: 'ablate',
  title: 'Ablate',
  description:
    'Ablate a head (attn.hook_z slice), an MLP neuron (mlp.hook_post), a component (resid_pre/mid/post, ' +
    'attn_out, mlp_out, mlp_post) or a whole layer (attn_out + mlp_out) by zero, mean or resample ' +
    "ablation at all or chosen positions, and report the change of the clean prediction's logit, " +
    'log-probability (nats) and probability at the last position, the KL(clean ‖ ablated), ' +
    'and the new prediction. Several targets: each singly and all together. Cost: one clean run plus ' +
    'one batched run (plus one run per mean prompt / the resample prompt). Dataset mode (dataset, ' +
    'dataset_text or generate): per pair (its clean prompt and answer; resample from its corrupted prompt), ' +
    "with each target's mean deltas, per-pair values, seeded bootstrap 95% CI and sign-flip p-value.",
  input: ablateInput,
  output: ablateOutput,
  long: true,
}).implement((model, input, ctx) =>
  hasDataset(input) ? ablateDataset(model, input, ctx) : ablatePair(model, input, ctx),
);

type AblateParsed = z.output<typeof ablateInput>;
type AblateDoc = z.input<typeof ablateOutput>;

/** one prompt (`resample`: the source tokens, in dataset mode the pair's corrupted prompt) */
async function ablatePair(
  model: LoadedModel,
  input: AblateParsed,
  ctx: OpContext,
  resample?: number[],
): Promise<AblateDoc> {
  const { ids, prompt } = inputIds(model, input);
  const targets = collectTargets(input);
  // validate every target and collect its hooks before any run
  const hooks = targets.flatMap((t) => targetSites(model, t).map((s) => s.hook));
  const variantsCount = targets.length + (targets.length > 1 ? 1 : 0);
  checkVariants(variantsCount, 'This ablation', 'List fewer targets.');
  if (input.mean_prompts && input.method !== 'mean')
    throw new LoupeError(
      'BAD_INPUT',
      'mean_prompts is only used with method "mean".',
      'Set method to "mean" or drop mean_prompts.',
    );
  if (input.resample_prompt !== undefined && input.method !== 'resample')
    throw new LoupeError(
      'BAD_INPUT',
      'resample_prompt is only used with method "resample".',
      'Set method to "resample" or drop resample_prompt.',
    );

  const answerId = resolveAnswer(model, input.answer);
  const meanPrompts =
    input.method === 'mean' && input.mean_prompts
      ? input.mean_prompts.map((p) => promptIds(model, p, { prependBos: input.prepend_bos, field: 'mean_prompts' }))
      : undefined;
  let resampleIds: number[] | undefined;
  let resampleFrom: string | undefined;
  if (input.method === 'resample') {
    const given =
      input.resample_prompt !== undefined
        ? promptIds(model, input.resample_prompt, { prependBos: input.prepend_bos, field: 'resample_prompt' })
        : undefined;
    const r = resample
      ? { ids: resample, from: "pair's corrupted prompt (the same position)" }
      : resampleTokens(model, ids, input.seed, given);
    resampleIds = r.ids;
    resampleFrom = r.from;
  }

  const { ablator } = await Ablator.prepare(
    model,
    ids,
    hooks,
    { method: input.method, positions: input.positions, meanPrompts, resampleIds, resampleFrom, answerId },
    ctx,
  );
  const { answer } = ablator;

  const variants = targets.map((t) => [t]);
  if (targets.length > 1) variants.push(targets);
  const effects = await ablator.effects(variants, ctx, 'ablating');

  const entries = targets.map((t, i) => ({ ...targetFields(t), label: targetLabel(t), ...effects[i] }));
  const combined = targets.length > 1 ? effects[targets.length] : null;
  const single = targets.length === 1 ? effects[0] : undefined;
  const from = ablator.sourceDescription();
  const what =
    input.method === 'zero'
      ? 'set to zero'
      : input.method === 'mean'
        ? `replaced by the ${from}`
        : `replaced by the activation at the ${from}`;
  const method =
    "Each target's site (heads: attn.hook_z of that head; neurons: mlp.hook_post of that neuron; " +
    'components: their hook; a whole layer: hook_attn_out and hook_mlp_out) ' +
    `${what} at ${input.positions === 'all' ? 'every position' : `positions ${input.positions.join(', ')}`}, ` +
    `${targets.length > 1 ? 'each target singly and all together, ' : ''}in one batched forward; ` +
    'effects read at the last position on the ' +
    `${answer.source === 'answer' ? 'given answer token' : 'clean prediction'}. No weights were changed; ` +
    'downstream layers recompute normally (total effect, not direct effect).';

  return {
    ...documentHead('ablate', model, prompt, ids),
    ablation: input.method,
    method,
    positions: input.positions,
    interventions: ablator.records(targets),
    answer,
    clean: ablator.cleanBlock(),
    entries,
    combined,
    ...(single
      ? {
          logit_delta: single.logit_delta,
          logprob_delta: single.logprob_delta,
          prob_delta: single.prob_delta,
          new_predicted_token: single.new_predicted_token,
          new_predicted_token_id: single.new_predicted_token_id,
        }
      : {}),
  };
}

const EFFECTS = ['logit_delta', 'logprob_delta', 'prob_delta'] as const;

/**
 * Dataset mode: ablatePair on every pair's clean prompt, reading the pair's answer (resample
 * takes the pair's corrupted prompt), then per target (and all together) the mean of each delta
 * with its per-pair values, CI and p-value.
 */
async function ablateDataset(model: LoadedModel, input: AblateParsed, ctx: OpContext): Promise<AblateDoc> {
  checkOneSource(input, ['prompt', 'token_ids', 'answer', 'resample_prompt']);
  const { dataset, docs } = await forEachPair(model, input, ctx, (ex, c) =>
    ablatePair(model, { ...input, prompt: '', token_ids: ex.clean, answer: `#${ex.answer}` }, c, ex.corrupted),
  );
  const stats = new DatasetStats(docs.length, input.bootstrap_seed);
  const components: NonNullable<AblateDoc['statistics']>['components'] = [];
  const first = docs[0];
  const meanEffects = <E extends Record<(typeof EFFECTS)[number], number>>(
    label: string,
    at: (d: AblateDoc) => E,
  ): E => {
    const out = { ...at(first) };
    for (const effect of EFFECTS) {
      const st = stats.of(
        docs.map((d) => at(d)[effect]),
        true,
      );
      components.push({ label, effect, ...st });
      out[effect] = st.mean as E[typeof effect];
    }
    return out;
  };
  const entries = first.entries.map((e, i) => meanEffects(e.label, (d) => d.entries[i]));
  const combined = first.combined ? meanEffects('combined', (d) => d.combined!) : null;
  return {
    ...first,
    method:
      `Dataset mode over ${docs.length} pairs (their clean prompts and ` +
      `answers${input.method === 'resample' ? '; resampled from each pair’s corrupted prompt' : ''}): each ablated ` +
      'as the single-pair form does; entries and combined hold the mean logit, log-prob and probability deltas ' +
      '(the other fields are the first pair’s), statistics the per-pair values, bootstrap CI and sign-flip ' +
      `p-value. ${first.method}`,
    entries,
    combined,
    ...(entries.length === 1
      ? {
          logit_delta: entries[0].logit_delta,
          logprob_delta: entries[0].logprob_delta,
          prob_delta: entries[0].prob_delta,
        }
      : {}),
    dataset: dataset.report,
    statistics: stats.table(components),
  };
}
