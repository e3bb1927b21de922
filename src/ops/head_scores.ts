/**
 * `head_scores` (after TransformerLens's head detector): every head's previous-token, induction
 * and duplicate-token score on repeated random token sequences, and optionally on the user's prompt.
 *
 * Sequences: [BOS] + R + R, with R = seq_len distinct tokens drawn uniformly (seeded) from the
 * vocabulary without BOS/EOS; `batch` such sequences run as rows of batched engine runs.
 * Scores, from the attention pattern A (blocks.{l}.attn.hook_pattern, row = query q):
 *   previous_token  = mean over q ≥ 1 of A[q, q−1]
 *   duplicate_token = mean over q with an earlier occurrence of its token of Σ_{k<q, t_k = t_q} A[q, k]
 *   induction       = mean over q with an earlier occurrence of its token of Σ_{k<q−1, t_k = t_q} A[q, k+1]
 *                     (the token after each earlier occurrence)
 * On [BOS] + R + R these are the textbook definitions (induction and duplicate-token are averaged
 * over the second copy, where they are defined). TransformerLens's detector divides the same
 * masses by every query row, so its induction and duplicate scores on such sequences are about
 * half of these; ours average only the rows where the pattern can occur. Then averaged over the batch.
 */
import { z } from 'zod';
import { defineOperation } from './types';
import { chatField, documentBase, documentHead } from '../schema/common';
import type { LoadedModel } from '../engine/api';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { CAPS, finite } from '../engine/caps';
import { distinctTokens, promptIds } from './lib/tokens';
import { rng } from './lib/math';
import { requireHeads } from './lib/dla';

export const SCORES = ['previous_token', 'induction', 'duplicate_token'] as const;
export type ScoreName = (typeof SCORES)[number];
/** most sequences one call may score */
export const MAX_BATCH = 256;
/** patterns of the example sequence are included when L·H·T² is at most this */
const MAX_PATTERN_NUMBERS = 1_000_000;

const input = z.object({
  seq_len: z
    .number()
    .int()
    .min(2)
    .optional()
    .describe('length of R in [BOS] + R + R (default: 30, or what fits the context)'),
  batch: z.number().int().min(1).max(MAX_BATCH).default(16).describe('random sequences to average over'),
  seed: z.number().int().default(0).describe('seed of the random sequences'),
  prompt: z.string().optional().describe('also score every head on this text'),
  prepend_bos: z
    .boolean()
    .default(true)
    .describe('prepend BOS to the prompt (the random sequences always start with BOS when the model has one)'),
  chat: chatField,
});
export type HeadScoresInput = z.input<typeof input>;

const topList = z.array(z.object({ layer: z.number().int(), head: z.number().int(), score: z.number() }));
const headRow = z.object({
  layer: z.number().int(),
  head: z.number().int(),
  previous_token: z.number(),
  induction: z.number(),
  duplicate_token: z.number(),
});
const output = documentBase('head_scores').extend({
  method: z.object({
    sequences: z.string(),
    seq_len: z.number().int(),
    batch: z.number().int(),
    seed: z.number().int(),
    definitions: z.object({ previous_token: z.string(), induction: z.string(), duplicate_token: z.string() }),
    reference: z.string(),
  }),
  heads: z.array(headRow).describe('every head in (layer, head) order, scores on the random repeated sequences'),
  top: z
    .object({ previous_token: topList, induction: topList, duplicate_token: topList })
    .describe('the 5 heads with the highest score of each kind'),
  example: z.object({
    token_ids: z.array(z.number().int()),
    tokens: z.array(z.string()),
    patterns: z
      .array(z.array(z.array(z.array(z.number()))))
      .nullable()
      .describe('[layer][head][q][k] on the first random sequence; null when L·H·T² exceeds 1e6'),
  }),
  prompt_scores: z
    .object({
      heads: z.array(headRow),
      patterns: z
        .array(z.array(z.array(z.array(z.number()))))
        .nullable()
        .describe('[layer][head][q][k] on the prompt; null when L·H·T² exceeds 1e6'),
    })
    .nullable()
    .describe('the same scores on the prompt (null without a prompt)'),
  engine_runs: z.number().int(),
});

type Sums = Float64Array; // [L·H·3]: previous, induction, duplicate

/** Add one sequence's scores (pattern data of one batch row) to `acc`. */
function scoreRow(acc: Sums, patterns: Float32Array[], row: number, ids: number[], L: number, H: number): void {
  const T = ids.length;
  // positions of earlier occurrences, per query
  const dup: number[][] = ids.map((t, q) => {
    const ks: number[] = [];
    for (let k = 0; k < q; k++) if (ids[k] === t) ks.push(k);
    return ks;
  });
  const qDup = dup.map((ks, q) => (ks.length ? q : -1)).filter((q) => q >= 0);
  const qInd = dup.map((ks, q) => (ks.some((k) => k + 1 < q) ? q : -1)).filter((q) => q >= 0);
  for (let l = 0; l < L; l++) {
    const A = patterns[l];
    for (let h = 0; h < H; h++) {
      const base = (row * H + h) * T * T;
      let prev = 0;
      for (let q = 1; q < T; q++) prev += A[base + q * T + q - 1];
      let ind = 0;
      for (const q of qInd) for (const k of dup[q]) if (k + 1 < q) ind += A[base + q * T + k + 1];
      let du = 0;
      for (const q of qDup) for (const k of dup[q]) du += A[base + q * T + k];
      const o = (l * H + h) * 3;
      acc[o] += T > 1 ? prev / (T - 1) : 0;
      acc[o + 1] += qInd.length ? ind / qInd.length : 0;
      acc[o + 2] += qDup.length ? du / qDup.length : 0;
    }
  }
}

function patternsOf(patterns: Float32Array[], row: number, T: number, H: number): number[][][][] {
  return patterns.map((A) =>
    Array.from({ length: H }, (_, h) =>
      Array.from({ length: T }, (_, q) =>
        Array.from(A.subarray(((row * H + h) * T + q) * T, ((row * H + h) * T + q + 1) * T), finite),
      ),
    ),
  );
}

function rows(acc: Sums, n: number, L: number, H: number): z.infer<typeof headRow>[] {
  const out: z.infer<typeof headRow>[] = [];
  for (let l = 0; l < L; l++)
    for (let h = 0; h < H; h++) {
      const o = (l * H + h) * 3;
      out.push({
        layer: l,
        head: h,
        previous_token: finite(acc[o] / n),
        induction: finite(acc[o + 1] / n),
        duplicate_token: finite(acc[o + 2] / n),
      });
    }
  return out;
}

export const operation = defineOperation({
  name: 'head_scores',
  title: 'Head scores',
  description:
    "Head detector (after TransformerLens): every head's previous_token, " +
    'induction and duplicate_token score (mean attention mass, 0–1) on `batch` sequences ' +
    '[BOS] + R + R of seq_len distinct random tokens (seeded), and optionally on a prompt. ' +
    'previous_token = mean A[q, q−1]; duplicate_token = mean over repeated tokens of the mass on their earlier ' +
    'occurrences; induction = mean over repeated tokens of the mass on the token after each earlier occurrence. ' +
    'Sequences run as rows of batched engine runs (patterns only). Returns heads: ' +
    '[{layer, head, previous_token, induction, duplicate_token}], the top 5 per score, ' +
    `and the example sequence's patterns for the grid view. Cap: ${MAX_BATCH} sequences.`,
  input,
  output,
  long: true,
}).implement(async (model, inp, ctx) => {
  const { n_layers: L, n_heads: H } = model.info;
  // the scores are a dense layer × head grid: a layer without heads (linear attention) is refused, named
  for (let l = 0; l < L; l++) requireHeads(model, l, 'a head score');
  const bos = model.bosTokenId;
  const lead = bos !== undefined ? 1 : 0;
  const fit = Math.floor((Math.min(model.info.n_ctx, CAPS.maxTokens) - lead) / 2);
  const seqLen = inp.seq_len ?? Math.min(30, fit);
  if (seqLen > fit) {
    throw new LoupeError(
      'BAD_INPUT',
      `seq_len = ${seqLen} needs ${lead + 2 * seqLen} tokens; the model's context holds ${model.info.n_ctx}.`,
      `Use seq_len ≤ ${fit}.`,
    );
  }
  if (seqLen > model.info.d_vocab - 2)
    throw new LoupeError(
      'BAD_INPUT',
      `seq_len = ${seqLen} exceeds the vocabulary's ${model.info.d_vocab - 2} ordinary tokens.`,
      'Use a shorter seq_len.',
    );
  if (seqLen < 2)
    throw new LoupeError('BAD_INPUT', `The model's context (${model.info.n_ctx}) is too short for repeated sequences.`);
  const promptTokens = inp.prompt !== undefined ? promptIds(model, inp.prompt, { prependBos: inp.prepend_bos }) : null;

  const u = rng(inp.seed);
  const seqs = Array.from({ length: inp.batch }, () => {
    const r = distinctTokens(model, seqLen, u);
    return [...(bos !== undefined ? [bos] : []), ...r, ...r];
  });
  const T = seqs[0].length;
  const hooks = Array.from({ length: L }, (_, l) => `blocks.${l}.attn.hook_pattern`);
  // rows per run: at most ~64 MiB of patterns
  const per = Math.max(1, Math.min(CAPS.maxBatch, Math.floor((64 << 20) / (L * H * T * T * 4))));
  const acc: Sums = new Float64Array(L * H * 3);
  let runs = 0;
  let example: number[][][][] | null = null;
  const withPatterns = L * H * T * T <= MAX_PATTERN_NUMBERS;
  for (let s = 0; s < seqs.length; s += per) {
    throwIfAborted(ctx.signal);
    const chunk = seqs.slice(s, s + per);
    const res = await model.run(chunk.length > 1 ? chunk : chunk[0], {
      hooks,
      lean: true,
      logitPositions: [T - 1],
      signal: ctx.signal,
    });
    runs++;
    const pats = hooks.map((k) => res.hooks[k].data as Float32Array);
    chunk.forEach((ids, r) => scoreRow(acc, pats, r, ids, L, H));
    if (s === 0 && withPatterns) example = patternsOf(pats, 0, T, H);
    ctx.onProgress?.({
      stage: 'scoring heads on repeated random sequences',
      done: Math.min(s + per, seqs.length),
      total: seqs.length,
    });
  }
  const heads = rows(acc, seqs.length, L, H);

  let promptScores: z.output<typeof output>['prompt_scores'] = null;
  if (promptTokens) {
    throwIfAborted(ctx.signal);
    const P = promptTokens.length;
    const res = await model.run(promptTokens, { hooks, lean: true, logitPositions: [P - 1], signal: ctx.signal });
    runs++;
    const pats = hooks.map((k) => res.hooks[k].data as Float32Array);
    const a: Sums = new Float64Array(L * H * 3);
    scoreRow(a, pats, 0, promptTokens, L, H);
    promptScores = {
      heads: rows(a, 1, L, H),
      patterns: L * H * P * P <= MAX_PATTERN_NUMBERS ? patternsOf(pats, 0, P, H) : null,
    };
  }
  const top = Object.fromEntries(
    SCORES.map((s) => [
      s,
      [...heads]
        .sort((a, b) => b[s] - a[s] || a.layer - b.layer || a.head - b.head)
        .slice(0, 5)
        .map((h) => ({ layer: h.layer, head: h.head, score: h[s] })),
    ]),
  ) as z.output<typeof output>['top'];
  const ex = seqs[0];
  const head = promptTokens
    ? documentHead('head_scores', model, inp.prompt!, promptTokens)
    : documentHead('head_scores', model, '', []);
  return {
    ...head,
    method: {
      sequences:
        `${inp.batch} sequences ${bos !== undefined ? '[BOS] + ' : ''}R + R, ` +
        `R = ${seqLen} distinct tokens drawn uniformly (seed ${inp.seed}) ` +
        'from the vocabulary without BOS/EOS; attention patterns from blocks.{l}.attn.hook_pattern',
      seq_len: seqLen,
      batch: inp.batch,
      seed: inp.seed,
      definitions: {
        previous_token: 'mean over queries q ≥ 1 of A[q, q−1]',
        induction:
          'mean over queries whose token occurred before (at k < q−1) of Σ A[q, k+1]: the mass on the token after each earlier occurrence',
        duplicate_token: 'mean over queries whose token occurred before of Σ A[q, k] over those earlier occurrences k',
      },
      reference:
        'TransformerLens head detector (previous_token_head, induction_head, ' +
        'duplicate_token_head); TL divides by every query row, so its induction ' +
        'and duplicate-token scores on these sequences are about half of these',
    },
    heads,
    top,
    example: { token_ids: ex, tokens: model.tokenStrings(ex), patterns: example },
    prompt_scores: promptScores,
    engine_runs: runs,
  };
});
