/**
 * Gemma 3: Gemma 2's sandwich norms, (1 + w) RMSNorms and tanh GeGLU, plus q_norm / k_norm per head
 * before rotary, five sliding layers to one global (`layer_types`, else `sliding_window_pattern`),
 * the sliding layers' own rope base (`rope_local_base_freq`), rope_scaling on the global layers
 * only, and the embedding scale cast to the embedding's dtype (transformers' modeling_gemma3.py,
 * configuration_gemma3.py). `gemma3_text` (Gemma3ForCausalLM: 270M, 1B) is the decoder itself;
 * `gemma3` (Gemma3ForConditionalGeneration: 4B, 12B, 27B) nests it in `text_config` with its
 * weights under `language_model.model.` (or `model.language_model.`), and its vision tower is
 * never read.
 */
import { LoupeError } from '../errors';
import type { ModelSpec } from '../spec';
import { type AdapterInput, type Config, nestedTextConfig, unsupportedConfig } from './common';
import { llamaLike } from './llama';

/** Gemma3TextConfig's defaults (configuration_gemma3.py): the multimodal configs leave most of them out */
const TEXT_DEFAULTS: Config = {
  vocab_size: 262_208,
  hidden_size: 2304,
  intermediate_size: 9216,
  num_hidden_layers: 26,
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
  rope_theta: 1_000_000,
  query_pre_attn_scalar: 256,
  sliding_window: 4096,
  rope_local_base_freq: 10_000,
  final_logit_softcapping: null,
  attn_logit_softcapping: null,
};

/** the two checkpoint layouts of Gemma3ForConditionalGeneration (its `_checkpoint_conversion_mapping`) */
const MULTIMODAL_PREFIXES = [
  { prefix: 'language_model.model.', lmHead: 'language_model.lm_head.weight' },
  { prefix: 'model.language_model.', lmHead: 'lm_head.weight' },
];

/** the text decoder's config: text_config of a multimodal config, the config itself otherwise, with HF's defaults */
export function gemma3TextConfig(config: Config): Config {
  const c = nestedTextConfig(
    config,
    { outer: 'gemma3', text: 'gemma3_text', name: 'multimodal Gemma 3', cls: 'Gemma3ForConditionalGeneration' },
    TEXT_DEFAULTS,
  );
  if (c.use_bidirectional_attention === true)
    throw unsupportedConfig(
      'use_bidirectional_attention',
      true,
      'false (causal attention; EmbeddingGemma is an encoder)',
    );
  // transformers 5 writes rope_parameters per layer type instead of rope_theta / rope_local_base_freq / rope_scaling
  const rp = c.rope_parameters;
  if (rp && typeof rp === 'object' && ('full_attention' in rp || 'sliding_attention' in rp)) {
    const full = rp.full_attention ?? {};
    const local = rp.sliding_attention ?? {};
    const localType = local.rope_type ?? local.type ?? 'default';
    if (localType !== 'default')
      throw unsupportedConfig(
        'rope_parameters.sliding_attention.rope_type',
        localType,
        'default (the sliding layers are never scaled)',
      );
    if (typeof full.rope_theta === 'number') c.rope_theta = full.rope_theta;
    if (typeof local.rope_theta === 'number') c.rope_local_base_freq = local.rope_theta;
    const { rope_theta: _theta, ...scaling } = full;
    c.rope_scaling = (scaling.rope_type ?? scaling.type ?? 'default') === 'default' ? null : scaling;
  }
  return c;
}

export function gemma3(input: AdapterInput): ModelSpec {
  const c = gemma3TextConfig(input.config);
  const build = (tensors: AdapterInput['tensors'], layout: { prefix: string; lmHead: string }) =>
    llamaLike(
      { config: c, tensors },
      {
        family: 'gemma3',
        normOffset: 1,
        embedScale: 'weight_dtype',
        qkNorm: 'head',
        norms: 'sandwich',
        softcap: true,
        queryPreAttnScalar: true,
        slidingWindowPattern: 6,
        localRopeBase: { key: 'rope_local_base_freq', fallback: 10_000 },
        defaultAct: 'gelu_pytorch_tanh',
        actKeys: ['hidden_activation'],
        defaultTied: true,
        ...layout,
      },
    );
  if (input.config.model_type !== 'gemma3') return build(input.tensors, { prefix: 'model.', lmHead: 'lm_head.weight' });
  const found = MULTIMODAL_PREFIXES.find((p) => input.tensors.has(`${p.prefix}embed_tokens.weight`));
  if (!found) {
    // text_config is judged first (llamaLike reads all of it before its first tensor), then the missing text model
    try {
      build(new Map(), MULTIMODAL_PREFIXES[0]);
    } catch (e) {
      if (!(e instanceof LoupeError && e.code === 'MISSING_TENSOR')) throw e;
    }
    throw new LoupeError(
      'MISSING_TENSOR',
      "This multimodal Gemma 3 checkpoint's text model is not in its weights: neither " +
        'language_model.model.embed_tokens.weight nor model.language_model.embed_tokens.weight is there.',
      'Loupe runs the text path of Gemma3ForConditionalGeneration; check that the repository is a complete transformers checkpoint.',
      { tensor: 'language_model.model.embed_tokens.weight' },
    );
  }
  return build(input.tensors, found);
}

/** a multimodal checkpoint's text-model tensors (the rest is the vision tower and its projector) */
gemma3.textTensors = (config: Config) =>
  config.model_type === 'gemma3'
    ? (name: string) => MULTIMODAL_PREFIXES.some((p) => name.startsWith(p.prefix) || name === p.lmHead)
    : null;
