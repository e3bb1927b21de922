/** Gemma: Llama with embeddings × sqrt(d_model), norms × (1 + w), GeGLU (tanh gelu), tied unembedding. */
import type { ModelSpec } from '../spec';
import type { AdapterInput } from './common';
import { llamaLike } from './llama';

export function gemma(input: AdapterInput): ModelSpec {
  // HF Gemma uses hidden_activation (gelu_pytorch_tanh) and ignores the legacy hidden_act 'gelu'.
  return llamaLike(input, {
    family: 'gemma',
    normOffset: 1,
    embedScale: true,
    defaultAct: 'gelu_pytorch_tanh',
    actKeys: ['hidden_activation'],
    defaultTied: true,
  });
}
