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
 *
 * Cost: the matrix products with the weights (W_O and W_out rows dotted with the readout, z·W_O for
 * the reconstruction check, columns and the vocabulary mean of W_U) go through
 * `model.weightProducts` (engine/readout/): W_U's in JavaScript with float64 sums, W_O's and
 * W_out's in a readout session or streamed from the weight bytes in JavaScript, as the model's
 * readout says (ModelInfo.readout); what does not depend on the
 * target (the vocabulary mean, the folded value biases b_V') is computed once per model and kept.
 * JavaScript then does O(d_model) work per head and O(1) per neuron: a head's term is
 * z_h · (W_O[h] e), a neuron's post[n] · (W_out[n] · e).
 */
import type { LoadedModel, RunResult, WeightProducts, WeightProductsInput } from '../../engine/api';
import type { Tensor } from '../../engine/tensor';
import { LoupeError } from '../../engine/errors';

export type Convention = 'transformer_lens' | 'raw';
export const CONVENTIONS = ['transformer_lens', 'raw'] as const;

// ------------------------------------------------------------------ per-model constants

interface LayerConstants {
  bO: Float32Array;
  bOut: Float32Array;
  /** Gemma 2 post-norm weights, when the layer has them */
  postAttnW: Float32Array | null;
  postMlpW: Float32Array | null;
  /** transformer_lens fold: b_V'[h] per query head [H·Dh] (computed on first use) */
  bVp?: Float64Array;
}

interface DlaConstants {
  bU: Float32Array;
  lnfW: Float32Array;
  lnfB: Float32Array;
  /** mean over the vocabulary of W_U's columns and of b_U (center_unembed); computed on first use */
  unembedMean?: { wu: Float64Array; bu: number };
  layers: LayerConstants[];
}

/** per model: its small parameters (model.param keeps them) and what DLA derives from the weights once */
const constants = new WeakMap<LoadedModel, DlaConstants>();

/** layer l is a linear-attention layer (Qwen3.5's gated delta-net): no heads, one term for its whole output */
export const isLinearLayer = (model: LoadedModel, l: number): boolean =>
  model.hookNames().includes(`blocks.${l}.linear_attn.hook_z`);

/** UNSUPPORTED_OP naming layer l where it is a linear-attention layer (head-level work there has nothing to read) */
export function requireHeads(
  model: LoadedModel,
  l: number,
  what: string,
  hint = "Choose a full-attention layer's heads, or the layer's whole output (component attn_out).",
): void {
  if (isLinearLayer(model, l))
    throw new LoupeError(
      'UNSUPPORTED_OP',
      `Layer ${l} of this ${model.info.architecture} model is a linear-attention (gated delta-net) layer: ` +
        `it has no attention heads, so ${what} has none there.`,
      hint,
      { layer: l, architecture: model.info.architecture },
    );
}

/**
 * Each layer's widths as its hooks have them: z's H·Dh_l and post's M_l (Gemma 4's full-attention
 * layers have wider heads, its double-wide MLPs twice the width; a layer without the hook: the
 * model's), and the widest, which the readout's per-layer stacks are padded to (readoutWidths)
 */
function layerWidths(model: LoadedModel): { hd: number[]; m: number[]; HD: number; M: number } {
  const { n_layers: L, n_heads: H, d_head: Dh, d_mlp: M } = model.info;
  const names = new Set(model.hookNames());
  const width = (h: string, or: number) =>
    names.has(h)
      ? model
          .hookShape(h, 1, 1)
          .slice(2)
          .reduce((a, b) => a * b, 1)
      : or;
  const hd = Array.from({ length: L }, (_, l) => width(`blocks.${l}.attn.hook_z`, H * Dh));
  const m = Array.from({ length: L }, (_, l) => width(`blocks.${l}.mlp.hook_post`, M));
  return { hd, m, HD: Math.max(...hd), M: Math.max(...m) };
}

/**
 * g[l] = Π_{k ≥ l} layer_scalar_k: Gemma 4 multiplies the whole residual stream by layer l's scalar
 * after block l, so what enters the stream at layer l (or, g[0], the embedding) reaches the final
 * norm times g[l]; all ones for other models
 */
function laterScalars(model: LoadedModel): { g: Float64Array; s: Float64Array } {
  const L = model.info.n_layers;
  const s = Float64Array.from({ length: L }, (_, l) =>
    model.hasParam(`blocks.${l}.layer_scalar`) ? model.param(`blocks.${l}.layer_scalar`).data[0] : 1,
  );
  const g = new Float64Array(L + 1);
  g[L] = 1;
  for (let l = L - 1; l >= 0; l--) g[l] = g[l + 1] * s[l];
  return { g, s };
}

function constantsOf(model: LoadedModel): DlaConstants {
  let c = constants.get(model);
  if (!c) {
    const p = (name: string) => model.param(name).data;
    const zeros = new Float32Array(model.info.d_model);
    c = {
      bU: p('unembed.b_U'),
      lnfW: p('ln_final.w'),
      lnfB: p('ln_final.b'),
      layers: Array.from({ length: model.info.n_layers }, (_, l) => ({
        bO: isLinearLayer(model, l) ? zeros : p(`blocks.${l}.attn.b_O`), // out_proj has no bias
        bOut: p(`blocks.${l}.mlp.b_out`),
        postAttnW: model.info.post_norms ? p(`blocks.${l}.ln1_post.w`) : null,
        postMlpW: model.info.post_norms ? p(`blocks.${l}.ln2_post.w`) : null,
      })),
    };
    constants.set(model, c);
  }
  return c;
}

/**
 * b_V'[h] = b_V[kv(h)] + b_ln1 · W_V[kv(h)] for every query head (GQA: kv(h) = h / (H/Hkv)), every
 * layer's at its first use; absent biases are zeros (model.param), and a layer's W_V is read only
 * when its b_ln1 is not all zero.
 */
function foldedValueBias(model: LoadedModel, c: DlaConstants, l: number): Float64Array {
  if (!c.layers[l].bVp) {
    const { n_layers: L, n_heads: H, n_kv_heads: Hkv, d_head: Dh, d_model: D } = model.info;
    const stored = (k: number) => model.hasParam(`blocks.${k}.ln1.b`) || model.hasParam(`blocks.${k}.attn.b_V`);
    if (!c.layers.some((_, k) => stored(k))) {
      // no value bias and no norm bias anywhere (Gemma 4, whose layers differ in width): b_V' = 0
      const { hd } = layerWidths(model);
      c.layers.forEach((lc, k) => (lc.bVp = new Float64Array(hd[k])));
      return c.layers[l].bVp!;
    }
    const bLn = new Float32Array(L * D),
      bV = new Float64Array(L * Hkv * Dh);
    for (let k = 0; k < L; k++) {
      bLn.set(model.param(`blocks.${k}.ln1.b`).data, k * D); // zeros for RMSNorm
      // a linear-attention layer has no b_V (RMSNorm too, so its x is zero and its W_V never read)
      if (!isLinearLayer(model, k)) bV.set(model.param(`blocks.${k}.attn.b_V`).data, k * Hkv * Dh);
    }
    const kvBias = model.valueProduct({ dims: [L, D], data: bLn }, { dims: [L, Hkv * Dh], data: bV }).data;
    const group = H / Hkv;
    c.layers.forEach((lc, k) => {
      lc.bVp = new Float64Array(H * Dh);
      for (let h = 0; h < H; h++) {
        const from = (k * Hkv + Math.floor(h / group)) * Dh;
        lc.bVp.set(kvBias.subarray(from, from + Dh), h * Dh);
      }
    });
  }
  return c.layers[l].bVp!;
}

function dotF(a: ArrayLike<number>, b: ArrayLike<number>, n: number, ao = 0): number {
  let s = 0;
  for (let i = 0; i < n; i++) s += a[ao + i] * b[i];
  return s;
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
async function unembedColumn(
  model: LoadedModel,
  c: DlaConstants,
  target: DlaTarget,
  convention: Convention,
  signal?: AbortSignal,
  extra: Pick<WeightProductsInput, 'z' | 'post'> = {},
): Promise<{ u: Float64Array; biasTerm: number; products: WeightProducts }> {
  const { d_model: D, d_vocab: V } = model.info;
  const cf = target.counterfactualId;
  const centre = cf === undefined && convention === 'transformer_lens';
  const ids = cf === undefined ? [target.tokenId] : [target.tokenId, cf];
  const p = await model.weightProducts({ unembedIds: ids, unembedSum: centre && !c.unembedMean, ...extra }, signal);
  const rows = p.unembedRows.data;
  const u = Float64Array.from(rows.subarray(0, D));
  let biasTerm = c.bU[target.tokenId];
  if (cf !== undefined) {
    for (let d = 0; d < D; d++) u[d] -= rows[D + d];
    biasTerm -= c.bU[cf];
  } else if (centre) {
    if (!c.unembedMean) {
      let bu = 0;
      for (let v = 0; v < V; v++) bu += c.bU[v];
      c.unembedMean = { wu: Float64Array.from(p.unembedSum.data, (x) => x / V), bu: bu / V };
    }
    for (let d = 0; d < D; d++) u[d] -= c.unembedMean.wu[d];
    biasTerm -= c.unembedMean.bu;
  }
  return { u, biasTerm, products: p };
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
export async function readoutDirection(
  model: LoadedModel,
  target: DlaTarget,
  convention: Convention,
  scale: number,
  signal?: AbortSignal,
): Promise<Readout> {
  return (await readoutWith(model, target, convention, scale, signal)).readout;
}

/** readoutDirection, with more weight products (`extra`) computed in the same call to the backend */
async function readoutWith(
  model: LoadedModel,
  target: DlaTarget,
  convention: Convention,
  scale: number,
  signal?: AbortSignal,
  extra: Pick<WeightProductsInput, 'z' | 'post'> = {},
): Promise<{ readout: Readout; products: WeightProducts }> {
  const c = constantsOf(model);
  const { u, biasTerm, products } = await unembedColumn(model, c, target, convention, signal, extra);
  const D = u.length;
  const e = new Float64Array(D);
  for (let d = 0; d < D; d++) e[d] = c.lnfW[d] * u[d];
  if (model.info.norm === 'layernorm') {
    let m = 0;
    for (let d = 0; d < D; d++) m += e[d];
    m /= D;
    for (let d = 0; d < D; d++) e[d] -= m;
  }
  for (let d = 0; d < D; d++) e[d] /= scale;
  return { readout: { e, lnBiasTerm: dotF(c.lnfB, u, D), unembedBiasTerm: biasTerm, scale }, products };
}

// ------------------------------------------------------------------ hooks

/** the hooks `decomposeLogit` reads */
export function dlaHookNames(model: LoadedModel): string[] {
  const L = model.info.n_layers;
  const names = ['blocks.0.hook_resid_pre', `blocks.${L - 1}.hook_resid_post`, 'ln_final.hook_scale'];
  if (model.info.pos_embed) names.push('hook_pos_embed');
  for (let l = 0; l < L; l++) {
    if (!isLinearLayer(model, l)) names.push(`blocks.${l}.attn.hook_z`);
    names.push(`blocks.${l}.hook_attn_out`, `blocks.${l}.hook_mlp_out`);
    if (model.hookNames().includes(`blocks.${l}.hook_per_layer_out`)) names.push(`blocks.${l}.hook_per_layer_out`);
    if (model.info.num_experts) names.push(...expertHooks(model, l));
    if (!model.info.num_experts || besideExperts(model, l)) names.push(`blocks.${l}.mlp.hook_post`);
  }
  return names;
}

/** Gemma 4 (enable_moe_block): layer l runs its experts beside a dense MLP, each branch through its own post-norm */
export const besideExperts = (model: LoadedModel, l: number): boolean =>
  model.hookNames().includes(`blocks.${l}.ln2_experts.hook_scale`);

/** a mixture-of-experts layer's hooks DLA reads: the routing weights, each expert's (weighted) output, the shared expert's */
function expertHooks(model: LoadedModel, l: number): string[] {
  const b = `blocks.${l}.mlp`;
  const shared = model.hookNames().includes(`${b}.shared_expert.hook_out`);
  return [
    `${b}.hook_router_weights`,
    ...Array.from({ length: model.info.num_experts! }, (_, e) => `${b}.experts.${e}.hook_out`),
    ...(shared ? [`${b}.shared_expert.hook_out`] : []),
  ];
}

/** a hook the run was asked for (INTERNAL when the engine did not return it) */
export function runHook(run: RunResult, name: string): Tensor {
  const t = run.hooks[name];
  if (!t)
    throw new LoupeError(
      'INTERNAL',
      `The engine did not return hook '${name}'.`,
      'This is a bug in Loupe; please report it.',
    );
  return t;
}

/** the vector of a [B, T, ...rest] hook at (row, pos), flattened */
function slice(t: Tensor, row: number, pos: number): Float32Array {
  const [, T] = t.dims;
  const inner = t.dims.slice(2).reduce((a, b) => a * b, 1);
  const off = (row * T + pos) * inner;
  return t.data.subarray(off, off + inner);
}

/** Gemma 2's post-norm as a frozen linear map: e ⊙ w_post / s_post, s_post from the layer's summed output x */
function postNormReadout(
  model: LoadedModel,
  w: Float32Array,
  x: Float64Array,
  e: Float64Array,
): { eL: Float64Array; gain: Float64Array } {
  const D = x.length;
  let ms = 0;
  for (let d = 0; d < D; d++) ms += x[d] * x[d];
  const s = Math.sqrt(ms / D + model.info.norm_eps);
  const gain = new Float64Array(D);
  const eL = new Float64Array(D);
  for (let d = 0; d < D; d++) {
    gain[d] = w[d] / s;
    eL[d] = e[d] * gain[d];
  }
  return { eL, gain };
}

// ------------------------------------------------------------------ the decomposition

export interface DlaTerm {
  name: string;
  value: number;
}

export interface DlaResult {
  convention: Convention;
  /** every term by name, in forward order: embed, pos_embed, per layer L{l}H{h}…, L{l}.attn.b_O, L{l}.mlp (L{l}.per_layer), then ln_final.b, unembed.b_U */
  terms: DlaTerm[];
  sum: number;
  /** the value the terms sum to, read from the model's logits (pre-soft-cap): logit, centred logit or difference */
  target: number;
  /** what target is, in words */
  targetKind: 'logit' | 'centered_logit' | 'logit_difference';
  /** [n_layers][n_heads]; a linear-attention layer's row is empty (its term is L{l}.linear_attn) */
  heads: number[][];
  /** per layer: neuron attributions and activations at the position, [n_layers][d_mlp] (zeros in a mixture-of-experts layer) */
  neuronAttribution: Float64Array[];
  neuronActivation: Float32Array[];
  /**
   * mixture-of-experts models: each expert's term [n_layers][n_experts] (its weighted output · e; 0
   * where not routed) and its routing weight at the position; the shared expert's term per layer
   */
  experts?: { attribution: number[][]; weight: number[][]; shared: number[] | null };
  /** max |Σ components − resid_post| and max over layers |Σ_h head outputs + bias − attn_out|: how exactly hooks and parameters agree */
  checks: { residual_reconstruction_max_abs: number; attention_reconstruction_max_abs: number };
  finalSoftcap: number | null;
}

/** pre-soft-cap value of a logit (identity without soft-cap) */
export function unsoftcap(logit: number, cap: number | null): number {
  if (!cap) return logit;
  const r = logit / cap;
  if (Math.abs(r) >= 1)
    throw new LoupeError(
      'RUNTIME_ERROR',
      `A logit (${logit}) sits at the soft-cap (${cap}); its pre-cap value cannot be recovered.`,
    );
  return cap * Math.atanh(r);
}

export interface DecomposeOptions {
  convention: Convention;
  /** position in the sequence (default: last) */
  position?: number;
  /** batch row of the run (default 0) */
  row?: number;
  signal?: AbortSignal;
  /**
   * index of the position's row in run.logits (default: the position itself, i.e. a run with
   * every position's logits; 0 for a run with logitPositions: [position])
   */
  logitIndex?: number;
}

/**
 * Decompose the target at one position from a run that returned `dlaHookNames(model)`.
 * Float64 arithmetic on the engine's float32 values and on the products `model.weightProducts` returns.
 */
export async function decomposeLogit(
  model: LoadedModel,
  run: RunResult,
  target: DlaTarget,
  opts: DecomposeOptions,
): Promise<DlaResult> {
  const { n_layers: L, n_heads: H, d_model: D } = model.info;
  // each layer's widths (hd[l], m[l]) and the stacks' (HD, M): one per model except Gemma 4's
  const { hd, m: mw, HD, M } = layerWidths(model);
  const { g: later, s: scalars } = laterScalars(model);
  const c = constantsOf(model);
  const row = opts.row ?? 0;
  const residPre0 = runHook(run, 'blocks.0.hook_resid_pre');
  const T = residPre0.dims[1];
  const pos = opts.position ?? T - 1;
  const convention = opts.convention;
  const tl = convention === 'transformer_lens';
  const scale = slice(runHook(run, 'ln_final.hook_scale'), row, pos)[0];

  // the layers' vectors at the position; Σ_h z_h W_O[h] per layer (the reconstruction check) and
  // each layer's readout (e, or e through the layer's frozen post-norm) against every row of W_O
  // and W_out. Each weightProducts call that touches W_O or W_out is a pass over them (streamed
  // from the weight bytes, or a session run), so without post-norms z rides with the readouts in
  // one pass; Gemma 2's post-norm scales need each layer's outputs (z·W_O, post·W_out) first, in
  // the call that reads the target's unembedding column
  const z = new Float32Array(L * HD);
  const act: Float32Array[] = [];
  const E = model.info.num_experts ?? 0;
  const linear = Array.from({ length: L }, (_, l) => isLinearLayer(model, l));
  const beside = Array.from({ length: L }, (_, l) => E > 0 && besideExperts(model, l));
  for (let l = 0; l < L; l++) {
    // a linear-attention layer's z stays zero: the readout's W_O products skip it
    if (!linear[l]) z.set(slice(runHook(run, `blocks.${l}.attn.hook_z`), row, pos), l * HD);
    // a mixture-of-experts layer has no one hook_post: its terms are its experts'; a narrower layer's zero-padded
    const a = new Float32Array(M);
    if (!E || beside[l]) a.set(slice(runHook(run, `blocks.${l}.mlp.hook_post`), row, pos));
    act.push(a); // [M]
  }
  const experts: DlaResult['experts'] = E ? { attribution: [], weight: [], shared: null } : undefined;
  const postNorms = c.layers.some((lc) => lc.postAttnW || lc.postMlpW);
  const zIn: Tensor = { dims: [L, 1, HD], data: z };
  const { readout: ro, products: outputs } = await readoutWith(
    model,
    target,
    convention,
    scale,
    opts.signal,
    postNorms ? { z: zIn, post: { dims: [L, 1, M], data: concat(act, M) } } : {},
  );
  const e = ro.e;
  /** the readout of what layer l adds to the stream: e times the later layers' scalars (Gemma 4) */
  const eOf = (l: number) => (later[l] === 1 ? e : e.map((v) => v * later[l]));
  /** layer l's attention output at the position, Σ_h z_h W_O[h] + b_O, from the call that carried z */
  const attnOut = (p: WeightProducts, l: number) =>
    Float64Array.from(p.attnX.data.subarray(l * D, (l + 1) * D), (v, d) => v + c.layers[l].bO[d]);

  const terms: DlaTerm[] = [];
  const resid = new Float64Array(D); // Σ of the residual components, to check against resid_post
  const add = (v: Float32Array) => {
    for (let d = 0; d < D; d++) resid[d] += v[d];
  };

  // embeddings: resid_pre0 = embed (+ pos_embed); taking embed as the difference keeps any
  // embedding scale (Gemma's √d) inside the term whatever hook_embed's convention is
  const r0 = slice(residPre0, row, pos);
  add(r0);
  const e0 = eOf(0);
  if (model.info.pos_embed) {
    const pe = dotF(slice(runHook(run, 'hook_pos_embed'), row, pos), e0, D);
    terms.push({ name: 'embed', value: dotF(r0, e0, D) - pe });
    terms.push({ name: 'pos_embed', value: pe });
  } else {
    terms.push({ name: 'embed', value: dotF(r0, e0, D) });
  }

  const eAttn = new Float32Array(L * D);
  const eMlp = new Float32Array(L * D);
  // Gemma 4's experts beside the dense MLP: the readout of their sum (through post_feedforward_layernorm_2
  // and _, scales frozen), and the dense MLP's term (through post_feedforward_layernorm_1 and _)
  const eExperts: (Float64Array | null)[] = [];
  const denseTerm: number[] = [];
  const gains: (Float64Array | null)[] = [];
  for (let l = 0; l < L; l++) {
    const lc = c.layers[l];
    const el = eOf(l);
    const pa = lc.postAttnW ? postNormReadout(model, lc.postAttnW, attnOut(outputs, l), el) : null;
    gains.push(pa ? pa.gain : null);
    eAttn.set(pa ? pa.eL : el, l * D);
    eExperts.push(null);
    if (lc.postMlpW && beside[l]) {
      const xm = Float64Array.from(outputs.mlpX.data.subarray(l * D, (l + 1) * D), (v, d) => v + lc.bOut[d]);
      const sum = new Float64Array(D);
      for (let x = 0; x < E; x++) {
        const y = slice(runHook(run, `blocks.${l}.mlp.experts.${x}.hook_out`), row, pos);
        for (let d = 0; d < D; d++) sum[d] += y[d];
      }
      const g1 = postNormReadout(model, model.param(`blocks.${l}.ln2_post_dense.w`).data, xm, el).gain;
      const g2 = postNormReadout(model, model.param(`blocks.${l}.ln2_post_experts.w`).data, sum, el).gain;
      const ePost = postNormReadout(
        model,
        lc.postMlpW,
        Float64Array.from(xm, (v, d) => v * g1[d] + sum[d] * g2[d]),
        el,
      ).eL;
      eMlp.set(
        ePost.map((v, d) => v * g1[d]),
        l * D,
      );
      eExperts[l] = ePost.map((v, d) => v * g2[d]);
      denseTerm[l] = xm.reduce((a, v, d) => a + v * g1[d] * ePost[d], 0);
    } else if (lc.postMlpW) {
      const xm = Float64Array.from(outputs.mlpX.data.subarray(l * D, (l + 1) * D), (v, d) => v + lc.bOut[d]);
      eMlp.set(postNormReadout(model, lc.postMlpW, xm, el).eL, l * D);
    } else eMlp.set(el, l * D);
  }
  const dirs = await model.weightProducts(
    {
      ...(postNorms ? {} : { z: zIn }),
      attnDirs: { dims: [L, 1, D], data: eAttn },
      mlpDirs: { dims: [L, 1, D], data: eMlp },
    },
    opts.signal,
  );
  const xs = Array.from({ length: L }, (_, l) => attnOut(postNorms ? outputs : dirs, l));

  const heads: number[][] = [];
  const neuronAttribution: Float64Array[] = [];
  const neuronActivation: Float32Array[] = [];
  let attnErr = 0;
  for (let l = 0; l < L; l++) {
    const lc = c.layers[l];
    const eL = eAttn.subarray(l * D, (l + 1) * D);
    const el = eOf(l);
    const Dh = hd[l] / H; // this layer's head width
    if (linear[l]) {
      // ---- a linear-attention layer: its whole output (out_proj has no bias) is one term
      const out = slice(runHook(run, `blocks.${l}.hook_attn_out`), row, pos);
      heads.push([]);
      terms.push({ name: `L${l}.linear_attn`, value: dotF(out, eL, D) });
      add(out);
    } else {
      // ---- attention: head h's term z_h · (W_O[h] eL); in TL minus b_V'[h] · (W_O[h] eL), which moves into the bias term
      const woe = dirs.attnDir.data.subarray(l * HD, l * HD + hd[l]);
      const bVp = tl ? foldedValueBias(model, c, l) : null;
      const headRow: number[] = [];
      let moved = 0;
      for (let h = 0; h < H; h++) {
        let v = dotF(z, woe.subarray(h * Dh, (h + 1) * Dh), Dh, l * HD + h * Dh);
        if (bVp) {
          const m = dotF(bVp, woe.subarray(h * Dh, (h + 1) * Dh), Dh, h * Dh);
          v -= m;
          moved += m;
        }
        headRow.push(v);
        terms.push({ name: `L${l}H${h}`, value: v });
      }
      heads.push(headRow);
      terms.push({ name: `L${l}.attn.b_O`, value: dotF(lc.bO, eL, D) + moved });
      const attnOut = slice(runHook(run, `blocks.${l}.hook_attn_out`), row, pos);
      const x = xs[l],
        g = gains[l];
      for (let d = 0; d < D; d++) attnErr = Math.max(attnErr, Math.abs(x[d] * (g ? g[d] : 1) - attnOut[d]));
      add(attnOut);
    }

    // ---- MLP: the whole output from its hook; neuron n's term post[n] · (W_out[n] · eM)
    const mlpOut = slice(runHook(run, `blocks.${l}.hook_mlp_out`), row, pos);
    if (experts) {
      // mixture of experts: hook_mlp_out = Σ_e experts.{e}.hook_out (+ the shared expert's), each its own term
      const b = `blocks.${l}.mlp`;
      if (beside[l]) terms.push({ name: `L${l}.mlp`, value: denseTerm[l] });
      const ee = eExperts[l] ?? el;
      const ea = Array.from({ length: E }, (_, x) =>
        dotF(slice(runHook(run, `${b}.experts.${x}.hook_out`), row, pos), ee, D),
      );
      ea.forEach((v, x) => terms.push({ name: `L${l}.E${x}`, value: v }));
      experts.attribution.push(ea);
      experts.weight.push(Array.from(slice(runHook(run, `${b}.hook_router_weights`), row, pos)));
      const sh = run.hooks[`${b}.shared_expert.hook_out`];
      if (sh) {
        const v = dotF(slice(sh, row, pos), el, D);
        terms.push({ name: `L${l}.shared_expert`, value: v });
        (experts.shared ??= []).push(v);
      }
    } else terms.push({ name: `L${l}.mlp`, value: dotF(mlpOut, el, D) });
    add(mlpOut);
    const Ml = mw[l]; // this layer's MLP width
    const woutE = dirs.mlpDir.data.subarray(l * M, l * M + Ml);
    const a = act[l];
    const na = new Float64Array(Ml);
    for (let n = 0; n < Ml; n++) na[n] = a[n] * woutE[n];
    neuronAttribution.push(na);
    neuronActivation.push(a.slice(0, Ml));

    // ---- Gemma 4's per-layer input (its block after the MLP): one term; then the layer's scalar
    const ple = run.hooks[`blocks.${l}.hook_per_layer_out`];
    if (ple) {
      const out = slice(ple, row, pos);
      terms.push({ name: `L${l}.per_layer`, value: dotF(out, el, D) });
      add(out);
    }
    if (scalars[l] !== 1) for (let d = 0; d < D; d++) resid[d] *= scalars[l];
  }

  terms.push({ name: 'ln_final.b', value: ro.lnBiasTerm });
  terms.push({ name: 'unembed.b_U', value: ro.unembedBiasTerm });

  let sum = 0;
  for (const t of terms) sum += t.value;

  const residPost = slice(runHook(run, `blocks.${L - 1}.hook_resid_post`), row, pos);
  let residErr = 0;
  for (let d = 0; d < D; d++) residErr = Math.max(residErr, Math.abs(resid[d] - residPost[d]));

  // the target from the model's own logits
  const cap = model.info.final_softcap;
  const logits = run.logits;
  const V = logits.dims[2];
  const lo = (row * logits.dims[1] + (opts.logitIndex ?? pos)) * V;
  const pre = (t: number) => unsoftcap(logits.data[lo + t], cap);
  let targetValue: number;
  let targetKind: DlaResult['targetKind'];
  if (target.counterfactualId !== undefined) {
    targetValue = pre(target.tokenId) - pre(target.counterfactualId);
    targetKind = 'logit_difference';
  } else if (tl) {
    let m = 0;
    for (let v = 0; v < V; v++) m += pre(v);
    targetValue = pre(target.tokenId) - m / V;
    targetKind = 'centered_logit';
  } else {
    targetValue = pre(target.tokenId);
    targetKind = 'logit';
  }

  return {
    convention,
    terms,
    sum,
    target: targetValue,
    targetKind,
    heads,
    neuronAttribution,
    neuronActivation,
    ...(experts ? { experts } : {}),
    checks: { residual_reconstruction_max_abs: residErr, attention_reconstruction_max_abs: attnErr },
    finalSoftcap: cap,
  };
}

function concat(parts: Float32Array[], n: number): Float32Array {
  const out = new Float32Array(parts.length * n);
  parts.forEach((p, i) => out.set(p, i * n));
  return out;
}

/** a sentence for documents saying exactly what the numbers are */
export function describeMethod(model: LoadedModel, convention: Convention, kind: DlaResult['targetKind']): string {
  const ln = model.info.norm === 'layernorm';
  const parts: string[] = [];
  parts.push(
    `Direct logit attribution at the chosen position with the final norm's scale frozen at its value there (ln_final.hook_scale).`,
  );
  if (convention === 'raw') {
    parts.push(
      ln
        ? 'raw convention: each component c contributes ((c − mean(c)) / s) ⊙ w_lnf · W_U[:, t]; ln_final.b · W_U[:, t] and b_U[t] are their own terms.'
        : 'raw convention: each component c contributes (c / s) ⊙ w_norm · W_U[:, t]; b_U[t] is its own term.',
    );
  } else {
    parts.push(
      'transformer_lens convention: direction d_t = w ⊙ W_U[:, t] − mean_v(w ⊙ W_U[:, v]) ' +
        `(center_unembed)${ln ? ', components centred' : ''}; b_U centred; value biases folded (each head's ` +
        `result loses b_V'[h]·W_O[h], b_V' = b_V${ln ? ' + b_ln1·W_V' : ''}, moved into L{l}.attn.b_O) ` +
        `wherever the model has value${ln ? ' or ln1' : ''} biases, as TransformerLens's fold_value_biases does.`,
    );
  }
  parts.push(
    kind === 'logit'
      ? 'Terms sum to the logit.'
      : kind === 'centered_logit'
        ? 'Terms sum to the centred logit (logit − mean over the vocabulary).'
        : 'Terms sum to the logit difference answer − counterfactual (centring cancels in a difference).',
  );
  parts.push(
    'Heads: z_h · W_O[h] (GQA: head h reads kv head h / (n_heads / n_kv_heads)). ' +
      (model.info.num_experts
        ? 'Mixture-of-experts layers: one term per expert, L{l}.E{e} = experts.{e}.hook_out (its output times its ' +
          'routing weight, 0 where not routed), and L{l}.shared_expert where there is one; they sum to hook_mlp_out.' +
          (besideExperts(model, 0)
            ? ' Gemma 4: L{l}.mlp is the dense MLP beside the experts (a neuron n contributes hook_post[n] · W_out[n]), ' +
              'through post_feedforward_layernorm_1 and the layer post-norm; the experts through ' +
              'post_feedforward_layernorm_2 and the layer post-norm, each scale frozen.'
            : '')
        : 'MLP terms are the whole hook_mlp_out (bias included); a neuron n contributes hook_post[n] · W_out[n].'),
  );
  if (model.info.post_norms)
    parts.push(
      'Post-attention / post-MLP norms are treated as linear maps with their scale frozen ' +
        "at its value (recomputed from the layer's summed output), which is exact for the sum.",
    );
  if (model.info.final_softcap)
    parts.push(
      `The final soft-cap (${model.info.final_softcap}·tanh(x/${model.info.final_softcap})) ` +
        'is not linear: the terms sum exactly to the PRE-soft-cap value, which is what target reports.',
    );
  return parts.join(' ');
}
