// Gemma 4's text decoder (transformers' modeling_gemma4.py: Gemma4TextModel, Gemma4TextAttention,
// Gemma4TextDecoderLayer, Gemma4TextRotaryEmbedding and modeling_rope_utils'
// _compute_proportional_rope_parameters; with enable_moe_block Gemma4TextRouter and
// Gemma4TextExperts beside the dense MLP) in float64: random-weight checkpoints in the exact HF
// layout (Gemma4ForCausalLM, or Gemma4ForConditionalGeneration with text_config and the decoder
// under model.language_model.) and a forward written from the HF equations, per layer and per head
// in plain loops. Imports nothing from src/.

import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { encodeSafetensors, roundToDtype, type StDtype } from './safetensors-io';
import { makeTokenizer, type GeneratedTokenizer, writeTokenizerFiles } from './tokenizer-gen';
import { mulberry32, gaussian } from './random-models';

export interface Gemma4Options {
  seed?: number;
  dModel?: number;
  nLayers?: number;
  /** written as config.layer_types; absent: HF's default (five sliding layers to one full, the last full) */
  layerTypes?: ('sliding_attention' | 'full_attention')[];
  nHeads?: number;
  nKvHeads?: number;
  headDim?: number;
  globalHeadDim?: number;
  /** attention_k_eq_v with num_global_key_value_heads */
  kEqV?: boolean;
  globalKvHeads?: number;
  /** num_kv_shared_layers */
  kvShared?: number;
  doubleWide?: boolean;
  /** hidden_size_per_layer_input (0: no per-layer inputs) */
  perLayer?: number;
  dMlp?: number;
  vocabSize?: number;
  window?: number;
  partialRotary?: number;
  softcap?: number | null;
  /** store layer_scalar (random, near 1); false leaves it out (HF then uses ones) */
  layerScalar?: boolean;
  tied?: boolean;
  multimodal?: boolean;
  dtype?: 'F32' | 'BF16';
  maxPositions?: number;
  /** enable_moe_block: num_experts, top_k_experts, moe_intermediate_size */
  moe?: { experts: number; topK: number; width: number };
}

export interface Gemma4Model {
  dir: string;
  config: Record<string, any>;
  /** the decoder's config with HF's defaults and its layer types filled in */
  text: Record<string, any>;
  prefix: string;
  dtype: StDtype;
  tensors: Record<string, { dims: number[]; data: Float32Array }>;
  tokenizer: GeneratedTokenizer;
  bosId: number;
  eosId: number;
  cleanup(): void;
}

/**
 * What the reference can leave out or get wrong, one at a time, to show each matters:
 * per_layer_input (no PLE block), layer_scalar (outputs not scaled), kv_sharing (a sharing layer
 * computes keys and values from its own input with its source layer's weights), k_eq_v (v taken
 * as the final keys, after k_norm and rotary), v_norm (v unnormalised), proportional_rope (the full
 * layers rotate their first p·G dims with θ^(−2i/(p·G)), the usual partial rotary), qk_norm, sliding_window
 * (every layer global), final_softcap, norm_offset (norms times 1 + w, as Gemma 3), attention_scale
 * (scores / √Dh instead of unscaled)
 */
export type Gemma4Feature =
  | 'per_layer_input'
  | 'layer_scalar'
  | 'kv_sharing'
  | 'k_eq_v'
  | 'v_norm'
  | 'proportional_rope'
  | 'qk_norm'
  | 'sliding_window'
  | 'final_softcap'
  | 'norm_offset'
  | 'attention_scale';

export const GEMMA4_FEATURES: Gemma4Feature[] = [
  'per_layer_input',
  'layer_scalar',
  'kv_sharing',
  'k_eq_v',
  'v_norm',
  'proportional_rope',
  'qk_norm',
  'sliding_window',
  'final_softcap',
  'norm_offset',
  'attention_scale',
];

/**
 * What the reference can leave out of the MoE block, one at a time: router_scale (the router reads
 * its norm without router.scale and D^−½), per_expert_scale, topk_renorm (the chosen probabilities
 * not renormalised; a factor per token that post_feedforward_layernorm_2 divides out, so only the
 * routing hooks show it), expert_norm (the experts read the dense MLP's input, pre_feedforward_layernorm
 * of resid_mid, not pre_feedforward_layernorm_2's), branch_norms (no post_feedforward_layernorm_1
 * or _2 on the two branches)
 */
export type Gemma4MoeFeature = 'router_scale' | 'per_expert_scale' | 'topk_renorm' | 'expert_norm' | 'branch_norms';

/** the features whose absence the logits show */
export const GEMMA4_MOE_FEATURES: Gemma4MoeFeature[] = [
  'router_scale',
  'per_expert_scale',
  'expert_norm',
  'branch_norms',
];

export function makeGemma4Model(o: Gemma4Options = {}): Gemma4Model {
  const rand = mulberry32(o.seed ?? 4);
  const randn = gaussian(rand);
  const dtype: StDtype = o.dtype ?? 'F32';
  const D = o.dModel ?? 32;
  const L = o.nLayers ?? 6;
  const H = o.nHeads ?? 4;
  const Hkv = o.nKvHeads ?? 2;
  const Dh = o.headDim ?? 8;
  const G = o.globalHeadDim ?? 16;
  const HkvG = o.kEqV ? (o.globalKvHeads ?? 1) : Hkv;
  const M = o.dMlp ?? 48;
  const V = o.vocabSize ?? 96;
  const P = o.perLayer ?? 8;
  const nShared = o.kvShared ?? 0;
  const Pos = o.maxPositions ?? 128;
  const tied = o.tied ?? true;
  const types = (
    o.layerTypes ?? Array.from({ length: L }, (_, l) => ((l + 1) % 6 !== 0 ? 'sliding_attention' : 'full_attention'))
  ).slice();
  types[L - 1] = 'full_attention';
  const first = L - nShared;
  const pre = o.multimodal ? 'model.language_model.' : 'model.';

  const tensors: Gemma4Model['tensors'] = {};
  const put = (name: string, dims: number[], gen: () => number) => {
    const n = dims.reduce((a, b) => a * b, 1);
    const raw = new Float64Array(n);
    for (let i = 0; i < n; i++) raw[i] = gen();
    tensors[name] = { dims, data: roundToDtype(raw, dtype) as Float32Array };
  };
  const normal =
    (std: number, mean = 0) =>
    () =>
      mean + std * randn();
  const W = (name: string, dims: number[]) => put(name, dims, normal(1 / Math.sqrt(dims[1])));
  // Gemma4RMSNorm multiplies by w itself (initialised to ones)
  const normW = (name: string, n: number) => put(name, [n], normal(0.2, 1));

  if (o.multimodal) {
    put('model.vision_tower.patch_embedder.input_proj.weight', [D, 12], normal(0.1));
    put('model.embed_vision.embedding_projection.weight', [D, D], normal(0.1));
  }
  put(`${pre}embed_tokens.weight`, [V, D], normal(0.5));
  if (P) {
    put(`${pre}embed_tokens_per_layer.weight`, [V, L * P], normal(0.5));
    W(`${pre}per_layer_model_projection.weight`, [L * P, D]);
    normW(`${pre}per_layer_projection_norm.weight`, P);
  }
  for (let l = 0; l < L; l++) {
    const p = `${pre}layers.${l}`;
    const a = `${p}.self_attn`;
    const full = types[l] === 'full_attention';
    const d = full ? G : Dh;
    const hkv = full ? HkvG : Hkv;
    const shared = nShared > 0 && l >= first;
    normW(`${p}.input_layernorm.weight`, D);
    W(`${a}.q_proj.weight`, [H * d, D]);
    normW(`${a}.q_norm.weight`, d);
    if (!shared) {
      W(`${a}.k_proj.weight`, [hkv * d, D]);
      if (!(o.kEqV && full)) W(`${a}.v_proj.weight`, [hkv * d, D]);
      normW(`${a}.k_norm.weight`, d);
    }
    W(`${a}.o_proj.weight`, [D, H * d]);
    normW(`${p}.post_attention_layernorm.weight`, D);
    normW(`${p}.pre_feedforward_layernorm.weight`, D);
    const m = o.doubleWide && shared ? 2 * M : M;
    W(`${p}.mlp.gate_proj.weight`, [m, D]);
    W(`${p}.mlp.up_proj.weight`, [m, D]);
    W(`${p}.mlp.down_proj.weight`, [D, m]);
    normW(`${p}.post_feedforward_layernorm.weight`, D);
    if (o.moe) {
      const { experts: E, width: Me } = o.moe;
      W(`${p}.router.proj.weight`, [E, D]);
      normW(`${p}.router.scale`, D);
      put(`${p}.router.per_expert_scale`, [E], normal(0.3, 1));
      // stacked: gate_up_proj [E, 2M, D] (gate rows, then up), down_proj [E, D, M]
      put(`${p}.experts.gate_up_proj`, [E, 2 * Me, D], normal(1 / Math.sqrt(D)));
      put(`${p}.experts.down_proj`, [E, D, Me], normal(1 / Math.sqrt(Me)));
      normW(`${p}.pre_feedforward_layernorm_2.weight`, D);
      normW(`${p}.post_feedforward_layernorm_1.weight`, D);
      normW(`${p}.post_feedforward_layernorm_2.weight`, D);
    }
    if (P) {
      W(`${p}.per_layer_input_gate.weight`, [P, D]);
      W(`${p}.per_layer_projection.weight`, [D, P]);
      normW(`${p}.post_per_layer_input_norm.weight`, D);
    }
    if (o.layerScalar ?? true) put(`${p}.layer_scalar`, [1], () => 0.6 + 0.8 * rand());
  }
  normW(`${pre}norm.weight`, D);
  if (!tied) put('lm_head.weight', [V, D], normal(2.5 / Math.sqrt(D)));

  const tok = makeTokenizer(
    {
      kind: 'char',
      specials: ['<pad>', '<eos>', '<bos>', '<unk>'],
      bos: '<bos>',
      eos: '<eos>',
      unk: '<unk>',
      pad: '<pad>',
      addBos: true,
      tokenizerClass: 'GemmaTokenizer',
      modelMaxLength: Pos,
    },
    V,
  );
  const bosId = tok.specialIds['<bos>'];
  const eosId = tok.specialIds['<eos>'];
  const text: Record<string, any> = {
    model_type: 'gemma4_text',
    vocab_size: V,
    hidden_size: D,
    intermediate_size: M,
    num_hidden_layers: L,
    num_attention_heads: H,
    num_key_value_heads: Hkv,
    head_dim: Dh,
    global_head_dim: G,
    num_global_key_value_heads: o.kEqV ? HkvG : null,
    attention_k_eq_v: !!o.kEqV,
    num_kv_shared_layers: nShared,
    use_double_wide_mlp: !!o.doubleWide,
    hidden_size_per_layer_input: P,
    vocab_size_per_layer_input: V,
    hidden_activation: 'gelu_pytorch_tanh',
    max_position_embeddings: Pos,
    rms_norm_eps: 1e-6,
    sliding_window: o.window ?? 4,
    final_logit_softcapping: o.softcap === undefined ? 30 : o.softcap,
    rope_parameters: {
      sliding_attention: { rope_type: 'default', rope_theta: 10_000 },
      full_attention: {
        rope_type: 'proportional',
        partial_rotary_factor: o.partialRotary ?? 0.25,
        rope_theta: 1_000_000,
      },
    },
    enable_moe_block: !!o.moe,
    ...(o.moe ? { num_experts: o.moe.experts, top_k_experts: o.moe.topK, moe_intermediate_size: o.moe.width } : {}),
    tie_word_embeddings: tied,
    pad_token_id: tok.specialIds['<pad>'],
    bos_token_id: bosId,
    eos_token_id: eosId,
  };
  if (o.layerTypes) text.layer_types = o.layerTypes;
  const config: Record<string, any> = o.multimodal
    ? {
        architectures: ['Gemma4ForConditionalGeneration'],
        model_type: 'gemma4',
        text_config: text,
        vision_config: { model_type: 'gemma4_vision', hidden_size: D },
        audio_config: null,
        image_token_id: V - 1,
        tie_word_embeddings: tied,
      }
    : { architectures: ['Gemma4ForCausalLM'], ...text };
  config.torch_dtype = dtype === 'F32' ? 'float32' : 'bfloat16';
  config.transformers_version = '5.5.0';

  const dir = mkdtempSync(join(tmpdir(), 'loupe-ref-gemma4-'));
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config, null, 2));
  writeFileSync(join(dir, 'model.safetensors'), encodeSafetensors(tensors, dtype));
  writeTokenizerFiles(dir, tok);
  return {
    dir,
    config,
    text: { ...text, layer_types: types },
    prefix: pre,
    dtype,
    tensors,
    tokenizer: tok,
    bosId,
    eosId,
    cleanup: () => rmSync(dir, { recursive: true, force: true }),
  };
}

export interface Hook64 {
  dims: number[];
  data: Float64Array;
}

/** Called for every hook in forward order; a returned array replaces the value downstream. */
export type Hook64Fn = (name: string, value: Float64Array, dims: number[]) => Float64Array | void;
type F64 = Float64Array<ArrayBufferLike>;

/** logits [1, T, V] and every hook [1, T, …] of the tokens, in float64 */
export function gemma4Forward(
  m: Gemma4Model,
  tokens: number[],
  opts: { drop?: (Gemma4Feature | Gemma4MoeFeature)[]; hook?: Hook64Fn } = {},
): { logits: Hook64; hooks: Record<string, Hook64> } {
  const c = m.text;
  const drop = new Set<string>(opts.drop ?? []);
  const T = tokens.length;
  const D = c.hidden_size,
    L = c.num_hidden_layers,
    H = c.num_attention_heads,
    V = c.vocab_size,
    P = c.hidden_size_per_layer_input,
    eps = c.rms_norm_eps;
  const types: string[] = c.layer_types;
  const first = L - c.num_kv_shared_layers;
  const pre = m.prefix;
  const w = (name: string) => Float64Array.from(m.tensors[name].data);
  const has = (name: string) => name in m.tensors;
  const hooks: Record<string, Hook64> = {};
  const hook = (name: string, v: F64, dims: number[]): F64 => {
    const r = opts.hook?.(name, v, dims);
    const out = r ?? v;
    hooks[name] = { dims, data: Float64Array.from(out) };
    return out;
  };
  /** y [n, out] = x [n, in] · Wᵀ, W [out, in] */
  const lin = (x: F64, Wt: F64, n: number, inp: number, out: number) => {
    const y = new Float64Array(n * out);
    for (let i = 0; i < n; i++)
      for (let o = 0; o < out; o++) {
        let s = 0;
        for (let k = 0; k < inp; k++) s += x[i * inp + k] * Wt[o * inp + k];
        y[i * out + o] = s;
      }
    return y;
  };
  const geluTanh = (x: number) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)));
  const off = drop.has('norm_offset') ? 1 : 0;
  /** Gemma4RMSNorm over rows of width d: x · (mean x² + eps)^−½ · w (no w: with_scale=False) */
  const rms = (x: F64, wt: F64 | null, d: number) => {
    const n = x.length / d;
    const y = new Float64Array(x.length);
    const scale = new Float64Array(n);
    for (let i = 0; i < n; i++) {
      let s = 0;
      for (let k = 0; k < d; k++) s += x[i * d + k] ** 2;
      scale[i] = Math.sqrt(s / d + eps);
      for (let k = 0; k < d; k++) y[i * d + k] = (x[i * d + k] / scale[i]) * (wt ? off + wt[k] : 1);
    }
    return { y, scale };
  };
  /** a D-wide norm whose scale is a hook */
  const scaledNorm = (x: F64, wname: string, scaleHook: string) => {
    const s = hook(scaleHook, rms(x, null, D).scale, [1, T, 1]);
    const wt = w(wname);
    const y = new Float64Array(x.length);
    for (let t = 0; t < T; t++) for (let k = 0; k < D; k++) y[t * D + k] = (x[t * D + k] / s[t]) * (off + wt[k]);
    return y;
  };
  /** the dtype's value of a float32 scalar (`embed_scale.to(weight.dtype)`) */
  const inDtype = (v: number) => roundToDtype([Math.fround(v)], m.dtype)[0];
  /**
   * rotate_half rotary over a head of width d: dims i and i + d/2 turn by t · f_i. Sliding layers:
   * f_i = θ^(−2i/d) for every i < d/2; full layers (proportional): f_i = θ^(−2i/d) for i < ⌊p·d/2⌋, else 0
   */
  const rope = (x0: F64, heads: number, d: number, full: boolean) => {
    const y = Float64Array.from(x0);
    const rp = c.rope_parameters[full ? 'full_attention' : 'sliding_attention'];
    const th = rp.rope_theta;
    const usual = full && drop.has('proportional_rope');
    const rd = usual ? Math.floor(rp.partial_rotary_factor * d) : d; // the usual partial rotary: first rd dims
    const angles = full && !usual ? Math.floor((rp.partial_rotary_factor * d) / 2) : rd / 2;
    for (let t = 0; t < T; t++)
      for (let hh = 0; hh < heads; hh++) {
        const o = (t * heads + hh) * d;
        for (let i = 0; i < rd / 2; i++) {
          const f = i < angles ? th ** ((-2 * i) / rd) : 0;
          const [x1, x2] = [x0[o + i], x0[o + i + rd / 2]];
          y[o + i] = x1 * Math.cos(t * f) - x2 * Math.sin(t * f);
          y[o + i + rd / 2] = x2 * Math.cos(t * f) + x1 * Math.sin(t * f);
        }
      }
    return y;
  };

  /**
   * Gemma4TextDecoderLayer's enable_moe_block branch: post_feedforward_layernorm_1(dense) +
   * post_feedforward_layernorm_2(Σ_chosen weight · expert(pre_feedforward_layernorm_2(mid))), the
   * router (Gemma4TextRouter) on mid: RMSNorm without a weight, · router.scale · D^−½, proj, softmax
   * over all experts, the top k, renormalised, each · per_expert_scale; expert e: down(gelu(gate) ⊙ up)
   * from the stacked gate_up_proj [E, 2M, D] (rows [0, M) gate, [M, 2M) up) and down_proj [E, D, M]
   */
  const moeBlock = (l: number, dense: F64, mid: F64, denseIn: F64): F64 => {
    const p = `${pre}layers.${l}`;
    const b = `blocks.${l}`;
    const { num_experts: NE, top_k_experts: K, moe_intermediate_size: Me } = c;
    const branchNorms = !drop.has('branch_norms');
    const d1 = branchNorms
      ? scaledNorm(dense, `${p}.post_feedforward_layernorm_1.weight`, `${b}.ln2_post_dense.hook_scale`)
      : dense;
    const xe0 = scaledNorm(mid, `${p}.pre_feedforward_layernorm_2.weight`, `${b}.ln2_experts.hook_scale`);
    const xe = drop.has('expert_norm') ? denseIn : xe0;
    const rs = w(`${p}.router.scale`);
    const xr = rms(mid, null, D).y.map((v, i) => (drop.has('router_scale') ? v : v * rs[i % D] * D ** -0.5));
    const logits = hook(`${b}.mlp.hook_router_logits`, lin(xr, w(`${p}.router.proj.weight`), T, D, NE), [1, T, NE]);
    const pes = w(`${p}.router.per_expert_scale`);
    const dense0 = new Float64Array(T * NE);
    const idx: number[][] = [];
    for (let t = 0; t < T; t++) {
      const row = logits.subarray(t * NE, (t + 1) * NE);
      const mx = Math.max(...row);
      const ex = Array.from(row, (v) => Math.exp(v - mx));
      const z = ex.reduce((a, v) => a + v, 0);
      const probs = ex.map((v) => v / z);
      const order = probs.map((_, e) => e).sort((a, bb) => probs[bb] - probs[a] || a - bb);
      const top = order.slice(0, K);
      const sum = top.reduce((a, e) => a + probs[e], 0);
      for (const e of top)
        dense0[t * NE + e] =
          (drop.has('topk_renorm') ? probs[e] : probs[e] / sum) * (drop.has('per_expert_scale') ? 1 : pes[e]);
      idx.push(top);
    }
    const wts = hook(`${b}.mlp.hook_router_weights`, dense0, [1, T, NE]);
    hook(
      `${b}.mlp.hook_expert_weights`,
      Float64Array.from({ length: T * K }, (_, i) => wts[Math.floor(i / K) * NE + idx[Math.floor(i / K)][i % K]]),
      [1, T, K],
    );
    hook(`${b}.mlp.hook_expert_indices`, Float64Array.from(idx.flat()), [1, T, K]);
    const gu = m.tensors[`${p}.experts.gate_up_proj`].data;
    const dp = m.tensors[`${p}.experts.down_proj`].data;
    const sum = new Float64Array(T * D);
    for (let e = 0; e < NE; e++) {
      const Wg = Float64Array.from(gu.subarray(e * 2 * Me * D, (e * 2 + 1) * Me * D));
      const Wu = Float64Array.from(gu.subarray((e * 2 + 1) * Me * D, (e + 1) * 2 * Me * D));
      const Wd = Float64Array.from(dp.subarray(e * D * Me, (e + 1) * D * Me));
      const g = lin(xe, Wg, T, D, Me);
      const u = lin(xe, Wu, T, D, Me);
      const y = lin(
        g.map((v, i) => geluTanh(v) * u[i]),
        Wd,
        T,
        Me,
        D,
      );
      const out = hook(
        `${b}.mlp.experts.${e}.hook_out`,
        y.map((v, i) => v * wts[Math.floor(i / D) * NE + e]),
        [1, T, D],
      );
      for (let i = 0; i < T * D; i++) sum[i] += out[i];
    }
    const d2 = branchNorms
      ? scaledNorm(sum, `${p}.post_feedforward_layernorm_2.weight`, `${b}.ln2_post_experts.hook_scale`)
      : sum;
    return d1.map((v, i) => v + d2[i]);
  };

  let x: F64 = new Float64Array(T * D);
  const E = w(`${pre}embed_tokens.weight`);
  const es = inDtype(Math.sqrt(D));
  for (let t = 0; t < T; t++) for (let k = 0; k < D; k++) x[t * D + k] = E[tokens[t] * D + k] * es;
  x = hook('hook_embed', x, [1, T, D]);

  // per-layer inputs [T, L, P]: (norm(W_proj x · D^−½) + E_pl[token] · √P) · 2^−½
  let pl: F64 = new Float64Array(0);
  if (P) {
    const Epl = w(`${pre}embed_tokens_per_layer.weight`);
    const ps = inDtype(Math.sqrt(P));
    const proj = lin(x, w(`${pre}per_layer_model_projection.weight`), T, D, L * P).map((v) => v * D ** -0.5);
    const normed = rms(proj, w(`${pre}per_layer_projection_norm.weight`), P).y;
    pl = new Float64Array(T * L * P);
    for (let t = 0; t < T; t++)
      for (let i = 0; i < L * P; i++)
        pl[t * L * P + i] = (normed[t * L * P + i] + Epl[tokens[t] * L * P + i] * ps) * 2 ** -0.5;
  }

  // each layer's keys and values [T, hkv, d] (after norm and rotary), for the layers that share them
  const kvStore = new Map<number, { k: F64; v: F64 }>();
  for (let l = 0; l < L; l++) {
    const p = `${pre}layers.${l}`;
    const a = `${p}.self_attn`;
    const b = `blocks.${l}`;
    const full = types[l] === 'full_attention';
    const d = full ? c.global_head_dim : c.head_dim;
    const hkv = full && c.attention_k_eq_v ? c.num_global_key_value_heads : c.num_key_value_heads;
    const shared = c.num_kv_shared_layers > 0 && l >= first;
    const src = shared ? types.slice(0, first).lastIndexOf(types[l]) : l;
    x = hook(`${b}.hook_resid_pre`, x, [1, T, D]);
    const h = scaledNorm(x, `${p}.input_layernorm.weight`, `${b}.ln1.hook_scale`);
    const q0 = lin(h, w(`${a}.q_proj.weight`), T, D, H * d);
    const qn = drop.has('qk_norm') ? q0 : rms(q0, w(`${a}.q_norm.weight`), d).y;
    const q = hook(`${b}.attn.hook_q`, rope(qn, H, d, full), [1, T, H, d]);
    let k: F64, v: F64;
    const ownKv = (wa: string): { k: F64; v: F64 } => {
      const kp = lin(h, w(`${wa}.k_proj.weight`), T, D, hkv * d);
      const kr = rope(drop.has('qk_norm') ? kp : rms(kp, w(`${wa}.k_norm.weight`), d).y, hkv, d, full);
      // attention_k_eq_v: v is the key projection, before k_norm and rotary
      const vp = has(`${wa}.v_proj.weight`) ? lin(h, w(`${wa}.v_proj.weight`), T, D, hkv * d) : kp;
      const vv = drop.has('k_eq_v') && !has(`${wa}.v_proj.weight`) ? kr : vp;
      return { k: kr, v: drop.has('v_norm') ? vv : rms(vv, null, d).y };
    };
    if (shared && !drop.has('kv_sharing')) ({ k, v } = kvStore.get(src)!);
    else {
      const own = ownKv(`${pre}layers.${src}.self_attn`);
      k = own.k;
      v = own.v;
      if (!shared) {
        k = hook(`${b}.attn.hook_k`, k, [1, T, hkv, d]);
        v = hook(`${b}.attn.hook_v`, v, [1, T, hkv, d]);
        kvStore.set(l, { k, v });
      }
    }
    const window = full || drop.has('sliding_window') ? Infinity : c.sliding_window;
    const scale = drop.has('attention_scale') ? 1 / Math.sqrt(d) : 1;
    const rep = H / hkv;
    const scores0 = new Float64Array(H * T * T);
    for (let hh = 0; hh < H; hh++)
      for (let i = 0; i < T; i++)
        for (let j = 0; j < T; j++) {
          if (j > i || i - j >= window) {
            scores0[(hh * T + i) * T + j] = -Infinity;
            continue;
          }
          let s = 0;
          const kh = Math.floor(hh / rep);
          for (let e = 0; e < d; e++) s += q[(i * H + hh) * d + e] * k[(j * hkv + kh) * d + e];
          scores0[(hh * T + i) * T + j] = s * scale;
        }
    const scores = hook(`${b}.attn.hook_attn_scores`, scores0, [1, H, T, T]);
    const pat0 = new Float64Array(H * T * T);
    for (let r = 0; r < H * T; r++) {
      let mx = -Infinity;
      for (let j = 0; j < T; j++) mx = Math.max(mx, scores[r * T + j]);
      let s = 0;
      for (let j = 0; j < T; j++) s += Math.exp(scores[r * T + j] - mx);
      for (let j = 0; j < T; j++) pat0[r * T + j] = Math.exp(scores[r * T + j] - mx) / s;
    }
    const pat = hook(`${b}.attn.hook_pattern`, pat0, [1, H, T, T]);
    const z0 = new Float64Array(T * H * d);
    for (let hh = 0; hh < H; hh++)
      for (let i = 0; i < T; i++)
        for (let e = 0; e < d; e++) {
          let s = 0;
          for (let j = 0; j < T; j++) s += pat[(hh * T + i) * T + j] * v[(j * hkv + Math.floor(hh / rep)) * d + e];
          z0[(i * H + hh) * d + e] = s;
        }
    const z = hook(`${b}.attn.hook_z`, z0, [1, T, H, d]);
    const o = lin(z, w(`${a}.o_proj.weight`), T, H * d, D);
    const attnOut = hook(
      `${b}.hook_attn_out`,
      scaledNorm(o, `${p}.post_attention_layernorm.weight`, `${b}.ln1_post.hook_scale`),
      [1, T, D],
    );
    let mid: F64 = x.map((xv, i) => xv + attnOut[i]);
    mid = hook(`${b}.hook_resid_mid`, mid, [1, T, D]);
    const h2 = scaledNorm(mid, `${p}.pre_feedforward_layernorm.weight`, `${b}.ln2.hook_scale`);
    const M = m.tensors[`${p}.mlp.gate_proj.weight`].dims[0];
    const gp = hook(`${b}.mlp.hook_pre`, lin(h2, w(`${p}.mlp.gate_proj.weight`), T, D, M), [1, T, M]);
    const up = hook(`${b}.mlp.hook_pre_linear`, lin(h2, w(`${p}.mlp.up_proj.weight`), T, D, M), [1, T, M]);
    const post = hook(
      `${b}.mlp.hook_post`,
      gp.map((g, i) => geluTanh(g) * up[i]),
      [1, T, M],
    );
    let down: F64 = lin(post, w(`${p}.mlp.down_proj.weight`), T, M, D);
    if (c.enable_moe_block) down = moeBlock(l, down, mid, h2);
    const mlpOut = hook(
      `${b}.hook_mlp_out`,
      scaledNorm(down, `${p}.post_feedforward_layernorm.weight`, `${b}.ln2_post.hook_scale`),
      [1, T, D],
    );
    let out: F64 = mid.map((mv, i) => mv + mlpOut[i]);
    if (P) {
      const pin0 = new Float64Array(T * P);
      for (let t = 0; t < T; t++) for (let i = 0; i < P; i++) pin0[t * P + i] = pl[(t * L + l) * P + i];
      const pin = hook(`${b}.hook_per_layer_input`, pin0, [1, T, P]);
      const gpre = hook(`${b}.per_layer.hook_pre`, lin(out, w(`${p}.per_layer_input_gate.weight`), T, D, P), [1, T, P]);
      const gpost = hook(
        `${b}.per_layer.hook_post`,
        gpre.map((g, i) => geluTanh(g) * pin[i]),
        [1, T, P],
      );
      const proj = lin(gpost, w(`${p}.per_layer_projection.weight`), T, P, D);
      const pout = hook(
        `${b}.hook_per_layer_out`,
        scaledNorm(proj, `${p}.post_per_layer_input_norm.weight`, `${b}.ln_per_layer.hook_scale`),
        [1, T, D],
      );
      if (!drop.has('per_layer_input')) out = out.map((ov, i) => ov + pout[i]);
    }
    const ls = has(`${p}.layer_scalar`) && !drop.has('layer_scalar') ? m.tensors[`${p}.layer_scalar`].data[0] : 1;
    x = hook(
      `${b}.hook_resid_post`,
      out.map((ov) => ov * ls),
      [1, T, D],
    );
  }
  const xf = scaledNorm(x, `${pre}norm.weight`, 'ln_final.hook_scale');
  const U = c.tie_word_embeddings ? E : w('lm_head.weight');
  let logits = lin(xf, U, T, D, V);
  const cap = c.final_logit_softcapping;
  if (typeof cap === 'number' && !drop.has('final_softcap')) logits = logits.map((z) => cap * Math.tanh(z / cap));
  return { logits: { dims: [1, T, V], data: logits }, hooks };
}

/** greedy continuation by full float64 forwards (no cache) */
export function gemma4Greedy(m: Gemma4Model, tokens: number[], n: number): number[] {
  const seq = [...tokens];
  const V = m.text.vocab_size;
  for (let s = 0; s < n; s++) {
    const { logits } = gemma4Forward(m, seq, { hook: undefined });
    const last = logits.data.subarray((seq.length - 1) * V, seq.length * V);
    let best = 0;
    for (let i = 1; i < V; i++) if (last[i] > last[best]) best = i;
    seq.push(best);
  }
  return seq.slice(tokens.length);
}

/**
 * Direct logit attribution of logit `t` (before the soft-cap) at position `pos`, in float64 from the
 * forward's hooks and the checkpoint's weights (raw convention). hook_resid_post_l is
 * (resid_mid_l + mlp_out_l + per_layer_out_l) · layer_scalar_l, so the final stream is
 * resid_pre_0 · G_0 + Σ_l (attn_out_l + mlp_out_l + per_layer_out_l) · G_l, G_l = Π_{k ≥ l} scalar_k;
 * with the final norm's scale s frozen, logit_t = Σ_d stream[d] / s · w_norm[d] · U[t, d]. Head h's
 * term is z_h · W_O[h] through the post-attention norm (its scale frozen), neuron n's post[n] ·
 * W_down[:, n] through the post-feedforward norm, the per-layer input's its gated projection through
 * its norm; with MoE, the dense MLP and each expert through their branch norm too. `logit` is
 * computed from the last hook_resid_post, not from the terms.
 */
export function gemma4Dla(
  m: Gemma4Model,
  hooks: Record<string, Hook64>,
  pos: number,
  t: number,
): { terms: Map<string, number>; neurons: number[][]; logit: number } {
  const c = m.text;
  const pre = m.prefix;
  const D = c.hidden_size,
    L = c.num_hidden_layers,
    H = c.num_attention_heads;
  const W = (name: string) => Float64Array.from(m.tensors[name].data);
  const at = (name: string) => {
    const h = hooks[name];
    const inner = h.dims.slice(2).reduce((a, b) => a * b, 1);
    return h.data.subarray(pos * inner, (pos + 1) * inner);
  };
  const U = c.tie_word_embeddings ? W(`${pre}embed_tokens.weight`) : W('lm_head.weight');
  const wf = W(`${pre}norm.weight`);
  const sf = at('ln_final.hook_scale')[0];
  const e = Float64Array.from({ length: D }, (_, d) => (wf[d] * U[t * D + d]) / sf);
  const dot = (a: ArrayLike<number>, b: ArrayLike<number>) => {
    let s = 0;
    for (let i = 0; i < D; i++) s += a[i] * b[i];
    return s;
  };
  const G = new Float64Array(L + 1).fill(1);
  for (let l = L - 1; l >= 0; l--) {
    const name = `${pre}layers.${l}.layer_scalar`;
    G[l] = G[l + 1] * (name in m.tensors ? m.tensors[name].data[0] : 1);
  }
  /** the readout of a vector that a norm (weight wn, frozen scale s) maps into the stream at layer l */
  const through = (wn: F64, s: number, l: number) => Float64Array.from(e, (v, d) => (v * wn[d] * G[l]) / s);
  const terms = new Map<string, number>();
  const neurons: number[][] = [];
  terms.set('embed', dot(at('blocks.0.hook_resid_pre'), e) * G[0]);
  for (let l = 0; l < L; l++) {
    const p = `${pre}layers.${l}`;
    const b = `blocks.${l}`;
    // heads: W_O is o_proj.weight [D, H·d]
    const z = at(`${b}.attn.hook_z`);
    const d = z.length / H;
    const Wo = W(`${p}.self_attn.o_proj.weight`);
    const ea = through(W(`${p}.post_attention_layernorm.weight`), at(`${b}.ln1_post.hook_scale`)[0], l);
    for (let h = 0; h < H; h++) {
      let v = 0;
      for (let i = 0; i < D; i++) {
        let o = 0;
        for (let k = 0; k < d; k++) o += z[h * d + k] * Wo[i * H * d + h * d + k];
        v += o * ea[i];
      }
      terms.set(`L${l}H${h}`, v);
    }
    // neurons: W_down is down_proj.weight [D, M]
    const post = at(`${b}.mlp.hook_post`);
    const M = post.length;
    const Wd = W(`${p}.mlp.down_proj.weight`);
    const em0 = through(W(`${p}.post_feedforward_layernorm.weight`), at(`${b}.ln2_post.hook_scale`)[0], l);
    // MoE: the dense MLP through post_feedforward_layernorm_1, expert x's weighted output through _2
    // (each scale frozen) before the layer's post-norm: L{l}.mlp and a term L{l}.E{x} per expert
    const moe = hooks[`${b}.ln2_post_dense.hook_scale`] !== undefined;
    const branch = (norm: string, scale: string) => {
      const wn = W(`${p}.${norm}.weight`);
      const sc = at(`${b}.${scale}.hook_scale`)[0];
      return Float64Array.from(em0, (v, d) => (v * wn[d]) / sc);
    };
    const em = moe ? branch('post_feedforward_layernorm_1', 'ln2_post_dense') : em0;
    if (moe) {
      const ee = branch('post_feedforward_layernorm_2', 'ln2_post_experts');
      for (let x = 0; x < c.num_experts; x++) terms.set(`L${l}.E${x}`, dot(at(`${b}.mlp.experts.${x}.hook_out`), ee));
    }
    const row: number[] = [];
    for (let n = 0; n < M; n++) {
      let v = 0;
      for (let i = 0; i < D; i++) v += Wd[i * M + n] * em[i];
      row.push(post[n] * v);
    }
    neurons.push(row);
    terms.set(
      `L${l}.mlp`,
      row.reduce((a, v) => a + v, 0),
    );
    // the per-layer input: per_layer_projection.weight [D, P] of the gated input, then its norm
    if (hooks[`${b}.per_layer.hook_post`]) {
      const gp = at(`${b}.per_layer.hook_post`);
      const P = gp.length;
      const Wp = W(`${p}.per_layer_projection.weight`);
      const ep = through(W(`${p}.post_per_layer_input_norm.weight`), at(`${b}.ln_per_layer.hook_scale`)[0], l);
      let v = 0;
      for (let i = 0; i < D; i++) {
        let o = 0;
        for (let j = 0; j < P; j++) o += gp[j] * Wp[i * P + j];
        v += o * ep[i];
      }
      terms.set(`L${l}.per_layer`, v);
    }
  }
  const logit = dot(at(`blocks.${L - 1}.hook_resid_post`), e);
  return { terms, neurons, logit };
}
