/**
 * `dashboard` (what Neuronpedia shows for a latent, computed locally): for one subject — an MLP
 * neuron, an SAE feature or a direction at a hook — scan a corpus and report its max-activating
 * windows with per-token activations, the histogram of its activations, and the tokens it
 * promotes and suppresses through the direct path.
 *
 * Subject activations at a position t (x_t = the hook's value there, flattened past [B, T]):
 *   neuron    (layer l, index n): blocks.{l}.mlp.hook_post[t, n]
 *   feature   (SAE, index f):     {hook}.hook_sae_acts_post[t, f] with the SAE spliced in
 *   direction (hook, v):          x_t · v (v as given; a probe handle's weights without its bias)
 * Corpus: lib/corpus.ts (text, JSON Lines or generated samples → windows of ≤ `window` tokens,
 * BOS prepended). Only content positions count: BOS is context, never an example or a histogram entry.
 * Direct path: the subject's vector r in the residual stream (neuron: W_out[n]; feature: W_dec[f]
 * mapped through lib/sae.ts residualMap; direction: v mapped the same way), then lib/directions.ts
 * directLogitScores: ((r − mean r) for LayerNorm) ⊙ w_lnf · W_U — the final norm's weight folded
 * in, its per-position scale 1/s not applied, no biases — per unit of activation.
 *
 * Batched: `batch_size` windows per engine run (shorter windows right-padded, which a causal model
 * ignores at the real positions), only the subject's hook fetched. Documents are cached in the
 * process (per loaded model) and in the surface's store when it gives one (ctx.documents: the
 * page's IndexedDB, Node's cache folder), under SHA-256 of (model, subject, corpus, settings).
 */
import { z } from 'zod';
import type { LoadedModel, RunOptions } from '../engine/api';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { documentBase, documentHead, modelBlockOf, tokenEntry } from '../schema/common';
import { defineOperation, formWhen, type OpContext } from './types';
import { CAPS, checkTopK, finite } from '../engine/caps';
import { directLogitScores, type ProbeHandleValue } from './lib/directions';
import { vocabFilter } from './lib/vocab';
import { storeOf } from './lib/handle-store';
import { tokenEntries } from './lib/tokens';
import {
  actsHook,
  checkActsSize,
  checkFeature,
  ensureSae,
  residualMap,
  saeBlock,
  saeBlockSchema,
  type AttachedSae,
  type ResidualMapResult,
} from './lib/sae';
import {
  corpusTexts,
  generateSamples,
  MAX_SAMPLES,
  sha256Hex,
  tokenizeDocuments,
  windowsOf,
  type CorpusDocument,
  type CorpusWindow,
} from './lib/corpus';

export const SUBJECTS = ['neuron', 'feature', 'direction'] as const;
/** the fields of one subject kind (a form shows them only for that kind: formWhen in ops/types.ts) */
const when = (kind: (typeof SUBJECTS)[number]) => formWhen({ subject: [kind] });

const input = z.object({
  subject: z
    .enum(SUBJECTS)
    .default('neuron')
    .describe(
      'what to build the dashboard for: an MLP neuron (layer, neuron), an SAE feature (sae_source, sae_path, feature) or a direction (hook, direction)',
    ),
  layer: z.number().int().min(0).optional().describe('neuron: its layer').meta(when('neuron')),
  neuron: z
    .number()
    .int()
    .min(0)
    .optional()
    .describe('neuron: its index in blocks.{layer}.mlp.hook_post (0 … d_mlp − 1)')
    .meta(when('neuron')),
  sae_source: z
    .string()
    .optional()
    .describe(
      "feature: where the SAE lives (SAELens layout): a Hub repo 'owner/name[@revision]', an http(s) " +
        'URL of a folder, or a local folder (CLI; over MCP only inside a folder the companion allows with ' +
        '--allow-local)',
    )
    .meta(when('feature')),
  sae_path: z
    .string()
    .default('')
    .describe("feature: the SAE's folder inside sae_source ('' = its root)")
    .meta(when('feature')),
  feature: z.number().int().min(0).optional().describe('feature: its index (0 … d_sae − 1)').meta(when('feature')),
  hook: z
    .string()
    .optional()
    .describe("direction: the hook it is read at, e.g. blocks.1.hook_resid_pre (default: a probe handle's own hook)")
    .meta(when('direction')),
  direction: z
    .union([z.string(), z.array(z.number()).min(1)])
    .optional()
    .describe(
      'direction: its numbers (one per value of the hook at a position) or "probe:<handle>" (a probe operation\'s handle: its weights, bias not added)',
    )
    .meta(when('direction')),
  // contentMediaType: the page's form offers a file drop/pick for it
  corpus: z
    .string()
    .default('')
    .meta({ contentMediaType: 'text/plain' })
    .describe(
      'corpus text: plain text (documents separated by blank lines) or JSON Lines with a "text" field per line',
    ),
  corpus_format: z
    .enum(['auto', 'text', 'jsonl'])
    .default('auto')
    .describe('how to read corpus: auto = JSON Lines when it starts with "{", else plain text'),
  samples: z
    .number()
    .int()
    .min(0)
    .max(MAX_SAMPLES)
    .default(0)
    .describe(
      'also generate this many samples from BOS with the loaded model and scan them (deterministic: sample i uses seed + i)',
    ),
  sample_length: z.number().int().min(1).default(32).describe('tokens per generated sample'),
  seed: z.number().int().default(0).describe('seed of the generated samples'),
  temperature: z
    .number()
    .min(0)
    .default(1)
    .describe('sampling temperature of the generated samples (0 = greedy: every sample the same)'),
  window: z
    .number()
    .int()
    .min(1)
    .default(32)
    .describe('tokens per window (BOS not counted); documents are cut into consecutive windows'),
  prepend_bos: z.boolean().default(true).describe('prepend BOS to every window'),
  batch_size: z.number().int().min(1).max(CAPS.maxBatch).default(16).describe('windows per engine run'),
  top_k: z.number().int().min(1).default(10).describe('max-activating windows listed'),
  top_tokens: z.number().int().min(1).default(10).describe('promoted and suppressed tokens listed'),
  bins: z.number().int().min(1).max(200).default(30).describe('histogram bins'),
});
export type DashboardInput = z.input<typeof input>;
type Parsed = z.output<typeof input>;

/** one example window: its tokens and the activation at each */
const exampleSchema = z.object({
  rank: z.number().int(),
  window: z.number().int().describe('index of the window in the corpus'),
  document: z.number().int(),
  start: z.number().int().describe("offset of the window's first token in its document"),
  origin: z.enum(['text', 'generated']),
  tokens: z.array(tokenEntry).describe("the window's tokens (BOS, when prepended, not listed)"),
  values: z.array(z.number()).describe('the activation at each token'),
  max: z.number(),
  max_position: z.number().int().describe('index into tokens'),
  min: z.number(),
  min_position: z.number().int().describe('index into tokens'),
});

const tokenWeight = z.object({ token: z.string(), token_id: z.number().int(), weight: z.number() });

const output = documentBase('dashboard').extend({
  subject: z.object({
    kind: z.enum(SUBJECTS),
    label: z.string().describe('e.g. "L1 N42", "feature 7", "direction at blocks.1.hook_resid_pre"'),
    hook: z.string().describe('the hook whose values give the activation'),
    layer: z.number().int().nullable(),
    index: z.number().int().nullable().describe('the neuron or feature index; null for a direction'),
    sae: saeBlockSchema.nullable(),
    direction: z
      .object({
        source: z.enum(['inline', 'probe']),
        handle: z.string().nullable(),
        size: z.number().int(),
        norm: z.number(),
      })
      .nullable(),
  }),
  corpus: z.object({
    format: z.enum(['text', 'jsonl', 'generated', 'text+generated']),
    documents: z.number().int(),
    windows: z.number().int(),
    tokens: z.number().int().describe('content tokens scanned (BOS not counted)'),
    window: z.number().int(),
    prepend_bos: z.boolean(),
    samples: z
      .object({ n: z.number().int(), length: z.number().int(), seed: z.number().int(), temperature: z.number() })
      .nullable(),
    hash: z.string().describe('SHA-256 of the corpus text and the sample settings'),
  }),
  examples: z
    .array(exampleSchema)
    .describe('the top_k windows by their maximum activation, descending (ties: earlier window first)'),
  examples_min: z
    .array(exampleSchema)
    .describe(
      'the top_k windows by their minimum activation, most negative first (ties: ' +
        'earlier window first); empty when no activation is negative. A gated (SwiGLU, GeGLU) ' +
        'neuron or a direction acts through both signs: its strongest effect may come from its minima',
    ),
  dominant: z
    .enum(['max', 'min'])
    .describe('the sign of the larger extreme: max when max ≥ |min|, else min (the view leads with those examples)'),
  histogram: z.object({
    positions: z.number().int().describe('activations counted (every content token of every window)'),
    zeros: z.number().int().describe('exactly 0'),
    positive: z.number().int(),
    negative: z.number().int(),
    density: z.number().describe('positive / positions: how often the subject fires'),
    min: z.number(),
    max: z.number(),
    mean: z.number(),
    edges: z.array(z.number()).describe('bins + 1 equal-width edges over [min, max] of the nonzero activations'),
    counts: z
      .array(z.number().int())
      .describe('nonzero activations per bin (bin i: edges[i] ≤ a < edges[i+1], the last bin closed)'),
  }),
  direct_path: z.object({
    available: z.boolean(),
    reason: z.string().nullable(),
    vector: z.string().nullable().describe("the subject's vector in the residual stream, in words"),
    final_norm_weight_applied: z.boolean(),
    centered: z.boolean(),
    norm_scale_applied: z.literal(false),
    promoted: z.array(tokenWeight).describe('largest weights first'),
    suppressed: z.array(tokenWeight).describe('most negative first'),
    excluded: z
      .object({ count: z.number().int(), rule: z.string() })
      .describe(
        'tokens never listed (lib/vocab.ts): special, undecodable or untrained ones, which tie at the top of an untrained vocabulary',
      ),
  }),
  cache: z.object({
    key: z.string(),
    hit: z.boolean().describe('true when this document came from a cache'),
    from: z
      .enum(['computed', 'process', 'store'])
      .describe(
        "computed now, or read from the process's memory or from the surface's store (IndexedDB, cache folder)",
      ),
    scope: z.string().describe('where dashboards are kept'),
  }),
  engine_runs: z.number().int(),
  method: z.string(),
});
/** the document, for this module's helpers (elsewhere: OperationDocument<'dashboard'>, ops/index.ts) */
type DashboardDocument = z.output<typeof output>;

const IN_PROCESS = 'in the process, per loaded model (the last 16)';
const scopeOf = (ctx: OpContext) => (ctx.documents ? `${IN_PROCESS}, and ${ctx.documents.where}` : IN_PROCESS);
const cache = new WeakMap<LoadedModel, Map<string, DashboardDocument>>();

function remember(byKey: Map<string, DashboardDocument>, key: string, doc: DashboardDocument): void {
  byKey.set(key, doc);
  if (byKey.size > 16) byKey.delete(byKey.keys().next().value!);
}

function bad(message: string, hint: string): LoupeError {
  return new LoupeError('BAD_INPUT', message, hint);
}

interface Subject {
  kind: Parsed['subject'];
  label: string;
  hook: string;
  layer: number | null;
  index: number | null;
  sae: AttachedSae | null;
  direction: { source: 'inline' | 'probe'; handle: string | null; vector: Float64Array } | null;
  /** values per position at the hook */
  width: number;
  /** what identifies the subject in the cache key */
  key: unknown;
}

const layerOf = (hook: string) => {
  const m = /^blocks\.(\d+)\./.exec(hook);
  return m ? Number(m[1]) : null;
};

async function resolveSubject(model: LoadedModel, inp: Parsed, ctx: OpContext): Promise<Subject> {
  const { n_layers: L, d_mlp: M } = model.info;
  if (inp.subject === 'neuron') {
    if (inp.layer === undefined || inp.neuron === undefined)
      throw bad('A neuron dashboard needs layer and neuron.', `Give layer (0 … ${L - 1}) and neuron (0 … ${M - 1}).`);
    if (inp.layer >= L)
      throw bad(`layer ${inp.layer} does not exist: the model has ${L} layers.`, `Use layer 0 … ${L - 1}.`);
    if (inp.neuron >= M)
      throw bad(
        `neuron ${inp.neuron} does not exist: layer ${inp.layer}'s MLP has ${M} neurons.`,
        `Use neuron 0 … ${M - 1}.`,
      );
    const hook = `blocks.${inp.layer}.mlp.hook_post`;
    return {
      kind: 'neuron',
      label: `L${inp.layer} N${inp.neuron}`,
      hook,
      layer: inp.layer,
      index: inp.neuron,
      sae: null,
      direction: null,
      width: M,
      key: [hook, inp.neuron],
    };
  }
  if (inp.subject === 'feature') {
    if (!inp.sae_source || inp.feature === undefined)
      throw bad(
        'A feature dashboard needs sae_source (and sae_path) and feature.',
        'Give the SAE (SAELens layout) as for sae_features, and a feature index.',
      );
    ctx.onProgress?.({ stage: 'loading SAE', done: 0, total: 1 });
    const sae = await ensureSae(model, { source: inp.sae_source, path: inp.sae_path }, ctx);
    checkFeature(sae, inp.feature);
    return {
      kind: 'feature',
      label: `feature ${inp.feature}`,
      hook: sae.info.hook,
      layer: layerOf(sae.info.hook),
      index: inp.feature,
      sae,
      direction: null,
      width: sae.info.d_sae,
      key: [sae.id, inp.feature],
    };
  }
  if (inp.direction === undefined)
    throw bad(
      'A direction dashboard needs direction (numbers, or "probe:<handle>") and hook.',
      'Give direction as a list of numbers with hook, e.g. hook blocks.1.hook_resid_pre, or "probe:<handle>" from the probe operation.',
    );
  let hook = inp.hook;
  let vector: Float64Array;
  let source: 'inline' | 'probe' = 'inline';
  let handle: string | null = null;
  if (typeof inp.direction === 'string') {
    const m = /^probe:\s*(\S+)$/.exec(inp.direction.trim());
    if (!m)
      throw bad(
        `Cannot read the direction ${JSON.stringify(inp.direction)}.`,
        'Give a list of numbers, or "probe:<handle>" (the handle a probe operation returned).',
      );
    const p = storeOf(ctx).get<ProbeHandleValue>('probe', m[1]);
    if (p.model_id !== model.info.id)
      throw bad(
        `Probe ${m[1]} was trained on ${p.model_id}, not ${model.info.id}.`,
        'Capture and train the probe with the loaded model.',
      );
    if (hook !== undefined && hook !== p.hook)
      throw bad(
        `Probe ${m[1]} was trained at ${p.hook}, not at hook ${hook}.`,
        `Leave hook out (the probe's own hook is used) or give ${p.hook}.`,
      );
    hook = p.hook;
    vector = Float64Array.from(p.weights);
    source = 'probe';
    handle = m[1];
  } else {
    if (!hook)
      throw bad(
        'A direction given as numbers needs hook: where it is read.',
        'Give hook, e.g. blocks.0.hook_resid_post.',
      );
    vector = Float64Array.from(inp.direction);
  }
  if (!model.hookNames().includes(hook)) {
    throw new LoupeError(
      'UNKNOWN_HOOK',
      `This model has no hook ${JSON.stringify(hook)}.`,
      `Use a hook such as blocks.0.hook_resid_pre or blocks.${L - 1}.mlp.hook_post (\`loupe activations\` lists them).`,
    );
  }
  const dims = model.hookShape(hook, 1, 2);
  if (dims[1] !== 2 || /hook_pattern$|hook_attn_scores$/.test(hook)) {
    throw bad(
      `${hook} is not a per-position activation, so a direction cannot be read there.`,
      'Use a hook shaped [batch, position, …], e.g. a residual-stream hook, mlp.hook_post or attn.hook_z.',
    );
  }
  const width = dims.slice(2).reduce((a, b) => a * b, 1);
  if (vector.length !== width)
    throw bad(
      `direction has ${vector.length} numbers; ${hook} has ${width} values per position.`,
      `Give ${width} numbers.`,
    );
  let n2 = 0;
  for (const x of vector) n2 += x * x;
  if (!(n2 > 0) || !Number.isFinite(n2))
    throw bad('The direction is zero (or not finite).', 'Give a nonzero direction.');
  return {
    kind: 'direction',
    label: `direction at ${hook}`,
    hook,
    layer: layerOf(hook),
    index: null,
    sae: null,
    direction: { source, handle, vector },
    width,
    key: [hook, Array.from(vector)],
  };
}

/** the subject's hook-space vector whose residual image the direct path reads */
function hookVector(s: Subject): { v: Float64Array | ArrayLike<number>; words: string } {
  if (s.kind === 'neuron') {
    const v = new Float64Array(s.width);
    v[s.index!] = 1;
    return { v, words: `W_out[${s.index}] (row of blocks.${s.layer}.mlp.W_out)` };
  }
  if (s.kind === 'feature') {
    const dIn = s.sae!.info.d_in;
    return {
      v: s.sae!.weight('W_dec').data.subarray(s.index! * dIn, (s.index! + 1) * dIn),
      words: `W_dec[${s.index}] mapped into the residual stream`,
    };
  }
  return { v: s.direction!.vector, words: `v mapped into the residual stream` };
}

async function directPath(
  model: LoadedModel,
  s: Subject,
  k: number,
  signal?: AbortSignal,
): Promise<DashboardDocument['direct_path']> {
  const map: ResidualMapResult = residualMap(model, s.hook);
  const layerNorm = model.info.norm === 'layernorm';
  if (map.kind === null) {
    return {
      available: false,
      reason: map.reason,
      vector: null,
      final_norm_weight_applied: false,
      centered: false,
      norm_scale_applied: false,
      promoted: [],
      suppressed: [],
      excluded: { count: 0, rule: 'no direct path, so no token listed' },
    };
  }
  const { v, words } = hookVector(s);
  const scores = await directLogitScores(model, map.push(v), signal);
  // tokens no text produces or no page shows, and untrained ones (tied at the top of an untrained vocabulary), never listed
  const vocab = await vocabFilter(model, signal);
  const order = Array.from({ length: scores.length }, (_, i) => i)
    .filter(vocab.usable)
    .sort((a, b) => scores[b] - scores[a] || a - b);
  const n = Math.min(k, order.length);
  const entry = (id: number) => ({ token: model.tokenStrings([id])[0], token_id: id, weight: finite(scores[id]) });
  return {
    available: true,
    reason: null,
    vector: `${words} (${map.description})`,
    final_norm_weight_applied: true,
    centered: layerNorm,
    norm_scale_applied: false,
    promoted: order.slice(0, n).map(entry),
    suppressed: order.slice(-n).reverse().map(entry),
    excluded: { count: scores.length - order.length, rule: vocab.rule },
  };
}

/** activations at every content position of a batch's windows, read from one run */
function readBatch(s: Subject, data: Float32Array, T: number, rows: CorpusWindow[], bos: number): number[][] {
  const W = s.width;
  return rows.map((w, b) => {
    const vals: number[] = [];
    for (let i = 0; i < w.ids.length; i++) {
      const o = (b * T + bos + i) * W;
      if (s.kind === 'direction') {
        const v = s.direction!.vector;
        let acc = 0;
        for (let j = 0; j < W; j++) acc += data[o + j] * v[j];
        vals.push(finite(acc));
      } else {
        vals.push(finite(data[o + s.index!]));
      }
    }
    return vals;
  });
}

function histogram(acts: number[][], nBins: number): DashboardDocument['histogram'] {
  let positions = 0,
    zeros = 0,
    positive = 0,
    negative = 0,
    sum = 0;
  let min = Infinity,
    max = -Infinity,
    lo = Infinity,
    hi = -Infinity;
  for (const row of acts)
    for (const a of row) {
      positions++;
      sum += a;
      if (a < min) min = a;
      if (a > max) max = a;
      if (a === 0) {
        zeros++;
        continue;
      }
      if (a > 0) positive++;
      else negative++;
      if (a < lo) lo = a;
      if (a > hi) hi = a;
    }
  const counts = new Array<number>(nBins).fill(0);
  let edges: number[];
  if (lo > hi) {
    edges = Array.from({ length: nBins + 1 }, () => 0);
  } else {
    const width = (hi - lo) / nBins;
    edges = Array.from({ length: nBins + 1 }, (_, i) => (i === nBins ? hi : lo + i * width));
    for (const row of acts)
      for (const a of row) {
        if (a === 0) continue;
        const i = width > 0 ? Math.min(nBins - 1, Math.floor((a - lo) / width)) : 0;
        counts[i]++;
      }
  }
  return {
    positions,
    zeros,
    positive,
    negative,
    density: positions ? positive / positions : 0,
    min: positions ? min : 0,
    max: positions ? max : 0,
    mean: positions ? sum / positions : 0,
    edges,
    counts,
  };
}

export const operation = defineOperation({
  name: 'dashboard',
  title: 'Dashboard',
  description:
    'A Neuronpedia-style dashboard computed locally, for an MLP neuron (layer, neuron: ' +
    'blocks.{l}.mlp.hook_post), an SAE feature (sae_source/sae_path, feature) or a direction (hook + numbers, ' +
    'or "probe:<handle>"; activation = hook value · v) over a corpus: text given inline (plain text split at ' +
    'blank lines, or JSON Lines with a "text" field) and/or samples the model generates (samples, ' +
    'sample_length, seed). ' +
    "Returns the top_k max-activating windows with every token's activation, a histogram of " +
    'the nonzero activations with zero/positive counts and density, and the top promoted/suppressed ' +
    'tokens through the direct path (subject vector in the residual stream, centred for LayerNorm, ' +
    '⊙ final-norm weight, · W_U; no norm scale, no biases; per unit activation). ' +
    "Cost: one forward per batch_size windows of `window` tokens (only the subject's " +
    'hook fetched), plus generation when samples > 0; cached per model + corpus hash ' +
    "+ subject (in the process, and in the page's IndexedDB or the Node cache folder).",
  input,
  output,
  long: true,
}).implement(async (model, inp, ctx) => {
  checkTopK(inp.top_k);
  checkTopK(inp.top_tokens, 'top_tokens');
  const subject = await resolveSubject(model, inp, ctx);
  const bosId = model.bosTokenId;
  const bos = inp.prepend_bos && bosId !== undefined ? 1 : 0;
  const limit = Math.min(model.info.n_ctx, CAPS.maxTokens) - bos;
  if (subject.sae)
    checkActsSize(
      subject.sae,
      inp.batch_size * (inp.window + bos),
      `One batch (batch_size ${inp.batch_size} × window ${inp.window}${bos ? ' + BOS' : ''})`,
    );
  if (inp.window > limit)
    throw bad(
      `window ${inp.window} does not fit the model's context (n_ctx = ${model.info.n_ctx}${bos ? ', BOS included' : ''}).`,
      `Use window ≤ ${limit}.`,
    );
  if (inp.samples > 0 && inp.sample_length > CAPS.maxNewTokens)
    throw new LoupeError(
      'TOO_LARGE',
      `sample_length ${inp.sample_length} exceeds the cap of ${CAPS.maxNewTokens}.`,
      `Use sample_length ≤ ${CAPS.maxNewTokens}.`,
    );
  if (inp.samples > 0 && 1 + inp.sample_length > model.info.n_ctx)
    throw bad(
      `sample_length ${inp.sample_length} does not fit the model's context (n_ctx = ${model.info.n_ctx}, BOS included).`,
      `Use sample_length ≤ ${model.info.n_ctx - 1}.`,
    );

  // ---- the corpus: parsed and checked before any engine run
  const parsed = inp.corpus.trim() ? corpusTexts(inp.corpus, inp.corpus_format) : null;
  if (!parsed?.texts.length && inp.samples === 0) {
    throw bad(
      parsed ? 'The corpus has no documents (only blank lines or empty texts).' : 'The corpus is empty.',
      'Give corpus text (plain text, or JSON Lines with a "text" field), or samples > 0 to scan text the model generates.',
    );
  }
  const samples =
    inp.samples > 0
      ? { n: inp.samples, length: inp.sample_length, seed: inp.seed, temperature: inp.temperature }
      : null;
  const hash = await sha256Hex(JSON.stringify({ corpus: inp.corpus, format: parsed?.format ?? null, samples }));
  const key = await sha256Hex(
    JSON.stringify({
      model: modelBlockOf(model),
      subject: subject.key,
      hash,
      window: inp.window,
      bos,
      top_k: inp.top_k,
      top_tokens: inp.top_tokens,
      bins: inp.bins,
    }),
  );
  let byKey = cache.get(model);
  if (!byKey) cache.set(model, (byKey = new Map()));
  const hit = byKey.get(key);
  if (hit) {
    ctx.onProgress?.({ stage: 'from the cache', done: 1, total: 1 });
    return { ...hit, cache: { ...hit.cache, hit: true, from: 'process', scope: scopeOf(ctx) } };
  }
  // a stored document is used only when it is still a valid document of this key
  const stored = output.safeParse(await ctx.documents?.get('dashboard', key));
  if (stored.success && stored.data.cache.key === key) {
    ctx.onProgress?.({ stage: 'from the cache', done: 1, total: 1 });
    const doc = {
      ...stored.data,
      cache: { ...stored.data.cache, hit: true, from: 'store' as const, scope: scopeOf(ctx) },
    };
    remember(byKey, key, doc);
    return doc;
  }

  let runs = 0;
  const documents: CorpusDocument[] = parsed ? tokenizeDocuments(model, parsed.texts) : [];
  if (samples) {
    const g = await generateSamples(model, {
      ...samples,
      signal: ctx.signal,
      onProgress: (done, total) => ctx.onProgress?.({ stage: 'generating samples (tokens)', done, total }),
    });
    documents.push(...g.documents);
    runs += g.runs;
  }
  const windows = windowsOf(documents, inp.window);
  if (windows.length === 0) throw bad('The corpus tokenizes to no tokens.', 'Give text the tokenizer keeps.');

  // ---- batched scan: one run per batch, only the subject's hook
  const acts: number[][] = [];
  const pad = model.eosTokenId ?? 0;
  const hookName = subject.sae ? actsHook(subject.sae) : subject.hook;
  for (let first = 0; first < windows.length; first += inp.batch_size) {
    throwIfAborted(ctx.signal);
    ctx.onProgress?.({ stage: 'scanning windows', done: first, total: windows.length });
    const rows = windows.slice(first, first + inp.batch_size);
    const T = bos + Math.max(...rows.map((w) => w.ids.length));
    const tokens = rows.map((w) => {
      const ids = bos ? [bosId!, ...w.ids] : [...w.ids];
      while (ids.length < T) ids.push(pad); // right padding: the real positions never attend to it
      return ids;
    });
    const opts: RunOptions = { hooks: [hookName], logitPositions: [0], signal: ctx.signal };
    if (subject.sae) opts.sae = subject.sae.id;
    else opts.lean = true;
    const res = await model.run(tokens, opts);
    runs++;
    acts.push(...readBatch(subject, res.hooks[hookName].data, T, rows, bos));
  }
  ctx.onProgress?.({ stage: 'scanning windows', done: windows.length, total: windows.length });

  // ---- top windows (by the maximum, and by the minimum when any activation is negative), histogram, direct path
  const extremes = acts.map((row) => {
    let hi = 0,
      lo = 0;
    for (let i = 1; i < row.length; i++) {
      if (row[i] > row[hi]) hi = i;
      if (row[i] < row[lo]) lo = i;
    }
    return { hi, max: row[hi], lo, min: row[lo] };
  });
  const example = (wi: number, rank: number) => {
    const w = windows[wi];
    const x = extremes[wi];
    return {
      rank,
      window: wi,
      document: w.document,
      start: w.start,
      origin: documents[w.document].origin,
      tokens: tokenEntries(model, w.ids),
      values: acts[wi],
      max: x.max,
      max_position: x.hi,
      min: x.min,
      min_position: x.lo,
    };
  };
  const all = windows.map((_, i) => i);
  const examples = all
    .sort((a, b) => extremes[b].max - extremes[a].max || a - b)
    .slice(0, inp.top_k)
    .map(example);
  const examplesMin = windows
    .map((_, i) => i)
    .filter((i) => extremes[i].min < 0)
    .sort((a, b) => extremes[a].min - extremes[b].min || a - b)
    .slice(0, inp.top_k)
    .map(example);
  const tokens = acts.reduce((a, r) => a + r.length, 0);
  const hist = histogram(acts, inp.bins);
  const direct = await directPath(model, subject, inp.top_tokens, ctx.signal);
  const format = parsed && samples ? 'text+generated' : parsed ? parsed.format : 'generated';

  const activation =
    subject.kind === 'neuron'
      ? `blocks.${subject.layer}.mlp.hook_post[t, ${subject.index}] (post-activation)`
      : subject.kind === 'feature'
        ? `${hookName}[t, ${subject.index}] with the SAE spliced in at ${subject.hook}`
        : `${subject.hook}[t] · v (${subject.width} ` +
          `numbers${subject.direction!.source === 'probe' ? `, probe ${subject.direction!.handle}'s weights, bias not added` : ', as given, not normalised'})`;
  const corpusText = parsed
    ? `${parsed.texts.length} ${parsed.format === 'jsonl' ? 'JSON Lines records' : 'plain-text documents (split at blank lines)'}`
    : '';
  const samplesText = samples
    ? `${samples.n} samples of ${samples.length} tokens generated from BOS (temperature ${samples.temperature}, ` +
      `sample i with seed ${samples.seed} + i, stopped at EOS)`
    : '';
  const directText = direct.available
    ? `weight(token) = ${model.info.norm === 'layernorm' ? '(r − mean r)' : 'r'} ⊙ w_lnf · W_U[:, token], ` +
      `r = ${direct.vector}; the final norm's weight is folded in, its scale 1/s (position-dependent) is not, ` +
      'and no bias is added, so weights rank tokens per unit of activation and are not logits of a run ' +
      `(a negative activation swaps the promoted and suppressed lists); ${direct.excluded.rule}`
    : `not available: ${direct.reason}`;
  const method =
    `Activation at token t: ${activation}. ` +
    `Corpus: ${corpusText}${parsed && samples ? ' and ' : ''}${samplesText}, ` +
    `tokenized without BOS and cut into consecutive windows of ≤ ${inp.window} ` +
    `tokens${bos ? ', each run as [BOS] + window; BOS is context only, not an example or a histogram entry' : ''}. ` +
    `${inp.batch_size} windows per engine run, shorter ones right-padded (causal attention: padding does not change the real positions). ` +
    `Examples: the ${inp.top_k} windows with the largest maximum activation, and (when any activation is ` +
    `negative) the ${inp.top_k} with the most negative minimum. Histogram: ${inp.bins} equal-width bins over ` +
    '[min, max] of the nonzero activations; zeros counted apart; density = fraction of tokens with ' +
    'activation > 0. ' +
    `Direct path: ${directText}. ` +
    `Cache: ${scopeOf(ctx)}, under SHA-256 of (model, subject, corpus, settings).`;

  const doc: DashboardDocument = {
    ...documentHead('dashboard', model, '', []),
    subject: {
      kind: subject.kind,
      label: subject.label,
      hook: subject.hook,
      layer: subject.layer,
      index: subject.index,
      sae: subject.sae ? saeBlock(subject.sae) : null,
      direction: subject.direction
        ? {
            source: subject.direction.source,
            handle: subject.direction.handle,
            size: subject.width,
            norm: finite(Math.sqrt(subject.direction.vector.reduce((a, x) => a + x * x, 0))),
          }
        : null,
    },
    corpus: {
      format,
      documents: documents.length,
      windows: windows.length,
      tokens,
      window: inp.window,
      prepend_bos: bos === 1,
      samples,
      hash,
    },
    examples,
    examples_min: examplesMin,
    dominant: hist.max >= -hist.min ? 'max' : 'min',
    histogram: hist,
    direct_path: direct,
    cache: { key, hit: false, from: 'computed', scope: scopeOf(ctx) },
    engine_runs: runs,
    method,
  };
  remember(byKey, key, doc);
  await ctx.documents?.put('dashboard', key, doc);
  return doc;
});
