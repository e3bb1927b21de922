/**
 * Sparse autoencoders in SAELens's layout (cfg.json + sae_weights.safetensors with W_enc [d_in,
 * d_sae], b_enc, W_dec [d_sae, d_in], b_dec, and `threshold` for JumpReLU) or in Gemma Scope 2's own
 * (config.json + params.safetensors, gemma-scope.ts), attached to a model at their hook. The graph
 * then computes, where the activation x lives (WebGPU/WASM/CPU):
 *   acts   = act((x − b_dec·apply_b_dec_to_input) · W_enc + b_enc)        → {hook}.hook_sae_acts_post (a site)
 *   recons = acts · W_dec + b_dec                                         → {hook}.hook_sae_recons
 *   error  = x − recons                                                   → {hook}.hook_sae_error
 *   x'     = x + (acts'·W_dec − acts·W_dec) = recons' + error   (acts' = acts after feature interventions)
 * so with no feature intervention x' = x exactly, and clamping/adding a feature changes the stream
 * by exactly (acts' − acts) · W_dec, the reconstruction error kept (SAELens's error term).
 *
 * Architectures, as SAELens 6 runs them at inference (sae_lens/saes/*.py): standard (ReLU), jumprelu
 * (relu(pre)·[pre > threshold]), topk (the k largest pre-activations, ReLU'd). batchtopk and
 * matryoshka_batchtopk are training architectures that SAELens saves as JumpReLU with threshold =
 * its running topk_threshold (batchtopk_sae.py process_state_dict_for_saving_inference): a cfg naming
 * them runs as JumpReLU with the stored `threshold` [d_sae] or the scalar `topk_threshold`, and as
 * TopK with round(k) where neither is stored. `rescale_acts_by_decoder_norm` (TopK family) is folded
 * at load as SAELens folds it (topk_sae.py _fold_norm_topk: W_enc·‖W_dec‖, b_enc·‖W_dec‖, W_dec/‖W_dec‖).
 */
import { LoupeError } from './errors';
import { decodeValues, DTYPE_BYTES, parseSafetensors } from './safetensors';
import type { TensorEntry, WeightSet } from './safetensors-types';
import type { FetchOptions, ModelSource } from './source/types';
import {
  GEMMA_SCOPE_2_CONFIG,
  GEMMA_SCOPE_2_PARAMS,
  GEMMA_SCOPE_2_TENSORS,
  parseGemmaScope2Config,
} from './gemma-scope';

export type SaeActivation = 'relu' | 'jumprelu' | 'topk';

export type SaeLayout = 'saelens' | 'gemma_scope_2';

export interface SaeInfo {
  id: string;
  /** the files' layout */
  layout: SaeLayout;
  /** the cfg's architecture as written (e.g. batchtopk), which `activation` runs */
  architecture: string;
  hook: string;
  d_in: number;
  d_sae: number;
  activation: SaeActivation;
  k?: number;
  apply_b_dec_to_input: boolean;
}

export interface SaeFiles {
  /** cfg.json (SAELens) or config.json (Gemma Scope 2) */
  cfg: Record<string, any>;
  /** raw bytes of sae_weights.safetensors (SAELens) or params.safetensors (Gemma Scope 2) */
  bytes: Uint8Array;
  /** default saelens */
  layout?: SaeLayout;
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

/**
 * Fetch an SAE from a source (a Hub repo, URL or folder); `path` is the SAE's folder inside it ('' for
 * the root). SAELens's cfg.json first; where there is none, Gemma Scope 2's config.json.
 */
export async function loadSaeFiles(source: ModelSource, path: string, opts: FetchOptions = {}): Promise<SaeFiles> {
  const p = path.replace(/^\/+|\/+$/g, '');
  const file = (f: string) => (p ? `${p}/${f}` : f);
  let layout: SaeLayout = 'saelens';
  let cfgBytes = await source.fetchFile(file('cfg.json'), { ...opts, optional: true });
  if (!cfgBytes) {
    cfgBytes = await source.fetchFile(file(GEMMA_SCOPE_2_CONFIG), { ...opts, optional: true });
    layout = 'gemma_scope_2';
  }
  if (!cfgBytes)
    throw new LoupeError(
      'FILE_NOT_FOUND',
      `No cfg.json or ${GEMMA_SCOPE_2_CONFIG} at ${file('')}.`,
      'An SAE is a folder with cfg.json and sae_weights.safetensors (SAELens), ' +
        'or config.json and params.safetensors (Gemma Scope 2); check the path inside the repository.',
    );
  const cfgName = file(layout === 'saelens' ? 'cfg.json' : GEMMA_SCOPE_2_CONFIG);
  let cfg: Record<string, any>;
  try {
    cfg = JSON.parse(new TextDecoder().decode(cfgBytes));
  } catch {
    throw new LoupeError('BAD_CONFIG', `${cfgName} is not valid JSON.`);
  }
  if (!cfg || typeof cfg !== 'object' || Array.isArray(cfg))
    throw new LoupeError('BAD_CONFIG', `${cfgName} is not a JSON object.`);
  const weights = file(layout === 'saelens' ? 'sae_weights.safetensors' : GEMMA_SCOPE_2_PARAMS);
  const bytes = await source.fetchFile(weights, opts);
  if (!bytes) throw new LoupeError('FILE_NOT_FOUND', `No ${weights}.`);
  return { cfg, bytes, layout };
}

interface Activation {
  activation: SaeActivation;
  k?: number;
  /** jumprelu from a training checkpoint's scalar topk_threshold, broadcast to every feature */
  scalarThreshold?: boolean;
}

/** How a SAELens cfg (old `activation_fn_str` or newer `architecture`) runs at inference, given the stored tensors. */
function activationOf(cfg: Record<string, any>, has: (name: string) => boolean): Activation {
  const arch = cfg.architecture ?? 'standard';
  const fn = cfg.activation_fn_str ?? cfg.activation_fn ?? (arch === 'topk' ? 'topk' : 'relu');
  const kOf = (round: boolean) => {
    const k = cfg.activation_fn_kwargs?.k ?? cfg.k;
    const n = round && typeof k === 'number' ? Math.round(k) : k;
    if (!Number.isInteger(n) || n < 1)
      throw new LoupeError('BAD_CONFIG', `A ${arch} SAE needs k (activation_fn_kwargs.k or k), a positive number.`);
    return n as number;
  };
  if (arch === 'jumprelu') return { activation: 'jumprelu' };
  if (arch === 'batchtopk' || arch === 'matryoshka_batchtopk') {
    if (has('threshold')) return { activation: 'jumprelu' };
    if (has('topk_threshold')) return { activation: 'jumprelu', scalarThreshold: true };
    return { activation: 'topk', k: kOf(true) };
  }
  if (arch === 'topk' || fn === 'topk') return { activation: 'topk', k: kOf(false) };
  if (arch === 'standard' && fn === 'relu') return { activation: 'relu' };
  throw new LoupeError(
    'UNSUPPORTED_CONFIG',
    `SAE architecture '${arch}' with activation '${fn}' is not supported.`,
    'Supported: standard (ReLU), jumprelu, topk, batchtopk, matryoshka_batchtopk.',
    { field: 'architecture', value: arch },
  );
}

/** The SAE's cfg fields in one form, whichever layout it came in */
interface SaeConfig {
  hook: string;
  dIn: number;
  dSae: number;
  applyBDec: boolean;
  names: Record<'W_enc' | 'b_enc' | 'W_dec' | 'b_dec' | 'threshold', string>;
  activation: Activation;
  architecture: string;
  rescale: boolean;
  modelName?: string;
}

function configOf(files: SaeFiles, byName: Map<string, TensorEntry>): SaeConfig {
  const cfg = files.cfg;
  if ((files.layout ?? 'saelens') === 'gemma_scope_2') {
    const g = parseGemmaScope2Config(cfg);
    if (g.hookOut || byName.has(GEMMA_SCOPE_2_TENSORS.W_skip))
      throw mismatch(
        `This Gemma Scope 2 folder is a transcoder (it reads ${g.hfHookIn} and writes ${g.hfHookOut ?? 'with an affine skip'}), not an SAE.`,
        'Load it as a transcoder set (attribution_graph); SAEs reconstruct the activation they read.',
      );
    const wEnc = byName.get(GEMMA_SCOPE_2_TENSORS.W_enc);
    if (!wEnc || wEnc.shape.length !== 2)
      throw new LoupeError(
        'MISSING_TENSOR',
        `${GEMMA_SCOPE_2_PARAMS} has no 2-D w_enc.`,
        'Gemma Scope 2 stores w_enc [d_in, width].',
      );
    const [dIn, dSae] = wEnc.shape;
    if (g.width !== undefined && g.width !== dSae)
      throw mismatch(`config.json width is ${g.width} but w_enc has ${dSae} features.`);
    return {
      hook: g.hookIn,
      dIn,
      dSae,
      applyBDec: false,
      names: GEMMA_SCOPE_2_TENSORS,
      activation: { activation: 'jumprelu' },
      architecture: 'jump_relu',
      rescale: false,
      modelName: g.modelName,
    };
  }
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
      { field: 'normalize_activations', value: norm },
    );
  return {
    hook,
    dIn,
    dSae,
    applyBDec: cfg.apply_b_dec_to_input !== false,
    names: { W_enc: 'W_enc', b_enc: 'b_enc', W_dec: 'W_dec', b_dec: 'b_dec', threshold: 'threshold' },
    activation: activationOf(cfg, (n) => byName.has(n)),
    architecture: String(cfg.architecture ?? 'standard'),
    rescale: cfg.rescale_acts_by_decoder_norm === true,
    modelName: typeof cfg.model_name === 'string' ? cfg.model_name : undefined,
  };
}

/** The SAE's hook must be one of the model's editable hooks, with d_in values per position. */
function checkSaeHook(
  hook: string,
  dIn: number,
  modelName: string | undefined,
  hookDim: (hook: string) => number | undefined,
) {
  const want = hookDim(hook);
  if (want === undefined)
    throw mismatch(
      `The SAE reads ${hook}, which this model does not have (or which cannot be edited).`,
      "Load the model the SAE was trained on (cfg.json model_name) or pick an SAE for one of this model's hooks.",
    );
  if (want !== dIn)
    throw mismatch(
      `The SAE's d_in is ${dIn} but ${hook} has ${want} values per position in this model.`,
      `This SAE was trained on ${modelName ?? 'another model'}; pick one whose d_in matches.`,
    );
}

/**
 * SAELens's cfg.json judged against a model before the weights are fetched: its hook_name and d_in
 * (prepareSae checks them again, with the rest of the config, once the tensors are in).
 */
export function checkSaeConfig(cfg: Record<string, unknown>, hookDim: (hook: string) => number | undefined): void {
  const { hook_name: hook, d_in: dIn, model_name: name } = cfg;
  if (typeof hook !== 'string' || typeof dIn !== 'number' || !Number.isInteger(dIn)) return;
  checkSaeHook(hook, dIn, typeof name === 'string' ? name : undefined, hookDim);
}

/**
 * Validate an SAE against a model and rename its tensors into the model's weight index.
 * `hookDim(hook)` gives the hook's per-position size (d_in must equal it), or undefined for a
 * hook the model does not have. `files` are the bytes the weight set gets: the SAE's file, and a
 * float32 file of what was derived at load (a folded decoder norm, a broadcast threshold).
 */
export function prepareSae(
  files: SaeFiles,
  id: string,
  slot: number,
  hookDim: (hook: string) => number | undefined,
): { spec: SaeGraphSpec; files: Map<string, Uint8Array> } {
  const fileName = `sae-${slot}.safetensors`;
  const derivedName = `sae-${slot}-derived.f32`;
  const header = parseSafetensors(files.bytes, fileName);
  const byName = new Map(header.tensors.map((t) => [t.name, t]));
  const c = configOf(files, byName);
  const { hook, dIn, dSae } = c;
  checkSaeHook(hook, dIn, c.modelName, hookDim);
  const { activation, k } = c.activation;
  const take = (role: keyof SaeConfig['names'], shape: number[]): TensorEntry => {
    const name = c.names[role];
    const t = byName.get(name);
    if (!t)
      throw new LoupeError(
        'MISSING_TENSOR',
        `The SAE's weights have no ${name}.`,
        files.layout === 'gemma_scope_2'
          ? 'Gemma Scope 2 stores w_enc, w_dec, b_enc, b_dec and threshold.'
          : 'SAELens SAEs store W_enc, b_enc, W_dec, b_dec (and threshold for JumpReLU).',
      );
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i]))
      throw mismatch(`SAE tensor ${name} has shape [${t.shape}], expected [${shape}] from its config.`);
    if (!['F32', 'F16', 'BF16'].includes(t.dtype))
      throw new LoupeError('SAFETENSORS_UNKNOWN_DTYPE', `SAE tensor ${name} has dtype ${t.dtype}.`);
    return { ...t, name: `sae${slot}.${role}`, file: fileName };
  };
  if (activation === 'topk' && (k ?? 0) > dSae)
    throw new LoupeError('BAD_CONFIG', `TopK k=${k} exceeds d_sae=${dSae}.`);
  const spec: SaeGraphSpec = {
    info: {
      id,
      layout: files.layout ?? 'saelens',
      architecture: c.architecture,
      hook,
      d_in: dIn,
      d_sae: dSae,
      activation,
      ...(k ? { k } : {}),
      apply_b_dec_to_input: c.applyBDec,
    },
    W_enc: take('W_enc', [dIn, dSae]),
    b_enc: take('b_enc', [dSae]),
    W_dec: take('W_dec', [dSae, dIn]),
    b_dec: take('b_dec', [dIn]),
    threshold: activation === 'jumprelu' && !c.activation.scalarThreshold ? take('threshold', [dSae]) : undefined,
  };
  const out = new Map([[fileName, files.bytes]]);
  // what is derived at load: float32 tensors in one more file, addressed by offset (no header needed)
  const derived: { name: string; shape: number[]; data: Float32Array }[] = [];
  const values = (e: TensorEntry) => {
    const n = e.shape.reduce((a, b) => a * b, 1);
    const v = new Float32Array(n);
    const raw = files.bytes.subarray(e.fileOffset, e.fileOffset + n * DTYPE_BYTES[e.dtype]);
    if (e.dtype === 'F64') {
      // SAELens keeps topk_threshold in double precision
      const dv = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
      for (let i = 0; i < n; i++) v[i] = dv.getFloat64(8 * i, true);
    } else if (['F32', 'F16', 'BF16'].includes(e.dtype)) decodeValues(e.dtype, raw, 0, n, v);
    else throw new LoupeError('SAFETENSORS_UNKNOWN_DTYPE', `SAE tensor ${e.name} has dtype ${e.dtype}.`);
    return v;
  };
  if (c.activation.scalarThreshold) {
    const t = byName.get('topk_threshold')!;
    if (t.shape.reduce((a, b) => a * b, 1) !== 1)
      throw mismatch(`SAE tensor topk_threshold has shape [${t.shape}], not a scalar.`);
    derived.push({ name: 'threshold', shape: [dSae], data: new Float32Array(dSae).fill(values(t)[0]) });
  }
  if (c.rescale) {
    const wEnc = values(spec.W_enc),
      bEnc = values(spec.b_enc),
      wDec = values(spec.W_dec);
    for (let f = 0; f < dSae; f++) {
      let s = 0;
      for (let i = 0; i < dIn; i++) s += wDec[f * dIn + i] ** 2;
      const n = Math.sqrt(s);
      bEnc[f] *= n;
      for (let i = 0; i < dIn; i++) {
        wDec[f * dIn + i] /= n;
        wEnc[i * dSae + f] *= n;
      }
    }
    derived.push(
      { name: 'W_enc', shape: [dIn, dSae], data: wEnc },
      { name: 'b_enc', shape: [dSae], data: bEnc },
      { name: 'W_dec', shape: [dSae, dIn], data: wDec },
    );
  }
  if (derived.length) {
    const bytes = new Uint8Array(derived.reduce((a, d) => a + 4 * d.data.length, 0));
    let offset = 0;
    for (const d of derived) {
      bytes.set(new Uint8Array(d.data.buffer), offset);
      const e: TensorEntry = {
        name: `sae${slot}.${d.name}`,
        dtype: 'F32',
        shape: d.shape,
        fileOffset: offset,
        byteLength: 4 * d.data.length,
        file: derivedName,
      };
      (spec as any)[d.name] = e;
      offset += e.byteLength;
    }
    out.set(derivedName, bytes);
  }
  return { spec, files: out };
}

/** The model's weights plus an SAE's files (prepareSae), as one weight set for a graph variant. */
export function withSaeWeights(weights: WeightSet, sae: SaeGraphSpec, saeFiles: Map<string, Uint8Array>): WeightSet {
  const tensors = new Map(weights.tensors);
  for (const t of [sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec, sae.threshold]) if (t) tensors.set(t.name, t);
  const files = new Map(weights.files);
  for (const [name, bytes] of saeFiles) files.set(name, bytes);
  return { ...weights, files, tensors };
}
