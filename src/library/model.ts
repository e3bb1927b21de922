/**
 * The library's model: a loaded engine model (api.ts LoadedModel) seen the way a TransformerLens
 * script sees a HookedTransformer: `cfg` under TL's config names, `toTokens` / `toStr` /
 * `toStrTokens`, `runWithCache`, `runWithHooks` with plain JavaScript hook functions, weights under
 * TL names (unprocessed and processed) and every operation as a function. Platform-free: the Node
 * entry (./index.ts) and the page's worker wrap the model they load.
 *
 * runWithHooks runs the one hooked graph and feeds each function's result back as a `patch`
 * intervention (x' = x·0 + r, exact): the sites are taken in forward order, each site's value is
 * read from a run that already carries the earlier sites' results, so a call with k sites whose
 * functions change something costs k + 1 forwards, and functions that only read cost nothing more.
 */
import { LoupeError } from '../engine/errors';
import type { Intervention, LoadedModel } from '../engine/api';
import type { Tensor } from '../engine/tensor';
import { numel } from '../engine/tensor';
import { hookInfo } from '../engine/graph/hooks';
import { operations, type OperationRegistry } from '../ops';
import type { DocumentOf, InputOf, OpContext } from '../ops/types';
import { MemoryHandleStore } from '../ops/lib/handle-store';
import { processedReader } from '../ops/lib/tl-weights';
import { compositionScores, ovCircuit, qkCircuit, type CompositionMode } from '../ops/lib/circuits';
import { weightsView, type Weights } from './weights';

/** TransformerLens's HookedTransformerConfig fields, as far as a Loupe model has them */
export interface Config {
  model_name: string;
  /** config.json's model_type (TL: original_architecture is the HF class name) */
  original_architecture: string;
  n_layers: number;
  d_model: number;
  n_heads: number;
  /** TL: n_key_value_heads (null when equal to n_heads, as TL leaves it) */
  n_key_value_heads: number | null;
  d_head: number;
  d_mlp: number;
  d_vocab: number;
  d_vocab_out: number;
  n_ctx: number;
  act_fn: string;
  gated_mlp: boolean;
  normalization_type: 'LN' | 'RMS';
  eps: number;
  positional_embedding_type: 'standard' | 'rotary';
  parallel_attn_mlp: boolean;
  output_logits_soft_cap: number;
  default_prepend_bos: boolean;
  /** where the model runs: node (onnxruntime-node CPU), wasm or webgpu */
  device: string;
  /** Loupe's own: hooks and weights are the unprocessed Hugging Face model's (TL's from_pretrained_no_processing) */
  processed: false;
}

/** a prompt, prompts of equal token length, or token ids (one row or a batch) */
export type Input = string | string[] | number[] | number[][];

export interface HookContext {
  /** the hook's name, e.g. blocks.0.hook_resid_mid */
  hook: string;
  /** the block's index, for hooks inside a block */
  layer: number | undefined;
}

/**
 * A hook function: gets the site's value (TL shape, batch first; its own copy) and returns its
 * replacement (a Tensor of the same dims, or a flat Float32Array / Float64Array / number[] of the
 * same size), or nothing to keep it; editing `value.data` in place and returning nothing also
 * replaces it (as in TransformerLens).
 */
export type HookFn = (value: Tensor, ctx: HookContext) => Tensor | Float32Array | Float64Array | number[] | void;

/** a hook name or a predicate over hook names (TL's fwd_hooks entries) */
export type HookSpec = [string | ((name: string) => boolean), HookFn];

export interface RunOptionsLib {
  /** prepend BOS to string input (default true, as TL) */
  prependBos?: boolean;
  /** fixed interventions (api.ts Intervention: zero, scale, add, set, mean, patch) applied as well: the fast path */
  interventions?: Intervention[];
  signal?: AbortSignal;
}

export interface CacheOptions extends RunOptionsLib {
  /** the hooks to keep (names or a predicate; TL's names_filter); default every hook (hook_result only when named) */
  names?: string[] | ((name: string) => boolean);
}

export interface HooksOptions extends RunOptionsLib {
  fwdHooks: HookSpec[];
}

type Registry = OperationRegistry;
/** every operation as a function: `ops.trace(model, input)` returns the CLI's document */
export type Ops = {
  [K in keyof Registry]: (
    model: Model | LoadedModel,
    input: InputOf<Registry[K]>,
    ctx?: OpContext,
  ) => Promise<DocumentOf<Registry[K]>>;
};

const stores = new WeakMap<LoadedModel, MemoryHandleStore>();

/** the operations bound to a context (the Node entry adds its SAE loaders and document cache) */
export function makeOps(base: () => OpContext | Promise<OpContext> = () => ({})): Ops {
  const out: Record<string, unknown> = {};
  for (const [name, op] of Object.entries(operations)) {
    out[name] = async (model: Model | LoadedModel, input: unknown, ctx: OpContext = {}) => {
      const engine = model instanceof Model ? model.engine : model;
      let store = stores.get(engine);
      if (!store) stores.set(engine, (store = new MemoryHandleStore()));
      return op.run(engine, input, { store, ...(await base()), ...ctx });
    };
  }
  return out as Ops;
}

/** edit distance, for the nearest hook names to an unknown one */
function distance(a: string, b: string): number {
  const row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    let prev = row[0];
    row[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const cur = row[j];
      row[j] = Math.min(row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] === b[j - 1] ? 0 : 1));
      prev = cur;
    }
  }
  return row[b.length];
}

const layerOf = (hook: string) => {
  const m = /^blocks\.(\d+)\./.exec(hook);
  return m ? Number(m[1]) : undefined;
};

function hookError(hook: string, message: string, hint: string, details?: unknown): LoupeError {
  return new LoupeError('HOOK_FAILED', `The hook function at ${hook} ${message}`, hint, { hook, ...(details ?? {}) });
}

/** a hook function's return → a float32 tensor of `dims`, or HOOK_FAILED naming the hook */
function checkReturn(hook: string, dims: number[], r: unknown): Tensor {
  const n = numel(dims);
  let data: ArrayLike<unknown>;
  let got: number[];
  if (r instanceof Float32Array || r instanceof Float64Array || Array.isArray(r)) {
    data = r;
    got = [r.length];
  } else if (r && typeof r === 'object' && 'data' in r && 'dims' in r) {
    const t = r as { dims: unknown; data: unknown };
    if (!(t.data instanceof Float32Array || t.data instanceof Float64Array))
      throw hookError(
        hook,
        `returned a tensor whose data is ${Object.prototype.toString.call(t.data).slice(8, -1)}, not Float32Array.`,
        'Return a {dims, data: Float32Array} (or Float64Array) tensor.',
      );
    data = t.data;
    got = Array.isArray(t.dims) ? (t.dims as number[]) : [];
    if (got.length !== dims.length || got.some((d, i) => d !== dims[i]))
      throw hookError(
        hook,
        `returned shape [${got}]; the site has shape [${dims}].`,
        'Return a tensor of the shape it was given.',
        { expected: dims, got },
      );
  } else {
    throw hookError(
      hook,
      `returned ${r === null ? 'null' : typeof r}; it must return a tensor, a flat array or nothing.`,
      'Return the (edited) value, a Float32Array of its size, or undefined to keep it.',
    );
  }
  if (data.length !== n)
    throw hookError(
      hook,
      `returned ${data.length} values; the site has shape [${dims}] (${n}).`,
      'Return a value of the size it was given.',
      {
        expected: dims,
        got,
      },
    );
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const v = data[i];
    if (typeof v !== 'number' || !Number.isFinite(v))
      throw hookError(
        hook,
        `returned ${typeof v === 'number' ? v : typeof v} at flat index ${i}; every value must be a finite number.`,
        'Check the function for a division by zero or an overflow.',
        { index: i },
      );
    out[i] = v;
  }
  return { dims: [...dims], data: out };
}

export class Model {
  readonly cfg: Config;
  /** the unprocessed weights under TL names: `W_E`, `W_U`, `W_Q[l]`, `b_in[l]`, … */
  readonly weights: Weights;
  /** the same names processed as TL's from_pretrained does (fold_ln, centring, fold_value_biases; ./weights.ts) */
  readonly processedWeights: Weights;
  private readonly copies = new Map<string, Tensor>();
  private processed?: (name: string) => Tensor;

  constructor(readonly engine: LoadedModel) {
    const i = engine.info;
    this.cfg = {
      model_name: i.requested_name ?? i.id,
      original_architecture: i.architecture,
      n_layers: i.n_layers,
      d_model: i.d_model,
      n_heads: i.n_heads,
      n_key_value_heads: i.n_kv_heads === i.n_heads ? null : i.n_kv_heads,
      d_head: i.d_head,
      d_mlp: i.d_mlp,
      d_vocab: i.d_vocab,
      d_vocab_out: i.d_vocab,
      n_ctx: i.n_ctx,
      act_fn: i.act_fn,
      gated_mlp: i.gated_mlp,
      normalization_type: i.norm === 'layernorm' ? 'LN' : 'RMS',
      eps: i.norm_eps,
      positional_embedding_type: i.pos_embed ? 'standard' : 'rotary',
      parallel_attn_mlp: i.parallel_attn_mlp,
      output_logits_soft_cap: i.final_softcap ?? -1,
      default_prepend_bos: engine.bosTokenId !== undefined,
      device: i.backend,
      processed: false,
    };
    this.weights = weightsView(i.n_layers, (n) => this.param(n));
    this.processedWeights = weightsView(i.n_layers, (n) => this.param(n, { processed: true }));
  }

  /** frees the model's sessions and weights */
  dispose(): Promise<void> {
    return this.engine.dispose();
  }

  get W_E(): Tensor {
    return this.weights.W_E;
  }
  get W_U(): Tensor {
    return this.weights.W_U;
  }

  /**
   * a weight under its TL state-dict name (`blocks.0.attn.W_Q`, `ln_final.w`, …; api.ts lists them),
   * as a float32 copy of its own; `processed`: as TL's from_pretrained processes it
   */
  param(name: string, opts: { processed?: boolean } = {}): Tensor {
    if (opts.processed) {
      this.processed ??= processedReader(this.engine, (n) => this.param(n));
      return this.processed(name);
    }
    let t = this.copies.get(name);
    if (!t) {
      const p = this.engine.param(name, { keep: false });
      t = { dims: [...p.dims], data: p.data.slice() };
      this.copies.set(name, t);
    }
    return t;
  }

  /** head h of layer l's QK circuit W_Q W_Kᵀ [d_model, d_model] (processed weights by default, as TL) */
  QK(layer: number, head: number, opts: { processed?: boolean } = {}): Tensor {
    return qkCircuit(this.engine, (n) => this.param(n, { processed: opts.processed ?? true }), layer, head);
  }

  /** head h of layer l's OV circuit W_V W_O [d_model, d_model] (processed weights by default, as TL) */
  OV(layer: number, head: number, opts: { processed?: boolean } = {}): Tensor {
    return ovCircuit(this.engine, (n) => this.param(n, { processed: opts.processed ?? true }), layer, head);
  }

  /**
   * Elhage et al.'s composition scores for every pair of heads, [L, H, L, H] (from layer, from head,
   * to layer, to head; 0 unless from layer < to layer): TL's all_composition_scores(mode)
   */
  async allCompositionScores(mode: 'Q' | 'K' | 'V', opts: { processed?: boolean; signal?: AbortSignal } = {}) {
    const m = mode.toLowerCase() as CompositionMode;
    if (!['q', 'k', 'v'].includes(m))
      throw new LoupeError('BAD_INPUT', `mode must be 'Q', 'K' or 'V' (got '${mode}').`);
    const read = (n: string) => this.param(n, { processed: opts.processed ?? true });
    const r = await compositionScores(this.engine, read, [m], { signal: opts.signal });
    const { n_layers: L, n_heads: H } = this.cfg;
    return { dims: [L, H, L, H], data: Float32Array.from(r.scores[m]!) } as Tensor;
  }

  /** every hook name in forward order (`withResult`: with the per-head hook_result) */
  hookNames(opts: { withResult?: boolean } = {}): string[] {
    return this.engine.hookNames(opts);
  }

  /** token ids [batch, pos] of a prompt or prompts (equal token lengths: Loupe runs no padding) */
  toTokens(input: string | string[], opts: { prependBos?: boolean } = {}): number[][] {
    const texts = typeof input === 'string' ? [input] : input;
    if (!Array.isArray(texts) || texts.length === 0 || texts.some((t) => typeof t !== 'string'))
      throw new LoupeError('BAD_INPUT', 'toTokens takes a string or a non-empty array of strings.');
    const rows = texts.map((t) => this.engine.tokenize(t, { prependBos: opts.prependBos ?? true }));
    const T = rows[0].length;
    if (rows.some((r) => r.length !== T))
      throw new LoupeError(
        'BAD_INPUT',
        `The prompts tokenize to different lengths (${rows.map((r) => r.length).join(', ')}).`,
        'Loupe runs batches without padding: give prompts of equal token length, or run them one at a time.',
      );
    return rows;
  }

  /** the text of token ids (TL's to_string) */
  toStr(tokens: number | number[]): string {
    return this.engine.decode(typeof tokens === 'number' ? [tokens] : tokens);
  }

  /** each token's text (TL's to_str_tokens): of a prompt (BOS prepended by default) or of ids */
  toStrTokens(input: string | number[], opts: { prependBos?: boolean } = {}): string[] {
    const ids = typeof input === 'string' ? this.toTokens(input, opts)[0] : input;
    return ids.map((id) => this.engine.decode([id]));
  }

  /** the id of a single-token string (TL's to_single_token); UNKNOWN_TOKEN when it is not one token */
  toSingleToken(text: string): number {
    const id = this.engine.tokenId(text);
    if (id === undefined)
      throw new LoupeError(
        'UNKNOWN_TOKEN',
        `${JSON.stringify(text)} is not a single token of this model.`,
        'Check toStrTokens(text, { prependBos: false }).',
      );
    return id;
  }

  private rows(input: Input, prependBos?: boolean): number[][] {
    if (typeof input === 'string' || (Array.isArray(input) && typeof input[0] === 'string'))
      return this.toTokens(input as string | string[], { prependBos });
    if (!Array.isArray(input) || input.length === 0)
      throw new LoupeError('BAD_INPUT', 'Input must be a prompt, prompts, or token ids (number[] or number[][]).');
    return Array.isArray(input[0]) ? (input as number[][]) : [input as number[]];
  }

  /** hook names asked for → the model's, or UNKNOWN_HOOK with the nearest names */
  private resolveHooks(names: (string | ((n: string) => boolean))[]): { hook: string; index: number }[] {
    const base = this.engine.hookNames();
    const all = this.engine.hookNames({ withResult: true });
    const out: { hook: string; index: number }[] = [];
    names.forEach((n, index) => {
      if (typeof n === 'function') {
        for (const h of base) if (n(h)) out.push({ hook: h, index });
        return;
      }
      if (!all.includes(n)) {
        const near = [...all].sort((a, b) => distance(n, a) - distance(n, b)).slice(0, 3);
        throw new LoupeError(
          'UNKNOWN_HOOK',
          `'${n}' is not a hook of this model.`,
          `Did you mean ${near.join(', ')}? model.hookNames() lists them all.`,
          {
            hook: n,
            nearest: near,
          },
        );
      }
      out.push({ hook: n, index });
    });
    return out;
  }

  /**
   * One forward; returns the logits [batch, pos, d_vocab] and the hooks asked for (TL shapes,
   * batch first), each read from the run and nothing else copied out.
   */
  async runWithCache(
    input: Input,
    opts: CacheOptions = {},
  ): Promise<{ logits: Tensor; cache: Record<string, Tensor> }> {
    const rows = this.rows(input, opts.prependBos);
    const names =
      opts.names === undefined
        ? this.engine.hookNames()
        : typeof opts.names === 'function'
          ? this.resolveHooks([opts.names]).map((r) => r.hook)
          : this.resolveHooks(opts.names).map((r) => r.hook);
    const hooks = [...new Set(names)];
    const r = await this.engine.run(rows, {
      hooks,
      interventions: opts.interventions,
      withResult: hooks.some((h) => h.endsWith('.hook_result')) || undefined,
      signal: opts.signal,
    });
    return { logits: r.logits, cache: r.hooks };
  }

  /**
   * A forward with hook functions at sites (TL's run_with_hooks): returns the logits [batch, pos,
   * d_vocab]. Functions at one site run in the order given; sites in forward order. A function
   * that throws or returns a bad value is HOOK_FAILED naming the hook; the model stays usable.
   */
  async runWithHooks(input: Input, opts: HooksOptions): Promise<Tensor> {
    if (!opts || !Array.isArray(opts.fwdHooks))
      throw new LoupeError('BAD_INPUT', 'runWithHooks needs { fwdHooks: [[name or predicate, fn], …] }.');
    opts.fwdHooks.forEach((h, i) => {
      if (
        !Array.isArray(h) ||
        h.length !== 2 ||
        typeof h[1] !== 'function' ||
        !['string', 'function'].includes(typeof h[0])
      )
        throw new LoupeError('BAD_INPUT', `fwdHooks[${i}] must be [hook name or predicate, function].`);
    });
    const rows = this.rows(input, opts.prependBos);
    const order = this.engine.hookNames({ withResult: true });
    const resolved = this.resolveHooks(opts.fwdHooks.map((h) => h[0]));
    const fnsAt = new Map<string, HookFn[]>();
    for (const { hook, index } of resolved.sort(
      (a, b) => order.indexOf(a.hook) - order.indexOf(b.hook) || a.index - b.index,
    )) {
      if (!fnsAt.has(hook)) fnsAt.set(hook, []);
      fnsAt.get(hook)!.push(opts.fwdHooks[index][1]);
    }
    const sites = [...fnsAt.keys()];
    const withResult = sites.some((h) => h.endsWith('.hook_result')) || undefined;
    const interventions: Intervention[] = [...(opts.interventions ?? [])];
    const run = (hooks: string[]) =>
      this.engine.run(rows, { hooks, interventions: [...interventions], withResult, signal: opts.signal });
    let last = await run(sites);
    let stale = false; // a site's result was fed back after `last` ran
    for (let s = 0; s < sites.length; s++) {
      const hook = sites[s];
      if (stale) {
        last = await run(sites.slice(s));
        stale = false;
      }
      const before = last.hooks[hook];
      let value: Tensor = { dims: [...before.dims], data: before.data.slice() };
      let changed = false;
      for (const fn of fnsAt.get(hook)!) {
        const given = value.data.slice();
        let r: unknown;
        try {
          r = fn(value, { hook, layer: layerOf(hook) });
        } catch (e) {
          throw hookError(
            hook,
            `threw: ${e instanceof Error ? e.message : String(e)}`,
            'Fix the hook function; the model is unchanged and usable.',
          );
        }
        if (r && typeof (r as Promise<unknown>).then === 'function')
          throw hookError(
            hook,
            'returned a Promise; hook functions are synchronous.',
            'Compute what the function needs before the run.',
          );
        if (r === undefined) {
          // an in-place edit counts as a replacement, as in TransformerLens
          if (value.data.some((v, i) => !Object.is(v, given[i]))) {
            value = checkReturn(hook, before.dims, value);
            changed = true;
          }
          continue;
        }
        value = checkReturn(hook, before.dims, r);
        if (value.data.some((v, i) => v !== given[i])) changed = true;
      }
      if (!changed) continue;
      if (!hookInfo(hook).site)
        throw hookError(
          hook,
          'changed a read-only hook.',
          `${hook} can be read, not replaced (edit hook_pattern instead of hook_attn_scores).`,
        );
      interventions.push({ hook, op: 'patch', source: value });
      stale = true;
    }
    if (stale) last = await run([]);
    return last.logits;
  }
}
