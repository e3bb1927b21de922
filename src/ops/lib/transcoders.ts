/**
 * What operations on transcoder sets share (attribution_graph, feature_intervention):
 *  - the input fields naming a set ({transcoder_source, transcoder_path}), like sae_source/sae_path;
 *  - `ensureTranscoders`: the set attached to the model once, under an id derived from its ref, its
 *    files fetched through the surface's `ctx.loadTranscoders` and judged from their headers first
 *    (TRANSCODER_MISMATCH against the model, TOO_LARGE against the caps) with download progress;
 *  - the document's block describing the set;
 *  - `inputReplacement`: the set an operation's input names and the prompt's local replacement model;
 *  - `transcoderLabels`: the set's feature descriptions, read as an SAE's are (lib/sae.ts).
 */
import { z } from 'zod';
import { SharedLoads, assertLoader } from './shared-load';
import type { LoadedModel, LocalReplacement, TranscoderInfo } from '../../engine/api';
import { LoupeError, throwIfAborted } from '../../engine/errors';
import { transcoderIdOf } from '../../engine/transcoder';
import type { OpContext, SaeRef } from '../types';
import { CAPS } from '../../engine/caps';
import { explanationsBeside } from './sae';
import { checkDescriptions, type FeatureDescription } from './feature-descriptions';
import { requireHeads } from './dla';

export const transcoderRefFields = {
  transcoder_source: z
    .string()
    .min(1)
    .describe(
      "Where the transcoder set lives: a Hub repository 'owner/name' or " +
        "'owner/name@revision', an http(s) URL of a folder, or a local folder (CLI; " +
        'over MCP only inside a folder the companion allows with --allow-local).',
    ),
  transcoder_path: z
    .string()
    .default('')
    .describe(
      "The set's folder inside transcoder_source: circuit-tracer's layout (config.yaml with " +
        'model_kind transcoder_set and layer_{i}.safetensors, or cross_layer_transcoder and ' +
        'W_enc_{i}/W_dec_{i}.safetensors; its transcoders: list may name Gemma Scope 2 files), ' +
        "or SAELens transcoder folders as a pattern with {layer}, e.g. 'layer_{layer}'; '' = the root.",
    ),
};

export const transcoderBlockSchema = z.object({
  id: z.string(),
  source: z.string(),
  path: z.string(),
  kind: z.enum(['plt', 'clt']).describe('per-layer transcoders, or one cross-layer transcoder'),
  layout: z.enum(['circuit_tracer', 'gemma_scope_2', 'saelens']),
  n_layers: z.number().int(),
  d_model: z.number().int(),
  d_transcoder: z.number().int().describe('features per layer'),
  activation: z.enum(['jumprelu', 'relu', 'topk']),
  k: z.number().int().nullable(),
  skip: z.boolean().describe('a linear skip connection (the only part of the MLP the local replacement model keeps)'),
  input_hook: z.string().describe('the feature-input hook in each block (TransformerLens name)'),
  output_hook: z.string(),
  scan: z.string().describe("circuit-tracer's scan: the graph metadata's scan"),
  dtype: z.string(),
  weight_bytes: z.number().int(),
});

export function transcoderBlock(info: TranscoderInfo, ref: SaeRef): z.infer<typeof transcoderBlockSchema> {
  const { relu_before_threshold: _r, ...rest } = info;
  void _r;
  return { ...rest, source: ref.source, path: ref.path };
}

const loads = new SharedLoads<TranscoderInfo>();

const gib = (b: number) => `${(b / 1024 ** 3).toFixed(2)} GiB`;

/** the caps a set is judged against before its weights are fetched (engine/caps.ts) */
function judgeSize(info: TranscoderInfo): void {
  const layer = info.d_transcoder * info.d_model * 4;
  if (layer > CAPS.maxTranscoderLayerBytes) {
    const fit = Math.floor(CAPS.maxTranscoderLayerBytes / (info.d_model * 4));
    throw new LoupeError(
      'TOO_LARGE',
      `One layer's encoder of this set is ${gib(layer)} as float32 (${info.d_transcoder} features × d_model ` +
        `${info.d_model}), more than the ${gib(CAPS.maxTranscoderLayerBytes)} a layer may take while it is encoded.`,
      `Pick a narrower set: at most ${fit} features per layer fit.`,
      { d_transcoder: info.d_transcoder, max_d_transcoder: fit },
    );
  }
  if (info.weight_bytes > CAPS.maxTranscoderBytes)
    throw new LoupeError(
      'TOO_LARGE',
      `The transcoder set's files hold ${gib(info.weight_bytes)}, more than the cap of ${gib(CAPS.maxTranscoderBytes)} of weights to download and keep.`,
      `Pick a narrower set: about ${Math.floor((info.d_transcoder * CAPS.maxTranscoderBytes) / info.weight_bytes)} features per layer would fit.`,
      { weight_bytes: info.weight_bytes, max_bytes: CAPS.maxTranscoderBytes },
    );
}

/**
 * The set at `ref`, attached to `model` (fetched and judged the first time). Concurrent calls
 * share one load; a failed or cancelled load is forgotten so the next call starts again, and
 * nothing is attached until every file is in.
 */
export async function ensureTranscoders(model: LoadedModel, ref: SaeRef, ctx: OpContext): Promise<TranscoderInfo> {
  const id = transcoderIdOf(ref.source, ref.path);
  return loads.get(model, id, ctx.signal, async () => {
    const known = model.transcoderSets().find((t) => t.id === id);
    if (known) return known;
    assertLoader(ctx.loadTranscoders, 'loadTranscoders', 'transcoders', 'a transcoder loader');
    throwIfAborted(ctx.signal);
    const files = await ctx.loadTranscoders(ref, {
      nLayers: model.info.n_layers,
      signal: ctx.signal,
      judge: (headers) => judgeSize(model.checkTranscoders(headers, id)),
      onProgress: (f) =>
        ctx.onProgress?.({
          stage: `loading transcoders ${f.file}${f.cached ? ' (cached)' : ''}`,
          done: f.overall?.loaded ?? f.loaded,
          total: f.overall?.total ?? f.total ?? f.loaded,
        }),
    });
    throwIfAborted(ctx.signal);
    return model.attachTranscoders(files, id);
  });
}

/**
 * The set the input names (ensureTranscoders), the prompt's local replacement model with it
 * (replacementFor) and the set's document block.
 */
export async function inputReplacement(
  model: LoadedModel,
  input: { transcoder_source: string; transcoder_path: string },
  ids: number[],
  ctx: OpContext,
): Promise<{ info: TranscoderInfo; rep: LocalReplacement; block: z.infer<typeof transcoderBlockSchema> }> {
  // the local replacement model freezes every head's attention pattern; a linear-attention layer has none
  for (let l = 0; l < model.info.n_layers; l++)
    requireHeads(
      model,
      l,
      "the local replacement model (which freezes every head's attention pattern)",
      'On this model use attribution_patching, patch or sae_features; transcoders need every layer to have heads.',
    );
  const ref = { source: input.transcoder_source, path: input.transcoder_path };
  const info = await ensureTranscoders(model, ref, ctx);
  const rep = await replacementFor(model, info, ids, ctx);
  return { info, rep, block: transcoderBlock(info, ref) };
}

const prepared = new WeakMap<LoadedModel, { key: string; rep: Promise<LocalReplacement> }>();

/**
 * The local replacement model of a prompt with an attached set, kept for the next call on the same
 * model, set and tokens (an intervention after its graph prepares nothing again); one per model.
 */
export function replacementFor(
  model: LoadedModel,
  info: TranscoderInfo,
  ids: number[],
  ctx: OpContext,
): Promise<LocalReplacement> {
  const key = `${info.id}\u0000${ids.join(',')}`;
  const hit = prepared.get(model);
  if (hit && hit.key === key) return hit.rep;
  const rep = model.replacement(ids, info.id, {
    signal: ctx.signal,
    onProgress: (stage, done, total) => ctx.onProgress?.({ stage, done, total }),
  });
  prepared.set(model, { key, rep });
  rep.catch(() => {
    if (prepared.get(model)?.rep === rep) prepared.delete(model);
  });
  return rep;
}

export const transcoderDescriptionsSchema = z.object({
  looked_for: z
    .array(z.string())
    .describe("the explanations.json files looked for: the set's folder's, or each layer folder's ({layer} paths)"),
  found: z.array(z.string()),
  count: z.number().int().describe('features (layer, index) with a description'),
  records: z.number().int().describe('explanation records read'),
  rule: z.string(),
});

export interface TranscoderLabels {
  /** the description of feature `feature` of layer `layer`, or null (never made up) */
  label(layer: number, feature: number): string | null;
  block: z.infer<typeof transcoderDescriptionsSchema>;
}

const LABELS_RULE =
  "explanations.json in Neuronpedia's export layout beside the set's config.yaml, each record naming its layer " +
  '("layer": 3, or Neuronpedia\'s "3-…"), or one per layer folder of a {layer} path; features without one get no label';

const labelLoads = new WeakMap<LoadedModel, Map<string, Promise<TranscoderLabels>>>();

/**
 * The set's feature descriptions, when it carries them (read once per model and set): from the
 * explanations file beside it, as an SAE's (lib/sae.ts explanationsBeside). Refused (BAD_INPUT)
 * when a record names no layer, a layer the model lacks or a feature past d_transcoder.
 */
export function transcoderLabels(
  model: LoadedModel,
  info: TranscoderInfo,
  ref: SaeRef,
  ctx: OpContext,
): Promise<TranscoderLabels> {
  const byModel = labelLoads.get(model) ?? new Map<string, Promise<TranscoderLabels>>();
  labelLoads.set(model, byModel);
  let p = byModel.get(info.id);
  if (!p) {
    p = readLabels(info, ref, ctx);
    byModel.set(info.id, p);
    p.catch(() => byModel.delete(info.id));
  }
  return p;
}

async function readLabels(info: TranscoderInfo, ref: SaeRef, ctx: OpContext): Promise<TranscoderLabels> {
  const byLayer = new Map<number, Map<number, FeatureDescription>>();
  const block = { looked_for: [] as string[], found: [] as string[], count: 0, records: 0, rule: LABELS_RULE };
  const load = ctx.loadSaeFile;
  const L = info.n_layers;
  const folders = ref.path.includes('{layer}')
    ? Array.from({ length: L }, (_, l) => ({
        layer: l,
        ref: { ...ref, path: ref.path.replaceAll('{layer}', String(l)) },
      }))
    : [{ layer: null, ref }];
  for (const f of load ? folders : []) {
    const { set, looked_for } = await explanationsBeside(f.ref, load!, ctx.signal);
    block.looked_for.push(looked_for);
    if (!set) continue;
    block.found.push(looked_for);
    block.records += set.records;
    checkDescriptions(set, { d_sae: info.d_transcoder }, looked_for);
    if (f.layer !== null) {
      byLayer.set(f.layer, set.byFeature);
      continue;
    }
    for (const [name, features] of set.byLayer) {
      const layer = /^\s*(\d+)/.exec(name);
      if (!layer || Number(layer[1]) >= L)
        throw new LoupeError(
          'BAD_INPUT',
          `Descriptions from ${looked_for}: ${layer ? `layer ${layer[1]} is past the set's ${L} layers` : 'a record names no layer'}.`,
          'Each record of a transcoder set\'s explanations.json names its layer: "layer": 3, or Neuronpedia\'s "3-…".',
        );
      const into = byLayer.get(Number(layer[1])) ?? new Map<number, FeatureDescription>();
      byLayer.set(Number(layer[1]), into);
      for (const [k, d] of features) if (!into.has(k)) into.set(k, d);
    }
  }
  for (const m of byLayer.values()) block.count += m.size;
  return { label: (layer, feature) => byLayer.get(layer)?.get(feature)?.description ?? null, block };
}
