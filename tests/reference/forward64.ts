// Independent float64 reference forward for the Hugging Face causal-LM families Loupe supports.
// Written straight from the transformers modeling code (modeling_gpt2, modeling_gpt_neox,
// modeling_llama, modeling_qwen2, modeling_qwen3, modeling_gemma, modeling_gemma2,
// modeling_gemma3 + configuration_gemma3, modeling_phi3 + modeling_rope_utils, modeling_olmo2).
// It is the oracle the engine is judged against, so it must not import anything from src/.
//
// Hook names and shapes follow TransformerLens (batch dim 1):
//   hook_embed [1,T,D] (after Gemma's sqrt(D) scale), hook_pos_embed [1,T,D] (learned positions),
//   blocks.l.hook_resid_pre, blocks.l.ln1.hook_scale [1,T,1],
//   blocks.l.attn.hook_q [1,T,H,Dh], hook_k / hook_v [1,T,Hkv,Dh] (q, k after q/k-norm and rotary),
//   blocks.l.attn.hook_attn_scores [1,H,T,T] (scaled, soft-capped, masked with -Infinity),
//   blocks.l.attn.hook_pattern [1,H,T,T], blocks.l.attn.hook_z [1,T,H,Dh],
//   blocks.l.attn.hook_result [1,T,H,D] (z_h · W_O[h], no bias),
//   blocks.l.ln1_post.hook_scale (post-norms), blocks.l.hook_attn_out [1,T,D] (with o bias;
//   Gemma 2/3, OLMo 2: after the post-attention norm), blocks.l.hook_resid_mid (not for
//   parallel-residual NeoX), blocks.l.ln2.hook_scale, blocks.l.mlp.hook_pre [1,T,M] (gated MLPs:
//   x·W_gate), blocks.l.mlp.hook_pre_linear (gated: x·W_up), blocks.l.mlp.hook_post,
//   blocks.l.ln2_post.hook_scale, blocks.l.hook_mlp_out (after the post-MLP norm), blocks.l.hook_resid_post,
//   (OLMo 2 has no ln1 / ln2: no pre-norm, so no ln1.hook_scale / ln2.hook_scale)
//   ln_final.hook_scale [1,T,1], logits [1,T,V] (after Gemma2's final soft-cap).

import { readFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { decodeSafetensors, roundToDtype, type StDtype } from './safetensors-io';

export interface RefTensor {
  dims: number[];
  data: ArrayLike<number>;
}

export interface RefModel {
  config: Record<string, any>;
  tensors: Record<string, RefTensor>;
  /** the stored dtype of every tensor (loadModelDir), or of all (makeRandomModel); default F32 */
  dtypes?: Record<string, string>;
  dtype?: string;
}

export interface HookValue {
  dims: number[];
  data: Float64Array;
}

export type HookFn = (name: string, value: Float64Array, dims: number[]) => Float64Array | void;

/**
 * A feature the reference can leave out, so a test can show that leaving it out moves the logits
 * (the sensitivity check: an engine missing it would fail the 1e-4 comparison):
 *   qk_norm (no q_norm/k_norm), qk_norm_full (OLMo 2's norm per head instead of over the projection),
 *   post_norms (Gemma 3: no post-norms; OLMo 2: its norms placed before attention and MLP instead),
 *   query_pre_attn_scalar (d_head^-1/2 instead), sliding_window (every layer global),
 *   layer_pattern (Gemma 2's even-layers-slide rule instead of Gemma 3's), local_rope_base (the
 *   sliding layers rotate with rope_theta), rope_scaling_global_only (scaling on every layer),
 *   embed_scale_dtype (sqrt(D) in float32), gelu_tanh (erf GELU instead), partial_rotary (all of
 *   head_dim rotates), longrope_by_length (the other factor set), longrope_attention_factor (1),
 *   qkv_split (Phi-3's k and v rows swapped), gate_up_split (gate and up halves swapped),
 *   moe_renorm (the chosen experts' weights not divided by their sum), shared_expert_gate
 *   (Qwen2-MoE's shared expert added without its sigmoid gate)
 */
export type RefFeature =
  | 'qk_norm'
  | 'qk_norm_full'
  | 'post_norms'
  | 'query_pre_attn_scalar'
  | 'sliding_window'
  | 'layer_pattern'
  | 'local_rope_base'
  | 'rope_scaling_global_only'
  | 'embed_scale_dtype'
  | 'gelu_tanh'
  | 'partial_rotary'
  | 'longrope_by_length'
  | 'longrope_attention_factor'
  | 'qkv_split'
  | 'gate_up_split'
  | 'moe_renorm'
  | 'shared_expert_gate';

export interface ForwardOptions {
  /** Called for every hook in forward order; a returned array replaces the value downstream. */
  hook?: HookFn;
  /** features to leave out (RefFeature), for sensitivity checks only */
  drop?: RefFeature[];
  /** Which hooks to keep in the result (default: all). `false` keeps only logits. */
  record?: boolean | ((name: string) => boolean);
}

export interface ForwardResult {
  logits: HookValue;
  hooks: Record<string, HookValue>;
}

export const SUPPORTED_FAMILIES = [
  'gpt2',
  'gpt_neox',
  'llama',
  'qwen2',
  'qwen3',
  'gemma',
  'gemma2',
  'gemma3',
  'phi3',
  'olmo2',
  'mixtral',
  'qwen2_moe',
  'qwen3_moe',
  'olmoe',
] as const;
export type Family = (typeof SUPPORTED_FAMILIES)[number];

// ---------------------------------------------------------------- the model description
// (exported for the attribution reference, attribution64.ts, which reads the same weights)

type Norm = RefNorm;
type Layer = RefLayer;
type Arch = RefArch;

export interface RefNorm {
  kind: 'layer' | 'rms';
  w: Float64Array;
  b: Float64Array | null;
  plusOne: boolean; // Gemma: x̂ · (1 + w)
  eps: number;
}

export interface RefLayer {
  ln1: Norm | null; // null: no pre-norm (OLMo 2)
  ln2: Norm | null;
  postAttn: Norm | null; // Gemma2/3 and OLMo 2 post_attention_layernorm
  postMlp: Norm | null; // Gemma2/3 and OLMo 2 post_feedforward_layernorm
  Wq: Float64Array; // [D, H*Dh]
  bq: Float64Array | null;
  Wk: Float64Array; // [D, Hkv*Dh]
  bk: Float64Array | null;
  Wv: Float64Array; // [D, Hkv*Dh]
  bv: Float64Array | null;
  Wo: Float64Array; // [H*Dh, D]
  bo: Float64Array | null;
  qNorm: Norm | null; // Qwen3, Gemma 3: over each head's Dh; OLMo 2: over all H·Dh (qkFull)
  kNorm: Norm | null;
  qkFull: boolean;
  rope: 'global' | 'local'; // Gemma 3's sliding layers rotate with rope_local_base_freq
  gated: boolean;
  Win: Float64Array; // plain: W_in [D,M]; gated: W_gate [D,M]
  bin: Float64Array | null;
  Wup: Float64Array | null; // gated: W_up [D,M]
  bup: Float64Array | null;
  Wout: Float64Array; // [M, D]
  bout: Float64Array | null;
  attnScale: number;
  window: number | null; // sliding window (keys allowed: i - j < window)
  moe?: RefMoe; // a mixture-of-experts MLP instead of Win/Wup/Wout
}

/** Mixtral / Qwen2-MoE / Qwen3-MoE / OLMoE sparse MoE block (HF *SparseMoeBlock + *TopKRouter) */
export interface RefMoe {
  router: Float64Array; // [D, E]
  E: number;
  k: number;
  renorm: boolean; // divide the top-k probabilities by their sum
  M: number;
  experts: { Wg: Float64Array; Wu: Float64Array; Wd: Float64Array }[]; // [D,M], [D,M], [M,D]
  shared: { Wg: Float64Array; Wu: Float64Array; Wd: Float64Array; S: number; gate: Float64Array | null } | null;
}

export interface RefArch {
  family: Family;
  D: number;
  H: number;
  Hkv: number;
  Dh: number;
  M: number;
  V: number;
  nPos: number | null; // learned positions: table size
  embed: Float64Array; // [V, D]
  pos: Float64Array | null; // [P, D]
  embedScale: number;
  layers: RefLayer[];
  lnf: Norm;
  WU: Float64Array; // [D, V]
  bU: Float64Array | null;
  act: (x: number) => number;
  rotDims: number; // 0 = no rotary
  /** inverse frequencies [rotDims/2] and the cos/sin multiplier for a forward over seqLen positions (longrope picks by seqLen) */
  rope: ((kind: 'global' | 'local', seqLen: number) => { inv: Float64Array; mult: number }) | null;
  /** the global layers' inverse frequencies where they depend on nothing else (null with longrope) */
  invFreq: Float64Array | null;
  attnSoftcap: number | null;
  finalSoftcap: number | null;
  parallel: boolean;
}

// ---------------------------------------------------------------- math helpers

const SQRT_2_OVER_PI = Math.sqrt(2 / Math.PI);

/** erf to ~1e-15: the all-positive series erf(x) = 2/√π e^{-x²} Σ 2^n x^{2n+1} / (1·3·…·(2n+1)). */
export function erf(x: number): number {
  if (!Number.isFinite(x)) return Number.isNaN(x) ? NaN : Math.sign(x);
  const ax = Math.abs(x);
  if (ax >= 6.5) return Math.sign(x); // 1 - erf(6.5) < 1e-19
  let term = ax;
  let sum = ax;
  const x2 = ax * ax;
  for (let n = 1; n < 500; n++) {
    term *= (2 * x2) / (2 * n + 1);
    sum += term;
    if (term < sum * 1e-17) break;
  }
  const r = (2 / Math.sqrt(Math.PI)) * Math.exp(-x2) * sum;
  return x < 0 ? -r : r;
}

function activation(name: string): (x: number) => number {
  switch (name) {
    case 'gelu_new':
    case 'gelu_pytorch_tanh':
    case 'gelu_fast':
    case 'gelu_tanh':
      return (x) => 0.5 * x * (1 + Math.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)));
    case 'gelu':
      return (x) => 0.5 * x * (1 + erf(x / Math.SQRT2));
    case 'silu':
    case 'swish':
      return (x) => x / (1 + Math.exp(-x));
    case 'relu':
      return (x) => (x > 0 ? x : 0);
    default:
      throw new Error(`reference forward: unsupported activation '${name}'`);
  }
}

/** y[T,out] = x[T,in] · W[in,out] (+ b) */
export function matmul(
  x: Float64Array,
  T: number,
  nin: number,
  W: Float64Array,
  nout: number,
  b: Float64Array | null,
): Float64Array {
  const y = new Float64Array(T * nout);
  for (let t = 0; t < T; t++) {
    const yo = t * nout;
    if (b) for (let o = 0; o < nout; o++) y[yo + o] = b[o];
    for (let i = 0; i < nin; i++) {
      const xv = x[t * nin + i];
      if (xv === 0) continue;
      const wo = i * nout;
      for (let o = 0; o < nout; o++) y[yo + o] += xv * W[wo + o];
    }
  }
  return y;
}

function f64(t: RefTensor): Float64Array {
  return Float64Array.from(t.data as ArrayLike<number>);
}

/** A Linear weight [out, in] → [in, out]. */
function transposed(t: RefTensor): Float64Array {
  const [o, i] = t.dims;
  const out = new Float64Array(o * i);
  for (let r = 0; r < o; r++) for (let c = 0; c < i; c++) out[c * o + r] = t.data[r * i + c];
  return out;
}

// ---------------------------------------------------------------- model description from HF names

function tensorGetter(model: RefModel) {
  const get = (name: string, dims?: number[]): RefTensor => {
    const t = model.tensors[name];
    if (!t) throw new Error(`reference forward: missing tensor '${name}'`);
    if (dims && (t.dims.length !== dims.length || t.dims.some((d, k) => d !== dims[k])))
      throw new Error(`reference forward: tensor '${name}' has shape [${t.dims}], expected [${dims}]`);
    return t;
  };
  const opt = (name: string, dims?: number[]): RefTensor | null => (model.tensors[name] ? get(name, dims) : null);
  return { get, opt };
}

function defaultInvFreq(rotDims: number, base: number): Float64Array {
  const half = rotDims / 2;
  const inv = new Float64Array(half);
  for (let i = 0; i < half; i++) inv[i] = 1 / Math.pow(base, (2 * i) / rotDims);
  return inv;
}

/** rope_scaling → adjusted inverse frequencies (transformers' modeling_rope_utils). */
function scaledInvFreq(inv: Float64Array, scaling: Record<string, any> | null | undefined): Float64Array {
  if (!scaling) return inv;
  const type = scaling.rope_type ?? scaling.type ?? 'default';
  if (type === 'default') return inv;
  if (type === 'linear') return inv.map((f) => f / scaling.factor);
  if (type === 'llama3') {
    const factor = scaling.factor;
    const lowF = scaling.low_freq_factor;
    const highF = scaling.high_freq_factor;
    const oldCtx = scaling.original_max_position_embeddings;
    const lowWavelen = oldCtx / lowF;
    const highWavelen = oldCtx / highF;
    return inv.map((f) => {
      const wavelen = (2 * Math.PI) / f;
      if (wavelen < highWavelen) return f;
      if (wavelen > lowWavelen) return f / factor;
      const smooth = (oldCtx / wavelen - lowF) / (highF - lowF);
      return (1 - smooth) * (f / factor) + smooth * f;
    });
  }
  throw new Error(`reference forward: unsupported rope_scaling type '${type}'`);
}

/**
 * LongRoPE (modeling_rope_utils `_compute_longrope_parameters`, picked per forward by
 * `dynamic_rope_update` → longrope_frequency_update with seq_len = max(position_ids) + 1):
 * inv_freq = 1 / (ext · base^(2i/dim)), ext = long_factor when seq_len > original_max_position_embeddings
 * else short_factor; cos and sin × attention_factor, by default sqrt(1 + ln(factor)/ln(original))
 * with factor = max_position_embeddings / original_max_position_embeddings.
 */
function longrope(
  c: Record<string, any>,
  rotDims: number,
  base: number,
  seqLen: number,
  /** partial_rotary dropped: the factors extended with 1s to the full rotary dims */
  pad = false,
): { inv: Float64Array; mult: number } {
  const rs = c.rope_scaling;
  const original =
    rs.original_max_position_embeddings ?? c.original_max_position_embeddings ?? c.max_position_embeddings;
  const factor = rs.factor ?? c.max_position_embeddings / original;
  const mult = rs.attention_factor ?? (factor <= 1 ? 1 : Math.sqrt(1 + Math.log(factor) / Math.log(original)));
  let ext: number[] = seqLen > original ? rs.long_factor : rs.short_factor;
  if (pad) ext = [...ext, ...Array(Math.max(0, rotDims / 2 - ext.length)).fill(1)];
  if (ext.length !== rotDims / 2) throw new Error('reference forward: longrope factors must have rotDims/2 entries');
  const inv = new Float64Array(rotDims / 2);
  for (let i = 0; i < rotDims / 2; i++) inv[i] = 1 / (ext[i] * Math.pow(base, (2 * i) / rotDims));
  return { inv, mult };
}

/** Gemma3TextConfig's defaults (configuration_gemma3.py), which the multimodal configs rely on */
const GEMMA3_TEXT_DEFAULTS: Record<string, any> = {
  vocab_size: 262208,
  hidden_size: 2304,
  intermediate_size: 9216,
  num_hidden_layers: 26,
  num_attention_heads: 8,
  num_key_value_heads: 4,
  head_dim: 256,
  hidden_activation: 'gelu_pytorch_tanh',
  max_position_embeddings: 131072,
  rms_norm_eps: 1e-6,
  tie_word_embeddings: true,
  rope_theta: 1000000,
  query_pre_attn_scalar: 256,
  sliding_window: 4096,
  rope_local_base_freq: 10000,
  sliding_window_pattern: 6,
  rope_scaling: null,
  attn_logit_softcapping: null,
  final_logit_softcapping: null,
};

const MOE: string[] = ['mixtral', 'qwen2_moe', 'qwen3_moe', 'olmoe'];

const archCache = new WeakMap<RefModel, Arch>();

/** The parsed float64 weights of a model (one parse per model, cached; with `drop`, a fresh one without those features). */
export function describe(model: RefModel, drop: RefFeature[] = []): Arch {
  if (drop.length) return buildArch(model, new Set(drop));
  const cached = archCache.get(model);
  if (cached) return cached;
  const arch = buildArch(model, new Set());
  archCache.set(model, arch);
  return arch;
}

function buildArch(model: RefModel, drop: Set<RefFeature>): Arch {
  const c = model.config;
  const family = c.model_type as Family;
  const { get } = tensorGetter(model);
  const vec = (name: string, n: number) => f64(get(name, [n]));

  if (family === 'gpt2') {
    const D = c.n_embd,
      H = c.n_head,
      Dh = D / H,
      M = c.n_inner ?? 4 * D,
      V = c.vocab_size,
      P = c.n_positions;
    const eps = c.layer_norm_epsilon ?? 1e-5;
    const ln = (p: string): Norm => ({
      kind: 'layer',
      w: vec(`${p}.weight`, D),
      b: vec(`${p}.bias`, D),
      plusOne: false,
      eps,
    });
    const layers: RefLayer[] = [];
    for (let l = 0; l < c.n_layer; l++) {
      const p = `transformer.h.${l}`;
      const cattn = get(`${p}.attn.c_attn.weight`, [D, 3 * D]);
      const cb = get(`${p}.attn.c_attn.bias`, [3 * D]);
      const Wq = new Float64Array(D * D),
        Wk = new Float64Array(D * D),
        Wv = new Float64Array(D * D);
      for (let i = 0; i < D; i++)
        for (let o = 0; o < D; o++) {
          Wq[i * D + o] = cattn.data[i * 3 * D + o];
          Wk[i * D + o] = cattn.data[i * 3 * D + D + o];
          Wv[i * D + o] = cattn.data[i * 3 * D + 2 * D + o];
        }
      const cbf = f64(cb);
      let scale = c.scale_attn_weights === false ? 1 : 1 / Math.sqrt(Dh);
      if (c.scale_attn_by_inverse_layer_idx) scale /= l + 1;
      layers.push({
        ln1: ln(`${p}.ln_1`),
        ln2: ln(`${p}.ln_2`),
        postAttn: null,
        postMlp: null,
        Wq,
        Wk,
        Wv,
        bq: cbf.slice(0, D),
        bk: cbf.slice(D, 2 * D),
        bv: cbf.slice(2 * D),
        Wo: f64(get(`${p}.attn.c_proj.weight`, [D, D])),
        bo: vec(`${p}.attn.c_proj.bias`, D),
        qNorm: null,
        kNorm: null,
        qkFull: false,
        rope: 'global',
        gated: false,
        Win: f64(get(`${p}.mlp.c_fc.weight`, [D, M])),
        bin: vec(`${p}.mlp.c_fc.bias`, M),
        Wup: null,
        bup: null,
        Wout: f64(get(`${p}.mlp.c_proj.weight`, [M, D])),
        bout: vec(`${p}.mlp.c_proj.bias`, D),
        attnScale: scale,
        window: null,
      });
    }
    const tie = c.tie_word_embeddings ?? true;
    const wte = get('transformer.wte.weight', [V, D]);
    return {
      family,
      D,
      H,
      Hkv: H,
      Dh,
      M,
      V,
      nPos: P,
      embed: f64(wte),
      pos: f64(get('transformer.wpe.weight', [P, D])),
      embedScale: 1,
      layers,
      lnf: ln('transformer.ln_f'),
      WU: transposed(tie ? wte : get('lm_head.weight', [V, D])),
      bU: null,
      act: activation(c.activation_function ?? 'gelu_new'),
      rotDims: 0,
      rope: null,
      invFreq: null,
      attnSoftcap: null,
      finalSoftcap: null,
      parallel: false,
    };
  }

  if (family === 'gpt_neox') {
    const D = c.hidden_size,
      H = c.num_attention_heads,
      Dh = D / H,
      M = c.intermediate_size,
      V = c.vocab_size;
    const eps = c.layer_norm_eps ?? 1e-5;
    const bias = c.attention_bias ?? true;
    const ln = (p: string): Norm => ({
      kind: 'layer',
      w: vec(`${p}.weight`, D),
      b: vec(`${p}.bias`, D),
      plusOne: false,
      eps,
    });
    const pct = c.rotary_pct ?? c.partial_rotary_factor ?? 1;
    const rotDims = Math.floor(Dh * pct);
    const base = c.rotary_emb_base ?? c.rope_theta ?? 10000;
    const layers: RefLayer[] = [];
    for (let l = 0; l < c.num_hidden_layers; l++) {
      const p = `gpt_neox.layers.${l}`;
      const qkv = get(`${p}.attention.query_key_value.weight`, [3 * D, D]);
      const qkvb = bias ? get(`${p}.attention.query_key_value.bias`, [3 * D]) : null;
      // output feature f = h·3Dh + s·Dh + d  (view [.., H, 3·Dh], then split q | k | v)
      const Ws = [new Float64Array(D * D), new Float64Array(D * D), new Float64Array(D * D)];
      const bs = [new Float64Array(D), new Float64Array(D), new Float64Array(D)];
      for (let h = 0; h < H; h++)
        for (let s = 0; s < 3; s++)
          for (let d = 0; d < Dh; d++) {
            const f = h * 3 * Dh + s * Dh + d;
            const o = h * Dh + d;
            for (let i = 0; i < D; i++) Ws[s][i * D + o] = qkv.data[f * D + i];
            if (qkvb) bs[s][o] = qkvb.data[f];
          }
      layers.push({
        ln1: ln(`${p}.input_layernorm`),
        ln2: ln(`${p}.post_attention_layernorm`),
        postAttn: null,
        postMlp: null,
        Wq: Ws[0],
        Wk: Ws[1],
        Wv: Ws[2],
        bq: qkvb ? bs[0] : null,
        bk: qkvb ? bs[1] : null,
        bv: qkvb ? bs[2] : null,
        Wo: transposed(get(`${p}.attention.dense.weight`, [D, D])),
        bo: bias ? vec(`${p}.attention.dense.bias`, D) : null,
        qNorm: null,
        kNorm: null,
        qkFull: false,
        rope: 'global',
        gated: false,
        Win: transposed(get(`${p}.mlp.dense_h_to_4h.weight`, [M, D])),
        bin: vec(`${p}.mlp.dense_h_to_4h.bias`, M),
        Wup: null,
        bup: null,
        Wout: transposed(get(`${p}.mlp.dense_4h_to_h.weight`, [D, M])),
        bout: vec(`${p}.mlp.dense_4h_to_h.bias`, D),
        attnScale: 1 / Math.sqrt(Dh),
        window: null,
      });
    }
    const tie = c.tie_word_embeddings ?? false;
    const emb = get('gpt_neox.embed_in.weight', [V, D]);
    return {
      family,
      D,
      H,
      Hkv: H,
      Dh,
      M,
      V,
      nPos: null,
      embed: f64(emb),
      pos: null,
      embedScale: 1,
      layers,
      lnf: ln('gpt_neox.final_layer_norm'),
      WU: transposed(tie ? emb : get('embed_out.weight', [V, D])),
      bU: null,
      act: activation(c.hidden_act ?? 'gelu'),
      rotDims,
      rope: rotDims > 0 ? () => ({ inv: scaledInvFreq(defaultInvFreq(rotDims, base), c.rope_scaling), mult: 1 }) : null,
      invFreq: rotDims > 0 ? scaledInvFreq(defaultInvFreq(rotDims, base), c.rope_scaling) : null,
      attnSoftcap: null,
      finalSoftcap: null,
      parallel: c.use_parallel_residual ?? true,
    };
  }

  // Gemma 3: gemma3_text is the decoder itself; gemma3 (Gemma3ForConditionalGeneration) nests it in
  // text_config, with weights under language_model.model.* (or model.language_model.*)
  let cfg = c;
  let pre = 'model.';
  let lmHead = 'lm_head.weight';
  let fam: string = family;
  if (c.model_type === 'gemma3_text' || c.model_type === 'gemma3') {
    fam = 'gemma3';
    const text = c.model_type === 'gemma3' ? c.text_config : c;
    cfg = { ...GEMMA3_TEXT_DEFAULTS };
    for (const [k, v] of Object.entries(text)) if (v !== undefined) cfg[k] = v;
    if (c.model_type === 'gemma3') {
      if (model.tensors['language_model.model.embed_tokens.weight']) {
        pre = 'language_model.model.';
        lmHead = 'language_model.lm_head.weight';
      } else pre = 'model.language_model.';
    }
  }
  const llamaLike = ['llama', 'qwen2', 'qwen3', 'gemma', 'gemma2', 'gemma3', 'phi3', 'olmo2', ...MOE];
  if (llamaLike.includes(fam)) {
    const cc = cfg;
    const D = cc.hidden_size,
      H = cc.num_attention_heads,
      Hkv = cc.num_key_value_heads ?? H;
    const isMoe = MOE.includes(fam);
    const Dh = cc.head_dim ?? D / H,
      M = isMoe && fam !== 'mixtral' && fam !== 'olmoe' ? cc.moe_intermediate_size : cc.intermediate_size,
      V = cc.vocab_size;
    const eps = cc.rms_norm_eps ?? 1e-6;
    // HF MixtralSparseMoeBlock (always renormalises), Qwen2MoeTopKRouter (norm_topk_prob; also Qwen3-MoE, OLMoE),
    // Qwen2MoeSparseMoeBlock's shared expert and its sigmoid shared_expert_gate
    const readMoe = (p: string): RefMoe => {
      const blk = fam === 'mixtral' ? `${p}.block_sparse_moe` : `${p}.mlp`;
      const [gn, un, dn] = fam === 'mixtral' ? ['w1', 'w3', 'w2'] : ['gate_proj', 'up_proj', 'down_proj'];
      const E = fam === 'mixtral' ? cc.num_local_experts : cc.num_experts;
      const renorm = (fam === 'mixtral' || !!cc.norm_topk_prob) && !drop.has('moe_renorm');
      const experts = Array.from({ length: E }, (_, e) => ({
        Wg: transposed(get(`${blk}.experts.${e}.${gn}.weight`, [M, D])),
        Wu: transposed(get(`${blk}.experts.${e}.${un}.weight`, [M, D])),
        Wd: transposed(get(`${blk}.experts.${e}.${dn}.weight`, [D, M])),
      }));
      let shared: RefMoe['shared'] = null;
      if (fam === 'qwen2_moe') {
        const S = cc.shared_expert_intermediate_size;
        shared = {
          S,
          Wg: transposed(get(`${blk}.shared_expert.gate_proj.weight`, [S, D])),
          Wu: transposed(get(`${blk}.shared_expert.up_proj.weight`, [S, D])),
          Wd: transposed(get(`${blk}.shared_expert.down_proj.weight`, [D, S])),
          gate: drop.has('shared_expert_gate') ? null : transposed(get(`${blk}.shared_expert_gate.weight`, [1, D])),
        };
      }
      const router = transposed(get(`${blk}.gate.weight`, [E, D]));
      return { router, E, k: cc.num_experts_per_tok, renorm, M, experts, shared };
    };
    const gemma = fam === 'gemma' || fam === 'gemma2' || fam === 'gemma3';
    const sandwich = fam === 'gemma2' || fam === 'gemma3';
    if (H % Hkv !== 0)
      throw new Error('reference forward: num_attention_heads must be a multiple of num_key_value_heads');
    if (fam === 'qwen2' && cc.use_sliding_window)
      throw new Error('reference forward: qwen2 use_sliding_window is not supported');
    const rms = (name: string, n = D): Norm => ({ kind: 'rms', w: vec(name, n), b: null, plusOne: gemma, eps });
    // which projections carry a bias
    let qkvBias: boolean, oBias: boolean;
    if (fam === 'qwen2' || fam === 'qwen2_moe') {
      qkvBias = true;
      oBias = false;
    } else if (fam === 'phi3') {
      qkvBias = oBias = false; // Phi3Attention: qkv_proj and o_proj have bias=False
    } else {
      qkvBias = oBias = !!cc.attention_bias;
    }
    const mlpBias = fam === 'llama' ? !!cc.mlp_bias : false;
    // Gemma: HF's GemmaMLP (4.38–4.47) ignores the legacy hidden_act ('gelu' in the 1.0 configs) and uses
    // hidden_activation, defaulting to the tanh approximation; Gemma2 and Gemma3 read hidden_activation too.
    let actName = gemma ? (cc.hidden_activation ?? 'gelu_pytorch_tanh') : (cc.hidden_act ?? 'silu');
    if (drop.has('gelu_tanh') && actName === 'gelu_pytorch_tanh') actName = 'gelu';
    let scale = 1 / Math.sqrt(Dh);
    if ((fam === 'gemma2' || fam === 'gemma3') && !drop.has('query_pre_attn_scalar'))
      scale = 1 / Math.sqrt(cc.query_pre_attn_scalar ?? Dh);
    const base = cc.rope_theta ?? 10000;
    const layers: RefLayer[] = [];
    for (let l = 0; l < cc.num_hidden_layers; l++) {
      const p = `${pre}layers.${l}`;
      const a = `${p}.self_attn`;
      let window: number | null = null;
      if (fam === 'gemma2' && cc.sliding_window) {
        const sliding = Array.isArray(cc.layer_types) ? cc.layer_types[l] === 'sliding_attention' : l % 2 === 0;
        if (sliding) window = cc.sliding_window;
      }
      // Gemma3TextConfig: layer_types, else sliding unless (i + 1) % sliding_window_pattern == 0
      let local = false;
      if (fam === 'gemma3') {
        local = drop.has('layer_pattern')
          ? l % 2 === 0
          : Array.isArray(cc.layer_types)
            ? cc.layer_types[l] === 'sliding_attention'
            : (l + 1) % (cc.sliding_window_pattern ?? 6) !== 0;
        if (local) window = cc.sliding_window;
      }
      // Phi3Attention passes config.sliding_window to every layer; so does Mixtral's (MistralAttention)
      if ((fam === 'phi3' || fam === 'mixtral') && typeof cc.sliding_window === 'number') window = cc.sliding_window;
      if (drop.has('sliding_window')) window = null;
      let Wq: Float64Array, Wk: Float64Array, Wv: Float64Array, Wgate: Float64Array, Wup: Float64Array;
      if (fam === 'phi3') {
        // Phi3Attention.forward: qkv = qkv_proj(x); q = qkv[..., :H·Dh], k = the next Hkv·Dh, v = the rest
        const qkv = transposed(get(`${a}.qkv_proj.weight`, [(H + 2 * Hkv) * Dh, D])); // [D, (H+2Hkv)Dh]
        const cols = (from: number, n: number) => {
          const out = new Float64Array(D * n);
          const w = (H + 2 * Hkv) * Dh;
          for (let i = 0; i < D; i++) for (let o = 0; o < n; o++) out[i * n + o] = qkv[i * w + from + o];
          return out;
        };
        Wq = cols(0, H * Dh);
        Wk = cols(H * Dh, Hkv * Dh);
        Wv = cols((H + Hkv) * Dh, Hkv * Dh);
        if (drop.has('qkv_split')) [Wk, Wv] = [Wv, Wk];
        // Phi3MLP.forward: gate, up = gate_up_proj(x).chunk(2, dim=-1); up * act(gate)
        const gu = transposed(get(`${p}.mlp.gate_up_proj.weight`, [2 * M, D]));
        Wgate = new Float64Array(D * M);
        Wup = new Float64Array(D * M);
        for (let i = 0; i < D; i++)
          for (let o = 0; o < M; o++) {
            Wgate[i * M + o] = gu[i * 2 * M + o];
            Wup[i * M + o] = gu[i * 2 * M + M + o];
          }
        if (drop.has('gate_up_split')) [Wgate, Wup] = [Wup, Wgate];
      } else {
        Wq = transposed(get(`${a}.q_proj.weight`, [H * Dh, D]));
        Wk = transposed(get(`${a}.k_proj.weight`, [Hkv * Dh, D]));
        Wv = transposed(get(`${a}.v_proj.weight`, [Hkv * Dh, D]));
        Wgate = isMoe ? new Float64Array(0) : transposed(get(`${p}.mlp.gate_proj.weight`, [M, D]));
        Wup = isMoe ? new Float64Array(0) : transposed(get(`${p}.mlp.up_proj.weight`, [M, D]));
      }
      const olmo = fam === 'olmo2';
      const fullQk = olmo || fam === 'olmoe';
      const dropPost = drop.has('post_norms');
      layers.push({
        // OLMo2DecoderLayer: no input_layernorm; post_attention_layernorm and post_feedforward_layernorm on the outputs
        // (dropped: those two placed before attention and the MLP, as a pre-norm block would have them)
        ln1: olmo
          ? dropPost
            ? rms(`${p}.post_attention_layernorm.weight`)
            : null
          : rms(`${p}.input_layernorm.weight`),
        ln2: olmo
          ? dropPost
            ? rms(`${p}.post_feedforward_layernorm.weight`)
            : null
          : rms(sandwich ? `${p}.pre_feedforward_layernorm.weight` : `${p}.post_attention_layernorm.weight`),
        postAttn: (sandwich || olmo) && !dropPost ? rms(`${p}.post_attention_layernorm.weight`) : null,
        postMlp: (sandwich || olmo) && !dropPost ? rms(`${p}.post_feedforward_layernorm.weight`) : null,
        Wq,
        bq: qkvBias ? vec(`${a}.q_proj.bias`, H * Dh) : null,
        Wk,
        bk: qkvBias ? vec(`${a}.k_proj.bias`, Hkv * Dh) : null,
        Wv,
        bv: qkvBias ? vec(`${a}.v_proj.bias`, Hkv * Dh) : null,
        Wo: transposed(get(`${a}.o_proj.weight`, [D, H * Dh])),
        bo: oBias ? vec(`${a}.o_proj.bias`, D) : null,
        // Olmo2Attention: q_norm = RMSNorm(H·Dh), k_norm = RMSNorm(Hkv·Dh) on the projections; Qwen3/Gemma3: per head
        qNorm: drop.has('qk_norm')
          ? null
          : fam === 'qwen3' || fam === 'qwen3_moe' || fam === 'gemma3'
            ? rms(`${a}.q_norm.weight`, Dh)
            : fullQk
              ? rms(`${a}.q_norm.weight`, H * Dh)
              : null,
        kNorm: drop.has('qk_norm')
          ? null
          : fam === 'qwen3' || fam === 'qwen3_moe' || fam === 'gemma3'
            ? rms(`${a}.k_norm.weight`, Dh)
            : fullQk
              ? rms(`${a}.k_norm.weight`, Hkv * Dh)
              : null,
        qkFull: fullQk && !drop.has('qk_norm_full'),
        rope: local ? 'local' : 'global',
        gated: true,
        Win: Wgate,
        bin: mlpBias ? vec(`${p}.mlp.gate_proj.bias`, M) : null,
        Wup,
        bup: mlpBias ? vec(`${p}.mlp.up_proj.bias`, M) : null,
        Wout: isMoe ? new Float64Array(0) : transposed(get(`${p}.mlp.down_proj.weight`, [D, M])),
        bout: mlpBias ? vec(`${p}.mlp.down_proj.bias`, D) : null,
        attnScale: scale,
        window,
        ...(isMoe ? { moe: readMoe(p) } : {}),
      });
    }
    const tie = cc.tie_word_embeddings ?? gemma;
    const embName = `${pre}embed_tokens.weight`;
    const emb = get(embName, [V, D]);
    const rotDims = drop.has('partial_rotary') ? Dh : Math.floor(Dh * (cc.partial_rotary_factor ?? 1));
    // Gemma3TextScaledWordEmbedding: embeds × embed_scale.to(weight.dtype), embed_scale = sqrt(hidden_size)
    // (a float32 tensor); Gemma, Gemma 2: sqrt(hidden_size) in the compute dtype (float32 here)
    let embedScale = 1;
    if (fam === 'gemma' || fam === 'gemma2') embedScale = Math.fround(Math.sqrt(D));
    if (fam === 'gemma3') {
      const dt = (model.dtypes?.[embName] ?? model.dtype ?? 'F32') as StDtype;
      embedScale = drop.has('embed_scale_dtype')
        ? Math.fround(Math.sqrt(D))
        : roundToDtype([Math.fround(Math.sqrt(D))], dt)[0];
    }
    const globalInv = (seqLen: number) => {
      const rs = cc.rope_scaling;
      if (rs && (rs.rope_type ?? rs.type) === 'longrope') {
        const original =
          rs.original_max_position_embeddings ?? cc.original_max_position_embeddings ?? cc.max_position_embeddings;
        // dropped: the factor set of the other side of original_max_position_embeddings
        const len = drop.has('longrope_by_length') ? (seqLen > original ? 1 : original + 1) : seqLen;
        const r = longrope(cc, rotDims, base, len, drop.has('partial_rotary'));
        return drop.has('longrope_attention_factor') ? { inv: r.inv, mult: 1 } : r;
      }
      return { inv: scaledInvFreq(defaultInvFreq(rotDims, base), rs), mult: 1 };
    };
    // Gemma 3: the sliding layers' rotary has base rope_local_base_freq and no scaling (rope_scaling is the global layers')
    const localBase = drop.has('local_rope_base') ? base : (cc.rope_local_base_freq ?? 10000);
    const localInv = {
      inv: drop.has('rope_scaling_global_only')
        ? scaledInvFreq(defaultInvFreq(rotDims, localBase), cc.rope_scaling)
        : defaultInvFreq(rotDims, localBase),
      mult: 1,
    };
    return {
      family: fam as Family,
      D,
      H,
      Hkv,
      Dh,
      M,
      V,
      nPos: null,
      embed: f64(emb),
      pos: null,
      embedScale,
      layers,
      lnf: rms(`${pre}norm.weight`),
      WU: transposed(tie ? emb : get(lmHead, [V, D])),
      bU: null,
      act: activation(actName),
      rotDims,
      rope: (kind, seqLen) => (kind === 'local' ? localInv : globalInv(seqLen)),
      invFreq: (cc.rope_scaling?.rope_type ?? cc.rope_scaling?.type) === 'longrope' ? null : globalInv(1).inv,
      attnSoftcap: sandwich ? (cc.attn_logit_softcapping ?? null) : null,
      finalSoftcap: sandwich ? (cc.final_logit_softcapping ?? null) : null,
      parallel: false,
    };
  }

  throw new Error(
    `reference forward: unsupported model_type '${c.model_type}' (supported: ${SUPPORTED_FAMILIES.join(', ')})`,
  );
}

// ---------------------------------------------------------------- the forward

export function normalize(
  x: Float64Array,
  T: number,
  n: number,
  norm: Norm,
  scaleOverride?: Float64Array,
): Float64Array {
  // returns y; the per-row scale is computed by rowScale (so a hook can replace it)
  const s = scaleOverride ?? rowScale(x, T, n, norm);
  const y = new Float64Array(T * n);
  for (let t = 0; t < T; t++) {
    let mean = 0;
    if (norm.kind === 'layer') {
      for (let i = 0; i < n; i++) mean += x[t * n + i];
      mean /= n;
    }
    for (let i = 0; i < n; i++) {
      const xh = (x[t * n + i] - mean) / s[t];
      const w = norm.plusOne ? 1 + norm.w[i] : norm.w[i];
      y[t * n + i] = xh * w + (norm.b ? norm.b[i] : 0);
    }
  }
  return y;
}

/** sqrt(var + eps) (LayerNorm, biased variance) or sqrt(mean(x²) + eps) (RMSNorm), per row. */
function rowScale(x: Float64Array, T: number, n: number, norm: Norm): Float64Array {
  const s = new Float64Array(T);
  for (let t = 0; t < T; t++) {
    let mean = 0;
    if (norm.kind === 'layer') {
      for (let i = 0; i < n; i++) mean += x[t * n + i];
      mean /= n;
    }
    let v = 0;
    for (let i = 0; i < n; i++) {
      const d = x[t * n + i] - mean;
      v += d * d;
    }
    s[t] = Math.sqrt(v / n + norm.eps);
  }
  return s;
}

/** an RMSNorm over each head's Dh; a weight of nh·Dh (OLMo 2's, with qk_norm_full dropped) gives each head its own slice */
function headNorm(x: Float64Array, T: number, nh: number, Dh: number, norm: Norm): Float64Array {
  if (norm.w.length === Dh) return normalize(x, T * nh, Dh, norm);
  const y = new Float64Array(x.length);
  for (let h = 0; h < nh; h++) {
    const part = { ...norm, w: norm.w.subarray(h * Dh, (h + 1) * Dh) };
    const xs = new Float64Array(T * Dh);
    for (let t = 0; t < T; t++) xs.set(x.subarray((t * nh + h) * Dh, (t * nh + h + 1) * Dh), t * Dh);
    const ys = normalize(xs, T, Dh, part);
    for (let t = 0; t < T; t++) y.set(ys.subarray(t * Dh, (t + 1) * Dh), (t * nh + h) * Dh);
  }
  return y;
}

export function applyRotary(
  x: Float64Array,
  T: number,
  nh: number,
  Dh: number,
  rotDims: number,
  inv: Float64Array,
  mult = 1,
) {
  const half = rotDims / 2;
  const tmp = new Float64Array(rotDims);
  for (let t = 0; t < T; t++)
    for (let h = 0; h < nh; h++) {
      const o = (t * nh + h) * Dh;
      for (let j = 0; j < rotDims; j++) {
        const ang = t * inv[j % half];
        const rot = j < half ? -x[o + j + half] : x[o + j - half];
        tmp[j] = x[o + j] * Math.cos(ang) * mult + rot * Math.sin(ang) * mult;
      }
      for (let j = 0; j < rotDims; j++) x[o + j] = tmp[j];
    }
}

export function referenceForward(model: RefModel, tokens: number[], opts: ForwardOptions = {}): ForwardResult {
  const A = describe(model, opts.drop);
  const T = tokens.length;
  if (T === 0) throw new Error('reference forward: empty token list');
  for (const tok of tokens)
    if (!Number.isInteger(tok) || tok < 0 || tok >= A.V)
      throw new Error(`reference forward: token ${tok} outside vocab [0, ${A.V})`);
  if (A.nPos !== null && T > A.nPos)
    throw new Error(`reference forward: ${T} tokens exceed the ${A.nPos} learned positions`);
  const { D, H, Hkv, Dh, M, V } = A;
  const hooks: Record<string, HookValue> = {};
  const rec = opts.record ?? true;
  const keep = (name: string) => (typeof rec === 'function' ? rec(name) : rec);

  const hp = (name: string, value: Float64Array, dims: number[]): Float64Array => {
    let v = value;
    if (opts.hook) {
      const r = opts.hook(name, value, dims);
      if (r) {
        if (r.length !== value.length)
          throw new Error(`hook '${name}': replacement has ${r.length} values, expected ${value.length}`);
        v = r instanceof Float64Array ? r : Float64Array.from(r);
      }
    }
    if (name === 'logits' || keep(name)) hooks[name] = { dims, data: v };
    return v;
  };

  const normWithHook = (x: Float64Array, norm: Norm | null, name: string) => {
    if (!norm) return x; // no norm there (OLMo 2's blocks have no pre-norms)
    const s = hp(name, rowScale(x, T, D, norm), [1, T, 1]);
    return normalize(x, T, D, norm, s);
  };

  // embeddings
  let embed: Float64Array = new Float64Array(T * D);
  for (let t = 0; t < T; t++) for (let i = 0; i < D; i++) embed[t * D + i] = A.embed[tokens[t] * D + i] * A.embedScale;
  embed = hp('hook_embed', embed, [1, T, D]);
  let resid: Float64Array = embed;
  if (A.pos) {
    let pe: Float64Array = A.pos.slice(0, T * D);
    pe = hp('hook_pos_embed', pe, [1, T, D]);
    resid = new Float64Array(T * D);
    for (let k = 0; k < T * D; k++) resid[k] = embed[k] + pe[k];
  }

  const rep = H / Hkv;
  for (let l = 0; l < A.layers.length; l++) {
    const L = A.layers[l];
    const b = `blocks.${l}`;
    resid = hp(`${b}.hook_resid_pre`, resid, [1, T, D]);
    const residPre = resid;

    // ---- attention
    const x1 = normWithHook(residPre, L.ln1, `${b}.ln1.hook_scale`);
    let q: Float64Array = matmul(x1, T, D, L.Wq, H * Dh, L.bq);
    let k: Float64Array = matmul(x1, T, D, L.Wk, Hkv * Dh, L.bk);
    let v: Float64Array = matmul(x1, T, D, L.Wv, Hkv * Dh, L.bv);
    // per head over Dh (Qwen3, Gemma 3), or over the whole projection (OLMo 2), before rotary
    if (L.qNorm) q = L.qkFull ? normalize(q, T, H * Dh, L.qNorm) : headNorm(q, T, H, Dh, L.qNorm);
    if (L.kNorm) k = L.qkFull ? normalize(k, T, Hkv * Dh, L.kNorm) : headNorm(k, T, Hkv, Dh, L.kNorm);
    if (A.rotDims > 0 && A.rope) {
      const { inv, mult } = A.rope(L.rope, T); // full recompute: max(position_ids) + 1 = T
      applyRotary(q, T, H, Dh, A.rotDims, inv, mult);
      applyRotary(k, T, Hkv, Dh, A.rotDims, inv, mult);
    }
    q = hp(`${b}.attn.hook_q`, q, [1, T, H, Dh]);
    k = hp(`${b}.attn.hook_k`, k, [1, T, Hkv, Dh]);
    v = hp(`${b}.attn.hook_v`, v, [1, T, Hkv, Dh]);

    let scores: Float64Array = new Float64Array(H * T * T);
    for (let h = 0; h < H; h++) {
      const kh = Math.floor(h / rep);
      for (let i = 0; i < T; i++)
        for (let j = 0; j < T; j++) {
          const idx = (h * T + i) * T + j;
          const masked = j > i || (L.window !== null && i - j >= L.window);
          let s = 0;
          for (let d = 0; d < Dh; d++) s += q[(i * H + h) * Dh + d] * k[(j * Hkv + kh) * Dh + d];
          s *= L.attnScale;
          if (A.attnSoftcap) s = A.attnSoftcap * Math.tanh(s / A.attnSoftcap);
          scores[idx] = masked ? -Infinity : s;
        }
    }
    scores = hp(`${b}.attn.hook_attn_scores`, scores, [1, H, T, T]);
    let pattern: Float64Array = new Float64Array(H * T * T);
    for (let r = 0; r < H * T; r++) {
      let mx = -Infinity;
      for (let j = 0; j < T; j++) mx = Math.max(mx, scores[r * T + j]);
      let sum = 0;
      for (let j = 0; j < T; j++) {
        const e = scores[r * T + j] === -Infinity ? 0 : Math.exp(scores[r * T + j] - mx);
        pattern[r * T + j] = e;
        sum += e;
      }
      for (let j = 0; j < T; j++) pattern[r * T + j] /= sum;
    }
    pattern = hp(`${b}.attn.hook_pattern`, pattern, [1, H, T, T]);
    let z: Float64Array = new Float64Array(T * H * Dh);
    for (let h = 0; h < H; h++) {
      const kh = Math.floor(h / rep);
      for (let i = 0; i < T; i++)
        for (let j = 0; j < T; j++) {
          const p = pattern[(h * T + i) * T + j];
          if (p === 0) continue;
          for (let d = 0; d < Dh; d++) z[(i * H + h) * Dh + d] += p * v[(j * Hkv + kh) * Dh + d];
        }
    }
    z = hp(`${b}.attn.hook_z`, z, [1, T, H, Dh]);
    let result: Float64Array = new Float64Array(T * H * D);
    for (let t = 0; t < T; t++)
      for (let h = 0; h < H; h++) {
        const ro = (t * H + h) * D;
        for (let d = 0; d < Dh; d++) {
          const zv = z[(t * H + h) * Dh + d];
          const wo = (h * Dh + d) * D;
          for (let o = 0; o < D; o++) result[ro + o] += zv * L.Wo[wo + o];
        }
      }
    result = hp(`${b}.attn.hook_result`, result, [1, T, H, D]);
    let attnOut: Float64Array = new Float64Array(T * D);
    for (let t = 0; t < T; t++)
      for (let o = 0; o < D; o++) {
        let s = L.bo ? L.bo[o] : 0;
        for (let h = 0; h < H; h++) s += result[(t * H + h) * D + o];
        attnOut[t * D + o] = s;
      }
    if (L.postAttn) attnOut = normWithHook(attnOut, L.postAttn, `${b}.ln1_post.hook_scale`);
    attnOut = hp(`${b}.hook_attn_out`, attnOut, [1, T, D]);

    // ---- MLP
    let mlpIn: Float64Array;
    if (A.parallel) {
      mlpIn = residPre;
    } else {
      let mid: Float64Array = new Float64Array(T * D);
      for (let k2 = 0; k2 < T * D; k2++) mid[k2] = residPre[k2] + attnOut[k2];
      mid = hp(`${b}.hook_resid_mid`, mid, [1, T, D]);
      mlpIn = mid;
    }
    const x2 = normWithHook(mlpIn, L.ln2, `${b}.ln2.hook_scale`);
    if (L.moe) {
      let mlpOut = moeForward(x2, T, D, L.moe, A.act, b, hp);
      if (L.postMlp) mlpOut = normWithHook(mlpOut, L.postMlp, `${b}.ln2_post.hook_scale`);
      mlpOut = hp(`${b}.hook_mlp_out`, mlpOut, [1, T, D]);
      const next = new Float64Array(T * D);
      for (let k2 = 0; k2 < T * D; k2++) next[k2] = mlpIn[k2] + mlpOut[k2];
      resid = hp(`${b}.hook_resid_post`, next, [1, T, D]);
      continue;
    }
    let pre: Float64Array = matmul(x2, T, D, L.Win, M, L.bin);
    pre = hp(`${b}.mlp.hook_pre`, pre, [1, T, M]);
    let post: Float64Array = new Float64Array(T * M);
    if (L.gated) {
      const up = hp(`${b}.mlp.hook_pre_linear`, matmul(x2, T, D, L.Wup!, M, L.bup), [1, T, M]);
      for (let k2 = 0; k2 < T * M; k2++) post[k2] = A.act(pre[k2]) * up[k2];
    } else {
      for (let k2 = 0; k2 < T * M; k2++) post[k2] = A.act(pre[k2]);
    }
    post = hp(`${b}.mlp.hook_post`, post, [1, T, M]);
    let mlpOut: Float64Array = matmul(post, T, M, L.Wout, D, L.bout);
    if (L.postMlp) mlpOut = normWithHook(mlpOut, L.postMlp, `${b}.ln2_post.hook_scale`);
    mlpOut = hp(`${b}.hook_mlp_out`, mlpOut, [1, T, D]);

    const next = new Float64Array(T * D);
    // parallel (NeoX): x + attn(ln1(x)) + mlp(ln2(x)); sequential: resid_mid + mlp(ln2(resid_mid))
    if (A.parallel) for (let k2 = 0; k2 < T * D; k2++) next[k2] = residPre[k2] + attnOut[k2] + mlpOut[k2];
    else for (let k2 = 0; k2 < T * D; k2++) next[k2] = mlpIn[k2] + mlpOut[k2];
    resid = hp(`${b}.hook_resid_post`, next, [1, T, D]);
  }

  const xf = normWithHook(resid, A.lnf, 'ln_final.hook_scale');
  let logits: Float64Array = matmul(xf, T, D, A.WU, V, A.bU);
  if (A.finalSoftcap)
    for (let k2 = 0; k2 < logits.length; k2++) logits[k2] = A.finalSoftcap * Math.tanh(logits[k2] / A.finalSoftcap);
  logits = hp('logits', logits, [1, T, V]);
  return { logits: hooks.logits, hooks };
}

/**
 * A sparse MoE block, token by token as HF's loop over experts does: router logits x·W_r; softmax
 * over the E experts; the k largest (ties: lower index); renormalised to sum 1 when `renorm`; each
 * chosen expert's down(act(x·W_gate) ⊙ x·W_up) times its weight, summed, only for the tokens routed
 * to it; plus the shared expert × sigmoid(x·w_gate). Hooks: hook_router_logits [1,T,E],
 * hook_router_weights [1,T,E] (zero where not chosen), hook_expert_weights / hook_expert_indices
 * [1,T,k] (largest first), experts.{e}.hook_out [1,T,D] (weighted; zero where not routed),
 * shared_expert.hook_out.
 */
function moeForward(
  x: Float64Array,
  T: number,
  D: number,
  m: RefMoe,
  act: (v: number) => number,
  b: string,
  hp: (name: string, value: Float64Array, dims: number[]) => Float64Array,
): Float64Array {
  const { E, k, M } = m;
  const logits = hp(`${b}.mlp.hook_router_logits`, matmul(x, T, D, m.router, E, null), [1, T, E]);
  let w: Float64Array = new Float64Array(T * E);
  const chosen: number[][] = [];
  for (let t = 0; t < T; t++) {
    const row = Array.from(logits.subarray(t * E, (t + 1) * E));
    const mx = Math.max(...row);
    const ex = row.map((v) => (v === -Infinity ? 0 : Math.exp(v - mx)));
    const z = ex.reduce((a, c) => a + c, 0);
    const p = ex.map((v) => v / z);
    const order = p.map((v, e) => e).sort((i, j) => p[j] - p[i] || i - j);
    const top = order.slice(0, k);
    chosen.push(top);
    const s = m.renorm ? top.reduce((a, e) => a + p[e], 0) : 1;
    for (const e of top) w[t * E + e] = p[e] / s;
  }
  w = hp(`${b}.mlp.hook_router_weights`, w, [1, T, E]);
  hp(
    `${b}.mlp.hook_expert_weights`,
    Float64Array.from({ length: T * k }, (_, i) => w[Math.floor(i / k) * E + chosen[Math.floor(i / k)][i % k]]),
    [1, T, k],
  );
  hp(
    `${b}.mlp.hook_expert_indices`,
    Float64Array.from({ length: T * k }, (_, i) => chosen[Math.floor(i / k)][i % k]),
    [1, T, k],
  );
  const out = new Float64Array(T * D);
  const mlp = (xt: Float64Array, Wg: Float64Array, Wu: Float64Array, Wd: Float64Array, n: number) => {
    const g = matmul(xt, 1, D, Wg, n, null);
    const u = matmul(xt, 1, D, Wu, n, null);
    for (let i = 0; i < n; i++) g[i] = act(g[i]) * u[i];
    return matmul(g, 1, n, Wd, D, null);
  };
  for (let e = 0; e < E; e++) {
    let y: Float64Array = new Float64Array(T * D);
    for (let t = 0; t < T; t++) {
      if (!chosen[t].includes(e)) continue;
      const ye = mlp(x.subarray(t * D, (t + 1) * D), m.experts[e].Wg, m.experts[e].Wu, m.experts[e].Wd, M);
      for (let d = 0; d < D; d++) y[t * D + d] = ye[d] * w[t * E + e];
    }
    y = hp(`${b}.mlp.experts.${e}.hook_out`, y, [1, T, D]);
    for (let i = 0; i < T * D; i++) out[i] += y[i];
  }
  if (m.shared) {
    const sh = m.shared;
    let y: Float64Array = new Float64Array(T * D);
    for (let t = 0; t < T; t++) {
      const xt = x.subarray(t * D, (t + 1) * D);
      const ys = mlp(xt, sh.Wg, sh.Wu, sh.Wd, sh.S);
      const gate = sh.gate ? 1 / (1 + Math.exp(-matmul(xt, 1, D, sh.gate, 1, null)[0])) : 1;
      for (let d = 0; d < D; d++) y[t * D + d] = ys[d] * gate;
    }
    y = hp(`${b}.mlp.shared_expert.hook_out`, y, [1, T, D]);
    for (let i = 0; i < T * D; i++) out[i] += y[i];
  }
  return out;
}

/** Final-position logits only (convenience). */
export function lastLogits(res: ForwardResult): Float64Array {
  const [, T, V] = res.logits.dims;
  return res.logits.data.slice((T - 1) * V, T * V);
}

/** log-softmax in float64 of n values of x starting at `start` (default: all of x) */
export function logSoftmax64(x: ArrayLike<number>, start = 0, n = x.length - start): Float64Array {
  let mx = -Infinity;
  for (let i = 0; i < n; i++) mx = Math.max(mx, x[start + i]);
  let s = 0;
  for (let i = 0; i < n; i++) s += Math.exp(x[start + i] - mx);
  const lse = mx + Math.log(s);
  return Float64Array.from({ length: n }, (_, i) => x[start + i] - lse);
}

export function argmax(a: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < a.length; i++) if (a[i] > a[best]) best = i;
  return best;
}

/** Greedy decoding (full recompute each step, no cache): returns the n new token ids. */
export function greedyGenerate64(model: RefModel, tokens: number[], n: number): number[] {
  const seq = tokens.slice();
  const out: number[] = [];
  for (let s = 0; s < n; s++) {
    const r = referenceForward(model, seq, { record: false });
    const next = argmax(lastLogits(r));
    out.push(next);
    seq.push(next);
  }
  return out;
}

/** The hook names referenceForward produces for this model, in forward order. */
export function hookNames(model: RefModel): string[] {
  const A = describe(model);
  const names = ['hook_embed'];
  if (A.pos) names.push('hook_pos_embed');
  for (let l = 0; l < A.layers.length; l++) {
    const b = `blocks.${l}`;
    const L = A.layers[l];
    names.push(`${b}.hook_resid_pre`);
    if (L.ln1) names.push(`${b}.ln1.hook_scale`);
    names.push(
      `${b}.attn.hook_q`,
      `${b}.attn.hook_k`,
      `${b}.attn.hook_v`,
      `${b}.attn.hook_attn_scores`,
      `${b}.attn.hook_pattern`,
      `${b}.attn.hook_z`,
      `${b}.attn.hook_result`,
    );
    if (L.postAttn) names.push(`${b}.ln1_post.hook_scale`);
    names.push(`${b}.hook_attn_out`);
    if (!A.parallel) names.push(`${b}.hook_resid_mid`);
    if (L.ln2) names.push(`${b}.ln2.hook_scale`);
    if (L.moe) {
      names.push(
        `${b}.mlp.hook_router_logits`,
        `${b}.mlp.hook_router_weights`,
        `${b}.mlp.hook_expert_weights`,
        `${b}.mlp.hook_expert_indices`,
        ...L.moe.experts.map((_, e) => `${b}.mlp.experts.${e}.hook_out`),
        ...(L.moe.shared ? [`${b}.mlp.shared_expert.hook_out`] : []),
      );
    } else {
      names.push(`${b}.mlp.hook_pre`);
      if (L.gated) names.push(`${b}.mlp.hook_pre_linear`);
      names.push(`${b}.mlp.hook_post`);
    }
    if (L.postMlp) names.push(`${b}.ln2_post.hook_scale`);
    names.push(`${b}.hook_mlp_out`, `${b}.hook_resid_post`);
  }
  names.push('ln_final.hook_scale', 'logits');
  return names;
}

/** Read config.json + model.safetensors (or model.safetensors.index.json + shards) with our own reader. */
export function loadModelDir(dir: string): RefModel & { dtypes: Record<string, string> } {
  const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'));
  const tensors: Record<string, RefTensor> = {};
  const dtypes: Record<string, string> = {};
  const files: string[] = [];
  if (existsSync(join(dir, 'model.safetensors'))) files.push('model.safetensors');
  else if (existsSync(join(dir, 'model.safetensors.index.json'))) {
    const idx = JSON.parse(readFileSync(join(dir, 'model.safetensors.index.json'), 'utf8'));
    files.push(...new Set<string>(Object.values(idx.weight_map as Record<string, string>)));
  } else throw new Error(`loadModelDir: no model.safetensors in ${dir}`);
  for (const f of files) {
    const r = decodeSafetensors(new Uint8Array(readFileSync(join(dir, f))));
    for (const [name, t] of Object.entries(r.tensors)) {
      tensors[name] = { dims: t.dims, data: t.data };
      dtypes[name] = t.dtype;
    }
  }
  return { config, tensors, dtypes };
}
