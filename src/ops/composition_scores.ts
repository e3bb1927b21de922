/**
 * `composition_scores`: Elhage et al.'s (2021) Q-, K- and V-composition between every pair of
 * heads in different layers, from the weights alone (lib/circuits.ts: TransformerLens's
 * all_composition_scores, on TL's processed weights by default), with each head's ‖QK‖_F and
 * ‖OV‖_F. On a two-layer induction model the previous-token heads (layer 0) K-compose with the
 * induction heads (layer 1).
 */
import { z } from 'zod';
import { defineOperation } from './types';
import { documentHead, documentBase } from '../schema/common';
import { COMPOSITION_MODES, compositionScores, weightReader, type CompositionMode } from './lib/circuits';

/** the full grids are in the document while (L·H)² is at most this */
const MAX_GRID = 65_536;

const input = z.object({
  modes: z
    .array(z.enum(COMPOSITION_MODES))
    .min(1)
    .default(['q', 'k', 'v'])
    .describe('q: the earlier head’s OV feeds the later head’s queries; k: its keys; v: its values'),
  weights: z
    .enum(['processed', 'unprocessed'])
    .default('processed')
    .describe(
      'processed: as TransformerLens’s from_pretrained (fold_ln, centred writing weights), as TL computes them; ' +
        'unprocessed: the stored matrices',
    ),
  top_k: z.number().int().min(1).max(1000).default(10).describe('strongest pairs listed per mode'),
});
export type CompositionScoresInput = z.input<typeof input>;

const headRef = z.object({ layer: z.number().int(), head: z.number().int() });
const pair = z.object({ from: headRef, to: headRef, score: z.number() });

const output = documentBase('composition_scores').extend({
  weights: z.enum(['processed', 'unprocessed']),
  heads: z.array(z.string()).describe('head labels L{layer}H{head}, in the grids’ row and column order'),
  modes: z.array(
    z.object({
      mode: z.enum(COMPOSITION_MODES),
      grid: z
        .array(z.array(z.number()))
        .nullable()
        .describe(`[from head][to head] scores, 0 unless from layer < to layer (null above ${MAX_GRID} cells)`),
      top: z.array(pair).describe('the strongest pairs, highest first'),
    }),
  ),
  circuits: z
    .array(z.object({ layer: z.number().int(), head: z.number().int(), qk_norm: z.number(), ov_norm: z.number() }))
    .describe('each head’s ‖W_Q W_Kᵀ‖_F and ‖W_V W_O‖_F'),
  method: z.string(),
});

export const operation = defineOperation({
  name: 'composition_scores',
  title: 'Composition',
  description:
    'Elhage et al. (2021) composition scores between every pair of attention heads in different layers, from the ' +
    'weights only (no prompt): ‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F) with W_A the earlier head’s OV circuit W_V W_O and W_B ' +
    'the later head’s QK circuit W_Q W_Kᵀ (Q-composition), its transpose (K) or its OV circuit (V), in ' +
    'TransformerLens’s row-vector convention and its processed weights by default (all_composition_scores). Biases ' +
    'are left out. Scores lie in [0, 1]; compare pairs with each other. Also each head’s ‖QK‖_F and ‖OV‖_F. ' +
    'Cost: d_head²·d_model multiply-adds per ' +
    'pair and mode (TOO_LARGE above 6e10).',
  input,
  output,
}).implement(async (model, inp, ctx) => {
  const { n_layers: L, n_heads: H } = model.info;
  const modes = [...new Set(inp.modes)] as CompositionMode[];
  const read = weightReader(model, inp.weights === 'processed');
  const r = await compositionScores(model, read, modes, {
    signal: ctx.signal,
    onProgress: (done, total) => ctx.onProgress?.({ stage: 'composing heads', done, total }),
  });
  const N = L * H;
  const heads = Array.from({ length: N }, (_, i) => `L${Math.floor(i / H)}H${i % H}`);
  const ref = (i: number) => ({ layer: Math.floor(i / H), head: i % H });
  return {
    ...documentHead('composition_scores', model, '', []),
    weights: inp.weights,
    heads,
    modes: modes.map((mode) => {
      const s = r.scores[mode]!;
      const pairs: { from: number; to: number; score: number }[] = [];
      for (let a = 0; a < N; a++)
        for (let b = 0; b < N; b++)
          if (Math.floor(a / H) < Math.floor(b / H)) pairs.push({ from: a, to: b, score: s[a * N + b] });
      pairs.sort((x, y) => y.score - x.score || x.from - y.from || x.to - y.to);
      return {
        mode,
        grid:
          N * N <= MAX_GRID ? Array.from({ length: N }, (_, a) => Array.from(s.subarray(a * N, (a + 1) * N))) : null,
        top: pairs.slice(0, inp.top_k).map((p) => ({ from: ref(p.from), to: ref(p.to), score: p.score })),
      };
    }),
    circuits: heads.map((_, i) => ({ ...ref(i), qk_norm: r.qkNorm[i], ov_norm: r.ovNorm[i] })),
    method:
      `Composition scores on the ${inp.weights} weights: ‖OV_A · W_B‖_F / (‖OV_A‖_F ‖W_B‖_F), OV = W_V W_O, ` +
      'W_B = W_Q W_Kᵀ (q), W_K W_Qᵀ (k) or W_V W_O (v), float64 (lib/circuits.ts).',
  };
});
