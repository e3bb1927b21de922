/**
 * Steering directions: a vector over d_model that `steer`, `sweep` and `causality` add to the
 * residual stream. One spec (plain JSON, so a document re-runs exactly) → one resolved vector.
 *
 * Sources:
 *  - tokens:    mean W_U[:, positive] − mean W_U[:, negative] (unembedding columns, unprocessed
 *               weights); with no negative, just the positive columns' mean
 *  - mean_diff: mean activation of the positive prompts − mean of the negative prompts at a hook
 *               (default the steering layer's hook_resid_pre), at the final position or averaged
 *               over positions (BOS excluded)
 *  - probe:     the weights of a probe handle (`probe` operation), in the residual basis
 *  - vector:    numbers given directly
 *  - random:    a seeded Gaussian direction (a control)
 * String shorthands: 'probe:<handle>', 'random:<seed>', 'tokens: love - hate' (each side trimmed;
 * the word-initial token (' love') is preferred).
 *
 * The raw norm is always reported; by default the vector is normalised to unit length so that α is
 * in residual-stream units (α = the norm of the edit).
 */
import { z } from 'zod';
import type { LoadedModel } from '../../engine/api';
import { LoupeError, throwIfAborted } from '../../engine/errors';
import type { HandleStore } from '../types';
import { gaussian, rng } from './math';
import { resolveToken } from './tokens';
import { collectActivations } from './collect';

const tokenList = z.union([z.string(), z.array(z.string()).min(1).max(64)]);

export const directionObject = z.discriminatedUnion('kind', [
  z.object({
    kind: z.literal('tokens'),
    positive: tokenList.describe('token(s) the direction points to: text of one token (" love") or "#id"'),
    negative: tokenList.optional().describe('token(s) subtracted'),
  }),
  z.object({
    kind: z.literal('mean_diff'),
    positive: z.array(z.string()).min(1).max(256),
    negative: z.array(z.string()).min(1).max(256),
    hook: z.string().optional().describe("hook to read (default: the steering layer's blocks.{layer}.hook_resid_pre)"),
    reduce: z.enum(['last', 'mean']).default('last').describe('final position, or mean over positions (BOS excluded)'),
  }),
  z
    .object({
      kind: z.literal('head'),
      layer: z.number().int().min(0),
      head: z.number().int().min(0),
      prompt: z.string().min(1).describe("the prompt whose final position gives the head's output"),
    })
    .describe(
      "a head's output: blocks.{layer}.attn.hook_result[final position, head] on the prompt (what the head writes into the residual stream)",
    ),
  z.object({ kind: z.literal('probe'), handle: z.string() }),
  z.object({ kind: z.literal('vector'), values: z.array(z.number()).min(1) }),
  z.object({ kind: z.literal('random'), seed: z.number().int() }),
]);

export const directionSpec = z
  .union([z.string(), directionObject])
  .describe(
    'Steering direction: {kind:"tokens",positive," love",negative:" hate"} | {kind:"mean_diff",positive:[...],negative:[...]} | ' +
      '{kind:"head",layer,head,prompt} | {kind:"probe",handle} | {kind:"vector",values:[...]} | ' +
      '{kind:"random",seed}; or a string "probe:<handle>", "random:<seed>", "tokens: love - hate".',
  );
export type DirectionSpec = z.infer<typeof directionSpec>;
export type DirectionObject = z.infer<typeof directionObject>;

export interface ResolvedDirection {
  kind: DirectionObject['kind'];
  /** the spec as an object (string shorthands expanded) */
  spec: DirectionObject;
  /** the vector used (unit norm when normalised) */
  vector: Float64Array;
  /** ‖d‖ before normalisation */
  raw_norm: number;
  normalized: boolean;
  /** human-readable formula, e.g. "W_U[:, ' love'] − W_U[:, ' hate']" */
  description: string;
  /** tokens the direction is meant to promote (token directions only) */
  positive_ids: number[];
  negative_ids: number[];
  /** hook the direction was read at (mean_diff, probe) */
  hook?: string;
}

/** stored by the probe operation under kind 'probe' */
export interface ProbeHandleValue {
  hook: string;
  weights: Float64Array;
  bias: number;
  model_id: string;
}

/** Expand the string shorthands. */
export function parseDirectionSpec(spec: DirectionSpec): DirectionObject {
  if (typeof spec !== 'string') return spec;
  const s = spec.trim();
  let m = /^probe:\s*(\S+)$/.exec(s);
  if (m) return { kind: 'probe', handle: m[1] };
  m = /^random:\s*(-?\d+)$/.exec(s);
  if (m) return { kind: 'random', seed: Number(m[1]) };
  m = /^tokens:(.*)$/s.exec(s);
  if (m) {
    const parts = m[1].split(' - ');
    const side = (t: string) => {
      const x = t.trim();
      return x.startsWith('#') ? x : ' ' + x;
    };
    if (parts.length === 1 && parts[0].trim()) return { kind: 'tokens', positive: side(parts[0]) };
    if (parts.length === 2 && parts[0].trim() && parts[1].trim())
      return { kind: 'tokens', positive: side(parts[0]), negative: side(parts[1]) };
  }
  throw new LoupeError(
    'BAD_INPUT',
    `Cannot read the direction ${JSON.stringify(spec)}.`,
    'Use "tokens: love - hate", "probe:<handle>", "random:<seed>", or an object such as {"kind":"tokens","positive":" love","negative":" hate"}.',
  );
}

function asList(x: string | string[] | undefined): string[] {
  return x === undefined ? [] : Array.isArray(x) ? x : [x];
}

/** the mean of the rows [I, D] of `rows` whose indices are `at` (float64) */
function meanRows(rows: Float32Array, at: number[], D: number): Float64Array {
  const out = new Float64Array(D);
  for (const i of at) for (let j = 0; j < D; j++) out[j] += rows[i * D + j];
  for (let j = 0; j < D; j++) out[j] /= Math.max(at.length, 1);
  return out;
}

/** mean W_U[:, id] over ids (float64), the columns read from the weights (no copy of W_U kept) */
export async function unembedColumnsMean(
  model: LoadedModel,
  ids: number[],
  signal?: AbortSignal,
): Promise<Float64Array> {
  const { unembedRows } = await model.weightProducts({ unembedIds: ids }, signal);
  return meanRows(
    unembedRows.data,
    ids.map((_, i) => i),
    model.info.d_model,
  );
}

/** cosine between each candidate's unembedding column and the targets' mean column (one read of the columns) */
export async function unembedCosines(
  model: LoadedModel,
  targets: number[],
  candidates: number[],
  signal?: AbortSignal,
): Promise<number[]> {
  const D = model.info.d_model;
  const {
    unembedRows: { data: W },
  } = await model.weightProducts({ unembedIds: [...targets, ...candidates] }, signal);
  const t = meanRows(
    W,
    targets.map((_, i) => i),
    D,
  );
  let tn = 0;
  for (let j = 0; j < D; j++) tn += t[j] * t[j];
  return candidates.map((_, k) => {
    const o = (targets.length + k) * D;
    let dotp = 0;
    let cn = 0;
    for (let j = 0; j < D; j++) {
      const w = W[o + j];
      dotp += w * t[j];
      cn += w * w;
    }
    return dotp / Math.sqrt(Math.max(tn * cn, 1e-30));
  });
}

export function vecNorm(v: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < v.length; i++) s += v[i] * v[i];
  return Math.sqrt(s);
}

/** a seeded Gaussian vector */
export function randomVector(d: number, seed: number): Float64Array {
  const u = rng(seed);
  const v = new Float64Array(d);
  for (let i = 0; i < d; i++) v[i] = gaussian(u);
  return v;
}

export interface ResolveOptions {
  /** the steering layer (default hook of mean_diff) */
  layer: number;
  normalize?: boolean;
  prependBos?: boolean;
  store: HandleStore;
  signal?: AbortSignal;
  onProgress?: (done: number, total: number) => void;
}

export async function resolveDirection(
  model: LoadedModel,
  specIn: DirectionSpec,
  opts: ResolveOptions,
): Promise<ResolvedDirection> {
  const spec = parseDirectionSpec(specIn);
  const D = model.info.d_model;
  let vector: Float64Array;
  let description: string;
  let positive_ids: number[] = [];
  let negative_ids: number[] = [];
  let hook: string | undefined;
  const show = (ids: number[]) => ids.map((id) => JSON.stringify(model.tokenStrings([id])[0])).join(', ');

  switch (spec.kind) {
    case 'tokens': {
      positive_ids = asList(spec.positive).map((t) => resolveToken(model, t, 'direction.positive'));
      negative_ids = asList(spec.negative).map((t) => resolveToken(model, t, 'direction.negative'));
      vector = await unembedColumnsMean(model, positive_ids, opts.signal);
      description = `mean W_U[:, {${show(positive_ids)}}]`;
      if (negative_ids.length) {
        const neg = await unembedColumnsMean(model, negative_ids, opts.signal);
        for (let j = 0; j < D; j++) vector[j] -= neg[j];
        description += ` − mean W_U[:, {${show(negative_ids)}}]`;
      }
      break;
    }
    case 'mean_diff': {
      hook = spec.hook ?? `blocks.${opts.layer}.hook_resid_pre`;
      const total = spec.positive.length + spec.negative.length;
      const act = await collectActivations(model, [...spec.positive, ...spec.negative], [hook], {
        position: spec.reduce === 'mean' ? 'mean' : 'last',
        prependBos: opts.prependBos ?? true,
        signal: opts.signal,
        onProgress: opts.onProgress,
      });
      const dim = act.dims[hook];
      if (dim !== D)
        throw new LoupeError(
          'BAD_INPUT',
          `direction.hook ${hook} has ${dim} values per position, not d_model = ${D}.`,
          'Use a residual-stream hook (hook_resid_pre/mid/post, hook_attn_out, hook_mlp_out).',
        );
      const data = act.data[hook];
      vector = new Float64Array(D);
      const nPos = spec.positive.length;
      for (let i = 0; i < total; i++) {
        const w = i < nPos ? 1 / nPos : -1 / spec.negative.length;
        for (let j = 0; j < D; j++) vector[j] += w * data[i * D + j];
      }
      description =
        `mean(${hook} | ${nPos} positive prompts) − mean(${hook} | ${spec.negative.length} ` +
        `negative prompts), ${spec.reduce === 'mean' ? 'mean over positions' : 'final position'}`;
      break;
    }
    case 'head': {
      const { n_layers: L, n_heads: H } = model.info;
      if (spec.layer >= L || spec.head >= H)
        throw new LoupeError(
          'BAD_INPUT',
          `direction: L${spec.layer}H${spec.head} is not a head of this model (${L} layers × ${H} heads).`,
          `Use layer 0 … ${L - 1} and head 0 … ${H - 1}.`,
        );
      hook = `blocks.${spec.layer}.attn.hook_result`;
      const act = await collectActivations(model, [spec.prompt], [hook], {
        position: 'last',
        prependBos: opts.prependBos ?? true,
        signal: opts.signal,
        onProgress: opts.onProgress,
      });
      // hook_result is [H, d_model] per position, head-major
      vector = Float64Array.from(act.data[hook].subarray(spec.head * D, (spec.head + 1) * D));
      description = `output of L${spec.layer}H${spec.head} (hook_result at the final position of ${JSON.stringify(spec.prompt)})`;
      break;
    }
    case 'probe': {
      const p = opts.store.get<ProbeHandleValue>('probe', spec.handle);
      if (p.model_id !== model.info.id)
        throw new LoupeError(
          'BAD_INPUT',
          `Probe ${spec.handle} was trained on ${p.model_id}, not ${model.info.id}.`,
          'Capture and train the probe with the loaded model.',
        );
      if (p.weights.length !== D)
        throw new LoupeError(
          'BAD_INPUT',
          `Probe ${spec.handle} was trained on ${p.weights.length}-dimensional activations (${p.hook}), not d_model = ${D}.`,
          'Train the probe on a residual-stream hook to steer with it.',
        );
      vector = Float64Array.from(p.weights);
      hook = p.hook;
      description = `weights of probe ${spec.handle} (trained at ${p.hook})`;
      break;
    }
    case 'vector': {
      if (spec.values.length !== D)
        throw new LoupeError(
          'BAD_INPUT',
          `direction.values has ${spec.values.length} numbers; this model's d_model is ${D}.`,
        );
      vector = Float64Array.from(spec.values);
      description = `given vector (${D} numbers)`;
      break;
    }
    case 'random': {
      vector = randomVector(D, spec.seed);
      description = `random Gaussian direction (seed ${spec.seed})`;
      break;
    }
  }
  throwIfAborted(opts.signal);
  const raw = vecNorm(vector);
  if (!(raw > 0) || !Number.isFinite(raw)) {
    throw new LoupeError(
      'BAD_INPUT',
      `The direction (${description}) has norm ${raw}; it cannot steer.`,
      'Pick tokens or prompt sets that differ.',
    );
  }
  const normalized = opts.normalize ?? true;
  if (normalized) for (let j = 0; j < D; j++) vector[j] /= raw;
  return { kind: spec.kind, spec, vector, raw_norm: raw, normalized, description, positive_ids, negative_ids, hook };
}

/**
 * Direct logit effect of adding d at the end of the residual stream, ignoring the final norm's
 * scale: (w_lnf ⊙ d) · W_U[:, v] (centring d first for LayerNorm models). Used to pick default
 * target/control tokens, never as a measured effect.
 */
export async function directLogitScores(
  model: LoadedModel,
  d: ArrayLike<number>,
  signal?: AbortSignal,
): Promise<Float64Array> {
  const D = model.info.d_model;
  let w: ArrayLike<number> | undefined;
  try {
    w = model.param('ln_final.w').data;
  } catch {
    w = undefined;
  }
  const x = new Float64Array(D);
  let mu = 0;
  if (model.info.norm === 'layernorm') {
    for (let j = 0; j < D; j++) mu += d[j];
    mu /= D;
  }
  for (let j = 0; j < D; j++) x[j] = (d[j] - mu) * (w ? w[j] : 1);
  // streamed over W_U's rows by the engine, in float64: no [D, V] copy of W_U here
  return (await model.weightProducts({ unembedDots: { dims: [1, D], data: x } }, signal)).unembedDots.data;
}

/** the directions' public block in documents */
export function directionBlock(d: ResolvedDirection) {
  return {
    kind: d.kind,
    spec: d.spec,
    description: d.description,
    raw_norm: d.raw_norm,
    normalized: d.normalized,
    norm: d.normalized ? 1 : d.raw_norm,
    ...(d.hook ? { hook: d.hook } : {}),
  };
}

export const directionBlockSchema = z.object({
  kind: z.enum(['tokens', 'mean_diff', 'head', 'probe', 'vector', 'random']),
  spec: directionObject,
  description: z.string(),
  raw_norm: z.number().describe('‖d‖ before normalisation'),
  normalized: z.boolean(),
  norm: z.number().describe('norm of the vector actually added per unit α'),
  hook: z.string().optional(),
});
