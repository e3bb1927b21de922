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
  architecture?: 'standard' | 'jumprelu' | 'topk';
  k?: number;
  seed?: number;
  modelName?: string;
  applyBDec?: boolean;
}): RandomSae {
  const { hook, dIn, dSae } = opts;
  const g = gaussian(mulberry32(opts.seed ?? 5));
  const r = (n: number, s: number, mean = 0) => Float64Array.from({ length: n }, () => mean + s * g());
  const round = (a: Float64Array) => Float64Array.from(Float32Array.from(a));
  const W_enc = round(r(dIn * dSae, 1 / Math.sqrt(dIn)));
  const b_enc = round(r(dSae, 0.3, -0.1));
  const W_dec = round(r(dSae * dIn, 1 / Math.sqrt(dSae)));
  const b_dec = round(r(dIn, 0.2));
  const arch = opts.architecture ?? 'standard';
  const threshold =
    arch === 'jumprelu' ? round(Float64Array.from({ length: dSae }, () => Math.abs(0.5 * g()))) : undefined;
  const cfg: Record<string, any> = {
    architecture: arch,
    d_in: dIn,
    d_sae: dSae,
    hook_name: hook,
    hook_layer: Number(/blocks\.(\d+)/.exec(hook)?.[1] ?? 0),
    model_name: opts.modelName ?? 'test-model',
    apply_b_dec_to_input: opts.applyBDec ?? true,
    normalize_activations: 'none',
    dtype: 'float32',
    context_size: 64,
    prepend_bos: true,
    ...(arch === 'topk'
      ? { activation_fn_str: 'topk', activation_fn_kwargs: { k: opts.k ?? 4 } }
      : { activation_fn_str: 'relu' }),
  };
  const dir = mkdtempSync(path.join(tmpdir(), 'loupe-sae-'));
  writeFileSync(path.join(dir, 'cfg.json'), JSON.stringify(cfg));
  const tensors: Record<string, { dims: number[]; data: ArrayLike<number> }> = {
    W_enc: { dims: [dIn, dSae], data: W_enc },
    b_enc: { dims: [dSae], data: b_enc },
    W_dec: { dims: [dSae, dIn], data: W_dec },
    b_dec: { dims: [dIn], data: b_dec },
  };
  if (threshold) tensors.threshold = { dims: [dSae], data: threshold };
  writeFileSync(path.join(dir, 'sae_weights.safetensors'), encodeSafetensors(tensors));
  return { dir, cfg, W_enc, b_enc, W_dec, b_dec, threshold };
}

/** float64 SAELens encode for one position x (length d_in) */
export function saeEncode64(s: RandomSae, x: ArrayLike<number>): { pre: Float64Array; acts: Float64Array } {
  const { d_in: dIn, d_sae: dSae } = s.cfg;
  const pre = new Float64Array(dSae);
  for (let j = 0; j < dSae; j++) {
    let v = s.b_enc[j];
    for (let i = 0; i < dIn; i++) v += (x[i] - (s.cfg.apply_b_dec_to_input ? s.b_dec[i] : 0)) * s.W_enc[i * dSae + j];
    pre[j] = v;
  }
  let acts = pre.map((v) => Math.max(v, 0));
  if (s.cfg.architecture === 'jumprelu') acts = pre.map((v, j) => (v > s.threshold![j] ? Math.max(v, 0) : 0));
  if (s.cfg.architecture === 'topk') {
    const k = s.cfg.activation_fn_kwargs.k;
    const kth = [...pre].sort((a, b) => b - a)[k - 1];
    acts = pre.map((v) => (v >= kth ? Math.max(v, 0) : 0));
  }
  return { pre, acts };
}

export function saeDecode64(s: RandomSae, acts: ArrayLike<number>): Float64Array {
  const { d_in: dIn, d_sae: dSae } = s.cfg;
  const out = Float64Array.from(s.b_dec);
  for (let j = 0; j < dSae; j++)
    if (acts[j] !== 0) for (let i = 0; i < dIn; i++) out[i] += acts[j] * s.W_dec[j * dIn + i];
  return out;
}
