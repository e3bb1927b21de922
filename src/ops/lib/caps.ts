/**
 * Limits every operation enforces BEFORE any engine run, so a request that cannot finish in a
 * page (or would exhaust the 32-bit WASM heap) fails at once with a clear, fixable error.
 * One place so the CLI, the page and the MCP tools all refuse the same things.
 */
import { LoupeError } from '../../engine/errors';
import type { LoadedModel } from '../../engine/api';

export const CAPS = {
  /** tokens per prompt, whatever the model's context (the model's n_ctx also applies) */
  maxTokens: 2048,
  /** tokens one generate/steer call may add */
  maxNewTokens: 1024,
  /** rows of one batched engine run */
  maxBatch: 64,
  /** entries of a top-k list */
  maxTopK: 1000,
  /** numbers one document may carry in its large arrays (patterns, lens tables) */
  maxDocumentNumbers: 4_000_000,
} as const;

/** prompt length against the model's context and the global cap; `extra` = tokens still to come */
export function checkTokenCount(model: LoadedModel, n: number, extra = 0): void {
  const nCtx = model.info.n_ctx;
  const limit = Math.min(nCtx, CAPS.maxTokens);
  if (n + extra > limit) {
    const which =
      nCtx <= CAPS.maxTokens ? `the model's context (n_ctx = ${nCtx})` : `Loupe's cap of ${CAPS.maxTokens} tokens`;
    const what = extra > 0 ? `${n} prompt tokens + ${extra} new tokens = ${n + extra}` : `${n} tokens`;
    throw new LoupeError(
      'PROMPT_TOO_LONG',
      `${what} exceed ${which}.`,
      extra > 0
        ? `Shorten the prompt or ask for at most ${Math.max(0, limit - n)} new tokens.`
        : `Shorten the prompt to at most ${limit} tokens (BOS included).`,
    );
  }
}

export function checkNewTokens(n: number): void {
  if (!Number.isInteger(n) || n < 0)
    throw new LoupeError('BAD_INPUT', `max_new_tokens must be a non-negative integer (got ${n}).`);
  if (n > CAPS.maxNewTokens)
    throw new LoupeError(
      'TOO_LARGE',
      `max_new_tokens = ${n} exceeds the cap of ${CAPS.maxNewTokens}.`,
      `Ask for at most ${CAPS.maxNewTokens} tokens per call.`,
    );
}

export function checkBatch(n: number): void {
  if (n > CAPS.maxBatch)
    throw new LoupeError(
      'TOO_LARGE',
      `A batch of ${n} rows exceeds the cap of ${CAPS.maxBatch}.`,
      'Split the request into smaller ones.',
    );
}

export function checkTopK(k: number, field = 'top_k'): void {
  if (k > CAPS.maxTopK)
    throw new LoupeError(
      'TOO_LARGE',
      `${field} = ${k} exceeds the cap of ${CAPS.maxTopK}.`,
      `Use ${field} ≤ ${CAPS.maxTopK}.`,
    );
}

/** how many numbers a document would carry; refuse before computing them */
export function checkDocumentSize(numbers: number, what: string, hint: string): void {
  if (numbers > CAPS.maxDocumentNumbers) {
    throw new LoupeError(
      'TOO_LARGE',
      `${what} would return ${numbers.toLocaleString('en-US')} numbers, more than the cap of ${CAPS.maxDocumentNumbers.toLocaleString('en-US')}.`,
      hint,
    );
  }
}

/** a JSON-safe number: documents never carry NaN or ±Infinity (JSON cannot hold them) */
export function finite(x: number): number {
  if (Number.isFinite(x)) return x;
  throw new LoupeError(
    'RUNTIME_ERROR',
    `A non-finite value (${x}) came out of the computation.`,
    'The model produced NaN or infinite activations for this input; try another backend or prompt.',
  );
}
