/**
 * Direct logit attribution: the exact linear decomposition of one logit (or centred logit, or
 * logit difference) at one position into the residual stream's components, in the two
 * conventions of DESIGN.md. Used by `trace` and by other operations (circuit, steer), so the
 * pieces are exported separately:
 *
 *  - `readoutDirection`  the vector e with term(c) = c · e for any residual-space component c
 *                        (folds in the final norm's centring, its frozen scale and weight, and the
 *                        unembedding column(s) of the target),
 *  - `decomposeLogit`    every term by name, their sum, the target they sum to, per-head and
 *                        per-neuron attributions, and reconstruction checks.
 *
 * Maths (s = ln_final.hook_scale at the position, w = final-norm weight, u_t = W_U[:, t]):
 *   raw:               term(c) = ((c − mean c) / s) · (w ⊙ u_t)   (LayerNorm; RMSNorm: no centring)
 *                      + ln_final.b · u_t  + b_U[t]                      = logit_t
 *   transformer_lens:  u_t → u_t − mean_v u_v, b_U[t] → b_U[t] − mean(b_U) (center_unembed), and
 *                      each head's result loses b_V'[h]·W_O[h] (fold_value_biases;
 *                      b_V' = b_V + b_ln1·W_V) which moves into the layer's attention-bias term
 *                                                                        = logit_t − mean_v logit_v
 *   difference:        the same with u_answer − u_counterfactual   = logit_a − logit_c
 * Because attention rows sum to one, z_h contains b_V'[h] exactly, so the fold only moves
 * b_V'[h]·W_O[h] between terms; the sum is unchanged.
 *
 * Gemma 2 (post-attention / post-MLP norms, final soft-cap): a post-norm is linear once its
 * scale is frozen, so head and neuron terms are (r ⊙ w_post / s_post) · e with s_post recomputed
 * from the layer's summed output; the decomposition is exact for the PRE-soft-cap logit (the
 * soft-cap is a monotone non-linearity applied after the sum), which is what `target` reports.
 */
import type { LoadedModel, RunResult } from '../../engine/api';
import type { Tensor } from '../../engine/tensor';
import { LoupeError } from '../../engine/errors';

export type Convention = 'transformer_lens' | 'raw';
export const CONVENTIONS = ['transformer_lens', 'raw'] as const;

// ------------------------------------------------------------------ parameters (cached per model)

const paramCache = new WeakMap<LoadedModel, Map<string, Tensor | null>>();

/** a parameter by TL name, or null when the model has none (e.g. biases of Llama) */
export function optionalParam(model: LoadedModel, name: string): Tensor | null {
  let m = paramCache.get(model);
  if (!m) paramCache.set(model, (m = new Map()));
  if (!m.has(name)) {
    let t: Tensor | null = null;
    try {
      t = model.param(name);
    } catch {
      t = null;
    }
    m.set(name, t);
  }
  return m.get(name)!;
}

export function requiredParam(model: LoadedModel, name: string): Tensor {
  const t = optionalParam(model, name);
  if (!t) throw new LoupeError('MISSING_TENSOR', `The model has no parameter '${name}', which direct logit attribution needs.`, 'This architecture cannot be decomposed by Loupe yet; please report it.');
  return t;
}

const meanCache = new WeakMap<LoadedModel, { wuMean: Float64Array; buMean: number }>();

/** mean over the vocabulary of W_U's columns, and of b_U (center_unembed) */
function unembedMeans(model: LoadedModel): { wuMean: Float64Array; buMean: number } {
  let c = meanCache.get(model);
  if (!c) {
    const WU = requiredParam(model, 'unembed.W_U');
    const [D, V] = WU.dims;
    const wuMean = new Float64Array(D);
    for (let d = 0; d < D; d++) {
      let s = 0;
      const o = d * V;
      for (let v = 0; v < V; v++) s += WU.data[o + v];
      wuMean[d] = s / V;
    }
    const bU = optionalParam(model, 'unembed.b_U');
    let buMean = 0;
    if (bU) { for (let v = 0; v < V; v++) buMean += bU.data[v]; buMean /= V; }
    c = { wuMean, buMean };
    meanCache.set(model, c);
  }
  return c;
}

// ------------------------------------------------------------------ the target and its readout

/** what is attributed: one token's logit, or the difference answer − counterfactual */
export interface DlaTarget {
  tokenId: number;
  counterfactualId?: number;
}

/**
 * The unembedding side of the target in a convention: u (residual-space, before the norm weight)
 * and the unembedding-bias term. u = W_U[:,t] (raw) or W_U[:,t] − mean_v W_U[:,v] (TL); for a
 * difference, u_a − u_c (centring cancels).
 */
export function unembedColumn(model: LoadedModel, target: DlaTarget, convention: Convention): { u: Float64Array; biasTerm: number } {
  const WU = requiredParam(model, 'unembed.W_U');
  const [D, V] = WU.dims;
  const bU = optionalParam(model, 'unembed.b_U');
  const u = new Float64Array(D);
  const col = (t: number, sign: number) => {
    for (let d = 0; d < D; d++) u[d] += sign * WU.data[d * V + t];
  };
  col(target.tokenId, 1);
  let biasTerm = bU ? bU.data[target.tokenId] : 0;
  if (target.counterfactualId !== undefined) {
    col(target.counterfactualId, -1);
    if (bU) biasTerm -= bU.data[target.counterfactualId];
  } else if (convention === 'transformer_lens') {
    const { wuMean, buMean } = unembedMeans(model);
    for (let d = 0; d < D; d++) u[d] -= wuMean[d];
    biasTerm -= buMean;
  }
  return { u, biasTerm };
}

export interface Readout {
  /** term(c) = c · e for a residual-space component c at the position */
  e: Float64Array;
  /** the final-norm bias term b_lnf · u (0 for norms without bias) */
  lnBiasTerm: number;
  /** the unembedding-bias term */
  unembedBiasTerm: number;
  /** the frozen final-norm scale s used */
  scale: number;
}

/**
 * The readout vector e for a target at a position whose final-norm scale is `scale`:
 * RMSNorm e = (w ⊙ u) / s; LayerNorm e = (w ⊙ u − mean(w ⊙ u)) / s, which equals projecting the
 * centred component ((c − mean c)/s) · (w ⊙ u).
 */
export function readoutDirection(model: LoadedModel, target: DlaTarget, convention: Convention, scale: number): Readout {
  const { u, biasTerm } = unembedColumn(model, target, convention);
  const w = requiredParam(model, 'ln_final.w');
  const b = optionalParam(model, 'ln_final.b');
  const D = u.length;
  const e = new Float64Array(D);
  for (let d = 0; d < D; d++) e[d] = w.data[d] * u[d];
  if (model.info.norm === 'layernorm') {
    let m = 0;
    for (let d = 0; d < D; d++) m += e[d];
    m /= D;
    for (let d = 0; d < D; d++) e[d] -= m;
  }
  for (let d = 0; d < D; d++) e[d] /= scale;
  let lnBiasTerm = 0;
  if (b) for (let d = 0; d < D; d++) lnBiasTerm += b.data[d] * u[d];
  return { e, lnBiasTerm, unembedBiasTerm: biasTerm, scale };
}

// ------------------------------------------------------------------ hooks

export function hasPosEmbed(model: LoadedModel): boolean {
  return model.hookNames().includes('hook_pos_embed');
}

/** the hooks `decomposeLogit` reads */
export function dlaHookNames(model: LoadedModel): string[] {
  const L = model.info.n_layers;
  const names = ['blocks.0.hook_resid_pre', `blocks.${L - 1}.hook_resid_post`, 'ln_final.hook_scale'];
  if (hasPosEmbed(model)) names.push('hook_pos_embed');
  for (let l = 0; l < L; l++) {
    names.push(`blocks.${l}.attn.hook_z`, `blocks.${l}.hook_attn_out`, `blocks.${l}.hook_mlp_out`, `blocks.${l}.mlp.hook_post`);
  }
  return names;
}

function hook(run: RunResult, name: string): Tensor {
  const t = run.hooks[name];
  if (!t) throw new LoupeError('INTERNAL', `The engine did not return hook '${name}'.`, 'This is a bug in Loupe; please report it.');
  return t;
}

/** the vector of a [B, T, ...rest] hook at (row, pos), flattened */
function slice(t: Tensor, row: number, pos: number): Float32Array {
  const [, T] = t.dims;
  const inner = t.dims.slice(2).reduce((a, b) => a * b, 1);
  const off = (row * T + pos) * inner;
  return t.data.subarray(off, off + inner);
}

function dotF(a: ArrayLike<number>, b: ArrayLike<number>, n: number, ao = 0, bo = 0): number {
  let s = 0;
  for (let i = 0; i < n; i++) s += a[ao + i] * b[bo + i];
  return s;
}

// ------------------------------------------------------------------ per-layer linear maps

/** Gemma 2's post-norm as a frozen linear map g = w_post / s_post, from the layer's summed output x */
function postNormGain(model: LoadedModel, which: 'attn' | 'mlp', layer: number, x: Float64Array): Float64Array | null {
  const spec = model.spec.layers[layer];
  const ns = which === 'attn' ? spec.postAttnNorm : spec.postMlpNorm;
  if (!ns) return null;
  if (ns.kind !== 'rmsnorm') throw new LoupeError('UNSUPPORTED_ARCHITECTURE', `Direct logit attribution does not support a ${ns.kind} post-norm.`);
  const name = which === 'attn' ? `blocks.${layer}.ln1_post.w` : `blocks.${layer}.ln2_post.w`;
  const w = requiredParam(model, name);
  const D = x.length;
  let ms = 0;
  for (let d = 0; d < D; d++) ms += x[d] * x[d];
  const s = Math.sqrt(ms / D + ns.eps);
  const g = new Float64Array(D);
  for (let d = 0; d < D; d++) g[d] = w.data[d] / s;
  return g;
}

/**
 * b_V'[h] = b_V[kv(h)] + b_ln1 · W_V[kv(h)] for every query head (GQA: kv(h) = h / (H/Hkv)), or
 * null when the model has neither value nor ln1 bias (nothing to fold).
 */
const foldCache = new WeakMap<LoadedModel, Map<number, Float64Array[] | null>>();

export function foldedValueBias(model: LoadedModel, layer: number): Float64Array[] | null {
  let m = foldCache.get(model);
  if (!m) foldCache.set(model, (m = new Map()));
  if (!m.has(layer)) m.set(layer, computeFoldedValueBias(model, layer));
  return m.get(layer)!;
}

function computeFoldedValueBias(model: LoadedModel, layer: number): Float64Array[] | null {
  const { n_heads: H, n_kv_heads: Hkv, d_head: Dh, d_model: D } = model.info;
  const bV = optionalParam(model, `blocks.${layer}.attn.b_V`);
  const bLn = model.info.norm === 'layernorm' ? optionalParam(model, `blocks.${layer}.ln1.b`) : null;
  if (!bV && !bLn) return null;
  const WV = bLn ? requiredParam(model, `blocks.${layer}.attn.W_V`) : null; // [Hkv, D, Dh]
  const group = H / Hkv;
  const out: Float64Array[] = [];
  for (let h = 0; h < H; h++) {
    const kv = Math.floor(h / group);
    const v = new Float64Array(Dh);
    if (bV) for (let i = 0; i < Dh; i++) v[i] = bV.data[kv * Dh + i];
    if (bLn && WV) {
      for (let d = 0; d < D; d++) {
        const bd = bLn.data[d];
        if (bd === 0) continue;
        const o = (kv * D + d) * Dh;
        for (let i = 0; i < Dh; i++) v[i] += bd * WV.data[o + i];
      }
    }
    out.push(v);
  }
  return out;
}

// ------------------------------------------------------------------ the decomposition

export interface DlaTerm {
  name: string;
  value: number;
}

export interface DlaResult {
  convention: Convention;
  /** every term by name, in forward order: embed, pos_embed, per layer L{l}H{h}…, L{l}.attn.b_O, L{l}.mlp, then ln_final.b, unembed.b_U */
  terms: DlaTerm[];
  sum: number;
  /** the value the terms sum to, read from the model's logits (pre-soft-cap): logit, centred logit or difference */
  target: number;
  /** what target is, in words */
  targetKind: 'logit' | 'centered_logit' | 'logit_difference';
  /** [n_layers][n_heads] */
  heads: number[][];
  /** per layer: neuron attributions and activations at the position, [n_layers][d_mlp] */
  neuronAttribution: Float64Array[];
  neuronActivation: Float64Array[];
  /** max |Σ components − resid_post| and max over layers |Σ_h head outputs + bias − attn_out|: how exactly hooks and parameters agree */
  checks: { residual_reconstruction_max_abs: number; attention_reconstruction_max_abs: number };
  finalSoftcap: number | null;
}

/** pre-soft-cap value of a logit (identity without soft-cap) */
export function unsoftcap(logit: number, cap: number | null): number {
  if (!cap) return logit;
  const r = logit / cap;
  if (Math.abs(r) >= 1) throw new LoupeError('RUNTIME_ERROR', `A logit (${logit}) sits at the soft-cap (${cap}); its pre-cap value cannot be recovered.`);
  return cap * Math.atanh(r);
}

export interface DecomposeOptions {
  convention: Convention;
  /** position in the sequence (default: last) */
  position?: number;
  /** batch row of the run (default 0) */
  row?: number;
}

/**
 * Decompose the target at one position from a run that returned `dlaHookNames(model)`.
 * All arithmetic in float64 on the engine's float32 values.
 */
export function decomposeLogit(model: LoadedModel, run: RunResult, target: DlaTarget, opts: DecomposeOptions): DlaResult {
  const { n_layers: L, n_heads: H, d_head: Dh, d_model: D, d_mlp: M } = model.info;
  const row = opts.row ?? 0;
  const residPre0 = hook(run, 'blocks.0.hook_resid_pre');
  const T = residPre0.dims[1];
  const pos = opts.position ?? T - 1;
  const convention = opts.convention;
  const scale = slice(hook(run, 'ln_final.hook_scale'), row, pos)[0];
  const ro = readoutDirection(model, target, convention, scale);
  const e = ro.e;

  const terms: DlaTerm[] = [];
  const resid = new Float64Array(D); // Σ of the residual components, to check against resid_post
  const add = (c: ArrayLike<number>) => { for (let d = 0; d < D; d++) resid[d] += c[d]; };

  // embeddings: resid_pre0 = embed (+ pos_embed); taking embed as the difference keeps any
  // embedding scale (Gemma's √d) inside the term whatever hook_embed's convention is
  const r0 = slice(residPre0, row, pos);
  add(r0);
  if (hasPosEmbed(model)) {
    const pe = slice(hook(run, 'hook_pos_embed'), row, pos);
    terms.push({ name: 'embed', value: dotF(r0, e, D) - dotF(pe, e, D) });
    terms.push({ name: 'pos_embed', value: dotF(pe, e, D) });
  } else {
    terms.push({ name: 'embed', value: dotF(r0, e, D) });
  }

  const heads: number[][] = [];
  const neuronAttribution: Float64Array[] = [];
  const neuronActivation: Float64Array[] = [];
  let attnErr = 0;
  for (let l = 0; l < L; l++) {
    // ---- attention: r_h = z_h · W_O[h]
    const z = slice(hook(run, `blocks.${l}.attn.hook_z`), row, pos); // [H, Dh]
    const WO = requiredParam(model, `blocks.${l}.attn.W_O`); // [H, Dh, D]
    const bO = optionalParam(model, `blocks.${l}.attn.b_O`);
    const r: Float64Array[] = [];
    const x = new Float64Array(D); // pre-post-norm attention output Σ_h r_h + b_O
    for (let h = 0; h < H; h++) {
      const rh = new Float64Array(D);
      for (let i = 0; i < Dh; i++) {
        const zi = z[h * Dh + i];
        const o = (h * Dh + i) * D;
        for (let d = 0; d < D; d++) rh[d] += zi * WO.data[o + d];
      }
      r.push(rh);
      for (let d = 0; d < D; d++) x[d] += rh[d];
    }
    const bias = new Float64Array(D);
    if (bO) for (let d = 0; d < D; d++) bias[d] = bO.data[d];
    for (let d = 0; d < D; d++) x[d] += bias[d];
    if (convention === 'transformer_lens') {
      const bv = foldedValueBias(model, l);
      if (bv) {
        for (let h = 0; h < H; h++) {
          const moved = new Float64Array(D);
          for (let i = 0; i < Dh; i++) {
            const o = (h * Dh + i) * D;
            for (let d = 0; d < D; d++) moved[d] += bv[h][i] * WO.data[o + d];
          }
          for (let d = 0; d < D; d++) { r[h][d] -= moved[d]; bias[d] += moved[d]; }
        }
      }
    }
    const g = postNormGain(model, 'attn', l, x);
    const eL = g ? e.map((v, d) => v * g[d]) : e;
    const headRow: number[] = [];
    for (let h = 0; h < H; h++) {
      const v = dotF(r[h], eL, D);
      headRow.push(v);
      terms.push({ name: `L${l}H${h}`, value: v });
    }
    heads.push(headRow);
    terms.push({ name: `L${l}.attn.b_O`, value: dotF(bias, eL, D) });
    const attnOut = slice(hook(run, `blocks.${l}.hook_attn_out`), row, pos);
    for (let d = 0; d < D; d++) attnErr = Math.max(attnErr, Math.abs(x[d] * (g ? g[d] : 1) - attnOut[d]));
    add(attnOut);

    // ---- MLP: the whole output from its hook; neurons from hook_post · W_out
    const mlpOut = slice(hook(run, `blocks.${l}.hook_mlp_out`), row, pos);
    terms.push({ name: `L${l}.mlp`, value: dotF(mlpOut, e, D) });
    add(mlpOut);
    const post = slice(hook(run, `blocks.${l}.mlp.hook_post`), row, pos); // [M]
    const Wout = requiredParam(model, `blocks.${l}.mlp.W_out`); // [M, D]
    let eM = e;
    if (model.spec.layers[l].postMlpNorm) {
      const xm = new Float64Array(D);
      const bOut = optionalParam(model, `blocks.${l}.mlp.b_out`);
      for (let n = 0; n < M; n++) { const a = post[n]; if (a !== 0) for (let d = 0; d < D; d++) xm[d] += a * Wout.data[n * D + d]; }
      if (bOut) for (let d = 0; d < D; d++) xm[d] += bOut.data[d];
      const gm = postNormGain(model, 'mlp', l, xm)!;
      eM = e.map((v, d) => v * gm[d]);
    }
    const na = new Float64Array(M);
    const act = new Float64Array(M);
    for (let n = 0; n < M; n++) {
      act[n] = post[n];
      na[n] = post[n] * dotF(Wout.data, eM, D, n * D, 0);
    }
    neuronAttribution.push(na);
    neuronActivation.push(act);
  }

  const lnB = optionalParam(model, 'ln_final.b');
  if (lnB) terms.push({ name: 'ln_final.b', value: ro.lnBiasTerm });
  else terms.push({ name: 'ln_final.b', value: 0 });
  terms.push({ name: 'unembed.b_U', value: ro.unembedBiasTerm });

  let sum = 0;
  for (const t of terms) sum += t.value;

  const residPost = slice(hook(run, `blocks.${L - 1}.hook_resid_post`), row, pos);
  let residErr = 0;
  for (let d = 0; d < D; d++) residErr = Math.max(residErr, Math.abs(resid[d] - residPost[d]));

  // the target from the model's own logits
  const cap = model.spec.finalSoftcap ?? null;
  const logits = run.logits;
  const V = logits.dims[2];
  const lo = (row * logits.dims[1] + pos) * V;
  const pre = (t: number) => unsoftcap(logits.data[lo + t], cap);
  let targetValue: number;
  let targetKind: DlaResult['targetKind'];
  if (target.counterfactualId !== undefined) {
    targetValue = pre(target.tokenId) - pre(target.counterfactualId);
    targetKind = 'logit_difference';
  } else if (convention === 'transformer_lens') {
    let m = 0;
    for (let v = 0; v < V; v++) m += pre(v);
    targetValue = pre(target.tokenId) - m / V;
    targetKind = 'centered_logit';
  } else {
    targetValue = pre(target.tokenId);
    targetKind = 'logit';
  }

  return {
    convention, terms, sum, target: targetValue, targetKind, heads, neuronAttribution, neuronActivation,
    checks: { residual_reconstruction_max_abs: residErr, attention_reconstruction_max_abs: attnErr },
    finalSoftcap: cap,
  };
}

/** a sentence for documents saying exactly what the numbers are */
export function describeMethod(model: LoadedModel, convention: Convention, kind: DlaResult['targetKind']): string {
  const ln = model.info.norm === 'layernorm';
  const parts: string[] = [];
  parts.push(`Direct logit attribution at the chosen position with the final norm's scale frozen at its value there (ln_final.hook_scale).`);
  if (convention === 'raw') {
    parts.push(ln
      ? 'raw convention: each component c contributes ((c − mean(c)) / s) ⊙ w_lnf · W_U[:, t]; ln_final.b · W_U[:, t] and b_U[t] are their own terms.'
      : 'raw convention: each component c contributes (c / s) ⊙ w_norm · W_U[:, t]; b_U[t] is its own term.');
  } else {
    parts.push(`transformer_lens convention: direction d_t = w ⊙ W_U[:, t] − mean_v(w ⊙ W_U[:, v]) (center_unembed)${ln ? ', components centred' : ''}; b_U centred; value biases folded (each head's result loses b_V'[h]·W_O[h], b_V' = b_V${ln ? ' + b_ln1·W_V' : ''}, moved into L{l}.attn.b_O) wherever the model has value${ln ? ' or ln1' : ''} biases, as TransformerLens's fold_value_biases does.`);
  }
  parts.push(kind === 'logit' ? 'Terms sum to the logit.' : kind === 'centered_logit' ? 'Terms sum to the centred logit (logit − mean over the vocabulary).' : 'Terms sum to the logit difference answer − counterfactual (centring cancels in a difference).');
  parts.push('Heads: z_h · W_O[h] (GQA: head h reads kv head h / (n_heads / n_kv_heads)). MLP terms are the whole hook_mlp_out (bias included); a neuron n contributes hook_post[n] · W_out[n].');
  if (model.spec.layers.some((s) => s.postAttnNorm || s.postMlpNorm)) parts.push('Post-attention / post-MLP norms are treated as linear maps with their scale frozen at its value (recomputed from the layer\'s summed output), which is exact for the sum.');
  if (model.spec.finalSoftcap) parts.push(`The final soft-cap (${model.spec.finalSoftcap}·tanh(x/${model.spec.finalSoftcap})) is not linear: the terms sum exactly to the PRE-soft-cap value, which is what target reports.`);
  return parts.join(' ');
}
