/** model_type → adapter. Adding an architecture = one adapter file + one line here. */
import { LoupeError } from '../errors';
import type { ModelSpec } from '../spec';
import type { AdapterInput } from './common';
import { gpt2 } from './gpt2';
import { gptNeox } from './gpt_neox';
import { llama } from './llama';
import { qwen2 } from './qwen2';
import { qwen3 } from './qwen3';
import { gemma } from './gemma';
import { gemma2 } from './gemma2';

const ADAPTERS: Record<string, (input: AdapterInput) => ModelSpec> = {
  gpt2,
  gpt_neox: gptNeox,
  llama,
  mistral: llama,
  qwen2,
  qwen3,
  gemma,
  gemma2,
};

export const SUPPORTED_MODEL_TYPES = Object.keys(ADAPTERS);

/** The adapter for config.json's model_type; UNSUPPORTED_ARCHITECTURE from config.json alone (before any weight is fetched). */
export function adapterFor(config: Record<string, unknown> | undefined): (input: AdapterInput) => ModelSpec {
  const type = config?.model_type;
  const adapter =
    typeof type === 'string' && Object.prototype.hasOwnProperty.call(ADAPTERS, type) ? ADAPTERS[type] : undefined;
  if (!adapter) {
    throw new LoupeError(
      'UNSUPPORTED_ARCHITECTURE',
      `model_type '${type}' is not supported.`,
      `Supported model types: ${SUPPORTED_MODEL_TYPES.join(', ')}.`,
      { model_type: type, supported: SUPPORTED_MODEL_TYPES },
    );
  }
  return adapter;
}

export function describeModel(input: AdapterInput): ModelSpec {
  const spec = adapterFor(input.config)(input);
  if (spec.nHeads % spec.nKvHeads !== 0)
    throw new LoupeError(
      'BAD_CONFIG',
      `num_attention_heads (${spec.nHeads}) is not a multiple of num_key_value_heads (${spec.nKvHeads}).`,
    );
  return spec;
}
