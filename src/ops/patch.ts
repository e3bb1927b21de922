/**
 * patch — activation patching with TransformerLens's patching-module semantics (denoising:
 * clean activations patched into the corrupted run; `direction: 'noising'` patches the corrupted
 * run's into the clean run instead). For each cell, one activation of the base run is replaced by
 * the source run's, and the metric
 *     (LD_patched − LD_corrupted) / (LD_clean − LD_corrupted),   LD = logit[answer] − logit[counterfactual]
 * at the last position is reported: 0 = no better than corrupted, 1 = fully clean.
 * Scans (each one batched through the engine's batch dimension):
 *   resid_pre, attn_out, mlp_out   per layer × position (TL get_act_patch_resid_pre / attn_out / mlp_out)
 *   head_out                       per layer × head, all positions (hook_z; TL get_act_patch_attn_head_out_all_pos),
 *                                  every head or only the heads asked for (the page's "patch" on one head)
 *   attn_out_all_pos, mlp_out_all_pos  per layer, every position at once (whole sublayer)
 *   path                           per sender head: path patching (Wang et al. 2022, IOI §3.1) from the
 *                                  sender to the receivers (heads' q/k/v inputs, or the logits)
 *
 * Path patching, with x_orig the base run's prompt and x_new the source's: (1) run both; (2) run
 * x_orig with every head's hook_z frozen to x_orig's except the sender's, set to x_new's (MLPs and
 * norms recomputed), and keep the receivers' hook_q/k/v; (3) run x_orig with only those receiver
 * values patched in, and read the metric (receivers = the logits: (2)'s logits). Written with
 * interventions, not the edge graph's direct edges, because the definition lets the sender's
 * change reach the receivers through the MLPs as well.
 */
import { z } from 'zod';
import type { DeviceTensor, Intervention, LogitReduce, LogitRow, RunResult } from '../engine/api';
import type { Tensor } from '../engine/tensor';
import { defineOperation } from './types';
import { documentBase, documentHead, tokenEntry, interventionList } from '../schema/common';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { CAPS, checkDocumentSize, finite } from '../engine/caps';
import { checkVariants, corruptedIds, inputIds, logitsAt, runVariants } from './lib/ablation';
import { checkOneSource, datasetReport, forEachPair, hasDataset, pairInputOf } from './lib/dataset';
import { DatasetStats, componentStats, statisticsBlock } from './lib/stats';
import type { LoadedModel } from '../engine/api';
import type { OpContext } from './types';
import { tokenEntries } from './lib/tokens';
import { isLinearLayer, requireHeads } from './lib/dla';
import {
  gapWarnings,
  smallGapPairs,
  givenMetricTokens,
  metricTokenSchemas,
  patchingFields,
  warningsSchema,
} from './lib/metric';

const SCANS = ['resid_pre', 'attn_out', 'mlp_out', 'head_out', 'expert_out', 'path'] as const;
const DEFAULT_SCANS = ['resid_pre', 'attn_out', 'mlp_out', 'head_out'] as const;
const headRef = z.object({ layer: z.number().int().min(0), head: z.number().int().min(0) });
type Scan = (typeof SCANS)[number];

export const patchInput = z.object({
  ...patchingFields({ clean: 'its activations are patched in (denoising)' }),
  direction: z
    .enum(['denoising', 'noising'])
    .default('denoising')
    .describe(
      'denoising: clean activations patched into the corrupted run (TransformerLens); ' +
        'noising: corrupted activations patched into the clean run',
    ),
  scans: z
    .array(z.enum(SCANS))
    .min(1)
    .default([...DEFAULT_SCANS])
    .describe(
      'Which scans to run: resid_pre, attn_out, mlp_out (layer × position), head_out (layer × head, all positions), ' +
        'expert_out (mixture-of-experts models: layer × expert, its weighted output at every position; not run unless asked), ' +
        'path (path patching from each sender head to path_receivers; not run unless asked).',
    ),
  path_receivers: z
    .array(
      headRef.extend({
        inputs: z
          .array(z.enum(['q', 'k', 'v']))
          .min(1)
          .default(['q', 'k', 'v']),
      }),
    )
    .min(1)
    .optional()
    .describe(
      'path scan: the receiver heads and which of their inputs (q, k, v) receive the path, e.g. ' +
        '[{"layer":1,"head":0,"inputs":["k"]}]; default the logits (the final residual stream)',
    ),
  path_senders: z
    .array(headRef)
    .min(1)
    .optional()
    .describe('path scan: the sender heads (default every head in a layer below the last receiver’s, or every head)'),
  heads: z
    .array(z.object({ layer: z.number().int().min(0), head: z.number().int().min(0) }))
    .min(1)
    .optional()
    .describe(
      'The head_out scan patches only these heads, e.g. [{"layer":1,"head":2}] (the others are null in head_out); default every head.',
    ),
});
export type PatchInput = z.input<typeof patchInput>;

const grid = z.array(z.array(z.number()));

export const patchOutput = documentBase('patch').extend({
  method: z.string().describe('exactly what was done'),
  metric: z.literal('normalised_logit_difference'),
  corrupted_prompt: z.string(),
  corrupted_tokens: z.array(tokenEntry),
  differing_positions: z.array(z.number().int()).describe('positions where the clean and corrupted tokens differ'),
  answer: metricTokenSchemas.answer,
  counterfactual: metricTokenSchemas.counterfactual,
  clean_logit_diff: z.number().describe('logit[answer] − logit[counterfactual] of the clean run (metric 1)'),
  corrupted_logit_diff: z.number().describe('the same for the corrupted run (metric 0)'),
  resid_pre: grid
    .nullable()
    .describe('[layer][position] metric after patching clean blocks.{l}.hook_resid_pre at one position'),
  attn_out: grid.nullable().describe('[layer][position] the same for hook_attn_out'),
  mlp_out: grid.nullable().describe('[layer][position] the same for hook_mlp_out'),
  head_out: z
    .array(z.array(z.number().nullable()))
    .nullable()
    .describe(
      '[layer][head] metric after patching clean attn.hook_z of one head at every position (null: a head not asked ' +
        "for in `heads`, or a layer without heads: a linear-attention layer's whole output is attn_out_all_pos)",
    ),
  expert_out: z
    .array(z.array(z.number()))
    .nullable()
    .optional()
    .describe(
      "[layer][expert] metric after patching one expert's weighted output (mlp.experts.{e}.hook_out) at every position",
    ),
  attn_out_all_pos: z
    .array(z.number())
    .nullable()
    .describe('[layer] hook_attn_out patched at every position (= all heads of the layer)'),
  mlp_out_all_pos: z.array(z.number()).nullable().describe('[layer] hook_mlp_out patched at every position'),
  direction: z
    .enum(['denoising', 'noising'])
    .optional()
    .describe('which run was patched (documents made before this field existed were denoising)'),
  path: z
    .object({
      receivers: z.string().describe('the receivers, in words'),
      grid: z
        .array(z.array(z.number().nullable()))
        .describe('[layer][head] metric after path patching from that sender (null: not a sender)'),
    })
    .nullable()
    .optional()
    .describe('the path scan (path patching, Wang et al. 2022), or null'),
  interventions: interventionList.describe(
    'one patch per variant, in the order of the scans (each variant ran with exactly one of these)',
  ),
  warnings: warningsSchema,
  n_variants: z.number().int(),
  n_engine_runs: z.number().int(),
  dataset: datasetReport
    .optional()
    .describe(
      'dataset mode: the pairs (the grids above are then means over them; tokens, answer and counterfactual are the first pair’s)',
    ),
  statistics: statisticsBlock
    .extend({
      components: z.array(
        componentStats.extend({
          scan: z.enum(['resid_pre', 'attn_out', 'mlp_out', 'head_out', 'attn_out_all_pos', 'mlp_out_all_pos']),
          layer: z.number().int(),
          index: z
            .number()
            .int()
            .nullable()
            .describe('position (per-position scans) or head (head_out); null for *_all_pos'),
        }),
      ),
    })
    .optional()
    .describe('dataset mode: every cell’s mean, per-pair values, bootstrap 95% CI and sign-flip p-value'),
});

interface Cell {
  scan: Exclude<Scan, 'path'> | 'attn_all' | 'mlp_all';
  layer: number;
  index: number; // position or head (unused for *_all)
  iv: Intervention;
}

export const operation = defineOperation({
  name: 'patch',
  title: 'Patch',
  description:
    'Activation patching (TransformerLens patching module, denoising): clean and corrupted prompts ' +
    'of equal token length; patch the clean activation into the corrupted run at resid_pre, ' +
    "attn_out and mlp_out per layer × position, and each head's output (hook_z) per layer × head at all " +
    'positions. Metric at the last position: normalised logit difference (answer − counterfactual; ' +
    '0 = corrupted, 1 = clean). Returns the heatmaps as arrays and both baselines. Cost: ' +
    '2 runs + (3·n_layers·T + n_layers·n_heads + 2·n_layers) variants in batched runs. Dataset mode (dataset, ' +
    "dataset_text or generate instead of the prompts): the same per pair, with each cell's mean, " +
    'per-pair values, seeded bootstrap 95% CI and sign-flip p-value; per-position scans need pairs of ' +
    'one token length.',
  input: patchInput,
  output: patchOutput,
  long: true,
}).implement((model, input, ctx) =>
  hasDataset(input) ? patchDataset(model, input, ctx) : patchPair(model, input, ctx),
);

type PatchParsed = z.output<typeof patchInput>;
type PatchDoc = z.input<typeof patchOutput>;

/** one clean/corrupted pair: the single-pair form */
async function patchPair(model: LoadedModel, input: PatchParsed, ctx: OpContext): Promise<PatchDoc> {
  const clean = inputIds(model, input);
  // the shared tokenizer check would say "The prompt is empty": name the field that is
  if (!input.corrupted_prompt && !input.corrupted_token_ids) {
    throw new LoupeError(
      'EMPTY_PROMPT',
      'corrupted_prompt is empty.',
      'Give the corrupted prompt: the clean prompt with one token changed, of the same token length (or corrupted_token_ids).',
    );
  }
  const T = clean.ids.length;
  const corrupted = corruptedIds(model, input, T, {
    needs: 'patching',
    hint: 'Change the corrupted prompt so it tokenizes to the same number of tokens (e.g. swap one word for a word that is also one token).',
  });
  const given = givenMetricTokens(model, input);
  const { n_layers: L, n_heads: H } = model.info;
  const scans = new Set<Scan>(input.scans);
  for (const h of input.heads ?? []) {
    if (h.layer >= L || h.head >= H)
      throw new LoupeError(
        'BAD_INPUT',
        `L${h.layer}H${h.head} does not exist (the model has ${L} layers × ${H} heads).`,
        `Use layer 0 … ${L - 1} and head 0 … ${H - 1}.`,
      );
    requireHeads(model, h.layer, 'the head_out scan');
  }
  if (input.heads && !scans.has('head_out')) {
    throw new LoupeError(
      'BAD_INPUT',
      'heads chooses which heads the head_out scan patches, but scans does not include head_out.',
      'Add "head_out" to scans, or leave heads out.',
    );
  }
  // a linear-attention layer (Qwen3.5) has no heads to patch: null in head_out
  const patchHead = (l: number, h: number) =>
    !isLinearLayer(model, l) && (!input.heads || input.heads.some((x) => x.layer === l && x.head === h));
  const path = scans.has('path') ? pathPlan(model, input) : null;
  if (!path && (input.path_receivers || input.path_senders))
    throw new LoupeError(
      'BAD_INPUT',
      'path_receivers and path_senders apply to the path scan, but scans does not include path.',
      'Add "path" to scans, or leave them out.',
    );
  const E = model.info.num_experts ?? 0;
  if (scans.has('expert_out') && !E)
    throw new LoupeError(
      'BAD_INPUT',
      `The expert_out scan needs a mixture-of-experts model; ${model.info.architecture} has no experts.`,
      'Leave "expert_out" out of scans.',
    );
  const nHeads = input.heads
    ? new Set(input.heads.map((x) => `${x.layer}:${x.head}`)).size
    : Array.from({ length: L }, (_, l) => l).filter((l) => !isLinearLayer(model, l)).length * H;
  const nVariants =
    (scans.has('resid_pre') ? L * T : 0) +
    (scans.has('attn_out') ? L * T + L : 0) +
    (scans.has('mlp_out') ? L * T + L : 0) +
    (scans.has('head_out') ? nHeads : 0) +
    (scans.has('expert_out') ? L * E : 0) +
    (path ? 2 * path.senders.length : 0);
  checkVariants(nVariants, 'This patching scan', 'Use a shorter prompt or fewer scans.');
  checkDocumentSize(nVariants, 'This patching scan', 'Use a shorter prompt or fewer scans.');

  const hooks: string[] = [];
  for (let l = 0; l < L; l++) {
    if (scans.has('resid_pre')) hooks.push(`blocks.${l}.hook_resid_pre`);
    if (scans.has('attn_out')) hooks.push(`blocks.${l}.hook_attn_out`);
    if (scans.has('mlp_out')) hooks.push(`blocks.${l}.hook_mlp_out`);
    if (scans.has('expert_out')) for (let e = 0; e < E; e++) hooks.push(`blocks.${l}.mlp.experts.${e}.hook_out`);
    if (scans.has('head_out') && Array.from({ length: H }, (_, h) => patchHead(l, h)).some(Boolean))
      hooks.push(`blocks.${l}.attn.hook_z`);
  }
  const noising = input.direction === 'noising';
  const zHooks = path ? Array.from({ length: L }, (_, l) => `blocks.${l}.attn.hook_z`) : [];
  const srcHooks = [...new Set([...hooks, ...zHooks])];
  ctx.onProgress?.({ stage: 'clean and corrupted runs', done: 0, total: 2 });
  // the metric is read at the last position: its logits only (row 0)
  const last = { logitPositions: [T - 1], signal: ctx.signal };
  // the hooks patched in stay on the device where the backend keeps values there, fed to every batch from there
  const held = { ...last, hooksOnDevice: true };
  const cleanRun = await model.run(clean.ids, { hooks: noising ? zHooks : srcHooks, ...held });
  const corrRun = await model.run(corrupted.ids, { hooks: noising ? srcHooks : zHooks, ...held }).catch((e) => {
    release(cleanRun);
    throw e;
  });
  const releaseBoth = () => [cleanRun, corrRun].forEach(release);
  ctx.onProgress?.({ stage: 'clean and corrupted runs', done: 2, total: 2 });
  const cleanLogits = logitsAt(cleanRun, 0);
  const corrLogits = logitsAt(corrRun, 0);
  const mt = given.tokens(cleanLogits, corrLogits);
  const a = mt.answer;
  const c = mt.counterfactual;
  const ld = (l: ArrayLike<number>) => l[a] - l[c];
  const ldClean = ld(cleanLogits);
  const ldCorr = ld(corrLogits);
  const denom = ldClean - ldCorr;
  if (!(Math.abs(denom) > 1e-6)) {
    releaseBoth();
    throw new LoupeError(
      'BAD_INPUT',
      `The clean and corrupted logit differences are equal (${ldClean.toFixed(6)}), so the normalised metric is undefined.`,
      'Choose a corrupted prompt (or answer/counterfactual) that changes the logit difference.',
    );
  }

  const cells: Cell[] = [];
  const [baseIds, baseRun, srcRun] = noising ? [clean.ids, cleanRun, corrRun] : [corrupted.ids, corrRun, cleanRun];
  const src = (h: string) => hookOf(srcRun, h);
  for (let l = 0; l < L; l++) {
    for (const s of ['resid_pre', 'attn_out', 'mlp_out'] as const) {
      if (!scans.has(s)) continue;
      const hook = `blocks.${l}.hook_${s}`;
      for (let p = 0; p < T; p++)
        cells.push({ scan: s, layer: l, index: p, iv: { hook, op: 'patch', positions: [p], source: src(hook) } });
      if (s !== 'resid_pre')
        cells.push({
          scan: s === 'attn_out' ? 'attn_all' : 'mlp_all',
          layer: l,
          index: -1,
          iv: { hook, op: 'patch', positions: 'all', source: src(hook) },
        });
    }
    if (scans.has('expert_out'))
      for (let e = 0; e < E; e++) {
        const hook = `blocks.${l}.mlp.experts.${e}.hook_out`;
        cells.push({
          scan: 'expert_out',
          layer: l,
          index: e,
          iv: { hook, op: 'patch', positions: 'all', source: src(hook) },
        });
      }
    if (scans.has('head_out')) {
      const hook = `blocks.${l}.attn.hook_z`;
      for (let h = 0; h < H; h++)
        if (patchHead(l, h))
          cells.push({
            scan: 'head_out',
            layer: l,
            index: h,
            iv: { hook, op: 'patch', head: h, positions: 'all', source: src(hook) },
          });
    }
  }
  // each variant's logits reduced to the answer's and the counterfactual's (on the device where the values are)
  const reduce = { ids: [a, c] };
  let rows: LogitRow[], pathRows: LogitRow[] | null;
  try {
    rows = await runVariants(
      model,
      baseIds,
      cells.map((x) => [x.iv]),
      { ctx, stage: 'patching', reduce },
    );
    pathRows = path ? await pathPatch(model, path, baseIds, baseRun, srcRun, reduce, ctx) : null;
  } finally {
    releaseBoth();
  }

  const gridOf = (n: number) => Array.from({ length: L }, () => new Array<number>(n).fill(0));
  const out = {
    resid_pre: scans.has('resid_pre') ? gridOf(T) : null,
    attn_out: scans.has('attn_out') ? gridOf(T) : null,
    mlp_out: scans.has('mlp_out') ? gridOf(T) : null,
    head_out: scans.has('head_out')
      ? (Array.from({ length: L }, (_, l) => Array.from({ length: H }, (_, h) => (patchHead(l, h) ? 0 : null))) as (
          number | null
        )[][])
      : null,
    ...(scans.has('expert_out') ? { expert_out: gridOf(E) } : {}),
    attn_out_all_pos: scans.has('attn_out') ? new Array<number>(L).fill(0) : null,
    mlp_out_all_pos: scans.has('mlp_out') ? new Array<number>(L).fill(0) : null,
  };
  const metric = (r: LogitRow) => finite((r.at[0] - r.at[1] - ldCorr) / denom);
  const pathOut = path
    ? {
        receivers: path.describe,
        grid: Array.from({ length: L }, (_, l) => new Array<number | null>(H).fill(null)),
      }
    : null;
  path?.senders.forEach((s, i) => (pathOut!.grid[s.layer][s.head] = metric(pathRows![i])));
  cells.forEach((cell, i) => {
    const m = metric(rows[i]);
    if (cell.scan === 'attn_all') out.attn_out_all_pos![cell.layer] = m;
    else if (cell.scan === 'mlp_all') out.mlp_out_all_pos![cell.layer] = m;
    else if (cell.scan === 'expert_out') out.expert_out![cell.layer][cell.index] = m;
    else out[cell.scan]![cell.layer][cell.index] = m;
  });
  const maxBatchRuns =
    Math.ceil(cells.length / CAPS.maxBatch) +
    (path ? Math.ceil(path.senders.length / CAPS.maxBatch) * (path.receivers ? 2 : 1) : 0);
  const from = noising ? "the corrupted prompt's run" : "the clean prompt's run";
  return {
    ...documentHead('patch', model, clean.prompt, clean.ids),
    method:
      (noising
        ? 'Noising activation patching: the clean prompt is run with ONE activation replaced by the ' +
          "corrupted run's value at the same site"
        : 'Denoising activation patching: the corrupted prompt is run with ONE activation replaced by the ' +
          "clean run's value at the same site") +
      ' — a residual stream (hook_resid_pre), attention output (hook_attn_out) ' +
      "or MLP output (hook_mlp_out) of one layer at one position; one head's hook_z at every position; " +
      'or a whole attn_out / mlp_out at every position — and everything downstream recomputed. ' +
      (path
        ? `Path patching (Wang et al. 2022) from each sender head to ${path.describe}: the ${noising ? 'clean' : 'corrupted'} ` +
          "prompt run with every head's hook_z frozen to its own value except the sender's, taken from the other run " +
          '(MLPs recomputed), then ' +
          (path.receivers ? "the receivers' inputs patched to that run's values. " : 'its logits read. ')
        : '') +
      'Metric at the last position: (LD − LD_corrupted) / (LD_clean − LD_corrupted), ' +
      'LD = logit[answer] − logit[counterfactual]' +
      (noising ? ' (noising: 1 = unaffected, 0 = as corrupted).' : ' (0 = as corrupted, 1 = clean).') +
      ' No attribution patching (gradients: attribution_patching).',
    direction: input.direction,
    path: pathOut,
    metric: 'normalised_logit_difference',
    corrupted_prompt: corrupted.prompt,
    corrupted_tokens: tokenEntries(model, corrupted.ids),
    differing_positions: clean.ids.flatMap((id, i) => (id !== corrupted.ids[i] ? [i] : [])),
    answer: mt.refs.answer,
    counterfactual: mt.refs.counterfactual,
    clean_logit_diff: finite(ldClean),
    corrupted_logit_diff: finite(ldCorr),
    ...out,
    warnings: gapWarnings(ldClean, ldCorr),
    interventions: cells.map(({ iv: { hook, op, head, positions } }) => ({
      hook,
      op,
      ...(head !== undefined ? { head } : {}),
      positions,
      from,
    })),
    n_variants: cells.length,
    n_engine_runs: 2 + maxBatchRuns,
  };
}

/**
 * Dataset mode: patchPair on every pair (so each pair's values are exactly its single-pair run's),
 * then per cell the mean, the per-pair values, the bootstrap CI and the sign-flip p-value.
 */
async function patchDataset(model: LoadedModel, input: PatchParsed, ctx: OpContext): Promise<PatchDoc> {
  checkOneSource(input, ['prompt', 'token_ids', 'corrupted_prompt', 'corrupted_token_ids', 'answer', 'counterfactual']);
  if (input.scans.includes('expert_out'))
    throw new LoupeError(
      'BAD_INPUT',
      'The expert_out scan runs on one clean/corrupted pair, not on a dataset.',
      'Give prompt and corrupted_prompt, or leave "expert_out" out of scans.',
    );
  if (input.scans.includes('path'))
    throw new LoupeError(
      'BAD_INPUT',
      'The path scan runs on one clean/corrupted pair, not on a dataset.',
      'Give prompt and corrupted_prompt for path patching, or leave "path" out of scans.',
    );
  const perPosition = input.scans.some((s) => s !== 'head_out');
  const { dataset, docs } = await forEachPair(
    model,
    input,
    ctx,
    (ex, c) => patchPair(model, { ...input, ...pairInputOf(ex), prompt: '', corrupted_prompt: '' }, c),
    (d) => {
      const lengths = new Set(d.examples.map((e) => e.clean.length));
      if (perPosition && lengths.size > 1)
        throw new LoupeError(
          'BAD_INPUT',
          `Per-position scans (${input.scans.filter((s) => s !== 'head_out').join(', ')}) ` +
            `need pairs of one token length; this dataset has ${lengths.size} lengths.`,
          'Use scans ["head_out"], or pairs of one token length.',
        );
    },
  );
  const stats = new DatasetStats(docs.length, input.bootstrap_seed);
  const components: NonNullable<PatchDoc['statistics']>['components'] = [];
  const first = docs[0];
  const meanGrid = (key: 'resid_pre' | 'attn_out' | 'mlp_out') => {
    if (!first[key]) return null;
    return first[key]!.map((row, l) =>
      row.map((_, i) => {
        const st = stats.of(
          docs.map((d) => d[key]![l][i]),
          true,
        );
        components.push({ scan: key, layer: l, index: i, ...st });
        return st.mean;
      }),
    );
  };
  const resid_pre = meanGrid('resid_pre');
  const attn_out = meanGrid('attn_out');
  const mlp_out = meanGrid('mlp_out');
  const head_out = first.head_out
    ? first.head_out.map((row, l) =>
        row.map((v, h) => {
          if (v === null) return null;
          const st = stats.of(
            docs.map((d) => d.head_out![l][h] as number),
            true,
          );
          components.push({ scan: 'head_out', layer: l, index: h, ...st });
          return st.mean;
        }),
      )
    : null;
  const allPos = (key: 'attn_out_all_pos' | 'mlp_out_all_pos') =>
    first[key]
      ? first[key]!.map((_, l) => {
          const st = stats.of(
            docs.map((d) => d[key]![l]),
            true,
          );
          components.push({ scan: key, layer: l, index: null, ...st });
          return st.mean;
        })
      : null;
  const attn_out_all_pos = allPos('attn_out_all_pos');
  const mlp_out_all_pos = allPos('mlp_out_all_pos');
  const meanOf = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  return {
    ...first,
    method:
      `Dataset mode over ${docs.length} pairs: each pair patched exactly as the single-pair ` +
      "form does (below), every cell's value the mean over the pairs of its normalised metric, " +
      'with per-pair values, bootstrap CI and sign-flip p-value in statistics. The tokens, ' +
      `corrupted prompt, answer and counterfactual shown are the first pair's. ${first.method}`,
    clean_logit_diff: finite(meanOf(docs.map((d) => d.clean_logit_diff))),
    corrupted_logit_diff: finite(meanOf(docs.map((d) => d.corrupted_logit_diff))),
    // the normalised cells divide by the dataset's mean gap, not the first pair's
    warnings: gapWarnings(meanOf(docs.map((d) => d.clean_logit_diff)), meanOf(docs.map((d) => d.corrupted_logit_diff))),
    resid_pre,
    attn_out,
    mlp_out,
    head_out,
    attn_out_all_pos,
    mlp_out_all_pos,
    n_variants: docs.reduce((s, d) => s + d.n_variants, 0),
    n_engine_runs: docs.reduce((s, d) => s + d.n_engine_runs, 0),
    dataset: dataset.report,
    statistics: stats.table(components),
  };
}

/** a hook of a run, where the run left it (deviceHooks) or in JS memory */
const hookOf = (run: RunResult, h: string): Tensor | DeviceTensor => run.deviceHooks?.[h] ?? run.hooks[h];
const release = (run: RunResult) => Object.values(run.deviceHooks ?? {}).forEach((t) => t.release());

interface PathPlan {
  senders: { layer: number; head: number }[];
  /** receiver sites (hook_q/k/v of a head), or null for the logits */
  receivers: { hook: string; head: number }[] | null;
  describe: string;
}

function pathPlan(model: LoadedModel, input: PatchParsed): PathPlan {
  const { n_layers: L, n_heads: H, n_kv_heads: Hkv } = model.info;
  // path patching freezes every head's output; a linear-attention layer has none (refused, named, not guessed at)
  for (let l = 0; l < L; l++)
    requireHeads(
      model,
      l,
      "the path scan (which freezes every head's hook_z)",
      'Leave "path" out of scans: the other scans run on this model.',
    );
  const check = (h: { layer: number; head: number }, what: string) => {
    if (h.layer >= L || h.head >= H)
      throw new LoupeError(
        'BAD_INPUT',
        `${what} L${h.layer}H${h.head} does not exist (the model has ${L} layers × ${H} heads).`,
        `Use layer 0 … ${L - 1} and head 0 … ${H - 1}.`,
      );
  };
  const recv = input.path_receivers;
  recv?.forEach((r) => check(r, 'path receiver'));
  input.path_senders?.forEach((s) => check(s, 'path sender'));
  const top = recv ? Math.max(...recv.map((r) => r.layer)) : L;
  const senders =
    input.path_senders ?? Array.from({ length: top * H }, (_, i) => ({ layer: Math.floor(i / H), head: i % H }));
  if (senders.length === 0)
    throw new LoupeError(
      'BAD_INPUT',
      'The path scan has no sender: every receiver is in layer 0.',
      'Choose receivers in a later layer, or give path_senders.',
    );
  const group = H / Hkv;
  const receivers = recv
    ? recv.flatMap((r) =>
        [...new Set(r.inputs)].map((x) => ({
          hook: `blocks.${r.layer}.attn.hook_${x}`,
          head: x === 'q' ? r.head : Math.floor(r.head / group),
        })),
      )
    : null;
  const describe = recv
    ? recv.map((r) => `L${r.layer}H${r.head} (${[...new Set(r.inputs)].join(', ')})`).join(', ')
    : 'the logits';
  return { senders, receivers, describe };
}

/**
 * Path patching's runs (see the header), batched: per sender, the base prompt with every head's hook_z
 * frozen to the base run's and the sender's from the source run; then, for head receivers, the base
 * prompt with the receivers' values from that run. Returns each sender's logits at the last position, reduced.
 */
async function pathPatch(
  model: LoadedModel,
  plan: PathPlan,
  ids: number[],
  base: RunResult,
  src: RunResult,
  reduce: LogitReduce,
  ctx: OpContext,
): Promise<LogitRow[]> {
  const { n_layers: L } = model.info;
  const T = ids.length;
  const freeze = (s: { layer: number; head: number }): Intervention[] => [
    ...Array.from({ length: L }, (_, l) => {
      const hook = `blocks.${l}.attn.hook_z`;
      return { hook, op: 'patch' as const, source: hookOf(base, hook) };
    }),
    {
      hook: `blocks.${s.layer}.attn.hook_z`,
      op: 'patch',
      head: s.head,
      source: hookOf(src, `blocks.${s.layer}.attn.hook_z`),
    },
  ];
  if (!plan.receivers)
    return runVariants(model, ids, plan.senders.map(freeze), { ctx, stage: 'path patching', reduce });
  const hooks = [...new Set(plan.receivers.map((r) => r.hook))];
  const out: LogitRow[] = [];
  for (let start = 0; start < plan.senders.length; start += CAPS.maxBatch) {
    throwIfAborted(ctx.signal);
    const chunk = plan.senders.slice(start, start + CAPS.maxBatch);
    const B = chunk.length;
    const interventions = chunk.flatMap((s, row) => freeze(s).map((iv) => ({ ...iv, batch: [row] })));
    // the receivers' values stay where the run leaves them (on the device where the backend keeps
    // them there); row r of the next run patches in row r of them
    const r = await model.run(ids, {
      hooks,
      interventions,
      batch: B,
      logitPositions: [T - 1],
      hooksOnDevice: true,
      reduceLogits: reduce, // (its logits are not read: reduced, not brought back whole)
      signal: ctx.signal,
    });
    try {
      ctx.onProgress?.({ stage: 'path patching: senders', done: start + B, total: plan.senders.length });
      const received = chunk.flatMap((_, row) =>
        plan.receivers!.map((x) => ({
          hook: x.hook,
          op: 'patch' as const,
          head: x.head,
          source: hookOf(r, x.hook),
          batch: [row],
        })),
      );
      const res = await model.run(ids, {
        hooks: [],
        interventions: received,
        batch: B,
        logitPositions: [T - 1],
        lean: true,
        reduceLogits: reduce,
        signal: ctx.signal,
      });
      out.push(...res.logitRows!);
      ctx.onProgress?.({ stage: 'path patching: receivers', done: start + B, total: plan.senders.length });
    } finally {
      release(r);
    }
  }
  return out;
}
