/**
 * `feature`: one SAE feature's card — the tokens its decoder direction promotes and suppresses
 * through the unembedding, and how strongly it fires over a set of prompts.
 *
 * Logit weights (Neuronpedia's "top/bottom logits"): W_dec[f] is mapped into the residual stream
 * (lib/sae.ts residualMap: identity, W_O or W_out), centred over d_model for LayerNorm models,
 * multiplied by the final norm's weight w_lnf, then by W_U. No norm scale is applied (the value is
 * per unit of activation and position-independent) and no bias is added; so the numbers rank
 * tokens, they are not logits of a particular run.
 *
 * Activations: one run per prompt with the SAE spliced in; the feature's activation at every
 * token, its maximum per prompt and overall.
 */
import { z } from 'zod';
import type { LoadedModel } from '../engine/api';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { documentBase, documentHead, tokenEntry } from '../schema/common';
import { defineOperation } from './types';
import { checkTopK, finite } from '../engine/caps';
import { promptFields, promptIds, tokenEntries } from './lib/tokens';
import { directLogitScores } from './lib/directions';
import { describe as describeFeature } from './lib/feature-descriptions';
import {
  actsHook,
  checkActsSize,
  decoderRow,
  descriptionsField,
  featureRefFields,
  inputSae,
  saeDocFields,
} from './lib/sae';

/** prompts one call may scan, besides the main prompt */
export const MAX_FEATURE_PROMPTS = 64;

const input = z.object({
  ...promptFields,
  ...featureRefFields,
  prompts: z
    .array(z.string())
    .max(MAX_FEATURE_PROMPTS)
    .default([])
    .describe(`more prompts to read the feature's activations on, after prompt (at most ${MAX_FEATURE_PROMPTS})`),
  top_k: z.number().int().min(1).default(10).describe('promoted and suppressed tokens listed'),
  descriptions: descriptionsField,
});
export type FeatureInput = z.input<typeof input>;

const tokenWeight = z.object({ token: z.string(), token_id: z.number().int(), weight: z.number() });

const output = documentBase('feature').extend({
  ...saeDocFields,
  feature: z.object({
    index: z.number().int(),
    description: z.string().nullable().describe('auto-interp description, null when none was given'),
    decoder_norm: z.number(),
    encoder_bias: z.number(),
    threshold: z.number().nullable().describe('JumpReLU threshold'),
  }),
  logit_weights: z.object({
    available: z.boolean(),
    reason: z.string().nullable(),
    residual_map: z.string().nullable(),
    final_norm_weight_applied: z.boolean(),
    centered: z.boolean().describe('LayerNorm models: the direction is centred over d_model first, as the norm would'),
    norm_scale_applied: z.literal(false),
    promoted: z.array(tokenWeight).describe('largest weights first'),
    suppressed: z.array(tokenWeight).describe('most negative weights first'),
    method: z.string(),
  }),
  activations: z
    .array(
      z.object({
        prompt: z.string(),
        tokens: z.array(tokenEntry),
        values: z.array(z.number()).describe("the feature's activation at each token"),
        max: z.number(),
        max_position: z.number().int(),
        active_tokens: z.number().int(),
      }),
    )
    .describe('the prompt first, then prompts in order'),
  max_activation: z.number(),
  max_activation_prompt: z.number().int().describe('index into activations'),
});

export const operation = defineOperation({
  name: 'feature',
  title: 'Feature card',
  description:
    'One SAE feature (SAELens layout, from sae_source/sae_path): the tokens its decoder direction ' +
    'promotes and suppresses through the unembedding (W_dec[f] mapped into the residual stream, ' +
    "⊙ the final norm's weight, · W_U; no norm scale, per unit activation), its auto-interp " +
    'description (null when none is available), and its activation at every token of prompt and ' +
    'of up to 64 more prompts, with the maximum per prompt. Cost: one forward pass per prompt.',
  input,
  output,
}).implement(async (model, inp, ctx) => {
  checkTopK(inp.top_k);
  const texts = [inp.prompt, ...inp.prompts];
  const idsList = texts.map((p, i) => {
    try {
      return promptIds(model, p, { prependBos: inp.prepend_bos });
    } catch (e) {
      if (i > 0 && e instanceof LoupeError)
        throw new LoupeError(e.code, `prompts[${i - 1}]: ${e.message}`, e.hint, e.details);
      throw e;
    }
  });
  const f = inp.feature;
  const { sae, descriptions, doc } = await inputSae(model, inp, ctx, (sae) =>
    idsList.forEach((ids, i) => checkActsSize(sae, ids.length, i === 0 ? 'The prompt' : `prompts[${i - 1}]`)),
  );

  // ---- logit weights
  const { row, norm: decoderNorm, map } = decoderRow(model, sae, f);
  const layerNorm = model.info.norm === 'layernorm';
  let promoted: z.infer<typeof tokenWeight>[] = [];
  let suppressed: z.infer<typeof tokenWeight>[] = [];
  if (map.kind !== null) {
    const s = await directLogitScores(model, map.push(row), ctx.signal);
    const order = Array.from({ length: s.length }, (_, i) => i).sort((a, b) => s[b] - s[a] || a - b);
    const k = Math.min(inp.top_k, s.length);
    const entry = (id: number) => ({ token: model.tokenStrings([id])[0], token_id: id, weight: finite(s[id]) });
    promoted = order.slice(0, k).map(entry);
    suppressed = order.slice(-k).reverse().map(entry);
  }

  // ---- activations over the prompts
  const activations: z.output<typeof output>['activations'] = [];
  const dSae = sae.info.d_sae;
  for (let i = 0; i < idsList.length; i++) {
    throwIfAborted(ctx.signal);
    ctx.onProgress?.({ stage: 'reading activations', done: i, total: idsList.length });
    const ids = idsList[i];
    const res = await model.run(ids, { sae: sae.id, hooks: [actsHook(sae)], signal: ctx.signal });
    const acts = res.hooks[actsHook(sae)].data;
    const values = ids.map((_, t) => finite(acts[t * dSae + f]));
    let maxPos = 0;
    values.forEach((v, t) => {
      if (v > values[maxPos]) maxPos = t;
    });
    activations.push({
      prompt: texts[i],
      tokens: tokenEntries(model, ids),
      values,
      max: values[maxPos],
      max_position: maxPos,
      active_tokens: values.filter((v) => v !== 0).length,
    });
  }
  ctx.onProgress?.({ stage: 'reading activations', done: idsList.length, total: idsList.length });
  let best = 0;
  activations.forEach((a, i) => {
    if (a.max > activations[best].max) best = i;
  });

  const threshold = sae.info.activation === 'jumprelu' ? finite(sae.weight('threshold').data[f]) : null;
  return {
    ...documentHead('feature', model, inp.prompt, idsList[0]),
    ...doc,
    feature: {
      index: f,
      description: describeFeature(descriptions, f),
      decoder_norm: finite(decoderNorm),
      encoder_bias: finite(sae.weight('b_enc').data[f]),
      threshold,
    },
    logit_weights: {
      available: map.kind !== null,
      reason: map.kind === null ? map.reason : null,
      residual_map: map.kind !== null ? map.description : null,
      final_norm_weight_applied: map.kind !== null,
      centered: map.kind !== null && layerNorm,
      norm_scale_applied: false,
      promoted,
      suppressed,
      method:
        `weight(t) = ${layerNorm ? '(r − mean(r))' : 'r'} ⊙ w_lnf · W_U[:, t], ` +
        'r = W_dec[f] mapped into the residual stream; per unit of activation, no norm scale, no biases',
    },
    activations,
    max_activation: activations[best].max,
    max_activation_prompt: best,
  };
});
