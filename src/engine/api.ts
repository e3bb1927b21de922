/**
 * The engine's public contract. Everything above the engine (ops, worker, CLI, bridge) codes
 * against these types only.
 *
 * Conventions (TransformerLens):
 *  - Hook names are TransformerLens's (the list is graph/hooks.ts allHookNames; tests/docs-hooks.test.ts
 *    keeps this copy equal to it): <!-- hooks -->
 *    `hook_embed`, `hook_pos_embed` (learned positions), `blocks.{l}.hook_resid_pre`, `blocks.{l}.ln1.hook_scale` (pre-norms),
 *    `blocks.{l}.attn.hook_q|hook_k|hook_v` [B,T,H(or Hkv),Dh], `blocks.{l}.attn.hook_attn_scores|hook_pattern`
 *    [B,H,Tq,Tk], `blocks.{l}.attn.hook_z` [B,T,H,Dh], `blocks.{l}.attn.hook_result` [B,T,H,D] (only in the
 *    'result' graph variant), `blocks.{l}.attn.hook_gate` [B,T,H,Dh] (Qwen3.5's output gate; hook_z gated),
 *    Qwen3.5's linear-attention layers instead of attention: `blocks.{l}.linear_attn.hook_q|hook_k` [B,T,Hk,Dk],
 *    `blocks.{l}.linear_attn.hook_v|hook_core|hook_gate|hook_z` [B,T,Hv,Dv], `blocks.{l}.linear_attn.hook_beta|hook_decay`
 *    [B,T,Hv] (docs/DESIGN.md), `blocks.{l}.ln1_post.hook_scale` (post-norms: Gemma 2 and 3, OLMo 2), `blocks.{l}.hook_attn_out`,
 *    `blocks.{l}.hook_resid_mid` (not in parallel blocks), `blocks.{l}.ln2.hook_scale` (pre-norms),
 *    `blocks.{l}.mlp.hook_pre|hook_pre_linear|hook_post` [B,T,d_mlp] (hook_pre_linear in gated MLPs), or in a
 *    mixture-of-experts layer `blocks.{l}.mlp.hook_router_logits|hook_router_weights` [B,T,E],
 *    `blocks.{l}.mlp.hook_expert_weights|hook_expert_indices` [B,T,k], `blocks.{l}.mlp.experts.{e}.hook_out` [B,T,D]
 *    (weighted), `blocks.{l}.mlp.shared_expert.hook_out`, Gemma 4's beside its dense MLP (its hooks kept)
 *    `blocks.{l}.ln2_post_dense.hook_scale`, `blocks.{l}.ln2_experts.hook_scale`, `blocks.{l}.ln2_post_experts.hook_scale`
 *    (post_feedforward_layernorm_1, pre_ and post_feedforward_layernorm_2), `blocks.{l}.ln2_post.hook_scale` (post-norms),
 *    `blocks.{l}.hook_mlp_out`, Gemma 4's per-layer input block `blocks.{l}.hook_per_layer_input` [B,T,P],
 *    `blocks.{l}.per_layer.hook_pre|hook_post` [B,T,P], `blocks.{l}.ln_per_layer.hook_scale`,
 *    `blocks.{l}.hook_per_layer_out` [B,T,D] (graph/hooks.ts PER_LAYER_HOOKS), `blocks.{l}.hook_resid_post`,
 *    `ln_final.hook_scale` [B,T,1], `logits` [B,T,V]. <!-- /hooks -->
 *  - Values are those of the unprocessed Hugging Face model (no weight folding or centring).
 *  - A hook's returned value is the value AFTER any intervention at that hook (TL semantics).
 *  - `hook_scale` is the norm's divisor: sqrt(var + eps) for LayerNorm, sqrt(mean(x²) + eps) for RMSNorm.
 *  - Parameters are available under TransformerLens parameter names via `model.param()`, in TL
 *    shapes, unprocessed: `embed.W_E` [V,D], `pos_embed.W_pos` [nCtx,D], `blocks.{l}.ln1.w|b`,
 *    `blocks.{l}.attn.W_Q|W_K|W_V` [H(or Hkv),D,Dh], `b_Q|b_K|b_V` [H(or Hkv),Dh], `W_O` [H,Dh,D],
 *    `b_O` [D], `blocks.{l}.ln2.w|b`, `blocks.{l}.mlp.W_in|W_gate` [D,M], `b_in` [M], `W_out` [M,D],
 *    `b_out` [D], `ln_final.w|b` [D], `unembed.W_U` [D,V], `unembed.b_U` [V], and with post-norms
 *    `blocks.{l}.ln1_post.w|ln2_post.w` [D]; `blocks.{l}.layer_scalar` [1] (Gemma 4; 1 elsewhere); mixture-of-experts layers (TL's MoE names): the router
 *    `blocks.{l}.mlp.W_gate` [D,E], each expert's `blocks.{l}.mlp.experts.{e}.W_in|W_gate` [D,M] and
 *    `W_out` [M,D] (Qwen2-MoE's `mlp.shared_expert.*` too), `b_out` zeros; Gemma 4's experts beside a dense MLP
 *    (which keeps `mlp.W_in|W_gate|W_out`): the router `mlp.W_router` [D,E], `mlp.router_scale` [D],
 *    `mlp.per_expert_scale` [E], `ln2_experts.w|ln2_post_dense.w|ln2_post_experts.w` [D]. Norm weights are the *effective* multipliers (Gemma's
 *    stored w + 1 is returned as w + 1).
 *  - `param(name)` answers every name above that the architecture has; a bias the checkpoint
 *    does not store (Llama's b_Q, RMSNorm's b) reads as zeros, so that code can always add it.
 *    `hasParam(name)` says whether the name is backed by a stored tensor: false for those zero
 *    biases and for names this architecture lacks (W_gate on GPT-2, W_pos on rotary models),
 *    which `param` rejects with BAD_INPUT.
 */
import type { Tensor } from './tensor';
import type { ModelSpec } from './spec';
import type { ModelRef, FileProgress } from './source/types';
import type { SaeFiles, SaeInfo } from './sae';
import type { TranscoderHeaders, TranscoderInfo } from './transcoder';
import type { TranscoderFiles } from './source/transcoder-loader';
import type { WeightPrecision, WeightsMode } from './precision';

export type { SaeFiles, SaeInfo } from './sae';
export type { TranscoderInfo, TranscoderHeaders } from './transcoder';
export type { TranscoderFiles } from './source/transcoder-loader';

export type Backend = 'webgpu' | 'wasm' | 'node';

export interface ModelInfo {
  /** Hub id, URL or folder the model came from; 'default' resolves to the bundled model id 'stories260K' */
  id: string;
  /** the name the model was asked for by, when a catalog name other than `id` (engine/catalog.ts): 'gemma-3-270m' for google/gemma-3-270m */
  requested_name?: string;
  revision: string;
  /** the commit the Hub resolved `revision` to when the weights were fetched (X-Repo-Commit); absent off the Hub */
  commit?: string;
  source: ModelRef['kind'] | 'bundled';
  /** config.json model_type, e.g. 'llama' */
  architecture: string;
  n_layers: number;
  n_heads: number;
  n_kv_heads: number;
  d_model: number;
  d_head: number;
  /** each MLP's width; in a mixture-of-experts model each expert's */
  d_mlp: number;
  /**
   * mixture-of-experts models (TransformerLens's cfg names): experts per layer and how many each
   * token is routed to; hooks blocks.{l}.mlp.hook_router_logits … experts.{e}.hook_out (graph/hooks.ts moeHooks)
   */
  num_experts?: number;
  experts_per_token?: number;
  /** Qwen2-MoE: each layer also has a shared expert (blocks.{l}.mlp.shared_expert.hook_out) */
  shared_expert?: boolean;
  d_vocab: number;
  n_ctx: number;
  n_params: number;
  /** dtype of the stored weights (F32/F16/BF16); computation is float32 */
  dtype: string;
  backend: Backend;
  norm: 'layernorm' | 'rmsnorm';
  /** how the weights are held (precision.ts): f32 = widened at load, stored = 16-bit, widened at use */
  weights: WeightPrecision;
  /** why that precision (asked for, or what `auto` weighed) */
  weights_reason: string;
  /** bytes of the weights as the session holds them (float32: 4 per parameter; stored: as in the files) */
  weight_bytes: number;
  /** the vocabulary tables (embedding, unembedding) in this many row chunks; 1 = whole (precision.ts chooseVocabSplit) */
  vocab_chunks: number;
  /** why split or not (the table's float32 size against the limits that applied) */
  vocab_reason: string;
  /**
   * how DLA's products with W_O and W_out run (readout/choose.ts): streamed from the weight bytes in
   * JavaScript, a second onnxruntime session, or in the forward graph (WebGPU)
   */
  readout: 'session' | 'stream' | 'forward';
  /** why that readout */
  readout_reason: string;
  /** the norms' epsilon: scale = sqrt(var + eps) (LayerNorm) or sqrt(mean x² + eps) (RMSNorm) */
  norm_eps: number;
  /**
   * a learned absolute position embedding (GPT-2, not rotary): `hook_pos_embed` and
   * `pos_embed.W_pos` exist, and resid_pre0 = hook_embed + hook_pos_embed
   */
  pos_embed: boolean;
  /**
   * Gemma 2's sandwich norms: every block's attention and MLP outputs pass through their own
   * RMSNorm (epsilon `norm_eps`; weights `blocks.{l}.ln1_post.w` / `ln2_post.w`, scale hooks
   * `blocks.{l}.ln1_post.hook_scale` / `ln2_post.hook_scale`) before they are added to the
   * residual stream. The engine loads no model whose post-norms are otherwise (some blocks
   * only, another kind or epsilon), so this one flag describes them all.
   */
  post_norms: boolean;
  /** logits = cap · tanh(logits / cap) after the unembedding (Gemma 2); null = none */
  final_softcap: number | null;
  /**
   * attention and MLP read the same block input (GPT-NeoX's parallel residual): the MLP's input
   * then does not include its own layer's heads (the edge graph, edges.ts; EAP-IG's cfg key)
   */
  parallel_attn_mlp: boolean;
  /** the MLP's activation under its Hugging Face name (TransformerLens's act_fn: gelu_new, gelu, relu, silu, …) */
  act_fn: string;
  /** the MLP is gated: act(x W_gate) ⊙ (x W_in) (Llama, Gemma, Qwen); else act(x W_in + b_in) (GPT-2, NeoX) */
  gated_mlp: boolean;
}

/**
 * An intervention is plain data. It edits one hook site as x' = x * mul + add, restricted to
 * a head (axis of H), a neuron (last axis of d_mlp hooks), positions and batch rows.
 *  - zero:  x' = 0
 *  - scale: x' = alpha * x
 *  - add:   x' = x + alpha * value        (value: vector over the site's last axis, e.g. d_model)
 *  - set:   x' = value                     (value broadcast over positions)
 *  - mean:  x' = value, where value defaults to the mean of the clean activation over the prompt's
 *           positions (computed by the engine with one extra clean run when value is omitted)
 *  - patch: x' = source[pos]               (source: the activation tensor of the same hook from
 *           another run, dims [T, ...site dims without batch] or [1, T, ...])
 */
export type InterventionOp = 'zero' | 'scale' | 'add' | 'set' | 'mean' | 'patch';

/** Where and how an intervention edits: the fields the engine's form and a document's record share. */
export interface InterventionSite {
  hook: string;
  op: InterventionOp;
  /** restrict to one head (hooks with a head axis: hook_q/k/v/z/result, hook_pattern/attn_scores) */
  head?: number;
  /** restrict to one index of the last axis (mlp.hook_pre/hook_post neurons, SAE features, or a resid dimension) */
  neuron?: number;
  /** token positions (0-based, BOS included); default all */
  positions?: 'all' | number[];
  /** scale factor (scale) or strength (add); default 1 */
  alpha?: number;
}

/** An intervention as the engine runs it. */
export interface Intervention extends InterventionSite {
  /** vector for add/set/mean (length = size of the site's last axis, or of the head's slice) */
  value?: number[] | Float32Array;
  /**
   * patch source, or what `add` adds (x + α·source) instead of a value: a tensor of the hook's shape
   * in JS memory, or on the device (a run's deviceHooks, LoadedModel.toDevice), fed there to every run
   */
  source?: Tensor | DeviceTensor;
  /** batch rows this applies to (when running several variants at once); default every row */
  batch?: number[];
}

/**
 * An intervention as a document lists it (pyvene-style: plain, JSON-serialisable data): the
 * site and op, with a value listed when it is a few numbers and otherwise described by what made
 * it, so that a document says exactly what was edited and re-running its input reproduces it.
 * The schema documents validate it with is schema/common.ts `interventionRecord`.
 */
export interface InterventionRecord extends InterventionSite {
  /** the value, when it is a few numbers (an SAE feature's value, a unit vector's scale) */
  value?: number[];
  /** a steering direction: the spec it was made from (token pair, prompt sets, probe, numbers) */
  direction?: unknown;
  /** the direction was scaled to unit norm before α */
  normalize?: boolean;
  /** where a mean or patched value came from, in words ("the clean prompt", "mean over …") */
  from?: string;
  /** the SAE spliced in at the hook, whose features `neuron` indexes */
  sae?: { source: string; path: string };
}

/** What LoadedModel.weightProducts takes; an absent input is fed with a zero-length axis (no work). */
export interface WeightProductsInput {
  /** [L, N, H·Dh] → attnX [L, N, D] = z_l · W_O_l */
  z?: Tensor;
  /** [L, N, d_mlp] → mlpX [L, N, D] = post_l · W_out_l */
  post?: Tensor;
  /** [L, K, D] → attnDir [L, K, H·Dh] = W_O_l · e for each direction e */
  attnDirs?: Tensor;
  /** [L, K, D] → mlpDir [L, K, d_mlp] = W_out_l · e */
  mlpDirs?: Tensor;
  /** token ids → unembedRows [I, D]: the columns W_U[:, id] */
  unembedIds?: number[];
  /** true → unembedSum [D] = Σ_v W_U[:, v] (zeros when false) */
  unembedSum?: boolean;
  /**
   * vectors x [S, D] (float32 or float64) → unembedDots [S, V] = x_s · W_U: each vector's dot product
   * with every token's unembedding column (no final norm, no b_U, no soft-cap), each a float64 sum
   * over d in order of W_U's float32 values as the sessions use them (stored 16-bit widened, q8
   * dequantised), returned unrounded. Read a chunk of vocabulary rows at a time: no copy of W_U.
   */
  unembedDots?: Tensor | Tensor64;
}

/** a dense float64 tensor, row-major: a product the engine accumulates in float64 and returns unrounded */
export interface Tensor64 {
  dims: number[];
  data: Float64Array;
}

export interface WeightProducts {
  attnX: Tensor;
  mlpX: Tensor;
  attnDir: Tensor;
  mlpDir: Tensor;
  unembedRows: Tensor;
  unembedSum: Tensor;
  /** [S, V]; [0, V] when unembedDots was not given */
  unembedDots: Tensor64;
}

/** What LoadedModel.lensTop returns for S streams × P positions (row-major: stream, position, …). */
export interface LensTop {
  k: number;
  /** [S·P·k] the k largest logits of each vector, largest first (ties: lower id first) */
  topLogits: Float32Array;
  /** [S·P·k] their token ids */
  topIds: number[];
  /** [S·P] log Σ_v exp(logit_v) */
  logSumExp: Float32Array;
  /** [P] argmax of the last stream's logits (first on ties) */
  finalIds: number[];
  /** [S·P] each vector's logit of finalIds at its position */
  finalLogit: Float32Array;
  /** [S·P] how many tokens have a strictly larger logit (the rank of finalIds − 1) */
  finalAbove: Float32Array;
}

export interface KVCache {
  /** per layer: keys and values [B, Hkv, P, Dh] */
  keys: Tensor[];
  values: Tensor[];
  /** number of cached positions P */
  length: number;
  /**
   * held on the device instead (`returnCache: 'device'` where the backend keeps values there:
   * WebGPU in Node): `keys` and `values` are empty; the runtime's tensors, fed back as they are
   */
  device?: { keys: unknown[]; values: unknown[]; batch: number };
  /** frees a cache held on the device (a no-op otherwise); call it once the cache is no longer fed */
  release?: () => void;
}

/** what each row of a run's logits is reduced to (RunOptions.reduceLogits) */
export interface LogitReduce {
  /** token ids whose logits a row keeps */
  ids: number[];
  /** a reference row of log-probabilities [V]: each row's KL(reference ‖ row) is returned too */
  ref?: Float32Array;
}

/** one logits row reduced (runtime/reduce.ts); float32 arithmetic on the backend */
export interface LogitRow {
  /** the logits at LogitReduce.ids, in order */
  at: Float32Array;
  /** log Σ_v exp(logit_v) */
  logsumexp: number;
  /** the argmax (first on ties) and its logit */
  top: number;
  topLogit: number;
  /** KL(ref ‖ softmax(row)) in nats, when a ref was given */
  kl?: number;
}

/** a hook reduced to statistics over every element (RunOptions.hookStats; runtime/reduce.ts) */
export interface HookStats {
  shape: number[];
  mean: number;
  /** population standard deviation */
  std: number;
  min: number;
  max: number;
  /** the flat (row-major) index of the first largest element */
  argmax: number;
  /** the L2 norm of everything at each position of the hook's position axis */
  norms: number[];
}

/** RunOptions.attribution: the values the products are taken against (an earlier run's, here or on the device) and the axis kept per hook */
export interface AttributionReduce {
  against: Record<string, Tensor | DeviceTensor>;
  keep: Record<string, number | null>;
  /**
   * false: `against` is the direction itself, Σ against · ∂M/∂value, batch 1 broadcast over the
   * run's rows (integrated gradients' x − x'); default true, Σ (against − value) · ∂M/∂value
   */
  subtract?: boolean;
}

/**
 * A run of the edge-patching variant (graph/edge-graph.ts; the layout of its axes is edges.ts):
 * every node input b is the residual stream plus Σ_u w[u, b] · d_u, with d_u = src_u − a_u (this
 * run's output of u) when `subtract`, else d_u = src_u. With grad, ∂M/∂w comes back as `edgeGrad`
 * (d held constant). Not with hooks, interventions, an SAE, a KV cache or hook_result.
 */
/** a run's output the runtime left on the device (EdgeRun outputs 'device'): fed to a later run as it is */
export interface DeviceTensor {
  dims: number[];
  /** the runtime's tensor */
  device: unknown;
  /** frees it; call once it is no longer fed */
  release(): void;
}

export interface EdgeRun {
  /** [1 or B, nForward, nBackward] (here, or on the device: LoadedModel.toDevice); absent: zeros (every input reads this run's own values) */
  weights?: Tensor | DeviceTensor;
  /** [1 or B, nForward, T or 1, d_model or 1] upstream values (on the device: an earlier run's edgeOutputsOnDevice); absent: zeros */
  source?: Tensor | DeviceTensor;
  subtract: boolean;
  /** [1 or B, nForward], gradient runs only: the gradient through a_u is scaled by gate[u] (its value is not); default ones */
  gate?: Tensor | DeviceTensor;
  /** gradient runs only: edgeGrad is ∂M/∂w summed over the batch's rows [1, nForward, nBackward], summed on the device */
  sumRows?: boolean;
  /** false: the logits are not read back (RunResult.logits is [B, P, 0]), for gradient runs that need only edgeGrad */
  logits?: boolean;
  /**
   * return every upstream node's output in this run as `edgeOutputs` [B, nForward, T, d_model] (not
   * with grad); 'device': left on the device as `edgeOutputsOnDevice` where the backend keeps values
   * there (WebGPU in Node), else as with true
   */
  outputs?: boolean | 'device';
}

export interface RunOptions {
  /** hook names to return, or 'all' */
  hooks?: string[] | 'all';
  interventions?: Intervention[];
  /** run this many copies of the tokens at once (variants differ by their interventions' `batch`) */
  batch?: number;
  /**
   * positions (of this run's tokens) whose logits to compute; default all. Scans that read only
   * the final position pass [T-1]: the unembedding is then done for one position, not T.
   */
  logitPositions?: number[];
  /**
   * return each hook only at these positions, along its (query) position axis (hook_pattern
   * [B, H, P, Tk], hook_z [B, P, H, Dh]): where the values stay on the device (WebGPU in Node) only
   * these positions are read back. Gradients are returned whole.
   */
  hookPositions?: number[];
  /**
   * run on a lean graph variant that has only this run's intervention sites and requested hooks
   * (built once per such set and kept; at most two): for large batched scans, where every other
   * hook's output buffers would cost memory and time. Same numbers as the full graph.
   */
  lean?: boolean;
  /**
   * what of the logits to read back (generation reads a step's next token this way): `argmax`
   * each logit position's largest logit's id (RunResult.argmax), `topK` the k largest logits and
   * their ids (RunResult.top), both reduced in the graph; `logits: false` leaves the logits
   * themselves on the device (RunResult.logits is then [B, P, 0]). Not with grad or lean.
   */
  pick?: { argmax?: boolean; topK?: number; logits?: boolean };
  /** use the graph variant with per-head `hook_result` outputs */
  withResult?: boolean;
  /** continue from a KV cache (positions continue from past.length); returns `present` */
  past?: KVCache;
  /**
   * return a KV cache for the tokens run (use for generation); 'device': left on the device where
   * the backend keeps values there (KVCache.device; release it), else as with true
   */
  returnCache?: boolean | 'device';
  /**
   * run with this attached SAE spliced in at its hook: adds the hooks `{hook}.hook_sae_acts_post`
   * [B,T,d_sae] (an intervention site: edit features with `neuron` = feature index),
   * `{hook}.hook_sae_recons` and `{hook}.hook_sae_error` (shaped like the hook)
   */
  sae?: string;
  /**
   * also run the backward pass (reverse mode, in the same graph): `seed` is ∂M/∂logits, shaped
   * like the logits returned ([B, P, V] for the `logitPositions` asked for), so any metric linear
   * in the logits is one seed (logit[A] − logit[B] at the last position: +1 at A, −1 at B).
   * Returns ∂M/∂hook for each of `hooks` in `grads`, each shaped like the hook. The value a
   * gradient is taken at is the hook's value after interventions. The forward is always lean (only
   * this run's intervention sites; outputs the hooks fetched or differentiated). Not with `past`,
   * `returnCache` or `withResult`; `hook_result` has no gradient (use hook_z).
   */
  grad?: { hooks: string[]; seed: Tensor };
  /** run the edge-patching variant (see EdgeRun); with grad, grad.hooks must be empty */
  edges?: EdgeRun;
  /**
   * return the logits reduced, one LogitRow per row of [B, P] (`logitRows`), instead of whole: on
   * the device where the values stay there (runtime/reduce.ts); `logits` is then [B, P, 0]
   */
  reduceLogits?: LogitReduce;
  /**
   * hooks reduced to statistics (`hookStats` of the result), not returned unless also in `hooks`:
   * on the device in float32 where the values stay there, else in float64 here (runtime/reduce.ts)
   */
  hookStats?: string[];
  /**
   * attribution patching's products reduced where the values are (runtime/reduce.ts): per hook of
   * `keep` (each also in grad.hooks), Σ (against − value) · ∂M/∂value over every axis but its `keep`
   * (null: all) → `attribution`; those hooks and gradients are then not returned unless in `hooks`
   */
  attribution?: AttributionReduce;
  /** the hooks returned stay on the device where the session keeps them there (`deviceHooks`: release them), else in `hooks` */
  hooksOnDevice?: boolean;
  /**
   * the logit lens of this run (`lens`, as lensTop of every resid_pre and the final resid_post at
   * these positions, k tokens each): in the forward graph where it has one (WebGPU: only
   * the reduced numbers leave the device), else its streams fetched and reduced in the lens
   * session. One row; `pick.logits: false` may go with it alone.
   */
  lens?: { positions: number[]; k: number };
  signal?: AbortSignal;
}

export interface RunResult {
  /** [B, T, V], or [B, P, V] for the `logitPositions` asked for; [B, P, 0] with `pick.logits: false` or an edge run's `logits: false` */
  logits: Tensor;
  /** pick.argmax: [B·P] the id of each position's largest logit (the lowest id on ties) */
  argmax?: number[];
  /** pick.topK: [B·P·k] the k largest logits of each position, largest first (ties: lower id first), and their ids */
  top?: { k: number; logits: Float32Array; ids: number[] };
  hooks: Record<string, Tensor>;
  present?: KVCache;
  /** ∂M/∂hook for `grad.hooks`, shaped like the hooks */
  grads?: Record<string, Tensor>;
  /** edge runs with `outputs`: [B, nForward, T, d_model] */
  edgeOutputs?: Tensor;
  /** edge runs with outputs 'device', where the backend keeps values on the device: those outputs, not read back */
  edgeOutputsOnDevice?: DeviceTensor;
  /** with `reduceLogits`: each logits row reduced, row-major over [B, P] */
  logitRows?: LogitRow[];
  /** with `attribution`: per hook the products summed, shaped [hook dim at keep] ([1] for keep null) */
  attribution?: Record<string, Float32Array | Float64Array>;
  /** with `hooksOnDevice`, where the backend keeps values on the device: the hooks, not read back */
  deviceHooks?: Record<string, DeviceTensor>;
  /** with `lens`: the streams' lens reduced, S = n_layers + 1 */
  lens?: LensTop;
  /** with `hookStats`: each hook's statistics */
  hookStats?: Record<string, HookStats>;
  /** edge runs with grad: ∂M/∂w [B, nForward, nBackward] ([1, …] summed over the rows with sumRows) */
  edgeGrad?: Tensor;
}

export interface TokenizeOptions {
  /** prepend the BOS token as TransformerLens does (default true) */
  prependBos?: boolean;
  /** the input field the text came from, named when it is refused as too long (default 'text') */
  field?: string;
}

export interface LoadedModel {
  readonly info: ModelInfo;
  /**
   * the engine's own description of the architecture, for the engine, tests and benches only:
   * code above the engine reads `info` (tests/architecture.test.ts checks that no operation or
   * surface reads `model.spec`)
   */
  readonly spec: ModelSpec;
  /**
   * token ids of text (BOS prepended by default); PROMPT_TOO_LONG before tokenizing a text longer
   * than the run could take (caps.ts maxTextChars), as for tokenId and chatPrompt
   */
  tokenize(text: string, opts?: TokenizeOptions): number[];
  /**
   * text as one user message in the model's own chat_template (engine/chat.ts), ending with the
   * assistant's turn; NO_CHAT_TEMPLATE when it has none. Tokenize the result with prependBos false.
   */
  chatPrompt(text: string, field?: string): string;
  decode(ids: number[]): string;
  /** the text of each token as the tokenizer's vocabulary shows it, decoded for display */
  tokenStrings(ids: number[]): string[];
  /** id of a single-token string, or undefined when text is not exactly one token */
  tokenId(text: string, field?: string): number | undefined;
  /** ids of text as a word of running text (" sad" as after another word; no second word-start marker) */
  wordIds(text: string, field?: string): number[];
  readonly bosTokenId: number | undefined;
  readonly eosTokenId: number | undefined;
  /** every hook name this model offers, in forward order */
  hookNames(opts?: { withResult?: boolean }): string[];
  /** shape of a hook for B, T (Tk = total key length) */
  hookShape(hook: string, B: number, T: number, Tk?: number): number[];
  /**
   * a parameter under its TransformerLens name (see above), as float32; absent biases read as zeros.
   * Kept for later calls unless `keep: false` (a weight read once to derive something smaller).
   */
  param(name: string, opts?: { keep?: boolean }): Tensor;
  /**
   * init_l + x_l · W_V_l for every layer l (x [n_layers, d_model], init [n_layers, n_kv_heads · d_head])
   * in float64: each a sum over d in order of W_V's float32 values (as `param` reads them), the terms
   * where x is 0 left out; a layer whose x is all zero gets its init. Read from the stored weights in
   * their own layout, one matrix after another; nothing is kept.
   */
  valueProduct(x: Tensor, init: Tensor64): Tensor64;
  /** whether `name` is a parameter this checkpoint stores (false for zero-filled biases and unknown names) */
  hasParam(name: string): boolean;
  run(tokens: number[] | number[][], opts?: RunOptions): Promise<RunResult>;
  /**
   * The logit lens on the backend: residual vectors [N, d_model] → ln_final with each vector's own
   * statistics → unembedding (+ b_U) → final soft-cap, giving logits [N, d_vocab].
   */
  unembed(resid: Tensor, signal?: AbortSignal): Promise<Tensor>;
  /**
   * The logit lens reduced on the backend: S streams of P residual vectors [S, P, d_model], each
   * through the same lens as `unembed`, and only the k largest logits and a few per-vector numbers
   * come back (graph/build-model.ts buildLensGraph). The last stream is taken to be the final
   * resid_post: its argmax is the model's own prediction, which every stream is ranked on.
   */
  lensTop(resid: Tensor, k: number, signal?: AbortSignal): Promise<LensTop>;
  /**
   * Products with the stored W_O, W_out and W_U, for attribution after a forward and for the
   * operations' direct logit effects (src/engine/readout/ lists them): W_O's and W_out's
   * streamed from the weight bytes in JavaScript or in a readout session (`info.readout`), W_U's
   * in JavaScript a chunk of rows at a time; one pass over each weight, no copy of it kept in
   * JavaScript (so operations use this, not `param`, for whole matrices).
   */
  weightProducts(input: WeightProductsInput, signal?: AbortSignal): Promise<WeightProducts>;
  /** attach an SAE (SAELens layout) under an id; validates d_in and hook against this model (SAE_MISMATCH) */
  attachSae(files: SaeFiles, id: string): SaeInfo;
  /** SAEs attached so far */
  saes(): SaeInfo[];
  /** an attached SAE's weights as float32: W_enc [d_in,d_sae], b_enc, W_dec [d_sae,d_in], b_dec, threshold */
  saeWeight(id: string, name: 'W_enc' | 'b_enc' | 'W_dec' | 'b_dec' | 'threshold'): Tensor;
  /**
   * describe a transcoder set from its headers (no weight byte) and check it against this model:
   * d_model, layer count, hooks (TRANSCODER_MISMATCH naming the mismatch)
   */
  checkTranscoders(headers: TranscoderHeaders, id: string): TranscoderInfo;
  /** an SAE's SAELens cfg.json (hook_name, d_in) against this model, before its weights are fetched (SAE_MISMATCH) */
  checkSaeConfig(cfg: Record<string, unknown>): void;
  /** attach a loaded transcoder set under an id (checked as checkTranscoders does) */
  attachTranscoders(files: TranscoderFiles, id: string): TranscoderInfo;
  /** transcoder sets attached so far */
  transcoderSets(): TranscoderInfo[];
  /**
   * The local replacement model of a prompt with an attached transcoder set (engine/replacement.ts):
   * its active features, and rows of the attribution adjacency from the frozen backward graph.
   */
  replacement(
    tokens: number[],
    transcoders: string,
    opts?: { signal?: AbortSignal; onProgress?: (stage: string, done: number, total: number) => void; batch?: number },
  ): Promise<LocalReplacement>;
  /**
   * Row `row` (first axis) of a − b, two outputs left on the device (edgeOutputsOnDevice), computed
   * and kept there: a source of the EAP-IG runs. Only where the backend keeps values on the device.
   */
  deviceDifference(a: DeviceTensor, b: DeviceTensor, row: number): Promise<DeviceTensor>;
  /**
   * t copied to the device once where the backend keeps values there (a patch source fed to many
   * runs with nothing written again; release it), else t itself
   */
  toDevice(t: Tensor): Promise<Tensor | DeviceTensor>;
  /** what the model holds in memory besides the runtime's own (see ModelMemory) */
  memory(): ModelMemory;
  /**
   * After a DEVICE_LOST run: every onnxruntime session released and made again on a new device
   * (runtime/device-lost.ts); DEVICE_LOST where the runtime cannot in this process. Absent: no recovery.
   */
  recoverDevice?(): Promise<void>;
  dispose(): Promise<void>;
}

/** The active features of a prompt, sorted by (layer, position, feature); position 0 has none. */
export interface ReplacementFeatures {
  layer: Int32Array;
  position: Int32Array;
  feature: Int32Array;
  activation: Float32Array;
}

/** A row of the adjacency: an active feature (its index in ReplacementFeatures) or a logit (vocabulary id) */
export type ReplacementTarget = { kind: 'feature'; index: number } | { kind: 'logit'; token: number };

/** prune_graph on the device (LocalReplacement.pruneOnDevice): every feature's row, then the logits' */
export interface DevicePruneRequest {
  /** the logit rows' tokens and probabilities (the influence's weights) */
  logits: { token: number; prob: number }[];
  /** the node mask over the sources from their influence (the caller's node threshold; tokens kept) */
  nodeMask(influence: Float32Array): Uint8Array;
  /** prune_graph's edge_threshold (a cumulative fraction) */
  edgeThreshold: number;
  /** the most feature rows `next` will ask for (sizes the device's values; default every active feature) */
  maxFeatures?: number;
  /**
   * After the logit rows, and after each set it returns, the next features to compute rows for
   * (none: done); `partial` gives compute_partial_influences over the rows so far, per source.
   * Absent: every active feature.
   */
  next?(partial: () => Promise<Float32Array>): Promise<number[]>;
  signal?: AbortSignal;
  onRows?: (done: number, total: number) => void;
}

/**
 * What comes back of the adjacency pruned on the device, over the selected features: sources are
 * [selected, errors, tokens], rows [selected, logits].
 */
export interface DevicePruned {
  /** the features whose rows were computed, ascending: the graph's feature nodes and columns */
  selected: Int32Array;
  /** compute_influence over the unpruned graph, per source (float32) */
  influence: Float32Array;
  /** per row, the normalised |A| on the error columns (compute_graph_scores' completeness) */
  errorMass: Float32Array;
  nodeMask: Uint8Array;
  /** the edge score the edge threshold became */
  edgeScoreThreshold: number;
  /** the edges scoring at least that (row, source, A's weight), in no order; null where it is 0 */
  edges: { row: Int32Array; source: Int32Array; weight: Float32Array } | null;
  /** every row [rows, sources], read back only where `edges` is null (every entry is kept then) */
  rows: Float32Array | null;
}

/**
 * A prompt's local replacement model (engine/replacement.ts). Sources, in circuit-tracer's node
 * order: the active features, then the error nodes (index nFeatures + l·T + p; zero at p = 0),
 * then the tokens (nFeatures + L·T + p).
 */
export interface LocalReplacement {
  readonly transcoders: TranscoderInfo;
  readonly tokens: number[];
  readonly nLayers: number;
  readonly nPositions: number;
  readonly features: ReplacementFeatures;
  /** the clean run's logits at the last position [d_vocab] */
  readonly lastLogits: Float32Array;
  /** features + L·T errors + T tokens */
  readonly nSources: number;
  /**
   * runs of the frozen backward graph so far, the rows they computed, their time, and the time to
   * prepare; pruneOnDevice's helper sessions' nodes that ran off the device (onnxruntime's profiler, by op:dtype)
   */
  readonly stats: {
    runs: number;
    rows: number;
    run_ms: number;
    setup_ms: number;
    batch: number;
    off_device_ops?: Record<string, number>;
  };
  /** |e_{l,p}| per error node (l·T + p) */
  errorNorms(): Float32Array;
  /**
   * A[target, source] for each target (row-major [targets.length, nSources]): u_tᵀ J v_s in the
   * frozen model (feature targets: W_enc·x_l without b_enc; logit targets: logit − mean logit).
   */
  rows(
    targets: ReplacementTarget[],
    opts?: { signal?: AbortSignal; onRows?: (done: number, total: number) => void },
  ): Promise<Float32Array>;
  /**
   * Where the backend keeps values on the device (WebGPU): the rows of every active feature and
   * of `logits` computed and kept there, the adjacency assembled there and pruned there as far as
   * its edges (engine/runtime/adjacency.ts); only what the pruned graph needs comes back. null,
   * before any work, where its largest value (the scores' order, 8 bytes an entry) exceeds one
   * device buffer: then the rows are read back and pruned in JS.
   */
  pruneOnDevice?(request: DevicePruneRequest): Promise<DevicePruned | null>;
  /**
   * circuit-tracer's feature_intervention: set active features (indices into `features`) to new
   * values and return the logits at the last position (after any final soft-cap).
   *  - errors 'recomputed' (its default, freeze_attention): attention patterns frozen, the model's
   *    MLPs and norms run; at each intervened layer (ascending) the transcoder re-encodes the
   *    current input and (value − current activation)·W_dec is added at the feature-output hook,
   *    so later features and the error terms respond;
   *  - errors 'frozen' (constrained_layers = every layer): the local replacement model itself,
   *    patterns, norm scales and every MLP output (so every error) fixed at the clean run, only
   *    the skip responding; (value − clean activation)·W_dec enters and its direct effect is exact.
   */
  intervene(
    changes: { index: number; value: number }[],
    opts: { errors: 'recomputed' | 'frozen'; signal?: AbortSignal },
  ): Promise<Float32Array>;
}

/**
 * A model's memory as the engine sees it. The runtime's part (the WASM heap, the process RSS) is
 * measured by the host (the worker, the CLI) beside it.
 */
/** what crossed between JS and the device (runtime/transfers.ts counts it) */
export interface TransferCounts {
  /** session runs */
  runs: number;
  /** bytes of feeds taken from JS memory */
  written_bytes: number;
  /** bytes of outputs handed back in JS memory */
  read_bytes: number;
  /** feeds that were on the device already (nothing written) */
  device_feeds: number;
  /** outputs left on the device (nothing read) */
  device_outputs: number;
  /** nodes that ran off the device, summed over the profiled sessions (WebGPU in Node; absent where not profiled) */
  off_device_nodes?: number;
  /** their op types and first input's dtype ('Concat:int64') */
  off_device_ops?: Record<string, number>;
}

export interface ModelMemory {
  /** bytes of the weights in the precision the session holds them (= info.weight_bytes) */
  weight_bytes: number;
  precision: ModelInfo['weights'];
  /**
   * weight file bytes held in JavaScript (a source kept in memory: the bundled model, a folder picked
   * in the page); 0 when they are read by range from disk or IndexedDB
   */
  js_weight_bytes: number;
  /** why weight bytes are held in JavaScript, where some are (a q8 build whose cache entry could not be written, a source read whole) */
  js_weights_why?: string;
  /** float32 copies param() made and keeps for the operations that read weights in JavaScript */
  param_bytes: number;
  /** graph variants with a live session (each holds the weights in the runtime) */
  sessions: number;
  /** bytes of the hook (and gradient) values the last run returned */
  hooks_bytes: number;
  /** what crossed between JS and the device since load (runtime/transfers.ts) */
  transfers?: TransferCounts;
  /** GPU device losses this model recovered from, its sessions made again (runtime/device-lost.ts) */
  device_recoveries?: number;
  /**
   * the load's memory judgement (budget.ts): the pool that limits this backend, its size (null:
   * not known) and what loading was judged to need of it; an operation's working memory must fit the rest
   */
  budget?: { limit_name: string; limit_bytes: number | null; held_bytes: number };
}

export interface LoadOptions {
  backend?: Backend | 'auto';
  signal?: AbortSignal;
  onProgress?: (p: FileProgress) => void;
  /** memory the model must fit (budget.ts): host RAM, GPU memory; the WASM heap's 4 GiB unless wasmHeapBytes says less */
  memory?: { hostBytes?: number; gpuBytes?: number; tensorBytes?: number; wasmHeapBytes?: number };
  /** weight precision: auto (default), f32, stored or q8 (see precision.ts) */
  weights?: WeightsMode;
}
