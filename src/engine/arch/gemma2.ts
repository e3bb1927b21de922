/**
 * Gemma 2: Gemma plus sandwich norms (post-attention and pre/post-feedforward), attention-logit and
 * final-logit soft-capping, query_pre_attn_scalar scaling, and sliding-window attention on even layers.
 */
import type { ModelSpec } from '../spec';
import type { AdapterInput } from './common';
import { llamaLike } from './llama';

export function gemma2(input: AdapterInput): ModelSpec {
  return llamaLike(input, {
    family: 'gemma2',
    normOffset: 1,
    embedScale: true,
    norms: 'sandwich',
    softcap: true,
    queryPreAttnScalar: true,
    alternatingSlidingWindow: true,
    defaultAct: 'gelu_pytorch_tanh',
    actKeys: ['hidden_activation', 'hidden_act'],
    defaultTied: true,
  });
}
