/**
 * Text → token ids for operations, with the checks every operation needs before it runs:
 * an empty prompt, a prompt longer than the context, and answer/target strings that must be
 * exactly one token.
 */
import { z } from 'zod';
import { LoupeError } from '../../engine/errors';
import type { LoadedModel } from '../../engine/api';
import { checkTokenCount } from '../../engine/caps';
import { chatField, type PromptFormat } from '../../schema/common';

/** input fields shared by every prompt-taking operation (spread into an op's input schema) */
export const promptFields = {
  prompt: z
    .string()
    .describe('The text to run. BOS is prepended (TransformerLens prepend_bos) unless prepend_bos is false.'),
  prepend_bos: z.boolean().default(true).describe("Prepend the model's BOS token, as TransformerLens does by default."),
  chat: chatField,
};

/**
 * Chat format, applied by the operation template (ops/types.ts) to every parsed input before the
 * operation runs: when `chat` is true, `prompt` (and `corrupted_prompt`, which must be formatted
 * like the clean prompt it is compared with) become the model's chat rendering, and `prepend_bos`
 * becomes false because the rendering carries BOS itself (engine/chat.ts). The operations then
 * tokenize as usual. Returns what the document records as `prompt_format`, or undefined.
 */
export function applyChatFormat(model: LoadedModel, input: Record<string, unknown>): PromptFormat | undefined {
  if (input.chat !== true) return undefined;
  const user = input.prompt;
  if (typeof user !== 'string' || user.length === 0) {
    throw new LoupeError(
      'BAD_INPUT',
      'chat format needs a prompt to render.',
      'Give prompt (chat format does not apply to token_ids), or leave chat off.',
    );
  }
  const rendered = model.chatPrompt(user, 'prompt');
  input.prompt = rendered;
  if (typeof input.corrupted_prompt === 'string' && input.corrupted_prompt.length > 0)
    input.corrupted_prompt = model.chatPrompt(input.corrupted_prompt, 'corrupted_prompt');
  if ('prepend_bos' in input) input.prepend_bos = false;
  return { chat: true, user_prompt: user, rendered };
}

export interface PromptIdsOptions {
  prependBos?: boolean;
  /** tokens that will still be appended (generation), counted against the context */
  extra?: number;
  /** the input field, named when the text is refused as too long (default 'prompt') */
  field?: string;
}

/** Tokenize a prompt and check it: EMPTY_PROMPT, PROMPT_TOO_LONG. */
export function promptIds(model: LoadedModel, prompt: string, opts: PromptIdsOptions = {}): number[] {
  const prependBos = opts.prependBos ?? true;
  if (prompt.length === 0) {
    throw new LoupeError('EMPTY_PROMPT', 'The prompt is empty.', 'Give at least one character of text.');
  }
  const ids = model.tokenize(prompt, { prependBos, field: opts.field ?? 'prompt' });
  const content =
    prependBos && model.bosTokenId !== undefined && ids[0] === model.bosTokenId ? ids.length - 1 : ids.length;
  if (content <= 0) {
    throw new LoupeError(
      'EMPTY_PROMPT',
      `The prompt ${JSON.stringify(prompt)} tokenizes to no tokens.`,
      'Give text that the tokenizer does not drop entirely.',
    );
  }
  checkTokenCount(model, ids.length, opts.extra ?? 0);
  return ids;
}

/** how a text tokenizes as a word of running text, for hints: [" lo" (#12), "ve" (#40)] */
export function describeTokenization(model: LoadedModel, text: string): string {
  const ids = model.wordIds(text);
  const strs = model.tokenStrings(ids);
  return `[${ids.map((id, i) => `${JSON.stringify(strs[i])} (#${id})`).join(', ')}]`;
}

/**
 * Resolve a token given as text to one id. Accepts '#123' (an id), the exact text of a token,
 * or the text without/with its leading space (' love' and 'love' both find the word-initial
 * token when only one of them is a single token; the exact spelling wins when both are).
 * UNKNOWN_TOKEN when none is a single token, with how the text tokenizes.
 */
export function resolveToken(model: LoadedModel, text: string, field = 'token'): number {
  const m = /^#(\d+)$/.exec(text.trim());
  if (m) {
    const id = Number(m[1]);
    if (id >= model.info.d_vocab) {
      throw new LoupeError(
        'UNKNOWN_TOKEN',
        `${field}: token id ${id} is outside the vocabulary (d_vocab = ${model.info.d_vocab}).`,
        `Use an id between 0 and ${model.info.d_vocab - 1}.`,
      );
    }
    return id;
  }
  if (text.length === 0)
    throw new LoupeError(
      'UNKNOWN_TOKEN',
      `${field} is empty.`,
      'Give the text of one token, e.g. " love", or an id as "#123".',
    );
  const candidates = [text];
  if (text.startsWith(' ')) candidates.push(text.slice(1));
  else candidates.push(' ' + text);
  for (const c of candidates) {
    const id = model.tokenId(c, field);
    if (id !== undefined) return id;
  }
  // the hint names the pieces of the word as running text tokenizes it, and the first of them
  const pieces = model.wordIds(text);
  const first = pieces.length ? model.tokenStrings([pieces[0]])[0] : '';
  throw new LoupeError(
    'UNKNOWN_TOKEN',
    `${field} ${JSON.stringify(text)} is not a single token of this model.`,
    `In running text it tokenizes as ${describeTokenization(model, text)}; give one token's ` +
      `text${pieces.length > 1 ? ` (e.g. its first piece ${JSON.stringify(first)})` : ''} or its id as "#ID".`,
  );
}

/** the display text of one id */
export function tokenText(model: LoadedModel, id: number): string {
  return model.tokenStrings([id])[0];
}

/** the ids with their display texts, as documents list tokens ({ id, text }) */
export function tokenEntries(model: LoadedModel, ids: number[]): { id: number; text: string }[] {
  const texts = model.tokenStrings(ids);
  return ids.map((id, i) => ({ id, text: texts[i] }));
}

/**
 * `n` distinct token ids (BOS and EOS left out) drawn uniformly with `u`, seeded: the random
 * sequences of induction tasks (head_scores, the induction generator), whose repeats must be
 * the task's own and never two equal draws.
 */
export function distinctTokens(model: LoadedModel, n: number, u: () => number): number[] {
  const skip = new Set([model.bosTokenId, model.eosTokenId]);
  const pool = Array.from({ length: model.info.d_vocab }, (_, i) => i).filter((i) => !skip.has(i));
  if (n > pool.length)
    throw new LoupeError(
      'BAD_INPUT',
      `${n} distinct tokens asked for; the vocabulary has ${pool.length}.`,
      'Use a shorter random sequence.',
    );
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const j = i + Math.floor(u() * (pool.length - i)); // partial Fisher–Yates: distinct draws
    [pool[i], pool[j]] = [pool[j], pool[i]];
    out.push(pool[i]);
  }
  return out;
}
