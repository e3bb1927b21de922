/**
 * Qwen2-MoE (transformers' modeling_qwen2_moe.py): Qwen2's attention (q/k/v biases) with Qwen3-MoE's
 * router and experts, plus a shared expert on every token: sigmoid(x · shared_expert_gate) ·
 * shared_expert(x), a gated MLP of shared_expert_intermediate_size, added to the routed sum.
 */
import type { ModelSpec } from '../spec';
import type { AdapterInput } from './common';
import { llamaLike } from './llama';
import { QWEN_MOE } from './qwen3_moe';

export function qwen2Moe(input: AdapterInput): ModelSpec {
  return llamaLike(input, { family: 'qwen2_moe', moe: { ...QWEN_MOE, shared: true } });
}
