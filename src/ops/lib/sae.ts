/**
 * What the SAE operations (sae_features, sae_steer, feature) share:
 *  - input fields naming an SAE ({sae_source, sae_path}) and its descriptions;
 *  - `ensureSae`: the SAE attached to the model once, under an id derived from its ref, its files
 *    fetched through the surface's `ctx.loadSae` (with download progress);
 *  - `loadDescriptions`: auto-interp descriptions, given or found next to the SAE (else null);
 *  - `inputSae`: the SAE an operation's input names, checked, with its descriptions and the
 *    document's blocks; `decoderRow`: a feature's W_dec row, its norm and its residual map;
 *  - `residualMap`: how a vector in the SAE's hook space reaches the residual stream (identity
 *    for residual-stream hooks, W_O for attn.hook_z, W_out for mlp.hook_post), for logit effects;
 *  - `withSaeRuns`: a view of the model whose every run splices the SAE in, so the shared
 *    generation loop can edit features (`{hook}.hook_sae_acts_post`) while it generates.
 */
import { z } from 'zod';
import { SharedLoads, assertLoader } from './shared-load';
import type { LoadedModel, SaeInfo, RunOptions } from '../../engine/api';
import type { Tensor } from '../../engine/tensor';
import { LoupeError, throwIfAborted } from '../../engine/errors';
import type { OpContext, SaeRef } from '../types';
import { checkDescriptions, parseDescriptions, type DescriptionSet } from './feature-descriptions';

// ------------------------------------------------------------------ the context a surface provides

/**
 * ctx plus the optional file loader of the SAE loaders (src/engine/source/sae-loader.ts,
 * src/node/load-sae.ts): reads explanations files next to the SAE or at a URL/path.
 */
/** kept as an alias: OpContext now carries loadSae and loadSaeFile itself */
export type SaeOpContext = OpContext;

// ------------------------------------------------------------------ input fields

export const saeRefFields = {
  sae_source: z
    .string()
    .min(1)
    .describe(
      "Where the SAE lives: a Hub repository 'owner/name' or 'owner/name@revision', an http(s) URL of a folder, " +
        'or a local folder (CLI; over MCP only inside a folder the companion allows with --allow-local).',
    ),
  sae_path: z
    .string()
    .default('')
    .describe(
      "The SAE's folder inside sae_source, holding cfg.json and sae_weights.safetensors " +
        "(SAELens layout, e.g. 'blocks.8.hook_resid_pre') or config.json and params.safetensors " +
        "(Gemma Scope 2, e.g. 'resid_post/layer_12_width_16k_l0_medium'); '' = the root.",
    ),
};

export const EXPLANATIONS_FILE = 'explanations.json';

export const descriptionsField = z
  .union([z.string(), z.array(z.record(z.string(), z.unknown())), z.record(z.string(), z.unknown())])
  .optional()
  .describe(
    `Auto-interp feature descriptions in Neuronpedia's export layout (records with "index" and "description"; ` +
      'a JSON array, {"explanations": [...]}, or JSON Lines, optionally gzipped): a URL, a path (CLI; ' +
      'over MCP only inside a folder the companion allows with --allow-local), or the JSON itself. Default: ' +
      `${EXPLANATIONS_FILE} next to the SAE's cfg.json when it exists. Features without a description get null.`,
  );

export const featureField = z.number().int().min(0).describe('feature index (0 … d_sae − 1)');

/** an SAE and one of its features: the input fields feature and sae_steer lead with */
export const featureRefFields = { ...saeRefFields, feature: featureField };

// ------------------------------------------------------------------ attaching

export interface AttachedSae {
  /** the id the model knows the SAE by */
  id: string;
  ref: SaeRef;
  info: SaeInfo;
  /** cfg.json (null when the SAE was attached by someone else) */
  cfg: Record<string, any> | null;
  /** float32 weights, read from the model once */
  weight(name: 'W_enc' | 'b_enc' | 'W_dec' | 'b_dec' | 'threshold'): Tensor;
  /** the descriptions found next to the SAE (memoised) */
  alongside?: Promise<{ set: DescriptionSet | null; looked_for: string | null }>;
}

/** the id an SAE ref is attached under: the same SAE is attached once per model */
export function saeIdOf(ref: SaeRef): string {
  const path = ref.path.replace(/^\/+|\/+$/g, '');
  // a source given with a trailing slash names the same folder (never "…saelens//explanations.json")
  return `${ref.source.trim().replace(/(.)\/+$/, '$1')}${path ? `/${path}` : ''}`;
}

const loads = new SharedLoads<AttachedSae>();

function attached(
  model: LoadedModel,
  id: string,
  ref: SaeRef,
  info: SaeInfo,
  cfg: Record<string, any> | null,
): AttachedSae {
  const cache = new Map<string, Tensor>();
  return {
    id,
    ref,
    info,
    cfg,
    weight(name) {
      let t = cache.get(name);
      if (!t) cache.set(name, (t = model.saeWeight(id, name)));
      return t;
    },
  };
}

/**
 * The SAE at `ref`, attached to `model` (fetching and validating it the first time: d_in and the
 * hook must match this model, else SAE_MISMATCH). Concurrent calls share one load; a failed load
 * is forgotten so the next call tries again.
 */
export async function ensureSae(model: LoadedModel, ref: SaeRef, ctx: OpContext): Promise<AttachedSae> {
  const id = saeIdOf(ref);
  return loads.get(model, id, ctx.signal, async () => {
    const known = model.saes().find((s) => s.id === id);
    if (known) return attached(model, id, ref, known, null);
    assertLoader(ctx.loadSae, 'loadSae', 'SAEs', 'an SAE loader');
    throwIfAborted(ctx.signal);
    const files = await ctx.loadSae(ref, {
      signal: ctx.signal,
      judge: (cfg) => model.checkSaeConfig(cfg),
      onProgress: (f) =>
        ctx.onProgress?.({
          stage: `loading SAE ${f.file}${f.cached ? ' (cached)' : ''}`,
          done: f.loaded,
          total: f.total ?? f.loaded,
        }),
    });
    throwIfAborted(ctx.signal);
    const info = model.attachSae(files, id);
    return attached(model, id, ref, info, files.cfg);
  });
}

export function checkFeature(sae: AttachedSae, feature: number, field = 'feature'): void {
  if (feature >= sae.info.d_sae) {
    throw new LoupeError(
      'BAD_INPUT',
      `${field} ${feature} does not exist: the SAE has ${sae.info.d_sae} features.`,
      `Use a feature index between 0 and ${sae.info.d_sae - 1}.`,
    );
  }
}

/** feature activations one run may return (T × d_sae floats; 2^26 = 256 MiB) */
export const MAX_SAE_ACTS = 2 ** 26;

/** refuse a run whose [T, d_sae] activations would not fit, before running it */
export function checkActsSize(sae: AttachedSae, T: number, what = 'The prompt'): void {
  if (T * sae.info.d_sae > MAX_SAE_ACTS) {
    const maxT = Math.floor(MAX_SAE_ACTS / sae.info.d_sae);
    throw new LoupeError(
      'TOO_LARGE',
      `${what} has ${T} tokens; with ${sae.info.d_sae} features that is ` +
        `${(T * sae.info.d_sae).toLocaleString('en-US')} activations, more than the cap of ` +
        `${MAX_SAE_ACTS.toLocaleString('en-US')}.`,
      `Shorten it to at most ${maxT} tokens.`,
    );
  }
}

/** the hook of the SAE's feature activations, an intervention site (neuron = feature index) */
export const actsHook = (sae: AttachedSae) => `${sae.info.hook}.hook_sae_acts_post`;

// ------------------------------------------------------------------ the SAE's document block

export const saeBlockSchema = z.object({
  id: z.string(),
  source: z.string(),
  path: z.string(),
  layout: z
    .enum(['saelens', 'gemma_scope_2'])
    .describe("the files' layout: SAELens (cfg.json) or Gemma Scope 2's own (config.json)"),
  architecture: z
    .string()
    .describe("the config's architecture as written (batchtopk runs as jumprelu or topk: see activation)"),
  hook: z.string(),
  hook_layer: z.number().int().nullable(),
  d_in: z.number().int(),
  d_sae: z.number().int(),
  activation: z.enum(['relu', 'jumprelu', 'topk']),
  k: z.number().int().nullable().describe('TopK: features kept per position'),
  apply_b_dec_to_input: z.boolean(),
  model_name: z.string().nullable().describe("the config's model_name: the model the SAE was trained on"),
  neuronpedia_id: z.string().nullable(),
});

const layerOfHook = (hook: string): number | null => {
  const m = /^blocks\.(\d+)\./.exec(hook);
  return m ? Number(m[1]) : null;
};

export function saeBlock(sae: AttachedSae): z.infer<typeof saeBlockSchema> {
  const cfg = sae.cfg ?? {};
  const s = (v: unknown) => (typeof v === 'string' ? v : null);
  return {
    id: sae.id,
    source: sae.ref.source,
    path: sae.ref.path,
    layout: sae.info.layout,
    architecture: sae.info.architecture,
    hook: sae.info.hook,
    hook_layer: Number.isInteger(cfg.hook_layer) ? cfg.hook_layer : layerOfHook(sae.info.hook),
    d_in: sae.info.d_in,
    d_sae: sae.info.d_sae,
    activation: sae.info.activation,
    k: sae.info.k ?? null,
    apply_b_dec_to_input: sae.info.apply_b_dec_to_input,
    model_name: s(cfg.model_name),
    neuronpedia_id: s(cfg.neuronpedia_id),
  };
}

// ------------------------------------------------------------------ descriptions

export const DESCRIPTIONS_RULE =
  'descriptions are read, never generated: a feature without one in the file (or with no file) has description null';

export const descriptionsBlockSchema = z.object({
  source: z
    .string()
    .nullable()
    .describe('"inline", the URL/path given, or the file next to the SAE; null when no descriptions were found'),
  looked_for: z.string().nullable().describe('the file next to the SAE that was looked for when none was given'),
  count: z.number().int().describe('features with a description'),
  records: z.number().int().describe('explanation records read'),
  format: z.enum(['json_array', 'json_object', 'jsonl']).nullable(),
  gzip: z.boolean(),
  neuronpedia_model_id: z.string().nullable(),
  neuronpedia_layer: z.string().nullable(),
  rule: z.string(),
});
export type DescriptionsBlock = z.infer<typeof descriptionsBlockSchema>;

function block(set: DescriptionSet | null, source: string | null, lookedFor: string | null): DescriptionsBlock {
  return {
    source: set ? source : null,
    looked_for: lookedFor,
    count: set?.byFeature.size ?? 0,
    records: set?.records ?? 0,
    format: set?.format ?? null,
    gzip: set?.gzip ?? false,
    neuronpedia_model_id: set?.model_id ?? null,
    neuronpedia_layer: set?.layer ?? null,
    rule: DESCRIPTIONS_RULE,
  };
}

/** a URL or path of one file → the folder it is in (a source) and its name */
function splitFileSpec(spec: string): { ref: SaeRef; file: string } {
  const s = spec.trim();
  const i = s.lastIndexOf('/');
  const file = s.slice(i + 1).split(/[?#]/)[0];
  if (!file)
    throw new LoupeError(
      'BAD_INPUT',
      `descriptions: ${JSON.stringify(spec)} names a folder, not a file.`,
      'Give the URL or path of the explanations file itself, or its JSON.',
    );
  return { ref: { source: i >= 0 ? s.slice(0, i + 1) : './', path: '' }, file };
}

/**
 * The explanations file in a folder (an SAE's, a transcoder set's or one of its layers'), parsed;
 * `set` null when there is none. The one place descriptions published beside weights are read.
 */
export async function explanationsBeside(
  ref: SaeRef,
  load: NonNullable<OpContext['loadSaeFile']>,
  signal?: AbortSignal,
): Promise<{ set: DescriptionSet | null; looked_for: string }> {
  const lookedFor = `${saeIdOf(ref)}/${EXPLANATIONS_FILE}`;
  const bytes = await load(ref, EXPLANATIONS_FILE, { signal, optional: true });
  return { set: bytes ? parseDescriptions(bytes, lookedFor) : null, looked_for: lookedFor };
}

/**
 * The SAE's descriptions: from `given` (inline JSON, or a URL/path read through the surface's
 * loader) or else the explanations file next to the SAE (absent → null). Checked against the SAE
 * (feature range, Neuronpedia id).
 */
export async function loadDescriptions(
  sae: AttachedSae,
  given: unknown,
  ctx: SaeOpContext,
): Promise<{ set: DescriptionSet | null; block: DescriptionsBlock }> {
  const check = (set: DescriptionSet, where: string) =>
    checkDescriptions(set, { d_sae: sae.info.d_sae, neuronpedia_id: saeBlock(sae).neuronpedia_id }, where);
  if (given !== undefined && given !== null) {
    if (typeof given === 'string' && !/^\s*[[{]/.test(given)) {
      if (!ctx.loadSaeFile) {
        throw new LoupeError(
          'BAD_INPUT',
          'This surface cannot read a descriptions file by URL or path.',
          'Give the descriptions as JSON instead.',
        );
      }
      const { ref, file } = splitFileSpec(given);
      ctx.onProgress?.({ stage: 'reading descriptions', done: 0, total: 1 });
      let bytes: Uint8Array | null;
      try {
        bytes = await ctx.loadSaeFile(ref, file, { signal: ctx.signal });
      } catch (e) {
        if (e instanceof LoupeError && (e.code === 'FILE_NOT_FOUND' || e.code === 'MODEL_NOT_FOUND')) {
          throw new LoupeError(
            e.code,
            `descriptions: ${e.message}`,
            'Check the URL or path of the explanations file, or leave descriptions out to use the one next to the SAE (if any).',
            e.details,
          );
        }
        throw e;
      }
      const set = parseDescriptions(bytes!, given);
      check(set, given);
      return { set, block: block(set, given, null) };
    }
    const set = parseDescriptions(given, 'the inline JSON');
    check(set, 'the inline JSON');
    return { set, block: block(set, 'inline', null) };
  }
  if (!ctx.loadSaeFile) return { set: null, block: block(null, null, null) };
  const load = ctx.loadSaeFile;
  const lookedFor = `${saeIdOf(sae.ref)}/${EXPLANATIONS_FILE}`;
  sae.alongside ??= (async () => {
    const r = await explanationsBeside(sae.ref, load, ctx.signal);
    if (r.set) check(r.set, r.looked_for);
    return r;
  })();
  const p = sae.alongside;
  try {
    const r = await p;
    return { set: r.set, block: block(r.set, lookedFor, lookedFor) };
  } catch (e) {
    if (sae.alongside === p) sae.alongside = undefined;
    throw e;
  }
}

// ------------------------------------------------------------------ the SAE an operation's input names

/** the document's SAE and descriptions blocks, as inputSae's `doc` fills them */
export const saeDocFields = { sae: saeBlockSchema, descriptions: descriptionsBlockSchema };

/**
 * The SAE the input names, attached (ensureSae) and checked — the feature the input names
 * (checkFeature), then `check` — before its descriptions are read (loadDescriptions).
 * `doc`: the document's sae and descriptions blocks (saeDocFields).
 */
export async function inputSae(
  model: LoadedModel,
  inp: { sae_source: string; sae_path: string; feature?: number; descriptions?: unknown },
  ctx: OpContext,
  check: (sae: AttachedSae) => void = () => {},
): Promise<{
  sae: AttachedSae;
  descriptions: DescriptionSet | null;
  doc: { sae: z.infer<typeof saeBlockSchema>; descriptions: DescriptionsBlock };
}> {
  ctx.onProgress?.({ stage: 'loading SAE', done: 0, total: 1 });
  const sae = await ensureSae(model, { source: inp.sae_source, path: inp.sae_path }, ctx);
  if (inp.feature !== undefined) checkFeature(sae, inp.feature);
  check(sae);
  const desc = await loadDescriptions(sae, inp.descriptions, ctx);
  throwIfAborted(ctx.signal);
  return { sae, descriptions: desc.set, doc: { sae: saeBlock(sae), descriptions: desc.block } };
}

/** feature f's decoder row W_dec[f] (in the hook's space), its norm, and the hook's way into the residual stream */
export function decoderRow(
  model: LoadedModel,
  sae: AttachedSae,
  f: number,
): { row: Float32Array; norm: number; map: ResidualMapResult } {
  const dIn = sae.info.d_in;
  const row = sae.weight('W_dec').data.subarray(f * dIn, (f + 1) * dIn);
  let s = 0;
  for (let i = 0; i < dIn; i++) s += row[i] * row[i];
  return { row, norm: Math.sqrt(s), map: residualMap(model, sae.info.hook) };
}

// ------------------------------------------------------------------ the hook's way into the residual stream

export interface ResidualMap {
  kind: 'identity' | 'W_O' | 'W_out';
  /** in words, for `method` fields */
  description: string;
  /** a hook-space vector (d_in, at `offset`) → what it adds to the residual stream (d_model) */
  push(v: ArrayLike<number>, offset?: number): Float64Array;
  /** a residual readout e (d_model) → the hook-space readout with v·pull(e) = push(v)·e */
  pull(e: ArrayLike<number>): Float64Array;
}

export type ResidualMapResult = ResidualMap | { kind: null; reason: string };

const RESID_HOOK =
  /^(hook_embed|hook_pos_embed|blocks\.\d+\.(hook_resid_pre|hook_resid_mid|hook_resid_post|hook_attn_out|hook_mlp_out))$/;

/** the map through a weight W [R, D] (row r: what input r adds to the stream): push v → v·W, pull e → W·e */
function throughWeight(kind: 'W_O' | 'W_out', description: string, W: Float32Array, R: number, D: number): ResidualMap {
  return {
    kind,
    description,
    push: (v, o = 0) => {
      const out = new Float64Array(D);
      for (let r = 0; r < R; r++) {
        const a = v[o + r];
        if (a !== 0) for (let j = 0; j < D; j++) out[j] += a * W[r * D + j];
      }
      return out;
    },
    pull: (e) => {
      const out = new Float64Array(R);
      for (let r = 0; r < R; r++) {
        let s = 0;
        for (let j = 0; j < D; j++) s += W[r * D + j] * e[j];
        out[r] = s;
      }
      return out;
    },
  };
}

/**
 * How a vector at `hook` enters the residual stream linearly, or why it does not. Residual-stream
 * hooks (and attn_out/mlp_out, which are added to it) are the identity; attn.hook_z goes through
 * each head's W_O (SAELens flattens hook_z as [H·Dh], head-major); mlp.hook_post through W_out.
 * A post-norm after the attention or MLP (Gemma 2) is not linear: no map.
 */
export function residualMap(model: LoadedModel, hook: string): ResidualMapResult {
  const D = model.info.d_model;
  if (RESID_HOOK.test(hook)) {
    return {
      kind: 'identity',
      description: `${hook} is added to the residual stream as it is`,
      push: (v, o = 0) => Float64Array.from({ length: D }, (_, j) => v[o + j]),
      pull: (e) => Float64Array.from(e),
    };
  }
  let m = /^blocks\.(\d+)\.attn\.hook_z$/.exec(hook);
  if (m) {
    const l = Number(m[1]);
    if (model.info.post_norms)
      return { kind: null, reason: `layer ${l}'s attention output passes through a post-norm, which is not linear` };
    // read for this map, not kept: a float32 copy of every layer's W_O would stay in JS otherwise
    const WO = model.param(`blocks.${l}.attn.W_O`, { keep: false }); // [H, Dh, D], read as [H·Dh, D]
    return throughWeight(
      'W_O',
      `${hook} (flattened [H·Dh], head-major) enters the residual stream through each head's W_O (the attention output bias is not part of it)`,
      WO.data,
      WO.dims[0] * WO.dims[1],
      D,
    );
  }
  m = /^blocks\.(\d+)\.mlp\.hook_post$/.exec(hook);
  if (m) {
    const l = Number(m[1]);
    if (model.info.post_norms)
      return { kind: null, reason: `layer ${l}'s MLP output passes through a post-norm, which is not linear` };
    const W = model.param(`blocks.${l}.mlp.W_out`, { keep: false }); // [M, D], read for this map, not kept
    return throughWeight(
      'W_out',
      `${hook} enters the residual stream through W_out (the MLP output bias is not part of it)`,
      W.data,
      W.dims[0],
      D,
    );
  }
  return {
    kind: null,
    reason: `${hook} reaches the residual stream only through non-linear operations (attention or a norm), so a feature there has no direct logit effect`,
  };
}

// ------------------------------------------------------------------ runs with the SAE spliced in

/**
 * The model, seen through a wrapper whose `run` always splices the SAE in (`sae: id`), so code
 * that takes a LoadedModel (the KV-cached generation loop) can carry feature interventions. With
 * no feature edited, such a run equals the plain model exactly (src/engine/sae.ts).
 */
export function withSaeRuns(model: LoadedModel, saeId: string): LoadedModel {
  return new Proxy(model, {
    get(target, prop) {
      if (prop === 'run')
        return (tokens: number[] | number[][], opts: RunOptions = {}) => target.run(tokens, { ...opts, sae: saeId });
      const v = Reflect.get(target, prop, target);
      return typeof v === 'function' ? v.bind(target) : v;
    },
  });
}
