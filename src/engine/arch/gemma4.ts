/**
 * Gemma 4's text decoder (transformers' modeling_gemma4.py, configuration_gemma4.py): Gemma 3's
 * sandwich norms and q/k norms, but every RMSNorm multiplies by w (not 1 + w), v is RMS-normalised
 * without a weight, attention is unscaled (scaling 1.0), and the layers differ: full-attention
 * layers have their own head width (global_head_dim) and, with attention_k_eq_v, their own key/value
 * heads (num_global_key_value_heads) and no v_proj (v is the key projection); they rotate with
 * proportional RoPE (the first partial_rotary_factor of the frequencies over global_head_dim), the
 * sliding layers with the default RoPE of their own base. The last num_kv_shared_layers layers
 * compute no keys or values: each attends with those of the last earlier layer of its type (and,
 * with use_double_wide_mlp, has an MLP twice as wide). Per-layer inputs (PLE,
 * hidden_size_per_layer_input > 0): a second token table [V', L·P] and a projection of the
 * embedding give each layer a P-vector, gated into the stream after the MLP; each block's output
 * is multiplied by its stored layer_scalar. Final logits are soft-capped. `gemma4_text`
 * (Gemma4ForCausalLM) is the decoder under `model.`; `gemma4` (Gemma4ForConditionalGeneration)
 * nests it in text_config with its weights under `model.language_model.`, and its vision and audio
 * towers are never read. With enable_moe_block (26B-A4B) every layer runs num_experts experts of
 * moe_intermediate_size beside its dense MLP (Gemma4TextDecoderLayer, Gemma4TextRouter):
 *   router   `router.proj` [E, D] reads RMSNorm(resid_mid) · router.scale [D] · D^−½; softmax over E,
 *            the top_k_experts largest, renormalised to sum 1, each times router.per_expert_scale[e]
 *   experts  stacked: `experts.gate_up_proj` [E, 2M, D] (gate rows first, then up: `chunk(2)`),
 *            `experts.down_proj` [E, D, M], on pre_feedforward_layernorm_2(resid_mid)
 *   output   post_feedforward_layernorm(post_feedforward_layernorm_1(mlp) +
 *            post_feedforward_layernorm_2(Σ weight · expert)) (spec.ts MoeSpec.beside)
 */
import { checkDim } from '../caps';
import { LoupeError } from '../errors';
import { deriveRows } from '../mxfp4';
import type { AttentionSpec, ExpertSpec, LayerSpec, ModelSpec, MoeSpec, NormSpec, RotarySpec } from '../spec';
import {
  type AdapterInput,
  type Config,
  activation,
  dim,
  linear,
  maybe,
  need,
  norm,
  num,
  roundToStoredDtype,
  sizes,
  nestedTextConfig,
  unsupportedConfig,
} from './common';

/** Gemma4TextConfig's defaults (configuration_gemma4.py): the multimodal configs may leave some out */
const TEXT_DEFAULTS: Config = {
  vocab_size: 262_144,
  hidden_size: 2304,
  intermediate_size: 9216,
  num_hidden_layers: 30,
  num_attention_heads: 8,
  num_key_value_heads: 4,
  head_dim: 256,
  hidden_activation: 'gelu_pytorch_tanh',
  max_position_embeddings: 131_072,
  rms_norm_eps: 1e-6,
  pad_token_id: 0,
  eos_token_id: 1,
  bos_token_id: 2,
  tie_word_embeddings: true,
  attention_bias: false,
  sliding_window: 512,
  final_logit_softcapping: null,
  use_bidirectional_attention: null,
  vocab_size_per_layer_input: 262_144,
  hidden_size_per_layer_input: 256,
  num_global_key_value_heads: null,
  global_head_dim: 512,
  attention_k_eq_v: false,
  num_kv_shared_layers: 0,
  enable_moe_block: false,
  use_double_wide_mlp: false,
};

/** Gemma4TextConfig.__post_init__'s rope_parameters when config.json has none */
const DEFAULT_ROPE: Config = {
  sliding_attention: { rope_type: 'default', rope_theta: 10_000 },
  full_attention: { rope_type: 'proportional', partial_rotary_factor: 0.25, rope_theta: 1_000_000 },
};

const PREFIX = { text: 'model.', multimodal: 'model.language_model.' };
const LAYER_TYPES = ['sliding_attention', 'full_attention'];

const badConfig = (field: string, message: string) =>
  new LoupeError('BAD_CONFIG', `config.json ${field}: ${message}`, "The model's config.json is damaged.", { field });

/** the text decoder's config: text_config of a multimodal config, the config itself otherwise, with HF's defaults */
export function gemma4TextConfig(config: Config): Config {
  const c = nestedTextConfig(
    config,
    { outer: 'gemma4', text: 'gemma4_text', name: 'multimodal Gemma 4', cls: 'Gemma4ForConditionalGeneration' },
    TEXT_DEFAULTS,
  );
  return c;
}

/** a rope_parameters entry's theta, a positive number */
function theta(rp: Config, type: string): number {
  const v = rp.rope_theta;
  if (typeof v !== 'number' || !(v > 0))
    throw badConfig(`rope_parameters.${type}.rope_theta`, 'must be a positive number.');
  return v;
}

export function gemma4(input: AdapterInput): ModelSpec {
  const c = gemma4TextConfig(input.config);
  const t = input.tensors;
  // ---- config.json, all of it before the first tensor
  if (c.use_bidirectional_attention === 'all')
    throw unsupportedConfig('use_bidirectional_attention', 'all', "null or 'vision' (causal attention over text)");
  const D = dim(c, ['hidden_size'], 'maxDModel');
  const L = dim(c, ['num_hidden_layers'], 'maxLayers');
  const H = dim(c, ['num_attention_heads'], 'maxHeads');
  const Hkv = dim(c, ['num_key_value_heads'], 'maxHeads');
  const V = dim(c, ['vocab_size'], 'maxVocab');
  const M = dim(c, ['intermediate_size'], 'maxDMlp');
  const Dh = dim(c, ['head_dim'], 'maxDHead');
  const G = c.global_head_dim ? dim(c, ['global_head_dim'], 'maxDHead') : Dh;
  const nCtx = dim(c, ['max_position_embeddings'], 'maxPositions');
  const eps = num(c, ['rms_norm_eps'], 1e-6);
  const act = activation(c.hidden_activation, 'gelu_pytorch_tanh');
  const kEqV = c.attention_k_eq_v === true;
  const HkvGlobal = kEqV ? dim(c, ['num_global_key_value_heads'], 'maxHeads') : Hkv;
  for (const [field, n] of [
    ['num_key_value_heads', Hkv],
    ['num_global_key_value_heads', HkvGlobal],
  ] as const)
    if (H % n !== 0) throw badConfig(field, `num_attention_heads (${H}) is not a multiple of ${field} (${n}).`);
  const P = c.hidden_size_per_layer_input ? dim(c, ['hidden_size_per_layer_input'], 'maxDMlp') : 0;
  const Vp = P ? dim(c, ['vocab_size_per_layer_input'], 'maxVocab') : 0;
  if (P && Vp < V)
    throw unsupportedConfig(
      'vocab_size_per_layer_input',
      Vp,
      `at least vocab_size (${V}): every token has a per-layer row`,
    );
  // the per-layer table's rows hold all L layers' P values
  if (P) checkDim('maxDMlp', L * P, 'num_hidden_layers × hidden_size_per_layer_input');

  // layer types: HF's default five sliding to one full; the last layer is always full (HF forces it)
  const types: string[] = Array.isArray(c.layer_types)
    ? [...c.layer_types]
    : Array.from({ length: L }, (_, l) => ((l + 1) % 6 !== 0 ? 'sliding_attention' : 'full_attention'));
  if (types.length !== L) throw badConfig('layer_types', `lists ${types.length} layers but num_hidden_layers is ${L}.`);
  types.forEach((k, l) => {
    if (!LAYER_TYPES.includes(k)) throw unsupportedConfig(`layer_types[${l}]`, k, LAYER_TYPES.join(', '));
  });
  types[L - 1] = 'full_attention';
  const window = dim(c, ['sliding_window'], 'maxPositions');

  // KV sharing: layer l ≥ L − n reads the keys and values of the last earlier layer of its type
  const nShared = c.num_kv_shared_layers ?? 0;
  if (!Number.isInteger(nShared) || nShared < 0 || nShared >= L)
    throw badConfig('num_kv_shared_layers', `must be an integer from 0 to num_hidden_layers − 1 (${L - 1}).`);
  const first = L - nShared;
  const kvFrom = types.map((type, l) => {
    if (nShared === 0 || l < first) return undefined;
    const src = types.slice(0, first).lastIndexOf(type);
    if (src < 0)
      throw badConfig(
        'num_kv_shared_layers',
        `layer ${l} (${type}) shares keys and values, but no earlier layer of its type computes them.`,
      );
    return src;
  });
  const doubleWide = c.use_double_wide_mlp === true;
  const moe = c.enable_moe_block === true ? moeConfig(c) : undefined;

  // rotary: the sliding layers' default RoPE over head_dim; the full layers' proportional RoPE over global_head_dim
  const rp: Config = c.rope_parameters && typeof c.rope_parameters === 'object' ? c.rope_parameters : DEFAULT_ROPE;
  const ropeOf = (type: string, d: number): RotarySpec => {
    const r = rp[type];
    if (!r || typeof r !== 'object') throw badConfig(`rope_parameters.${type}`, 'is missing.');
    const kind = r.rope_type ?? 'default';
    if (kind === 'default') {
      // HF computes the default frequencies over head_dim on every layer type
      if (d !== Dh)
        throw unsupportedConfig(
          `rope_parameters.${type}.rope_type`,
          kind,
          `proportional (head width ${d} ≠ head_dim ${Dh})`,
        );
      return { theta: theta(r, type), dim: d, scaling: null };
    }
    if (kind !== 'proportional' || type !== 'full_attention')
      throw unsupportedConfig(
        `rope_parameters.${type}.rope_type`,
        kind,
        type === 'full_attention' ? 'default, proportional' : 'default',
      );
    const p = r.partial_rotary_factor ?? 1;
    const factor = r.factor ?? 1;
    if (typeof p !== 'number' || !(p > 0) || p > 1)
      throw badConfig(`rope_parameters.${type}.partial_rotary_factor`, 'must be a number in (0, 1].');
    if (typeof factor !== 'number' || !(factor > 0))
      throw badConfig(`rope_parameters.${type}.factor`, 'must be a positive number.');
    // `rope_angles = int(rope_proportion * head_dim // 2)` (modeling_rope_utils)
    return {
      theta: theta(r, type),
      dim: d,
      scaling: factor === 1 ? null : { kind: 'linear', factor },
      angles: Math.floor((p * d) / 2),
    };
  };
  const rotary = ropeOf('full_attention', G);
  const rotaryLocal = types.includes('sliding_attention') ? ropeOf('sliding_attention', Dh) : undefined;
  const tied = c.tie_word_embeddings !== false;
  const softcap = typeof c.final_logit_softcapping === 'number' ? c.final_logit_softcapping : null;

  // ---- tensors
  const pre = input.config.model_type === 'gemma4' ? PREFIX.multimodal : PREFIX.text;
  const rms = (name: string, d = D): NormSpec => norm(t, name, d, 'rmsnorm', eps, 0);
  const layers: LayerSpec[] = [];
  for (let l = 0; l < L; l++) {
    const p = `${pre}layers.${l}`;
    const a = `${p}.self_attn`;
    const full = types[l] === 'full_attention';
    const d = full ? G : Dh;
    const hkv = full ? HkvGlobal : Hkv;
    const shared = kvFrom[l] !== undefined;
    const q = linear(t, `${a}.q_proj`, H * d, D);
    const k = shared ? q : linear(t, `${a}.k_proj`, hkv * d, D);
    const attn: AttentionSpec = {
      // a KV-sharing layer has no k/v projections (its qkv.k, qkv.v are unused); k_eq_v: v is k's projection
      qkv: { kind: 'separate', q, k, v: shared || (kEqV && full) ? k : linear(t, `${a}.v_proj`, hkv * d, D) },
      o: linear(t, `${a}.o_proj`, D, H * d),
      qNorm: rms(`${a}.q_norm`, d),
      ...(shared ? { kvFrom: kvFrom[l] } : { kNorm: rms(`${a}.k_norm`, d), vNorm: { eps } }),
      qkNormWidth: 'head',
      ...(full ? {} : { localRotary: true }),
      scale: 1,
      softcap: null,
      slidingWindow: full ? null : window,
      ...(d !== Dh ? { dHead: d } : {}),
      ...(hkv !== Hkv ? { nKvHeads: hkv } : {}),
    };
    const m = doubleWide && shared ? 2 * M : M;
    const layer: LayerSpec = {
      ln1: rms(`${p}.input_layernorm`),
      attn,
      postAttnNorm: rms(`${p}.post_attention_layernorm`),
      ln2: rms(`${p}.pre_feedforward_layernorm`),
      mlp: {
        kind: 'gated',
        gate: linear(t, `${p}.mlp.gate_proj`, m, D),
        up: linear(t, `${p}.mlp.up_proj`, m, D),
        down: linear(t, `${p}.mlp.down_proj`, D, m),
        act,
        ...(m !== M ? { width: m } : {}),
      },
      postMlpNorm: rms(`${p}.post_feedforward_layernorm`),
      parallel: false,
    };
    if (moe) layer.moe = moeLayer(t, p, D, moe, act, rms);
    if (P)
      layer.perLayer = {
        gate: linear(t, `${p}.per_layer_input_gate`, P, D),
        proj: linear(t, `${p}.per_layer_projection`, D, P),
        norm: rms(`${p}.post_per_layer_input_norm`),
        act,
      };
    // a buffer of ones when a checkpoint leaves it out (HF's _init_weights)
    const scalar = maybe(t, `${p}.layer_scalar`, [1]);
    if (scalar) layer.scalar = scalar;
    layers.push(layer);
  }
  const embedName = need(t, `${pre}embed_tokens.weight`, [V, D]);
  let perLayerInput: ModelSpec['perLayerInput'];
  if (P) {
    const table = need(t, `${pre}embed_tokens_per_layer.weight`, [Vp, L * P]);
    perLayerInput = {
      embed: table,
      // Gemma4TextScaledWordEmbedding: `embed_scale.to(weight.dtype)`
      embedScale: roundToStoredDtype(Math.sqrt(P), t.get(table)!.dtype),
      projection: linear(t, `${pre}per_layer_model_projection`, L * P, D),
      projScale: D ** -0.5,
      norm: rms(`${pre}per_layer_projection_norm`, P),
      inputScale: 2 ** -0.5,
      width: P,
    };
  }
  return {
    family: 'gemma4',
    ...sizes(c, { L, D, H, Hkv, Dh, M, V, nCtx }),
    ...(moe ? { nExperts: moe.E, topK: moe.k } : {}),
    norm: 'rmsnorm',
    embed: { w: embedName, scale: roundToStoredDtype(Math.sqrt(D), t.get(embedName)!.dtype) },
    rotary,
    ...(rotaryLocal ? { rotaryLocal } : {}),
    layers,
    lnFinal: rms(`${pre}norm`),
    unembed: { w: tied ? embedName : need(t, 'lm_head.weight', [V, D]) },
    ...(perLayerInput ? { perLayerInput } : {}),
    finalSoftcap: softcap,
    bosTokenId: c.bos_token_id,
    eosTokenId: Array.isArray(c.eos_token_id) ? c.eos_token_id[0] : c.eos_token_id,
  };
}

/** enable_moe_block's sizes: num_experts experts of moe_intermediate_size, top_k_experts per token */
function moeConfig(c: Config): { E: number; k: number; M: number } {
  const E = dim(c, ['num_experts'], 'maxExperts');
  const k = dim(c, ['top_k_experts'], 'maxExpertsPerToken');
  if (k > E) throw badConfig('top_k_experts', `(${k}) is more than num_experts (${E}).`);
  return { E, k, M: dim(c, ['moe_intermediate_size'], 'maxDMlp') };
}

/** one layer's router and stacked experts (`p`: the layer's prefix), every shape checked from the headers */
function moeLayer(
  t: AdapterInput['tensors'],
  p: string,
  D: number,
  { E, k, M }: { E: number; k: number; M: number },
  act: MoeSpec['act'],
  rms: (name: string) => NormSpec,
): MoeSpec {
  const gu = need(t, `${p}.experts.gate_up_proj`, [E, 2 * M, D]);
  const dp = need(t, `${p}.experts.down_proj`, [E, D, M]);
  const rows = (src: string, name: string, e: number, start: number, count: number) => ({
    w: deriveRows(t, `${p}.experts.${e}.${name}.weight`, { kind: 'rows', src, expert: e, start, step: 1, count }),
    layout: 'out_in' as const,
  });
  const experts = Array.from({ length: E }, (_, e): ExpertSpec => ({
    gate: rows(gu, 'gate_proj', e, 0, M),
    up: rows(gu, 'up_proj', e, M, M),
    down: rows(dp, 'down_proj', e, 0, D),
  }));
  // RMSNorm without a weight, times router.scale: an RMSNorm whose weight is router.scale
  const routerNorm: NormSpec = { ...rms(`${p}.pre_feedforward_layernorm_2`), w: need(t, `${p}.router.scale`, [D]) };
  return {
    router: linear(t, `${p}.router.proj`, E, D),
    experts,
    topK: k,
    routing: 'softmax_topk',
    normTopK: true,
    act,
    dExpert: M,
    beside: {
      routerNorm,
      routerScale: D ** -0.5,
      expertScale: need(t, `${p}.router.per_expert_scale`, [E]),
      preNorm: rms(`${p}.pre_feedforward_layernorm_2`),
      postNorm: rms(`${p}.post_feedforward_layernorm_2`),
      denseNorm: rms(`${p}.post_feedforward_layernorm_1`),
    },
  };
}

/** a multimodal checkpoint's text-model tensors (the rest is the vision and audio towers and their embedders) */
gemma4.textTensors = (config: Config) =>
  config.model_type === 'gemma4'
    ? (name: string) => name.startsWith(PREFIX.multimodal) || name === 'lm_head.weight'
    : null;
