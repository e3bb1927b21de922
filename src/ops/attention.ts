/**
 * attention: the attention patterns of chosen heads (or all) as [Tq][Tk] arrays for the views,
 * with each destination's entropy and most-attended source.
 */
import { z } from 'zod';
import { defineOperation } from './types';
import { documentBase, documentHead } from '../schema/common';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { checkDocumentSize, finite } from '../engine/caps';
import { inputIds, promptOrIdsFields } from './lib/ablation';
import { isLinearLayer, requireHeads } from './lib/dla';

export const attentionInput = z.object({
  ...promptOrIdsFields,
  heads: z
    .array(z.object({ layer: z.number().int().min(0), head: z.number().int().min(0) }))
    .optional()
    .describe('Heads to return, e.g. [{"layer":1,"head":2}]; default every head (of `layers` when given).'),
  layers: z
    .array(z.number().int().min(0))
    .optional()
    .describe('Return every head of these layers (ignored when heads is given).'),
});
export type AttentionInput = z.input<typeof attentionInput>;

export const attentionOutput = documentBase('attention').extend({
  heads: z.array(
    z.object({
      layer: z.number().int(),
      head: z.number().int(),
      pattern: z
        .array(z.array(z.number()))
        .describe(
          '[Tq][Tk] attention probabilities (row = destination/query, column = source/key; causal, so entries above the diagonal are 0).',
        ),
      entropy: z.array(z.number()).describe('Per destination: −Σ p ln p in nats.'),
      top_source: z
        .array(z.object({ position: z.number().int(), weight: z.number() }))
        .describe('Per destination: the most attended source position and its weight.'),
    }),
  ),
  method: z.string(),
});

export const operation = defineOperation({
  name: 'attention',
  title: 'Attention',
  description:
    'Attention patterns (blocks.{l}.attn.hook_pattern, post-softmax probabilities) of chosen heads or all heads ' +
    'as [Tq][Tk] arrays, with the entropy (nats) and top source position of each destination. One forward pass.',
  input: attentionInput,
  output: attentionOutput,
}).implement(async (model, input, ctx) => {
  const { n_layers: L, n_heads: H } = model.info;
  let sel: { layer: number; head: number }[];
  if (input.heads) sel = input.heads;
  else
    // by default only layers with heads (Qwen3.5's linear-attention layers have no pattern); named layers must have them
    sel = (input.layers ?? Array.from({ length: L }, (_, l) => l).filter((l) => !isLinearLayer(model, l))).flatMap(
      (layer) => Array.from({ length: H }, (_, head) => ({ layer, head })),
    );
  for (const s of sel) {
    if (s.layer >= L || s.head >= H)
      throw new LoupeError(
        'BAD_INPUT',
        `L${s.layer}H${s.head} does not exist (the model has ${L} layers × ${H} heads).`,
        `Use layer 0 … ${L - 1} and head 0 … ${H - 1}.`,
      );
    requireHeads(model, s.layer, 'an attention pattern');
  }
  // one entry per head, in (layer, head) order
  const seen = new Set<string>();
  sel = sel
    .filter((s) => !seen.has(`${s.layer}.${s.head}`) && !!seen.add(`${s.layer}.${s.head}`))
    .sort((a, b) => a.layer - b.layer || a.head - b.head);
  const { ids, prompt } = inputIds(model, input);
  const T = ids.length;
  checkDocumentSize(
    sel.length * T * T,
    `${sel.length} head patterns over ${T} tokens`,
    'Choose fewer heads (heads: [{layer, head}]) or a shorter prompt.',
  );
  const layers = [...new Set(sel.map((s) => s.layer))];

  ctx.onProgress?.({ stage: 'forward pass', done: 0, total: 1 });
  throwIfAborted(ctx.signal);
  // no logits are shown: unembed one position only (all T would cost up to half a forward more)
  const run = await model.run(ids, {
    hooks: layers.map((l) => `blocks.${l}.attn.hook_pattern`),
    logitPositions: [T - 1],
    signal: ctx.signal,
  });
  throwIfAborted(ctx.signal);
  ctx.onProgress?.({ stage: 'forward pass', done: 1, total: 1 });

  const heads = sel.map(({ layer, head }) => {
    const p = run.hooks[`blocks.${layer}.attn.hook_pattern`]; // [1, H, T, T]
    const pattern: number[][] = [];
    const entropy: number[] = [];
    const top: { position: number; weight: number }[] = [];
    for (let q = 0; q < T; q++) {
      const off = (head * T + q) * T;
      const rowVals: number[] = [];
      let ent = 0,
        best = 0,
        bw = -Infinity;
      for (let k = 0; k < T; k++) {
        const v = p.data[off + k];
        rowVals.push(finite(v));
        if (v > 0) ent -= v * Math.log(v);
        if (v > bw) {
          bw = v;
          best = k;
        }
      }
      pattern.push(rowVals);
      entropy.push(finite(ent));
      top.push({ position: best, weight: finite(bw) });
    }
    return { layer, head, pattern, entropy, top_source: top };
  });

  return {
    ...documentHead('attention', model, prompt, ids),
    heads,
    method:
      "Patterns are the engine's hook_pattern (softmax over causal-masked, " +
      'scaled scores; GQA heads share keys but have their own patterns). ' +
      'Entropy uses natural logs; top_source is the first position with the largest weight.',
  };
});
