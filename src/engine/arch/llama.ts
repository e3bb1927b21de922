/**
 * Llama (also Mistral, SmolLM): RMSNorm, rotary (rotate_half), grouped-query attention, SwiGLU.
 * `llamaLike` is the shared decoder that qwen2/qwen3/gemma/gemma2 adapt with their own options.
 */
import type { ModelSpec, LayerSpec, NormSpec } from '../spec';
import { LoupeError } from '../errors';
import { type AdapterInput, type Config, dim, num, need, linear, norm, activation, ropeScaling } from './common';

export interface LlamaLikeOptions {
  family: string;
  /** Gemma: norms multiply by (1 + w) */
  normOffset?: 0 | 1;
  /** Gemma: embeddings scaled by sqrt(d_model) */
  embedScale?: boolean;
  /** Qwen3: an RMSNorm over each head's queries and keys (q_norm, k_norm) before rotary */
  qkNorm?: boolean;
  /** Gemma2: sandwich norms, i.e. a norm after attention and after the MLP as well as before each */
  sandwichNorms?: boolean;
  /** Gemma2: tanh soft-capping of attention scores and of the final logits (attn_/final_logit_softcapping) */
  softcap?: boolean;
  /** Gemma2: queries scaled by query_pre_attn_scalar^-1/2 instead of d_head^-1/2 */
  queryPreAttnScalar?: boolean;
  /** Gemma2: without config.layer_types, even layers use sliding-window attention and odd layers global */
  alternatingSlidingWindow?: boolean;
  defaultAct?: string;
  /** which config key holds the activation */
  actKeys?: string[];
  defaultTied?: boolean;
}

function slidingLayers(c: Config, L: number, opts: LlamaLikeOptions): (number | null)[] {
  const w = typeof c.sliding_window === 'number' ? c.sliding_window : null;
  if (Array.isArray(c.layer_types)) {
    if (c.layer_types.length !== L)
      throw new LoupeError(
        'BAD_CONFIG',
        `config.json: layer_types lists ${c.layer_types.length} layers but num_hidden_layers is ${L}.`,
        "The model's config.json is damaged.",
        { field: 'layer_types' },
      );
    return c.layer_types.map((k: string) => (k === 'sliding_attention' ? w : null));
  }
  if (opts.alternatingSlidingWindow) return Array.from({ length: L }, (_, l) => (l % 2 === 0 ? w : null)); // HF Gemma2: even layers slide
  if (c.use_sliding_window && w !== null) {
    const from = typeof c.max_window_layers === 'number' ? c.max_window_layers : 0;
    return Array.from({ length: L }, (_, l) => (l >= from ? w : null));
  }
  if (c.model_type === 'mistral' && w !== null) return Array.from({ length: L }, () => w);
  return Array.from({ length: L }, () => null);
}

export function llamaLike(input: AdapterInput, opts: LlamaLikeOptions): ModelSpec {
  const { config: c, tensors: t } = input;
  const D = dim(c, ['hidden_size'], 'maxDModel');
  const L = dim(c, ['num_hidden_layers'], 'maxLayers');
  const H = dim(c, ['num_attention_heads'], 'maxHeads');
  const Hkv = dim(c, ['num_key_value_heads'], 'maxHeads', H);
  const V = dim(c, ['vocab_size'], 'maxVocab');
  const M = dim(c, ['intermediate_size'], 'maxDMlp');
  const Dh = dim(c, ['head_dim'], 'maxDHead', D / H);
  const nCtx = dim(c, ['max_position_embeddings'], 'maxPositions', 2048);
  const eps = num(c, ['rms_norm_eps'], 1e-6);
  const off = opts.normOffset ?? 0;
  let actName: string | undefined;
  for (const k of opts.actKeys ?? ['hidden_act'])
    if (typeof c[k] === 'string') {
      actName = c[k];
      break;
    }
  const act = activation(actName, opts.defaultAct ?? 'silu');
  const rms = (prefix: string, d = D): NormSpec => norm(t, prefix, d, 'rmsnorm', eps, off);
  const slide = slidingLayers(c, L, opts);
  const scale =
    opts.queryPreAttnScalar && typeof c.query_pre_attn_scalar === 'number'
      ? c.query_pre_attn_scalar ** -0.5
      : 1 / Math.sqrt(Dh);
  const softcap = opts.softcap && typeof c.attn_logit_softcapping === 'number' ? c.attn_logit_softcapping : null;
  const layers: LayerSpec[] = [];
  for (let l = 0; l < L; l++) {
    const p = `model.layers.${l}`;
    const layer: LayerSpec = {
      ln1: rms(`${p}.input_layernorm`),
      ln2: rms(opts.sandwichNorms ? `${p}.pre_feedforward_layernorm` : `${p}.post_attention_layernorm`),
      attn: {
        qkv: {
          kind: 'separate',
          q: linear(t, `${p}.self_attn.q_proj`, H * Dh, D),
          k: linear(t, `${p}.self_attn.k_proj`, Hkv * Dh, D),
          v: linear(t, `${p}.self_attn.v_proj`, Hkv * Dh, D),
        },
        o: linear(t, `${p}.self_attn.o_proj`, D, H * Dh),
        qNorm: opts.qkNorm ? rms(`${p}.self_attn.q_norm`, Dh) : undefined,
        kNorm: opts.qkNorm ? rms(`${p}.self_attn.k_norm`, Dh) : undefined,
        scale,
        softcap,
        slidingWindow: slide[l],
      },
      mlp: {
        kind: 'gated',
        gate: linear(t, `${p}.mlp.gate_proj`, M, D),
        up: linear(t, `${p}.mlp.up_proj`, M, D),
        down: linear(t, `${p}.mlp.down_proj`, D, M),
        act,
      },
      parallel: false,
    };
    if (opts.sandwichNorms) {
      layer.postAttnNorm = rms(`${p}.post_attention_layernorm`);
      layer.postMlpNorm = rms(`${p}.post_feedforward_layernorm`);
    }
    layers.push(layer);
  }
  const embed = need(t, 'model.embed_tokens.weight', [V, D]);
  const tied = c.tie_word_embeddings ?? opts.defaultTied ?? false;
  return {
    family: opts.family,
    modelType: c.model_type,
    nLayers: L,
    dModel: D,
    nHeads: H,
    nKvHeads: Hkv,
    dHead: Dh,
    dMlp: M,
    dVocab: V,
    nCtx,
    norm: 'rmsnorm',
    // HF Gemma casts sqrt(hidden_size) to the model dtype; in float32 that is Math.fround.
    embed: { w: embed, scale: opts.embedScale ? Math.fround(Math.sqrt(D)) : 1 },
    rotary: {
      theta: num(c, ['rope_theta'], 10000),
      dim: Math.floor(Dh * (c.partial_rotary_factor ?? 1)),
      scaling: ropeScaling(c),
    },
    layers,
    lnFinal: rms('model.norm'),
    // Tied models use the embedding even when a copy of lm_head is stored (as HF's tie_weights does).
    unembed: { w: tied ? embed : need(t, 'lm_head.weight', [V, D]) },
    finalSoftcap: opts.softcap && typeof c.final_logit_softcapping === 'number' ? c.final_logit_softcapping : null,
    bosTokenId: c.bos_token_id,
    eosTokenId: Array.isArray(c.eos_token_id) ? c.eos_token_id[0] : c.eos_token_id,
  };
}

export function llama(input: AdapterInput): ModelSpec {
  return llamaLike(input, { family: 'llama' });
}
