/**
 * Qwen3-MoE (transformers' modeling_qwen3_moe.py): Qwen3's attention (q/k RMSNorm per head) with a
 * sparse MoE MLP in every layer: router `mlp.gate` [E, D], softmax over num_experts, the
 * num_experts_per_tok largest, renormalised when norm_topk_prob; experts of moe_intermediate_size.
 */
import type { ModelSpec } from '../spec';
import type { AdapterInput } from './common';
import { llamaLike } from './llama';
import type { MoeOptions } from './moe';

export const QWEN_MOE: MoeOptions = {
  block: 'mlp',
  names: ['gate_proj', 'up_proj', 'down_proj'],
  expertsKey: 'num_experts',
  widthKey: 'moe_intermediate_size',
  normTopK: 'config',
};

export function qwen3Moe(input: AdapterInput): ModelSpec {
  return llamaLike(input, { family: 'qwen3_moe', qkNorm: 'head', moe: QWEN_MOE });
}
