/**
 * logit_lens: read every layer's residual stream as if it were the last — through the final norm
 * (with the stream's OWN statistics at that layer, not the final ones) and the unembedding
 * (+ the final soft-cap where the model has one) — and report, per layer and position, the top
 * tokens and the probability and rank of the model's final prediction.
 */
import { z } from 'zod';
import { defineOperation } from './types';
import { documentBase, documentHead } from '../schema/common';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { checkTopK, checkDocumentSize, finite } from '../engine/caps';
import { promptFields, promptIds } from './lib/tokens';
import { lensHooks } from '../engine/graph/build-model';

export const logitLensInput = z.object({
  ...promptFields,
  top_k: z.number().int().min(1).default(5).describe('Tokens listed per layer and position.'),
  positions: z
    .union([z.literal('all'), z.array(z.number().int().min(0))])
    .default('all')
    .describe('Positions to read (0-based, BOS included), or "all".'),
});
export type LogitLensInput = z.input<typeof logitLensInput>;

const tokenProb = z.object({ token: z.string(), token_id: z.number().int(), logit: z.number(), prob: z.number() });

export const logitLensOutput = documentBase('logit_lens').extend({
  positions: z.array(z.number().int()),
  final_predictions: z
    .array(z.object({ position: z.number().int(), token: z.string(), token_id: z.number().int(), prob: z.number() }))
    .describe("The model's own prediction (argmax of its logits) at each position read."),
  layers: z.array(
    z.object({
      layer: z
        .number()
        .int()
        .describe('0 … n_layers−1: the input to that layer (resid_pre); n_layers: the final resid_post.'),
      hook: z.string(),
      positions: z.array(
        z.object({
          position: z.number().int(),
          top: z.array(tokenProb),
          final_token_prob: z
            .number()
            .describe("Probability of the model's final prediction at this position under this layer's lens."),
          final_token_rank: z.number().int().describe('Its rank (1 = top).'),
        }),
      ),
    }),
  ),
  method: z.string(),
});

export const operation = defineOperation({
  name: 'logit_lens',
  title: 'Logit lens',
  description:
    'Logit lens: for the input of every layer (blocks.{l}.hook_resid_pre) and the final resid_post, ' +
    "at each position, apply the final norm with the stream's own statistics, the unembedding " +
    'and any final soft-cap; report the top-k tokens (prob) and the probability and rank of ' +
    "the model's final prediction. One forward pass plus one batched unembedding of (n_layers+1)·T " +
    'residual vectors on the same backend (top-k, normaliser and ranks reduced there; on WebGPU ' +
    'inside the forward graph, so the streams never leave the GPU).',
  input: logitLensInput,
  output: logitLensOutput,
}).implement(async (model, input, ctx) => {
  checkTopK(input.top_k);
  const { n_layers: L, d_vocab: V } = model.info;
  const ids = promptIds(model, input.prompt, { prependBos: input.prepend_bos });
  const T = ids.length;
  const positions =
    input.positions === 'all'
      ? Array.from({ length: T }, (_, p) => p)
      : [...new Set(input.positions)].sort((a, b) => a - b);
  for (const p of positions)
    if (p >= T)
      throw new LoupeError(
        'BAD_INPUT',
        `position ${p} is outside the prompt (${T} tokens).`,
        `Use positions 0 … ${T - 1}.`,
      );
  checkDocumentSize(
    (L + 1) * positions.length * (input.top_k * 4 + 3),
    'The logit lens',
    'Use a smaller top_k or fewer positions.',
  );

  const hooks = lensHooks(L);
  ctx.onProgress?.({ stage: 'forward pass', done: 0, total: 2 });
  throwIfAborted(ctx.signal);
  // every (layer, position) stream through ln_final + W_U, reduced to the top-k, the log-normaliser
  // and the final prediction's logit and rank where the streams are (on the device in the forward
  // graph on WebGPU; else in the lens session). The model's own prediction is the lens of
  // the final stream, so no logits are read.
  const P = positions.length;
  const run = await model.run(ids, {
    lens: { positions, k: Math.min(input.top_k, V) },
    logitPositions: [T - 1],
    pick: { logits: false },
    signal: ctx.signal,
  });
  const lens = run.lens!;
  throwIfAborted(ctx.signal);
  ctx.onProgress?.({ stage: 'projecting layers', done: 1, total: 2 });
  const text = (id: number) => model.tokenStrings([id])[0];
  const k = lens.k;
  const prob = (logit: number, j: number) => finite(Math.exp(logit - lens.logSumExp[j]));

  const finals = positions.map((p, i) => {
    const id = lens.finalIds[i];
    return { position: p, token: text(id), token_id: id, prob: prob(lens.finalLogit[L * P + i], L * P + i) };
  });
  const layers: z.output<typeof logitLensOutput>['layers'] = hooks.map((hook, l) => ({
    layer: l,
    hook,
    positions: positions.map((p, i) => {
      const j = l * P + i;
      return {
        position: p,
        top: Array.from({ length: k }, (_, r) => {
          const id = lens.topIds[j * k + r],
            logit = lens.topLogits[j * k + r];
          return { token: text(id), token_id: id, logit: finite(logit), prob: prob(logit, j) };
        }),
        final_token_prob: prob(lens.finalLogit[j], j),
        final_token_rank: lens.finalAbove[j] + 1,
      };
    }),
  }));
  ctx.onProgress?.({ stage: 'projecting layers', done: 2, total: 2 });

  return {
    ...documentHead('logit_lens', model, input.prompt, ids),
    positions,
    final_predictions: finals,
    layers,
    method:
      'Each stream x is read as ' +
      `${model.info.norm === 'layernorm' ? 'LayerNorm((x − mean x) / sqrt(var x + eps)) ⊙ w + b' : 'RMSNorm x / sqrt(mean x² + eps) ⊙ w'} ` +
      "with ln_final's weights and x's own statistics, then · W_U + " +
      `b_U${model.info.final_softcap ? `, then the final soft-cap ${model.info.final_softcap}·tanh(·/${model.info.final_softcap})` : ''}; ` +
      "probabilities are its softmax. No tuned lens. Layer n_layers (the final resid_post) reproduces the model's " +
      'own output, and its argmax is the final prediction each layer is ranked on.',
  };
});
