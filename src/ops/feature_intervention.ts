/**
 * feature_intervention — circuit-tracer's feature_intervention (replacement_model_transformerlens.py
 * `_get_feature_intervention_hooks`): set transcoder features at their positions (zero, scale, or a
 * value) and see the new top logits at the last position. The page's attribution-graph view runs it
 * for a feature or a supernode.
 *
 *  errors 'recomputed' (circuit-tracer's default: freeze_attention, no constrained layers):
 *    attention patterns frozen at the clean run, the model's MLPs and norms run; at each intervened
 *    layer the transcoder re-encodes the current input and (value − current activation)·W_dec is
 *    added at the feature-output hook (a CLT feature: at every layer it writes to), so downstream
 *    features and error terms respond.
 *  errors 'frozen' (constrained_layers = every layer): the local replacement model itself, every
 *    pattern, norm scale and MLP output (so every error node) held at the clean run, only the skip
 *    responding; (value − clean activation)·W_dec enters, its direct effect computed exactly.
 */
import { z } from 'zod';
import { defineOperation } from './types';
import { documentBase, documentHead } from '../schema/common';
import { LoupeError } from '../engine/errors';
import { checkTopK } from '../engine/caps';
import { softmax, topK } from './lib/math';
import { inputIds, promptOrIdsFields } from './lib/ablation';
import { inputReplacement, transcoderBlockSchema, transcoderRefFields } from './lib/transcoders';

const change = z
  .object({
    layer: z.number().int().min(0),
    position: z.number().int().min(1).describe('token position (0-based; position 0 has no features)'),
    feature: z.number().int().min(0),
    value: z.number().optional().describe('the activation to set'),
    scale: z
      .number()
      .optional()
      .describe('multiply the clean activation by this (0 zeroes it); default 0 without a value'),
  })
  .refine((c) => c.value === undefined || c.scale === undefined, { message: 'give value or scale, not both' });

export const featureInterventionInput = z.object({
  ...promptOrIdsFields,
  ...transcoderRefFields,
  interventions: z
    .array(change)
    .min(1)
    .max(4096)
    .describe(
      "Active features to change, each by its layer, position and index (as in the attribution graph's node {layer}_{feature}_{position}).",
    ),
  errors: z
    .enum(['recomputed', 'frozen'])
    .default('recomputed')
    .describe(
      "'recomputed': circuit-tracer's default intervention (patterns frozen; MLPs, norms and the " +
        "transcoders' re-encoding respond, so error terms move); 'frozen': the local replacement model (patterns, " +
        'norm scales and every MLP output fixed, so every error node held; the direct effect only).',
    ),
  top_k: z.number().int().min(1).default(10).describe('Logits listed before and after.'),
});

const logitEntry = z.object({ token: z.number().int(), text: z.string(), logit: z.number(), prob: z.number() });

export const featureInterventionOutput = documentBase('feature_intervention').extend({
  method: z.string(),
  transcoders: transcoderBlockSchema,
  errors: z.enum(['recomputed', 'frozen']),
  interventions: z.array(
    z.object({
      layer: z.number().int(),
      position: z.number().int(),
      feature: z.number().int(),
      node_id: z.string().describe("the feature's node id in the attribution graph"),
      clean: z.number().describe('its activation on the clean run'),
      value: z.number().describe('the activation it was set to'),
    }),
  ),
  before: z.array(logitEntry).describe('the top logits of the clean run at the last position'),
  after: z.array(logitEntry).describe('the top logits with the intervention'),
  tokens: z
    .array(z.object({ token: z.number().int(), text: z.string(), prob_before: z.number(), prob_after: z.number() }))
    .describe('every token in either list, with its probability before and after'),
});

export const operation = defineOperation({
  name: 'feature_intervention',
  title: 'Feature intervention',
  description:
    "circuit-tracer's feature intervention through a transcoder set: set active features (layer, position, " +
    "feature: an attribution graph's feature node) to a value or a multiple of their activation, " +
    "and return the top logits at the last position before and after. errors 'recomputed' (circuit-tracer's " +
    'default): attention patterns frozen, MLPs and norms run, each intervened layer re-encoded so downstream ' +
    "features and errors respond; 'frozen': the local replacement model with every error node held, " +
    'the direct effect only. Cost: one forward and the encoders (shared with an attribution graph of the ' +
    "same prompt), then one forward per intervened layer ('recomputed') or one frozen forward ('frozen').",
  input: featureInterventionInput,
  output: featureInterventionOutput,
}).implement(async (model, input, ctx) => {
  checkTopK(input.top_k);
  const { ids, prompt } = inputIds(model, input);
  const { info, rep, block } = await inputReplacement(model, input, ids, ctx);
  const { layer: fl, position: fp, feature: ff, activation: fa } = rep.features;
  const index = new Map<string, number>();
  for (let i = 0; i < fl.length; i++) index.set(`${fl[i]}_${ff[i]}_${fp[i]}`, i);
  const seen = new Set<number>();
  const changes = input.interventions.map((c) => {
    const id = `${c.layer}_${c.feature}_${c.position}`;
    const i = index.get(id);
    if (i === undefined)
      throw new LoupeError(
        'BAD_INPUT',
        `Feature ${c.feature} of layer ${c.layer} is not active at position ${c.position} on this prompt (node ${id}).`,
        "Intervene on active features: the feature nodes of this prompt's attribution graph.",
      );
    if (seen.has(i)) throw new LoupeError('BAD_INPUT', `Node ${id} is listed twice.`, 'List each feature once.');
    seen.add(i);
    return { index: i, value: c.value ?? (c.scale ?? 0) * fa[i], id, c };
  });
  const logits = await rep.intervene(
    changes.map(({ index: i, value }) => ({ index: i, value })),
    { errors: input.errors, signal: ctx.signal },
  );
  const list = (l: Float32Array, p: Float64Array) =>
    topK(p, input.top_k).map((token) => ({ token, text: model.decode([token]), logit: l[token], prob: p[token] }));
  const pb = softmax(rep.lastLogits),
    pa = softmax(logits);
  const before = list(rep.lastLogits, pb),
    after = list(logits, pa);
  const union = [...new Set([...before, ...after].map((e) => e.token))];
  return {
    ...documentHead('feature_intervention', model, prompt, ids),
    method:
      input.errors === 'recomputed'
        ? "circuit-tracer's feature_intervention (freeze_attention): patterns frozen; at each intervened layer, " +
          'in order, (value − the re-encoded activation)·W_dec added at the feature-output hook'
        : "circuit-tracer's feature_intervention with constrained_layers = every layer: " +
          'the frozen local replacement model (patterns, norm scales, MLP outputs and errors fixed); ' +
          "(value − clean activation)·W_dec at the feature-output hooks, its effect on the final norm's output exact",
    transcoders: block,
    errors: input.errors,
    interventions: changes.map(({ index: i, value, id, c }) => ({
      layer: c.layer,
      position: c.position,
      feature: c.feature,
      node_id: id,
      clean: fa[i],
      value: Math.fround(value),
    })),
    before,
    after,
    tokens: union.map((token) => ({
      token,
      text: model.decode([token]),
      prob_before: pb[token],
      prob_after: pa[token],
    })),
  };
});
