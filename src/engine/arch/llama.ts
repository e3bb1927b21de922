/**
 * Llama (also Mistral, SmolLM): RMSNorm, rotary (rotate_half), grouped-query attention, SwiGLU.
 * `llamaLike` is the shared decoder that qwen2/qwen3/gemma/gemma2/gemma3/phi3/olmo2 adapt with
 * their own options. It reads every config.json field before the first tensor, so a config it
 * cannot run is refused from config.json alone (arch/index.ts checkConfig).
 */
import { LoupeError } from '../errors';
import type { ModelSpec, LayerSpec, LinearRef, NormSpec, RotarySpec } from '../spec';
import {
  type AdapterInput,
  type Config,
  dim,
  num,
  need,
  linear,
  norm,
  activation,
  ropeScaling,
  roundToStoredDtype,
  unsupportedConfig,
  sizes,
} from './common';
import { type MoeOptions, moeConfig, moeLayer } from './moe';

export interface LlamaLikeOptions {
  family: string;
  /** Gemma: norms multiply by (1 + w) */
  normOffset?: 0 | 1;
  /** Gemma: embeddings scaled by sqrt(d_model), in float32 (Gemma, Gemma 2) or cast to the embedding's stored dtype (Gemma 3) */
  embedScale?: boolean | 'weight_dtype';
  /** an RMSNorm of q and k before rotary: over each head's Dh (Qwen3, Gemma 3) or the whole projection (OLMo 2) */
  qkNorm?: 'head' | 'full';
  /** pre: a norm before attention and before the MLP (Llama); sandwich: also after each (Gemma 2, 3); post: after each only (OLMo 2) */
  norms?: 'pre' | 'sandwich' | 'post';
  /** Gemma2: tanh soft-capping of attention scores and of the final logits (attn_/final_logit_softcapping) */
  softcap?: boolean;
  /** Gemma2: queries scaled by query_pre_attn_scalar^-1/2 instead of d_head^-1/2 */
  queryPreAttnScalar?: boolean;
  /** Gemma2: without config.layer_types, even layers use sliding-window attention and odd layers global */
  alternatingSlidingWindow?: boolean;
  /** Gemma 3: without config.layer_types, layer l slides unless (l + 1) % sliding_window_pattern == 0 (this the default pattern) */
  slidingWindowPattern?: number;
  /** Phi-3: config.sliding_window (when set) applies to every layer */
  slidingWindowAll?: boolean;
  /** Gemma 3: the sliding layers rotate with their own base, config[key] (never scaled); rope_scaling applies to the global layers only */
  localRopeBase?: { key: string; fallback: number };
  /** Phi-3: one fused projection per block, rows q | k | v (`self_attn.qkv_proj`) and gate | up (`mlp.gate_up_proj`) */
  fused?: boolean;
  /** tensor name prefix of the decoder (Gemma 3's multimodal checkpoints: `language_model.model.`) */
  prefix?: string;
  /** the untied unembedding's tensor */
  lmHead?: string;
  defaultAct?: string;
  /** which config key holds the activation */
  actKeys?: string[];
  defaultTied?: boolean;
  /** a mixture-of-experts MLP in every layer (arch/moe.ts) instead of the dense one */
  moe?: MoeOptions;
  /** GPT-OSS: a learned sink logit per head in each attention softmax (`self_attn.sinks` [H]) */
  sinks?: boolean;
}

const LAYER_TYPES = ['sliding_attention', 'full_attention'];

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
    return c.layer_types.map((k: unknown, l: number) => {
      if (typeof k !== 'string' || !LAYER_TYPES.includes(k))
        throw unsupportedConfig(`layer_types[${l}]`, k, LAYER_TYPES.join(', '));
      return k === 'sliding_attention' ? w : null;
    });
  }
  if (opts.alternatingSlidingWindow) return Array.from({ length: L }, (_, l) => (l % 2 === 0 ? w : null)); // HF Gemma2: even layers slide
  if (opts.slidingWindowPattern) {
    // HF Gemma3TextConfig: layer_types from `sliding_window_pattern` (default 6): full every p-th layer
    const p = num(c, ['sliding_window_pattern'], opts.slidingWindowPattern);
    if (!Number.isInteger(p) || p < 1) throw unsupportedConfig('sliding_window_pattern', p, 'a positive integer');
    return Array.from({ length: L }, (_, l) => ((l + 1) % p !== 0 ? w : null));
  }
  if (opts.slidingWindowAll || c.model_type === 'mistral') return Array.from({ length: L }, () => w);
  if (c.use_sliding_window && w !== null) {
    const from = typeof c.max_window_layers === 'number' ? c.max_window_layers : 0;
    return Array.from({ length: L }, (_, l) => (l >= from ? w : null));
  }
  return Array.from({ length: L }, () => null);
}

export function llamaLike(input: AdapterInput, opts: LlamaLikeOptions): ModelSpec {
  const { config: c, tensors: t } = input;
  // ---- config.json, all of it before the first tensor
  const D = dim(c, ['hidden_size'], 'maxDModel');
  const L = dim(c, ['num_hidden_layers'], 'maxLayers');
  const H = dim(c, ['num_attention_heads'], 'maxHeads');
  const Hkv = dim(c, ['num_key_value_heads'], 'maxHeads', H);
  const V = dim(c, ['vocab_size'], 'maxVocab');
  const moe = opts.moe ? moeConfig(c, opts.moe) : undefined;
  const M = moe ? moe.width : dim(c, ['intermediate_size'], 'maxDMlp');
  const Dh = dim(c, ['head_dim'], 'maxDHead', D / H);
  const nCtx = dim(c, ['max_position_embeddings'], 'maxPositions', 2048);
  const eps = num(c, ['rms_norm_eps'], 1e-6);
  const off = opts.normOffset ?? 0;
  const norms = opts.norms ?? 'pre';
  const pre = opts.prefix ?? 'model.';
  let actName: string | undefined;
  for (const k of opts.actKeys ?? ['hidden_act'])
    if (typeof c[k] === 'string') {
      actName = c[k];
      break;
    }
  const act = activation(actName, opts.defaultAct ?? 'silu');
  const slide = slidingLayers(c, L, opts);
  const scale =
    opts.queryPreAttnScalar && typeof c.query_pre_attn_scalar === 'number'
      ? c.query_pre_attn_scalar ** -0.5
      : 1 / Math.sqrt(Dh);
  const softcap = opts.softcap && typeof c.attn_logit_softcapping === 'number' ? c.attn_logit_softcapping : null;
  const rd = Math.floor(Dh * (c.partial_rotary_factor ?? 1));
  if (!(rd > 0) || rd % 2 !== 0 || rd > Dh)
    throw unsupportedConfig(
      'partial_rotary_factor',
      c.partial_rotary_factor,
      `a factor giving even rotary dims ≤ head_dim ${Dh}`,
    );
  const rotary: RotarySpec = { theta: num(c, ['rope_theta'], 10000), dim: rd, scaling: ropeScaling(c, rd) };
  const rotaryLocal: RotarySpec | undefined = opts.localRopeBase
    ? { theta: num(c, [opts.localRopeBase.key], opts.localRopeBase.fallback), dim: rd, scaling: null }
    : undefined;
  const tied = c.tie_word_embeddings ?? opts.defaultTied ?? false;

  // ---- tensors
  const rms = (prefix: string, d = D): NormSpec => norm(t, prefix, d, 'rmsnorm', eps, off);
  /** rows [start, start + count) of a fused [out, in] projection */
  const rowsOf = (ref: LinearRef, start: number, count: number): LinearRef => ({ ...ref, rows: { start, count } });
  const layers: LayerSpec[] = [];
  for (let l = 0; l < L; l++) {
    const p = `${pre}layers.${l}`;
    let q: LinearRef, k: LinearRef, v: LinearRef;
    let gate: LinearRef | undefined, up: LinearRef | undefined;
    if (opts.fused) {
      const qkv = linear(t, `${p}.self_attn.qkv_proj`, (H + 2 * Hkv) * Dh, D);
      [q, k, v] = [rowsOf(qkv, 0, H * Dh), rowsOf(qkv, H * Dh, Hkv * Dh), rowsOf(qkv, (H + Hkv) * Dh, Hkv * Dh)];
      const gateUp = linear(t, `${p}.mlp.gate_up_proj`, 2 * M, D); // HF Phi3MLP: `gate, up = gate_up.chunk(2, -1)`
      [gate, up] = [rowsOf(gateUp, 0, M), rowsOf(gateUp, M, M)];
    } else {
      q = linear(t, `${p}.self_attn.q_proj`, H * Dh, D);
      k = linear(t, `${p}.self_attn.k_proj`, Hkv * Dh, D);
      v = linear(t, `${p}.self_attn.v_proj`, Hkv * Dh, D);
      if (!moe) {
        gate = linear(t, `${p}.mlp.gate_proj`, M, D);
        up = linear(t, `${p}.mlp.up_proj`, M, D);
      }
    }
    const qkFull = opts.qkNorm === 'full';
    const layer: LayerSpec = {
      attn: {
        qkv: { kind: 'separate', q, k, v },
        o: linear(t, `${p}.self_attn.o_proj`, D, H * Dh),
        ...(opts.qkNorm
          ? {
              qNorm: rms(`${p}.self_attn.q_norm`, qkFull ? H * Dh : Dh),
              kNorm: rms(`${p}.self_attn.k_norm`, qkFull ? Hkv * Dh : Dh),
              qkNormWidth: opts.qkNorm,
            }
          : {}),
        ...(rotaryLocal && slide[l] !== null ? { localRotary: true } : {}),
        scale,
        softcap,
        slidingWindow: slide[l],
        ...(opts.sinks ? { sinks: { w: need(t, `${p}.self_attn.sinks`, [H]) } } : {}),
      },
      ...(moe
        ? { moe: opts.moe!.layer ? opts.moe!.layer(t, p, D, moe) : moeLayer(t, p, D, moe, opts.moe!, act) }
        : { mlp: { kind: 'gated' as const, gate, up: up!, down: linear(t, `${p}.mlp.down_proj`, D, M), act } }),
      parallel: false,
    };
    if (norms !== 'post') {
      layer.ln1 = rms(`${p}.input_layernorm`);
      layer.ln2 = rms(norms === 'sandwich' ? `${p}.pre_feedforward_layernorm` : `${p}.post_attention_layernorm`);
    }
    if (norms !== 'pre') {
      // HF names the norm after attention post_attention_layernorm in Gemma 2/3 and OLMo 2 alike
      layer.postAttnNorm = rms(`${p}.post_attention_layernorm`);
      layer.postMlpNorm = rms(`${p}.post_feedforward_layernorm`);
    }
    layers.push(layer);
  }
  const embedName = need(t, `${pre}embed_tokens.weight`, [V, D]);
  let embedScale = 1;
  // HF Gemma, Gemma 2: sqrt(hidden_size) in the model dtype (float32 here); Gemma 3: `embed_scale.to(weight.dtype)`
  if (opts.embedScale === true) embedScale = Math.fround(Math.sqrt(D));
  if (opts.embedScale === 'weight_dtype') embedScale = roundToStoredDtype(Math.sqrt(D), t.get(embedName)!.dtype);
  return {
    family: opts.family,
    ...sizes(c, { L, D, H, Hkv, Dh, M, V, nCtx }),
    ...(moe ? { nExperts: moe.E, topK: moe.k } : {}),
    norm: 'rmsnorm',
    embed: { w: embedName, scale: embedScale },
    rotary,
    ...(rotaryLocal ? { rotaryLocal } : {}),
    layers,
    lnFinal: rms(`${pre}norm`),
    // Tied models use the embedding even when a copy of lm_head is stored (as HF's tie_weights does).
    unembed: { w: tied ? embedName : need(t, opts.lmHead ?? 'lm_head.weight', [V, D]) },
    finalSoftcap: opts.softcap && typeof c.final_logit_softcapping === 'number' ? c.final_logit_softcapping : null,
    bosTokenId: c.bos_token_id,
    eosTokenId: Array.isArray(c.eos_token_id) ? c.eos_token_id[0] : c.eos_token_id,
  };
}

export function llama(input: AdapterInput): ModelSpec {
  return llamaLike(input, { family: 'llama' });
}
