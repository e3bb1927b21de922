/** GPT-NeoX / Pythia: rotary (possibly partial), LayerNorm, fused per-head qkv, optional parallel residual. */
import type { ModelSpec, LayerSpec } from '../spec';
import { type AdapterInput, dim, num, need, linear, norm, activation, ropeScaling, sizes } from './common';

export function gptNeox(input: AdapterInput): ModelSpec {
  const { config: c, tensors: t } = input;
  const D = dim(c, ['hidden_size'], 'maxDModel');
  const L = dim(c, ['num_hidden_layers'], 'maxLayers');
  const H = dim(c, ['num_attention_heads'], 'maxHeads');
  const V = dim(c, ['vocab_size'], 'maxVocab');
  const M = dim(c, ['intermediate_size'], 'maxDMlp');
  const nCtx = dim(c, ['max_position_embeddings'], 'maxPositions', 2048);
  const eps = num(c, ['layer_norm_eps'], 1e-5);
  const Dh = D / H;
  const rotaryPct = num(c, ['rotary_pct', 'partial_rotary_factor'], 1);
  const act = activation(c.hidden_act, 'gelu');
  const parallel = c.use_parallel_residual !== false;
  const rd = Math.floor(Dh * rotaryPct);
  const rotary = { theta: num(c, ['rotary_emb_base', 'rope_theta'], 10000), dim: rd, scaling: ropeScaling(c, rd) };
  const layers: LayerSpec[] = [];
  for (let l = 0; l < L; l++) {
    const pre = `gpt_neox.layers.${l}`;
    layers.push({
      ln1: norm(t, `${pre}.input_layernorm`, D, 'layernorm', eps),
      ln2: norm(t, `${pre}.post_attention_layernorm`, D, 'layernorm', eps),
      attn: {
        qkv: { kind: 'neox_fused', qkv: linear(t, `${pre}.attention.query_key_value`, 3 * D, D) },
        o: linear(t, `${pre}.attention.dense`, D, D),
        scale: 1 / Math.sqrt(Dh),
        softcap: null,
        slidingWindow: null,
      },
      mlp: {
        kind: 'plain',
        up: linear(t, `${pre}.mlp.dense_h_to_4h`, M, D),
        down: linear(t, `${pre}.mlp.dense_4h_to_h`, D, M),
        act,
      },
      parallel,
    });
  }
  const embed = need(t, 'gpt_neox.embed_in.weight', [V, D]);
  return {
    family: 'gpt_neox',
    ...sizes(c, { L, D, H, Hkv: H, Dh, M, V, nCtx }),
    norm: 'layernorm',
    embed: { w: embed, scale: 1 },
    rotary,
    layers,
    lnFinal: norm(t, 'gpt_neox.final_layer_norm', D, 'layernorm', eps),
    unembed: { w: c.tie_word_embeddings && !t.has('embed_out.weight') ? embed : need(t, 'embed_out.weight', [V, D]) },
    finalSoftcap: null,
    bosTokenId: c.bos_token_id,
    eosTokenId: c.eos_token_id,
  };
}
