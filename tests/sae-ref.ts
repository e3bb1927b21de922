/**
 * Float64 oracles for the SAE operation tests, computed from the models' own safetensors (via
 * tests/reference, which imports nothing from src/) and the random SAEs' float64 weights.
 */
import { referenceForward, type RefModel } from './reference';
import { saeEncode64, saeDecode64, decoderRow, type RandomSae } from './helpers/random-sae';
import { SHARED } from './helpers/shared';

export const INDUCTION = SHARED + '/models/induction-gpt2';
export const STORIES = SHARED + '/models/stories260K';

const isGpt2 = (m: RefModel) => m.config.model_type === 'gpt2';

/** W_U[:, t] (both shared models tie the unembedding to the embedding) */
export function unembedCol(m: RefModel, t: number): Float64Array {
  const w = isGpt2(m)
    ? m.tensors['transformer.wte.weight']
    : (m.tensors['lm_head.weight'] ?? m.tensors['model.embed_tokens.weight']);
  const D = w.dims[1];
  return Float64Array.from({ length: D }, (_, j) => w.data[t * D + j]);
}

export function finalNormWeight(m: RefModel): Float64Array {
  return Float64Array.from(
    (isGpt2(m) ? m.tensors['transformer.ln_f.weight'] : m.tensors['model.norm.weight']).data as ArrayLike<number>,
  );
}

/** the readout e of token t with final-norm scale s: (w ⊙ W_U[:, t]) (centred for LayerNorm) / s */
export function readout64(m: RefModel, t: number, s: number): Float64Array {
  const u = unembedCol(m, t);
  const w = finalNormWeight(m);
  const e = u.map((v, j) => v * w[j]);
  if (isGpt2(m)) {
    const mu = e.reduce((a, b) => a + b, 0) / e.length;
    for (let j = 0; j < e.length; j++) e[j] -= mu;
  }
  return e.map((v) => v / s);
}

/** direct logit weights of a residual direction r: ((r − mean r) for LayerNorm) ⊙ w_lnf · W_U */
export function logitWeights64(m: RefModel, r: Float64Array): Float64Array {
  const w = finalNormWeight(m);
  let x = Float64Array.from(r);
  if (isGpt2(m)) {
    const mu = x.reduce((a, b) => a + b, 0) / x.length;
    x = x.map((v) => v - mu);
  }
  x = x.map((v, j) => v * w[j]);
  const V = isGpt2(m) ? m.tensors['transformer.wte.weight'].dims[0] : m.tensors['lm_head.weight'].dims[0];
  return Float64Array.from({ length: V }, (_, t) => unembedCol(m, t).reduce((a, u, j) => a + u * x[j], 0));
}

/** attn.hook_z-space readout: e_z[h·Dh + i] = Σ_d W_O[h, i, d] e_d (Llama o_proj.weight is [D, H·Dh]) */
export function pullThroughWO(m: RefModel, layer: number, e: Float64Array): Float64Array {
  if (isGpt2(m)) {
    const w = m.tensors[`transformer.h.${layer}.attn.c_proj.weight`]; // Conv1D [in = H·Dh, out = D]
    const [HD, D] = w.dims;
    return Float64Array.from({ length: HD }, (_, r) => {
      let s = 0;
      for (let d = 0; d < D; d++) s += w.data[r * D + d] * e[d];
      return s;
    });
  }
  const w = m.tensors[`model.layers.${layer}.self_attn.o_proj.weight`];
  const [D, HD] = w.dims;
  return Float64Array.from({ length: HD }, (_, r) => {
    let s = 0;
    for (let d = 0; d < D; d++) s += w.data[d * HD + r] * e[d];
    return s;
  });
}

export function argmax64(a: ArrayLike<number>, start = 0, n = a.length - start): number {
  let b = 0;
  for (let i = 1; i < n; i++) if (a[start + i] > a[start + b]) b = i;
  return b;
}

/** the float64 forward's hook value, the SAE's float64 encoding of it per position, and the logits */
export function saeReference(m: RefModel, sae: RandomSae, tokens: number[]) {
  const hook = sae.cfg.hook_name as string;
  const res = referenceForward(m, tokens, { record: (n) => n === hook || n === 'ln_final.hook_scale' });
  const dIn = sae.cfg.d_in as number;
  const T = tokens.length;
  const x = res.hooks[hook].data;
  const acts: Float64Array[] = [];
  const recons: Float64Array[] = [];
  for (let t = 0; t < T; t++) {
    const a = saeEncode64(sae, x.subarray(t * dIn, (t + 1) * dIn)).acts;
    acts.push(a);
    recons.push(saeDecode64(sae, a));
  }
  return {
    x,
    acts,
    recons,
    scale: res.hooks['ln_final.hook_scale'].data,
    logits: res.logits.data,
    V: res.logits.dims[2],
  };
}

/**
 * Reference forward with feature f edited at the SAE's hook at `positions` (all when undefined):
 * add: x += α·W_dec[f]; clamp: x += (v − acts_f(x))·W_dec[f] with acts from the float64 encoder.
 */
export function steeredForward(
  m: RefModel,
  sae: RandomSae,
  tokens: number[],
  f: number,
  edit: 'add' | 'clamp',
  v: number,
  positions?: number[],
) {
  const hook = sae.cfg.hook_name as string;
  const dIn = sae.cfg.d_in as number;
  const dec = decoderRow(sae, f);
  return referenceForward(m, tokens, {
    record: false,
    hook: (name, value) => {
      if (name !== hook) return;
      const out = Float64Array.from(value);
      const T = value.length / dIn;
      for (let t = 0; t < T; t++) {
        if (positions && !positions.includes(t)) continue;
        const x = value.subarray(t * dIn, (t + 1) * dIn);
        const delta = edit === 'add' ? v : v - saeEncode64(sae, x).acts[f];
        for (let i = 0; i < dIn; i++) out[t * dIn + i] += delta * dec[i];
      }
      return out;
    },
  });
}
