/** Qwen2: Llama with q/k/v biases (picked up from the weights by `linear`). */
import type { ModelSpec } from '../spec';
import type { AdapterInput } from './common';
import { llamaLike } from './llama';

export function qwen2(input: AdapterInput): ModelSpec {
  return llamaLike(input, { family: 'qwen2' });
}
