/** Random-weight SAEs in SAELens's on-disk layout (cfg.json + sae_weights.safetensors), for tests. */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { encodeSafetensors, mulberry32, gaussian } from '../reference';

export interface RandomSae {
  dir: string;
  cfg: Record<string, any>;
  W_enc: Float64Array;
  b_enc: Float64Array;
  W_dec: Float64Array;
  b_dec: Float64Array;
  threshold?: Float64Array;
}

export function makeRandomSae(opts: {
  hook: string;
  dIn: number;
  dSae: number;
  architecture?: 'standard' | 'jumprelu' | 'topk' | 'batchtopk' | 'matryoshka_batchtopk';
  k?: number;
  seed?: number;
  modelName?: string;
  applyBDec?: boolean;
  /**
   * gemma_scope_2: Gemma Scope 2's own files (config.json {hf_hook_point_in: `hfHook`, width, l0,
   * model_name, architecture "jump_relu"} + params.safetensors {w_enc, w_dec, b_enc, b_dec,
   * threshold}), a JumpReLU without b_dec subtracted, as the Gemma Scope 2 tutorial loads them
   */
  layout?: 'saelens' | 'gemma_scope_2';
  hfHook?: string;
  /** batchtopk / matryoshka_batchtopk: store `threshold` [d_sae] (SAELens's inference form), the training scalar `topk_threshold` (F64), or neither */
  batchThreshold?: 'threshold' | 'topk_threshold' | 'none';
  /** cfg rescale_acts_by_decoder_norm (SAELens TopK family) */
  rescale?: boolean;
}): RandomSae {
  const { hook, dIn, dSae } = opts;
  const g = gaussian(mulberry32(opts.seed ?? 5));
  const r = (n: number, s: number, mean = 0) => Float64Array.from({ length: n }, () => mean + s * g());
  const round = (a: Float64Array) => Float64Array.from(Float32Array.from(a));
  const W_enc = round(r(dIn * dSae, 1 / Math.sqrt(dIn)));
  const b_enc = round(r(dSae, 0.3, -0.1));
  const W_dec = round(r(dSae * dIn, 1 / Math.sqrt(dSae)));
  const b_dec = round(r(dIn, 0.2));
  const gs2 = opts.layout === 'gemma_scope_2';
  const arch = gs2 ? 'jumprelu' : (opts.architecture ?? 'standard');
  const batch = arch === 'batchtopk' || arch === 'matryoshka_batchtopk';
  const form = batch ? (opts.batchThreshold ?? 'threshold') : undefined;
  let threshold =
    arch === 'jumprelu' || form === 'threshold'
      ? round(Float64Array.from({ length: dSae }, () => Math.abs(0.5 * g())))
      : undefined;
  const topkThreshold = form === 'topk_threshold' ? 0.35 : undefined;
  if (topkThreshold !== undefined) threshold = new Float64Array(dSae).fill(topkThreshold);
  const dir = mkdtempSync(path.join(tmpdir(), 'loupe-sae-'));
  // the config the float64 encoder reads (SAELens's field names, whichever layout is written)
  const cfg: Record<string, any> = {
    architecture: arch,
    d_in: dIn,
    d_sae: dSae,
    hook_name: hook,
    hook_layer: Number(/blocks\.(\d+)/.exec(hook)?.[1] ?? 0),
    model_name: opts.modelName ?? 'test-model',
    apply_b_dec_to_input: gs2 ? false : (opts.applyBDec ?? true),
    normalize_activations: 'none',
    dtype: 'float32',
    context_size: 64,
    prepend_bos: true,
    ...(arch === 'topk' || batch
      ? { activation_fn_str: 'topk', activation_fn_kwargs: { k: opts.k ?? 4 } }
      : { activation_fn_str: 'relu' }),
    ...(opts.rescale ? { rescale_acts_by_decoder_norm: true } : {}),
    ...(form ? { threshold_form: form } : {}),
  };
  if (gs2) {
    writeFileSync(
      path.join(dir, 'config.json'),
      JSON.stringify({
        hf_hook_point_in: opts.hfHook ?? 'model.layers.0.output',
        width: dSae,
        l0: 20,
        model_name: opts.modelName ?? 'google/gemma-3-1b-pt',
        architecture: 'jump_relu',
      }),
    );
    const t: Record<string, { dims: number[]; data: ArrayLike<number> }> = {
      w_enc: { dims: [dIn, dSae], data: W_enc },
      w_dec: { dims: [dSae, dIn], data: W_dec },
      b_enc: { dims: [dSae], data: b_enc },
      b_dec: { dims: [dIn], data: b_dec },
      threshold: { dims: [dSae], data: threshold! },
    };
    writeFileSync(path.join(dir, 'params.safetensors'), encodeSafetensors(t));
    return { dir, cfg, W_enc, b_enc, W_dec, b_dec, threshold };
  }
  const saelensCfg = { ...cfg };
  delete saelensCfg.threshold_form;
  if (batch) saelensCfg.k = opts.k ?? 4; // SAELens's BatchTopK configs carry k at the top level
  writeFileSync(path.join(dir, 'cfg.json'), JSON.stringify(saelensCfg));
  const tensors: Record<string, { dims: number[]; data: ArrayLike<number> }> = {
    W_enc: { dims: [dIn, dSae], data: W_enc },
    b_enc: { dims: [dSae], data: b_enc },
    W_dec: { dims: [dSae, dIn], data: W_dec },
    b_dec: { dims: [dIn], data: b_dec },
  };
  if (threshold && form !== 'topk_threshold') tensors.threshold = { dims: [dSae], data: threshold };
  writeFileSync(path.join(dir, 'sae_weights.safetensors'), encodeSafetensors(tensors));
  if (topkThreshold !== undefined) {
    // a training checkpoint's buffer: a float64 scalar beside the weights (encodeSafetensors writes one dtype per call)
    writeFileSync(path.join(dir, 'sae_weights.safetensors'), withF64Scalar(tensors, 'topk_threshold', topkThreshold));
  }
  return { dir, cfg, W_enc, b_enc, W_dec, b_dec, threshold };
}

/** a float32 safetensors file of `tensors` plus one float64 scalar (written by hand: 8-byte length, header, data) */
function withF64Scalar(
  tensors: Record<string, { dims: number[]; data: ArrayLike<number> }>,
  name: string,
  value: number,
): Uint8Array {
  const header: Record<string, unknown> = {};
  let off = 0;
  const parts: Uint8Array[] = [];
  for (const [k, t] of Object.entries(tensors)) {
    const b = new Uint8Array(Float32Array.from(t.data).buffer);
    header[k] = { dtype: 'F32', shape: t.dims, data_offsets: [off, off + b.length] };
    parts.push(b);
    off += b.length;
  }
  header[name] = { dtype: 'F64', shape: [], data_offsets: [off, off + 8] };
  parts.push(new Uint8Array(Float64Array.of(value).buffer));
  let json = JSON.stringify(header);
  while ((json.length + 8) % 8) json += ' ';
  const jb = new TextEncoder().encode(json);
  const out = new Uint8Array(8 + jb.length + off + 8);
  new DataView(out.buffer).setBigUint64(0, BigInt(jb.length), true);
  out.set(jb, 8);
  let at = 8 + jb.length;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** the decoder norm of every feature (rescale_acts_by_decoder_norm), else 1s */
function decNorms(s: RandomSae): Float64Array {
  const { d_in: dIn, d_sae: dSae } = s.cfg;
  return Float64Array.from({ length: dSae }, (_, f) => {
    if (!s.cfg.rescale_acts_by_decoder_norm) return 1;
    let q = 0;
    for (let i = 0; i < dIn; i++) q += s.W_dec[f * dIn + i] ** 2;
    return Math.sqrt(q);
  });
}

/** the residual change per unit of feature f: W_dec[f] (÷ ‖W_dec[f]‖ with rescale_acts_by_decoder_norm) */
export function decoderRow(s: RandomSae, f: number): Float64Array {
  const dIn = s.cfg.d_in;
  const n = decNorms(s)[f];
  return Float64Array.from(s.W_dec.subarray(f * dIn, (f + 1) * dIn), (v) => v / n);
}

/**
 * float64 encode for one position x, as SAELens's inference classes compute it (standard_sae.py,
 * jumprelu_sae.py, topk_sae.py): pre = (x − b_dec·apply_b_dec_to_input)·W_enc + b_enc, × ‖W_dec[f]‖
 * with rescale_acts_by_decoder_norm; standard relu(pre), jumprelu relu(pre)·[pre > θ], topk the k
 * largest pre ReLU'd. BatchTopK / Matryoshka (saved as JumpReLU, batchtopk_sae.py): jumprelu with the
 * stored threshold or the broadcast topk_threshold; with neither, topk(round k). Gemma Scope 2: jumprelu
 * with no b_dec subtracted (its tutorial's JumpReLUSAE.encode).
 */
export function saeEncode64(s: RandomSae, x: ArrayLike<number>): { pre: Float64Array; acts: Float64Array } {
  const { d_in: dIn, d_sae: dSae } = s.cfg;
  const norms = decNorms(s);
  const pre = new Float64Array(dSae);
  for (let j = 0; j < dSae; j++) {
    let v = s.b_enc[j];
    for (let i = 0; i < dIn; i++) v += (x[i] - (s.cfg.apply_b_dec_to_input ? s.b_dec[i] : 0)) * s.W_enc[i * dSae + j];
    pre[j] = v * norms[j];
  }
  const arch = s.cfg.architecture;
  const batch = arch === 'batchtopk' || arch === 'matryoshka_batchtopk';
  const jump = arch === 'jumprelu' || (batch && s.cfg.threshold_form !== 'none');
  let acts = pre.map((v) => Math.max(v, 0));
  if (jump) acts = pre.map((v, j) => (v > s.threshold![j] ? Math.max(v, 0) : 0));
  else if (arch === 'topk' || batch) {
    const k = Math.round(s.cfg.activation_fn_kwargs.k);
    const kth = [...pre].sort((a, b) => b - a)[k - 1];
    acts = pre.map((v) => (v >= kth ? Math.max(v, 0) : 0));
  }
  return { pre, acts };
}

/** float64 decode: acts (÷ ‖W_dec‖ with rescale) · W_dec + b_dec */
export function saeDecode64(s: RandomSae, acts: ArrayLike<number>): Float64Array {
  const { d_in: dIn, d_sae: dSae } = s.cfg;
  const norms = decNorms(s);
  const out = Float64Array.from(s.b_dec);
  for (let j = 0; j < dSae; j++)
    if (acts[j] !== 0) for (let i = 0; i < dIn; i++) out[i] += (acts[j] / norms[j]) * s.W_dec[j * dIn + i];
  return out;
}
