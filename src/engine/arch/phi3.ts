/**
 * Phi-3 / Phi-3.5 / Phi-4-mini (transformers' modeling_phi3.py): Llama with one fused projection
 * per block (`qkv_proj` rows q | k | v, `gate_up_proj` rows gate | up), partial rotary
 * (`partial_rotary_factor`), `longrope` rope_scaling (short factors while a run's positions stay
 * within original_max_position_embeddings, long ones past it; cos and sin × the attention factor),
 * and `sliding_window`, when set, on every layer.
 */
import type { ModelSpec } from '../spec';
import { type AdapterInput, unsupportedConfig } from './common';
import { llamaLike } from './llama';

export function phi3(input: AdapterInput): ModelSpec {
  const rs = input.config.rope_scaling;
  const type = rs ? (rs.rope_type ?? rs.type ?? 'default') : 'default';
  // Phi3Config accepts only these two (configuration_phi3.py `_rope_parameters_validation`)
  if (type !== 'default' && type !== 'longrope')
    throw unsupportedConfig(
      rs.rope_type !== undefined ? 'rope_scaling.rope_type' : 'rope_scaling.type',
      type,
      'longrope, default (or none)',
    );
  return llamaLike(input, { family: 'phi3', fused: true, slidingWindowAll: true });
}
