/**
 * generate: continue a prompt greedily or by seeded sampling, reusing past keys and values
 * (the shared loop in lib/generation.ts), so a document re-runs to the same tokens.
 */
import { z } from 'zod';
import { generationBlock } from '../schema/generation';
import { defineOperation } from './types';
import { documentBase, documentHead } from '../schema/common';
import { LoupeError } from '../engine/errors';
import { checkNewTokens } from '../engine/caps';
import { promptFields, promptIds, tokenEntries } from './lib/tokens';
import { generateTokens } from './lib/generation';

export const generateInput = z.object({
  ...promptFields,
  max_new_tokens: z
    .number()
    .int()
    .min(0)
    .default(32)
    .describe("Tokens to generate at most (prompt + new tokens must fit the model's context)."),
  temperature: z
    .number()
    .min(0)
    .default(0)
    .describe('0 = greedy (argmax); > 0 samples from softmax(logits / temperature).'),
  top_k: z
    .number()
    .int()
    .min(0)
    .optional()
    .describe('Sampling: keep only the k most likely tokens (0 or absent = all).'),
  top_p: z
    .number()
    .gt(0)
    .max(1)
    .optional()
    .describe('Sampling: nucleus, keep the smallest set reaching this probability (absent = 1).'),
  seed: z.number().int().default(0).describe('Seed of the sampler (mulberry32), so sampled runs are reproducible.'),
  stop_at_eos: z
    .boolean()
    .default(true)
    .describe('Stop when the model emits its EOS token (the EOS id is kept in generated_token_ids).'),
});
export type GenerateInput = z.input<typeof generateInput>;

export const generateOutput = documentBase('generate')
  .extend(generationBlock.shape)
  .extend({
    generated_tokens: z.array(z.object({ id: z.number().int(), text: z.string() })),
    sampling: z.object({
      method: z.enum(['greedy', 'sample']),
      temperature: z.number(),
      top_k: z.number().int().nullable(),
      top_p: z.number().nullable(),
      seed: z.number().int(),
    }),
    method: z.string(),
  });

export const operation = defineOperation({
  name: 'generate',
  title: 'Generate',
  description:
    'Continue the prompt: greedy (temperature 0, default) or seeded sampling (temperature, ' +
    'top_k, top_p, seed), stopping at EOS or max_new_tokens. Uses a KV cache (one prompt pass, ' +
    'then one engine run per token). Returns generated_token_ids and generated_text.',
  input: generateInput,
  output: generateOutput,
  long: true,
}).implement(async (model, input, ctx) => {
  checkNewTokens(input.max_new_tokens);
  if (input.temperature === 0 && (input.top_k !== undefined || input.top_p !== undefined)) {
    throw new LoupeError(
      'BAD_INPUT',
      'top_k / top_p only apply when sampling (temperature > 0).',
      'Set temperature > 0, or drop top_k / top_p for greedy decoding.',
    );
  }
  const ids = promptIds(model, input.prompt, { prependBos: input.prepend_bos, extra: input.max_new_tokens });
  const total = input.max_new_tokens;
  ctx.onProgress?.({ stage: 'generating', done: 0, total });
  const res = await generateTokens(model, ids, {
    maxNewTokens: input.max_new_tokens,
    temperature: input.temperature,
    topK: input.top_k,
    topP: input.top_p,
    seed: input.seed,
    stopAtEos: input.stop_at_eos,
    signal: ctx.signal,
    onToken: ({ step }) => ctx.onProgress?.({ stage: 'generating', done: step + 1, total }),
  });
  const sample = input.temperature > 0;
  return {
    ...documentHead('generate', model, input.prompt, ids),
    generated_token_ids: res.ids,
    generated_text: res.text,
    generated_tokens: tokenEntries(model, res.ids),
    stop_reason: res.stop_reason,
    sampling: {
      method: sample ? 'sample' : 'greedy',
      temperature: input.temperature,
      top_k: input.top_k ?? null,
      top_p: input.top_p ?? null,
      seed: input.seed,
    },
    method: sample
      ? 'Seeded sampling from softmax(logits / temperature) after top_k / top_p filtering (mulberry32 generator), with a KV cache.'
      : 'Greedy decoding (argmax of the logits at each step), with a KV cache.',
  };
});
