/**
 * `sweep`: `steer` over a list of α, one document with one curve per metric and the generated text
 * at each α — what the page's α-sweep chart draws. All α rows share one batched, KV-cached
 * generation (split only when the batch cap or the logits' memory requires it), and the metric
 * curves come from that same batched prompt pass.
 *
 * α defaults to multiples of the layer's mean residual norm (mean over the prompt's non-BOS
 * positions of ‖blocks.{layer}.hook_resid_pre‖), so that with a unit direction α = 1 × norm is an
 * edit as large as the residual stream itself.
 */
import { z } from 'zod';
import { generationBlock } from '../schema/generation';
import type { LoadedModel } from '../engine/api';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { documentBase, documentHead, interventionRecord } from '../schema/common';
import { defineOperation } from './types';
import { logSoftmax } from './lib/math';
import { generateBatch, generationFields } from './lib/generation';
import {
  checkSteerTokens,
  METRIC_DEFINITIONS,
  metricCurves,
  metricDefinitionsSchema,
  metricFields,
  monotone,
  monotoneSchema,
  prepareSteering,
  rowsPerRun,
  sampling,
  steeringFields,
  steeringSiteSchema,
  tokenRef,
  tokenRefs,
  type SteeringMetrics,
  MAX_SWEEP_ALPHAS,
  DEFAULT_MULTIPLES,
} from './lib/steering';

const input = z.object({
  ...steeringFields,
  alphas: z.array(z.number()).min(1).optional().describe('absolute α values (overrides multiples)'),
  multiples: z
    .array(z.number())
    .min(1)
    .default(DEFAULT_MULTIPLES)
    .describe('α = multiple × resid_norm (used when alphas is absent)'),
  ...sampling.fields,
});
export type SweepInput = z.input<typeof input>;

const curve = z.array(z.number());
const output = documentBase('sweep').extend({
  ...steeringSiteSchema,
  alpha_source: z.enum(['alphas', 'multiples']),
  multiples: z.array(z.number()).nullable().describe('α / resid_norm when α came from multiples'),
  alphas: z.array(z.number()),
  curves: z.object(metricFields(curve)).describe('one value per α, in the order of `alphas`'),
  monotone: monotoneSchema,
  generations: z.array(generationBlock.extend({ alpha: z.number() })),
  targets: z.array(tokenRef),
  controls: z.array(tokenRef),
  targets_rule: z.string(),
  controls_rule: z.string(),
  interventions: z.array(interventionRecord).describe('the edit as data, once per α'),
  sampling: sampling.schema,
  metric_definitions: metricDefinitionsSchema,
  engine_runs: z.number().int(),
});

export const operation = defineOperation({
  name: 'sweep',
  title: 'α-sweep',
  description:
    'Steering over a list of α at blocks.{layer}.hook_resid_pre: one curve per metric (target and ' +
    'control log-prob deltas at the final prompt position, normalized_effect = target Δ − control Δ, ' +
    'relative_change, KL(base ‖ steered)), the trend of each curve, and the generated text at each α. ' +
    `α defaults to ${JSON.stringify(DEFAULT_MULTIPLES)} × the layer's mean ` +
    'residual norm (d unit-normalised). All α values run as rows of one batched, ' +
    `KV-cached generation. Caps: ${MAX_SWEEP_ALPHAS} α values, 256 new tokens.`,
  input,
  output,
  long: true,
}).implement(async (model, inp, ctx) => {
  checkSteerTokens(inp.max_new_tokens);
  const n = inp.alphas?.length ?? inp.multiples.length;
  if (n > MAX_SWEEP_ALPHAS) {
    throw new LoupeError(
      'TOO_LARGE',
      `${n} α values exceed the sweep cap of ${MAX_SWEEP_ALPHAS}.`,
      `Give at most ${MAX_SWEEP_ALPHAS} values.`,
    );
  }
  ctx.onProgress?.({ stage: 'base run', done: 0, total: n });
  const setup = await prepareSteering(model, inp, ctx, inp.max_new_tokens);
  const { ids, hook, dir, targets, controls } = setup;
  const alphas = inp.alphas ?? inp.multiples.map((m) => m * setup.residNorm);
  const V = model.info.d_vocab;
  const per = rowsPerRun(model, ids.length);
  const metrics: SteeringMetrics[] = [];
  const generations: z.output<typeof output>['generations'] = [];
  let runs = 1;
  for (let s = 0; s < alphas.length; s += per) {
    throwIfAborted(ctx.signal);
    const chunk = alphas.slice(s, s + per);
    const ivs = chunk.map((a, r) => setup.edit(a, chunk.length > 1 ? [r] : undefined));
    const gen = await generateBatch(model, ids, chunk.length, {
      ...sampling.options(inp),
      interventions: ivs,
      promptLogits: true,
      promptReduce: setup.reduce,
      signal: ctx.signal,
      onToken: ({ step, row }) => {
        if (row === 0)
          ctx.onProgress?.({
            stage: `generating (α ${s + 1}–${s + chunk.length} of ${alphas.length})`,
            done: step + 1,
            total: inp.max_new_tokens,
          });
      },
    });
    runs += gen.runs;
    chunk.forEach((a, r) => {
      // each row reduced where it is (greedy, top-k), else read back whole (sampling from the row)
      const row = gen.promptRows?.[r];
      metrics.push(row ? setup.metricsOfRow(row) : setup.metrics(logSoftmax(gen.promptLogits[r], 0, V)));
      generations.push({ alpha: a, ...generationFields(gen.rows[r]) });
    });
    ctx.onProgress?.({ stage: 'sweeping α', done: Math.min(s + per, alphas.length), total: alphas.length });
  }
  const curves = metricCurves(metrics);
  return {
    ...documentHead('sweep', model, inp.prompt, ids),
    ...setup.site,
    alpha_source: inp.alphas ? 'alphas' : 'multiples',
    multiples: inp.alphas ? null : inp.multiples,
    alphas,
    curves,
    monotone: monotone(alphas, curves),
    generations,
    targets: tokenRefs(model, targets),
    controls: tokenRefs(model, controls),
    targets_rule: setup.targetsRule,
    controls_rule: setup.controlsRule,
    interventions: alphas.map((a) => ({
      hook,
      op: 'add' as const,
      positions: inp.positions,
      alpha: a,
      direction: dir.spec,
      normalize: inp.normalize,
    })),
    sampling: sampling.block(inp),
    metric_definitions: METRIC_DEFINITIONS,
    engine_runs: runs,
  };
});
