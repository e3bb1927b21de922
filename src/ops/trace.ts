/**
 * trace (NeuronScope's trace): what the model predicts at a position and which heads and MLP
 * neurons write it there directly — direct logit attribution with every term of the exact
 * decomposition listed (lib/dla.ts holds the maths).
 */
import { z } from 'zod';
import { defineOperation } from './types';
import { documentBase, documentHead } from '../schema/common';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { checkTopK, finite } from '../engine/caps';
import { promptFields, promptIds, resolveToken, tokenText } from './lib/tokens';
import { CONVENTIONS, besideExperts, decomposeLogit, describeMethod, dlaHookNames, type DlaTarget } from './lib/dla';
import { logSumExp, topIndices, topK } from './lib/math';

export const traceInput = z.object({
  ...promptFields,
  convention: z
    .enum(CONVENTIONS)
    .default('transformer_lens')
    .describe(
      'transformer_lens (centred unembedding, folded value biases; sums to the centred logit) or raw (no processing; sums to the logit).',
    ),
  answer: z
    .string()
    .optional()
    .describe('Attribute this token instead of the prediction: its text (" love", "love") or id ("#123").'),
  counterfactual: z
    .string()
    .optional()
    .describe('With answer: attribute the logit difference answer − counterfactual (IOI style).'),
  top_k: z
    .number()
    .int()
    .min(1)
    .default(10)
    .describe('Length of top_predictions, top_heads and the neuron lists; ≥ n_layers × n_heads lists every head.'),
  position: z
    .number()
    .int()
    .min(0)
    .optional()
    .describe('Sequence position to trace (0-based, BOS included); default the last.'),
});
export type TraceInput = z.input<typeof traceInput>;

const prediction = z.object({ token: z.string(), token_id: z.number().int(), logit: z.number(), prob: z.number() });
const neuron = z.object({
  layer: z.number().int(),
  neuron: z.number().int(),
  activation: z.number(),
  logit_attribution: z.number(),
});

export const traceOutput = documentBase('trace').extend({
  convention: z.enum(CONVENTIONS),
  position: z.number().int(),
  predicted_token: z.string(),
  predicted_token_id: z.number().int(),
  top_predictions: z.array(prediction),
  target: z
    .object({
      kind: z.enum(['logit', 'centered_logit', 'logit_difference']),
      token: z.string(),
      token_id: z.number().int(),
      counterfactual_token: z.string().optional(),
      counterfactual_token_id: z.number().int().optional(),
    })
    .describe('What is attributed: the predicted token unless answer was given.'),
  top_heads: z
    .array(z.object({ layer: z.number().int(), head: z.number().int(), logit_attribution: z.number() }))
    .describe('Heads ranked by |logit_attribution|.'),
  head_attribution: z
    .array(z.array(z.number()))
    .describe('[n_layers][n_heads] per-head direct logit attribution; [] for a linear-attention layer (Qwen3.5).'),
  top_neurons: z
    .array(neuron)
    .describe('MLP neurons ranked by |logit_attribution| (their own direct effect through W_out).'),
  top_neurons_by_activation: z
    .array(neuron)
    .describe('MLP neurons ranked by |activation| (mlp.hook_post) at the position.'),
  top_experts: z
    .array(
      z.object({
        layer: z.number().int(),
        expert: z.number().int(),
        weight: z.number().describe('its routing weight at the position (0: not routed there)'),
        logit_attribution: z.number(),
      }),
    )
    .optional()
    .describe('Mixture-of-experts models: experts ranked by |logit_attribution| (experts.{e}.hook_out · direction).'),
  expert_attribution: z
    .array(z.array(z.number()))
    .optional()
    .describe('Mixture-of-experts models: [n_layers][n_experts] per-expert direct logit attribution.'),
  decomposition: z.object({
    terms: z.array(z.object({ name: z.string(), value: z.number() })),
    sum: z.number(),
    target: z.number().describe("The value the terms sum to, read from the model's own logits (pre-soft-cap)."),
  }),
  checks: z.object({
    sum_minus_target: z.number(),
    residual_reconstruction_max_abs: z
      .number()
      .describe('max |Σ components − final resid_post| (float32 rounding only, when hooks are consistent)'),
    attention_reconstruction_max_abs: z.number().describe('max over layers |Σ_h z_h W_O[h] + b_O − hook_attn_out|'),
  }),
  method: z.string(),
});

export const operation = defineOperation({
  name: 'trace',
  title: 'Trace',
  description:
    'Predicted token at a position (default last) and its direct logit attribution (DLA): ' +
    'per attention head (z_h·W_O[h]), per MLP neuron, and the exact decomposition into named ' +
    'terms (embed, pos_embed, L{l}H{h}, L{l}.attn.b_O, L{l}.mlp — in a mixture-of-experts model one term per ' +
    'expert L{l}.E{e} and L{l}.shared_expert; Gemma 4 adds L{l}.per_layer — ln_final.b, unembed.b_U) ' +
    'whose sum equals the logit (raw), the centred logit (transformer_lens, default) or, ' +
    'with answer + counterfactual, the logit difference. Units: logits. Cost: one forward pass.',
  input: traceInput,
  output: traceOutput,
}).implement(async (model, input, ctx) => {
  checkTopK(input.top_k);
  if (input.counterfactual !== undefined && input.answer === undefined) {
    throw new LoupeError(
      'BAD_INPUT',
      'counterfactual needs answer.',
      'Give answer too: the difference attributed is answer − counterfactual.',
    );
  }
  const ids = promptIds(model, input.prompt, { prependBos: input.prepend_bos });
  const pos = input.position ?? ids.length - 1;
  if (pos >= ids.length)
    throw new LoupeError(
      'BAD_INPUT',
      `position ${pos} is outside the prompt (${ids.length} tokens).`,
      `Use 0 … ${ids.length - 1}.`,
    );
  const answerId = input.answer !== undefined ? resolveToken(model, input.answer, 'answer') : undefined;
  const cfId =
    input.counterfactual !== undefined ? resolveToken(model, input.counterfactual, 'counterfactual') : undefined;

  ctx.onProgress?.({ stage: 'forward pass', done: 0, total: 2 });
  throwIfAborted(ctx.signal);
  // logits at the traced position only: the unembedding of the other positions would cost as much as a tenth of the forward
  // and the hooks at it only: on the GPU nothing else is read back
  const run = await model.run(ids, {
    hooks: dlaHookNames(model),
    logitPositions: [pos],
    hookPositions: [pos],
    signal: ctx.signal,
  });
  throwIfAborted(ctx.signal);
  ctx.onProgress?.({ stage: 'attribution', done: 1, total: 2 });

  const V = run.logits.dims[2];
  const row = run.logits.data.subarray(0, V);
  // probabilities of the listed tokens only: exp(logit − log Σ exp), one pass over the vocabulary
  const lse = logSumExp(row);
  const top = topK(row, input.top_k);
  const predictedId = top[0];
  const target: DlaTarget = { tokenId: answerId ?? predictedId, counterfactualId: cfId };
  const dla = await decomposeLogit(model, run, target, {
    convention: input.convention,
    position: 0, // the run's hooks are at pos only
    logitIndex: 0,
    signal: ctx.signal,
  });

  const { n_layers: L, n_heads: H } = model.info;
  // a linear-attention layer (Qwen3.5) has no heads: its row is empty, its term L{l}.linear_attn
  const headAt = (i: number) => dla.heads[Math.floor(i / H)][i % H] ?? 0;
  const hasHead = (i: number) => dla.heads[Math.floor(i / H)].length > 0;
  const topHeads = topIndices(L * H, (i) => (hasHead(i) ? Math.abs(headAt(i)) : -1), input.top_k)
    .filter(hasHead)
    .map((i) => ({
      layer: Math.floor(i / H),
      head: i % H,
      logit_attribution: finite(headAt(i)),
    }));
  // neuron i of the flattened list: layers' widths may differ (Gemma 4's double-wide MLPs)
  const first = [0];
  for (const a of dla.neuronAttribution) first.push(first[first.length - 1] + a.length);
  const whereNeuron = (i: number): [number, number] => {
    let l = 0;
    while (i >= first[l + 1]) l++;
    return [l, i - first[l]];
  };
  const neuronAt = (i: number): z.infer<typeof neuron> => {
    const [l, n] = whereNeuron(i);
    return {
      layer: l,
      neuron: n,
      activation: finite(dla.neuronActivation[l][n]),
      logit_attribution: finite(dla.neuronAttribution[l][n]),
    };
  };
  const ex = dla.experts;
  const Ne = model.info.num_experts ?? 0;
  const topExperts = ex
    ? topIndices(L * Ne, (i) => Math.abs(ex.attribution[Math.floor(i / Ne)][i % Ne]), input.top_k).map((i) => ({
        layer: Math.floor(i / Ne),
        expert: i % Ne,
        weight: finite(ex.weight[Math.floor(i / Ne)][i % Ne]),
        logit_attribution: finite(ex.attribution[Math.floor(i / Ne)][i % Ne]),
      }))
    : undefined;
  // a mixture-of-experts model has no neurons of one MLP (its experts are listed instead), but for Gemma 4's dense MLP beside them
  const nNeurons = ex && !besideExperts(model, 0) ? 0 : first[L];
  const neuronValue = (of: ArrayLike<number>[]) => (i: number) => {
    const [l, n] = whereNeuron(i);
    return Math.abs(of[l][n]);
  };
  const topNeurons = topIndices(nNeurons, neuronValue(dla.neuronAttribution), input.top_k).map(neuronAt);
  const topActive = topIndices(nNeurons, neuronValue(dla.neuronActivation), input.top_k).map(neuronAt);
  ctx.onProgress?.({ stage: 'attribution', done: 2, total: 2 });

  return {
    ...documentHead('trace', model, input.prompt, ids),
    convention: input.convention,
    position: pos,
    predicted_token: tokenText(model, predictedId),
    predicted_token_id: predictedId,
    top_predictions: top.map((t) => ({
      token: tokenText(model, t),
      token_id: t,
      logit: finite(row[t]),
      prob: finite(Math.exp(row[t] - lse)),
    })),
    target: {
      kind: dla.targetKind,
      token: tokenText(model, target.tokenId),
      token_id: target.tokenId,
      ...(cfId !== undefined ? { counterfactual_token: tokenText(model, cfId), counterfactual_token_id: cfId } : {}),
    },
    top_heads: topHeads,
    head_attribution: dla.heads.map((r) => r.map(finite)),
    top_neurons: topNeurons,
    top_neurons_by_activation: topActive,
    ...(ex ? { top_experts: topExperts, expert_attribution: ex.attribution.map((r) => r.map(finite)) } : {}),
    decomposition: {
      terms: dla.terms.map((t) => ({ name: t.name, value: finite(t.value) })),
      sum: finite(dla.sum),
      target: finite(dla.target),
    },
    checks: {
      sum_minus_target: finite(dla.sum - dla.target),
      residual_reconstruction_max_abs: finite(dla.checks.residual_reconstruction_max_abs),
      attention_reconstruction_max_abs: finite(dla.checks.attention_reconstruction_max_abs),
    },
    method: describeMethod(model, input.convention, dla.targetKind),
  };
});
