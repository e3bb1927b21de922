/**
 * attribution_patching — AtP (Nanda 2023; Syed et al. 2023; Kramár et al. 2024): a first-order
 * estimate of every activation-patching effect from one forward + backward pass.
 *
 * Metric M = logit[answer] − logit[counterfactual] at the last position, raw logits, the answer
 * defaulting to the clean prediction and the counterfactual to the corrupted one, as in `patch`
 * and `integrated_gradients` (lib/metric.ts). For an activation a, the effect of patching the clean value
 * into the corrupted run is estimated as Σ (a_clean − a_corrupted) · ∂M/∂a, with the gradient
 * taken on the CORRUPTED run (TransformerLens's attribution-patching demo does the same). Heads
 * sum hook_z over positions and d_head; sites sum resid_pre / attn_out / mlp_out over d_model at
 * one position. A validation block patches the top estimates for real (the engine's patch
 * interventions, as the `patch` operation does) so the linear approximation can be judged — or,
 * where that is cheap (at most AUTO_ALL_VARIANTS patches), every head and every site, batched.
 */
import { z } from 'zod';
import type { Intervention, RunResult } from '../engine/api';
import { defineOperation } from './types';
import { documentBase, documentHead, tokenEntry, interventionList } from '../schema/common';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { CAPS, checkTopK, finite } from '../engine/caps';
import { corruptedIds, inputIds, logitsAt, runVariants } from './lib/ablation';
import { metricOf, metricSeed, spearman } from './lib/gradients';
import { gapWarnings, givenMetricTokens, metricTokenSchemas, patchingFields, warningsSchema } from './lib/metric';
import { checkOneSource, datasetReport, forEachPair, hasDataset, pairInputOf } from './lib/dataset';
import { DatasetStats, componentStats, statisticsBlock } from './lib/stats';
import type { LoadedModel } from '../engine/api';
import type { OpContext } from './types';
import { tokenEntries } from './lib/tokens';

/**
 * Actual effects at or below this (nats) count in no sign agreement: they are differences of two float32
 * metrics, at the resolution of the logits (~1e-6 at |logit| ~10), and their signs differ between
 * backends that agree on every number within 1e-4.
 */
const SIGN_FLOOR = 1e-4;

const SITE_KINDS = ['resid_pre', 'attn_out', 'mlp_out'] as const;

/** validate every head and site by default when that is at most this many patched variants */
export const AUTO_ALL_VARIANTS = 512;

export const attributionPatchingInput = z.object({
  ...patchingFields({ corrupted: 'the gradient is taken on its run' }),
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
      'With validate_scope "top": patch this many top heads and top sites (by |estimate|) ' +
        'for real and report estimate beside actual effect; 0 = no validation.',
    ),
  validate_scope: z
    .enum(['auto', 'all', 'top'])
    .default('auto')
    .describe(
      'Which estimates to patch for real: all = every head and every site (batched), top = the top ' +
        `\`validate\` of each, auto = all when that is at most ${AUTO_ALL_VARIANTS} patched variants, else top.`,
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
  answer: metricTokenSchemas.answer,
  counterfactual: metricTokenSchemas.counterfactual,
  metric: z.object({
    name: z.literal('logit_difference'),
    clean: z.number().describe('M on the clean run'),
    corrupted: z.number().describe('M on the corrupted run'),
  }),
  warnings: warningsSchema,
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
  experts: z
    .array(z.object({ layer: z.number().int(), expert: z.number().int(), estimate: z.number() }))
    .optional()
    .describe(
      'mixture-of-experts models: every layer × expert, Σ over positions and d_model of (out_clean − out_corrupted) · ∂M/∂out ' +
        'of its weighted output mlp.experts.{e}.hook_out (corrupted run)',
    ),
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
      scope: z.enum(['all', 'top']).describe('every head and site patched, or the top estimates of each'),
      rank_correlation: z.object({
        heads: z
          .number()
          .nullable()
          .describe('Spearman ρ of estimate vs actual over the validated heads (null below 3)'),
        sites: z.number().nullable(),
      }),
      sign_agreement: z
        .object({ heads: z.number().nullable(), sites: z.number().nullable() })
        .describe(
          `fraction of the validated estimates with the sign of the actual effect (|actual| > ${SIGN_FLOOR}; null when none)`,
        ),
    })
    .nullable(),
  interventions: interventionList.describe(
    "the validation block's real patches, one per variant (none without validation)",
  ),
  n_engine_runs: z.number().int(),
  dataset: datasetReport.optional().describe('dataset mode: the pairs (heads and sites are then means over them)'),
  statistics: statisticsBlock
    .extend({
      components: z.array(
        componentStats.extend({
          kind: z.enum(['head', 'site']),
          layer: z.number().int(),
          head: z.number().int().nullable(),
          hook: z.string().nullable(),
          position: z.number().int().nullable(),
        }),
      ),
    })
    .optional()
    .describe(
      'dataset mode: each head’s and site’s mean estimate, per-pair values, bootstrap 95% CI, sign-flip p-value',
    ),
});

export const operation = defineOperation({
  name: 'attribution_patching',
  title: 'Attribution patching',
  description:
    'Attribution patching (AtP): estimates the effect of patching every head (hook_z), ' +
    'every residual/attention/MLP site × position (and optionally every MLP neuron) from the clean prompt into ' +
    'the corrupted one, as Σ (a_clean − a_corrupted) · ∂M/∂a with the gradient from ONE backward pass on the ' +
    'corrupted run. M = logit[answer] − logit[counterfactual] at the last position in raw logits (answer ' +
    'default the clean prediction, counterfactual default the corrupted prediction, as in patch and ' +
    'integrated_gradients); estimates are in the same units as ΔM. A validation block patches estimates for real: ' +
    `every head and site when that is at most ${AUTO_ALL_VARIANTS} variants (validate_scope auto), ` +
    `else the top \`validate\`. Cost: a clean forward + a corrupted forward-and-backward (~3 forward-equivalents; ` +
    "one more forward for the default counterfactual) plus the validation's patched variants in batched runs. " +
    "Dataset mode (dataset, dataset_text or generate): per pair (validation off), with each head's (and, " +
    "for pairs of one length, each site's) mean estimate, per-pair values, seeded bootstrap 95% CI and " +
    'sign-flip p-value.',
  input: attributionPatchingInput,
  output: attributionPatchingOutput,
  long: true,
}).implement((model, input, ctx) => (hasDataset(input) ? atpDataset(model, input, ctx) : atpPair(model, input, ctx)));

type AtpParsed = z.output<typeof attributionPatchingInput>;
type AtpDoc = z.input<typeof attributionPatchingOutput>;

async function atpPair(model: LoadedModel, input: AtpParsed, ctx: OpContext): Promise<AtpDoc> {
  checkTopK(input.top_k);
  const clean = inputIds(model, input);
  const T = clean.ids.length;
  const corrupted = corruptedIds(model, input, T, {
    needs: 'attribution patching',
    hint: 'Change the corrupted prompt so it tokenizes to the same number of tokens.',
  });
  const given = givenMetricTokens(model, input);
  const { n_layers: L } = model.info;

  // Qwen3.5's linear-attention layers have no heads: their output is a site (hook_attn_out)
  const known = new Set(model.hookNames());
  const hooks: string[] = [];
  for (let l = 0; l < L; l++) {
    if (known.has(`blocks.${l}.attn.hook_z`)) hooks.push(`blocks.${l}.attn.hook_z`);
    hooks.push(...SITE_KINDS.map((k) => `blocks.${l}.hook_${k}`));
    if (input.neurons) hooks.push(`blocks.${l}.mlp.hook_post`);
  }
  const E = model.info.num_experts ?? 0;
  const expertHook = (l: number, e: number) => `blocks.${l}.mlp.experts.${e}.hook_out`;
  for (let l = 0; l < L && E; l++) for (let e = 0; e < E; e++) hooks.push(expertHook(l, e));
  // the axis each hook's products are summed to: hook_z [1, T, H, Dh] per head, the sites [1, T, D]
  // per position, mlp.hook_post [1, T, M] per neuron, an expert's output to one number
  const keep: Record<string, number | null> = Object.fromEntries(
    hooks.map((h) => [
      h,
      h.endsWith('attn.hook_z') || h.endsWith('mlp.hook_post') ? 2 : h.includes('.experts.') ? null : 1,
    ]),
  );
  ctx.onProgress?.({ stage: 'clean forward', done: 0, total: 2 });
  // the clean values stay on the device (where the backend keeps them there): the products are taken
  // there, and the validation patches them in from there
  const cleanRun = await model.run(clean.ids, {
    hooks,
    logitPositions: [T - 1],
    hooksOnDevice: true,
    signal: ctx.signal,
  });
  try {
    return await atpFrom(model, input, ctx, { clean, corrupted, given, hooks, keep, cleanRun });
  } finally {
    for (const t of Object.values(cleanRun.deviceHooks ?? {})) t.release();
  }
}

async function atpFrom(
  model: LoadedModel,
  input: AtpParsed,
  ctx: OpContext,
  p: {
    clean: ReturnType<typeof inputIds>;
    corrupted: ReturnType<typeof corruptedIds>;
    given: ReturnType<typeof givenMetricTokens>;
    hooks: string[];
    keep: Record<string, number | null>;
    cleanRun: RunResult;
  },
): Promise<AtpDoc> {
  const { clean, corrupted, given, hooks, keep, cleanRun } = p;
  const T = clean.ids.length;
  const { n_layers: L, n_heads: H, d_vocab: V } = model.info;
  const E = model.info.num_experts ?? 0;
  const expertHook = (l: number, e: number) => `blocks.${l}.mlp.experts.${e}.hook_out`;
  let runs = 2;
  // the default counterfactual is the corrupted prediction, which the backward seed needs first
  let corrPrediction: ArrayLike<number> = [];
  if (given.counterfactual === undefined) {
    corrPrediction = logitsAt(
      await model.run(corrupted.ids, { hooks: [], logitPositions: [T - 1], lean: true, signal: ctx.signal }),
      0,
    );
    runs++;
  }
  const mt = given.tokens(logitsAt(cleanRun, 0), corrPrediction);
  const a = mt.answer;
  const cfId = mt.counterfactual;
  ctx.onProgress?.({ stage: 'corrupted forward + backward', done: 1, total: 2 });
  // Σ (clean − corrupted) · ∂M/∂a reduced where the values are: only the estimates come back
  const corrRun = await model.run(corrupted.ids, {
    logitPositions: [T - 1],
    grad: { hooks, seed: metricSeed(V, 1, a, cfId) },
    attribution: { against: { ...cleanRun.hooks, ...cleanRun.deviceHooks }, keep },
    // M(corrupted) needs the answer's and the counterfactual's logits only
    reduceLogits: { ids: cfId !== null ? [a, cfId] : [a] },
    signal: ctx.signal,
  });
  ctx.onProgress?.({ stage: 'corrupted forward + backward', done: 2, total: 2 });
  throwIfAborted(ctx.signal);
  const mClean = metricOf(cleanRun.logits.data, a, cfId);
  const mCorr = metricOf(corrRun.logitRows![0].at, 0, cfId !== null ? 1 : null);
  const at = (hook: string) => corrRun.attribution![hook];
  const cleanOf = (hook: string) => cleanRun.deviceHooks?.[hook] ?? cleanRun.hooks[hook];

  const heads: z.infer<typeof headEntry>[] = [];
  const sites: z.infer<typeof siteEntry>[] = [];
  const neuronAll: { layer: number; neuron: number; estimate: number }[] = [];
  for (let l = 0; l < L; l++) {
    // [H], whatever this layer's head width (Gemma 4's full-attention layers are wider); none on a linear-attention layer
    const hz = hooks.includes(`blocks.${l}.attn.hook_z`) ? at(`blocks.${l}.attn.hook_z`) : null;
    for (let h = 0; hz && h < H; h++) heads.push({ layer: l, head: h, estimate: finite(hz[h]) });
    for (const k of SITE_KINDS) {
      const hook = `blocks.${l}.hook_${k}`;
      const per = at(hook); // [T]
      for (let p = 0; p < T; p++) sites.push({ hook, layer: l, position: p, estimate: finite(per[p]) });
    }
    if (input.neurons) {
      // this layer's own width (Gemma 4's double-wide MLPs): the reduction keeps the hook's axis
      const per = at(`blocks.${l}.mlp.hook_post`);
      for (let n = 0; n < per.length; n++) neuronAll.push({ layer: l, neuron: n, estimate: finite(per[n]) });
    }
  }
  const experts = E
    ? Array.from({ length: L * E }, (_, i) => {
        const [layer, expert] = [Math.floor(i / E), i % E];
        return { layer, expert, estimate: finite(at(expertHook(layer, expert))[0]) };
      })
    : undefined;
  const byMagnitude = <X extends { estimate: number }>(xs: X[]) =>
    xs.slice().sort((p, q) => Math.abs(q.estimate) - Math.abs(p.estimate));
  const neurons = input.neurons ? byMagnitude(neuronAll).slice(0, input.top_k) : null;

  let validation: z.output<typeof attributionPatchingOutput>['validation'] = null;
  let patched: Intervention[] = [];
  const scope =
    input.validate_scope === 'auto'
      ? heads.length + sites.length <= AUTO_ALL_VARIANTS
        ? 'all'
        : 'top'
      : input.validate_scope;
  if (input.validate > 0 || input.validate_scope === 'all') {
    const topHeads = scope === 'all' ? heads : byMagnitude(heads).slice(0, input.validate);
    const topSites = scope === 'all' ? sites : byMagnitude(sites).slice(0, input.validate);
    const variants: Intervention[][] = [
      [],
      ...topHeads.map((x): Intervention[] => [
        {
          hook: `blocks.${x.layer}.attn.hook_z`,
          op: 'patch',
          head: x.head,
          positions: 'all',
          source: cleanOf(`blocks.${x.layer}.attn.hook_z`),
        },
      ]),
      ...topSites.map((x): Intervention[] => [
        { hook: x.hook, op: 'patch', positions: [x.position], source: cleanOf(x.hook) },
      ]),
    ];
    patched = variants.flat();
    // each variant's logits reduced to the answer's and the counterfactual's (on the device where the values are)
    const rows = await runVariants(model, corrupted.ids, variants, {
      ctx,
      stage: scope === 'all' ? 'validating every estimate' : 'validating top estimates',
      reduce: { ids: cfId !== null ? [a, cfId] : [a] },
    });
    runs += Math.ceil(variants.length / CAPS.maxBatch);
    const m = (i: number) => metricOf(rows[i].at, 0, cfId !== null ? 1 : null);
    const base = m(0); // the corrupted run in the same batch
    const actual = (i: number) => finite(m(i) - base);
    const vh = topHeads.map((x, i) => ({ ...x, actual: actual(1 + i) }));
    const vs = topSites.map((x, i) => ({ ...x, actual: actual(1 + topHeads.length + i) }));
    const agree = (xs: { estimate: number; actual: number }[]) => {
      const real = xs.filter((x) => Math.abs(x.actual) > SIGN_FLOOR);
      return real.length
        ? real.filter((x) => Math.sign(x.estimate) === Math.sign(x.actual)).length / real.length
        : null;
    };
    validation = {
      heads: vh,
      sites: vs,
      scope,
      sign_agreement: { heads: agree(vh), sites: agree(vs) },
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

  return {
    ...documentHead('attribution_patching', model, clean.prompt, clean.ids),
    method:
      'Attribution patching (AtP): estimate = Σ (a_clean − a_corrupted) · ∂M/∂a, the gradient taken ' +
      "on the corrupted run by the engine's reverse-mode backward graph (one backward pass, float32). " +
      'M = logit[answer] − logit[counterfactual] at the last position, raw logits (answer: ' +
      'the clean prediction unless given; counterfactual: the corrupted prediction unless given, ' +
      'as in patch and integrated_gradients). Heads: hook_z summed over positions and d_head ' +
      '(a linear-attention layer has none; its output is the site hook_attn_out). ' +
      'Sites: hook_resid_pre / hook_attn_out / hook_mlp_out summed over d_model at one position. ' +
      'An estimate is first-order: it approximates the effect of patching that one activation (denoising: ' +
      'clean into corrupted), M_patched − M_corrupted; the validation block reports the real effect of ' +
      `${validation?.scope === 'all' ? 'every head and every site (all patched, batched)' : 'the top estimates'}. ` +
      'Saturated attention and LayerNorm make the approximation weaker (Kramár et al. 2024).',
    corrupted_prompt: corrupted.prompt,
    corrupted_tokens: tokenEntries(model, corrupted.ids),
    answer: mt.refs.answer,
    counterfactual: mt.refs.counterfactual,
    metric: { name: 'logit_difference' as const, clean: finite(mClean), corrupted: finite(mCorr) },
    warnings: gapWarnings(mClean, mCorr),
    heads,
    sites,
    neurons,
    ...(experts ? { experts } : {}),
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
}

/**
 * Dataset mode: atpPair on every pair (validation off: it patches each pair's own top estimates),
 * then each head's and site's mean estimate with its per-pair values, CI and p-value. Sites need
 * pairs of one token length (positions must line up); otherwise only heads get statistics.
 */
async function atpDataset(model: LoadedModel, input: AtpParsed, ctx: OpContext): Promise<AtpDoc> {
  checkOneSource(input, ['prompt', 'token_ids', 'corrupted_prompt', 'corrupted_token_ids', 'answer', 'counterfactual']);
  const { dataset, docs } = await forEachPair(model, input, ctx, (ex, c) =>
    atpPair(
      model,
      {
        ...input,
        ...pairInputOf(ex),
        prompt: '',
        corrupted_prompt: '',
        validate: 0,
        validate_scope: 'top',
        neurons: false,
      },
      c,
    ),
  );
  const stats = new DatasetStats(docs.length, input.bootstrap_seed);
  const oneLength = new Set(dataset.examples.map((e) => e.clean.length)).size === 1;
  const components: NonNullable<AtpDoc['statistics']>['components'] = [];
  const first = docs[0];
  const heads = first.heads.map((h, i) => {
    const st = stats.of(
      docs.map((d) => d.heads[i].estimate),
      true,
    );
    components.push({ kind: 'head', layer: h.layer, head: h.head, hook: null, position: null, ...st });
    return { ...h, estimate: st.mean };
  });
  const sites = oneLength
    ? first.sites.map((x, i) => {
        const st = stats.of(
          docs.map((d) => d.sites[i].estimate),
          true,
        );
        components.push({ kind: 'site', layer: x.layer, head: null, hook: x.hook, position: x.position, ...st });
        return { ...x, estimate: st.mean };
      })
    : [];
  const meanOf = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  return {
    ...first,
    method:
      `Dataset mode over ${docs.length} pairs: each pair estimated as the single-pair form does (validation off); ` +
      `heads${oneLength ? ' and sites' : ''} carry the mean estimate, statistics the per-pair values, ` +
      'bootstrap CI and sign-flip ' +
      `p-value${oneLength ? '' : ' (no sites: the pairs differ in token length, so positions do not line up)'}. ` +
      `Tokens and answer shown are the first pair's. ${first.method}`,
    metric: {
      ...first.metric,
      clean: finite(meanOf(docs.map((d) => d.metric.clean))),
      corrupted: finite(meanOf(docs.map((d) => d.metric.corrupted))),
    },
    warnings: gapWarnings(meanOf(docs.map((d) => d.metric.clean)), meanOf(docs.map((d) => d.metric.corrupted))),
    heads,
    sites,
    neurons: null,
    validation: null,
    interventions: [],
    n_engine_runs: docs.reduce((s, d) => s + d.n_engine_runs, 0),
    dataset: dataset.report,
    statistics: stats.table(components),
  };
}
