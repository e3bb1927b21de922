/**
 * Sparse autoencoders in SAELens's layout (cfg.json + sae_weights.safetensors with W_enc [d_in,
 * d_sae], b_enc, W_dec [d_sae, d_in], b_dec, and `threshold` for JumpReLU), attached to a model
 * at their hook. The graph then computes, where the activation x lives (WebGPU/WASM/CPU):
 *   acts   = act((x − b_dec·apply_b_dec_to_input) · W_enc + b_enc)        → {hook}.hook_sae_acts_post (a site)
 *   recons = acts · W_dec + b_dec                                         → {hook}.hook_sae_recons
 *   error  = x − recons                                                   → {hook}.hook_sae_error
 *   x'     = x + (acts'·W_dec − acts·W_dec) = recons' + error   (acts' = acts after feature interventions)
 * so with no feature intervention x' = x exactly, and clamping/adding a feature changes the stream
 * by exactly (acts' − acts) · W_dec, the reconstruction error kept (SAELens's error term).
 */
import { LoupeError } from './errors';
import { parseSafetensors } from './safetensors';
import type { TensorEntry, WeightSet } from './safetensors-types';
import type { FetchOptions, ModelSource } from './source/types';

export type SaeActivation = 'relu' | 'jumprelu' | 'topk';

export interface SaeInfo {
  id: string;
  hook: string;
  d_in: number;
  d_sae: number;
  activation: SaeActivation;
  k?: number;
  apply_b_dec_to_input: boolean;
}

export interface SaeFiles {
  cfg: Record<string, any>;
  /** raw bytes of sae_weights.safetensors */
  bytes: Uint8Array;
}

/** How the graph builder sees an attached SAE: tensor entries already renamed into the model's weight index. */
export interface SaeGraphSpec {
  info: SaeInfo;
  W_enc: TensorEntry;
  b_enc: TensorEntry;
  W_dec: TensorEntry;
  b_dec: TensorEntry;
  threshold?: TensorEntry;
}

const mismatch = (msg: string, hint?: string) => new LoupeError('SAE_MISMATCH', msg, hint);

/** Fetch an SAE from a source (a Hub repo, URL or folder); `path` is the SAE's folder inside it ('' for the root). */
export async function loadSaeFiles(source: ModelSource, path: string, opts: FetchOptions = {}): Promise<SaeFiles> {
  const p = path.replace(/^\/+|\/+$/g, '');
  const file = (f: string) => (p ? `${p}/${f}` : f);
  const cfgBytes = await source.fetchFile(file('cfg.json'), { ...opts, optional: true });
  if (!cfgBytes)
    throw new LoupeError(
      'FILE_NOT_FOUND',
      `No cfg.json at ${file('cfg.json')}.`,
      'An SAE in SAELens layout is a folder with cfg.json and sae_weights.safetensors; check the path inside the repository.',
    );
  let cfg: Record<string, any>;
  try {
    cfg = JSON.parse(new TextDecoder().decode(cfgBytes));
  } catch {
    throw new LoupeError('BAD_CONFIG', `${file('cfg.json')} is not valid JSON.`);
  }
  const bytes = await source.fetchFile(file('sae_weights.safetensors'), opts);
  if (!bytes)
    throw new LoupeError('FILE_NOT_FOUND', `No sae_weights.safetensors at ${file('sae_weights.safetensors')}.`);
  return { cfg, bytes };
}

/** The activation function named by a SAELens cfg (old `activation_fn_str` or newer `architecture`). */
function activationOf(cfg: Record<string, any>): { activation: SaeActivation; k?: number } {
  const arch = cfg.architecture ?? 'standard';
  const fn = cfg.activation_fn_str ?? cfg.activation_fn ?? (arch === 'topk' ? 'topk' : 'relu');
  if (arch === 'jumprelu') return { activation: 'jumprelu' };
  if (arch === 'topk' || fn === 'topk') {
    const k = cfg.activation_fn_kwargs?.k ?? cfg.k;
    if (!Number.isInteger(k) || k < 1)
      throw new LoupeError('BAD_CONFIG', 'A TopK SAE needs activation_fn_kwargs.k (a positive integer).');
    return { activation: 'topk', k };
  }
  if (arch === 'standard' && fn === 'relu') return { activation: 'relu' };
  throw new LoupeError(
    'UNSUPPORTED_CONFIG',
    `SAE architecture '${arch}' with activation '${fn}' is not supported.`,
    'Supported: standard (ReLU), jumprelu, topk.',
  );
}

/**
 * Validate an SAE against a model and rename its tensors into the model's weight index.
 * `hookDim(hook)` gives the hook's per-position size (d_in must equal it), or undefined for a
 * hook the model does not have.
 */
export function prepareSae(
  files: SaeFiles,
  id: string,
  slot: number,
  hookDim: (hook: string) => number | undefined,
): { spec: SaeGraphSpec; fileName: string } {
  const cfg = files.cfg;
  const hook = cfg.hook_name;
  if (typeof hook !== 'string') throw new LoupeError('BAD_CONFIG', 'SAE cfg.json has no hook_name.');
  const dIn = cfg.d_in;
  const dSae = cfg.d_sae;
  if (!Number.isInteger(dIn) || !Number.isInteger(dSae))
    throw new LoupeError('BAD_CONFIG', 'SAE cfg.json needs integer d_in and d_sae.');
  const norm = cfg.normalize_activations ?? 'none';
  if (norm !== 'none' && norm !== null)
    throw new LoupeError(
      'UNSUPPORTED_CONFIG',
      `normalize_activations '${norm}' is not supported.`,
      "Only SAEs trained with normalize_activations 'none' can be attached exactly.",
    );
  const want = hookDim(hook);
  if (want === undefined)
    throw mismatch(
      `The SAE reads ${hook}, which this model does not have (or which cannot be edited).`,
      "Load the model the SAE was trained on (cfg.json model_name) or pick an SAE for one of this model's hooks.",
    );
  if (want !== dIn)
    throw mismatch(
      `The SAE's d_in is ${dIn} but ${hook} has ${want} values per position in this model.`,
      `This SAE was trained on ${cfg.model_name ?? 'another model'}; pick one whose d_in matches.`,
    );
  const { activation, k } = activationOf(cfg);
  const fileName = `sae-${slot}.safetensors`;
  const header = parseSafetensors(files.bytes, 'sae_weights.safetensors');
  const byName = new Map(header.tensors.map((t) => [t.name, t]));
  const take = (name: string, shape: number[], required = true): TensorEntry | undefined => {
    const t = byName.get(name);
    if (!t) {
      if (!required) return undefined;
      throw new LoupeError(
        'MISSING_TENSOR',
        `sae_weights.safetensors has no ${name}.`,
        'SAELens SAEs store W_enc, b_enc, W_dec, b_dec (and threshold for JumpReLU).',
      );
    }
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i]))
      throw mismatch(`SAE tensor ${name} has shape [${t.shape}], expected [${shape}] from cfg.json.`);
    if (!['F32', 'F16', 'BF16'].includes(t.dtype))
      throw new LoupeError('SAFETENSORS_UNKNOWN_DTYPE', `SAE tensor ${name} has dtype ${t.dtype}.`);
    return { ...t, name: `sae${slot}.${name}`, file: fileName };
  };
  const spec: SaeGraphSpec = {
    info: {
      id,
      hook,
      d_in: dIn,
      d_sae: dSae,
      activation,
      ...(k ? { k } : {}),
      apply_b_dec_to_input: cfg.apply_b_dec_to_input !== false,
    },
    W_enc: take('W_enc', [dIn, dSae])!,
    b_enc: take('b_enc', [dSae])!,
    W_dec: take('W_dec', [dSae, dIn])!,
    b_dec: take('b_dec', [dIn])!,
    threshold: activation === 'jumprelu' ? take('threshold', [dSae]) : undefined,
  };
  if (activation === 'topk' && (k ?? 0) > dSae)
    throw new LoupeError('BAD_CONFIG', `TopK k=${k} exceeds d_sae=${dSae}.`);
  return { spec, fileName };
}

/** The model's weights plus one SAE file, as one weight set for a graph variant. */
export function withSaeWeights(weights: WeightSet, sae: SaeGraphSpec, fileName: string, bytes: Uint8Array): WeightSet {
  const tensors = new Map(weights.tensors);
  for (const t of [sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec, sae.threshold]) if (t) tensors.set(t.name, t);
  const files = new Map(weights.files);
  files.set(fileName, bytes);
  return { ...weights, files, tensors };
}
