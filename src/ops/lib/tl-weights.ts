/**
 * Weights processed as TransformerLens's `from_pretrained` processes them
 * (HookedTransformer.process_weights, in its order):
 *
 *  1. fold_ln: a norm's weight w (and LayerNorm's bias b) folded into the matrices that read it:
 *     W' = w[d]·W[d, …], b' = b_W + Σ_d b[d]·W[d, …] (W_Q/W_K/W_V ← ln1, W_in/W_gate ← ln2,
 *     W_U ← ln_final); LayerNorm: W' also centred over d_model (its input is centred anyway).
 *     The norms then read as w = 1, b = 0 (TL's LNPre / RMSPre).
 *  2. center_writing_weights (LayerNorm only): W_E, W_pos, W_O, b_O, W_out, b_out minus their mean
 *     over d_model.
 *  3. center_unembed: W_U minus its mean over the vocabulary, b_U minus its mean; logits are then
 *     the centred logits (logit − mean logit), as DLA's transformer_lens convention reads them.
 *  4. fold_value_biases: b_O += Σ_h b_V[h]·W_O[h], b_V = 0 (attention rows sum to one).
 *
 * So a processed forward with LNPre gives the same centred residual stream and the centred
 * logits. Not for models with post-norms (Gemma 2/3, OLMo 2), which TL's folding does not cover.
 */
import { LoupeError } from '../../engine/errors';
import type { LoadedModel } from '../../engine/api';
import type { Tensor } from '../../engine/tensor';

const f64 = (a: ArrayLike<number>) => Float64Array.from(a);
const t32 = (dims: number[], d: ArrayLike<number>): Tensor => ({ dims, data: Float32Array.from(d) });

/** x minus its mean over the last axis (size n), each row in float64 */
function centreLast(x: Float64Array, n: number): Float64Array {
  for (let r = 0; r < x.length / n; r++) {
    let s = 0;
    for (let i = 0; i < n; i++) s += x[r * n + i];
    s /= n;
    for (let i = 0; i < n; i++) x[r * n + i] -= s;
  }
  return x;
}

/**
 * A reader [G, D, E] matrix (G heads, or 1) folded with a norm (w, b over D): W' = w[d]·W, centred
 * over d when `centre`; bias' = bias + Σ_d b[d]·W[g, d, e]
 */
function foldReader(W: Tensor, bias: Float64Array | null, w: Float32Array, b: Float32Array | null, centre: boolean) {
  const [G, D, E] = W.dims.length === 3 ? W.dims : [1, ...W.dims];
  const out = new Float64Array(G * D * E);
  const bOut = bias ? Float64Array.from(bias) : new Float64Array(G * E);
  for (let g = 0; g < G; g++)
    for (let d = 0; d < D; d++)
      for (let e = 0; e < E; e++) {
        const v = W.data[(g * D + d) * E + e];
        out[(g * D + d) * E + e] = w[d] * v;
        if (b) bOut[g * E + e] += b[d] * v;
      }
  if (centre)
    for (let g = 0; g < G; g++)
      for (let e = 0; e < E; e++) {
        let s = 0;
        for (let d = 0; d < D; d++) s += out[(g * D + d) * E + e];
        s /= D;
        for (let d = 0; d < D; d++) out[(g * D + d) * E + e] -= s;
      }
  return { W: out, b: bOut };
}

/**
 * The processed weights of `model` (see the header), every name computed on first use and kept;
 * `read` is the unprocessed reader (model.param).
 */
export function processedReader(model: LoadedModel, read: (name: string) => Tensor): (name: string) => Tensor {
  const { info } = model;
  if (info.post_norms)
    throw new LoupeError(
      'BAD_INPUT',
      `${info.id} has norms after its attention and MLP outputs; TransformerLens's fold_ln does not fold them.`,
      'Read the unprocessed weights (model.weights, model.param(name)).',
    );
  const ln = info.norm === 'layernorm';
  const cache = new Map<string, Tensor>();
  const normOf = (prefix: string) => {
    if (!model.hasParam(`${prefix}.w`)) return null; // a block without this norm (OLMo 2's ln1/ln2)
    return { w: read(`${prefix}.w`).data, b: ln ? read(`${prefix}.b`).data : null };
  };
  const compute = (name: string): Tensor => {
    const m = /^blocks\.(\d+)\.(.+)$/.exec(name);
    const D = info.d_model;
    if (m) {
      const l = Number(m[1]);
      const leaf = m[2];
      const qkv = /^attn\.(W|b)_([QKV])$/.exec(leaf);
      if (qkv) {
        const which = qkv[2];
        const n = normOf(`blocks.${l}.ln1`);
        const W = read(`blocks.${l}.attn.W_${which}`);
        const bias = f64(read(`blocks.${l}.attn.b_${which}`).data);
        const f = n ? foldReader(W, bias, n.w, n.b, ln) : { W: f64(W.data), b: bias };
        if (which === 'V') f.b.fill(0); // fold_value_biases moved it into b_O
        return qkv[1] === 'W' ? t32(W.dims, f.W) : t32([W.dims[0], W.dims[2]], f.b);
      }
      if (leaf === 'mlp.W_in' || leaf === 'mlp.b_in' || leaf === 'mlp.W_gate') {
        const n = normOf(`blocks.${l}.ln2`);
        const W = read(`blocks.${l}.${leaf === 'mlp.W_gate' ? 'mlp.W_gate' : 'mlp.W_in'}`);
        const bias = leaf === 'mlp.W_gate' ? null : f64(read(`blocks.${l}.mlp.b_in`).data);
        const f = n ? foldReader(W, bias, n.w, n.b, ln) : { W: f64(W.data), b: bias ?? new Float64Array(0) };
        return leaf === 'mlp.b_in' ? t32([W.dims[1]], f.b) : t32(W.dims, f.W);
      }
      if (leaf === 'attn.W_O' || leaf === 'mlp.W_out' || leaf === 'mlp.b_out') {
        const t = read(name);
        return ln ? t32(t.dims, centreLast(f64(t.data), D)) : t;
      }
      if (leaf === 'attn.b_O') {
        const bO = f64(read(name).data);
        if (ln) centreLast(bO, D);
        const WO = get(`blocks.${l}.attn.W_O`); // centred, as TL folds after centring
        const bV = f64(read(`blocks.${l}.attn.b_V`).data);
        const n = normOf(`blocks.${l}.ln1`);
        const { n_heads: H, n_kv_heads: Hkv, d_head: Dh } = info;
        if (n?.b) {
          // b_V' = b_V + b_ln1 · W_V
          const WV = read(`blocks.${l}.attn.W_V`).data;
          for (let g = 0; g < Hkv; g++)
            for (let d = 0; d < D; d++)
              for (let e = 0; e < Dh; e++) bV[g * Dh + e] += n.b[d] * WV[(g * D + d) * Dh + e];
        }
        for (let h = 0; h < H; h++) {
          const g = Math.floor(h / (H / Hkv));
          for (let e = 0; e < Dh; e++) {
            const v = bV[g * Dh + e];
            if (v === 0) continue;
            for (let d = 0; d < D; d++) bO[d] += v * WO.data[(h * Dh + e) * D + d];
          }
        }
        return t32([D], bO);
      }
      if (/^ln\d\.w$/.test(leaf)) return t32([D], new Float64Array(D).fill(1));
      if (/^ln\d\.b$/.test(leaf)) return t32([D], new Float64Array(D));
      return read(name);
    }
    if (name === 'embed.W_E' || name === 'pos_embed.W_pos') {
      const t = read(name);
      return ln ? t32(t.dims, centreLast(f64(t.data), D)) : t;
    }
    if (name === 'unembed.W_U' || name === 'unembed.b_U') {
      const W = read('unembed.W_U');
      const n = normOf('ln_final');
      const f = n
        ? foldReader(W, f64(read('unembed.b_U').data), n.w, n.b, ln)
        : { W: f64(W.data), b: f64(read('unembed.b_U').data) };
      if (name === 'unembed.b_U') return t32([W.dims[1]], centreLast(f.b, f.b.length));
      return t32(W.dims, centreLast(f.W, W.dims[1]));
    }
    if (name === 'ln_final.w') return t32([D], new Float64Array(D).fill(1));
    if (name === 'ln_final.b') return t32([D], new Float64Array(D));
    return read(name);
  };
  const get = (name: string): Tensor => {
    let t = cache.get(name);
    if (!t) {
      t = compute(name);
      cache.set(name, t);
    }
    return t;
  };
  return get;
}
