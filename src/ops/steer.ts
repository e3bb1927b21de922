/**
 * `steer` (openinterp's steer): add α·d to blocks.{layer}.hook_resid_pre and generate, base and
 * steered side by side (one batched, KV-cached generation: row 0 base, row 1 steered), and measure
 * the edit's effect on the next-token distribution at the final prompt position.
 *
 * The steering machinery (setup, metrics, batched variants) is ops/lib/steering.ts, shared with
 * `sweep`, `sae_steer` and `causality`; its metric definitions are written there.
 */
import { z } from 'zod';
import { generationBlock } from '../schema/generation';
import { documentBase, documentHead, interventionRecord } from '../schema/common';
import { defineOperation } from './types';
import { logSoftmax } from './lib/math';
import { generateBatch, generationFields } from './lib/generation';
import {
  checkSteerTokens,
  METRIC_DEFINITIONS,
  metricDefinitionsSchema,
  metricFields,
  metricValues,
  prepareSteering,
  relativeChangeNote,
  relativeChangeNoteSchema,
  sampling,
  steeringFields,
  steeringSiteSchema,
  tokenDeltas,
  tokenRef,
} from './lib/steering';

const input = z.object({
  ...steeringFields,
  alpha: z.number().describe("strength: the edit is α·d (with a unit d, α is the edit's norm)"),
  ...sampling.fields,
});
export type SteerInput = z.input<typeof input>;

const tokenDelta = tokenRef.extend({ base_logprob: z.number(), steered_logprob: z.number(), delta: z.number() });

const output = documentBase('steer').extend({
  ...steeringSiteSchema,
  alpha: z.number(),
  interventions: z.array(interventionRecord).describe('the edit as data: re-running with it reproduces this document'),
  sampling: sampling.schema,
  base: generationBlock,
  steered: generationBlock,
  targets: z.array(tokenDelta),
  controls: z.array(tokenDelta),
  targets_rule: z.string(),
  controls_rule: z.string(),
  ...metricFields(z.number()),
  relative_change_note: relativeChangeNoteSchema,
  metric_definitions: metricDefinitionsSchema,
  generation: z.object({ kv_cache: z.boolean(), engine_runs: z.number().int(), batched_rows: z.number().int() }),
});

export const operation = defineOperation({
  name: 'steer',
  title: 'Steer',
  description:
    'Add α·d to the residual stream before a layer (blocks.{layer}.hook_resid_pre; all or chosen positions; ' +
    'with "all", every generated token too) and generate, base and steered side by side (greedy, or sampled with ' +
    'a seed; KV-cached, both rows in one batch). d comes from a token pair (unembedding columns W_U[:, ' +
    'a] − W_U[:, b]), the mean activation difference of two prompt sets, a probe handle ("probe:<handle>"), ' +
    'a random seed, or numbers; it is unit-normalised by default so α is in residual-norm units (resid_norm ' +
    'gives the scale). ' +
    "Reports, at the final prompt position, the change of target and control tokens' log-probabilities, " +
    'normalized_effect = target Δ − control Δ, relative_change = exp(normalized_effect) − 1, ' +
    'and KL(base ‖ steered).',
  input,
  output,
}).implement(async (model, inp, ctx) => {
  checkSteerTokens(inp.max_new_tokens);
  ctx.onProgress?.({ stage: 'base run', done: 0, total: 1 });
  const setup = await prepareSteering(model, inp, ctx, inp.max_new_tokens);
  const { ids, hook, dir, targets, controls } = setup;
  const iv = setup.edit(inp.alpha, [1]);
  let produced = 0;
  const gen = await generateBatch(model, ids, 2, {
    ...sampling.options(inp),
    interventions: [iv],
    promptLogits: true,
    promptReduce: setup.reduce,
    signal: ctx.signal,
    onToken: ({ row }) => {
      if (row === 1) ctx.onProgress?.({ stage: 'generating', done: ++produced, total: inp.max_new_tokens });
    },
  });
  // the steered row reduced where it is (greedy, top-k), else read back whole (sampling from the row)
  const m = gen.promptRows
    ? setup.metricsOfRow(gen.promptRows[1])
    : setup.metrics(logSoftmax(gen.promptLogits[1], 0, model.info.d_vocab));
  const steered = m.steeredLogprobs;
  return {
    ...documentHead('steer', model, inp.prompt, ids),
    ...setup.site,
    alpha: inp.alpha,
    interventions: [
      { hook, op: 'add', positions: inp.positions, alpha: inp.alpha, direction: dir.spec, normalize: inp.normalize },
    ],
    sampling: sampling.block(inp),
    base: generationFields(gen.rows[0]),
    steered: generationFields(gen.rows[1]),
    targets: tokenDeltas(model, targets, setup.baseLogprobs, steered),
    controls: tokenDeltas(model, controls, setup.baseLogprobs, steered),
    targets_rule: setup.targetsRule,
    controls_rule: setup.controlsRule,
    ...metricValues(m),
    relative_change_note: relativeChangeNote(setup.baseLogprobs, targets),
    metric_definitions: METRIC_DEFINITIONS,
    generation: { kv_cache: true, engine_runs: gen.runs, batched_rows: 2 },
  };
});
