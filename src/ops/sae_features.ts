/**
 * `sae_features` (openinterp's sae_lookup, done locally): decompose the activation at an SAE's
 * hook into its top-K features at every position (or one), with descriptions, the SAE's
 * reconstruction error, and each final-position feature's direct logit attribution to the
 * model's prediction.
 *
 * One engine run with the SAE spliced into the graph (feature activations and the reconstruction
 * are computed where the activation lives); the rest is float64 arithmetic on its outputs.
 *
 * Reconstruction (x = the hook's activation at a position, x̂ = the SAE's reconstruction):
 *   mse            = mean_d (x − x̂)²
 *   fvu (overall)  = Σ_t ‖x_t − x̂_t‖² / Σ_t ‖x_t − x̄‖², x̄ = mean over the positions   (SAELens's
 *                    explained_variance = 1 − fvu: 1 − mean‖x − x̂‖² / mean‖x − x̄‖²)
 *   fvu (position) = ‖x_t − x̂_t‖² / ‖x_t − x̄‖²  (SAELens's per-token "legacy" explained variance)
 * Logit attribution of feature f at the final position T−1, to the predicted token p:
 *   act_f · (r_f · e),  r_f = W_dec[f] mapped into the residual stream (lib/sae.ts residualMap),
 *   e = (w_lnf ⊙ W_U[:, p]) / s, centred over d_model for LayerNorm, s = the clean run's
 *   ln_final.hook_scale at T−1 (frozen). The bias of the final norm and of the unembedding are not
 *   part of any feature. Over all active features plus b_dec·e and error·e it sums to the hook's own
 *   direct term x·e (reported as a check).
 */
import { z } from 'zod';
import type { LoadedModel } from '../engine/api';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { documentBase, documentHead } from '../schema/common';
import { defineOperation } from './types';
import { checkTopK, finite } from '../engine/caps';
import { promptFields, promptIds, tokenText } from './lib/tokens';
import { argmax } from './lib/math';
import { readoutDirection } from './lib/dla';
import { describe as describeFeature } from './lib/feature-descriptions';
import {
  actsHook,
  checkActsSize,
  descriptionsField,
  inputSae,
  residualMap,
  saeDocFields,
  saeRefFields,
} from './lib/sae';

const input = z.object({
  ...promptFields,
  ...saeRefFields,
  position: z
    .number()
    .int()
    .min(0)
    .optional()
    .describe('only this position (0-based, BOS included); default every position'),
  top_k: z
    .number()
    .int()
    .min(1)
    .default(10)
    .describe('features listed per position (only active ones, activation ≠ 0)'),
  descriptions: descriptionsField,
});
export type SaeFeaturesInput = z.input<typeof input>;

const featureEntry = z.object({
  feature: z.number().int(),
  activation: z.number(),
  description: z.string().nullable().describe('auto-interp description, null when none was given'),
  logit_attribution: z
    .number()
    .nullable()
    .describe(
      "at the final position: the feature's direct effect on the predicted token's logit; " +
        'null elsewhere (no direct path) or when the hook has no linear way into the residual stream',
    ),
});

const reconstructionAt = z.object({
  mse: z.number(),
  fvu: z.number().nullable().describe('‖x − x̂‖² / ‖x − x̄‖² (null when ‖x − x̄‖ = 0)'),
  input_norm: z.number(),
  error_norm: z.number(),
});

const output = documentBase('sae_features').extend({
  ...saeDocFields,
  top_k: z.number().int(),
  position: z.number().int().nullable().describe('the position asked for; null = every position'),
  positions: z.array(
    z.object({
      position: z.number().int(),
      token: z.string(),
      token_id: z.number().int(),
      l0: z.number().int().describe('active features at this position'),
      features: z.array(featureEntry).describe('top_k active features by activation, descending'),
      reconstruction: reconstructionAt,
    }),
  ),
  reconstruction: z.object({
    positions: z.number().int().describe('positions averaged over (every position of the prompt, BOS included)'),
    mse: z.number(),
    fvu: z.number().nullable(),
    explained_variance: z.number().nullable(),
    without_bos: z
      .object({
        positions: z.number().int(),
        mse: z.number(),
        fvu: z.number().nullable(),
        explained_variance: z.number().nullable(),
      })
      .nullable()
      .describe(
        'the same over the positions after BOS (BOS activations are outliers for most SAEs); null without a BOS',
      ),
    definitions: z.object({ mse: z.string(), fvu: z.string(), position_fvu: z.string() }),
  }),
  prediction: z.object({
    position: z.number().int(),
    token: z.string(),
    token_id: z.number().int(),
    logit: z.number(),
  }),
  logit_attribution: z.object({
    available: z.boolean(),
    residual_map: z.string().nullable(),
    reason: z.string().nullable().describe('why attribution is not available'),
    final_norm_scale: z.number().describe('ln_final.hook_scale at the final position (frozen)'),
    features_sum: z.number().nullable().describe('Σ over every active feature at the final position'),
    b_dec_term: z.number().nullable(),
    error_term: z.number().nullable(),
    hook_direct_term: z
      .number()
      .nullable()
      .describe("x·e: the hook value's own direct term = features_sum + b_dec_term + error_term"),
    check_abs_diff: z.number().nullable(),
  }),
  method: z.string(),
});

const DEFINITIONS = {
  mse: 'mean over positions and the d_in values of (x − x̂)², x = the hook activation, x̂ = the SAE reconstruction',
  fvu:
    'fraction of variance unexplained, as SAELens: Σ_t ‖x_t − x̂_t‖² / Σ_t ‖x_t − x̄‖² with x̄ the mean over ' +
    'the positions; explained_variance = 1 − fvu',
  position_fvu: "‖x_t − x̂_t‖² / ‖x_t − x̄‖² (SAELens's per-token legacy explained variance, subtracted from 1)",
};

function overall(x: Float32Array, rc: Float32Array, d: number, from: number, T: number) {
  const n = T - from;
  const mean = new Float64Array(d);
  for (let t = from; t < T; t++) for (let i = 0; i < d; i++) mean[i] += x[t * d + i] / n;
  let err = 0;
  let tot = 0;
  for (let t = from; t < T; t++) {
    for (let i = 0; i < d; i++) {
      err += (x[t * d + i] - rc[t * d + i]) ** 2;
      tot += (x[t * d + i] - mean[i]) ** 2;
    }
  }
  const fvu = tot > 0 ? err / tot : null;
  return {
    positions: n,
    mse: finite(err / (n * d)),
    fvu: fvu === null ? null : finite(fvu),
    explained_variance: fvu === null ? null : finite(1 - fvu),
    mean,
  };
}

export const operation = defineOperation({
  name: 'sae_features',
  title: 'SAE features',
  description:
    "Decompose the activation at a sparse autoencoder's hook into SAE features (SAELens layout, " +
    'loaded from sae_source/sae_path: Hub repo, URL or folder): per position (or one position) ' +
    'the top_k active features with activation and auto-interp description (null when none is available; ' +
    'never invented), L0, the reconstruction error (MSE and fraction of variance unexplained, ' +
    "SAELens definitions) per position and overall, and for the final position each feature's direct logit " +
    'attribution to the predicted token (activation × W_dec[f] through the final norm with its frozen scale and ' +
    'W_U[:, predicted]). ' +
    'The SAE must match the model (d_in and hook), else SAE_MISMATCH. Cost: loading the SAE once per model, then one forward pass.',
  input,
  output,
}).implement(async (model, inp, ctx) => {
  checkTopK(inp.top_k);
  const ids = promptIds(model, inp.prompt, { prependBos: inp.prepend_bos });
  const T = ids.length;
  if (inp.position !== undefined && inp.position >= T) {
    throw new LoupeError(
      'BAD_INPUT',
      `position ${inp.position} is outside the prompt (${T} tokens, BOS included).`,
      `Use 0 … ${T - 1}, or leave position out for every position.`,
    );
  }
  const { sae, descriptions, doc } = await inputSae(model, inp, ctx, (sae) => checkActsSize(sae, T));

  const hook = sae.info.hook;
  const { d_in: dIn, d_sae: dSae } = sae.info;
  ctx.onProgress?.({ stage: 'running with the SAE', done: 0, total: 1 });
  const res = await model.run(ids, {
    sae: sae.id,
    hooks: [hook, actsHook(sae), `${hook}.hook_sae_recons`, 'ln_final.hook_scale'],
    signal: ctx.signal,
  });
  throwIfAborted(ctx.signal);
  const x = res.hooks[hook].data;
  const acts = res.hooks[actsHook(sae)].data;
  const rc = res.hooks[`${hook}.hook_sae_recons`].data;

  // ---- reconstruction
  const all = overall(x, rc, dIn, 0, T);
  const hasBos = inp.prepend_bos && model.bosTokenId !== undefined && ids[0] === model.bosTokenId && T > 1;
  const noBos = hasBos ? overall(x, rc, dIn, 1, T) : null;

  // ---- the prediction and the readout at the final position
  const V = model.info.d_vocab;
  const last = T - 1;
  const predicted = argmax(res.logits.data, last * V, V);
  const scale = res.hooks['ln_final.hook_scale'].data[last];
  const map = residualMap(model, hook);
  let eHook: Float64Array | null = null;
  if (map.kind !== null) {
    const { e } = await readoutDirection(model, { tokenId: predicted }, 'raw', scale, ctx.signal);
    eHook = map.pull(e);
  }
  const W_dec = eHook ? sae.weight('W_dec').data : null;
  /** r_f · e for feature f (its decoder row pulled back through the readout) */
  const unitEffect = (f: number) => {
    let s = 0;
    for (let i = 0; i < dIn; i++) s += W_dec![f * dIn + i] * eHook![i];
    return s;
  };

  // ---- per position
  const wanted = inp.position === undefined ? Array.from({ length: T }, (_, t) => t) : [inp.position];
  const texts = model.tokenStrings(ids);
  const positions = wanted.map((t) => {
    const row = acts.subarray(t * dSae, (t + 1) * dSae);
    const active: number[] = [];
    for (let f = 0; f < dSae; f++) if (row[f] !== 0) active.push(f);
    const top = active.sort((a, b) => row[b] - row[a] || a - b).slice(0, inp.top_k);
    let err = 0,
      xx = 0,
      dev = 0;
    for (let i = 0; i < dIn; i++) {
      const xi = x[t * dIn + i];
      err += (xi - rc[t * dIn + i]) ** 2;
      xx += xi * xi;
      dev += (xi - all.mean[i]) ** 2;
    }
    return {
      position: t,
      token: texts[t],
      token_id: ids[t],
      l0: active.length,
      features: top.map((f) => ({
        feature: f,
        activation: finite(row[f]),
        description: describeFeature(descriptions, f),
        logit_attribution: t === last && eHook ? finite(row[f] * unitEffect(f)) : null,
      })),
      reconstruction: {
        mse: finite(err / dIn),
        fvu: dev > 0 ? finite(err / dev) : null,
        input_norm: finite(Math.sqrt(xx)),
        error_norm: finite(Math.sqrt(err)),
      },
    };
  });

  // ---- the exact split of the hook's direct term at the final position
  let attribution: z.output<typeof output>['logit_attribution'] = {
    available: false,
    residual_map: null,
    reason: map.kind === null ? map.reason : null,
    final_norm_scale: finite(scale),
    features_sum: null,
    b_dec_term: null,
    error_term: null,
    hook_direct_term: null,
    check_abs_diff: null,
  };
  if (eHook && map.kind !== null) {
    const row = acts.subarray(last * dSae, (last + 1) * dSae);
    let feats = 0;
    for (let f = 0; f < dSae; f++) if (row[f] !== 0) feats += row[f] * unitEffect(f);
    const bDec = sae.weight('b_dec').data;
    let bTerm = 0,
      eTerm = 0,
      xTerm = 0;
    for (let i = 0; i < dIn; i++) {
      const xi = x[last * dIn + i];
      bTerm += bDec[i] * eHook[i];
      eTerm += (xi - rc[last * dIn + i]) * eHook[i];
      xTerm += xi * eHook[i];
    }
    attribution = {
      available: true,
      residual_map: map.description,
      reason: null,
      final_norm_scale: finite(scale),
      features_sum: finite(feats),
      b_dec_term: finite(bTerm),
      error_term: finite(eTerm),
      hook_direct_term: finite(xTerm),
      check_abs_diff: finite(Math.abs(feats + bTerm + eTerm - xTerm)),
    };
  }

  const norm =
    model.info.norm === 'layernorm'
      ? 'LayerNorm: (w_lnf ⊙ W_U[:, p]) centred over d_model'
      : 'RMSNorm: w_lnf ⊙ W_U[:, p]';
  const method =
    `One run with the SAE spliced in at ${hook} (encode/decode inside the graph; with no feature edited the model's output is unchanged). ` +
    `Features: acts = ${sae.info.activation}((x${sae.info.apply_b_dec_to_input ? ' − b_dec' : ''})·W_enc ` +
    `+ b_enc); each position lists its ${inp.top_k} largest active features. ` +
    `Logit attribution (final position ${last} only; earlier positions have no direct path to its logits): ` +
    'activation × W_dec[f] ' +
    `${map.kind === null ? '(unavailable: ' + map.reason + ')' : `(${map.description})`} · e, ` +
    `e = ${norm} / s, s = the clean run's ln_final.hook_scale at position ${last}, frozen; p = the predicted ` +
    'token (argmax of the logits). Final-norm bias and unembedding bias are not attributed to features. ' +
    `Reconstruction: ${DEFINITIONS.fvu}.`;

  return {
    ...documentHead('sae_features', model, inp.prompt, ids),
    ...doc,
    top_k: inp.top_k,
    position: inp.position ?? null,
    positions,
    reconstruction: {
      positions: all.positions,
      mse: all.mse,
      fvu: all.fvu,
      explained_variance: all.explained_variance,
      without_bos: noBos
        ? { positions: noBos.positions, mse: noBos.mse, fvu: noBos.fvu, explained_variance: noBos.explained_variance }
        : null,
      definitions: DEFINITIONS,
    },
    prediction: {
      position: last,
      token: tokenText(model, predicted),
      token_id: predicted,
      logit: finite(res.logits.data[last * V + predicted]),
    },
    logit_attribution: attribution,
    method,
  };
});
