/** Helpers shared by the architecture adapters: config field access and tensor checks. */
import { checkDim, type CapName } from '../caps';
import { LoupeError } from '../errors';
import type { TensorEntry } from '../safetensors-types';
import type { LinearRef, NormSpec, RopeScaling } from '../spec';

export type Config = Record<string, any>;
export type TensorIndex = Map<string, TensorEntry>;

export interface AdapterInput {
  config: Config;
  tensors: TensorIndex;
}

export function num(config: Config, keys: string[], fallback?: number): number {
  for (const k of keys) if (typeof config[k] === 'number') return config[k];
  if (fallback !== undefined) return fallback;
  throw new LoupeError(
    'BAD_CONFIG',
    `config.json lacks ${keys.join(' / ')}.`,
    "The model folder's config.json is incomplete or not a Hugging Face causal-LM config.",
  );
}

/**
 * A dimension (layers, heads, widths, vocabulary, positions): the first key present, a positive
 * integer within its cap in caps.ts (BAD_CONFIG naming the key and the limit), checked before
 * the adapter builds anything per layer or allocates by it. Adapters read every size with this,
 * never with num().
 */
export function dim(config: Config, keys: string[], cap: CapName, fallback?: number): number {
  for (const k of keys) if (config[k] !== undefined && config[k] !== null) return checkDim(cap, config[k], k);
  if (fallback !== undefined) return fallback;
  return num(config, keys);
}

/** A tensor that must exist with the given shape (undefined entries in `shape` are not checked). */
export function need(t: TensorIndex, name: string, shape?: (number | undefined)[]): string {
  const e = t.get(name);
  if (!e)
    throw new LoupeError(
      'MISSING_TENSOR',
      `Tensor ${name} is missing from the weights.`,
      'The safetensors files do not match config.json (wrong model type, or an incomplete download).',
      { tensor: name },
    );
  if (shape) {
    const ok = e.shape.length === shape.length && shape.every((d, i) => d === undefined || d === e.shape[i]);
    if (!ok)
      throw new LoupeError(
        'BAD_TENSOR_SHAPE',
        `Tensor ${name} has shape [${e.shape}] but config.json implies [${shape.map((d) => d ?? '?')}].`,
        'config.json and the weights disagree.',
        { tensor: name, shape: e.shape, expected: shape },
      );
  }
  return name;
}

export function maybe(t: TensorIndex, name: string, shape?: (number | undefined)[]): string | undefined {
  return t.has(name) ? need(t, name, shape) : undefined;
}

/** torch.nn.Linear [out, in] with optional bias */
export function linear(
  t: TensorIndex,
  prefix: string,
  out: number,
  inp: number,
  bias: 'auto' | boolean = 'auto',
): LinearRef {
  const w = need(t, `${prefix}.weight`, [out, inp]);
  const b =
    bias === false ? undefined : bias === true ? need(t, `${prefix}.bias`, [out]) : maybe(t, `${prefix}.bias`, [out]);
  return { w, b, layout: 'out_in' };
}

export function norm(
  t: TensorIndex,
  prefix: string,
  d: number,
  kind: NormSpec['kind'],
  eps: number,
  weightOffset: 0 | 1 = 0,
): NormSpec {
  const w = need(t, `${prefix}.weight`, [d]);
  const b = kind === 'layernorm' ? maybe(t, `${prefix}.bias`, [d]) : undefined;
  return { kind, w, b, eps, weightOffset };
}

export function ropeScaling(config: Config): RopeScaling | null {
  const rs = config.rope_scaling;
  if (!rs) return null;
  const type = rs.rope_type ?? rs.type;
  if (type === 'llama3') {
    return {
      kind: 'llama3',
      factor: rs.factor,
      lowFreqFactor: rs.low_freq_factor,
      highFreqFactor: rs.high_freq_factor,
      originalMaxPositionEmbeddings: rs.original_max_position_embeddings,
    };
  }
  if (type === 'linear') return { kind: 'linear', factor: rs.factor };
  if (type === 'default') return null;
  throw new LoupeError(
    'UNSUPPORTED_CONFIG',
    `rope_scaling type '${type}' is not supported.`,
    'Supported rope_scaling types: llama3, linear (or none).',
  );
}

export function activation(name: string | undefined, fallback: string): any {
  const a = (name ?? fallback) as string;
  const known = ['gelu_new', 'gelu', 'gelu_pytorch_tanh', 'relu', 'silu', 'gelu_fast', 'swish'];
  if (!known.includes(a))
    throw new LoupeError(
      'UNSUPPORTED_CONFIG',
      `Activation '${a}' is not supported.`,
      `Supported: ${known.join(', ')}.`,
    );
  return a === 'swish' ? 'silu' : a;
}
