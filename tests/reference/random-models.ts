// Random-weight test models in the exact Hugging Face on-disk layout (config.json field names,
// safetensors tensor names and layouts, tokenizer.json, tokenizer_config.json) for every family
// Loupe supports. Shares no code with src/.

import { mkdtempSync, mkdirSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { encodeSafetensors, roundToDtype, type StDtype } from './safetensors-io';
import { makeTokenizer, type TokenizerSpec, type GeneratedTokenizer, writeTokenizerFiles } from './tokenizer-gen';
import type { Family } from './forward64';

export type { Family } from './forward64';

export interface RandomModelOptions {
  seed?: number;
  dModel?: number;
  nLayers?: number;
  nHeads?: number;
  /** GQA / MQA: fewer key-value heads (llama, qwen2, qwen3, gemma, gemma2) */
  nKvHeads?: number;
  /** explicit head_dim (llama, qwen3, gemma, gemma2); default d_model / n_heads */
  headDim?: number;
  dMlp?: number;
  vocabSize?: number;
  /** n_positions (gpt2) / max_position_embeddings */
  maxPositions?: number;
  tied?: boolean;
  /** write tie_word_embeddings into config.json (default true); false leaves the family default */
  writeTieField?: boolean;
  /** attention_bias (llama, qwen3, gemma, gemma2, gpt_neox; qwen2 always has q/k/v bias) */
  attentionBias?: boolean;
  /** mlp_bias (llama) */
  mlpBias?: boolean;
  /** gpt_neox rotary_pct */
  rotaryPct?: number;
  /** gpt_neox use_parallel_residual */
  parallelResidual?: boolean;
  ropeTheta?: number;
  ropeScaling?: Record<string, unknown> | null;
  /** activation_function (gpt2) / hidden_act (others; gemma also hidden_activation) */
  activation?: string;
  attnSoftcap?: number | null;
  finalSoftcap?: number | null;
  slidingWindow?: number | null;
  queryPreAttnScalar?: number;
  /** gemma2: write the newer `layer_types` list (else HF's default: even layers slide); gemma3: the pattern's list */
  writeLayerTypes?: boolean;
  /** gemma3: sliding_window_pattern (default: leave it out, HF's 6) */
  slidingWindowPattern?: number;
  /** gemma3: rope_local_base_freq (default: leave it out, HF's 10000) */
  ropeLocalBase?: number;
  /**
   * gemma3: a Gemma3ForConditionalGeneration checkpoint (model_type gemma3, text_config nested with
   * HF's defaults left out, a small stand-in vision tower) with the text weights under this prefix
   */
  multimodal?: 'language_model.model.' | 'model.language_model.';
  /** phi3: partial_rotary_factor */
  partialRotary?: number;
  /** phi3: original_max_position_embeddings (top level, as in Phi-3's configs) */
  originalMaxPositions?: number;
  /** an untied lm_head's weights × this: larger logits, so a small relative change in the last residual shows */
  unembedScale?: number;
  /** which shard (0-based) a tensor goes to, instead of splitting by size */
  shardOf?: (tensor: string) => number;
  /** qwen2: a (small) sliding_window with use_sliding_window false, which HF ignores */
  qwen2InactiveSlidingWindow?: number;
  dtype?: 'F32' | 'F16' | 'BF16';
  /** write model-0000k-of-0000n.safetensors shards + model.safetensors.index.json instead of one file */
  shards?: number;
  /** mixture-of-experts families: experts per layer, experts per token, norm_topk_prob (qwen2/3_moe, olmoe) */
  nExperts?: number;
  topK?: number;
  normTopK?: boolean;
  /** qwen2_moe: shared_expert_intermediate_size */
  sharedMlp?: number;
  /** the router's weights × this: larger router logits, so routing is decided by clear margins */
  routerScale?: number;
  /** output directory (default: a fresh temp dir) */
  dir?: string;
  /** words the tokenizer gets merges for first (each one token, with and without a leading space) */
  words?: string[];
}

export interface GeneratedTensor {
  dims: number[];
  /** values exactly as stored (rounded to the file dtype) */
  data: Float32Array;
}

export interface RandomModel {
  dir: string;
  family: Family;
  config: Record<string, any>;
  tensors: Record<string, GeneratedTensor>;
  dtype: StDtype;
  tokenizer: GeneratedTokenizer;
  bosId: number;
  /** delete the directory */
  cleanup(): void;
}

// ---------------------------------------------------------------- seeded RNG

export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function gaussian(rand: () => number): () => number {
  return () => {
    let u = 0;
    while (u === 0) u = rand();
    const v = rand();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  };
}

/** Deterministic random token ids in [lo, hi). */
export function randomTokens(n: number, hi: number, seed = 1, lo = 0): number[] {
  const r = mulberry32(seed);
  return Array.from({ length: n }, () => lo + Math.floor(r() * (hi - lo)));
}

// ---------------------------------------------------------------- family defaults

const TOKENIZERS: Record<Family, Omit<TokenizerSpec, 'modelMaxLength'> & { kindSmall?: 'char' }> = {
  gpt2: {
    kind: 'bytelevel',
    specials: ['<|endoftext|>'],
    bos: '<|endoftext|>',
    eos: '<|endoftext|>',
    unk: '<|endoftext|>',
    addBos: false,
    tokenizerClass: 'GPT2Tokenizer',
  },
  gpt_neox: {
    kind: 'bytelevel',
    specials: ['<|endoftext|>', '<|padding|>'],
    bos: '<|endoftext|>',
    eos: '<|endoftext|>',
    unk: '<|endoftext|>',
    addBos: false,
    tokenizerClass: 'GPTNeoXTokenizer',
  },
  qwen2: {
    kind: 'bytelevel',
    specials: ['<|endoftext|>', '<|im_start|>', '<|im_end|>'],
    bos: '<|endoftext|>',
    eos: '<|endoftext|>',
    pad: '<|endoftext|>',
    addBos: false,
    tokenizerClass: 'Qwen2Tokenizer',
  },
  qwen3: {
    kind: 'bytelevel',
    specials: ['<|endoftext|>', '<|im_start|>', '<|im_end|>'],
    bos: '<|endoftext|>',
    eos: '<|im_end|>',
    pad: '<|endoftext|>',
    addBos: false,
    tokenizerClass: 'Qwen2Tokenizer',
  },
  llama: {
    kind: 'char',
    specials: ['<unk>', '<s>', '</s>'],
    bos: '<s>',
    eos: '</s>',
    unk: '<unk>',
    addBos: true,
    tokenizerClass: 'LlamaTokenizer',
  },
  gemma: {
    kind: 'char',
    specials: ['<pad>', '<eos>', '<bos>', '<unk>'],
    bos: '<bos>',
    eos: '<eos>',
    unk: '<unk>',
    pad: '<pad>',
    addBos: true,
    tokenizerClass: 'GemmaTokenizer',
  },
  gemma2: {
    kind: 'char',
    specials: ['<pad>', '<eos>', '<bos>', '<unk>'],
    bos: '<bos>',
    eos: '<eos>',
    unk: '<unk>',
    pad: '<pad>',
    addBos: true,
    tokenizerClass: 'GemmaTokenizer',
  },
  gemma3: {
    kind: 'char',
    specials: ['<pad>', '<eos>', '<bos>', '<unk>'],
    bos: '<bos>',
    eos: '<eos>',
    unk: '<unk>',
    pad: '<pad>',
    addBos: true,
    tokenizerClass: 'GemmaTokenizerFast',
  },
  phi3: {
    kind: 'char',
    specials: ['<unk>', '<s>', '</s>', '<|endoftext|>'],
    bos: '<s>',
    eos: '<|endoftext|>',
    unk: '<unk>',
    addBos: false,
    tokenizerClass: 'LlamaTokenizer',
  },
  olmo2: {
    kind: 'bytelevel',
    specials: ['<|endoftext|>', '<|pad|>'],
    bos: '<|endoftext|>',
    eos: '<|endoftext|>',
    pad: '<|pad|>',
    addBos: true,
    tokenizerClass: 'GPT2Tokenizer',
  },
  mixtral: {
    kind: 'char',
    specials: ['<unk>', '<s>', '</s>'],
    bos: '<s>',
    eos: '</s>',
    unk: '<unk>',
    addBos: true,
    tokenizerClass: 'LlamaTokenizer',
  },
  qwen2_moe: {
    kind: 'bytelevel',
    specials: ['<|endoftext|>', '<|im_start|>', '<|im_end|>'],
    bos: '<|endoftext|>',
    eos: '<|endoftext|>',
    addBos: false,
    tokenizerClass: 'Qwen2Tokenizer',
  },
  qwen3_moe: {
    kind: 'bytelevel',
    specials: ['<|endoftext|>', '<|im_start|>', '<|im_end|>'],
    bos: '<|endoftext|>',
    eos: '<|endoftext|>',
    addBos: false,
    tokenizerClass: 'Qwen2Tokenizer',
  },
  olmoe: {
    kind: 'bytelevel',
    specials: ['<|endoftext|>', '<|pad|>'],
    bos: '<|endoftext|>',
    eos: '<|endoftext|>',
    pad: '<|pad|>',
    addBos: true,
    tokenizerClass: 'GPT2Tokenizer',
  },
};

// ---------------------------------------------------------------- the generator

export function makeRandomModel(family: Family, options: RandomModelOptions = {}): RandomModel {
  const o = options;
  const rand = mulberry32(o.seed ?? 1234);
  const randn = gaussian(rand);
  const dtype: StDtype = o.dtype ?? 'F32';
  const D = o.dModel ?? 48;
  const L = o.nLayers ?? 2;
  const H = o.nHeads ?? 4;
  const Hkv = o.nKvHeads ?? H;
  const Dh = o.headDim ?? D / H;
  const V =
    o.vocabSize ??
    (family === 'llama' || family === 'gemma' || family === 'gemma2' || family === 'gemma3' || family === 'phi3'
      ? 96
      : 300);
  const P = o.maxPositions ?? 64;
  if (!Number.isInteger(Dh)) throw new Error('makeRandomModel: head dim must be an integer');
  if (H % Hkv !== 0) throw new Error('makeRandomModel: n_heads must be a multiple of n_kv_heads');
  if ((family === 'gpt2' || family === 'gpt_neox') && (Hkv !== H || (o.headDim && o.headDim !== D / H)))
    throw new Error(`makeRandomModel: ${family} has neither GQA nor an explicit head_dim`);

  const gated = !(family === 'gpt2' || family === 'gpt_neox');
  const M = o.dMlp ?? (gated ? Math.round((8 * D) / 3 / 8) * 8 : 4 * D);
  const gemma = family === 'gemma' || family === 'gemma2' || family === 'gemma3';
  const tied = o.tied ?? (family === 'gpt_neox' ? false : gemma || family === 'gpt2' ? true : false);
  if ((family === 'gemma' || family === 'gemma2') && !tied)
    throw new Error('makeRandomModel: Gemma and Gemma 2 models always tie their embeddings');

  const tensors: Record<string, GeneratedTensor> = {};
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
  const W = (name: string, dims: number[], fanIn: number) => put(name, dims, normal(1 / Math.sqrt(fanIn)));
  const bias = (name: string, n: number) => put(name, [n], normal(0.2));
  const normW = (name: string, n: number) => put(name, [n], gemma ? normal(0.2) : normal(0.2, 1));
  const unembedStd = (2.5 * (o.unembedScale ?? 1)) / Math.sqrt(D);

  // tokenizer first (it fixes the special-token ids)
  const tspec = TOKENIZERS[family];
  const kind = tspec.kind === 'bytelevel' && V < 256 + tspec.specials.length ? 'char' : tspec.kind;
  const specials = kind === 'char' && tspec.kind === 'bytelevel' ? ['<unk>', ...tspec.specials] : tspec.specials;
  const tok = makeTokenizer(
    {
      ...tspec,
      kind,
      specials,
      unk: kind === 'char' ? (tspec.unk && specials.includes(tspec.unk) ? tspec.unk : '<unk>') : tspec.unk,
      modelMaxLength: P,
      words: o.words,
    },
    V,
  );
  const bosId = tok.specialIds[tspec.bos];
  const eosId = tok.specialIds[tspec.eos];

  let config: Record<string, any>;
  const torchDtype = dtype === 'F32' ? 'float32' : dtype === 'F16' ? 'float16' : 'bfloat16';

  if (family === 'gpt2') {
    put('transformer.wte.weight', [V, D], normal(0.5));
    put('transformer.wpe.weight', [P, D], normal(0.3));
    for (let l = 0; l < L; l++) {
      const p = `transformer.h.${l}`;
      normW(`${p}.ln_1.weight`, D);
      bias(`${p}.ln_1.bias`, D);
      W(`${p}.attn.c_attn.weight`, [D, 3 * D], D);
      bias(`${p}.attn.c_attn.bias`, 3 * D);
      W(`${p}.attn.c_proj.weight`, [D, D], D);
      bias(`${p}.attn.c_proj.bias`, D);
      normW(`${p}.ln_2.weight`, D);
      bias(`${p}.ln_2.bias`, D);
      W(`${p}.mlp.c_fc.weight`, [D, M], D);
      bias(`${p}.mlp.c_fc.bias`, M);
      W(`${p}.mlp.c_proj.weight`, [M, D], M);
      bias(`${p}.mlp.c_proj.bias`, D);
    }
    normW('transformer.ln_f.weight', D);
    bias('transformer.ln_f.bias', D);
    if (!tied) put('lm_head.weight', [V, D], normal(unembedStd));
    config = {
      architectures: ['GPT2LMHeadModel'],
      model_type: 'gpt2',
      vocab_size: V,
      n_positions: P,
      n_ctx: P,
      n_embd: D,
      n_layer: L,
      n_head: H,
      n_inner: M === 4 * D ? null : M,
      activation_function: o.activation ?? 'gelu_new',
      layer_norm_epsilon: 1e-5,
      resid_pdrop: 0.0,
      embd_pdrop: 0.0,
      attn_pdrop: 0.0,
      initializer_range: 0.02,
      scale_attn_weights: true,
      scale_attn_by_inverse_layer_idx: false,
      reorder_and_upcast_attn: false,
      tie_word_embeddings: tied,
      use_cache: true,
      bos_token_id: bosId,
      eos_token_id: eosId,
    };
  } else if (family === 'gpt_neox') {
    const attnBias = o.attentionBias ?? true;
    put('gpt_neox.embed_in.weight', [V, D], normal(0.5));
    for (let l = 0; l < L; l++) {
      const p = `gpt_neox.layers.${l}`;
      normW(`${p}.input_layernorm.weight`, D);
      bias(`${p}.input_layernorm.bias`, D);
      normW(`${p}.post_attention_layernorm.weight`, D);
      bias(`${p}.post_attention_layernorm.bias`, D);
      // rows: per head h, [q(Dh) | k(Dh) | v(Dh)]  (the [H, 3, Dh] layout)
      W(`${p}.attention.query_key_value.weight`, [3 * D, D], D);
      if (attnBias) bias(`${p}.attention.query_key_value.bias`, 3 * D);
      W(`${p}.attention.dense.weight`, [D, D], D);
      if (attnBias) bias(`${p}.attention.dense.bias`, D);
      W(`${p}.mlp.dense_h_to_4h.weight`, [M, D], D);
      bias(`${p}.mlp.dense_h_to_4h.bias`, M);
      W(`${p}.mlp.dense_4h_to_h.weight`, [D, M], M);
      bias(`${p}.mlp.dense_4h_to_h.bias`, D);
    }
    normW('gpt_neox.final_layer_norm.weight', D);
    bias('gpt_neox.final_layer_norm.bias', D);
    if (!tied) put('embed_out.weight', [V, D], normal(unembedStd));
    config = {
      architectures: ['GPTNeoXForCausalLM'],
      model_type: 'gpt_neox',
      vocab_size: V,
      hidden_size: D,
      num_hidden_layers: L,
      num_attention_heads: H,
      intermediate_size: M,
      hidden_act: o.activation ?? 'gelu',
      rotary_pct: o.rotaryPct ?? 0.25,
      rotary_emb_base: o.ropeTheta ?? 10000,
      max_position_embeddings: P,
      initializer_range: 0.02,
      layer_norm_eps: 1e-5,
      use_cache: true,
      use_parallel_residual: o.parallelResidual ?? true,
      attention_bias: attnBias,
      attention_dropout: 0.0,
      hidden_dropout: 0.0,
      tie_word_embeddings: tied,
      bos_token_id: bosId,
      eos_token_id: eosId,
    };
    if (o.rotaryPct !== undefined && Math.floor(Dh * o.rotaryPct) % 2 !== 0)
      throw new Error('makeRandomModel: rotary dims must be even');
  } else {
    // llama, qwen2, qwen3, gemma, gemma2, gemma3, phi3, olmo2, and the MoE families
    const moe = MOE_FAMILIES.includes(family);
    const qkvBias = family === 'qwen2' || family === 'qwen2_moe' ? true : !!o.attentionBias;
    const oBias = family === 'qwen2' || family === 'qwen2_moe' ? false : !!o.attentionBias;
    const E = o.nExperts ?? 4;
    const K = o.topK ?? 2;
    const mlpBias = family === 'llama' && !!o.mlpBias;
    if (o.mlpBias && family !== 'llama') throw new Error('makeRandomModel: mlp_bias exists only for llama');
    if (o.attentionBias && family === 'phi3') throw new Error('makeRandomModel: phi3 projections have no bias');
    if (o.multimodal && family !== 'gemma3') throw new Error('makeRandomModel: multimodal is gemma3 only');
    const mm = o.multimodal;
    // a stand-in vision tower first, as Gemma3ForConditionalGeneration's state dict has it (never read by the engine)
    if (mm) {
      const v = mm === 'model.language_model.' ? 'model.' : '';
      put(`${v}vision_tower.vision_model.embeddings.patch_embedding.weight`, [D, 3, 4, 4], normal(0.1));
      put(`${v}vision_tower.vision_model.post_layernorm.weight`, [D], normal(0.1, 1));
      put(`${v}multi_modal_projector.mm_input_projection_weight`, [D, D], normal(0.1));
    }
    const pre = mm ?? 'model.';
    const olmo = family === 'olmo2';
    const sandwich = family === 'gemma2' || family === 'gemma3';
    put(`${pre}embed_tokens.weight`, [V, D], normal(gemma ? 1.5 / Math.sqrt(D) : 0.5));
    for (let l = 0; l < L; l++) {
      const p = `${pre}layers.${l}`;
      const a = `${p}.self_attn`;
      if (!olmo) normW(`${p}.input_layernorm.weight`, D);
      if (family === 'phi3') W(`${a}.qkv_proj.weight`, [(H + 2 * Hkv) * Dh, D], D);
      else {
        W(`${a}.q_proj.weight`, [H * Dh, D], D);
        if (qkvBias) bias(`${a}.q_proj.bias`, H * Dh);
        W(`${a}.k_proj.weight`, [Hkv * Dh, D], D);
        if (qkvBias) bias(`${a}.k_proj.bias`, Hkv * Dh);
        W(`${a}.v_proj.weight`, [Hkv * Dh, D], D);
        if (qkvBias) bias(`${a}.v_proj.bias`, Hkv * Dh);
      }
      W(`${a}.o_proj.weight`, [D, H * Dh], H * Dh);
      if (oBias) bias(`${a}.o_proj.bias`, D);
      if (family === 'qwen3' || family === 'qwen3_moe' || family === 'gemma3' || olmo || family === 'olmoe') {
        const qn = olmo || family === 'olmoe' ? H * Dh : Dh;
        const kn = olmo || family === 'olmoe' ? Hkv * Dh : Dh;
        put(`${a}.q_norm.weight`, [qn], gemma ? normal(0.3) : normal(0.2, 1));
        put(`${a}.k_norm.weight`, [kn], gemma ? normal(0.3) : normal(0.2, 1));
      }
      normW(`${p}.post_attention_layernorm.weight`, D);
      if (sandwich) normW(`${p}.pre_feedforward_layernorm.weight`, D);
      if (sandwich || olmo) normW(`${p}.post_feedforward_layernorm.weight`, D);
      if (moe) {
        // HF's per-expert checkpoint layout: router `gate` [E, D], experts.{e}.{gate,up,down} (Mixtral w1, w3, w2)
        const blk = family === 'mixtral' ? `${p}.block_sparse_moe` : `${p}.mlp`;
        const [gn, un, dn] = family === 'mixtral' ? ['w1', 'w3', 'w2'] : ['gate_proj', 'up_proj', 'down_proj'];
        put(`${blk}.gate.weight`, [E, D], normal((o.routerScale ?? 1) / Math.sqrt(D)));
        for (let e = 0; e < E; e++) {
          W(`${blk}.experts.${e}.${gn}.weight`, [M, D], D);
          W(`${blk}.experts.${e}.${un}.weight`, [M, D], D);
          W(`${blk}.experts.${e}.${dn}.weight`, [D, M], M);
        }
        if (family === 'qwen2_moe') {
          const S = o.sharedMlp ?? 2 * M;
          W(`${blk}.shared_expert.gate_proj.weight`, [S, D], D);
          W(`${blk}.shared_expert.up_proj.weight`, [S, D], D);
          W(`${blk}.shared_expert.down_proj.weight`, [D, S], S);
          W(`${blk}.shared_expert_gate.weight`, [1, D], D);
        }
        continue;
      }
      if (family === 'phi3') W(`${p}.mlp.gate_up_proj.weight`, [2 * M, D], D);
      else {
        W(`${p}.mlp.gate_proj.weight`, [M, D], D);
        if (mlpBias) bias(`${p}.mlp.gate_proj.bias`, M);
        W(`${p}.mlp.up_proj.weight`, [M, D], D);
        if (mlpBias) bias(`${p}.mlp.up_proj.bias`, M);
      }
      W(`${p}.mlp.down_proj.weight`, [D, M], M);
      if (mlpBias) bias(`${p}.mlp.down_proj.bias`, D);
    }
    normW(`${pre}norm.weight`, D);
    if (!tied)
      put(
        mm === 'language_model.model.' ? 'language_model.lm_head.weight' : 'lm_head.weight',
        [V, D],
        normal(unembedStd),
      );

    const arch = {
      llama: 'LlamaForCausalLM',
      qwen2: 'Qwen2ForCausalLM',
      qwen3: 'Qwen3ForCausalLM',
      gemma: 'GemmaForCausalLM',
      gemma2: 'Gemma2ForCausalLM',
      gemma3: 'Gemma3ForCausalLM',
      phi3: 'Phi3ForCausalLM',
      olmo2: 'Olmo2ForCausalLM',
      mixtral: 'MixtralForCausalLM',
      qwen2_moe: 'Qwen2MoeForCausalLM',
      qwen3_moe: 'Qwen3MoeForCausalLM',
      olmoe: 'OlmoeForCausalLM',
    }[family as 'llama'];
    config = {
      architectures: [arch],
      model_type: family === 'gemma3' ? 'gemma3_text' : family,
      vocab_size: V,
      hidden_size: D,
      intermediate_size: M,
      num_hidden_layers: L,
      num_attention_heads: H,
      num_key_value_heads: Hkv,
    };
    if (o.headDim !== undefined || gemma || family === 'qwen3' || family === 'qwen3_moe') config.head_dim = Dh;
    if (family === 'mixtral') {
      config.num_local_experts = E;
      config.router_jitter_noise = 0.0;
      config.sliding_window = o.slidingWindow ?? null;
    } else if (moe) {
      config.num_experts = E;
      config.norm_topk_prob = !!o.normTopK;
      if (family !== 'olmoe') {
        config.moe_intermediate_size = M;
        config.intermediate_size = 3 * M; // the dense MLP's width: unused when every layer is sparse
        config.decoder_sparse_step = 1;
        config.mlp_only_layers = [];
      }
      if (family === 'qwen2_moe') config.shared_expert_intermediate_size = o.sharedMlp ?? 2 * M;
    }
    if (moe) config.num_experts_per_tok = K;
    if (family === 'gemma3') {
      if (o.activation) config.hidden_activation = o.activation; // else HF's default, gelu_pytorch_tanh
    } else if (gemma) {
      const act = o.activation ?? 'gelu_pytorch_tanh';
      config.hidden_act = act;
      config.hidden_activation = act;
    } else config.hidden_act = o.activation ?? 'silu';
    config.max_position_embeddings = P;
    config.initializer_range = 0.02;
    if (family !== 'gemma3') config.rms_norm_eps = olmo || family === 'olmoe' || family === 'mixtral' ? 1e-5 : 1e-6;
    if (family === 'gemma3') {
      if (o.ropeTheta !== undefined) config.rope_theta = o.ropeTheta;
      if (o.ropeLocalBase !== undefined) config.rope_local_base_freq = o.ropeLocalBase;
      if (o.slidingWindowPattern !== undefined) config.sliding_window_pattern = o.slidingWindowPattern;
    } else
      config.rope_theta =
        o.ropeTheta ?? (['qwen2', 'qwen3', 'qwen3_moe', 'mixtral'].includes(family) ? 1000000.0 : 10000.0);
    if (family === 'llama') config.rope_scaling = o.ropeScaling ?? null;
    else if (o.ropeScaling) config.rope_scaling = o.ropeScaling;
    if (family === 'phi3') {
      if (o.partialRotary !== undefined) config.partial_rotary_factor = o.partialRotary;
      if (o.originalMaxPositions !== undefined) config.original_max_position_embeddings = o.originalMaxPositions;
      config.sliding_window = o.slidingWindow === undefined ? null : o.slidingWindow;
      config.resid_pdrop = 0.0;
      config.embd_pdrop = 0.0;
    }
    if (family !== 'qwen2' && family !== 'qwen2_moe' && family !== 'phi3') config.attention_bias = !!o.attentionBias;
    if (family === 'llama') config.mlp_bias = mlpBias;
    config.attention_dropout = 0.0;
    if (family === 'qwen2') {
      config.use_sliding_window = false;
      config.sliding_window = o.qwen2InactiveSlidingWindow ?? P;
      config.max_window_layers = L;
    }
    if (family === 'qwen2_moe') {
      config.use_sliding_window = false;
      config.sliding_window = P;
      config.max_window_layers = L;
    }
    if (family === 'qwen3' || family === 'qwen3_moe') {
      config.use_sliding_window = false;
      config.sliding_window = null;
      config.max_window_layers = L;
    }
    if (family === 'gemma3') {
      if (o.queryPreAttnScalar !== undefined) config.query_pre_attn_scalar = o.queryPreAttnScalar; // else HF's 256
      config.sliding_window = o.slidingWindow === undefined ? 4 : o.slidingWindow;
      if (o.attnSoftcap) config.attn_logit_softcapping = o.attnSoftcap;
      if (o.finalSoftcap) config.final_logit_softcapping = o.finalSoftcap;
      if (o.writeLayerTypes) {
        const pat = o.slidingWindowPattern ?? 6;
        config.layer_types = Array.from({ length: L }, (_, l) =>
          (l + 1) % pat !== 0 ? 'sliding_attention' : 'full_attention',
        );
      }
    }
    if (family === 'gemma2') {
      config.query_pre_attn_scalar = o.queryPreAttnScalar ?? Dh;
      config.attn_logit_softcapping = o.attnSoftcap === undefined ? 50.0 : o.attnSoftcap;
      config.final_logit_softcapping = o.finalSoftcap === undefined ? 30.0 : o.finalSoftcap;
      config.sliding_window = o.slidingWindow === undefined ? 4096 : o.slidingWindow;
      config.cache_implementation = 'hybrid';
      if (o.writeLayerTypes)
        config.layer_types = Array.from({ length: L }, (_, l) =>
          l % 2 === 0 ? 'sliding_attention' : 'full_attention',
        );
    }
    if (o.writeTieField !== false) config.tie_word_embeddings = tied;
    config.use_cache = true;
    config.bos_token_id = bosId;
    config.eos_token_id = eosId;
    if (tok.specialIds[tspec.pad ?? ''] !== undefined) config.pad_token_id = tok.specialIds[tspec.pad!];
    if (mm) {
      // Gemma3Config: the decoder's fields in text_config (HF's defaults left out), a vision_config beside it
      const { architectures: _a, ...text } = config;
      config = {
        architectures: ['Gemma3ForConditionalGeneration'],
        model_type: 'gemma3',
        text_config: { ...text, model_type: 'gemma3_text' },
        vision_config: { model_type: 'siglip_vision_model', hidden_size: D, image_size: 8, patch_size: 4 },
        mm_tokens_per_image: 4,
        boi_token_index: V - 3,
        eoi_token_index: V - 2,
        image_token_index: V - 1,
        bos_token_id: bosId,
        eos_token_id: eosId,
      };
    }
  }
  config.torch_dtype = torchDtype;
  config.transformers_version = '4.46.0';

  // ---- write the folder
  const dir = o.dir ?? mkdtempSync(join(tmpdir(), `loupe-ref-${family}-`));
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config, null, 2));
  const st: Record<string, { dims: number[]; data: Float32Array }> = {};
  for (const [k, t] of Object.entries(tensors)) st[k] = t;
  const nShards = o.shards ?? 1;
  if (nShards <= 1) writeFileSync(join(dir, 'model.safetensors'), encodeSafetensors(st, dtype));
  else {
    // split in insertion order into shards of roughly equal size (HF's save_pretrained splits by size)
    const names = Object.keys(st);
    if (names.length < nShards) throw new Error('makeRandomModel: more shards than tensors');
    const total = names.reduce((a, k) => a + st[k].data.length, 0);
    const pad = (n: number) => String(n).padStart(5, '0');
    const files = Array.from({ length: nShards }, (_, i) => `model-${pad(i + 1)}-of-${pad(nShards)}.safetensors`);
    const parts: (typeof st)[] = files.map(() => ({}));
    const weightMap: Record<string, string> = {};
    let cum = 0;
    let prev = 0;
    names.forEach((n, i) => {
      // by size, one shard at a time (no shard skipped), never leaving a later shard empty
      const bySize = Math.min(nShards - 1, Math.floor((cum / total) * nShards));
      let shard = Math.max(prev, Math.min(prev + 1, bySize));
      shard = Math.max(shard, nShards - (names.length - i));
      if (o.shardOf) shard = o.shardOf(n);
      prev = shard;
      parts[shard][n] = st[n];
      weightMap[n] = files[shard];
      cum += st[n].data.length;
    });
    parts.forEach((part, i) => writeFileSync(join(dir, files[i]), encodeSafetensors(part, dtype)));
    const bytesPer = dtype === 'F32' ? 4 : 2;
    writeFileSync(
      join(dir, 'model.safetensors.index.json'),
      JSON.stringify({ metadata: { total_size: total * bytesPer }, weight_map: weightMap }, null, 2),
    );
  }
  writeTokenizerFiles(dir, tok);
  writeFileSync(
    join(dir, 'generation_config.json'),
    JSON.stringify({ bos_token_id: bosId, eos_token_id: eosId, transformers_version: '4.46.0' }, null, 2),
  );

  return {
    dir,
    family,
    config,
    tensors,
    dtype,
    tokenizer: tok,
    bosId,
    cleanup: () => rmSync(dir, { recursive: true, force: true }),
  };
}

// ---------------------------------------------------------------- preset cases

export interface FamilyCase {
  name: string;
  family: Family;
  options: RandomModelOptions;
  /** what this case exercises */
  features: string[];
  /** a good test length (long enough for the sliding window to bite) */
  seqLen: number;
}

export const ALL_FAMILY_CASES: FamilyCase[] = [
  {
    name: 'gpt2-tied',
    family: 'gpt2',
    options: { seed: 11, dModel: 48, nLayers: 2, nHeads: 4, vocabSize: 300, maxPositions: 32 },
    features: ['learned positions', 'Conv1D fused c_attn', 'biases', 'gelu_new', 'tied embeddings', 'LayerNorm'],
    seqLen: 12,
  },
  {
    name: 'gpt2-untied-erf-f16',
    family: 'gpt2',
    options: {
      seed: 12,
      dModel: 32,
      nLayers: 3,
      nHeads: 2,
      dMlp: 96,
      vocabSize: 290,
      tied: false,
      activation: 'gelu',
      dtype: 'F16',
    },
    features: ['untied lm_head', 'gelu (erf)', 'n_inner', 'F16 weights', '3 layers'],
    seqLen: 10,
  },
  {
    name: 'neox-parallel-rot25',
    family: 'gpt_neox',
    options: { seed: 21, dModel: 64, nLayers: 2, nHeads: 4, vocabSize: 280, rotaryPct: 0.25, parallelResidual: true },
    features: [
      'partial rotary 0.25',
      'parallel residual',
      'qkv [H,3,Dh] layout',
      'biases',
      'embed_out (untied)',
      'gelu (erf)',
    ],
    seqLen: 12,
  },
  {
    name: 'neox-sequential-rot50',
    family: 'gpt_neox',
    options: {
      seed: 22,
      dModel: 32,
      nLayers: 3,
      nHeads: 4,
      vocabSize: 270,
      rotaryPct: 0.5,
      parallelResidual: false,
      ropeTheta: 1000,
    },
    features: ['partial rotary 0.5', 'sequential residual', 'rotary_emb_base'],
    seqLen: 12,
  },
  {
    name: 'llama-gqa-tied',
    family: 'llama',
    options: { seed: 31, dModel: 32, nLayers: 2, nHeads: 4, nKvHeads: 2, dMlp: 80, vocabSize: 64, tied: true },
    features: ['GQA 4/2', 'RMSNorm', 'SwiGLU', 'tied embeddings', 'char tokenizer (vocab 64)'],
    seqLen: 12,
  },
  {
    name: 'llama3-rope-untied-bias',
    family: 'llama',
    options: {
      seed: 32,
      dModel: 48,
      nLayers: 2,
      nHeads: 4,
      nKvHeads: 2,
      headDim: 8,
      dMlp: 96,
      vocabSize: 96,
      tied: false,
      attentionBias: true,
      mlpBias: true,
      ropeScaling: {
        rope_type: 'llama3',
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 64,
      },
    },
    features: [
      'rope_scaling llama3 (all three frequency bands)',
      'explicit head_dim 8 ≠ 48/4',
      'untied lm_head',
      'attention_bias',
      'mlp_bias',
      'GQA',
    ],
    seqLen: 14,
  },
  {
    name: 'llama-mha-bf16',
    family: 'llama',
    options: {
      seed: 33,
      dModel: 32,
      nLayers: 2,
      nHeads: 4,
      dMlp: 64,
      vocabSize: 64,
      ropeTheta: 500,
      dtype: 'BF16',
      tied: true,
    },
    features: ['BF16 weights', 'MHA (n_kv = n_heads)', 'rope_theta 500'],
    seqLen: 10,
  },
  {
    name: 'qwen2-qkv-bias',
    family: 'qwen2',
    options: {
      seed: 41,
      dModel: 48,
      nLayers: 2,
      nHeads: 6,
      nKvHeads: 2,
      dMlp: 112,
      vocabSize: 300,
      tied: false,
      qwen2InactiveSlidingWindow: 4,
    },
    features: [
      'q/k/v bias, no o bias',
      'GQA 6/2',
      'untied lm_head',
      'rope_theta 1e6',
      'sliding_window 4 present but use_sliding_window false (must be ignored)',
    ],
    seqLen: 12,
  },
  {
    name: 'qwen3-qk-norm',
    family: 'qwen3',
    options: {
      seed: 51,
      dModel: 32,
      nLayers: 2,
      nHeads: 4,
      nKvHeads: 2,
      headDim: 16,
      dMlp: 64,
      vocabSize: 280,
      tied: true,
    },
    features: ['q_norm / k_norm before rotary', 'explicit head_dim 16 ≠ 32/4', 'GQA', 'tied embeddings'],
    seqLen: 12,
  },
  {
    name: 'gemma-mqa',
    family: 'gemma',
    options: {
      seed: 61,
      dModel: 32,
      nLayers: 2,
      nHeads: 4,
      nKvHeads: 1,
      headDim: 16,
      dMlp: 64,
      vocabSize: 96,
      writeTieField: false,
    },
    features: [
      'embedding × sqrt(D)',
      'RMSNorm (1 + w)',
      'GeGLU (gelu tanh)',
      'MQA',
      'head_dim 16 ≠ 32/4',
      'tied by default (no tie field)',
    ],
    seqLen: 12,
  },
  {
    name: 'gemma2-softcap-window',
    family: 'gemma2',
    options: {
      seed: 71,
      dModel: 32,
      nLayers: 3,
      nHeads: 4,
      nKvHeads: 2,
      headDim: 16,
      dMlp: 64,
      vocabSize: 128,
      attnSoftcap: 3.0,
      finalSoftcap: 5.0,
      slidingWindow: 4,
      queryPreAttnScalar: 24,
      writeTieField: false,
    },
    features: [
      'attention soft-cap 3',
      'final logit soft-cap 5',
      'sliding window 4 on layers 0, 2 (HF default rule)',
      'query_pre_attn_scalar 24 ≠ head_dim',
      'sandwich norms',
      'GQA',
    ],
    seqLen: 12,
  },
  {
    name: 'gemma2-layer-types',
    family: 'gemma2',
    options: {
      seed: 72,
      dModel: 48,
      nLayers: 2,
      nHeads: 4,
      headDim: 12,
      dMlp: 96,
      vocabSize: 100,
      slidingWindow: 3,
      writeLayerTypes: true,
      tied: true,
    },
    features: ['layer_types list', 'sliding window 3 on layer 0', 'realistic soft-caps 50 / 30', 'MHA'],
    seqLen: 10,
  },
  {
    name: 'gemma3-text-bf16',
    family: 'gemma3',
    options: {
      seed: 81,
      dModel: 56,
      nLayers: 7,
      nHeads: 4,
      nKvHeads: 1,
      headDim: 16,
      dMlp: 64,
      vocabSize: 96,
      slidingWindow: 4,
      queryPreAttnScalar: 24,
      ropeScaling: { rope_type: 'linear', factor: 4.0 },
      dtype: 'BF16',
      tied: false,
      unembedScale: 4,
    },
    features: [
      'q_norm / k_norm (1 + w) per head before rotary',
      'sandwich norms',
      'query_pre_attn_scalar 24 ≠ head_dim',
      'sliding_window_pattern left out: HF default 6 (layers 0–4 and 6 slide, 5 global)',
      'rope_local_base_freq left out: 10000 on sliding layers, rope_theta 1e6 on the global one',
      'rope_scaling linear ×4 on the global layer only',
      'embedding scale sqrt(56) cast to BF16 (7.5, not 7.483)',
      'tanh GELU, with logits large enough (untied lm_head × 4) that erf GELU moves them by 1e-2',
      'untied lm_head',
      'MQA',
    ],
    seqLen: 12,
  },
  {
    name: 'gemma3-multimodal-text',
    family: 'gemma3',
    options: {
      seed: 82,
      dModel: 32,
      nLayers: 3,
      nHeads: 4,
      nKvHeads: 2,
      headDim: 8,
      dMlp: 48,
      vocabSize: 96,
      slidingWindow: 3,
      slidingWindowPattern: 2,
      writeLayerTypes: true,
      ropeLocalBase: 100,
      ropeTheta: 5000,
      multimodal: 'language_model.model.',
      writeTieField: false,
    },
    features: [
      'Gemma3ForConditionalGeneration: text_config nested, HF defaults left out',
      'weights under language_model.model.*, a vision tower beside them',
      'layer_types list (sliding, global, sliding)',
      'rope_local_base_freq 100 vs rope_theta 5000',
    ],
    seqLen: 10,
  },
  {
    name: 'phi3-longrope-short-untied',
    family: 'phi3',
    options: {
      seed: 91,
      dModel: 48,
      nLayers: 2,
      nHeads: 4,
      nKvHeads: 2,
      headDim: 12,
      dMlp: 64,
      vocabSize: 96,
      maxPositions: 128,
      originalMaxPositions: 32,
      slidingWindow: 5,
      ropeScaling: {
        type: 'longrope',
        short_factor: [1.0, 1.5, 2.0, 4.0, 6.0, 9.0],
        long_factor: [1.0, 3.0, 7.0, 15.0, 31.0, 64.0],
      },
      tied: false,
    },
    features: [
      'fused qkv_proj (q | k | v rows, GQA 4/2) and gate_up_proj',
      'longrope: 12 positions ≤ original_max_position_embeddings 32 use short_factor',
      'longrope attention factor sqrt(1 + ln 4 / ln 32)',
      'sliding_window 5 on every layer',
      'untied lm_head',
    ],
    seqLen: 12,
  },
  {
    name: 'phi4-mini-longrope-long-partial',
    family: 'phi3',
    options: {
      seed: 92,
      dModel: 32,
      nLayers: 2,
      nHeads: 4,
      nKvHeads: 1,
      headDim: 16,
      dMlp: 48,
      vocabSize: 96,
      maxPositions: 64,
      originalMaxPositions: 4,
      partialRotary: 0.75,
      ropeScaling: {
        type: 'longrope',
        short_factor: [1.0, 1.2, 1.5, 2.0, 3.0, 4.0],
        long_factor: [1.0, 2.0, 4.0, 8.0, 16.0, 32.0],
      },
      tied: true,
    },
    features: [
      'partial_rotary_factor 0.75 (12 of 16 dims rotate)',
      'longrope: runs past original_max_position_embeddings 4 (all but the shortest) use long_factor',
      'MQA, tied embeddings (Phi-4-mini)',
    ],
    seqLen: 12,
  },
  {
    name: 'olmo2-post-norms',
    family: 'olmo2',
    options: {
      seed: 101,
      dModel: 48,
      nLayers: 3,
      nHeads: 4,
      nKvHeads: 2,
      headDim: 12,
      dMlp: 96,
      vocabSize: 300,
      tied: false,
    },
    features: [
      'norms after attention and after the MLP only (no pre-norms)',
      'q_norm / k_norm over the whole projection (48, 24)',
      'GQA 4/2',
      'untied lm_head',
    ],
    seqLen: 12,
  },
];

export function makeCaseModel(c: FamilyCase, extra: RandomModelOptions = {}): RandomModel {
  return makeRandomModel(c.family, { ...c.options, ...extra });
}

/** Deterministic tokens for a case: BOS then random ids (never a special token). */
export function caseTokens(model: RandomModel, T: number, seed = 7): number[] {
  const V = (model.config.vocab_size ?? model.config.text_config?.vocab_size) as number;
  const specials = new Set(Object.values(model.tokenizer.specialIds));
  const r = mulberry32(seed);
  const out = [model.bosId];
  while (out.length < T) {
    const t = Math.floor(r() * V);
    if (!specials.has(t)) out.push(t);
  }
  return out;
}

/** the mixture-of-experts families (forward64.ts routes their MLPs) */
export const MOE_FAMILIES: readonly string[] = ['mixtral', 'qwen2_moe', 'qwen3_moe', 'olmoe'];

/** random MoE models, one per family and routing feature (tests/engine-moe.test.ts) */
export const MOE_FAMILY_CASES: FamilyCase[] = [
  {
    name: 'mixtral-8e-top2-window',
    family: 'mixtral',
    options: {
      seed: 71,
      dModel: 32,
      nLayers: 2,
      nHeads: 4,
      nKvHeads: 2,
      dMlp: 24,
      vocabSize: 96,
      nExperts: 8,
      topK: 2,
      routerScale: 3,
      slidingWindow: 5,
      unembedScale: 3,
    },
    features: ['8 experts, top 2, always renormalised', 'sliding window on every layer', 'GQA 4/2', 'w1/w3/w2'],
    seqLen: 12,
  },
  {
    name: 'qwen3-moe-norm-topk',
    family: 'qwen3_moe',
    options: {
      seed: 72,
      dModel: 32,
      nLayers: 2,
      nHeads: 4,
      nKvHeads: 2,
      headDim: 8,
      dMlp: 16,
      vocabSize: 300,
      nExperts: 6,
      topK: 3,
      normTopK: true,
      routerScale: 3,
      unembedScale: 3,
    },
    features: ['6 experts, top 3', 'norm_topk_prob true', 'q/k norm per head', 'moe_intermediate_size'],
    seqLen: 10,
  },
  {
    name: 'qwen2-moe-shared-expert',
    family: 'qwen2_moe',
    options: {
      seed: 73,
      dModel: 32,
      nLayers: 2,
      nHeads: 4,
      dMlp: 16,
      vocabSize: 300,
      nExperts: 4,
      topK: 2,
      normTopK: false,
      sharedMlp: 24,
      routerScale: 3,
      unembedScale: 3,
    },
    features: ['4 experts, top 2, not renormalised', 'shared expert with sigmoid gate', 'q/k/v bias'],
    seqLen: 10,
  },
  {
    name: 'olmoe-full-qk-norm',
    family: 'olmoe',
    options: {
      seed: 74,
      dModel: 32,
      nLayers: 2,
      nHeads: 4,
      dMlp: 16,
      vocabSize: 300,
      nExperts: 8,
      topK: 2,
      normTopK: true,
      routerScale: 3,
      unembedScale: 3,
      dtype: 'BF16',
    },
    features: ['8 experts, top 2', 'q/k norm over the whole projection', 'BF16 weights'],
    seqLen: 10,
  },
];
