/**
 * Mixtral (transformers' modeling_mixtral.py): Mistral's attention (sliding_window, when set, on
 * every layer) with a sparse MoE MLP, `block_sparse_moe`: router `gate` [E, D], softmax over the
 * num_local_experts, the num_experts_per_tok largest, always renormalised to sum to 1; expert e is
 * w2(silu(w1 x) ⊙ w3 x).
 */
import type { ModelSpec } from '../spec';
import type { AdapterInput } from './common';
import { llamaLike } from './llama';

export function mixtral(input: AdapterInput): ModelSpec {
  return llamaLike(input, {
    family: 'mixtral',
    slidingWindowAll: true,
    moe: {
      block: 'block_sparse_moe',
      names: ['w1', 'w3', 'w2'],
      expertsKey: 'num_local_experts',
      widthKey: 'intermediate_size',
      normTopK: 'always',
    },
  });
}
