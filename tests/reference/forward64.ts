// Independent float64 reference forward for the Hugging Face causal-LM families Loupe supports.
// Written straight from the transformers modeling code (modeling_gpt2, modeling_gpt_neox,
// modeling_llama, modeling_qwen2, modeling_qwen3, modeling_gemma, modeling_gemma2). It is the
// oracle the engine is judged against, so it must not import anything from src/.
//
// Hook names and shapes follow TransformerLens (batch dim 1):
//   hook_embed [1,T,D] (after Gemma's sqrt(D) scale), hook_pos_embed [1,T,D] (learned positions),
//   blocks.l.hook_resid_pre, blocks.l.ln1.hook_scale [1,T,1],
//   blocks.l.attn.hook_q [1,T,H,Dh], hook_k / hook_v [1,T,Hkv,Dh] (q, k after q/k-norm and rotary),
//   blocks.l.attn.hook_attn_scores [1,H,T,T] (scaled, soft-capped, masked with -Infinity),
//   blocks.l.attn.hook_pattern [1,H,T,T], blocks.l.attn.hook_z [1,T,H,Dh],
//   blocks.l.attn.hook_result [1,T,H,D] (z_h · W_O[h], no bias),
//   blocks.l.hook_attn_out [1,T,D] (with o bias; Gemma2: after post_attention_layernorm),
//   blocks.l.hook_resid_mid (not for parallel-residual NeoX), blocks.l.ln2.hook_scale,
//   blocks.l.mlp.hook_pre [1,T,M] (gated MLPs: x·W_gate), blocks.l.mlp.hook_post,
//   blocks.l.hook_mlp_out (Gemma2: after post_feedforward_layernorm), blocks.l.hook_resid_post,
//   ln_final.hook_scale [1,T,1], logits [1,T,V] (after Gemma2's final soft-cap).

import { readFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { decodeSafetensors } from './safetensors-io';

export interface RefTensor {
  dims: number[];
  data: ArrayLike<number>;
}

export interface RefModel {
  config: Record<string, any>;
  tensors: Record<string, RefTensor>;
}

export interface HookValue {
  dims: number[];
  data: Float64Array;
}

export type HookFn = (name: string, value: Float64Array, dims: number[]) => Float64Array | void;

export interface ForwardOptions {
  /** Called for every hook in forward order; a returned array replaces the value downstream. */
  hook?: HookFn;
  /** Which hooks to keep in the result (default: all). `false` keeps only logits. */
  record?: boolean | ((name: string) => boolean);
}

export interface ForwardResult {
  logits: HookValue;
  hooks: Record<string, HookValue>;
}

export const SUPPORTED_FAMILIES = ['gpt2', 'gpt_neox', 'llama', 'qwen2', 'qwen3', 'gemma', 'gemma2'] as const;
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
  ln1: Norm;
  ln2: Norm;
  postAttn: Norm | null; // Gemma2 post_attention_layernorm
  postMlp: Norm | null; // Gemma2 post_feedforward_layernorm
  Wq: Float64Array; // [D, H*Dh]
  bq: Float64Array | null;
  Wk: Float64Array; // [D, Hkv*Dh]
  bk: Float64Array | null;
  Wv: Float64Array; // [D, Hkv*Dh]
  bv: Float64Array | null;
  Wo: Float64Array; // [H*Dh, D]
  bo: Float64Array | null;
  qNorm: Norm | null; // Qwen3, over Dh
  kNorm: Norm | null;
  gated: boolean;
  Win: Float64Array; // plain: W_in [D,M]; gated: W_gate [D,M]
  bin: Float64Array | null;
  Wup: Float64Array | null; // gated: W_up [D,M]
  bup: Float64Array | null;
  Wout: Float64Array; // [M, D]
  bout: Float64Array | null;
  attnScale: number;
  window: number | null; // sliding window (keys allowed: i - j < window)
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
  layers: Layer[];
  lnf: Norm;
  WU: Float64Array; // [D, V]
  bU: Float64Array | null;
  act: (x: number) => number;
  rotDims: number; // 0 = no rotary
  invFreq: Float64Array | null; // [rotDims/2]
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

const archCache = new WeakMap<RefModel, Arch>();

/** The parsed float64 weights of a model (one parse per model, cached). */
export function describe(model: RefModel): Arch {
  const cached = archCache.get(model);
  if (cached) return cached;
  const arch = buildArch(model);
  archCache.set(model, arch);
  return arch;
}

function buildArch(model: RefModel): Arch {
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
    const layers: Layer[] = [];
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
    const layers: Layer[] = [];
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
      invFreq: rotDims > 0 ? scaledInvFreq(defaultInvFreq(rotDims, base), c.rope_scaling) : null,
      attnSoftcap: null,
      finalSoftcap: null,
      parallel: c.use_parallel_residual ?? true,
    };
  }

  if (family === 'llama' || family === 'qwen2' || family === 'qwen3' || family === 'gemma' || family === 'gemma2') {
    const D = c.hidden_size,
      H = c.num_attention_heads,
      Hkv = c.num_key_value_heads ?? H;
    const Dh = c.head_dim ?? D / H,
      M = c.intermediate_size,
      V = c.vocab_size;
    const eps = c.rms_norm_eps ?? 1e-6;
    const gemma = family === 'gemma' || family === 'gemma2';
    if (H % Hkv !== 0)
      throw new Error('reference forward: num_attention_heads must be a multiple of num_key_value_heads');
    if (family === 'qwen2' && c.use_sliding_window)
      throw new Error('reference forward: qwen2 use_sliding_window is not supported');
    const rms = (name: string, n = D): Norm => ({ kind: 'rms', w: vec(name, n), b: null, plusOne: gemma, eps });
    // which projections carry a bias
    let qkvBias: boolean, oBias: boolean;
    if (family === 'qwen2') {
      qkvBias = true;
      oBias = false;
    } else {
      qkvBias = oBias = !!c.attention_bias;
    }
    const mlpBias = family === 'llama' ? !!c.mlp_bias : false;
    // Gemma: HF's GemmaMLP (4.38–4.47) ignores the legacy hidden_act ('gelu' in the 1.0 configs) and uses
    // hidden_activation, defaulting to the tanh approximation; Gemma2 reads hidden_activation too.
    const actName = gemma ? (c.hidden_activation ?? 'gelu_pytorch_tanh') : (c.hidden_act ?? 'silu');
    let scale = 1 / Math.sqrt(Dh);
    if (family === 'gemma2') scale = 1 / Math.sqrt(c.query_pre_attn_scalar ?? Dh);
    const base = c.rope_theta ?? 10000;
    const layers: Layer[] = [];
    for (let l = 0; l < c.num_hidden_layers; l++) {
      const p = `model.layers.${l}`;
      const a = `${p}.self_attn`;
      let window: number | null = null;
      if (family === 'gemma2' && c.sliding_window) {
        const sliding = Array.isArray(c.layer_types) ? c.layer_types[l] === 'sliding_attention' : l % 2 === 0;
        if (sliding) window = c.sliding_window;
      }
      layers.push({
        ln1: rms(`${p}.input_layernorm.weight`),
        ln2: rms(
          family === 'gemma2' ? `${p}.pre_feedforward_layernorm.weight` : `${p}.post_attention_layernorm.weight`,
        ),
        postAttn: family === 'gemma2' ? rms(`${p}.post_attention_layernorm.weight`) : null,
        postMlp: family === 'gemma2' ? rms(`${p}.post_feedforward_layernorm.weight`) : null,
        Wq: transposed(get(`${a}.q_proj.weight`, [H * Dh, D])),
        bq: qkvBias ? vec(`${a}.q_proj.bias`, H * Dh) : null,
        Wk: transposed(get(`${a}.k_proj.weight`, [Hkv * Dh, D])),
        bk: qkvBias ? vec(`${a}.k_proj.bias`, Hkv * Dh) : null,
        Wv: transposed(get(`${a}.v_proj.weight`, [Hkv * Dh, D])),
        bv: qkvBias ? vec(`${a}.v_proj.bias`, Hkv * Dh) : null,
        Wo: transposed(get(`${a}.o_proj.weight`, [D, H * Dh])),
        bo: oBias ? vec(`${a}.o_proj.bias`, D) : null,
        qNorm: family === 'qwen3' ? rms(`${a}.q_norm.weight`, Dh) : null,
        kNorm: family === 'qwen3' ? rms(`${a}.k_norm.weight`, Dh) : null,
        gated: true,
        Win: transposed(get(`${p}.mlp.gate_proj.weight`, [M, D])),
        bin: mlpBias ? vec(`${p}.mlp.gate_proj.bias`, M) : null,
        Wup: transposed(get(`${p}.mlp.up_proj.weight`, [M, D])),
        bup: mlpBias ? vec(`${p}.mlp.up_proj.bias`, M) : null,
        Wout: transposed(get(`${p}.mlp.down_proj.weight`, [D, M])),
        bout: mlpBias ? vec(`${p}.mlp.down_proj.bias`, D) : null,
        attnScale: scale,
        window,
      });
    }
    const tie = c.tie_word_embeddings ?? gemma;
    const emb = get('model.embed_tokens.weight', [V, D]);
    const rotDims = Math.floor(Dh * (c.partial_rotary_factor ?? 1));
    return {
      family,
      D,
      H,
      Hkv,
      Dh,
      M,
      V,
      nPos: null,
      embed: f64(emb),
      pos: null,
      embedScale: gemma ? Math.sqrt(D) : 1,
      layers,
      lnf: rms('model.norm.weight'),
      WU: transposed(tie ? emb : get('lm_head.weight', [V, D])),
      bU: null,
      act: activation(actName),
      rotDims,
      invFreq: scaledInvFreq(defaultInvFreq(rotDims, base), c.rope_scaling),
      attnSoftcap: family === 'gemma2' ? (c.attn_logit_softcapping ?? null) : null,
      finalSoftcap: family === 'gemma2' ? (c.final_logit_softcapping ?? null) : null,
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

export function applyRotary(x: Float64Array, T: number, nh: number, Dh: number, rotDims: number, inv: Float64Array) {
  const half = rotDims / 2;
  const tmp = new Float64Array(rotDims);
  for (let t = 0; t < T; t++)
    for (let h = 0; h < nh; h++) {
      const o = (t * nh + h) * Dh;
      for (let j = 0; j < rotDims; j++) {
        const ang = t * inv[j % half];
        const rot = j < half ? -x[o + j + half] : x[o + j - half];
        tmp[j] = x[o + j] * Math.cos(ang) + rot * Math.sin(ang);
      }
      for (let j = 0; j < rotDims; j++) x[o + j] = tmp[j];
    }
}

export function referenceForward(model: RefModel, tokens: number[], opts: ForwardOptions = {}): ForwardResult {
  const A = describe(model);
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

  const normWithHook = (x: Float64Array, norm: Norm, name: string) => {
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
    if (L.qNorm) q = normalize(q, T * H, Dh, L.qNorm);
    if (L.kNorm) k = normalize(k, T * Hkv, Dh, L.kNorm);
    if (A.rotDims > 0 && A.invFreq) {
      applyRotary(q, T, H, Dh, A.rotDims, A.invFreq);
      applyRotary(k, T, Hkv, Dh, A.rotDims, A.invFreq);
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
    if (L.postAttn) attnOut = normalize(attnOut, T, D, L.postAttn);
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
    let pre: Float64Array = matmul(x2, T, D, L.Win, M, L.bin);
    pre = hp(`${b}.mlp.hook_pre`, pre, [1, T, M]);
    let post: Float64Array = new Float64Array(T * M);
    if (L.gated) {
      const up = matmul(x2, T, D, L.Wup!, M, L.bup);
      for (let k2 = 0; k2 < T * M; k2++) post[k2] = A.act(pre[k2]) * up[k2];
    } else {
      for (let k2 = 0; k2 < T * M; k2++) post[k2] = A.act(pre[k2]);
    }
    post = hp(`${b}.mlp.hook_post`, post, [1, T, M]);
    let mlpOut: Float64Array = matmul(post, T, M, L.Wout, D, L.bout);
    if (L.postMlp) mlpOut = normalize(mlpOut, T, D, L.postMlp);
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
    names.push(
      `${b}.hook_resid_pre`,
      `${b}.ln1.hook_scale`,
      `${b}.attn.hook_q`,
      `${b}.attn.hook_k`,
      `${b}.attn.hook_v`,
      `${b}.attn.hook_attn_scores`,
      `${b}.attn.hook_pattern`,
      `${b}.attn.hook_z`,
      `${b}.attn.hook_result`,
      `${b}.hook_attn_out`,
    );
    if (!A.parallel) names.push(`${b}.hook_resid_mid`);
    names.push(
      `${b}.ln2.hook_scale`,
      `${b}.mlp.hook_pre`,
      `${b}.mlp.hook_post`,
      `${b}.hook_mlp_out`,
      `${b}.hook_resid_post`,
    );
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
