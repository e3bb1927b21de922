// Qwen3.5 (transformers' modeling_qwen3_5.py) in float64: random-weight checkpoints in the exact
// HF layout (Qwen3_5ForCausalLM, or Qwen3_5ForConditionalGeneration with text_config and the
// decoder under model.language_model.) and a forward written from the HF equations. The gated
// delta-net runs in its recurrent form (torch_recurrent_gated_delta_rule: one token at a time, per
// head, in plain loops); the engine runs the same recurrence as an ONNX Scan and shares no code.
// Imports nothing from src/.

import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { encodeSafetensors, roundToDtype, type StDtype } from './safetensors-io';
import { makeTokenizer, type GeneratedTokenizer, writeTokenizerFiles } from './tokenizer-gen';
import { mulberry32, gaussian } from './random-models';

export interface Qwen35Options {
  seed?: number;
  dModel?: number;
  nLayers?: number;
  /** written as config.layer_types; absent: HF's default (full_attention every 4th layer) */
  layerTypes?: ('linear_attention' | 'full_attention')[];
  nHeads?: number;
  nKvHeads?: number;
  headDim?: number;
  dMlp?: number;
  vocabSize?: number;
  linearKeyHeads?: number;
  linearValueHeads?: number;
  linearKeyDim?: number;
  linearValueDim?: number;
  convKernel?: number;
  partialRotary?: number;
  ropeTheta?: number;
  tied?: boolean;
  /** a Qwen3_5ForConditionalGeneration checkpoint (model_type qwen3_5, text_config, a stand-in vision tower and mtp head) */
  multimodal?: boolean;
  dtype?: 'F32' | 'BF16';
  maxPositions?: number;
}

export interface Qwen35Model {
  dir: string;
  config: Record<string, any>;
  /** the decoder's config (text_config of a multimodal one) with HF's defaults filled in */
  text: Record<string, any>;
  prefix: string;
  tensors: Record<string, { dims: number[]; data: Float32Array }>;
  tokenizer: GeneratedTokenizer;
  bosId: number;
  eosId: number;
  cleanup(): void;
}

/**
 * What the reference can leave out, to show each one matters (a sensitivity check):
 * decay_gate (g = 0: the state never decays), beta (β = 1), qk_l2norm (the delta-net's q, k
 * unnormalised), conv (the conv replaced by its last tap alone), norm_gate (no silu(z) gate after
 * the delta-net's norm), attn_output_gate (no sigmoid gate on attention), qk_norm (no q/k RMSNorm),
 * partial_rotary (all of head_dim rotates), zero_centered_norm (norms multiply by w, not 1 + w)
 */
export type Qwen35Feature =
  | 'decay_gate'
  | 'beta'
  | 'qk_l2norm'
  | 'conv'
  | 'norm_gate'
  | 'attn_output_gate'
  | 'qk_norm'
  | 'partial_rotary'
  | 'zero_centered_norm';

export const QWEN35_FEATURES: Qwen35Feature[] = [
  'decay_gate',
  'beta',
  'qk_l2norm',
  'conv',
  'norm_gate',
  'attn_output_gate',
  'qk_norm',
  'partial_rotary',
  'zero_centered_norm',
];

export function makeQwen35Model(o: Qwen35Options = {}): Qwen35Model {
  const rand = mulberry32(o.seed ?? 35);
  const randn = gaussian(rand);
  const dtype: StDtype = o.dtype ?? 'F32';
  const D = o.dModel ?? 32;
  const L = o.nLayers ?? 4;
  const H = o.nHeads ?? 4;
  const Hkv = o.nKvHeads ?? 2;
  const Dh = o.headDim ?? 16;
  const M = o.dMlp ?? 64;
  const V = o.vocabSize ?? 96;
  const Hk = o.linearKeyHeads ?? 2;
  const Hv = o.linearValueHeads ?? 4;
  const Dk = o.linearKeyDim ?? 16;
  const Dv = o.linearValueDim ?? 16;
  const K = o.convKernel ?? 4;
  const C = 2 * Hk * Dk + Hv * Dv;
  const P = o.maxPositions ?? 64;
  const tied = o.tied ?? false;
  const types =
    o.layerTypes ?? Array.from({ length: L }, (_, l) => ((l + 1) % 4 !== 0 ? 'linear_attention' : 'full_attention'));
  const pre = o.multimodal ? 'model.language_model.' : 'model.';

  const tensors: Qwen35Model['tensors'] = {};
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
  // zero-centred norms store w and multiply by (1 + w)
  const normW = (name: string, n: number) => put(name, [n], normal(0.2));

  if (o.multimodal) {
    put('model.visual.patch_embed.proj.weight', [D, 3, 2, 4, 4], normal(0.1));
    put('mtp.fc.weight', [D, 2 * D], normal(0.1));
  }
  put(`${pre}embed_tokens.weight`, [V, D], normal(0.5));
  for (let l = 0; l < L; l++) {
    const p = `${pre}layers.${l}`;
    normW(`${p}.input_layernorm.weight`, D);
    if (types[l] === 'linear_attention') {
      const a = `${p}.linear_attn`;
      put(`${a}.conv1d.weight`, [C, 1, K], normal(0.5));
      put(`${a}.dt_bias`, [Hv], normal(0.5));
      // A in (0.1, 1): decays e^g of a few tenths to near 1, so the state carries over several tokens
      put(`${a}.A_log`, [Hv], () => Math.log(0.1 + 0.9 * rand()));
      put(`${a}.norm.weight`, [Dv], normal(0.2, 1));
      W(`${a}.out_proj.weight`, [D, Hv * Dv]);
      W(`${a}.in_proj_qkv.weight`, [C, D]);
      W(`${a}.in_proj_z.weight`, [Hv * Dv, D]);
      W(`${a}.in_proj_b.weight`, [Hv, D]);
      W(`${a}.in_proj_a.weight`, [Hv, D]);
    } else {
      const a = `${p}.self_attn`;
      W(`${a}.q_proj.weight`, [2 * H * Dh, D]);
      W(`${a}.k_proj.weight`, [Hkv * Dh, D]);
      W(`${a}.v_proj.weight`, [Hkv * Dh, D]);
      W(`${a}.o_proj.weight`, [D, H * Dh]);
      normW(`${a}.q_norm.weight`, Dh);
      normW(`${a}.k_norm.weight`, Dh);
    }
    normW(`${p}.post_attention_layernorm.weight`, D);
    W(`${p}.mlp.gate_proj.weight`, [M, D]);
    W(`${p}.mlp.up_proj.weight`, [M, D]);
    W(`${p}.mlp.down_proj.weight`, [D, M]);
  }
  normW(`${pre}norm.weight`, D);
  if (!tied) put('lm_head.weight', [V, D], normal(2.5 / Math.sqrt(D)));

  const specials = ['<unk>', '<|endoftext|>', '<|im_start|>', '<|im_end|>'];
  const tok = makeTokenizer(
    {
      kind: 'char',
      specials,
      bos: '<|endoftext|>',
      eos: '<|im_end|>',
      unk: '<unk>',
      pad: '<|endoftext|>',
      addBos: false,
      tokenizerClass: 'Qwen2Tokenizer',
      modelMaxLength: P,
    },
    V,
  );
  const bosId = tok.specialIds['<|endoftext|>'];
  const eosId = tok.specialIds['<|im_end|>'];
  const text: Record<string, any> = {
    model_type: 'qwen3_5_text',
    vocab_size: V,
    hidden_size: D,
    intermediate_size: M,
    num_hidden_layers: L,
    num_attention_heads: H,
    num_key_value_heads: Hkv,
    head_dim: Dh,
    hidden_act: 'silu',
    max_position_embeddings: P,
    rms_norm_eps: 1e-6,
    attention_bias: false,
    linear_conv_kernel_dim: K,
    linear_key_head_dim: Dk,
    linear_value_head_dim: Dv,
    linear_num_key_heads: Hk,
    linear_num_value_heads: Hv,
    rope_parameters: {
      rope_type: 'default',
      rope_theta: o.ropeTheta ?? 10_000,
      partial_rotary_factor: o.partialRotary ?? 0.25,
      mrope_section: [1, 1, 0],
      mrope_interleaved: true,
    },
    tie_word_embeddings: tied,
    bos_token_id: bosId,
    eos_token_id: eosId,
  };
  if (o.layerTypes) text.layer_types = o.layerTypes;
  const config: Record<string, any> = o.multimodal
    ? {
        architectures: ['Qwen3_5ForConditionalGeneration'],
        model_type: 'qwen3_5',
        text_config: text,
        vision_config: { model_type: 'qwen3_5_vision', hidden_size: D, depth: 1 },
        image_token_id: V - 1,
        tie_word_embeddings: tied,
      }
    : { architectures: ['Qwen3_5ForCausalLM'], ...text };
  config.torch_dtype = dtype === 'F32' ? 'float32' : 'bfloat16';
  config.transformers_version = '5.0.0';

  const dir = mkdtempSync(join(tmpdir(), 'loupe-ref-qwen3_5-'));
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config, null, 2));
  writeFileSync(join(dir, 'model.safetensors'), encodeSafetensors(tensors, dtype));
  writeTokenizerFiles(dir, tok);
  return {
    dir,
    config,
    text: { ...text, layer_types: types },
    prefix: pre,
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
export function qwen35Forward(
  m: Qwen35Model,
  tokens: number[],
  opts: { drop?: Qwen35Feature[]; hook?: Hook64Fn } = {},
): { logits: Hook64; hooks: Record<string, Hook64> } {
  const c = m.text;
  const drop = new Set(opts.drop ?? []);
  const T = tokens.length;
  const D = c.hidden_size,
    L = c.num_hidden_layers,
    H = c.num_attention_heads,
    Hkv = c.num_key_value_heads,
    Dh = c.head_dim,
    M = c.intermediate_size,
    V = c.vocab_size;
  const Hk = c.linear_num_key_heads,
    Hv = c.linear_num_value_heads,
    Dk = c.linear_key_head_dim,
    Dv = c.linear_value_head_dim,
    K = c.linear_conv_kernel_dim;
  const C = 2 * Hk * Dk + Hv * Dv;
  const eps = c.rms_norm_eps;
  const rd = drop.has('partial_rotary') ? Dh : Math.floor(Dh * c.rope_parameters.partial_rotary_factor);
  const theta = c.rope_parameters.rope_theta;
  const w = (name: string) => Float64Array.from(m.tensors[name].data);
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
  const sigmoid = (x: number) => 1 / (1 + Math.exp(-x));
  const silu = (x: number) => x * sigmoid(x);
  /** HF Qwen3_5RMSNorm over rows of width d: x / sqrt(mean x² + eps) · (1 + w); scale per row returned */
  const rms = (x: F64, wt: F64, d: number, offset = 1) => {
    const n = x.length / d;
    const y = new Float64Array(x.length);
    const scale = new Float64Array(n);
    const off = drop.has('zero_centered_norm') ? 0 : offset;
    for (let i = 0; i < n; i++) {
      let s = 0;
      for (let k = 0; k < d; k++) s += x[i * d + k] ** 2;
      scale[i] = Math.sqrt(s / d + eps);
      for (let k = 0; k < d; k++) y[i * d + k] = (x[i * d + k] / scale[i]) * (off + wt[k]);
    }
    return { y, scale };
  };
  const scaledNorm = (x: F64, wname: string, scaleHook: string) => {
    const { scale } = rms(x, w(wname), D);
    const s = hook(scaleHook, scale, [1, T, 1]);
    const wt = w(wname);
    const off = drop.has('zero_centered_norm') ? 0 : 1;
    const y = new Float64Array(x.length);
    for (let t = 0; t < T; t++) for (let k = 0; k < D; k++) y[t * D + k] = (x[t * D + k] / s[t]) * (off + wt[k]);
    return y;
  };

  const pre = m.prefix;
  let x: F64 = new Float64Array(T * D);
  const E = w(`${pre}embed_tokens.weight`);
  for (let t = 0; t < T; t++) x.set(E.subarray(tokens[t] * D, (tokens[t] + 1) * D), t * D);
  x = hook('hook_embed', x, [1, T, D]);

  for (let l = 0; l < L; l++) {
    const p = `${pre}layers.${l}`;
    const b = `blocks.${l}`;
    x = hook(`${b}.hook_resid_pre`, x, [1, T, D]);
    const h = scaledNorm(x, `${p}.input_layernorm.weight`, `${b}.ln1.hook_scale`);
    let mixOut: F64;
    const linearLayer = m.text.layer_types[l] === 'linear_attention';
    if (linearLayer) {
      const a = `${p}.linear_attn`;
      const n = `${b}.linear_attn`;
      const mixed = lin(h, w(`${a}.in_proj_qkv.weight`), T, D, C);
      // causal depthwise conv1d (zero left padding), then silu
      const cw = w(`${a}.conv1d.weight`); // [C, 1, K]
      const conv = new Float64Array(T * C);
      for (let t = 0; t < T; t++)
        for (let ch = 0; ch < C; ch++) {
          let s = 0;
          for (let j = 0; j < K; j++) {
            const src = t - (K - 1) + j;
            if (src < 0) continue;
            if (drop.has('conv') && j !== K - 1) continue;
            s += cw[ch * K + j] * mixed[src * C + ch];
          }
          conv[t * C + ch] = silu(s);
        }
      const part = (off: number, heads: number, d: number, l2: boolean) => {
        const out = new Float64Array(T * heads * d);
        for (let t = 0; t < T; t++)
          for (let hh = 0; hh < heads; hh++) {
            let ss = 0;
            for (let k = 0; k < d; k++) ss += conv[t * C + off + hh * d + k] ** 2;
            const inv = l2 && !drop.has('qk_l2norm') ? 1 / Math.sqrt(ss + 1e-6) : 1;
            for (let k = 0; k < d; k++) out[(t * heads + hh) * d + k] = conv[t * C + off + hh * d + k] * inv;
          }
        return out;
      };
      const q = hook(`${n}.hook_q`, part(0, Hk, Dk, true), [1, T, Hk, Dk]);
      const k = hook(`${n}.hook_k`, part(Hk * Dk, Hk, Dk, true), [1, T, Hk, Dk]);
      const v = hook(`${n}.hook_v`, part(2 * Hk * Dk, Hv, Dv, false), [1, T, Hv, Dv]);
      const bIn = lin(h, w(`${a}.in_proj_b.weight`), T, D, Hv);
      const aIn = lin(h, w(`${a}.in_proj_a.weight`), T, D, Hv);
      const Alog = w(`${a}.A_log`);
      const dt = w(`${a}.dt_bias`);
      const beta0 = new Float64Array(T * Hv);
      const g0 = new Float64Array(T * Hv);
      // torch softplus: log(1 + e^x), x itself above its threshold 20
      const softplus = (z: number) => (z > 20 ? z : Math.log1p(Math.exp(z)));
      for (let i = 0; i < T * Hv; i++) {
        beta0[i] = drop.has('beta') ? 1 : sigmoid(bIn[i]);
        g0[i] = drop.has('decay_gate') ? 0 : -Math.exp(Alog[i % Hv]) * softplus(aIn[i] + dt[i % Hv]);
      }
      const beta = hook(`${n}.hook_beta`, beta0, [1, T, Hv]);
      const g = hook(`${n}.hook_decay`, g0, [1, T, Hv]);
      // the recurrent gated delta rule, per value head; key head hv / (Hv / Hk) (repeat_interleave)
      const core0 = new Float64Array(T * Hv * Dv);
      const rep = Hv / Hk;
      for (let hv = 0; hv < Hv; hv++) {
        const hk = Math.floor(hv / rep);
        const S = new Float64Array(Dk * Dv); // S[i, j]: key dim i, value dim j
        for (let t = 0; t < T; t++) {
          const kt = k.subarray((t * Hk + hk) * Dk, (t * Hk + hk + 1) * Dk);
          const qt = q.subarray((t * Hk + hk) * Dk, (t * Hk + hk + 1) * Dk);
          const vt = v.subarray((t * Hv + hv) * Dv, (t * Hv + hv + 1) * Dv);
          const decay = Math.exp(g[t * Hv + hv]);
          for (let i = 0; i < Dk * Dv; i++) S[i] *= decay;
          for (let j = 0; j < Dv; j++) {
            let mem = 0;
            for (let i = 0; i < Dk; i++) mem += S[i * Dv + j] * kt[i];
            const delta = (vt[j] - mem) * beta[t * Hv + hv];
            for (let i = 0; i < Dk; i++) S[i * Dv + j] += kt[i] * delta;
          }
          for (let j = 0; j < Dv; j++) {
            let o = 0;
            for (let i = 0; i < Dk; i++) o += S[i * Dv + j] * (qt[i] / Math.sqrt(Dk));
            core0[(t * Hv + hv) * Dv + j] = o;
          }
        }
      }
      const core = hook(`${n}.hook_core`, core0, [1, T, Hv, Dv]);
      const gate = hook(`${n}.hook_gate`, lin(h, w(`${a}.in_proj_z.weight`), T, D, Hv * Dv), [1, T, Hv, Dv]);
      // Qwen3_5RMSNormGated: norm over Dv, times w (no offset), times silu(gate)
      const normed = rms(core, w(`${a}.norm.weight`), Dv, 0).y;
      const z0 = new Float64Array(T * Hv * Dv);
      for (let i = 0; i < z0.length; i++) z0[i] = normed[i] * (drop.has('norm_gate') ? 1 : silu(gate[i]));
      const z = hook(`${n}.hook_z`, z0, [1, T, Hv, Dv]);
      mixOut = lin(z, w(`${a}.out_proj.weight`), T, Hv * Dv, D);
    } else {
      const a = `${p}.self_attn`;
      const qg = lin(h, w(`${a}.q_proj.weight`), T, D, 2 * H * Dh); // per head: Dh query, Dh gate
      const q0 = new Float64Array(T * H * Dh);
      const gate0 = new Float64Array(T * H * Dh);
      for (let t = 0; t < T; t++)
        for (let hh = 0; hh < H; hh++)
          for (let d = 0; d < Dh; d++) {
            q0[(t * H + hh) * Dh + d] = qg[t * 2 * H * Dh + hh * 2 * Dh + d];
            gate0[(t * H + hh) * Dh + d] = qg[t * 2 * H * Dh + hh * 2 * Dh + Dh + d];
          }
      const gate = hook(`${b}.attn.hook_gate`, gate0, [1, T, H, Dh]);
      const k0 = lin(h, w(`${a}.k_proj.weight`), T, D, Hkv * Dh);
      const v0 = lin(h, w(`${a}.v_proj.weight`), T, D, Hkv * Dh);
      const qn = drop.has('qk_norm') ? q0 : rms(q0, w(`${a}.q_norm.weight`), Dh).y;
      const kn = drop.has('qk_norm') ? k0 : rms(k0, w(`${a}.k_norm.weight`), Dh).y;
      // rotate_half over the first rd dims, inv_freq_i = θ^(−2i/rd), positions 0…T−1
      const rope = (x0: F64, heads: number) => {
        const y = Float64Array.from(x0);
        for (let t = 0; t < T; t++)
          for (let hh = 0; hh < heads; hh++) {
            const o = (t * heads + hh) * Dh;
            for (let i = 0; i < rd / 2; i++) {
              const ang = t * theta ** ((-2 * i) / rd);
              const [x1, x2] = [x0[o + i], x0[o + i + rd / 2]];
              y[o + i] = x1 * Math.cos(ang) - x2 * Math.sin(ang);
              y[o + i + rd / 2] = x2 * Math.cos(ang) + x1 * Math.sin(ang);
            }
          }
        return y;
      };
      const q = hook(`${b}.attn.hook_q`, rope(qn, H), [1, T, H, Dh]);
      const k = hook(`${b}.attn.hook_k`, rope(kn, Hkv), [1, T, Hkv, Dh]);
      const v = hook(`${b}.attn.hook_v`, v0, [1, T, Hkv, Dh]);
      const scores0 = new Float64Array(H * T * T);
      const rep = H / Hkv;
      for (let hh = 0; hh < H; hh++)
        for (let i = 0; i < T; i++)
          for (let j = 0; j < T; j++) {
            if (j > i) {
              scores0[(hh * T + i) * T + j] = -Infinity;
              continue;
            }
            let s = 0;
            const kh = Math.floor(hh / rep);
            for (let d = 0; d < Dh; d++) s += q[(i * H + hh) * Dh + d] * k[(j * Hkv + kh) * Dh + d];
            scores0[(hh * T + i) * T + j] = s / Math.sqrt(Dh);
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
      const z0 = new Float64Array(T * H * Dh);
      for (let hh = 0; hh < H; hh++)
        for (let i = 0; i < T; i++)
          for (let d = 0; d < Dh; d++) {
            let s = 0;
            for (let j = 0; j < T; j++) s += pat[(hh * T + i) * T + j] * v[(j * Hkv + Math.floor(hh / rep)) * Dh + d];
            const gi = (i * H + hh) * Dh + d;
            z0[gi] = s * (drop.has('attn_output_gate') ? 1 : sigmoid(gate[gi]));
          }
      const z = hook(`${b}.attn.hook_z`, z0, [1, T, H, Dh]);
      mixOut = lin(z, w(`${a}.o_proj.weight`), T, H * Dh, D);
    }
    mixOut = hook(`${b}.hook_attn_out`, mixOut, [1, T, D]);
    let mid: F64 = new Float64Array(T * D);
    for (let i = 0; i < mid.length; i++) mid[i] = x[i] + mixOut[i];
    mid = hook(`${b}.hook_resid_mid`, mid, [1, T, D]);
    const h2 = scaledNorm(mid, `${p}.post_attention_layernorm.weight`, `${b}.ln2.hook_scale`);
    const gp = hook(`${b}.mlp.hook_pre`, lin(h2, w(`${p}.mlp.gate_proj.weight`), T, D, M), [1, T, M]);
    const up = hook(`${b}.mlp.hook_pre_linear`, lin(h2, w(`${p}.mlp.up_proj.weight`), T, D, M), [1, T, M]);
    const post0 = new Float64Array(T * M);
    for (let i = 0; i < post0.length; i++) post0[i] = silu(gp[i]) * up[i];
    const post = hook(`${b}.mlp.hook_post`, post0, [1, T, M]);
    const mlpOut = hook(`${b}.hook_mlp_out`, lin(post, w(`${p}.mlp.down_proj.weight`), T, M, D), [1, T, D]);
    const next = new Float64Array(T * D);
    for (let i = 0; i < next.length; i++) next[i] = mid[i] + mlpOut[i];
    x = hook(`${b}.hook_resid_post`, next, [1, T, D]);
  }
  const xf = scaledNorm(x, `${pre}norm.weight`, 'ln_final.hook_scale');
  const U = m.config.tie_word_embeddings || m.text.tie_word_embeddings ? E : w('lm_head.weight');
  return { logits: { dims: [1, T, V], data: lin(xf, U, T, D, V) }, hooks };
}

/** greedy continuation by full float64 forwards (no cache, no state carried) */
export function qwen35Greedy(m: Qwen35Model, tokens: number[], n: number): number[] {
  const seq = [...tokens];
  const V = m.text.vocab_size;
  for (let s = 0; s < n; s++) {
    const { logits } = qwen35Forward(m, seq);
    const last = logits.data.subarray((seq.length - 1) * V, seq.length * V);
    let best = 0;
    for (let i = 1; i < V; i++) if (last[i] > last[best]) best = i;
    seq.push(best);
  }
  return seq.slice(tokens.length);
}
