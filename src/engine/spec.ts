/**
 * The one internal model description that every architecture adapter (arch/<family>.ts) produces
 * from config.json + tensor names, and that the graph builder consumes. Weights are referenced by
 * their safetensors names, in their stored layout, so the graph can point ORT at the file bytes
 * directly (external data) without copying or transposing them.
 */
import { LoupeError } from './errors';

/** torch.nn.Linear stores [out, in] ('out_in'); GPT-2's Conv1D stores [in, out] ('in_out'). */
export interface LinearRef {
  w: string;
  b?: string;
  layout: 'out_in' | 'in_out';
  /**
   * the output rows [start, start + count) of a fused 'out_in' matrix (Phi-3's qkv_proj: q | k | v,
   * gate_up_proj: gate | up); the bias, if any, is the fused one. Absent: the whole matrix.
   */
  rows?: { start: number; count: number };
}

export interface NormSpec {
  kind: 'layernorm' | 'rmsnorm';
  w: string;
  b?: string;
  eps: number;
  /** Gemma stores w and multiplies by (1 + w) */
  weightOffset: 0 | 1;
}

export type Activation = 'gelu_new' | 'gelu' | 'gelu_pytorch_tanh' | 'relu' | 'silu' | 'gelu_fast';

export type QKVSpec =
  | { kind: 'separate'; q: LinearRef; k: LinearRef; v: LinearRef }
  /** GPT-2 c_attn: [D, 3D] Conv1D, columns q | k | v */
  | { kind: 'gpt2_fused'; qkv: LinearRef }
  /** GPT-NeoX query_key_value: [3D, D] Linear, output rows grouped per head as [H, 3, Dh] */
  | { kind: 'neox_fused'; qkv: LinearRef };

export interface AttentionSpec {
  qkv: QKVSpec;
  o: LinearRef;
  /** Qwen3, Gemma 3: RMSNorm over each head's Dh of q and k, before rotary; OLMo 2: over the whole projection (qkNormWidth 'full') */
  qNorm?: NormSpec;
  kNorm?: NormSpec;
  /** what q_norm / k_norm normalise: each head's Dh (default), or all H·Dh (Hkv·Dh) of the projection at once */
  qkNormWidth?: 'head' | 'full';
  /** Gemma 3: this layer rotates with ModelSpec.rotaryLocal (the sliding layers' own base, no scaling) */
  localRotary?: boolean;
  /** multiplier applied to q·k (usually 1/sqrt(Dh); Gemma 2: query_pre_attn_scalar^-0.5) */
  scale: number;
  /** Gemma 2: scores = cap * tanh(scores / cap) before the mask */
  softcap: number | null;
  /** sliding-window size for this layer, null = global */
  slidingWindow: number | null;
  /**
   * Qwen3.5's gated attention: q's projection holds, per head, Dh query rows then Dh gate rows
   * (`(h two dh)`); z is multiplied by sigmoid(gate) before W_O (hook_z is the gated value)
   */
  outputGate?: boolean;
  /**
   * GPT-OSS's attention sinks: a learned logit per head (`self_attn.sinks` [H]) joins each row's
   * softmax as one more column and is dropped after it, so a row's weights sum to less than 1
   * (hook_pattern holds the key columns only)
   */
  sinks?: { w: string };
  /** Gemma 4: this layer's own key/value heads and head width (its full-attention layers differ); absent: the model's */
  nKvHeads?: number;
  dHead?: number;
  /**
   * Gemma 4: v is RMS-normalised over each head's Dh, without a weight (v_norm), before the cache.
   * (Its attention_k_eq_v: qkv.v is the very object qkv.k, and v is the key projection before k_norm.)
   */
  vNorm?: { eps: number };
  /**
   * Gemma 4's KV sharing: this layer attends with layer kvFrom's keys and values (that layer's
   * present.*, cache included) and computes none of its own; qkv.k and qkv.v are then unused
   */
  kvFrom?: number;
}

/**
 * Qwen3.5's gated delta-net (linear attention), the token mixer of its linear_attention layers:
 * qkv = causal depthwise conv1d (kernel K, silu) of in_proj_qkv(x), q and k L2-normalised,
 * β = sigmoid(in_proj_b x), g = −exp(A_log) · softplus(in_proj_a x + dt_bias); per value head the
 * state S [Dk, Dv] evolves S ← e^g S, S ← S + k (β (v − Sᵀk))ᵀ and reads o = Sᵀ q / sqrt(Dk);
 * out = out_proj(RMSNorm(o) ⊙ w ⊙ silu(in_proj_z x)). Key heads serve Hv / Hk consecutive value heads.
 */
export interface LinearAttnSpec {
  /** in_proj_qkv [2·Hk·Dk + Hv·Dv, D]: rows q | k | v */
  qkv: LinearRef;
  /** in_proj_z [Hv·Dv, D]: the output gate */
  z: LinearRef;
  /** in_proj_b [Hv, D] (β), in_proj_a [Hv, D] (the decay's input) */
  b: LinearRef;
  a: LinearRef;
  /** conv1d.weight [C, 1, K], no bias */
  conv: string;
  convKernel: number;
  /** A_log [Hv], dt_bias [Hv] */
  aLog: string;
  dtBias: string;
  /** the gated RMSNorm over each value head's Dv (weight w, no offset) */
  norm: NormSpec;
  /** out_proj [D, Hv·Dv] */
  out: LinearRef;
  nKHeads: number;
  nVHeads: number;
  dK: number;
  dV: number;
}

export interface MlpSpec {
  /** gated: act(x W_gate) * (x W_in) then W_out (Llama/Gemma); plain: act(x W_in + b) W_out (GPT-2/NeoX) */
  kind: 'plain' | 'gated';
  up: LinearRef;
  gate?: LinearRef;
  down: LinearRef;
  act: Activation;
  /** Gemma 4's double-wide MLP on its KV-sharing layers: this layer's width; absent: ModelSpec.dMlp */
  width?: number;
}

/**
 * Gemma 4's per-layer input (PLE), in the block after the MLP: x + norm(W_proj (act(W_gate x) ⊙ p_l)),
 * p_l the layer's slice of ModelSpec.perLayerInput
 */
export interface PerLayerSpec {
  /** per_layer_input_gate [P, D], per_layer_projection [D, P] */
  gate: LinearRef;
  proj: LinearRef;
  /** post_per_layer_input_norm over D */
  norm: NormSpec;
  act: Activation;
}

/**
 * one expert of a mixture-of-experts layer: a gated MLP act(x W_gate) ⊙ (x W_up) W_down of width
 * MoeSpec.dExpert (GPT-OSS: each projection with its bias, and MoeSpec.glu's clamped form)
 */
export interface ExpertSpec {
  gate: LinearRef;
  up: LinearRef;
  down: LinearRef;
}

/**
 * A sparse mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): a router [E, D] scores the
 * experts per token, the top k are chosen and weighted, and the output is Σ over chosen experts of
 * weight · expert(x) (+ Qwen2-MoE's shared expert, sigmoid-gated).
 */
export interface MoeSpec {
  router: LinearRef;
  experts: ExpertSpec[];
  topK: number;
  /**
   * softmax_topk: softmax over all E logits, then the k largest probabilities (divided by their sum
   * when normTopK): Mixtral (always), Qwen2/3-MoE and OLMoE (norm_topk_prob); GPT-OSS's softmax
   * over the k largest logits is the same weights (normTopK true)
   */
  routing: 'softmax_topk';
  normTopK: boolean;
  act: Activation;
  /** each expert's width (Mixtral intermediate_size, the others moe_intermediate_size) */
  dExpert: number;
  /**
   * GPT-OSS's clamped SwiGLU in place of act(gate) ⊙ up: g = min(gate, limit), u = clamp(up, ±limit),
   * (u + 1) ⊙ g·σ(alpha·g)
   */
  glu?: { alpha: number; limit: number };
  /** Qwen2-MoE: a dense gated MLP on every token, times sigmoid(x · w_gate) ([1, D]) */
  shared?: { mlp: ExpertSpec; dMlp: number; gate: LinearRef };
  /**
   * Gemma 4 (enable_moe_block): the experts run beside the layer's dense MLP (LayerSpec.mlp), both on
   * hook_resid_mid. The router reads routerNorm(resid_mid) · routerScale (its RMSNorm's weight is the
   * stored router.scale), the experts preNorm(resid_mid); each chosen weight (after normTopK) is
   * times expertScale[e] ([E]); the experts' sum goes through postNorm, the dense MLP's output through
   * denseNorm, and the two add before LayerSpec.postMlpNorm.
   */
  beside?: {
    routerNorm: NormSpec;
    routerScale: number;
    expertScale: string;
    preNorm: NormSpec;
    postNorm: NormSpec;
    denseNorm: NormSpec;
  };
}

export interface LayerSpec {
  /** the norm before attention; absent when the block has none (OLMo 2 normalises only the outputs) */
  ln1?: NormSpec;
  /** the norm before the MLP (NeoX with parallel residual: on the block input); absent as ln1 */
  ln2?: NormSpec;
  /** the token mixer: attention (absent exactly when linearAttn is there) */
  attn?: AttentionSpec;
  /**
   * Qwen3.5's linear_attention layers: this token mixer replaces attention (no attention hooks,
   * heads or KV cache; its own hooks and recurrent state instead: graph/hooks.ts, runtime/feeds.ts)
   */
  linearAttn?: LinearAttnSpec;
  /** the dense MLP; a mixture-of-experts layer has `moe` instead (and this is absent, but for MoeSpec.beside) */
  mlp?: MlpSpec;
  moe?: MoeSpec;
  /** norms of the attention / MLP outputs before the residual add: Gemma 2's and 3's sandwich norms, OLMo 2's only norms */
  postAttnNorm?: NormSpec;
  postMlpNorm?: NormSpec;
  /** GPT-NeoX use_parallel_residual: resid_post = resid_pre + attn(ln1(x)) + mlp(ln2(x)) */
  parallel: boolean;
  /** Gemma 4: the per-layer input's block, added after the MLP */
  perLayer?: PerLayerSpec;
  /** Gemma 4: a stored [1] scalar (layer_scalar) the block's output is multiplied by */
  scalar?: string;
}

export interface RopeScaling {
  kind: 'llama3' | 'linear' | 'longrope' | 'yarn';
  /** llama3, linear: the scaling factor (longrope reads its factors and attentionFactor instead) */
  factor: number;
  lowFreqFactor?: number;
  highFreqFactor?: number;
  originalMaxPositionEmbeddings?: number;
  /** longrope: per-frequency divisors of the inverse frequencies, rd/2 each; `long` when a run's positions reach past originalMaxPositionEmbeddings */
  shortFactor?: number[];
  longFactor?: number[];
  /** longrope, yarn: cos and sin are multiplied by it */
  attentionFactor?: number;
  /** yarn: the rotation counts bounding the ramp between interpolated and kept frequencies, and whether its ends are rounded outwards */
  betaFast?: number;
  betaSlow?: number;
  truncate?: boolean;
}

export interface RotarySpec {
  theta: number;
  /** number of leading dims of each head that rotate (NeoX rotary_pct < 1 gives a partial rotary) */
  dim: number;
  scaling: RopeScaling | null;
  /**
   * Gemma 4's proportional RoPE: only the first `angles` of the dim / 2 frequencies θ^(−2i/dim)
   * turn, the rest are 0 (those dims pass unrotated); absent: all of them
   */
  angles?: number;
}

export interface ModelSpec {
  /** the adapter that produced it (arch/index.ts), e.g. 'llama' or 'qwen3' */
  family: string;
  /** config.json model_type */
  modelType: string;
  nLayers: number;
  dModel: number;
  nHeads: number;
  nKvHeads: number;
  dHead: number;
  /** the MLP's width; in a mixture-of-experts model each expert's width */
  dMlp: number;
  dVocab: number;
  /** mixture-of-experts models: experts per layer and how many each token is routed to (absent: dense) */
  nExperts?: number;
  topK?: number;
  nCtx: number;
  norm: 'layernorm' | 'rmsnorm';
  embed: {
    w: string;
    /** Gemma multiplies embeddings by sqrt(d_model), rounded to the dtype HF computes it in */ scale: number;
  };
  posEmbed?: { w: string };
  rotary?: RotarySpec;
  /** Gemma 3: the rotary of the layers marked localRotary (rope_local_base_freq, never scaled) */
  rotaryLocal?: RotarySpec;
  layers: LayerSpec[];
  lnFinal: NormSpec;
  /** lm_head [V, D] (or the tied embedding), optional bias */
  unembed: { w: string; b?: string };
  /**
   * Gemma 4's per-layer inputs [B, T, L, P]: (RMSNorm(W_proj x_embed · projScale) + E_pl[token] ·
   * embedScale) · inputScale, the token table [V', L·P] and projection [L·P, D] split per layer
   */
  perLayerInput?: {
    embed: string;
    embedScale: number;
    projection: LinearRef;
    projScale: number;
    norm: NormSpec;
    inputScale: number;
    width: number;
  };
  /** Gemma 2: logits = cap * tanh(logits / cap) */
  finalSoftcap: number | null;
  bosTokenId?: number;
  eosTokenId?: number;
}

/**
 * Layer l's attention; a linear-attention layer (Qwen3.5) has none, and an operation that needs
 * attention weights there (heads, W_Q…W_O, edges) is UNSUPPORTED_OP naming the layer.
 */
export function attentionOf(spec: ModelSpec, l: number): AttentionSpec {
  const a = spec.layers[l].attn;
  if (!a)
    throw new LoupeError(
      'UNSUPPORTED_OP',
      `Layer ${l} of this ${spec.family} model is a linear-attention (gated delta-net) layer: it has no attention heads.`,
      'Use its blocks.{l}.linear_attn.* hooks, or the full-attention layers, for head-level work.',
      { layer: l, family: spec.family },
    );
  return a;
}

/** layer l's key/value heads and head width (Gemma 4's differ by layer; other models': the model's) */
export function headsOf(spec: ModelSpec, l: number): { Hkv: number; Dh: number } {
  const a = spec.layers[l]?.attn;
  return { Hkv: a?.nKvHeads ?? spec.nKvHeads, Dh: a?.dHead ?? spec.dHead };
}

/**
 * DLA's readout widths: layer l's W_O rows (H·Dh_l) and W_out rows (its MLP width), and the widths
 * the readout's per-layer stacks are padded to (the largest; Gemma 4's full-attention layers and
 * double-wide MLPs are wider, every other model's layers are all of the model's widths)
 */
export function readoutWidths(spec: ModelSpec): { hd: number[]; m: number[]; HD: number; M: number } {
  const hd = spec.layers.map((_, l) => spec.nHeads * headsOf(spec, l).Dh);
  const m = spec.layers.map((l) => l.mlp?.width ?? spec.dMlp);
  return { hd, m, HD: Math.max(...hd), M: Math.max(...m) };
}

/** whether every attention layer has the model's head geometry, its own K/V and the model's MLP width */
export const uniformLayers = (spec: ModelSpec): boolean =>
  spec.layers.every(
    (l) =>
      !l.perLayer &&
      !l.scalar &&
      l.mlp?.width === undefined &&
      (!l.attn ||
        ((l.attn.nKvHeads ?? spec.nKvHeads) === spec.nKvHeads &&
          (l.attn.dHead ?? spec.dHead) === spec.dHead &&
          l.attn.kvFrom === undefined &&
          !l.attn.vNorm)),
  );

/** whether any layer is a linear-attention layer (the model then carries a recurrent state, not only a KV cache) */
export const hasLinearAttention = (spec: ModelSpec): boolean => spec.layers.some((l) => l.linearAttn !== undefined);

/** the token mixer's output projection: attention's W_O, or the linear attention's out_proj */
export const mixerOut = (layer: LayerSpec): LinearRef => layer.attn?.o ?? layer.linearAttn!.out;
