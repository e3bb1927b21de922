/**
 * layer_ablation (mechbench's protocol): ablate each layer's attention output (hook_attn_out)
 * and MLP output (hook_mlp_out) in turn — zero or mean — and measure the damage at the final
 * position: the change of the clean prediction's log-probability and KL(clean ‖ ablated).
 * All 2 × n_layers variants go through the engine's batch dimension.
 */
import { z } from 'zod';
import { defineOperation } from './types';
import { documentBase, documentHead, interventionList } from '../schema/common';
import {
  Ablator,
  effectFields,
  idsAndAnswer,
  promptOrIdsFields,
  readoutFields,
  targetSites,
  checkVariants,
  type AblationTarget,
} from './lib/ablation';

const LAYER_METHODS = ['zero', 'mean'] as const;
const PARTS = ['attn_out', 'mlp_out'] as const;

export const layerAblationInput = z.object({
  ...promptOrIdsFields,
  method: z
    .enum(LAYER_METHODS)
    .default('zero')
    .describe("zero, or mean (the clean activation averaged over the prompt's positions, BOS included)."),
  answer: z.string().optional().describe('Measure this token (text or "#id") instead of the clean prediction.'),
});
export type LayerAblationInput = z.input<typeof layerAblationInput>;

const entry = z.object({ layer: z.number().int(), component: z.enum(PARTS), label: z.string(), ...effectFields });

export const layerAblationOutput = documentBase('layer_ablation').extend({
  ablation: z.enum(LAYER_METHODS),
  method: z.string().describe('exactly what was done'),
  ...readoutFields,
  entries: z.array(entry).describe('per layer, attn_out then mlp_out'),
  layers: z
    .array(
      z.object({
        layer: z.number().int(),
        attn_logprob_delta: z.number(),
        attn_kl: z.number(),
        mlp_logprob_delta: z.number(),
        mlp_kl: z.number(),
      }),
    )
    .describe('the same numbers as a per-layer table'),
  most_damaging: z
    .object({ layer: z.number().int(), component: z.enum(PARTS), logprob_delta: z.number(), kl: z.number() })
    .describe('the entry with the most negative logprob_delta'),
  interventions: interventionList.describe('one ablation per entry, in the same order'),
});

export const operation = defineOperation({
  name: 'layer_ablation',
  title: 'Layer ablation',
  description:
    "Ablate each layer's attention output and MLP output in turn (zero or mean over positions), " +
    "one at a time, and report at the last position the change of the clean prediction's " +
    'log-probability (nats), logit and probability, KL(clean ‖ ablated), ' +
    'and the new top token. Cost: one clean run plus 2·n_layers variants in batched runs.',
  input: layerAblationInput,
  output: layerAblationOutput,
  long: true,
}).implement(async (model, input, ctx) => {
  const { ids, prompt, answerId } = idsAndAnswer(model, input);
  const L = model.info.n_layers;
  const targets: AblationTarget[] = [];
  for (let l = 0; l < L; l++) for (const c of PARTS) targets.push({ layer: l, component: c });
  checkVariants(targets.length, 'Layer ablation', 'Use a model with fewer layers.');
  const hooks = targets.flatMap((t) => targetSites(model, t).map((s) => s.hook));

  const { ablator } = await Ablator.prepare(
    model,
    ids,
    hooks,
    { method: input.method, positions: 'all', answerId },
    ctx,
  );
  const { answer } = ablator;
  const effects = await ablator.effects(
    targets.map((t) => [t]),
    ctx,
    'ablating layers',
  );
  const entries = targets.map((t, i) => ({
    layer: t.layer,
    component: t.component as (typeof PARTS)[number],
    label: `L${t.layer}.${t.component}`,
    ...effects[i],
  }));
  const layers = [];
  for (let l = 0; l < L; l++) {
    const a = entries[2 * l];
    const m = entries[2 * l + 1];
    layers.push({
      layer: l,
      attn_logprob_delta: a.logprob_delta,
      attn_kl: a.kl,
      mlp_logprob_delta: m.logprob_delta,
      mlp_kl: m.kl,
    });
  }
  const worst = entries.reduce((a, b) => (b.logprob_delta < a.logprob_delta ? b : a));
  return {
    ...documentHead('layer_ablation', model, prompt, ids),
    ablation: input.method,
    method:
      "Each layer's hook_attn_out, then its hook_mlp_out, " +
      `${input.method === 'zero' ? 'set to zero' : "replaced by its mean over the prompt's positions (BOS included)"} ` +
      'at every position, one component per variant (the other components and layers untouched; ' +
      'downstream layers recompute), all variants batched. ' +
      'Damage is read at the last position: logprob_delta of the ' +
      `${answer.source === 'answer' ? 'given answer token' : 'clean prediction'} and KL(clean ‖ ablated) ` +
      'over the vocabulary. Per-head or per-neuron effects are not measured here (see circuit / ablate).',
    answer,
    clean: ablator.cleanBlock(),
    entries,
    layers,
    most_damaging: { layer: worst.layer, component: worst.component, logprob_delta: worst.logprob_delta, kl: worst.kl },
    interventions: ablator.records(targets),
  };
});
