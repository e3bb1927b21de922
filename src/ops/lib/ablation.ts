/**
 * Ablation specs → engine interventions, and batched runs of many ablation variants.
 *
 * A target is one thing to knock out: a head (its `attn.hook_z` slice), an MLP neuron (its
 * `mlp.hook_post` index), a component of a layer (resid_pre/mid/post, attn_out, mlp_out,
 * mlp_post) or a whole layer (attn_out and mlp_out together, so resid_post = resid_pre under
 * zero ablation). A method says what replaces it:
 *  - zero      x' = 0
 *  - mean      x' = the mean of the clean activation over the prompt's positions (BOS included),
 *              or over every position of a supplied set of prompts
 *  - resample  x' = the activation of the same site in another prompt at the same position
 *              (a given prompt, or random tokens drawn from a seed)
 * at all or chosen positions. Mean and resample are compiled to the engine's `patch` op with a
 * source tensor of the full site shape, so the engine selects the head/neuron slice itself and
 * no convention about the length of a `value` vector is needed.
 *
 * `runVariants` packs many variants (each a list of interventions) into as few engine runs as
 * the batch cap allows: each intervention carries `batch: [row]` for its variant's row.
 */
import { z } from 'zod';
import type {
  DeviceTensor,
  Intervention,
  InterventionRecord,
  LoadedModel,
  LogitReduce,
  LogitRow,
  RunResult,
} from '../../engine/api';
import type { Tensor } from '../../engine/tensor';
import { LoupeError, throwIfAborted } from '../../engine/errors';
import type { OpContext } from '../types';
import { CAPS, checkTokenCount, finite } from '../../engine/caps';
import { promptFields, promptIds, resolveToken, tokenText } from './tokens';
import { argmax, logSoftmax, rng } from './math';
import { requireHeads, runHook } from './dla';

// ------------------------------------------------------------------ caps local to these operations

/** variants (distinct ablations/patches) one operation may run; a patch scan of a 12-layer model at 128 tokens is ~4.7k */
export const MAX_VARIANTS = 20_000;
/** prompts a mean over a prompt set may use */
export const MAX_MEAN_PROMPTS = 64;

export function checkVariants(n: number, what: string, hint: string): void {
  if (n > MAX_VARIANTS)
    throw new LoupeError(
      'TOO_LARGE',
      `${what} needs ${n} ablation variants, more than the cap of ${MAX_VARIANTS}.`,
      hint,
    );
}

// ------------------------------------------------------------------ input pieces shared by the four operations

export const COMPONENTS = ['resid_pre', 'resid_mid', 'resid_post', 'attn_out', 'mlp_out', 'mlp_post', 'layer'] as const;
export type Component = (typeof COMPONENTS)[number];
export const METHODS = ['zero', 'mean', 'resample'] as const;
export type AblationMethod = (typeof METHODS)[number];

/** prompt fields plus raw token ids (random byte sequences are not valid text) */
export const promptOrIdsFields = {
  ...promptFields,
  prompt: z
    .string()
    .default('')
    .describe(
      'The text to run. BOS is prepended (TransformerLens prepend_bos) unless prepend_bos is false. May be omitted when token_ids is given.',
    ),
  token_ids: z
    .array(z.number().int().min(0))
    .min(1)
    .optional()
    .describe(
      'Run exactly these token ids instead of tokenizing prompt (no BOS is added): for sequences that are not valid text, e.g. random bytes.',
    ),
};

/**
 * The patching operations' pair of runs: a clean prompt and a corrupted one of as many tokens
 * (each as text or token ids), and the answer whose logit counts; `roles` says, in words, what
 * each run is for in this operation.
 */
export function cleanCorruptedFields(roles: { clean?: string; corrupted?: string }) {
  const role = (r?: string) => (r ? ` (${r})` : '');
  return {
    ...promptOrIdsFields,
    prompt: promptOrIdsFields.prompt.describe(
      `The CLEAN prompt${role(roles.clean)}. BOS is prepended unless prepend_bos is false.`,
    ),
    token_ids: promptOrIdsFields.token_ids.describe('Clean token ids, used exactly instead of prompt.'),
    corrupted_prompt: z
      .string()
      .default('')
      .describe(`The corrupted prompt${role(roles.corrupted)}; must have as many tokens as the clean one.`),
    corrupted_token_ids: z
      .array(z.number().int().min(0))
      .min(1)
      .optional()
      .describe('Corrupted token ids, used exactly instead of corrupted_prompt.'),
    answer: z
      .string()
      .optional()
      .describe('Token (text or "#id") whose logit counts positively; default the clean prediction.'),
  };
}

/**
 * The corrupted run's ids (corrupted_prompt, or corrupted_token_ids used exactly): BAD_INPUT
 * unless it has the T tokens of the clean one (`clean` names it; `needs`: what needs equal lengths).
 */
export function corruptedIds(
  model: LoadedModel,
  input: { corrupted_prompt: string; prepend_bos: boolean; corrupted_token_ids?: number[] },
  T: number,
  why: { clean?: string; needs: string; hint: string },
): { ids: number[]; prompt: string } {
  const corrupted = inputIds(
    model,
    { prompt: input.corrupted_prompt, prepend_bos: input.prepend_bos, token_ids: input.corrupted_token_ids },
    'corrupted_token_ids',
  );
  if (corrupted.ids.length !== T)
    throw new LoupeError(
      'BAD_INPUT',
      `${why.clean ?? 'The clean prompt'} has ${T} tokens and the corrupted prompt ${corrupted.ids.length}; ${why.needs} needs equal token lengths.`,
      why.hint,
    );
  return corrupted;
}

export const positionsField = z
  .union([z.literal('all'), z.array(z.number().int().min(0)).min(1)])
  .default('all')
  .describe('Token positions to ablate (0-based, BOS included), or "all".');

/** ids of the prompt (or the given token ids), checked against the vocabulary and the caps */
export function inputIds(
  model: LoadedModel,
  input: { prompt: string; prepend_bos: boolean; token_ids?: number[] },
  field = 'token_ids',
): { ids: number[]; prompt: string } {
  if (input.token_ids) {
    const V = model.info.d_vocab;
    const bad = input.token_ids.find((t) => t >= V);
    if (bad !== undefined)
      throw new LoupeError(
        'BAD_TOKEN_ID',
        `${field}: token id ${bad} is outside the vocabulary (d_vocab = ${V}).`,
        `Use ids between 0 and ${V - 1}.`,
      );
    checkTokenCount(model, input.token_ids.length);
    return { ids: input.token_ids.slice(), prompt: input.prompt || model.decode(input.token_ids) };
  }
  return { ids: promptIds(model, input.prompt, { prependBos: input.prepend_bos }), prompt: input.prompt };
}

export function checkPositions(positions: 'all' | number[], T: number, field = 'positions'): void {
  if (positions === 'all') return;
  for (const p of positions) {
    if (p >= T)
      throw new LoupeError(
        'BAD_INPUT',
        `${field}: position ${p} is outside the prompt (${T} tokens).`,
        `Use positions 0 … ${T - 1}.`,
      );
  }
  if (new Set(positions).size !== positions.length)
    throw new LoupeError('BAD_INPUT', `${field} lists a position twice.`, 'List each position once.');
}

// ------------------------------------------------------------------ targets

export interface AblationTarget {
  layer: number;
  component?: Component;
  head?: number;
  neuron?: number;
  /** a mixture-of-experts model's expert: its weighted output, blocks.{l}.mlp.experts.{e}.hook_out */
  expert?: number;
  /** with expert: instead of its output, its router logit (ROUTE_EDIT): forbid (never chosen) or force (chosen, weight ≈ 1) */
  route?: 'forbid' | 'force';
}

/**
 * What a routing target adds to the expert's router logit: −1e9 makes its probability exactly 0
 * (never in the top k); +1e4 makes it ≈ 1 and every other expert's ≈ 0 (it alone carries the output).
 */
export const ROUTE_EDIT = { forbid: -1e9, force: 1e4 } as const;

export const targetSchema = z.object({
  layer: z.number().int().min(0),
  component: z.enum(COMPONENTS).optional(),
  head: z.number().int().min(0).optional(),
  neuron: z.number().int().min(0).optional(),
  expert: z.number().int().min(0).optional(),
  route: z.enum(['forbid', 'force']).optional(),
});

/** one edited site: a hook, optionally restricted to a head or a neuron */
export interface Site {
  hook: string;
  head?: number;
  neuron?: number;
  /** a fixed edit x + add whatever the method (a routing target's router logit) */
  add?: number;
}

export function targetLabel(t: AblationTarget): string {
  if (t.head !== undefined) return `L${t.layer}H${t.head}`;
  if (t.neuron !== undefined) return `L${t.layer}N${t.neuron}`;
  if (t.expert !== undefined) return `L${t.layer}E${t.expert}${t.route ? `.${t.route}` : ''}`;
  return `L${t.layer}.${t.component ?? 'layer'}`;
}

/** the identifying fields of an entry: {layer, head} | {layer, neuron} | {layer, component} */
export function targetFields(t: AblationTarget): {
  layer: number;
  head?: number;
  neuron?: number;
  expert?: number;
  route?: 'forbid' | 'force';
  component?: Component;
} {
  if (t.head !== undefined) return { layer: t.layer, head: t.head };
  if (t.neuron !== undefined) return { layer: t.layer, neuron: t.neuron };
  if (t.expert !== undefined) return { layer: t.layer, expert: t.expert, ...(t.route ? { route: t.route } : {}) };
  return { layer: t.layer, component: t.component ?? 'layer' };
}

/** the sites a target edits; validates ranges and that the hooks exist in this model */
export function targetSites(model: LoadedModel, t: AblationTarget): Site[] {
  const { n_layers: L, n_heads: H } = model.info;
  const given = [t.component, t.head, t.neuron, t.expert].filter((x) => x !== undefined).length;
  if (t.route !== undefined && t.expert === undefined)
    throw new LoupeError('BAD_INPUT', `${targetLabel(t)}: route needs an expert.`, 'Add expert: E.');
  if (given > 1)
    throw new LoupeError(
      'BAD_INPUT',
      `${targetLabel(t)}: give at most one of component, head, neuron, expert.`,
      'Ablate a head, a neuron or a component; list several targets to ablate several things.',
    );
  if (t.layer >= L)
    throw new LoupeError(
      'BAD_INPUT',
      `layer ${t.layer} is out of range: the model has ${L} layers.`,
      `Use a layer between 0 and ${L - 1}.`,
    );
  const b = `blocks.${t.layer}`;
  let sites: Site[];
  if (t.head !== undefined) {
    if (t.head >= H)
      throw new LoupeError(
        'BAD_INPUT',
        `head ${t.head} is out of range: the model has ${H} heads per layer.`,
        `Use a head between 0 and ${H - 1}.`,
      );
    requireHeads(model, t.layer, 'a head to ablate');
    sites = [{ hook: `${b}.attn.hook_z`, head: t.head }];
  } else if (t.neuron !== undefined) {
    // the layer's own MLP width, from its hook (Gemma 4's double-wide MLPs are wider than d_mlp)
    const post = `${b}.mlp.hook_post`;
    const M = model.hookNames().includes(post) ? model.hookShape(post, 1, 1)[2] : model.info.d_mlp;
    if (t.neuron >= M)
      throw new LoupeError(
        'BAD_INPUT',
        `neuron ${t.neuron} is out of range: the MLP has ${M} neurons.`,
        `Use a neuron between 0 and ${M - 1}.`,
      );
    sites = [{ hook: `${b}.mlp.hook_post`, neuron: t.neuron }];
  } else if (t.expert !== undefined) {
    const E = model.info.num_experts;
    if (!E || t.expert >= E)
      throw new LoupeError(
        'BAD_INPUT',
        E
          ? `expert ${t.expert} is out of range: the model has ${E} experts per layer.`
          : `${model.info.architecture} is not a mixture-of-experts model: it has no experts.`,
        E ? `Use an expert between 0 and ${E - 1}.` : 'Ablate a head, a neuron or a component.',
      );
    sites = t.route
      ? [{ hook: `${b}.mlp.hook_router_logits`, neuron: t.expert, add: ROUTE_EDIT[t.route] }]
      : [{ hook: `${b}.mlp.experts.${t.expert}.hook_out` }];
  } else {
    const c = t.component ?? 'layer';
    const hookOf: Record<Exclude<Component, 'layer'>, string> = {
      resid_pre: `${b}.hook_resid_pre`,
      resid_mid: `${b}.hook_resid_mid`,
      resid_post: `${b}.hook_resid_post`,
      attn_out: `${b}.hook_attn_out`,
      mlp_out: `${b}.hook_mlp_out`,
      mlp_post: `${b}.mlp.hook_post`,
    };
    sites = c === 'layer' ? [{ hook: hookOf.attn_out }, { hook: hookOf.mlp_out }] : [{ hook: hookOf[c] }];
  }
  const known = new Set(model.hookNames());
  for (const s of sites) {
    if (!known.has(s.hook))
      throw new LoupeError(
        'UNKNOWN_HOOK',
        `This model has no hook '${s.hook}' (${model.info.architecture}).`,
        'Parallel-residual models (GPT-NeoX) have no resid_mid; choose another component.',
      );
  }
  return sites;
}

// ------------------------------------------------------------------ the ablator: sources for mean / resample

export interface AblationConfig {
  method: AblationMethod;
  positions: 'all' | number[];
  /** mean over these prompts' positions instead of the clean prompt's */
  meanPrompts?: number[][];
  /** resample source tokens (already T long); built by resampleTokens() */
  resampleIds?: number[];
  /** how the resample tokens were obtained, for the document */
  resampleFrom?: string;
  /** the token effects are read on (resolveAnswer); default the clean prediction at the last position */
  answerId?: number;
}

/**
 * Resample source tokens, T long: the given ids (the first T; an error when shorter) or random
 * tokens from a seeded generator (position 0 kept when it is BOS; BOS/EOS never drawn).
 */
export function resampleTokens(
  model: LoadedModel,
  ids: number[],
  seed: number,
  given?: number[],
): { ids: number[]; from: string } {
  const T = ids.length;
  if (given) {
    if (given.length < T) {
      throw new LoupeError(
        'BAD_INPUT',
        `The resample prompt has ${given.length} tokens, fewer than the prompt's ${T}.`,
        'Resampling takes the activation at the same position from the other prompt: give one at least as long (extra tokens are ignored).',
      );
    }
    return { ids: given.slice(0, T), from: `resample prompt (its first ${T} tokens)` };
  }
  const u = rng(seed);
  const V = model.info.d_vocab;
  const special = new Set([model.bosTokenId, model.eosTokenId].filter((x): x is number => x !== undefined));
  const out: number[] = [];
  for (let t = 0; t < T; t++) {
    if (t === 0 && special.has(ids[0])) {
      out.push(ids[0]);
      continue;
    }
    let tok: number;
    do tok = Math.floor(u() * V);
    while (special.has(tok));
    out.push(tok);
  }
  return {
    ids: out,
    from: `random tokens (uniform over the vocabulary without BOS/EOS, seed ${seed}${special.has(ids[0]) ? ', BOS kept at position 0' : ''})`,
  };
}

/** the hook's value of batch row 0 as a [1, T, ...] source with `fill(t)` giving each position's slice */
function sourceTensor(
  dims: number[],
  inner: number,
  fill: (t: number, out: Float32Array, off: number) => void,
): Tensor {
  const T = dims[1];
  const data = new Float32Array(T * inner);
  for (let t = 0; t < T; t++) fill(t, data, t * inner);
  return { dims: [1, ...dims.slice(1)], data };
}

export class Ablator {
  private constructor(
    readonly model: LoadedModel,
    readonly ids: number[],
    readonly cfg: AblationConfig,
    /** hook → the [1, T, ...] tensor its mean/resample patches copy from */
    private readonly sources: Map<string, Tensor>,
    /** the token effects are read on, at the last position */
    readonly answer: AnswerToken,
    private readonly meter: EffectMeter,
  ) {}

  /**
   * Run the clean prompt once (fetching `extraHooks` and whatever mean ablation needs), plus the
   * mean-prompt or resample runs, and return the ablator with the clean run.
   * `hooks` are the hooks the targets will edit (from targetSites). The clean run's logits are
   * those of the last position only (row 0).
   */
  static async prepare(
    model: LoadedModel,
    ids: number[],
    hooks: string[],
    cfg: AblationConfig,
    ctx: OpContext,
    extraHooks: string[] = [],
  ): Promise<{ ablator: Ablator; clean: RunResult }> {
    checkPositions(cfg.positions, ids.length);
    const siteHooks = [...new Set(hooks)];
    const needClean = cfg.method === 'mean' && !cfg.meanPrompts;
    const cleanHooks = [...new Set([...extraHooks, ...(needClean ? siteHooks : [])])];
    throwIfAborted(ctx.signal);
    const T = ids.length;
    // effects are read at the last position: its logits only (the run's logits row 0)
    const clean = await model.run(ids, { hooks: cleanHooks, logitPositions: [T - 1], signal: ctx.signal });
    throwIfAborted(ctx.signal);
    const cleanLogits = logitsAt(clean, 0);
    const answer = answerToken(model, cleanLogits, cfg.answerId);
    const meter = new EffectMeter(model, cleanLogits, answer.token_id);
    const sources = new Map<string, Tensor>();
    if (cfg.method === 'mean') {
      const prompts = cfg.meanPrompts ?? [];
      if (prompts.length > MAX_MEAN_PROMPTS)
        throw new LoupeError(
          'TOO_LARGE',
          `${prompts.length} mean prompts exceed the cap of ${MAX_MEAN_PROMPTS}.`,
          `Use at most ${MAX_MEAN_PROMPTS} prompts for the mean.`,
        );
      // float64 sums over every position of every prompt, per hook
      const sums = new Map<string, { dims: number[]; inner: number; sum: Float64Array; n: number }>();
      const accumulate = (run: RunResult) => {
        for (const h of siteHooks) {
          const t = runHook(run, h);
          const Tr = t.dims[1];
          const inner = t.data.length / (t.dims[0] * Tr);
          let s = sums.get(h);
          if (!s) sums.set(h, (s = { dims: t.dims, inner, sum: new Float64Array(inner), n: 0 }));
          for (let p = 0; p < Tr; p++) for (let i = 0; i < inner; i++) s.sum[i] += t.data[p * inner + i];
          s.n += Tr;
        }
      };
      if (needClean) accumulate(clean);
      for (let i = 0; i < prompts.length; i++) {
        throwIfAborted(ctx.signal);
        ctx.onProgress?.({ stage: 'mean activations', done: i, total: prompts.length });
        accumulate(await model.run(prompts[i], { hooks: siteHooks, signal: ctx.signal }));
      }
      for (const [h, s] of sums) {
        const m = Float32Array.from(s.sum, (x) => x / s.n);
        sources.set(
          h,
          sourceTensor([1, T, ...s.dims.slice(2)], s.inner, (_t, out, off) => out.set(m, off)),
        );
      }
    } else if (cfg.method === 'resample') {
      if (!cfg.resampleIds)
        throw new LoupeError(
          'INTERNAL',
          'resample ablation without source tokens.',
          'This is a bug in Loupe; please report it.',
        );
      const run = await model.run(cfg.resampleIds, { hooks: siteHooks, signal: ctx.signal });
      throwIfAborted(ctx.signal);
      for (const h of siteHooks) {
        const t = runHook(run, h);
        sources.set(h, { dims: t.dims, data: t.data });
      }
    }
    return { ablator: new Ablator(model, ids, cfg, sources, answer, meter), clean };
  }

  /**
   * each variant's effect at the last position (a variant: targets ablated together), in batched
   * runs; the mean/resample sources copied to the device once for them where the backend keeps
   * values there (fed to every batch from there), released after
   */
  async effects(variants: AblationTarget[][], ctx: OpContext, stage: string): Promise<Effect[]> {
    const sources = new Map<string, Tensor | DeviceTensor>();
    try {
      for (const [h, t] of this.sources) sources.set(h, await this.model.toDevice(t));
      const rows = await runVariants(
        this.model,
        this.ids,
        variants.map((v) => this.interventions(v, sources)),
        { ctx, stage, reduce: this.meter.reduce },
      );
      return rows.map((r) => this.meter.effect(r));
    } finally {
      for (const t of sources.values()) if ('release' in t) t.release();
    }
  }

  /** the clean run's prediction and the answer's clean values, as documents list them */
  cleanBlock(): z.infer<typeof cleanSchema> {
    return cleanBlock(this.model, this.meter);
  }

  /** engine interventions that ablate all `targets` together (one variant, no batch rows yet), patching from `sources` */
  interventions(
    targets: AblationTarget[],
    sources: ReadonlyMap<string, Tensor | DeviceTensor> = this.sources,
  ): Intervention[] {
    const out: Intervention[] = [];
    for (const t of targets) {
      for (const s of targetSites(this.model, t)) {
        const base = {
          hook: s.hook,
          positions: this.cfg.positions,
          ...(s.head !== undefined ? { head: s.head } : {}),
          ...(s.neuron !== undefined ? { neuron: s.neuron } : {}),
        };
        if (s.add !== undefined) out.push({ ...base, op: 'add', value: [s.add] });
        else if (this.cfg.method === 'zero') out.push({ ...base, op: 'zero' });
        else out.push({ ...base, op: 'patch', source: sources.get(s.hook)! });
      }
    }
    return out;
  }

  /** what replaced the ablated values, in words */
  sourceDescription(): string | undefined {
    if (this.cfg.method === 'mean')
      return this.cfg.meanPrompts
        ? `mean over all positions of ${this.cfg.meanPrompts.length} supplied prompts`
        : "mean over the prompt's positions (BOS included)";
    if (this.cfg.method === 'resample') return `same position of ${this.cfg.resampleFrom ?? 'another prompt'}`;
    return undefined;
  }

  records(targets: AblationTarget[]): InterventionRecord[] {
    const from = this.sourceDescription();
    const out: InterventionRecord[] = [];
    for (const t of targets) {
      for (const s of targetSites(this.model, t)) {
        // resampling is a patch from the other prompt's run
        if (s.add !== undefined) {
          out.push({ hook: s.hook, op: 'add', neuron: s.neuron, positions: this.cfg.positions, value: [s.add] });
          continue;
        }
        out.push({
          hook: s.hook,
          op: this.cfg.method === 'resample' ? 'patch' : this.cfg.method,
          ...(s.head !== undefined ? { head: s.head } : {}),
          ...(s.neuron !== undefined ? { neuron: s.neuron } : {}),
          positions: this.cfg.positions,
          ...(from ? { from } : {}),
        });
      }
    }
    return out;
  }
}

// ------------------------------------------------------------------ batched runs

export interface RunVariantsOptions {
  /** rows per engine run (default CAPS.maxBatch) */
  maxBatch?: number;
  /** position whose logits are returned (default the last) */
  position?: number;
  /** progress stage name */
  stage?: string;
  /** what each variant's logits are reduced to (on the device where the backend keeps values there) */
  reduce: LogitReduce;
  ctx: OpContext;
}

/**
 * Run every variant (a list of interventions; [] = clean) on the same tokens, packed into
 * batches of at most maxBatch rows, and return each variant's logits at one position reduced
 * (opts.reduce: the logits at some ids, the normaliser, the argmax, KL from a reference).
 * Cancellation is checked between engine runs (and the signal is passed into each run).
 */
export async function runVariants(
  model: LoadedModel,
  ids: number[],
  variants: Intervention[][],
  opts: RunVariantsOptions,
): Promise<LogitRow[]> {
  const maxBatch = Math.max(1, Math.min(opts.maxBatch ?? CAPS.maxBatch, CAPS.maxBatch));
  const T = ids.length;
  const pos = opts.position ?? T - 1;
  const stage = opts.stage ?? 'ablations';
  const out: LogitRow[] = [];
  const { ctx } = opts;
  throwIfAborted(ctx.signal);
  ctx.onProgress?.({ stage, done: 0, total: variants.length });
  for (let start = 0; start < variants.length; start += maxBatch) {
    throwIfAborted(ctx.signal);
    const chunk = variants.slice(start, start + maxBatch);
    const B = chunk.length;
    const interventions: Intervention[] = [];
    chunk.forEach((v, row) => {
      for (const iv of v) interventions.push({ ...iv, batch: [row] });
    });
    // only the position read is unembedded, and its logits reduced where they are (one row per variant)
    const res = await model.run(ids, {
      hooks: [],
      interventions,
      batch: B,
      logitPositions: [pos],
      lean: true,
      reduceLogits: opts.reduce,
      signal: ctx.signal,
    });
    out.push(...res.logitRows!);
    ctx.onProgress?.({ stage, done: Math.min(start + B, variants.length), total: variants.length });
  }
  throwIfAborted(ctx.signal);
  return out;
}

// ------------------------------------------------------------------ effects on the output

/** logits at one position of a run (row 0) */
export function logitsAt(run: RunResult, pos: number): Float32Array {
  const [, T, V] = run.logits.dims;
  if (pos >= T) throw new LoupeError('INTERNAL', `position ${pos} outside the run (${T}).`);
  return run.logits.data.slice(pos * V, (pos + 1) * V);
}

export interface TokenStats {
  logit: number;
  logprob: number;
  prob: number;
}

export function tokenStats(logits: ArrayLike<number>, tokenId: number, lp = logSoftmax(logits)): TokenStats {
  return { logit: finite(logits[tokenId]), logprob: finite(lp[tokenId]), prob: finite(Math.exp(lp[tokenId])) };
}

/** what an ablation (or patch) did to the target token, and what the model predicts instead */
export interface Effect {
  logit_delta: number;
  logprob_delta: number;
  prob_delta: number;
  ablated_logit: number;
  ablated_logprob: number;
  ablated_prob: number;
  new_predicted_token: string;
  new_predicted_token_id: number;
  new_predicted_prob: number;
  /** KL(clean ‖ ablated) of the next-token distributions, nats */
  kl: number;
}

export const effectFields = {
  logit_delta: z.number().describe('ablated − clean logit of the target token'),
  logprob_delta: z.number().describe('ablated − clean log-probability of the target token (nats)'),
  prob_delta: z.number().describe('ablated − clean probability of the target token'),
  ablated_logit: z.number(),
  ablated_logprob: z.number(),
  ablated_prob: z.number(),
  new_predicted_token: z.string().describe('the top token after ablation'),
  new_predicted_token_id: z.number().int(),
  new_predicted_prob: z.number(),
  kl: z.number().describe('KL(clean ‖ ablated) of the next-token distributions at the position (nats)'),
};
export const effectSchema = z.object(effectFields);

/** compares ablated logits to clean ones for a target token; clean log-probs may be passed in to save work */
export class EffectMeter {
  readonly cleanLp: Float64Array;
  readonly clean: TokenStats;
  /** what an ablated run's logits are reduced to: the target's logit, and KL from the clean log-probs */
  readonly reduce: LogitReduce;
  constructor(
    readonly model: LoadedModel,
    readonly cleanLogits: Float32Array,
    readonly tokenId: number,
  ) {
    this.cleanLp = logSoftmax(cleanLogits);
    this.clean = tokenStats(cleanLogits, tokenId, this.cleanLp);
    this.reduce = { ids: [tokenId], ref: Float32Array.from(this.cleanLp) };
  }

  /** the effect of an ablation from its logits reduced by `reduce` */
  effect(ablated: LogitRow): Effect {
    const logprob = ablated.at[0] - ablated.logsumexp;
    const a = { logit: finite(ablated.at[0]), logprob: finite(logprob), prob: finite(Math.exp(logprob)) };
    const top = ablated.top;
    return {
      logit_delta: finite(a.logit - this.clean.logit),
      logprob_delta: finite(a.logprob - this.clean.logprob),
      prob_delta: finite(a.prob - this.clean.prob),
      ablated_logit: a.logit,
      ablated_logprob: a.logprob,
      ablated_prob: a.prob,
      new_predicted_token: tokenText(this.model, top),
      new_predicted_token_id: top,
      new_predicted_prob: finite(Math.exp(ablated.topLogit - ablated.logsumexp)),
      kl: finite(Math.max(0, ablated.kl!)),
    };
  }
}

/** a given answer token resolved early (before any run), so a bad token fails at once */
export function resolveAnswer(model: LoadedModel, answer: string | undefined, field = 'answer'): number | undefined {
  return answer !== undefined ? resolveToken(model, answer, field) : undefined;
}

/** the prompt's ids and the given answer token, both checked before any run */
export function idsAndAnswer(
  model: LoadedModel,
  input: { prompt: string; prepend_bos: boolean; token_ids?: number[]; answer?: string },
): { ids: number[]; prompt: string; answerId?: number } {
  return { ...inputIds(model, input), answerId: resolveAnswer(model, input.answer) };
}

type AnswerToken = { token: string; token_id: number; source: 'clean_prediction' | 'answer' };

/** the target token: a given answer id or the clean prediction */
export function answerToken(model: LoadedModel, cleanLogits: Float32Array, answerId?: number): AnswerToken {
  const id = answerId ?? argmax(cleanLogits);
  return { token: tokenText(model, id), token_id: id, source: answerId !== undefined ? 'answer' : 'clean_prediction' };
}

export const answerSchema = z.object({
  token: z.string(),
  token_id: z.number().int(),
  source: z.enum(['clean_prediction', 'answer']).describe('the clean prediction unless answer was given'),
});

export const cleanSchema = z.object({
  predicted_token: z.string(),
  predicted_token_id: z.number().int(),
  predicted_prob: z.number(),
  answer_logit: z.number(),
  answer_logprob: z.number(),
  answer_prob: z.number(),
});

/** the document fields of what effects are read on: the answer token and the clean run's values */
export const readoutFields = { answer: answerSchema, clean: cleanSchema };

export function cleanBlock(model: LoadedModel, meter: EffectMeter): z.infer<typeof cleanSchema> {
  const top = argmax(meter.cleanLogits);
  return {
    predicted_token: tokenText(model, top),
    predicted_token_id: top,
    predicted_prob: finite(Math.exp(meter.cleanLp[top])),
    answer_logit: meter.clean.logit,
    answer_logprob: meter.clean.logprob,
    answer_prob: meter.clean.prob,
  };
}
