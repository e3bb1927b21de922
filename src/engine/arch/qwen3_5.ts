/**
 * Qwen3.5 (transformers' modeling_qwen3_5.py, configuration_qwen3_5.py): a hybrid decoder whose
 * `layer_types` (else three linear_attention layers to one full_attention, full_attention_interval
 * 4) pick each layer's token mixer: the gated delta-net (spec.ts LinearAttnSpec) or gated
 * attention (Qwen3's per-head q/k norms, q_proj holding each head's query and output gate,
 * partial rotary, default 0.25 of head_dim). Every RMSNorm multiplies by (1 + w) except the
 * delta-net's gated norm (w). `qwen3_5_text` (Qwen3_5ForCausalLM) is the decoder under `model.`;
 * `qwen3_5` (Qwen3_5ForConditionalGeneration, the published checkpoints) nests its config in
 * text_config and its weights under `model.language_model.`; the vision tower and the
 * multi-token-prediction head (`mtp.*`) are never read. Text positions run M-RoPE with all three
 * position rows equal, which is the ordinary rotary of rope_theta.
 */
import { LoupeError } from '../errors';
import type { LayerSpec, LinearRef, ModelSpec, NormSpec } from '../spec';
import {
  type AdapterInput,
  type Config,
  dim,
  linear,
  need,
  norm,
  num,
  sizes,
  nestedTextConfig,
  unsupportedConfig,
} from './common';

/** Qwen3_5TextConfig's defaults (configuration_qwen3_5.py): the multimodal configs may leave some out */
const TEXT_DEFAULTS: Config = {
  vocab_size: 248_320,
  hidden_size: 4096,
  intermediate_size: 12_288,
  num_hidden_layers: 32,
  num_attention_heads: 16,
  num_key_value_heads: 4,
  hidden_act: 'silu',
  max_position_embeddings: 32_768,
  rms_norm_eps: 1e-6,
  tie_word_embeddings: false,
  attention_bias: false,
  head_dim: 256,
  linear_conv_kernel_dim: 4,
  linear_key_head_dim: 128,
  linear_value_head_dim: 128,
  linear_num_key_heads: 16,
  linear_num_value_heads: 32,
};

const PREFIX = { text: 'model.', multimodal: 'model.language_model.' };
const LAYER_TYPES = ['linear_attention', 'full_attention'];

/** the text decoder's config: text_config of a multimodal config, the config itself otherwise, with HF's defaults */
export function qwen3_5TextConfig(config: Config): Config {
  return nestedTextConfig(
    config,
    { outer: 'qwen3_5', text: 'qwen3_5_text', name: 'Qwen3.5', cls: 'Qwen3_5ForConditionalGeneration', skipNull: true },
    TEXT_DEFAULTS,
  );
}

export function qwen3_5(input: AdapterInput): ModelSpec {
  const c = qwen3_5TextConfig(input.config);
  const t = input.tensors;
  // ---- config.json, all of it before the first tensor
  const D = dim(c, ['hidden_size'], 'maxDModel');
  const L = dim(c, ['num_hidden_layers'], 'maxLayers');
  const H = dim(c, ['num_attention_heads'], 'maxHeads');
  const Hkv = dim(c, ['num_key_value_heads'], 'maxHeads');
  const V = dim(c, ['vocab_size'], 'maxVocab');
  const M = dim(c, ['intermediate_size'], 'maxDMlp');
  const Dh = dim(c, ['head_dim'], 'maxDHead');
  const nCtx = dim(c, ['max_position_embeddings'], 'maxPositions');
  const Hk = dim(c, ['linear_num_key_heads'], 'maxHeads');
  const Hv = dim(c, ['linear_num_value_heads'], 'maxHeads');
  const Dk = dim(c, ['linear_key_head_dim'], 'maxDHead');
  const Dv = dim(c, ['linear_value_head_dim'], 'maxDHead');
  const K = c.linear_conv_kernel_dim;
  if (!Number.isInteger(K) || K < 2 || K > 64)
    throw unsupportedConfig('linear_conv_kernel_dim', K, 'an integer kernel size from 2 to 64');
  if (Hv % Hk !== 0)
    throw new LoupeError(
      'BAD_CONFIG',
      `linear_num_value_heads (${Hv}) is not a multiple of linear_num_key_heads (${Hk}).`,
      undefined,
      { field: 'linear_num_value_heads' },
    );
  const eps = num(c, ['rms_norm_eps'], 1e-6);
  // the MLP, the conv and the gated norm all use hidden_act
  if (c.hidden_act !== 'silu') throw unsupportedConfig('hidden_act', c.hidden_act, 'silu');
  const rp: Config =
    c.rope_parameters && typeof c.rope_parameters === 'object' && !Array.isArray(c.rope_parameters)
      ? c.rope_parameters
      : {};
  const ropeType = rp.rope_type ?? rp.type ?? c.rope_scaling?.rope_type ?? 'default';
  if (ropeType !== 'default') throw unsupportedConfig('rope_parameters.rope_type', ropeType, 'default');
  const factor = rp.partial_rotary_factor ?? c.partial_rotary_factor ?? 0.25;
  const rd = Math.floor(Dh * factor);
  if (typeof factor !== 'number' || !(rd > 0) || rd % 2 !== 0 || rd > Dh)
    throw unsupportedConfig('partial_rotary_factor', factor, `a factor giving even rotary dims ≤ head_dim ${Dh}`);
  const theta = num(rp, ['rope_theta'], num(c, ['rope_theta'], 10_000));
  const interval = c.full_attention_interval ?? 4;
  if (!Array.isArray(c.layer_types) && (!Number.isInteger(interval) || interval < 1))
    throw unsupportedConfig('full_attention_interval', interval, 'a positive integer');
  const types: string[] = Array.isArray(c.layer_types)
    ? c.layer_types
    : Array.from({ length: L }, (_, l) => ((l + 1) % interval !== 0 ? 'linear_attention' : 'full_attention'));
  if (types.length !== L)
    throw new LoupeError(
      'BAD_CONFIG',
      `config.json: layer_types lists ${types.length} layers but num_hidden_layers is ${L}.`,
      "The model's config.json is damaged.",
      { field: 'layer_types' },
    );
  types.forEach((k, l) => {
    if (!LAYER_TYPES.includes(k)) throw unsupportedConfig(`layer_types[${l}]`, k, LAYER_TYPES.join(', '));
  });
  const tied = c.tie_word_embeddings === true;

  // ---- tensors
  const pre = input.config.model_type === 'qwen3_5' ? PREFIX.multimodal : PREFIX.text;
  const rms = (prefix: string, d = D): NormSpec => norm(t, prefix, d, 'rmsnorm', eps, 1);
  const layers: LayerSpec[] = [];
  for (let l = 0; l < L; l++) {
    const p = `${pre}layers.${l}`;
    const mlp: LayerSpec['mlp'] = {
      kind: 'gated',
      gate: linear(t, `${p}.mlp.gate_proj`, M, D),
      up: linear(t, `${p}.mlp.up_proj`, M, D),
      down: linear(t, `${p}.mlp.down_proj`, D, M),
      act: 'silu',
    };
    const layer: LayerSpec = {
      ln1: rms(`${p}.input_layernorm`),
      ln2: rms(`${p}.post_attention_layernorm`),
      mlp,
      parallel: false,
    };
    if (types[l] === 'linear_attention') {
      const a = `${p}.linear_attn`;
      const C = 2 * Hk * Dk + Hv * Dv;
      const lin = (name: string, out: number, inp: number): LinearRef => linear(t, `${a}.${name}`, out, inp, false);
      layer.linearAttn = {
        qkv: lin('in_proj_qkv', C, D),
        z: lin('in_proj_z', Hv * Dv, D),
        b: lin('in_proj_b', Hv, D),
        a: lin('in_proj_a', Hv, D),
        conv: need(t, `${a}.conv1d.weight`, [C, 1, K]),
        convKernel: K,
        aLog: need(t, `${a}.A_log`, [Hv]),
        dtBias: need(t, `${a}.dt_bias`, [Hv]),
        norm: norm(t, `${a}.norm`, Dv, 'rmsnorm', eps, 0),
        out: lin('out_proj', D, Hv * Dv),
        nKHeads: Hk,
        nVHeads: Hv,
        dK: Dk,
        dV: Dv,
      };
    } else {
      const a = `${p}.self_attn`;
      layer.attn = {
        qkv: {
          kind: 'separate',
          q: linear(t, `${a}.q_proj`, 2 * H * Dh, D),
          k: linear(t, `${a}.k_proj`, Hkv * Dh, D),
          v: linear(t, `${a}.v_proj`, Hkv * Dh, D),
        },
        o: linear(t, `${a}.o_proj`, D, H * Dh),
        qNorm: rms(`${a}.q_norm`, Dh),
        kNorm: rms(`${a}.k_norm`, Dh),
        qkNormWidth: 'head',
        scale: 1 / Math.sqrt(Dh),
        softcap: null,
        slidingWindow: null,
        outputGate: true,
      };
    }
    layers.push(layer);
  }
  const embedName = need(t, `${pre}embed_tokens.weight`, [V, D]);
  return {
    family: 'qwen3_5',
    ...sizes(c, { L, D, H, Hkv, Dh, M, V, nCtx }),
    norm: 'rmsnorm',
    embed: { w: embedName, scale: 1 },
    rotary: { theta, dim: rd, scaling: null },
    layers,
    lnFinal: rms(`${pre}norm`),
    unembed: { w: tied ? embedName : need(t, 'lm_head.weight', [V, D]) },
    finalSoftcap: null,
    bosTokenId: c.bos_token_id,
    eosTokenId: Array.isArray(c.eos_token_id) ? c.eos_token_id[0] : c.eos_token_id,
  };
}

/** a multimodal checkpoint's text-model tensors (the rest is the vision tower and the mtp head) */
qwen3_5.textTensors = (config: Config) =>
  config.model_type === 'qwen3_5'
    ? (name: string) => name.startsWith(PREFIX.multimodal) || name === 'lm_head.weight'
    : null;
