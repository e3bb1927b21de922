/**
 * activations (NeuronScope's activation summary): summary statistics of each layer's residual
 * stream, attention and MLP outputs, MLP activations and attention patterns, from one forward
 * pass — small enough to show for every layer at once, with a norm per position for the views —
 * and the values themselves of one chosen hook (a layer's MLP neurons by default): position ×
 * unit, with the top_k units by |value| at each position.
 */
import { z } from 'zod';
import { defineOperation } from './types';
import type { Tensor } from '../engine/tensor';
import type { HookStats } from '../engine/api';
import { hostStats } from '../engine/runtime/reduce';
import { documentBase, documentHead } from '../schema/common';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { checkTopK, finite } from '../engine/caps';
import { topIndices } from './lib/math';
import { promptFields, promptIds } from './lib/tokens';

export const SITES = ['resid_pre', 'resid_mid', 'resid_post', 'attn_out', 'mlp_out', 'mlp_post', 'pattern'] as const;
export type Site = (typeof SITES)[number];
/** the sites whose values are one number per position and unit (not the [head, key] patterns) */
export const VALUE_SITES = ['mlp_post', 'resid_pre', 'resid_mid', 'resid_post', 'attn_out', 'mlp_out'] as const;
/** numbers of the full values grid a document carries (positions × units); above it only the top_k lists */
export const MAX_VALUES = 1 << 18;

/** site → hook name in layer l */
export function siteHook(site: Site, l: number): string {
  switch (site) {
    case 'mlp_post':
      return `blocks.${l}.mlp.hook_post`;
    case 'pattern':
      return `blocks.${l}.attn.hook_pattern`;
    default:
      return `blocks.${l}.hook_${site}`;
  }
}

export const activationsInput = z.object({
  ...promptFields,
  sites: z
    .array(z.enum(SITES))
    .min(1)
    .default([...SITES])
    .describe('Which sites to summarise in every layer.'),
  layers: z.array(z.number().int().min(0)).optional().describe('Layers to include (default all).'),
  values_layer: z
    .number()
    .int()
    .min(0)
    .optional()
    .describe('The layer whose values_site values are returned in full (default the last layer included).'),
  values_site: z
    .enum(VALUE_SITES)
    .default('mlp_post')
    .describe(
      'The hook whose values are returned per position and unit: mlp_post = MLP neurons, else d_model dimensions.',
    ),
  top_k: z.number().int().min(1).default(10).describe('Units listed at each position, by |value|.'),
});
export type ActivationsInput = z.input<typeof activationsInput>;

const siteStats = z.object({
  site: z.enum(SITES),
  hook: z.string(),
  shape: z.array(z.number().int()).describe('Shape of the hook for this prompt, batch first.'),
  mean: z.number(),
  std: z.number().describe('Population standard deviation over every element.'),
  min: z.number(),
  max: z.number(),
  argmax: z.object({
    position: z.number().int().describe('Token position of the largest element (the query position for patterns).'),
    index: z
      .array(z.number().int())
      .describe(
        'Index of that element within the position (e.g. [d] for the residual stream, [head, key] for patterns).',
      ),
  }),
  norm_per_position: z
    .array(z.number())
    .describe('L2 norm of everything at each position (for patterns: each query row over all heads).'),
});

export const activationsOutput = documentBase('activations').extend({
  layers: z.array(z.object({ layer: z.number().int(), sites: z.array(siteStats) })),
  values: z
    .object({
      layer: z.number().int(),
      site: z.enum(VALUE_SITES),
      hook: z.string(),
      unit: z.enum(['neuron', 'dimension']),
      width: z.number().int().describe('units per position'),
      grid: z
        .array(z.array(z.number()))
        .nullable()
        .describe(`[position][unit] the hook's values (null above ${MAX_VALUES} numbers: see omitted)`),
      omitted: z.string().nullable().describe('why the grid is not in the document'),
      top: z
        .array(
          z.object({
            position: z.number().int(),
            units: z.array(z.object({ index: z.number().int(), value: z.number() })),
          }),
        )
        .describe('per position, the top_k units by |value|, largest first'),
    })
    .nullable()
    .describe('the values of one hook (values_layer, values_site); null when that site is not in this architecture'),
  experts: z
    .array(
      z.object({
        layer: z.number().int(),
        load: z
          .array(z.number())
          .describe('[n_experts] the fraction of positions routed to each expert (hook_expert_indices); sums to k'),
        router_entropy: z
          .number()
          .describe('mean over positions of the entropy (nats) of softmax(hook_router_logits); ln E is uniform'),
        entropy_per_position: z.array(z.number()),
      }),
    )
    .optional()
    .describe("Mixture-of-experts models: per included layer, the experts' load and the router's entropy."),
  missing_sites: z
    .array(z.enum(SITES))
    .describe('Requested sites this architecture does not have (e.g. resid_mid for a parallel-residual model).'),
  method: z.string(),
});

/** statistics of a [1, ...] hook whose position axis is `posAxis` (1, or 2 for [B,H,Tq,Tk] patterns), float64 */
export function summarize(t: Tensor, posAxis: number) {
  return described(hostStats(t, posAxis), posAxis);
}

/** a hook's statistics (the engine's, runtime/reduce.ts) as the document gives them */
function described(s: HookStats, posAxis: number) {
  const dims = s.shape;
  // strides of the row-major layout: position p of axis posAxis
  const strides = dims.map((_, k) => dims.slice(k + 1).reduce((a, b) => a * b, 1));
  const multi = dims.map((d, k) => Math.floor(s.argmax / strides[k]) % d);
  return {
    shape: [...dims],
    mean: finite(s.mean),
    std: finite(s.std),
    min: finite(s.min),
    max: finite(s.max),
    // drop the batch axis and the position axis from the element index
    argmax: { position: multi[posAxis], index: multi.filter((_, k) => k !== 0 && k !== posAxis) },
    norm_per_position: s.norms.map(finite),
  };
}

/** one hook's values [1, T, W] as a position × unit grid (when small enough) and each position's top units by |value| */
function valuesOf(t: Tensor, layer: number, site: (typeof VALUE_SITES)[number], hook: string, k: number) {
  const [, T, W] = t.dims;
  const x = t.data;
  const full = T * W <= MAX_VALUES;
  return {
    layer,
    site,
    hook,
    unit: site === 'mlp_post' ? ('neuron' as const) : ('dimension' as const),
    width: W,
    grid: full ? Array.from({ length: T }, (_, p) => Array.from(x.subarray(p * W, (p + 1) * W), finite)) : null,
    omitted: full ? null : `${T} positions × ${W} units = ${T * W} numbers, above the ${MAX_VALUES} a document carries`,
    top: Array.from({ length: T }, (_, p) => ({
      position: p,
      units: topIndices(W, (i) => Math.abs(x[p * W + i]), Math.min(k, W)).map((i) => ({
        index: i,
        value: finite(x[p * W + i]),
      })),
    })),
  };
}

/** one MoE layer's routing over the prompt: each expert's load and the router's entropy per position */
function routing(hooks: Record<string, Tensor>, l: number, E: number) {
  const logits = hooks[`blocks.${l}.mlp.hook_router_logits`].data;
  const idx = hooks[`blocks.${l}.mlp.hook_expert_indices`];
  const [, T, k] = idx.dims;
  const load = new Float64Array(E);
  for (let i = 0; i < T * k; i++) load[idx.data[i]] += 1 / T;
  const entropy = Array.from({ length: T }, (_, p) => {
    const row = logits.subarray(p * E, (p + 1) * E);
    let mx = -Infinity;
    for (const v of row) mx = Math.max(mx, v);
    let z = 0;
    for (const v of row) z += Math.exp(v - mx);
    let h = 0;
    for (const v of row) {
      const q = Math.exp(v - mx) / z;
      if (q > 0) h -= q * Math.log(q);
    }
    return h;
  });
  return {
    layer: l,
    load: Array.from(load, finite),
    router_entropy: finite(entropy.reduce((a, b) => a + b, 0) / T),
    entropy_per_position: entropy.map(finite),
  };
}

export const operation = defineOperation({
  name: 'activations',
  title: 'Activations',
  description:
    'Per layer, summary statistics (shape, mean, std, min, max, argmax position, L2 norm per position) ' +
    'of resid_pre, resid_mid, resid_post, attn_out, mlp_out, mlp_post (MLP activations) ' +
    'and the attention pattern, from one forward pass; and the values of one hook (values_layer, ' +
    "values_site; default the last layer's MLP neurons) per position and unit, with the top_k units " +
    'by |value| at each position. Values are those of the unprocessed model (no weight folding).',
  input: activationsInput,
  output: activationsOutput,
}).implement(async (model, input, ctx) => {
  const L = model.info.n_layers;
  const layers = [...new Set(input.layers ?? Array.from({ length: L }, (_, l) => l))].sort((a, b) => a - b);
  for (const l of layers)
    if (l >= L)
      throw new LoupeError(
        'BAD_INPUT',
        `layer ${l} does not exist (the model has ${L} layers).`,
        `Use layers 0 … ${L - 1}.`,
      );
  checkTopK(input.top_k);
  const vLayer = input.values_layer ?? layers[layers.length - 1];
  if (vLayer >= L)
    throw new LoupeError(
      'BAD_INPUT',
      `values_layer ${vLayer} does not exist (the model has ${L} layers).`,
      `Use values_layer 0 … ${L - 1}.`,
    );
  const ids = promptIds(model, input.prompt, { prependBos: input.prepend_bos });
  const available = new Set(model.hookNames());
  const sites = [...new Set(input.sites)];
  const missing = sites.filter((s) => !available.has(siteHook(s, 0)));
  const present = sites.filter((s) => !missing.includes(s));
  const hooks = layers.flatMap((l) => present.map((s) => siteHook(s, l)));
  const E = model.info.num_experts ?? 0;
  const moeHooks = (l: number) => [`blocks.${l}.mlp.hook_router_logits`, `blocks.${l}.mlp.hook_expert_indices`];
  if (E) for (const l of layers) hooks.push(...moeHooks(l));
  const vHook = siteHook(input.values_site, vLayer);
  const withValues = available.has(vHook);
  if (withValues && !hooks.includes(vHook)) hooks.push(vHook);

  ctx.onProgress?.({ stage: 'forward pass', done: 0, total: 1 });
  throwIfAborted(ctx.signal);
  // no logits are shown: unembed one position only (all T would cost up to half a forward more);
  // the summarised hooks come back as their statistics (reduced on the device where the values are)
  const summarised = layers.flatMap((l) => present.map((s) => siteHook(s, l)));
  const whole = hooks.filter((h) => !summarised.includes(h) || h === vHook);
  const run = await model.run(ids, {
    hooks: whole,
    hookStats: summarised,
    logitPositions: [ids.length - 1],
    // the logits stay where they are: the argmax (8 bytes) is the least a run can read of them
    pick: { argmax: true, logits: false },
    signal: ctx.signal,
  });
  throwIfAborted(ctx.signal);
  ctx.onProgress?.({ stage: 'forward pass', done: 1, total: 1 });

  return {
    ...documentHead('activations', model, input.prompt, ids),
    layers: layers.map((l) => ({
      layer: l,
      sites: present.map((site) => ({
        site,
        hook: siteHook(site, l),
        ...described(run.hookStats![siteHook(site, l)], site === 'pattern' ? 2 : 1),
      })),
    })),
    values: withValues ? valuesOf(run.hooks[vHook], vLayer, input.values_site, vHook, input.top_k) : null,
    ...(E ? { experts: layers.map((l) => routing(run.hooks, l, E)) } : {}),
    missing_sites: missing,
    method:
      'Statistics over every element of the hook for this prompt (batch 1, float64 accumulation; ' +
      'float32 where the values stay on the GPU); std is the population standard deviation; argmax is the first ' +
      'largest element. Patterns are post-softmax attention probabilities [B, H, Tq, Tk]. ' +
      `values: every number of ${vHook} at every position (the unprocessed model's values), ` +
      `and the ${input.top_k} units with the largest |value| at each position.` +
      (E
        ? ' experts: load = the fraction of positions whose top-k includes the expert; router entropy = ' +
          '−Σ_e p_e ln p_e of p = softmax(router logits) at each position, and its mean.'
        : ''),
  };
});
