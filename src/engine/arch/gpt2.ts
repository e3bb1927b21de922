/** GPT-2 (GPT2LMHeadModel): learned positions, LayerNorm, fused Conv1D qkv, gelu_new MLP. */
import type { ModelSpec, LayerSpec } from '../spec';
import { type AdapterInput, dim, num, need, maybe, activation, sizes } from './common';

export function gpt2(input: AdapterInput): ModelSpec {
  const { config: c, tensors: t } = input;
  const D = dim(c, ['n_embd', 'hidden_size'], 'maxDModel');
  const L = dim(c, ['n_layer', 'num_hidden_layers'], 'maxLayers');
  const H = dim(c, ['n_head', 'num_attention_heads'], 'maxHeads');
  const V = dim(c, ['vocab_size'], 'maxVocab');
  const nCtx = dim(c, ['n_positions', 'n_ctx', 'max_position_embeddings'], 'maxPositions');
  const M = dim(c, ['n_inner'], 'maxDMlp', 4 * D);
  const eps = num(c, ['layer_norm_epsilon'], 1e-5);
  const Dh = D / H;
  // Some checkpoints (e.g. openai-community/gpt2) store names without the 'transformer.' prefix.
  const p = t.has('transformer.wte.weight') ? 'transformer.' : '';
  const act = activation(c.activation_function, 'gelu_new');
  const ln = (name: string) => ({
    kind: 'layernorm' as const,
    w: need(t, `${p}${name}.weight`, [D]),
    b: need(t, `${p}${name}.bias`, [D]),
    eps,
    weightOffset: 0 as const,
  });
  const conv = (name: string, inp: number, out: number) => ({
    w: need(t, `${p}${name}.weight`, [inp, out]),
    b: need(t, `${p}${name}.bias`, [out]),
    layout: 'in_out' as const,
  });
  const layers: LayerSpec[] = [];
  for (let l = 0; l < L; l++) {
    let scale = c.scale_attn_weights === false ? 1 : 1 / Math.sqrt(Dh);
    if (c.scale_attn_by_inverse_layer_idx) scale /= l + 1;
    layers.push({
      ln1: ln(`h.${l}.ln_1`),
      ln2: ln(`h.${l}.ln_2`),
      attn: {
        qkv: { kind: 'gpt2_fused', qkv: conv(`h.${l}.attn.c_attn`, D, 3 * D) },
        o: conv(`h.${l}.attn.c_proj`, D, D),
        scale,
        softcap: null,
        slidingWindow: null,
      },
      mlp: { kind: 'plain', up: conv(`h.${l}.mlp.c_fc`, D, M), down: conv(`h.${l}.mlp.c_proj`, M, D), act },
      parallel: false,
    });
  }
  const wte = need(t, `${p}wte.weight`, [V, D]);
  return {
    family: 'gpt2',
    ...sizes(c, { L, D, H, Hkv: H, Dh, M, V, nCtx }),
    norm: 'layernorm',
    embed: { w: wte, scale: 1 },
    posEmbed: { w: need(t, `${p}wpe.weight`, [undefined, D]) },
    layers,
    lnFinal: ln('ln_f'),
    unembed: { w: maybe(t, 'lm_head.weight', [V, D]) ?? wte },
    finalSoftcap: null,
    bosTokenId: c.bos_token_id,
    eosTokenId: c.eos_token_id,
  };
}
