// The float64 oracle for attribution graphs: circuit-tracer's local replacement model, its
// adjacency, node selection, pruning and scores, written from circuit-tracer's definitions
// (decoderesearch/circuit-tracer 4bb8c0e; /work/shared/specs/attribution-graphs.md has the
// file:line citations) over the float64 forward of forward64.ts. Nothing here imports from src/,
// and nothing here runs a backward pass: every edge is a FORWARD propagation of one source vector
// through the frozen linear model (the engine computes the same numbers by reverse mode).
//
// The local replacement model of a prompt (replacement_model_transformerlens.py:197-232):
//   attention patterns, and the scale of every norm (ln1, ln2, post-norms, ln_final) are frozen at
//   their clean values; LayerNorm keeps its centring, RMSNorm is x/s·w; every MLP output is
//   skip(x_l) + (o_l − skip(x_l)).detach(), so only the transcoder's linear skip carries signal.
// Nodes, in circuit-tracer's order (graph.py:46-64): active features sorted by (layer, position,
// feature); error nodes at index l·T + p; token nodes; logit nodes by descending probability.
// Edge A[t, s] = u_tᵀ J v_s: u_t the encoder row at x_l[p] (a feature) or the demeaned unembedding
// column at y[T−1] (a logit); v_s the decoder row × activation at o_l[p] (CLT: one per output
// layer, summed), the error vector, or the token's hook_embed row.

import { describe, referenceForward, type RefArch, type RefModel, type RefNorm } from './forward64';

export type InputHook = 'mlp.hook_in' | 'hook_resid_mid' | 'ln2.hook_normalized';
export type OutputHook = 'hook_mlp_out' | 'mlp.hook_out';

export interface RefTranscoderLayer {
  /** [F, D]: row f is feature f's encoder vector */
  W_enc: Float64Array;
  b_enc: Float64Array;
  /** [D] */
  b_dec: Float64Array;
  /** [F] JumpReLU thresholds, or null */
  threshold: Float64Array | null;
  /** PLT [F, D]; CLT [F, L − l, D] (feature f of layer l writes to the MLP outputs of layers l … L−1) */
  W_dec: Float64Array;
  /** [D, D]: PLT skip(x) = x·W_skipᵀ (single_layer_transcoder.py:137-139); CLT skip(x) = x·W_skip[l] (cross_layer_transcoder.py:284-301) */
  W_skip: Float64Array | null;
}

export interface RefTranscoders {
  kind: 'plt' | 'clt';
  /** features per layer */
  F: number;
  inputHook: InputHook;
  outputHook: OutputHook;
  /** JumpReLU a = x·[x > θ] (strict), ReLU, or TopK(k) a = x·gate (activation_functions.py) */
  activation: 'jumprelu' | 'relu' | 'topk';
  k?: number;
  layers: RefTranscoderLayer[];
}

export interface RefFeature {
  layer: number;
  pos: number;
  feature: number;
  activation: number;
}

export interface RefNode {
  kind: 'feature' | 'error' | 'token' | 'logit';
  node_id: string;
  layer: number;
  pos: number;
  /** feature index, token id (token node) or vocabulary id (logit node); -1 for errors */
  index: number;
}

export interface AttributionOptions {
  maxNLogits?: number;
  desiredLogitProb?: number;
  /** all features when absent */
  maxFeatureNodes?: number;
  batchSize?: number;
  updateInterval?: number;
  nodeThreshold?: number;
  edgeThreshold?: number;
}

export interface RefAttribution {
  T: number;
  L: number;
  /** every active feature, sorted by (layer, pos, feature) */
  active: RefFeature[];
  /** indices into `active` of the features that are nodes (all, or those max_feature_nodes picked), ascending */
  selected: number[];
  logits: { token: number; prob: number }[];
  /** the graph's nodes in circuit-tracer's order (selected features, errors, tokens, logits) */
  nodes: RefNode[];
  /** N × N, row-major A[target, source] */
  adjacency: Float64Array;
  /** per node: the target quantity on the clean run (W_enc·x_l without b_enc; logit − mean logit), 0 for non-targets */
  targetValue: Float64Array;
  /** per node: the frozen affine model's value with every source removed (biases, positions, position 0) */
  constant: Float64Array;
  /** graph.py prune_graph(node_threshold, edge_threshold) */
  nodeMask: boolean[];
  edgeMask: Uint8Array;
  cumulativeScores: Float64Array;
  /** the node influence prune_graph thresholds (graph.py compute_node_influence) */
  nodeInfluence: Float64Array;
  /** the node threshold and the edge threshold prune_graph used, to see near-threshold flips */
  thresholds: { node: number; edge: number };
  scores: { replacement: number; completeness: number };
  /** frozen-model pieces for finite differences */
  clean: CleanState;
  /** source vectors by node index: where they enter and with what vector */
  sourceOf(node: number): SourceVector;
  /** target vector of a feature or logit node: where it reads and with what vector */
  targetOf(node: number): TargetVector;
}

export interface SourceVector {
  /** 'embed' at hook_embed, or the MLP output of a layer */
  at: { embed: true } | { layer: number }[];
  pos: number;
  /** one vector per entry of `at` (CLT: one per output layer) */
  vectors: Float64Array[];
}

export interface TargetVector {
  layer: number; // L = the final norm's output y
  pos: number;
  u: Float64Array;
}

export interface CleanState {
  T: number;
  D: number;
  L: number;
  tokens: number[];
  embed: Float64Array;
  residMid: Float64Array[];
  mlpOut: Float64Array[];
  xin: Float64Array[];
  s1: Float64Array[];
  s2: Float64Array[];
  /** post-attention norm scales (Gemma 2), or null */
  sPostAttn: (Float64Array | null)[];
  sf: Float64Array;
  pattern: Float64Array[];
  y: Float64Array;
  lastLogits: Float64Array;
}

// ---------------------------------------------------------------- small math

function rowScale(x: Float64Array, T: number, D: number, n: RefNorm): Float64Array {
  const s = new Float64Array(T);
  for (let t = 0; t < T; t++) {
    let mean = 0;
    if (n.kind === 'layer') {
      for (let i = 0; i < D; i++) mean += x[t * D + i];
      mean /= D;
    }
    let v = 0;
    for (let i = 0; i < D; i++) v += (x[t * D + i] - mean) ** 2;
    s[t] = Math.sqrt(v / D + n.eps);
  }
  return s;
}

/**
 * A norm with a frozen scale s: LayerNorm (x − mean x)/s ⊙ w (+ b), RMSNorm x/s ⊙ w (Gemma: 1 + w).
 * `bias` false gives the linear part; `weighted` false stops before the weight (TL's hook_normalized of an RMSNorm).
 */
function frozenNorm(
  x: Float64Array,
  T: number,
  D: number,
  n: RefNorm,
  s: Float64Array,
  bias: boolean,
  weighted = true,
): Float64Array {
  const y = new Float64Array(T * D);
  for (let t = 0; t < T; t++) {
    let mean = 0;
    if (n.kind === 'layer') {
      for (let i = 0; i < D; i++) mean += x[t * D + i];
      mean /= D;
    }
    for (let i = 0; i < D; i++) {
      const w = !weighted ? 1 : n.plusOne ? 1 + n.w[i] : n.w[i];
      y[t * D + i] = ((x[t * D + i] - mean) / s[t]) * w + (bias && weighted && n.b ? n.b[i] : 0);
    }
  }
  return y;
}

/** y[T, out] = x[T, in] · W[in, out] (+ b) */
function mm(x: Float64Array, T: number, nin: number, W: Float64Array, nout: number, b?: Float64Array | null) {
  const y = new Float64Array(T * nout);
  for (let t = 0; t < T; t++) {
    if (b) for (let o = 0; o < nout; o++) y[t * nout + o] = b[o];
    for (let i = 0; i < nin; i++) {
      const v = x[t * nin + i];
      if (v === 0) continue;
      for (let o = 0; o < nout; o++) y[t * nout + o] += v * W[i * nout + o];
    }
  }
  return y;
}

/** skip(x) for one layer: PLT x·W_skipᵀ, CLT x·W_skip */
function skipOf(tc: RefTranscoders, l: number, x: Float64Array, T: number, D: number): Float64Array {
  const W = tc.layers[l].W_skip;
  const y = new Float64Array(T * D);
  if (!W) return y;
  for (let t = 0; t < T; t++)
    for (let o = 0; o < D; o++) {
      let s = 0;
      for (let i = 0; i < D; i++) s += x[t * D + i] * (tc.kind === 'plt' ? W[o * D + i] : W[i * D + o]);
      y[t * D + o] = s;
    }
  return y;
}

function dot(a: Float64Array, ao: number, b: Float64Array, bo: number, n: number): number {
  let s = 0;
  for (let i = 0; i < n; i++) s += a[ao + i] * b[bo + i];
  return s;
}

// ---------------------------------------------------------------- the clean run

function inputHookOf(A: RefArch, l: number, mid: Float64Array, s2: Float64Array, T: number, hook: InputHook) {
  const D = A.D;
  if (hook === 'hook_resid_mid') return mid.slice();
  const n = A.layers[l].ln2!; // models with pre-norms only
  // TL: LayerNorm's hook_normalized is after w and b; RMSNorm's before w (spec ambiguity 1)
  if (hook === 'ln2.hook_normalized' && n.kind === 'rms') return frozenNorm(mid, T, D, n, s2, false, false);
  return frozenNorm(mid, T, D, n, s2, true);
}

export function cleanState(model: RefModel, tokens: number[], tc: RefTranscoders): CleanState {
  const A = describe(model);
  if (A.parallel) throw new Error('attribution64: parallel attention/MLP blocks are not supported');
  const T = tokens.length,
    D = A.D,
    L = A.layers.length;
  const r = referenceForward(model, tokens);
  const h = (n: string) => r.hooks[n].data;
  const residMid: Float64Array[] = [],
    mlpOut: Float64Array[] = [],
    xin: Float64Array[] = [],
    s1: Float64Array[] = [],
    s2: Float64Array[] = [],
    sPostAttn: (Float64Array | null)[] = [],
    pattern: Float64Array[] = [];
  for (let l = 0; l < L; l++) {
    const b = `blocks.${l}`;
    residMid.push(h(`${b}.hook_resid_mid`));
    mlpOut.push(h(`${b}.hook_mlp_out`));
    s1.push(h(`${b}.ln1.hook_scale`));
    s2.push(h(`${b}.ln2.hook_scale`));
    pattern.push(h(`${b}.attn.hook_pattern`));
    const post = A.layers[l].postAttn;
    if (post) {
      // the post-attention norm's input: Σ_h hook_result + b_O
      const res = h(`${b}.attn.hook_result`);
      const pre = new Float64Array(T * D);
      for (let t = 0; t < T; t++)
        for (let o = 0; o < D; o++) {
          let s = A.layers[l].bo ? A.layers[l].bo![o] : 0;
          for (let hh = 0; hh < A.H; hh++) s += res[(t * A.H + hh) * D + o];
          pre[t * D + o] = s;
        }
      sPostAttn.push(rowScale(pre, T, D, post));
    } else sPostAttn.push(null);
    xin.push(inputHookOf(A, l, residMid[l], s2[l], T, tc.inputHook));
  }
  const sf = h('ln_final.hook_scale');
  const y = frozenNorm(h(`blocks.${L - 1}.hook_resid_post`), T, D, A.lnf, sf, true);
  const V = A.V;
  const lastLogits = r.logits.data.slice((T - 1) * V, T * V);
  return {
    T,
    D,
    L,
    tokens,
    embed: h('hook_embed'),
    residMid,
    mlpOut,
    xin,
    s1,
    s2,
    sPostAttn,
    sf,
    pattern,
    y,
    lastLogits,
  };
}

// ---------------------------------------------------------------- transcoders

/** pre-activations of every feature at every position of layer l: W_enc·x + b_enc, [T, F] */
function preActs(tc: RefTranscoders, l: number, x: Float64Array, T: number, D: number): Float64Array {
  const { F } = tc;
  const Lr = tc.layers[l];
  const pre = new Float64Array(T * F);
  for (let t = 0; t < T; t++)
    for (let f = 0; f < F; f++) pre[t * F + f] = dot(Lr.W_enc, f * D, x, t * D, D) + Lr.b_enc[f];
  return pre;
}

function activate(tc: RefTranscoders, l: number, pre: Float64Array, T: number): Float64Array {
  const { F } = tc;
  const a = new Float64Array(T * F);
  for (let t = 0; t < T; t++) {
    if (tc.activation === 'topk') {
      const idx = Array.from({ length: F }, (_, f) => f).sort((i, j) => pre[t * F + j] - pre[t * F + i]);
      for (const f of idx.slice(0, tc.k!)) a[t * F + f] = pre[t * F + f];
      continue;
    }
    for (let f = 0; f < F; f++) {
      const v = pre[t * F + f];
      a[t * F + f] = tc.activation === 'relu' ? Math.max(v, 0) : v > tc.layers[l].threshold![f] ? v : 0;
    }
  }
  return a;
}

/** decoder vector of feature f of layer l into output layer m (m ≥ l; PLT only m = l) */
function decoderRow(tc: RefTranscoders, l: number, f: number, m: number, D: number): Float64Array {
  const Lr = tc.layers[l];
  if (tc.kind === 'plt') return Lr.W_dec.slice(f * D, (f + 1) * D);
  const nOut = tc.layers.length - l;
  const o = (f * nOut + (m - l)) * D;
  return Lr.W_dec.slice(o, o + D);
}

// ---------------------------------------------------------------- the frozen model

interface Injection {
  embed?: Float64Array;
  /** per layer, added at the MLP output (the feature-output hook) */
  mlp?: (Float64Array | null)[];
}

/**
 * The frozen model as an affine map: `affine` false is its linear part (what edges are made of);
 * true adds every constant (positional embeddings, biases, b_dec, position 0's MLP output).
 * Returns each layer's x_l (the feature-input hook) and y = ln_final's output.
 */
function frozenForward(
  A: RefArch,
  c: CleanState,
  tc: RefTranscoders,
  inj: Injection,
  affine: boolean,
): { xin: Float64Array[]; y: Float64Array } {
  const { T, D, L } = c;
  const { H, Hkv, Dh } = A;
  const rep = H / Hkv;
  let r = inj.embed ? inj.embed.slice() : new Float64Array(T * D);
  if (affine && A.pos) for (let k = 0; k < T * D; k++) r[k] += A.pos[k];
  const xinAll: Float64Array[] = [];
  for (let l = 0; l < L; l++) {
    const Ly = A.layers[l];
    const x1 = frozenNorm(r, T, D, Ly.ln1!, c.s1[l], affine);
    const v = mm(x1, T, D, Ly.Wv, Hkv * Dh, affine ? Ly.bv : null);
    const z = new Float64Array(T * H * Dh);
    const P = c.pattern[l];
    for (let hh = 0; hh < H; hh++) {
      const kv = Math.floor(hh / rep);
      for (let i = 0; i < T; i++)
        for (let j = 0; j <= i; j++) {
          const p = P[(hh * T + i) * T + j];
          if (p === 0) continue;
          for (let d = 0; d < Dh; d++) z[(i * H + hh) * Dh + d] += p * v[(j * Hkv + kv) * Dh + d];
        }
    }
    let attn: Float64Array = mm(z, T, H * Dh, Ly.Wo, D, affine ? Ly.bo : null);
    if (Ly.postAttn) attn = frozenNorm(attn, T, D, Ly.postAttn, c.sPostAttn[l]!, affine);
    const mid = new Float64Array(T * D);
    for (let k = 0; k < T * D; k++) mid[k] = r[k] + attn[k];
    const xin =
      tc.inputHook === 'hook_resid_mid'
        ? mid
        : tc.inputHook === 'ln2.hook_normalized' && Ly.ln2!.kind === 'rms'
          ? frozenNorm(mid, T, D, Ly.ln2!, c.s2[l], false, false)
          : frozenNorm(mid, T, D, Ly.ln2!, c.s2[l], affine);
    xinAll.push(xin);
    const mo = skipOf(tc, l, xin, T, D);
    if (affine) {
      // position 0: the MLP output minus its skip is a constant (no node); elsewhere b_dec is
      const skip0 = skipOf(tc, l, c.xin[l].slice(0, D), 1, D);
      for (let i = 0; i < D; i++) mo[i] += c.mlpOut[l][i] - skip0[i];
      for (let t = 1; t < T; t++) for (let i = 0; i < D; i++) mo[t * D + i] += tc.layers[l].b_dec[i];
    }
    const add = inj.mlp?.[l];
    if (add) for (let k = 0; k < T * D; k++) mo[k] += add[k];
    const next = new Float64Array(T * D);
    for (let k = 0; k < T * D; k++) next[k] = mid[k] + mo[k];
    r = next;
  }
  return { xin: xinAll, y: frozenNorm(r, T, D, A.lnf, c.sf, affine) };
}

// ---------------------------------------------------------------- graph.py

function normalizeRows(A: Float64Array, N: number, clampMin: number): Float64Array {
  const out = new Float64Array(N * N);
  for (let t = 0; t < N; t++) {
    let s = 0;
    for (let j = 0; j < N; j++) s += Math.abs(A[t * N + j]);
    s = Math.max(s, clampMin);
    for (let j = 0; j < N; j++) out[t * N + j] = Math.abs(A[t * N + j]) / s;
  }
  return out;
}

/** Σ_{k≥1} w Âᵏ, until the term is exactly zero (graph.py compute_influence) */
function influence(Ah: Float64Array, w: Float64Array, N: number): Float64Array {
  const vecMat = (v: Float64Array) => {
    const out = new Float64Array(N);
    for (let t = 0; t < N; t++) {
      const vt = v[t];
      if (vt === 0) continue;
      for (let j = 0; j < N; j++) out[j] += vt * Ah[t * N + j];
    }
    return out;
  };
  let cur = vecMat(w);
  const inf = cur.slice();
  for (let it = 0; cur.some((x) => x !== 0); it++) {
    if (it >= 1000) throw new Error('influence did not converge');
    cur = vecMat(cur);
    for (let j = 0; j < N; j++) inf[j] += cur[j];
  }
  return inf;
}

/** graph.py find_threshold: the score at the first cumulative fraction ≥ τ */
function findThreshold(scores: ArrayLike<number>, tau: number): number {
  const s = Float64Array.from(scores).sort().reverse();
  let total = 0;
  for (const x of s) total += x;
  let c = 0;
  let i = 0;
  for (; i < s.length; i++) {
    c += s[i];
    if (c / total >= tau) break;
  }
  return s[Math.min(i, s.length - 1)];
}

function prune(
  A: Float64Array,
  N: number,
  w: Float64Array,
  nFeat: number,
  nTok: number,
  nLog: number,
  o: Required<AttributionOptions>,
) {
  const nodeInfluence = influence(normalizeRows(A, N, 1e-10), w, N);
  const nodeThr = findThreshold(nodeInfluence, o.nodeThreshold);
  const nodeMask = Array.from(nodeInfluence, (x) => x >= nodeThr);
  for (let i = N - nLog - nTok; i < N; i++) nodeMask[i] = true;
  const P = A.slice();
  for (let t = 0; t < N; t++) for (let j = 0; j < N; j++) if (!nodeMask[t] || !nodeMask[j]) P[t * N + j] = 0;
  const Ph = normalizeRows(P, N, 1e-10);
  const I2 = influence(Ph, w, N);
  for (let i = 0; i < N; i++) I2[i] += w[i];
  const E = new Float64Array(N * N);
  for (let t = 0; t < N; t++) for (let j = 0; j < N; j++) E[t * N + j] = Ph[t * N + j] * I2[t];
  const edgeThr = findThreshold(E, o.edgeThreshold);
  const edgeMask = Uint8Array.from(E, (x) => (x >= edgeThr ? 1 : 0));
  const featOrErr = N - nLog - nTok;
  const step = () => {
    for (let j = 0; j < featOrErr; j++) {
      if (!nodeMask[j]) continue;
      let out = false;
      for (let t = 0; t < N && !out; t++) out = edgeMask[t * N + j] === 1;
      if (!out) nodeMask[j] = false;
    }
    for (let t = 0; t < nFeat; t++) {
      if (!nodeMask[t]) continue;
      let inc = false;
      for (let j = 0; j < N && !inc; j++) inc = edgeMask[t * N + j] === 1;
      if (!inc) nodeMask[t] = false;
    }
  };
  let old = nodeMask.slice();
  step();
  while (nodeMask.some((m, i) => m !== old[i])) {
    old = nodeMask.slice();
    for (let t = 0; t < N; t++) for (let j = 0; j < N; j++) if (!nodeMask[t] || !nodeMask[j]) edgeMask[t * N + j] = 0;
    step();
  }
  // cumulative scores: the cumulative fraction of influence at each node's rank (descending)
  const order = Array.from({ length: N }, (_, i) => i).sort((a, b) => nodeInfluence[b] - nodeInfluence[a] || a - b);
  let total = 0;
  for (const x of nodeInfluence) total += x;
  const cumulativeScores = new Float64Array(N);
  let c = 0;
  for (const i of order) {
    c += nodeInfluence[i];
    cumulativeScores[i] = c / total;
  }
  return { nodeMask, edgeMask, cumulativeScores, nodeInfluence, thresholds: { node: nodeThr, edge: edgeThr } };
}

function graphScores(A: Float64Array, N: number, w: Float64Array, nFeat: number, L: number, T: number) {
  const Ah = normalizeRows(A, N, 1e-10);
  const I = influence(Ah, w, N);
  const errStart = nFeat,
    errEnd = nFeat + L * T,
    tokEnd = errEnd + T;
  let tok = 0,
    err = 0;
  for (let i = errEnd; i < tokEnd; i++) tok += I[i];
  for (let i = errStart; i < errEnd; i++) err += I[i];
  let num = 0,
    den = 0;
  for (let n = 0; n < N; n++) {
    let e = 0;
    for (let j = errStart; j < errEnd; j++) e += Ah[n * N + j];
    num += (1 - e) * (I[n] + w[n]);
    den += I[n] + w[n];
  }
  return { replacement: tok / (tok + err), completeness: num / den };
}

// ---------------------------------------------------------------- the whole reference

export function referenceAttribution(
  model: RefModel,
  tokens: number[],
  tc: RefTranscoders,
  options: AttributionOptions = {},
): RefAttribution {
  const o: Required<AttributionOptions> = {
    maxNLogits: 10,
    desiredLogitProb: 0.95,
    maxFeatureNodes: Infinity,
    batchSize: 512,
    updateInterval: 4,
    nodeThreshold: 0.8,
    edgeThreshold: 0.98,
    ...options,
  };
  const Ar = describe(model);
  const c = cleanState(model, tokens, tc);
  const { T, D, L } = c;
  if (tc.layers.length !== L) throw new Error('attribution64: one transcoder layer per model layer');

  // active features (pos 0 zeroed before anything uses them), sorted by (layer, pos, feature)
  const acts: Float64Array[] = [];
  const active: RefFeature[] = [];
  for (let l = 0; l < L; l++) {
    const a = activate(tc, l, preActs(tc, l, c.xin[l], T, D), T);
    for (let f = 0; f < tc.F; f++) a[f] = 0;
    acts.push(a);
    for (let p = 0; p < T; p++)
      for (let f = 0; f < tc.F; f++)
        if (a[p * tc.F + f] !== 0) active.push({ layer: l, pos: p, feature: f, activation: a[p * tc.F + f] });
  }

  // errors: e_l = o_l − (Σ a·W_dec + b_dec + skip(x_l)), zero at position 0
  const errors: Float64Array[] = [];
  for (let m = 0; m < L; m++) {
    const recon = skipOf(tc, m, c.xin[m], T, D);
    for (let t = 0; t < T; t++) for (let i = 0; i < D; i++) recon[t * D + i] += tc.layers[m].b_dec[i];
    for (const f of active) {
      if (tc.kind === 'plt' ? f.layer !== m : f.layer > m) continue;
      const row = decoderRow(tc, f.layer, f.feature, m, D);
      for (let i = 0; i < D; i++) recon[f.pos * D + i] += f.activation * row[i];
    }
    const e = new Float64Array(T * D);
    for (let k = D; k < T * D; k++) e[k] = c.mlpOut[m][k] - recon[k];
    errors.push(e);
  }

  // logit targets (targets.py _from_salient): top max_n_logits by probability, until cumsum ≥ desired
  const V = Ar.V;
  let mx = -Infinity;
  for (const x of c.lastLogits) mx = Math.max(mx, x);
  let z = 0;
  for (const x of c.lastLogits) z += Math.exp(x - mx);
  const probs = Array.from(c.lastLogits, (x) => Math.exp(x - mx) / z);
  const top = Array.from({ length: V }, (_, v) => v)
    .sort((a, b) => probs[b] - probs[a] || a - b)
    .slice(0, o.maxNLogits);
  let cum = 0,
    cutoff = top.length;
  for (let i = 0; i < top.length; i++) {
    cum += probs[top[i]];
    if (cum >= o.desiredLogitProb) {
      cutoff = i + 1;
      break;
    }
  }
  const logits = top.slice(0, cutoff).map((token) => ({ token, prob: probs[token] }));
  const meanWU = new Float64Array(D);
  for (let d = 0; d < D; d++) {
    let s = 0;
    for (let v = 0; v < V; v++) s += Ar.WU[d * V + v];
    meanWU[d] = s / V;
  }
  const logitVec = (v: number) => Float64Array.from({ length: D }, (_, d) => Ar.WU[d * V + v] - meanWU[d]);

  // the full (all-features) node list: features, errors (l·T + p), tokens, logits
  const nAct = active.length;
  const nLog = logits.length;
  const Nf = nAct + L * T + T + nLog;
  const errIdx = (l: number, p: number) => nAct + l * T + p;
  const tokIdx = (p: number) => nAct + L * T + p;
  const logIdx = (i: number) => nAct + L * T + T + i;

  const sourceOfFull = (n: number): SourceVector => {
    if (n < nAct) {
      const f = active[n];
      const outs = tc.kind === 'plt' ? [f.layer] : Array.from({ length: L - f.layer }, (_, j) => f.layer + j);
      return {
        at: outs.map((layer) => ({ layer })),
        pos: f.pos,
        vectors: outs.map((m) => decoderRow(tc, f.layer, f.feature, m, D).map((x) => x * f.activation)),
      };
    }
    if (n < nAct + L * T) {
      const l = Math.floor((n - nAct) / T),
        p = (n - nAct) % T;
      return { at: [{ layer: l }], pos: p, vectors: [errors[l].slice(p * D, (p + 1) * D)] };
    }
    const p = n - nAct - L * T;
    return { at: { embed: true }, pos: p, vectors: [c.embed.slice(p * D, (p + 1) * D)] };
  };
  const targetOfFull = (n: number): TargetVector => {
    if (n < nAct) {
      const f = active[n];
      return { layer: f.layer, pos: f.pos, u: tc.layers[f.layer].W_enc.slice(f.feature * D, (f.feature + 1) * D) };
    }
    return { layer: L, pos: T - 1, u: logitVec(logits[n - nAct - L * T - T].token) };
  };
  const readTargets = (out: { xin: Float64Array[]; y: Float64Array }, into: (row: number, v: number) => void) => {
    for (let n = 0; n < nAct; n++) {
      const t = targetOfFull(n);
      into(n, dot(t.u, 0, out.xin[t.layer], t.pos * D, D));
    }
    for (let i = 0; i < nLog; i++) {
      const t = targetOfFull(logIdx(i));
      into(logIdx(i), dot(t.u, 0, out.y, (T - 1) * D, D));
    }
  };

  // every column by one forward propagation of its source through the frozen linear model
  const full = new Float64Array(Nf * Nf);
  for (let s = 0; s < nAct + L * T + T; s++) {
    const src = sourceOfFull(s);
    const inj: Injection = {};
    if ('embed' in src.at) {
      inj.embed = new Float64Array(T * D);
      inj.embed.set(src.vectors[0], src.pos * D);
    } else {
      inj.mlp = Array.from({ length: L }, () => null);
      src.at.forEach(({ layer }, k) => {
        const v = (inj.mlp![layer] ??= new Float64Array(T * D));
        for (let i = 0; i < D; i++) v[src.pos * D + i] += src.vectors[k][i];
      });
    }
    readTargets(frozenForward(Ar, c, tc, inj, false), (row, v) => (full[row * Nf + s] = v));
  }
  const constFull = new Float64Array(Nf);
  readTargets(frozenForward(Ar, c, tc, {}, true), (row, v) => (constFull[row] = v));
  const targetFull = new Float64Array(Nf);
  readTargets({ xin: c.xin, y: c.y }, (row, v) => (targetFull[row] = v));
  // (the feature target is W_enc·x: circuit-tracer's pre-activation without b_enc)

  // max_feature_nodes: circuit-tracer's partial-influence schedule (attribute_transformerlens.py Phase 4)
  const maxFeat = Math.min(o.maxFeatureNodes, nAct);
  let selected: number[];
  if (maxFeat === nAct) selected = active.map((_, i) => i);
  else {
    const rows: number[] = Array.from({ length: nLog }, (_, i) => logIdx(i)); // node index of each computed row
    const visited = new Uint8Array(nAct);
    let nVisited = 0;
    while (nVisited < maxFeat) {
      const inf = partialInfluences(
        full,
        Nf,
        rows,
        logits.map((x) => x.prob),
      );
      const rank = Array.from({ length: nAct }, (_, i) => i).sort((a, b) => inf[b] - inf[a] || a - b);
      const queue = Math.min(o.updateInterval * o.batchSize, maxFeat - nVisited);
      const pending = rank.filter((i) => !visited[i]).slice(0, queue);
      for (const i of pending) {
        visited[i] = 1;
        rows.push(i);
      }
      nVisited += pending.length;
    }
    selected = active.map((_, i) => i).filter((i) => visited[i]);
  }

  // the graph over the selected features
  const nFeat = selected.length;
  const N = nFeat + L * T + T + nLog;
  const mapFull = (n: number) => (n < nFeat ? selected[n] : n - nFeat + nAct);
  const adjacency = new Float64Array(N * N);
  for (let t = 0; t < N; t++) for (let s = 0; s < N; s++) adjacency[t * N + s] = full[mapFull(t) * Nf + mapFull(s)];
  const targetValue = Float64Array.from({ length: N }, (_, n) => targetFull[mapFull(n)]);
  const constant = Float64Array.from({ length: N }, (_, n) => constFull[mapFull(n)]);
  const nodes: RefNode[] = [];
  for (const i of selected) {
    const f = active[i];
    nodes.push({
      kind: 'feature',
      node_id: `${f.layer}_${f.feature}_${f.pos}`,
      layer: f.layer,
      pos: f.pos,
      index: f.feature,
    });
  }
  for (let l = 0; l < L; l++)
    for (let p = 0; p < T; p++) nodes.push({ kind: 'error', node_id: `0_${l}_${p}`, layer: l, pos: p, index: -1 });
  for (let p = 0; p < T; p++)
    nodes.push({ kind: 'token', node_id: `E_${tokens[p]}_${p}`, layer: -1, pos: p, index: tokens[p] });
  for (const lg of logits)
    nodes.push({ kind: 'logit', node_id: `${L + 1}_${lg.token}_${T - 1}`, layer: L + 1, pos: T - 1, index: lg.token });

  const w = new Float64Array(N);
  logits.forEach((lg, i) => (w[N - nLog + i] = lg.prob));
  const pr = prune(adjacency, N, w, nFeat, T, nLog, o);
  const scores = graphScores(adjacency, N, w, nFeat, L, T);
  void errIdx;
  void tokIdx;
  return {
    T,
    L,
    active,
    selected,
    logits,
    nodes,
    adjacency,
    targetValue,
    constant,
    ...pr,
    scores,
    clean: c,
    sourceOf: (n) => sourceOfFull(mapFull(n)),
    targetOf: (n) => targetOfFull(mapFull(n)),
  };
}

/** graph.py compute_partial_influences over the rows computed so far (clamp 1e-8, ≤ 128 iterations) */
function partialInfluences(full: Float64Array, Nf: number, rows: number[], logitP: number[]): Float64Array {
  const R = rows.length;
  const norm = new Float64Array(R * Nf);
  for (let r = 0; r < R; r++) {
    let s = 0;
    for (let j = 0; j < Nf; j++) s += Math.abs(full[rows[r] * Nf + j]);
    s = Math.max(s, 1e-8);
    for (let j = 0; j < Nf; j++) norm[r * Nf + j] = Math.abs(full[rows[r] * Nf + j]) / s;
  }
  const inf = new Float64Array(Nf);
  let prod = new Float64Array(Nf);
  logitP.forEach((p, i) => (prod[Nf - logitP.length + i] = p));
  for (let it = 0; it < 128; it++) {
    const next = new Float64Array(Nf);
    for (let r = 0; r < R; r++) {
      const v = prod[rows[r]];
      if (v === 0) continue;
      for (let j = 0; j < Nf; j++) next[j] += v * norm[r * Nf + j];
    }
    prod = next;
    if (!prod.some((x) => x !== 0)) return inf;
    for (let j = 0; j < Nf; j++) inf[j] += prod[j];
  }
  throw new Error('partial influences did not converge');
}

/**
 * Finite differences in the frozen model, through forward64's own forward (not frozenForward):
 * the real forward with every pattern and norm scale replaced by its clean value and every MLP
 * output by clean + skip(x) − skip(x_clean), plus ε·v_s where the source enters. Returns the change
 * of each requested target quantity divided by ε: the column A[·, s] (the frozen model is affine,
 * so the difference is exact up to rounding).
 */
export function frozenDifference(
  model: RefModel,
  ref: RefAttribution,
  tc: RefTranscoders,
  source: number,
  targets: number[],
  eps = 1,
): number[] {
  const A = describe(model);
  const c = ref.clean;
  const { T, D, L } = c;
  const src = ref.sourceOf(source);
  const add = (v: Float64Array, vec: Float64Array) => {
    const out = v.slice();
    for (let i = 0; i < D; i++) out[src.pos * D + i] += eps * vec[i];
    return out;
  };
  const run = (perturb: boolean) => {
    const mids: Float64Array[] = [];
    const res = referenceForward(model, c.tokens, {
      record: (n) => n === `blocks.${L - 1}.hook_resid_post` || n.endsWith('hook_resid_mid'),
      hook: (name, value) => {
        if (name === 'hook_embed' && perturb && 'embed' in src.at) return add(value, src.vectors[0]);
        const m = /^blocks\.(\d+)\.(.*)$/.exec(name);
        if (!m) return name === 'ln_final.hook_scale' ? c.sf : undefined;
        const l = Number(m[1]);
        if (m[2] === 'attn.hook_pattern') return c.pattern[l];
        if (m[2] === 'ln1.hook_scale') return c.s1[l];
        if (m[2] === 'ln2.hook_scale') return c.s2[l];
        if (m[2] === 'hook_resid_mid') mids[l] = value;
        if (m[2] === 'hook_mlp_out') {
          const x = inputHookOf(A, l, mids[l], c.s2[l], T, tc.inputHook);
          const sk = skipOf(tc, l, x, T, D),
            sk0 = skipOf(tc, l, c.xin[l], T, D);
          let out = Float64Array.from(c.mlpOut[l], (v, k) => v + sk[k] - sk0[k]);
          if (perturb && !('embed' in src.at))
            src.at.forEach(({ layer }, k) => layer === l && (out = add(out, src.vectors[k])));
          return out;
        }
        return undefined;
      },
    });
    const xin = mids.map((mid, l) => inputHookOf(A, l, mid, c.s2[l], T, tc.inputHook));
    const y = frozenNorm(res.hooks[`blocks.${L - 1}.hook_resid_post`].data, T, D, A.lnf, c.sf, true);
    return targets.map((t) => {
      const tv = ref.targetOf(t);
      return dot(tv.u, 0, tv.layer === L ? y : xin[tv.layer], tv.pos * D, D);
    });
  };
  if (A.layers.some((l) => l.postAttn)) throw new Error('frozenDifference: post-norm models are not supported');
  const base = run(false),
    pert = run(true);
  return base.map((b, i) => (pert[i] - b) / eps);
}

/**
 * circuit-tracer's feature_intervention (replacement_model_transformerlens.py
 * _get_feature_intervention_hooks) in float64: active features (indices into `ref.active`) set to
 * new values; the logits at the last position.
 *  - 'recomputed' (its default, freeze_attention=True, constrained_layers=None): patterns frozen;
 *    at each layer's feature-output hook the decoder delta (value − the activation the transcoder
 *    gives the current input, in the same pass) is added, to every layer a CLT feature writes to.
 *  - 'frozen' (constrained_layers = every layer): the frozen affine model with
 *    (value − clean activation)·W_dec added at the outputs.
 */
export function referenceIntervention(
  model: RefModel,
  ref: RefAttribution,
  tc: RefTranscoders,
  changes: { index: number; value: number }[],
  errors: 'recomputed' | 'frozen',
): Float64Array {
  const A = describe(model);
  const c = ref.clean;
  const { T, D, L } = c;
  const V = A.V;
  const unembed = (y: Float64Array, at: number) => {
    const out = new Float64Array(V);
    for (let v = 0; v < V; v++) {
      let s = A.bU ? A.bU[v] : 0;
      for (let d = 0; d < D; d++) s += y[at * D + d] * A.WU[d * V + v];
      out[v] = A.finalSoftcap ? A.finalSoftcap * Math.tanh(s / A.finalSoftcap) : s;
    }
    return out;
  };
  const deltas = Array.from({ length: L }, () => new Float64Array(T * D));
  const addDelta = (f: RefFeature, by: number) => {
    const outs = tc.kind === 'plt' ? [f.layer] : Array.from({ length: L - f.layer }, (_, j) => f.layer + j);
    for (const m of outs) {
      const row = decoderRow(tc, f.layer, f.feature, m, D);
      for (let i = 0; i < D; i++) deltas[m][f.pos * D + i] += by * row[i];
    }
  };
  if (errors === 'frozen') {
    for (const ch of changes) addDelta(ref.active[ch.index], ch.value - ref.active[ch.index].activation);
    const dy = frozenForward(A, c, tc, { mlp: deltas }, false).y;
    const y = Float64Array.from(c.y, (v, k) => v + dy[k]);
    return unembed(y, T - 1);
  }
  const mids: Float64Array[] = [];
  const res = referenceForward(model, c.tokens, {
    record: (n) => n === 'logits',
    hook: (name, value) => {
      const m = /^blocks\.(\d+)\.(.*)$/.exec(name);
      if (!m) return undefined;
      const l = Number(m[1]);
      if (m[2] === 'attn.hook_pattern') return c.pattern[l];
      if (m[2] === 'hook_resid_mid') mids[l] = value;
      if (m[2] === 'ln2.hook_scale') {
        const mine = changes.filter((ch) => ref.active[ch.index].layer === l);
        if (mine.length) {
          const x = inputHookOf(A, l, mids[l], value, T, tc.inputHook);
          const acts = activate(tc, l, preActs(tc, l, x, T, D), T);
          for (const ch of mine) {
            const f = ref.active[ch.index];
            addDelta(f, ch.value - acts[f.pos * tc.F + f.feature]);
          }
        }
      }
      if (m[2] === 'hook_mlp_out') return Float64Array.from(value, (v, k) => v + deltas[l][k]);
      return undefined;
    },
  });
  return res.logits.data.slice((T - 1) * V, T * V);
}
