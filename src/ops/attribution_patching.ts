/**
 * attribution_patching — AtP (Nanda 2023; Syed et al. 2023; Kramár et al. 2024): a first-order
 * estimate of every activation-patching effect from one forward + backward pass.
 *
 * Metric M = logit[answer] − logit[counterfactual] at the last position, raw logits (logit[answer]
 * alone without a counterfactual). For an activation a, the effect of patching the clean value
 * into the corrupted run is estimated as Σ (a_clean − a_corrupted) · ∂M/∂a, with the gradient
 * taken on the CORRUPTED run (TransformerLens's attribution-patching demo does the same). Heads
 * sum hook_z over positions and d_head; sites sum resid_pre / attn_out / mlp_out over d_model at
 * one position. A validation block patches the top estimates for real (the engine's patch
 * interventions, as the `patch` operation does) so the linear approximation can be judged.
 */
import { z } from 'zod';
import type { Intervention } from '../engine/api';
import type { Tensor } from '../engine/tensor';
import { defineOperation } from './types';
import { documentBase, documentHead, tokenEntry, interventionList } from '../schema/common';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { checkTopK, finite } from '../engine/caps';
import { argmax } from './lib/math';
import { inputIds, logitsAt, cleanCorruptedFields, resolveAnswer, runVariants } from './lib/ablation';
import { metricOf, metricSeed, metricTokens, spearman, tokenRef } from './lib/gradients';
import { tokenText } from './lib/tokens';

const SITE_KINDS = ['resid_pre', 'attn_out', 'mlp_out'] as const;

export const attributionPatchingInput = z.object({
  ...cleanCorruptedFields({ corrupted: 'the gradient is taken on its run' }),
  counterfactual: z
    .string()
    .optional()
    .describe('Token (text or "#id") whose logit counts negatively; without it the metric is logit[answer] alone.'),
  neurons: z
    .boolean()
    .default(false)
    .describe('Also estimate every MLP neuron (mlp.hook_post, summed over positions) and return the top_k.'),
  top_k: z.number().int().min(1).default(20).describe('Length of the neuron list.'),
  validate: z
    .number()
    .int()
    .min(0)
    .max(64)
    .default(8)
    .describe(
      'Patch this many top heads and top sites (by |estimate|) for real and report estimate beside actual effect; 0 = no validation.',
    ),
});
export type AttributionPatchingInput = z.input<typeof attributionPatchingInput>;

const headEntry = z.object({ layer: z.number().int(), head: z.number().int(), estimate: z.number() });
const siteEntry = z.object({
  hook: z.string(),
  layer: z.number().int(),
  position: z.number().int(),
  estimate: z.number(),
});

export const attributionPatchingOutput = documentBase('attribution_patching').extend({
  method: z.string().describe('exactly what was computed'),
  corrupted_prompt: z.string(),
  corrupted_tokens: z.array(tokenEntry),
  ...metricTokens.shape,
  metric: z.object({
    name: z.enum(['logit_difference', 'logit']),
    clean: z.number().describe('M on the clean run'),
    corrupted: z.number().describe('M on the corrupted run'),
  }),
  heads: z
    .array(headEntry)
    .describe(
      'every layer × head: Σ over positions and d_head of (z_clean − z_corrupted) · ∂M/∂z (hook_z, corrupted run)',
    ),
  sites: z
    .array(siteEntry)
    .describe(
      'every blocks.{l}.hook_resid_pre / hook_attn_out / hook_mlp_out × position: Σ over d_model of (a_clean − a_corrupted) · ∂M/∂a',
    ),
  neurons: z
    .array(z.object({ layer: z.number().int(), neuron: z.number().int(), estimate: z.number() }))
    .nullable()
    .describe('top_k neurons by |estimate| (mlp.hook_post summed over positions), or null'),
  validation: z
    .object({
      heads: z.array(
        headEntry.extend({
          actual: z.number().describe('M(corrupted with this clean head patched at every position) − M(corrupted)'),
        }),
      ),
      sites: z.array(
        siteEntry.extend({
          actual: z.number().describe('M(corrupted with this clean site patched at this position) − M(corrupted)'),
        }),
      ),
      rank_correlation: z.object({
        heads: z
          .number()
          .nullable()
          .describe('Spearman ρ of estimate vs actual over the validated heads (null below 3)'),
        sites: z.number().nullable(),
      }),
    })
    .nullable(),
  interventions: interventionList.describe(
    "the validation block's real patches, one per variant (none without validation)",
  ),
  n_engine_runs: z.number().int(),
});

/** Σ over a slice of (clean − corrupted) · grad */
function attribution(
  clean: Tensor,
  corr: Tensor,
  grad: Tensor,
  indices: (i: number) => number,
  nOut: number,
): Float64Array {
  const out = new Float64Array(nOut);
  const c = clean.data,
    k = corr.data,
    g = grad.data;
  for (let i = 0; i < g.length; i++) out[indices(i)] += (c[i] - k[i]) * g[i];
  return out;
}

export const operation = defineOperation({
  name: 'attribution_patching',
  title: 'Attribution patching',
  description:
    'Attribution patching (AtP): estimates the effect of patching every head (hook_z), every residual/attention/MLP site × position (and optionally every MLP neuron) from the clean prompt into the corrupted one, as Σ (a_clean − a_corrupted) · ∂M/∂a with the gradient from ONE backward pass on the corrupted run. M = logit[answer] − logit[counterfactual] at the last position in raw logits (logit[answer] alone without a counterfactual); estimates are in the same units as ΔM. A validation block patches the top estimates for real. Cost: a clean forward + a corrupted forward-and-backward (~3 forward-equivalents) plus 2·validate patched variants in one batched run.',
  input: attributionPatchingInput,
  output: attributionPatchingOutput,
  long: true,
}).implement(async (model, input, ctx) => {
  checkTopK(input.top_k);
  const clean = inputIds(model, input);
  const corrupted = inputIds(
    model,
    { prompt: input.corrupted_prompt, prepend_bos: input.prepend_bos, token_ids: input.corrupted_token_ids },
    'corrupted_token_ids',
  );
  const T = clean.ids.length;
  if (corrupted.ids.length !== T) {
    throw new LoupeError(
      'BAD_INPUT',
      `The clean prompt has ${T} tokens and the corrupted prompt ${corrupted.ids.length}; attribution patching needs equal token lengths.`,
      'Change the corrupted prompt so it tokenizes to the same number of tokens.',
    );
  }
  const answerId = resolveAnswer(model, input.answer);
  const cfId = resolveAnswer(model, input.counterfactual, 'counterfactual') ?? null;
  const { n_layers: L, n_heads: H, d_head: Dh, d_model: D, d_mlp: M, d_vocab: V } = model.info;

  const hooks: string[] = [];
  for (let l = 0; l < L; l++) {
    hooks.push(`blocks.${l}.attn.hook_z`, ...SITE_KINDS.map((k) => `blocks.${l}.hook_${k}`));
    if (input.neurons) hooks.push(`blocks.${l}.mlp.hook_post`);
  }
  ctx.onProgress?.({ stage: 'clean forward', done: 0, total: 2 });
  const cleanRun = await model.run(clean.ids, { hooks, logitPositions: [T - 1], signal: ctx.signal });
  const a = answerId ?? argmax(logitsAt(cleanRun, 0));
  if (cfId === a)
    throw new LoupeError(
      'BAD_INPUT',
      `The answer and the counterfactual are the same token (${JSON.stringify(tokenText(model, a))}), so the metric is always 0.`,
      'Give a different counterfactual, or none.',
    );
  ctx.onProgress?.({ stage: 'corrupted forward + backward', done: 1, total: 2 });
  const corrRun = await model.run(corrupted.ids, {
    hooks,
    logitPositions: [T - 1],
    grad: { hooks, seed: metricSeed(V, 1, a, cfId) },
    signal: ctx.signal,
  });
  ctx.onProgress?.({ stage: 'corrupted forward + backward', done: 2, total: 2 });
  throwIfAborted(ctx.signal);
  const mClean = metricOf(cleanRun.logits.data, a, cfId);
  const mCorr = metricOf(corrRun.logits.data, a, cfId);
  const grads = corrRun.grads!;
  const at = (hook: string, idx: (i: number) => number, n: number) =>
    attribution(cleanRun.hooks[hook], corrRun.hooks[hook], grads[hook], idx, n);

  const heads: z.infer<typeof headEntry>[] = [];
  const sites: z.infer<typeof siteEntry>[] = [];
  const neuronAll: { layer: number; neuron: number; estimate: number }[] = [];
  for (let l = 0; l < L; l++) {
    const hz = at(`blocks.${l}.attn.hook_z`, (i) => Math.floor(i / Dh) % H, H); // [1, T, H, Dh]
    for (let h = 0; h < H; h++) heads.push({ layer: l, head: h, estimate: finite(hz[h]) });
    for (const k of SITE_KINDS) {
      const hook = `blocks.${l}.hook_${k}`;
      const per = at(hook, (i) => Math.floor(i / D), T); // [1, T, D]
      for (let p = 0; p < T; p++) sites.push({ hook, layer: l, position: p, estimate: finite(per[p]) });
    }
    if (input.neurons) {
      const per = at(`blocks.${l}.mlp.hook_post`, (i) => i % M, M);
      for (let n = 0; n < M; n++) neuronAll.push({ layer: l, neuron: n, estimate: finite(per[n]) });
    }
  }
  const byMagnitude = <X extends { estimate: number }>(xs: X[]) =>
    xs.slice().sort((p, q) => Math.abs(q.estimate) - Math.abs(p.estimate));
  const neurons = input.neurons ? byMagnitude(neuronAll).slice(0, input.top_k) : null;

  let validation: z.output<typeof attributionPatchingOutput>['validation'] = null;
  let patched: Intervention[] = [];
  let runs = 2;
  if (input.validate > 0) {
    const topHeads = byMagnitude(heads).slice(0, input.validate);
    const topSites = byMagnitude(sites).slice(0, input.validate);
    const variants: Intervention[][] = [
      [],
      ...topHeads.map((x): Intervention[] => [
        {
          hook: `blocks.${x.layer}.attn.hook_z`,
          op: 'patch',
          head: x.head,
          positions: 'all',
          source: cleanRun.hooks[`blocks.${x.layer}.attn.hook_z`],
        },
      ]),
      ...topSites.map((x): Intervention[] => [
        { hook: x.hook, op: 'patch', positions: [x.position], source: cleanRun.hooks[x.hook] },
      ]),
    ];
    patched = variants.flat();
    const logits = await runVariants(model, corrupted.ids, variants, { ctx, stage: 'validating top estimates' });
    runs += Math.ceil(variants.length / 64);
    const base = metricOf(logits[0], a, cfId); // the corrupted run in the same batch
    const actual = (i: number) => finite(metricOf(logits[i], a, cfId) - base);
    const vh = topHeads.map((x, i) => ({ ...x, actual: actual(1 + i) }));
    const vs = topSites.map((x, i) => ({ ...x, actual: actual(1 + topHeads.length + i) }));
    validation = {
      heads: vh,
      sites: vs,
      rank_correlation: {
        heads: spearman(
          vh.map((x) => x.estimate),
          vh.map((x) => x.actual),
        ),
        sites: spearman(
          vs.map((x) => x.estimate),
          vs.map((x) => x.actual),
        ),
      },
    };
  }

  const corrTexts = model.tokenStrings(corrupted.ids);
  return {
    ...documentHead('attribution_patching', model, clean.prompt, clean.ids),
    method:
      "Attribution patching (AtP): estimate = Σ (a_clean − a_corrupted) · ∂M/∂a, the gradient taken on the corrupted run by the engine's reverse-mode backward graph (one backward pass, float32). " +
      'M = logit[answer] − logit[counterfactual] at the last position, raw logits (logit[answer] alone without a counterfactual). Heads: hook_z summed over positions and d_head. Sites: hook_resid_pre / hook_attn_out / hook_mlp_out summed over d_model at one position. ' +
      'An estimate is first-order: it approximates the effect of patching that one activation (denoising: clean into corrupted), M_patched − M_corrupted; the validation block reports the real effect for the top estimates. Saturated attention and LayerNorm make the approximation weaker (Kramár et al. 2024).',
    corrupted_prompt: corrupted.prompt,
    corrupted_tokens: corrupted.ids.map((id, i) => ({ id, text: corrTexts[i] })),
    answer: { ...tokenRef(model, a), source: answerId !== undefined ? 'answer' : 'clean_prediction' },
    counterfactual: cfId !== null ? tokenRef(model, cfId) : null,
    metric: { name: cfId !== null ? 'logit_difference' : 'logit', clean: finite(mClean), corrupted: finite(mCorr) },
    heads,
    sites,
    neurons,
    validation,
    interventions: patched.map(({ hook, op, head, positions }) => ({
      hook,
      op,
      ...(head !== undefined ? { head } : {}),
      positions,
      from: "the clean prompt's run",
    })),
    n_engine_runs: runs,
  };
});
