/** Helpers shared by the architecture adapters: config field access and tensor checks. */
import { checkDim, type CapName } from '../caps';
import { LoupeError } from '../errors';
import type { TensorEntry } from '../safetensors-types';
import type { LinearRef, ModelSpec, NormSpec, RopeScaling } from '../spec';
import type { SafetensorsDtype } from '../safetensors-types';
import { f16ToF32 } from '../safetensors';
import { f32ToF16 } from '../q8';

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

/**
 * A spec's sizes from an adapter's names for them (L layers, D model width, H query and Hkv
 * key/value heads of Dh, M MLP width, V vocabulary, nCtx positions), with config's model_type.
 */
export function sizes(
  c: Config,
  s: { L: number; D: number; H: number; Hkv: number; Dh: number; M: number; V: number; nCtx: number },
): Pick<ModelSpec, 'modelType' | 'nLayers' | 'dModel' | 'nHeads' | 'nKvHeads' | 'dHead' | 'dMlp' | 'dVocab' | 'nCtx'> {
  return {
    modelType: c.model_type,
    nLayers: s.L,
    dModel: s.D,
    nHeads: s.H,
    nKvHeads: s.Hkv,
    dHead: s.Dh,
    dMlp: s.M,
    dVocab: s.V,
    nCtx: s.nCtx,
  };
}

/** the dtypes the graph runs weights in (graph/onnx-builder.ts rawWeight) */
export const WEIGHT_DTYPES: readonly string[] = ['F32', 'F16', 'BF16'];

/**
 * A tensor that must exist with the given shape (undefined entries in `shape` are not checked),
 * stored in a dtype the graph runs (checked from the headers, before any weight byte).
 */
export function need(t: TensorIndex, name: string, shape?: (number | undefined)[]): string {
  const e = t.get(name);
  if (!e)
    throw new LoupeError(
      'MISSING_TENSOR',
      `Tensor ${name} is missing from the weights.`,
      'The safetensors files do not match config.json (wrong model type, or an incomplete download).',
      { tensor: name },
    );
  if (!WEIGHT_DTYPES.includes(e.dtype))
    throw new LoupeError(
      'SAFETENSORS_UNKNOWN_DTYPE',
      `Tensor ${name} is stored as ${e.dtype}; Loupe runs weights stored as ${WEIGHT_DTYPES.join(', ')}.`,
      'Convert the checkpoint to float32, float16 or bfloat16 (e.g. save_pretrained after model.to(torch.float16)).',
      { tensor: name, dtype: e.dtype },
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

/**
 * The text decoder's config of a family whose multimodal checkpoints nest it in text_config
 * (Gemma 3, Gemma 4, Qwen3.5): text_config under the family's model_type with the token ids and
 * tying of the outer config (they may sit there only), the config itself otherwise; over the
 * family's defaults, which an absent field (and, with `skipNull`, a null one) leaves standing.
 */
export function nestedTextConfig(
  config: Config,
  family: { outer: string; text: string; name: string; cls: string; skipNull?: boolean },
  defaults: Config,
): Config {
  let text: Config = config;
  if (config.model_type === family.outer) {
    const tc = config.text_config;
    if (!tc || typeof tc !== 'object' || Array.isArray(tc))
      throw new LoupeError(
        'BAD_CONFIG',
        `This ${family.name} config.json (model_type ${family.outer}) has no text_config, so its text model cannot be found.`,
        `A ${family.cls} config nests the language model in text_config.`,
        { field: 'text_config' },
      );
    if (tc.model_type !== undefined && tc.model_type !== family.text)
      throw unsupportedConfig('text_config.model_type', tc.model_type, family.text);
    const outer = Object.fromEntries(
      ['bos_token_id', 'eos_token_id', 'pad_token_id', 'tie_word_embeddings']
        .filter((k) => k in config)
        .map((k) => [k, config[k]]),
    );
    text = { ...outer, ...tc, model_type: family.outer };
  }
  const c: Config = { ...defaults };
  for (const [k, v] of Object.entries(text)) if (v !== undefined && !(family.skipNull && v === null)) c[k] = v;
  return c;
}

/** UNSUPPORTED_CONFIG naming the config.json field and what Loupe supports there */
export function unsupportedConfig(field: string, value: unknown, supported: string): LoupeError {
  return new LoupeError(
    'UNSUPPORTED_CONFIG',
    `config.json ${field} = ${JSON.stringify(value)} is not supported.`,
    `Supported: ${supported}.`,
    { field, value },
  );
}

const ROPE_TYPES = 'llama3, linear, longrope, yarn, default (or none)';

/**
 * config.json's rope_scaling (or one layer type's rope_parameters, `field` naming it) as the
 * engine's RopeScaling, for rotary dims `rd`; null for none or 'default'. As transformers'
 * modeling_rope_utils computes them: `_compute_linear_scaling_rope_parameters`,
 * `_compute_llama3_parameters`, `_compute_longrope_parameters` (factor defaults to
 * max_position_embeddings / original_max_position_embeddings; attention_factor to
 * sqrt(1 + ln factor / ln original), 1 when factor ≤ 1), `_compute_yarn_parameters`. Other types
 * are UNSUPPORTED_CONFIG.
 */
export function ropeScaling(
  config: Config,
  rd: number,
  rs: Record<string, any> | null | undefined = config.rope_scaling,
  field = 'rope_scaling',
): RopeScaling | null {
  if (!rs) return null;
  if (typeof rs !== 'object' || Array.isArray(rs)) throw unsupportedConfig(field, rs, 'an object with rope_type');
  const type = rs.rope_type ?? rs.type ?? 'default';
  const key = rs.rope_type !== undefined ? `${field}.rope_type` : `${field}.type`;
  const numberAt = (k: string): number => {
    if (typeof rs[k] !== 'number' || !Number.isFinite(rs[k]) || rs[k] <= 0)
      throw new LoupeError(
        'BAD_CONFIG',
        `config.json ${field}.${k} must be a positive number (rope_type '${type}').`,
        undefined,
        {
          field: `${field}.${k}`,
        },
      );
    return rs[k];
  };
  if (type === 'default') return null;
  if (type === 'linear') return { kind: 'linear', factor: numberAt('factor') };
  if (type === 'llama3') {
    return {
      kind: 'llama3',
      factor: numberAt('factor'),
      lowFreqFactor: numberAt('low_freq_factor'),
      highFreqFactor: numberAt('high_freq_factor'),
      originalMaxPositionEmbeddings: numberAt('original_max_position_embeddings'),
    };
  }
  if (type === 'longrope') {
    const factors = (k: string): number[] => {
      const f = rs[k];
      if (
        !Array.isArray(f) ||
        f.length !== rd / 2 ||
        !f.every((x) => typeof x === 'number' && Number.isFinite(x) && x > 0)
      )
        throw new LoupeError(
          'BAD_CONFIG',
          `config.json ${field}.${k} must be ${rd / 2} positive numbers (half the ${rd} rotary dims).`,
          undefined,
          { field: `${field}.${k}` },
        );
      return f;
    };
    const original =
      rs.original_max_position_embeddings ?? config.original_max_position_embeddings ?? config.max_position_embeddings;
    if (typeof original !== 'number' || !(original > 0))
      throw new LoupeError(
        'BAD_CONFIG',
        `config.json has no original_max_position_embeddings for ${field} longrope.`,
        undefined,
        {
          field: 'original_max_position_embeddings',
        },
      );
    const factor =
      typeof rs.factor === 'number' ? rs.factor : num(config, ['max_position_embeddings'], original) / original;
    const attentionFactor =
      typeof rs.attention_factor === 'number'
        ? rs.attention_factor
        : factor <= 1
          ? 1
          : Math.sqrt(1 + Math.log(factor) / Math.log(original));
    return {
      kind: 'longrope',
      factor,
      shortFactor: factors('short_factor'),
      longFactor: factors('long_factor'),
      originalMaxPositionEmbeddings: original,
      attentionFactor,
    };
  }
  if (type === 'yarn') {
    // `_compute_yarn_parameters`: attention_factor defaults to 0.1 ln(factor) + 1 (1 when factor ≤ 1;
    // mscale / mscale_all_dim, DeepSeek's, are refused), beta_fast 32, beta_slow 1, truncate true
    for (const k of ['mscale', 'mscale_all_dim'])
      if (rs[k] !== undefined && rs[k] !== null) throw unsupportedConfig(`${field}.${k}`, rs[k], 'absent');
    const factor = numberAt('factor');
    const original = numberAt('original_max_position_embeddings');
    const optional = (k: string, fallback: number) => (rs[k] === undefined || rs[k] === null ? fallback : numberAt(k));
    if (rs.truncate !== undefined && typeof rs.truncate !== 'boolean')
      throw unsupportedConfig(`${field}.truncate`, rs.truncate, 'true or false');
    return {
      kind: 'yarn',
      factor,
      originalMaxPositionEmbeddings: original,
      attentionFactor: optional('attention_factor', factor <= 1 ? 1 : 0.1 * Math.log(factor) + 1),
      betaFast: optional('beta_fast', 32),
      betaSlow: optional('beta_slow', 1),
      truncate: rs.truncate ?? true,
    };
  }
  throw unsupportedConfig(key, type, ROPE_TYPES);
}

export function activation(name: string | undefined, fallback: string): any {
  const a = (name ?? fallback) as string;
  const known = ['gelu_new', 'gelu', 'gelu_pytorch_tanh', 'relu', 'silu', 'gelu_fast', 'swish'];
  if (!known.includes(a))
    throw new LoupeError(
      'UNSUPPORTED_CONFIG',
      `Activation '${a}' is not supported.`,
      `Supported: ${known.join(', ')}.`,
      {
        value: a,
      },
    );
  return a === 'swish' ? 'silu' : a;
}

const f32Box = new Float32Array(1);
const u32Box = new Uint32Array(f32Box.buffer);

/** x as a value of a stored dtype (round half to even, as torch's `.to(dtype)`): BF16, F16, else float32 */
export function roundToStoredDtype(x: number, dtype: SafetensorsDtype): number {
  if (dtype === 'F16') return f16ToF32(f32ToF16(x));
  f32Box[0] = x;
  if (dtype !== 'BF16') return f32Box[0];
  const u = u32Box[0];
  u32Box[0] = ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) << 16;
  return f32Box[0];
}
