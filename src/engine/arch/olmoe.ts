/**
 * OLMoE (transformers' modeling_olmoe.py): Llama's pre-norm block with q_norm / k_norm over the
 * whole projection (H·Dh, Hkv·Dh) before rotary, as OLMo 2, and Qwen2-MoE's router (softmax,
 * top num_experts_per_tok, renormalised when norm_topk_prob) over num_experts experts of
 * intermediate_size. clip_qkv (a clamp of q, k, v) is refused: no published checkpoint sets it.
 */
import type { ModelSpec } from '../spec';
import { type AdapterInput, unsupportedConfig } from './common';
import { llamaLike } from './llama';

export function olmoe(input: AdapterInput): ModelSpec {
  const clip = input.config.clip_qkv;
  if (clip !== undefined && clip !== null) throw unsupportedConfig('clip_qkv', clip, 'null');
  return llamaLike(input, {
    family: 'olmoe',
    qkNorm: 'full',
    moe: {
      block: 'mlp',
      names: ['gate_proj', 'up_proj', 'down_proj'],
      expertsKey: 'num_experts',
      widthKey: 'intermediate_size',
      normTopK: 'config',
    },
  });
}
