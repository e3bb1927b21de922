/**
 * The one internal model description that every architecture adapter (arch/<family>.ts) produces
 * from config.json + tensor names, and that the graph builder consumes. Weights are referenced by
 * their safetensors names, in their stored layout, so the graph can point ORT at the file bytes
 * directly (external data) without copying or transposing them.
 */

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
}

export interface MlpSpec {
  /** gated: act(x W_gate) * (x W_in) then W_out (Llama/Gemma); plain: act(x W_in + b) W_out (GPT-2/NeoX) */
  kind: 'plain' | 'gated';
  up: LinearRef;
  gate?: LinearRef;
  down: LinearRef;
  act: Activation;
}

export interface LayerSpec {
  /** the norm before attention; absent when the block has none (OLMo 2 normalises only the outputs) */
  ln1?: NormSpec;
  /** the norm before the MLP (NeoX with parallel residual: on the block input); absent as ln1 */
  ln2?: NormSpec;
  attn: AttentionSpec;
  mlp: MlpSpec;
  /** norms of the attention / MLP outputs before the residual add: Gemma 2's and 3's sandwich norms, OLMo 2's only norms */
  postAttnNorm?: NormSpec;
  postMlpNorm?: NormSpec;
  /** GPT-NeoX use_parallel_residual: resid_post = resid_pre + attn(ln1(x)) + mlp(ln2(x)) */
  parallel: boolean;
}

export interface RopeScaling {
  kind: 'llama3' | 'linear' | 'longrope';
  /** llama3, linear: the scaling factor (longrope reads its factors and attentionFactor instead) */
  factor: number;
  lowFreqFactor?: number;
  highFreqFactor?: number;
  originalMaxPositionEmbeddings?: number;
  /** longrope: per-frequency divisors of the inverse frequencies, rd/2 each; `long` when a run's positions reach past originalMaxPositionEmbeddings */
  shortFactor?: number[];
  longFactor?: number[];
  /** longrope: cos and sin are multiplied by it */
  attentionFactor?: number;
}

export interface RotarySpec {
  theta: number;
  /** number of leading dims of each head that rotate (NeoX rotary_pct < 1 gives a partial rotary) */
  dim: number;
  scaling: RopeScaling | null;
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
  dMlp: number;
  dVocab: number;
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
  /** Gemma 2: logits = cap * tanh(logits / cap) */
  finalSoftcap: number | null;
  bosTokenId?: number;
  eosTokenId?: number;
}
