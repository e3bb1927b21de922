/** Qwen3: Llama with an RMSNorm over each head's q and k (before rotary) and an explicit head_dim. */
import type { ModelSpec } from '../spec';
import type { AdapterInput } from './common';
import { llamaLike } from './llama';

export function qwen3(input: AdapterInput): ModelSpec {
  return llamaLike(input, { family: 'qwen3', qkNorm: 'head' });
}
