/**
 * OLMo 2 (transformers' modeling_olmo2.py): Llama with its norms after attention and after the MLP
 * only (post_attention_layernorm, post_feedforward_layernorm; no pre-norms), and q_norm / k_norm over
 * the whole projected width (H·Dh, Hkv·Dh) before the split into heads and rotary.
 */
import type { ModelSpec } from '../spec';
import type { AdapterInput } from './common';
import { llamaLike } from './llama';

export function olmo2(input: AdapterInput): ModelSpec {
  return llamaLike(input, { family: 'olmo2', norms: 'post', qkNorm: 'full' });
}
