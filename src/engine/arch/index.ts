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
import { gemma3 } from './gemma3';
import { gemma4 } from './gemma4';
import { phi3 } from './phi3';
import { olmo2 } from './olmo2';
import { mixtral } from './mixtral';
import { qwen2Moe } from './qwen2_moe';
import { qwen3Moe } from './qwen3_moe';
import { olmoe } from './olmoe';
import { qwen3_5 } from './qwen3_5';
import { gptOss } from './gpt_oss';

/**
 * An adapter: config.json + tensor index → ModelSpec. A multimodal family also says which tensors
 * its text model uses (`textTensors`, null where every tensor may be), so the loader never fetches
 * a shard that holds none of them.
 */
export type Adapter = ((input: AdapterInput) => ModelSpec) & {
  textTensors?: (config: Record<string, any>) => ((tensor: string) => boolean) | null;
};

const ADAPTERS: Record<string, Adapter> = {
  gpt2,
  gpt_neox: gptNeox,
  llama,
  mistral: llama,
  qwen2,
  qwen3,
  gemma,
  gemma2,
  gemma3_text: gemma3,
  gemma3,
  gemma4_text: gemma4,
  gemma4,
  phi3,
  olmo2,
  mixtral,
  qwen2_moe: qwen2Moe,
  qwen3_moe: qwen3Moe,
  olmoe,
  qwen3_5_text: qwen3_5,
  qwen3_5,
  gpt_oss: gptOss,
};

export const SUPPORTED_MODEL_TYPES = Object.keys(ADAPTERS);

/** The adapter for config.json's model_type; UNSUPPORTED_ARCHITECTURE from config.json alone (before any weight is fetched). */
export function adapterFor(config: Record<string, unknown> | undefined): Adapter {
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

/**
 * config.json judged alone, before the tokenizer or any weight header: the architecture
 * (UNSUPPORTED_ARCHITECTURE), then every field the adapter reads (UNSUPPORTED_CONFIG naming the
 * field, BAD_CONFIG). Adapters read all of config.json before their first tensor, so the adapter
 * run on no tensors stops at MISSING_TENSOR exactly when the config itself is fine.
 */
export function checkConfig(config: Record<string, unknown> | undefined): void {
  const adapter = adapterFor(config);
  try {
    adapter({ config: config as Record<string, any>, tensors: new Map() });
  } catch (e) {
    if (e instanceof LoupeError && e.code === 'MISSING_TENSOR') return;
    throw e;
  }
}

/** For a multimodal checkpoint, which of its tensors the text model uses (Adapter.textTensors); null: every tensor may be */
export function textTensorFilter(config: Record<string, unknown>): ((tensor: string) => boolean) | null {
  return adapterFor(config).textTensors?.(config) ?? null;
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
