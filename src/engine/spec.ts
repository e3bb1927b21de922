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
  /** Qwen3: RMSNorm over each head's Dh of q and k, before rotary */
  qNorm?: NormSpec;
  kNorm?: NormSpec;
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
  ln1: NormSpec;
  /** NeoX with parallel residual uses its own ln2 on the block input */
  ln2: NormSpec;
  attn: AttentionSpec;
  mlp: MlpSpec;
  /** Gemma 2 "sandwich" norms applied to the attention / MLP outputs before the residual add */
  postAttnNorm?: NormSpec;
  postMlpNorm?: NormSpec;
  /** GPT-NeoX use_parallel_residual: resid_post = resid_pre + attn(ln1(x)) + mlp(ln2(x)) */
  parallel: boolean;
}

export interface RopeScaling {
  kind: 'llama3' | 'linear';
  factor: number;
  lowFreqFactor?: number;
  highFreqFactor?: number;
  originalMaxPositionEmbeddings?: number;
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
  embed: { w: string; /** Gemma multiplies embeddings by sqrt(d_model) (in the model dtype) */ scale: number };
  posEmbed?: { w: string };
  rotary?: RotarySpec;
  layers: LayerSpec[];
  lnFinal: NormSpec;
  /** lm_head [V, D] (or the tied embedding), optional bias */
  unembed: { w: string; b?: string };
  /** Gemma 2: logits = cap * tanh(logits / cap) */
  finalSoftcap: number | null;
  bosTokenId?: number;
  eosTokenId?: number;
}
