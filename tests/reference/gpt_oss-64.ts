// GPT-OSS (transformers' modeling_gpt_oss.py, configuration_gpt_oss.py, modeling_rope_utils.py's
// _compute_yarn_parameters, integrations/mxfp4.py's convert_moe_packed_tensors) in float64:
// random-weight checkpoints in the exact HF layout, with the experts stored dense
// (gate_up_proj [E, D, 2M], down_proj [E, M, D]) or as MXFP4 blocks and scales (the published
// checkpoints' form), and a forward written from the HF equations: attention sinks, sliding and
// full layers, YaRN rotary, the biased router (top-k of the logits, softmax over those), the
// biased experts with their clamped SwiGLU. Imports nothing from src/.

import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { encodeSafetensors, roundToDtype, type StDtype, type WriteEntry } from './safetensors-io';
import { makeTokenizer, type GeneratedTokenizer, writeTokenizerFiles } from './tokenizer-gen';
import { mulberry32, gaussian } from './random-models';

export interface GptOssOptions {
  seed?: number;
  dModel?: number;
  nLayers?: number;
  /** written as config.layer_types; absent: HF's default (even layers slide) */
  layerTypes?: ('sliding_attention' | 'full_attention')[];
  nHeads?: number;
  nKvHeads?: number;
  headDim?: number;
  dMlp?: number;
  nExperts?: number;
  topK?: number;
  vocabSize?: number;
  slidingWindow?: number;
  /** written as rope_scaling with rope_theta (transformers 4.x), or absent (HF's yarn default) */
  rope?: { theta: number; scaling: Record<string, unknown> } | 'default';
  /** experts as MXFP4 blocks + scales (U8) with quantization_config, the rest in `dtype` */
  mxfp4?: boolean;
  dtype?: 'F32' | 'BF16';
  maxPositions?: number;
}

export interface GptOssModel {
  dir: string;
  config: Record<string, any>;
  /** the resolved config the reference runs (layer_types, rope filled in as HF's __post_init__ does) */
  c: Record<string, any>;
  /** every tensor as the reference reads it; the experts as HF holds them after loading (dense [E, D, 2M], [E, M, D]) */
  tensors: Record<string, { dims: number[]; data: Float64Array }>;
  tokenizer: GeneratedTokenizer;
  bosId: number;
  cleanup(): void;
}

/**
 * What the reference can leave out (the sensitivity check): sinks (no sink column), sliding_window
 * (every layer global), yarn (plain rotary of rope_theta, no attention factor), clamp (the SwiGLU
 * unclamped), router_bias, expert_bias (gate_up and down biases), gate_up_interleave (gate the
 * first half of gate_up_proj's columns, up the second, instead of even / odd)
 */
export type GptOssFeature =
  'sinks' | 'sliding_window' | 'yarn' | 'clamp' | 'router_bias' | 'expert_bias' | 'gate_up_interleave';

export const GPT_OSS_FEATURES: GptOssFeature[] = [
  'sinks',
  'sliding_window',
  'yarn',
  'clamp',
  'router_bias',
  'expert_bias',
  'gate_up_interleave',
];

const FP4 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6];

/**
 * convert_moe_packed_tensors: blocks [E, R, G, 16], scales [E, R, G] → [E, G·32, R] (the values at
 * [e, r, 32g + 2j] and [.., 32g + 2j + 1] are the low and high nibbles of byte j, times
 * 2^(scale − 127); then transpose(1, 2))
 */
export function dequantMxfp4(blocks: ArrayLike<number>, scales: ArrayLike<number>, E: number, R: number, G: number) {
  const I = G * 32;
  const out = new Float64Array(E * I * R);
  for (let e = 0; e < E; e++)
    for (let r = 0; r < R; r++)
      for (let g = 0; g < G; g++) {
        const s = Math.pow(2, scales[(e * R + r) * G + g] - 127);
        for (let j = 0; j < 16; j++) {
          const byte = blocks[((e * R + r) * G + g) * 16 + j];
          out[(e * I + g * 32 + 2 * j) * R + r] = FP4[byte & 15] * s;
          out[(e * I + g * 32 + 2 * j + 1) * R + r] = FP4[byte >> 4] * s;
        }
      }
  return out;
}

export function makeGptOssModel(o: GptOssOptions = {}): GptOssModel {
  const rand = mulberry32(o.seed ?? 20);
  const randn = gaussian(rand);
  const dtype: StDtype = o.dtype ?? 'F32';
  const D = o.dModel ?? 64;
  const L = o.nLayers ?? 4;
  const H = o.nHeads ?? 4;
  const Hkv = o.nKvHeads ?? 2;
  const Dh = o.headDim ?? 16;
  const M = o.dMlp ?? 32;
  const E = o.nExperts ?? 4;
  const k = o.topK ?? 2;
  const V = o.vocabSize ?? 96;
  const P = o.maxPositions ?? 64;
  const window = o.slidingWindow ?? 4;

  const stored: Record<string, WriteEntry> = {};
  const tensors: GptOssModel['tensors'] = {};
  const put = (name: string, dims: number[], gen: () => number) => {
    const n = dims.reduce((a, b) => a * b, 1);
    const raw = new Float64Array(n);
    for (let i = 0; i < n; i++) raw[i] = gen();
    const data = Float64Array.from(roundToDtype(raw, dtype));
    stored[name] = { dims, data };
    tensors[name] = { dims, data };
  };
  const normal =
    (std: number, mean = 0) =>
    () =>
      mean + std * randn();
  const W = (name: string, dims: number[], gain = 1) =>
    put(name, dims, normal(gain / Math.sqrt(dims[dims.length - 1])));

  put('model.embed_tokens.weight', [V, D], normal(1));
  for (let l = 0; l < L; l++) {
    const p = `model.layers.${l}`;
    put(`${p}.input_layernorm.weight`, [D], normal(0.1, 1));
    const a = `${p}.self_attn`;
    W(`${a}.q_proj.weight`, [H * Dh, D], 1.5);
    put(`${a}.q_proj.bias`, [H * Dh], normal(0.2));
    W(`${a}.k_proj.weight`, [Hkv * Dh, D], 1.5);
    put(`${a}.k_proj.bias`, [Hkv * Dh], normal(0.2));
    W(`${a}.v_proj.weight`, [Hkv * Dh, D]);
    put(`${a}.v_proj.bias`, [Hkv * Dh], normal(0.2));
    W(`${a}.o_proj.weight`, [D, H * Dh]);
    put(`${a}.o_proj.bias`, [D], normal(0.2));
    // sinks around 1: a sink takes a share of each row comparable to a key's
    put(`${a}.sinks`, [H], normal(1, 1));
    put(`${p}.post_attention_layernorm.weight`, [D], normal(0.1, 1));
    const b = `${p}.mlp`;
    W(`${b}.router.weight`, [E, D], 2);
    put(`${b}.router.bias`, [E], normal(1));
    const ex = `${b}.experts`;
    // experts large enough that the clamp at ±limit bites on some entries
    const gain = 3.5;
    if (o.mxfp4) {
      // codes uniform over the 16 e2m1 values (rms ≈ 2.9), scales 2^(s − 127) for s in [lo, lo + 2]:
      // gate_up about gain / √D, down smaller (the residual stays small enough for float32's 1e-4)
      const mx = (proj: string, R: number, I: number, lo: number) => {
        const G = I / 32;
        const blocks = Array.from({ length: E * R * G * 16 }, () => Math.floor(rand() * 256));
        const scales = Array.from({ length: E * R * G }, () => lo + Math.floor(rand() * 3));
        stored[`${proj}_blocks`] = { dims: [E, R, G, 16], data: blocks, dtype: 'U8' };
        stored[`${proj}_scales`] = { dims: [E, R, G], data: scales, dtype: 'U8' };
        tensors[proj] = { dims: [E, I, R], data: dequantMxfp4(blocks, scales, E, R, G) };
      };
      mx(`${ex}.gate_up_proj`, 2 * M, D, 123);
      mx(`${ex}.down_proj`, D, M, 120);
    } else {
      put(`${ex}.gate_up_proj`, [E, D, 2 * M], normal(gain / Math.sqrt(D)));
      put(`${ex}.down_proj`, [E, M, D], normal(0.5 / Math.sqrt(M)));
    }
    put(`${ex}.gate_up_proj_bias`, [E, 2 * M], normal(0.5));
    put(`${ex}.down_proj_bias`, [E, D], normal(0.3));
  }
  put('model.norm.weight', [D], normal(0.1, 1));
  put('lm_head.weight', [V, D], normal(2.5 / Math.sqrt(D)));

  const specials = ['<|startoftext|>', '<|endoftext|>', '<|return|>'];
  const tok = makeTokenizer(
    {
      kind: 'char',
      specials,
      bos: '<|startoftext|>',
      eos: '<|return|>',
      pad: '<|endoftext|>',
      addBos: false,
      tokenizerClass: 'PreTrainedTokenizerFast',
      modelMaxLength: P,
    },
    V,
  );
  const bosId = tok.specialIds['<|startoftext|>'];
  const config: Record<string, any> = {
    architectures: ['GptOssForCausalLM'],
    model_type: 'gpt_oss',
    vocab_size: V,
    hidden_size: D,
    intermediate_size: M,
    num_hidden_layers: L,
    num_attention_heads: H,
    num_key_value_heads: Hkv,
    head_dim: Dh,
    num_local_experts: E,
    num_experts_per_tok: k,
    experts_per_token: k,
    sliding_window: window,
    hidden_act: 'silu',
    max_position_embeddings: P,
    rms_norm_eps: 1e-5,
    attention_bias: true,
    swiglu_limit: 7.0,
    tie_word_embeddings: false,
    bos_token_id: bosId,
    eos_token_id: tok.specialIds['<|return|>'],
    pad_token_id: tok.specialIds['<|endoftext|>'],
    torch_dtype: dtype === 'F32' ? 'float32' : 'bfloat16',
    transformers_version: '4.55.0',
  };
  if (o.layerTypes) config.layer_types = o.layerTypes;
  const rope = o.rope ?? {
    theta: 10_000,
    scaling: {
      rope_type: 'yarn',
      factor: 8,
      beta_fast: 32,
      beta_slow: 1,
      truncate: true,
      original_max_position_embeddings: 16,
    },
  };
  if (rope !== 'default') {
    config.rope_theta = rope.theta;
    config.rope_scaling = rope.scaling;
  }
  if (o.mxfp4)
    config.quantization_config = {
      quant_method: 'mxfp4',
      modules_to_not_convert: [
        'model.layers.*.self_attn',
        'model.layers.*.mlp.router',
        'model.embed_tokens',
        'lm_head',
      ],
    };

  // the config the reference runs: HF's __post_init__ defaults
  const c: Record<string, any> = { ...config };
  c.layer_types =
    o.layerTypes ?? Array.from({ length: L }, (_, i) => ((i + 1) % 2 ? 'sliding_attention' : 'full_attention'));
  if (rope === 'default') {
    c.rope_theta = 150_000;
    c.rope_scaling = {
      rope_type: 'yarn',
      factor: 32,
      beta_fast: 32,
      beta_slow: 1,
      truncate: false,
      original_max_position_embeddings: 4096,
    };
  }

  const dir = mkdtempSync(join(tmpdir(), 'loupe-ref-gpt_oss-'));
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config, null, 2));
  writeFileSync(join(dir, 'model.safetensors'), encodeSafetensors(stored, dtype));
  writeTokenizerFiles(dir, tok);
  return {
    dir,
    config,
    c,
    tensors,
    tokenizer: tok,
    bosId,
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

/** _compute_yarn_parameters: inverse frequencies and attention factor for rotary dims `dim` */
export function yarnFrequencies(
  theta: number,
  dim: number,
  rs: Record<string, any>,
): { inv: number[]; factor: number } {
  const factor = rs.factor;
  const attention = rs.attention_factor ?? (factor <= 1 ? 1 : 0.1 * Math.log(factor) + 1);
  const betaFast = rs.beta_fast || 32;
  const betaSlow = rs.beta_slow || 1;
  const orig = rs.original_max_position_embeddings;
  const corrDim = (rot: number) => (dim * Math.log(orig / (rot * 2 * Math.PI))) / (2 * Math.log(theta));
  let low = corrDim(betaFast);
  let high = corrDim(betaSlow);
  if (rs.truncate ?? true) {
    low = Math.floor(low);
    high = Math.ceil(high);
  }
  low = Math.max(low, 0);
  high = Math.min(high, dim - 1);
  if (low === high) high += 0.001;
  const inv: number[] = [];
  for (let i = 0; i < dim / 2; i++) {
    const pos = Math.pow(theta, (2 * i) / dim);
    const ramp = Math.min(1, Math.max(0, (i - low) / (high - low)));
    const extrap = 1 - ramp;
    inv.push((1 / (factor * pos)) * (1 - extrap) + (1 / pos) * extrap);
  }
  return { inv, factor: attention };
}

/** logits [1, T, V] and every hook [1, T, …] of the tokens, in float64 */
export function gptOssForward(
  m: GptOssModel,
  tokens: number[],
  opts: { drop?: GptOssFeature[]; hook?: Hook64Fn } = {},
): { logits: Hook64; hooks: Record<string, Hook64> } {
  const c = m.c;
  const drop = new Set(opts.drop ?? []);
  const T = tokens.length;
  const D = c.hidden_size,
    L = c.num_hidden_layers,
    H = c.num_attention_heads,
    Hkv = c.num_key_value_heads,
    Dh = c.head_dim,
    M = c.intermediate_size,
    E = c.num_local_experts,
    K = c.num_experts_per_tok,
    V = c.vocab_size;
  const eps = c.rms_norm_eps;
  // GptOssExperts: alpha and limit fixed in the module (the config's swiglu_limit is read by the MXFP4 kernels only)
  const limit = 7;
  const alpha = 1.702;
  const w = (name: string) => m.tensors[name].data;
  const hooks: Record<string, Hook64> = {};
  const hook = (name: string, v: F64, dims: number[]): F64 => {
    const r = opts.hook?.(name, v, dims);
    const out = r ?? v;
    hooks[name] = { dims, data: Float64Array.from(out) };
    return out;
  };
  /** y [n, out] = x [n, in] · Wᵀ + b, W [out, in] */
  const lin = (x: F64, Wt: F64, n: number, inp: number, out: number, b?: F64) => {
    const y = new Float64Array(n * out);
    for (let i = 0; i < n; i++)
      for (let o = 0; o < out; o++) {
        let s = b ? b[o] : 0;
        for (let k = 0; k < inp; k++) s += x[i * inp + k] * Wt[o * inp + k];
        y[i * out + o] = s;
      }
    return y;
  };
  const sigmoid = (x: number) => 1 / (1 + Math.exp(-x));
  /** GptOssRMSNorm: x · rsqrt(mean x² + eps) · w, the scale hooked */
  const rmsNorm = (x: F64, wname: string, scaleHook: string) => {
    const s0 = new Float64Array(T);
    for (let t = 0; t < T; t++) {
      let s = 0;
      for (let d = 0; d < D; d++) s += x[t * D + d] ** 2;
      s0[t] = Math.sqrt(s / D + eps);
    }
    const s = hook(scaleHook, s0, [1, T, 1]);
    const wt = w(wname);
    const y = new Float64Array(x.length);
    for (let t = 0; t < T; t++) for (let d = 0; d < D; d++) y[t * D + d] = (x[t * D + d] / s[t]) * wt[d];
    return y;
  };
  // rotary: YaRN's frequencies and attention factor (cos, sin of dim/2 angles; _apply_rotary_emb)
  const { inv, factor: attnFactor } = drop.has('yarn')
    ? { inv: Array.from({ length: Dh / 2 }, (_, i) => Math.pow(c.rope_theta, (-2 * i) / Dh)), factor: 1 }
    : yarnFrequencies(c.rope_theta, Dh, c.rope_scaling);
  const rope = (x0: F64, heads: number) => {
    const y = Float64Array.from(x0);
    for (let t = 0; t < T; t++)
      for (let hh = 0; hh < heads; hh++) {
        const o = (t * heads + hh) * Dh;
        for (let i = 0; i < Dh / 2; i++) {
          const cos = Math.cos(t * inv[i]) * attnFactor;
          const sin = Math.sin(t * inv[i]) * attnFactor;
          const [x1, x2] = [x0[o + i], x0[o + i + Dh / 2]];
          y[o + i] = x1 * cos - x2 * sin;
          y[o + i + Dh / 2] = x2 * cos + x1 * sin;
        }
      }
    return y;
  };

  let x: F64 = new Float64Array(T * D);
  const Emb = w('model.embed_tokens.weight');
  for (let t = 0; t < T; t++) x.set(Emb.subarray(tokens[t] * D, (tokens[t] + 1) * D), t * D);
  x = hook('hook_embed', x, [1, T, D]);

  for (let l = 0; l < L; l++) {
    const p = `model.layers.${l}`;
    const b = `blocks.${l}`;
    x = hook(`${b}.hook_resid_pre`, x, [1, T, D]);
    const h = rmsNorm(x, `${p}.input_layernorm.weight`, `${b}.ln1.hook_scale`);
    const a = `${p}.self_attn`;
    const q = hook(`${b}.attn.hook_q`, rope(lin(h, w(`${a}.q_proj.weight`), T, D, H * Dh, w(`${a}.q_proj.bias`)), H), [
      1,
      T,
      H,
      Dh,
    ]);
    const k = hook(
      `${b}.attn.hook_k`,
      rope(lin(h, w(`${a}.k_proj.weight`), T, D, Hkv * Dh, w(`${a}.k_proj.bias`)), Hkv),
      [1, T, Hkv, Dh],
    );
    const v = hook(`${b}.attn.hook_v`, lin(h, w(`${a}.v_proj.weight`), T, D, Hkv * Dh, w(`${a}.v_proj.bias`)), [
      1,
      T,
      Hkv,
      Dh,
    ]);
    const sliding = c.layer_types[l] === 'sliding_attention' && !drop.has('sliding_window');
    const rep = H / Hkv;
    const scores0 = new Float64Array(H * T * T);
    for (let hh = 0; hh < H; hh++)
      for (let i = 0; i < T; i++)
        for (let j = 0; j < T; j++) {
          // causal; a sliding layer sees keys j > i − sliding_window
          if (j > i || (sliding && j <= i - c.sliding_window)) {
            scores0[(hh * T + i) * T + j] = -Infinity;
            continue;
          }
          let s = 0;
          const kh = Math.floor(hh / rep);
          for (let d = 0; d < Dh; d++) s += q[(i * H + hh) * Dh + d] * k[(j * Hkv + kh) * Dh + d];
          scores0[(hh * T + i) * T + j] = s * Dh ** -0.5;
        }
    const scores = hook(`${b}.attn.hook_attn_scores`, scores0, [1, H, T, T]);
    // the sink: one more logit per row, in the softmax, dropped after it
    const sinks = w(`${a}.sinks`);
    const pat0 = new Float64Array(H * T * T);
    for (let hh = 0; hh < H; hh++)
      for (let i = 0; i < T; i++) {
        const r = hh * T + i;
        const sink = drop.has('sinks') ? -Infinity : sinks[hh];
        let mx = sink;
        for (let j = 0; j < T; j++) mx = Math.max(mx, scores[r * T + j]);
        let s = Math.exp(sink - mx);
        for (let j = 0; j < T; j++) s += Math.exp(scores[r * T + j] - mx);
        for (let j = 0; j < T; j++) pat0[r * T + j] = Math.exp(scores[r * T + j] - mx) / s;
      }
    const pat = hook(`${b}.attn.hook_pattern`, pat0, [1, H, T, T]);
    const z0 = new Float64Array(T * H * Dh);
    for (let hh = 0; hh < H; hh++)
      for (let i = 0; i < T; i++)
        for (let d = 0; d < Dh; d++) {
          let s = 0;
          for (let j = 0; j < T; j++) s += pat[(hh * T + i) * T + j] * v[(j * Hkv + Math.floor(hh / rep)) * Dh + d];
          z0[(i * H + hh) * Dh + d] = s;
        }
    const z = hook(`${b}.attn.hook_z`, z0, [1, T, H, Dh]);
    const Wo = w(`${a}.o_proj.weight`); // [D, H·Dh]
    const result = new Float64Array(T * H * D);
    for (let t = 0; t < T; t++)
      for (let hh = 0; hh < H; hh++)
        for (let d = 0; d < D; d++) {
          let s = 0;
          for (let e = 0; e < Dh; e++) s += z[(t * H + hh) * Dh + e] * Wo[d * H * Dh + hh * Dh + e];
          result[(t * H + hh) * D + d] = s;
        }
    hook(`${b}.attn.hook_result`, result, [1, T, H, D]);
    const attnOut = hook(`${b}.hook_attn_out`, lin(z, Wo, T, H * Dh, D, w(`${a}.o_proj.bias`)), [1, T, D]);
    let mid: F64 = new Float64Array(T * D);
    for (let i = 0; i < mid.length; i++) mid[i] = x[i] + attnOut[i];
    mid = hook(`${b}.hook_resid_mid`, mid, [1, T, D]);
    const h2 = rmsNorm(mid, `${p}.post_attention_layernorm.weight`, `${b}.ln2.hook_scale`);

    // GptOssTopKRouter: logits (with bias), topk of the logits, softmax over the k values
    const mb = `${p}.mlp`;
    const rb = drop.has('router_bias') ? new Float64Array(E) : w(`${mb}.router.bias`);
    const logits = hook(`${b}.mlp.hook_router_logits`, lin(h2, w(`${mb}.router.weight`), T, D, E, rb), [1, T, E]);
    const chosen: number[][] = [];
    let rw: F64 = new Float64Array(T * E);
    for (let t = 0; t < T; t++) {
      const row = Array.from(logits.subarray(t * E, (t + 1) * E));
      const top = row
        .map((_, e) => e)
        .sort((i, j) => row[j] - row[i] || i - j)
        .slice(0, K);
      chosen.push(top);
      const mx = row[top[0]];
      const ex = top.map((e) => Math.exp(row[e] - mx));
      const s = ex.reduce((u, v2) => u + v2, 0);
      top.forEach((e, i) => (rw[t * E + e] = ex[i] / s));
    }
    rw = hook(`${b}.mlp.hook_router_weights`, rw, [1, T, E]);
    hook(
      `${b}.mlp.hook_expert_weights`,
      Float64Array.from({ length: T * K }, (_, i) => rw[Math.floor(i / K) * E + chosen[Math.floor(i / K)][i % K]]),
      [1, T, K],
    );
    hook(
      `${b}.mlp.hook_expert_indices`,
      Float64Array.from({ length: T * K }, (_, i) => chosen[Math.floor(i / K)][i % K]),
      [1, T, K],
    );
    // GptOssExperts: gate_up = x · gate_up_proj[e] + bias; gate = [..., ::2], up = [..., 1::2]
    const gu = w(`${mb}.experts.gate_up_proj`); // [E, D, 2M]
    const gub = w(`${mb}.experts.gate_up_proj_bias`); // [E, 2M]
    const dp = w(`${mb}.experts.down_proj`); // [E, M, D]
    const dpb = w(`${mb}.experts.down_proj_bias`); // [E, D]
    const noBias = drop.has('expert_bias');
    const mlpOut = new Float64Array(T * D);
    for (let e = 0; e < E; e++) {
      let y: F64 = new Float64Array(T * D);
      // as GptOssExperts in eval: every expert on every token, times its routing weight (zero where not chosen)
      for (let t = 0; t < T; t++) {
        const gated = new Float64Array(M);
        for (let j = 0; j < M; j++) {
          const [gc, uc] = drop.has('gate_up_interleave') ? [j, M + j] : [2 * j, 2 * j + 1];
          let g = noBias ? 0 : gub[e * 2 * M + gc];
          let u = noBias ? 0 : gub[e * 2 * M + uc];
          for (let d = 0; d < D; d++) {
            g += h2[t * D + d] * gu[(e * D + d) * 2 * M + gc];
            u += h2[t * D + d] * gu[(e * D + d) * 2 * M + uc];
          }
          if (!drop.has('clamp')) {
            g = Math.min(g, limit);
            u = Math.min(Math.max(u, -limit), limit);
          }
          gated[j] = (u + 1) * (g * sigmoid(g * alpha));
        }
        for (let d = 0; d < D; d++) {
          let s = noBias ? 0 : dpb[e * D + d];
          for (let j = 0; j < M; j++) s += gated[j] * dp[(e * M + j) * D + d];
          y[t * D + d] = s * rw[t * E + e];
        }
      }
      y = hook(`${b}.mlp.experts.${e}.hook_out`, y, [1, T, D]);
      for (let i = 0; i < T * D; i++) mlpOut[i] += y[i];
    }
    const mo = hook(`${b}.hook_mlp_out`, mlpOut, [1, T, D]);
    const next = new Float64Array(T * D);
    for (let i = 0; i < next.length; i++) next[i] = mid[i] + mo[i];
    x = hook(`${b}.hook_resid_post`, next, [1, T, D]);
  }
  const xf = rmsNorm(x, 'model.norm.weight', 'ln_final.hook_scale');
  return { logits: { dims: [1, T, V], data: lin(xf, w('lm_head.weight'), T, D, V) }, hooks };
}

/** greedy continuation by full float64 forwards (no cache) */
export function gptOssGreedy(m: GptOssModel, tokens: number[], n: number): number[] {
  const seq = [...tokens];
  const V = m.c.vocab_size;
  for (let s = 0; s < n; s++) {
    const { logits } = gptOssForward(m, seq);
    const last = logits.data.subarray((seq.length - 1) * V, seq.length * V);
    let best = 0;
    for (let i = 1; i < V; i++) if (last[i] > last[best]) best = i;
    seq.push(best);
  }
  return seq.slice(tokens.length);
}
