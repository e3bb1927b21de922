/**
 * Test-side direct logit attribution, computed from the float64 reference forward's hooks and
 * the Hugging Face tensors (not from src/): the oracle for trace's numbers and the logit lens.
 * The folded value bias b_V'[h]·W_O[h] is MEASURED, not derived from parameters: a second
 * reference run with every ln1.hook_scale replaced by 1e30 makes each value vector equal to
 * b_ln1·W_V + b_V = b_V', so that run's hook_result is exactly b_V'[h]·W_O[h].
 */
import { referenceForward, type ForwardResult, type RefModel } from './reference';

export type Convention = 'transformer_lens' | 'raw';

export interface RefReadout {
  D: number;
  V: number;
  layerNorm: boolean;
  /** final-norm weight (effective: Gemma's 1 + w) and bias */
  w: Float64Array;
  b: Float64Array | null;
  eps: number;
  /** HF unembedding [V, D] */
  WU: ArrayLike<number>;
  bU: ArrayLike<number> | null;
  softcap: number | null;
  /** post-attention norm weights (Gemma 2/3: 1 + w; OLMo 2: w) per layer, else null */
  postAttn: (Float64Array | null)[];
  family: string;
}

const f64 = (a: ArrayLike<number>) => Float64Array.from(a);

export function refReadout(m: RefModel): RefReadout {
  // Gemma 3's multimodal checkpoints nest the decoder's config (text_config) and weights (language_model.model.*)
  const c = m.config.text_config ?? m.config;
  const t = m.tensors;
  const family = (m.config.model_type === 'gemma3_text' ? 'gemma3' : m.config.model_type) as string;
  const pre = t['language_model.model.embed_tokens.weight']
    ? 'language_model.model.'
    : t['model.language_model.embed_tokens.weight']
      ? 'model.language_model.'
      : 'model.';
  const D = (c.n_embd ?? c.hidden_size) as number;
  const V = c.vocab_size as number;
  const L = (c.n_layer ?? c.num_hidden_layers) as number;
  const gemma = family === 'gemma' || family === 'gemma2' || family === 'gemma3';
  const postNorms = family === 'gemma2' || family === 'gemma3' || family === 'olmo2';
  let w: Float64Array,
    b: Float64Array | null = null,
    WU: ArrayLike<number>,
    bU: ArrayLike<number> | null = null,
    eps: number;
  if (family === 'gpt2') {
    w = f64(t['transformer.ln_f.weight'].data);
    b = f64(t['transformer.ln_f.bias'].data);
    WU = (t['lm_head.weight'] ?? t['transformer.wte.weight']).data;
    eps = c.layer_norm_epsilon;
  } else if (family === 'gpt_neox') {
    w = f64(t['gpt_neox.final_layer_norm.weight'].data);
    b = f64(t['gpt_neox.final_layer_norm.bias'].data);
    WU = (t['embed_out.weight'] ?? t['gpt_neox.embed_in.weight']).data;
    eps = c.layer_norm_eps;
  } else {
    w = f64(t[`${pre}norm.weight`].data);
    if (gemma) for (let d = 0; d < D; d++) w[d] += 1;
    WU = (t['lm_head.weight'] ?? t['language_model.lm_head.weight'] ?? t[`${pre}embed_tokens.weight`]).data;
    bU = t['lm_head.bias']?.data ?? null;
    eps = c.rms_norm_eps ?? 1e-6; // Gemma3TextConfig's default
  }
  const postAttn: (Float64Array | null)[] = [];
  for (let l = 0; l < L; l++) {
    const pw = t[`${pre}layers.${l}.post_attention_layernorm.weight`];
    if (postNorms && pw) {
      const x = f64(pw.data);
      if (gemma) for (let d = 0; d < D; d++) x[d] += 1;
      postAttn.push(x);
    } else postAttn.push(null);
  }
  return {
    D,
    V,
    layerNorm: family === 'gpt2' || family === 'gpt_neox',
    w,
    b,
    eps,
    WU,
    bU,
    softcap: family === 'gemma2' || family === 'gemma3' ? (c.final_logit_softcapping ?? null) : null,
    postAttn,
    family,
  };
}

/** u = W_U[:, t] (raw), centred over the vocabulary (TL), or u_a − u_c (difference) */
function unembedCol(r: RefReadout, tok: number, conv: Convention, cf?: number): { u: Float64Array; bias: number } {
  const u = new Float64Array(r.D);
  for (let d = 0; d < r.D; d++) u[d] = r.WU[tok * r.D + d];
  let bias = r.bU ? r.bU[tok] : 0;
  if (cf !== undefined) {
    for (let d = 0; d < r.D; d++) u[d] -= r.WU[cf * r.D + d];
    if (r.bU) bias -= r.bU[cf];
  } else if (conv === 'transformer_lens') {
    for (let d = 0; d < r.D; d++) {
      let s = 0;
      for (let v = 0; v < r.V; v++) s += r.WU[v * r.D + d];
      u[d] -= s / r.V;
    }
    if (r.bU) {
      let s = 0;
      for (let v = 0; v < r.V; v++) s += r.bU[v];
      bias -= s / r.V;
    }
  }
  return { u, bias };
}

export function foldRun(m: RefModel, tokens: number[]): ForwardResult {
  // a block without ln1 (OLMo 2, whose projections have no bias) has b_V' = b_V = 0: its values are zeroed
  const sawLn1 = new Set<string>();
  return referenceForward(m, tokens, {
    hook: (name, value) => {
      const block = name.slice(0, name.indexOf('.', 'blocks.'.length));
      if (/^blocks\.\d+\.ln1\.hook_scale$/.test(name)) {
        sawLn1.add(block);
        return new Float64Array(value.length).fill(1e30);
      }
      if (/^blocks\.\d+\.attn\.hook_v$/.test(name) && !sawLn1.has(block)) return new Float64Array(value.length);
      return undefined;
    },
    record: (n) => n.endsWith('attn.hook_result'),
  });
}

/**
 * Every decomposition term (same names as trace's) at position p, from reference hooks.
 * `fold` (from foldRun) is needed for the transformer_lens convention.
 */
export function refTerms(
  r: RefReadout,
  fwd: ForwardResult,
  p: number,
  tok: number,
  conv: Convention,
  opts: { cf?: number; fold?: ForwardResult; H: number; L: number },
): { terms: Map<string, number>; target: number } {
  const { D, V } = r;
  const h = (n: string) => {
    const x = fwd.hooks[n];
    if (!x) throw new Error(`reference hook ${n} missing`);
    return x;
  };
  const vec = (n: string, pos: number, inner = D, off = 0) =>
    h(n).data.subarray(pos * inner + off, pos * inner + off + D);
  const s = h('ln_final.hook_scale').data[p];
  const { u, bias } = unembedCol(r, tok, conv, opts.cf);
  const dv = u.map((x, d) => x * r.w[d]);
  const proj = (c: ArrayLike<number>, gain?: Float64Array | null) => {
    const cc = Float64Array.from(c, (x, d) => x * (gain ? gain[d] : 1));
    let mean = 0;
    if (r.layerNorm) {
      for (let d = 0; d < D; d++) mean += cc[d];
      mean /= D;
    }
    let acc = 0;
    for (let d = 0; d < D; d++) acc += ((cc[d] - mean) / s) * dv[d];
    return acc;
  };
  const terms = new Map<string, number>();
  const r0 = vec('blocks.0.hook_resid_pre', p);
  if (fwd.hooks['hook_pos_embed']) {
    const pe = vec('hook_pos_embed', p);
    terms.set('embed', proj(r0.map((x, d) => x - pe[d])));
    terms.set('pos_embed', proj(pe));
  } else terms.set('embed', proj(r0));
  for (let l = 0; l < opts.L; l++) {
    const res = `blocks.${l}.attn.hook_result`;
    // Gemma 2: the post-attention norm's frozen gain w / rms(Σ_h result)
    let gain: Float64Array | null = null;
    if (r.postAttn[l]) {
      const x = new Float64Array(D);
      for (let hh = 0; hh < opts.H; hh++) {
        const rh = vec(res, p * opts.H + hh);
        for (let d = 0; d < D; d++) x[d] += rh[d];
      }
      let ms = 0;
      for (let d = 0; d < D; d++) ms += x[d] * x[d];
      const sc = Math.sqrt(ms / D + r.eps);
      gain = r.postAttn[l]!.map((wd) => wd / sc);
    }
    let headSum = 0;
    for (let hh = 0; hh < opts.H; hh++) {
      let rh: ArrayLike<number> = vec(res, p * opts.H + hh);
      if (conv === 'transformer_lens') {
        if (!opts.fold) throw new Error('fold run needed');
        const fb = opts.fold.hooks[res].data.subarray((p * opts.H + hh) * D, (p * opts.H + hh + 1) * D);
        rh = Float64Array.from(rh, (x, d) => x - fb[d]);
      }
      const v = proj(rh, gain);
      headSum += v;
      terms.set(`L${l}H${hh}`, v);
    }
    terms.set(`L${l}.attn.b_O`, proj(vec(`blocks.${l}.hook_attn_out`, p)) - headSum);
    terms.set(`L${l}.mlp`, proj(vec(`blocks.${l}.hook_mlp_out`, p)));
  }
  let lnb = 0;
  if (r.b) for (let d = 0; d < D; d++) lnb += r.b[d] * u[d];
  terms.set('ln_final.b', lnb);
  terms.set('unembed.b_U', bias);
  const logits = h('logits').data;
  const pre = (t: number) => (r.softcap ? r.softcap * Math.atanh(logits[p * V + t] / r.softcap) : logits[p * V + t]);
  let target: number;
  if (opts.cf !== undefined) target = pre(tok) - pre(opts.cf);
  else if (conv === 'transformer_lens') {
    let m = 0;
    for (let v = 0; v < V; v++) m += pre(v);
    target = pre(tok) - m / V;
  } else target = pre(tok);
  return { terms, target };
}

/** logit lens of one reference residual vector: final norm with its own statistics, W_U, soft-cap */
export function refLens(r: RefReadout, x: ArrayLike<number>): Float64Array {
  const { D, V } = r;
  let mean = 0;
  if (r.layerNorm) {
    for (let d = 0; d < D; d++) mean += x[d];
    mean /= D;
  }
  let ms = 0;
  for (let d = 0; d < D; d++) ms += (x[d] - mean) ** 2;
  const s = Math.sqrt(ms / D + r.eps);
  const n = Float64Array.from({ length: D }, (_, d) => ((x[d] - mean) / s) * r.w[d] + (r.b ? r.b[d] : 0));
  const out = new Float64Array(V);
  for (let v = 0; v < V; v++) {
    let acc = r.bU ? r.bU[v] : 0;
    for (let d = 0; d < D; d++) acc += n[d] * r.WU[v * D + d];
    out[v] = r.softcap ? r.softcap * Math.tanh(acc / r.softcap) : acc;
  }
  return out;
}
