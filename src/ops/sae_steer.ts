/**
 * `sae_steer` (Neuronpedia's feature steering, done locally): edit one SAE feature and generate,
 * base and steered side by side, or sweep the edit's strength.
 *
 * The edit is made on the feature's activation, at `{hook}.hook_sae_acts_post` inside the graph:
 *  - add    acts'_f = acts_f + α     → the stream moves by exactly α·W_dec[f]
 *  - clamp  acts'_f = v              → the stream moves by (v − acts_f)·W_dec[f]
 * and the SAE's reconstruction error is kept (x' = x̂' + error), so an unedited run is the model
 * itself (src/engine/sae.ts). With positions "all" every generated token is edited too.
 * Generation is the shared KV-cached loop (lib/generation.ts) with every row in one batch: row 0
 * unedited (base), then one row per α (or clamp value).
 *
 * Metrics are steer's (see steer.ts): target/control log-prob changes at the final prompt
 * position, normalized_effect, relative_change, KL(base ‖ steered); the sweep mode gives one
 * curve per metric and its trend, as sweep.ts.
 */
import { z } from 'zod';
import { generationBlock } from '../schema/generation';
import type { Intervention, LoadedModel } from '../engine/api';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { documentBase, documentHead, interventionRecord } from '../schema/common';
import { defineOperation } from './types';
import { finite } from '../engine/caps';
import { promptFields, promptIds } from './lib/tokens';
import { logSoftmax } from './lib/math';
import { generateBatch, generationFields } from './lib/generation';
import { directLogitScores } from './lib/directions';
import { vocabFilter } from './lib/vocab';
import { describe as describeFeature } from './lib/feature-descriptions';
import {
  checkEditPositions,
  checkSteerTokens,
  givenTokens,
  METRIC_DEFINITIONS,
  metricCurves,
  metricDefinitionsSchema,
  metricFields,
  metricValues,
  monotone,
  monotoneSchema,
  positionsField,
  relativeChangeNote,
  relativeChangeNoteSchema,
  rowsPerRun,
  sampling,
  steeringFields,
  steeringMetrics,
  tokenDeltas,
  tokenRef,
  topTokens,
  controlPool,
  givenOr,
  DEFAULT_TARGETS,
  DEFAULT_CONTROLS,
  CONTROL_POOL,
  MAX_SWEEP_ALPHAS,
} from './lib/steering';
import {
  actsHook,
  decoderRow,
  descriptionsField,
  featureRefFields,
  inputSae,
  saeDocFields,
  withSaeRuns,
  type AttachedSae,
} from './lib/sae';

const input = z.object({
  ...promptFields,
  ...featureRefFields,
  edit: z
    .enum(['add', 'clamp'])
    .default('add')
    .describe(
      'add: acts_f += α (the stream moves by α·W_dec[f]); clamp: acts_f = α (Neuronpedia-style clamping). The SAE error term is kept either way.',
    ),
  alpha: z.number().optional().describe('the strength (add) or clamp value; give this or alphas'),
  alphas: z
    .array(z.number())
    .min(1)
    .optional()
    .describe(
      `sweep mode: several strengths (add) or clamp values, one curve per metric (at most ${MAX_SWEEP_ALPHAS})`,
    ),
  positions: positionsField.describe(
    'positions whose feature is edited (0-based, BOS included); "all" also edits every generated token',
  ),
  targets: steeringFields.targets.describe(
    `tokens the feature should promote (default: the ${DEFAULT_TARGETS} tokens with the largest direct logit effect of W_dec[f])`,
  ),
  controls: steeringFields.controls.describe(
    `unrelated tokens used to normalise (default: of the ${CONTROL_POOL} most likely base tokens, the ${DEFAULT_CONTROLS} least affected by W_dec[f])`,
  ),
  descriptions: descriptionsField,
  ...sampling.fields,
});
export type SaeSteerInput = z.input<typeof input>;

const tokenDelta = tokenRef.extend({
  base_logprob: z.number(),
  steered_logprob: z.number().nullable().describe('null in sweep mode (see sweep.curves)'),
  delta: z.number().nullable(),
});

const curve = z.array(z.number());

const output = documentBase('sae_steer').extend({
  ...saeDocFields,
  feature: z.object({
    index: z.number().int(),
    description: z.string().nullable(),
    decoder_norm: z.number().describe("‖W_dec[f]‖ in the hook's space"),
    residual_norm: z
      .number()
      .nullable()
      .describe('‖W_dec[f] mapped into the residual stream‖ (null when the hook has no linear map)'),
  }),
  edit: z.enum(['add', 'clamp']),
  hook: z.string().describe('the edited site: {sae hook}.hook_sae_acts_post'),
  positions: z.union([z.literal('all'), z.array(z.number().int())]),
  mode: z.enum(['single', 'sweep']),
  alpha: z.number().nullable().describe('single mode: the strength or clamp value'),
  interventions: z
    .array(interventionRecord)
    .describe('the edit as data (one per α): re-running with it reproduces this document'),
  sampling: sampling.schema,
  base: generationBlock,
  steered: generationBlock.nullable().describe('single mode'),
  targets: z.array(tokenDelta),
  controls: z.array(tokenDelta),
  targets_rule: z.string(),
  controls_rule: z.string(),
  ...metricFields(z.number().nullable().describe('single mode')),
  relative_change_note: relativeChangeNoteSchema,
  sweep: z
    .object({
      alphas: z.array(z.number()),
      curves: z.object(metricFields(curve)).describe('one value per α, in the order of alphas'),
      monotone: monotoneSchema,
      generations: z.array(generationBlock.extend({ alpha: z.number() })),
    })
    .nullable()
    .describe('sweep mode'),
  metric_definitions: metricDefinitionsSchema,
  method: z.string(),
  engine_runs: z.number().int(),
});

const metricNulls = metricFields(null);

function featureIntervention(
  sae: AttachedSae,
  edit: 'add' | 'clamp',
  feature: number,
  v: number,
  positions: 'all' | number[],
  batch?: number[],
): Intervention {
  const base = { hook: actsHook(sae), neuron: feature, positions, ...(batch ? { batch } : {}) };
  return edit === 'add' ? { ...base, op: 'add', value: [1], alpha: v } : { ...base, op: 'set', value: [v] };
}

export const operation = defineOperation({
  name: 'sae_steer',
  title: 'SAE steer',
  description:
    'Steer with one SAE feature (SAELens layout, from sae_source/sae_path): add α to its ' +
    'activation (the residual stream moves by α·W_dec[f]) or clamp it to a value, ' +
    'at all or chosen positions (with "all", every generated token too), keeping the SAE error term; ' +
    'generate base and steered side by side (greedy or seeded sampling, KV-cached, batched). ' +
    "Reports target and control tokens' log-prob changes at the final prompt position, normalized_effect, " +
    'relative_change and KL(base ‖ steered), as steer does. With alphas (a list of strengths or ' +
    'clamp values) it is a sweep: one curve per metric, its trend, and the text at each value. ' +
    `Caps: ${MAX_SWEEP_ALPHAS} values, 256 new tokens.`,
  input,
  output,
  long: true,
}).implement(async (model, inp, ctx) => {
  checkSteerTokens(inp.max_new_tokens);
  if ((inp.alpha === undefined) === (inp.alphas === undefined)) {
    throw new LoupeError(
      'BAD_INPUT',
      inp.alpha === undefined ? 'Give alpha (one edit) or alphas (a sweep).' : 'Give alpha or alphas, not both.',
      'alpha = one strength (add) or clamp value; alphas = a list of them for a sweep.',
    );
  }
  const values = inp.alphas ?? [inp.alpha!];
  if (values.length > MAX_SWEEP_ALPHAS)
    throw new LoupeError(
      'TOO_LARGE',
      `${values.length} values exceed the sweep cap of ${MAX_SWEEP_ALPHAS}.`,
      `Give at most ${MAX_SWEEP_ALPHAS} values.`,
    );
  const ids = promptIds(model, inp.prompt, { prependBos: inp.prepend_bos, extra: inp.max_new_tokens });
  const T = ids.length;
  checkEditPositions(inp.positions, T);
  const { targets: givenTargets, controls: givenControls } = givenTokens(model, inp);

  const { sae, descriptions, doc } = await inputSae(model, inp, ctx);

  // ---- the feature's decoder row and its direct logit effect (for default targets/controls)
  const f = inp.feature;
  const { row, norm: decoderNorm, map } = decoderRow(model, sae, f);
  const resid = map.kind !== null ? map.push(row) : null;
  const scores = resid ? await directLogitScores(model, resid, ctx.signal) : null;
  const V = model.info.d_vocab;
  // defaults name only tokens the model can produce and a page can show (lib/vocab.ts)
  const vocab = !givenTargets || !givenControls ? await vocabFilter(model, ctx.signal) : null;
  const { ids: targets, rule: targetsRule } = await givenOr(givenTargets, () => {
    if (!scores)
      throw new LoupeError(
        'BAD_INPUT',
        `The feature has no direct logit effect to choose targets from: ${(map as { reason: string }).reason}.`,
        'Give targets (the tokens the feature should promote).',
      );
    return {
      ids: topTokens(scores, DEFAULT_TARGETS, vocab!.usable),
      rule:
        `the ${DEFAULT_TARGETS} tokens with the largest direct logit effect of W_dec[f] (mapped into the ` +
        `residual stream, ⊙ the final norm's weight, · W_U) — chosen from the feature itself; ${vocab!.rule}`,
    };
  });

  // ---- one batched, KV-cached generation per chunk of rows: row 0 unedited, then one row per value
  const variants: (number | null)[] = [null, ...values];
  const steering = withSaeRuns(model, sae.id);
  const per = rowsPerRun(model, T);
  const promptLogits: Float32Array[] = [];
  const rows: { ids: number[]; text: string; stop_reason: 'eos' | 'max_new_tokens' }[] = [];
  let runs = 0;
  let produced = 0;
  const totalTokens = variants.length * inp.max_new_tokens;
  for (let s = 0; s < variants.length; s += per) {
    throwIfAborted(ctx.signal);
    const chunk = variants.slice(s, s + per);
    const many = chunk.length > 1;
    const ivs = chunk.flatMap((v, r) =>
      v === null ? [] : [featureIntervention(sae, inp.edit, f, v, inp.positions, many ? [r] : undefined)],
    );
    const gen = await generateBatch(steering, ids, chunk.length, {
      ...sampling.options(inp),
      interventions: ivs,
      promptLogits: true,
      signal: ctx.signal,
      onToken: () => ctx.onProgress?.({ stage: 'generating', done: ++produced, total: totalTokens }),
    });
    runs += gen.runs;
    promptLogits.push(...gen.promptLogits);
    rows.push(...gen.rows);
  }

  const baseLp = logSoftmax(promptLogits[0], 0, V);
  const { ids: controls, rule: controlsRule } = await givenOr(givenControls, () => {
    const pool = controlPool(baseLp, [...targets, model.bosTokenId, model.eosTokenId], vocab!.usable);
    return scores
      ? {
          ids: pool.sort((a, b) => Math.abs(scores[a]) - Math.abs(scores[b]) || a - b).slice(0, DEFAULT_CONTROLS),
          rule:
            `of the ${CONTROL_POOL} most likely base tokens (targets, BOS, EOS excluded), ` +
            `the ${DEFAULT_CONTROLS} with the smallest |direct logit effect of W_dec[f]|; ${vocab!.rule}`,
        }
      : {
          ids: pool.slice(0, DEFAULT_CONTROLS),
          rule:
            `the ${DEFAULT_CONTROLS} most likely base tokens (targets, BOS, EOS excluded): ` +
            `the feature has no direct logit effect to rank them by; ${vocab!.rule}`,
        };
  });

  const metrics = values.map((_, i) =>
    steeringMetrics(baseLp, logSoftmax(promptLogits[i + 1], 0, V), targets, controls),
  );
  const single = inp.alphas === undefined;
  const m0 = single ? metrics[0] : null;
  const curves = metricCurves(metrics);
  const what =
    inp.edit === 'add'
      ? 'acts_f += α, so the stream at the hook moves by exactly α·W_dec[f]'
      : 'acts_f = α (clamp), so the stream at the hook moves by (α − acts_f)·W_dec[f]';

  return {
    ...documentHead('sae_steer', model, inp.prompt, ids),
    ...doc,
    feature: {
      index: f,
      description: describeFeature(descriptions, f),
      decoder_norm: finite(decoderNorm),
      residual_norm: resid ? finite(Math.sqrt(resid.reduce((a, v) => a + v * v, 0))) : null,
    },
    edit: inp.edit,
    hook: actsHook(sae),
    positions: inp.positions,
    mode: single ? 'single' : 'sweep',
    alpha: single ? inp.alpha! : null,
    interventions: values.map((v) => ({
      hook: actsHook(sae),
      op: inp.edit === 'add' ? ('add' as const) : ('set' as const),
      neuron: f,
      positions: inp.positions,
      value: inp.edit === 'add' ? [1] : [v],
      ...(inp.edit === 'add' ? { alpha: v } : {}),
      sae: { source: inp.sae_source, path: inp.sae_path },
    })),
    sampling: sampling.block(inp),
    base: generationFields(rows[0]),
    steered: single ? generationFields(rows[1]) : null,
    targets: tokenDeltas(model, targets, baseLp, m0?.steeredLogprobs ?? null),
    controls: tokenDeltas(model, controls, baseLp, m0?.steeredLogprobs ?? null),
    targets_rule: targetsRule,
    controls_rule: controlsRule,
    ...(m0 ? metricValues(m0) : metricNulls),
    relative_change_note: relativeChangeNote(baseLp, targets),
    sweep: single
      ? null
      : {
          alphas: values,
          curves,
          monotone: monotone(values, curves),
          generations: values.map((a, i) => ({ alpha: a, ...generationFields(rows[i + 1]) })),
        },
    metric_definitions: METRIC_DEFINITIONS,
    method:
      `Feature ${f} of the SAE at ${sae.info.hook} is edited at ${actsHook(sae)} (${what}); ` +
      "the SAE's error term is kept, so an unedited row is the model itself. " +
      `Positions: ${inp.positions === 'all' ? 'every prompt position and every generated token' : `prompt positions ${inp.positions.join(', ')}`}. ` +
      'One KV-cached generation with all rows batched (row 0 unedited = ' +
      `base${single ? ', row 1 edited' : ', one row per α'}); metrics at the final prompt position from the ` +
      'same prompt pass.',
    engine_runs: runs,
  };
});
