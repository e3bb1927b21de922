/**
 * The one metric of the causal methods — `patch`, `attribution_patching`, `integrated_gradients`:
 *     M = logit[answer] − logit[counterfactual]   at the last position, raw logits,
 * the answer defaulting to the clean prediction and the counterfactual to the corrupted
 * prediction (every one of them, so their numbers are in one unit and compare). A run reports
 * M(clean) and M(corrupted); raw effects are ΔM in logits, and the normalised recovery of a
 * patched run is (M − M(corrupted)) / (M(clean) − M(corrupted)): 0 = corrupted, 1 = clean.
 * When |M(clean) − M(corrupted)| is small that quotient is unstable, and the documents say so.
 */
import { z } from 'zod';
import type { LoadedModel } from '../../engine/api';
import { LoupeError } from '../../engine/errors';
import { argmax } from './math';
import { resolveToken, tokenText } from './tokens';
import { cleanCorruptedFields } from './ablation';
import { datasetFields } from './dataset';
import { statsFields } from './stats';

/** below this |M(clean) − M(corrupted)| (logits) the normalised recovery is unstable */
export const SMALL_GAP = 1;

export const answerField = z
  .string()
  .optional()
  .describe('Token (text or "#id") whose logit counts positively; default the clean prediction.');
export const counterfactualField = z
  .string()
  .optional()
  .describe(
    'Token (text or "#id") whose logit counts negatively; default the corrupted ' +
      'prediction (the same default in patch, attribution_patching and integrated_gradients).',
  );

/**
 * The input fields patch and attribution_patching share: the clean/corrupted pair (`roles`: what
 * each run is for), dataset mode with its statistics, and the counterfactual.
 */
export function patchingFields(roles: Parameters<typeof cleanCorruptedFields>[0]) {
  return { ...cleanCorruptedFields(roles), ...datasetFields, ...statsFields, counterfactual: counterfactualField };
}

export const metricTokenSchemas = {
  answer: z.object({
    token: z.string(),
    token_id: z.number().int(),
    source: z.enum(['answer', 'clean_prediction']),
  }),
  counterfactual: z.object({
    token: z.string(),
    token_id: z.number().int(),
    source: z.enum(['counterfactual', 'corrupted_prediction']),
  }),
};

export const warningsSchema = z
  .array(z.string())
  .describe('what makes these numbers fragile (e.g. a small gap between M(clean) and M(corrupted))');

export interface MetricTokens {
  answer: number;
  counterfactual: number;
  refs: {
    answer: { token: string; token_id: number; source: 'answer' | 'clean_prediction' };
    counterfactual: { token: string; token_id: number; source: 'counterfactual' | 'corrupted_prediction' };
  };
}

/**
 * the given tokens' ids, checked before any run (UNKNOWN_TOKEN); `tokens` completes them from the
 * runs' predictions (metricTokens)
 */
export function givenMetricTokens(model: LoadedModel, input: { answer?: string; counterfactual?: string }) {
  const given = {
    answer: input.answer !== undefined ? resolveToken(model, input.answer, 'answer') : undefined,
    counterfactual:
      input.counterfactual !== undefined ? resolveToken(model, input.counterfactual, 'counterfactual') : undefined,
  };
  return {
    ...given,
    tokens: (cleanLogits: ArrayLike<number>, corruptedLogits: ArrayLike<number>) =>
      metricTokens(model, given, cleanLogits, corruptedLogits),
  };
}

/** answer and counterfactual: the given ones, else the clean and the corrupted predictions (BAD_INPUT when equal) */
export function metricTokens(
  model: LoadedModel,
  given: { answer?: number; counterfactual?: number },
  cleanLogits: ArrayLike<number>,
  corruptedLogits: ArrayLike<number>,
): MetricTokens {
  const a = given.answer ?? argmax(cleanLogits);
  const c = given.counterfactual ?? argmax(corruptedLogits);
  if (a === c)
    throw new LoupeError(
      'BAD_INPUT',
      `The answer and the counterfactual are the same token (${JSON.stringify(tokenText(model, a))}), so the logit difference is always 0.`,
      'Give answer and counterfactual explicitly (e.g. the clean and the corrupted correct tokens), or a corrupted prompt whose prediction differs.',
    );
  return {
    answer: a,
    counterfactual: c,
    refs: {
      answer: {
        token: tokenText(model, a),
        token_id: a,
        source: given.answer !== undefined ? 'answer' : 'clean_prediction',
      },
      counterfactual: {
        token: tokenText(model, c),
        token_id: c,
        source: given.counterfactual !== undefined ? 'counterfactual' : 'corrupted_prediction',
      },
    },
  };
}

/** a dataset whose values are normalised pair by pair: how many pairs have a gap below SMALL_GAP */
export function smallGapPairs(k: number, n: number): string[] {
  return k
    ? [
        `${k} of ${n} pairs have |M(clean) − M(corrupted)| below ${SMALL_GAP} logit: their normalised ` +
          'values are unstable and can pull the means far; drop them or read the raw ΔM.',
      ]
    : [];
}

/** the warnings of a clean/corrupted pair: a gap below SMALL_GAP */
export function gapWarnings(mClean: number, mCorrupted: number): string[] {
  const gap = mClean - mCorrupted;
  return Math.abs(gap) < SMALL_GAP
    ? [
        `M(clean) − M(corrupted) = ${gap.toFixed(3)} logits, below ${SMALL_GAP}: ` +
          'the normalised recovery divides by this gap and is unstable; read the raw ΔM, ' +
          'or choose a corrupted prompt (or answer/counterfactual) that separates the runs more.',
      ]
    : [];
}
