// Edge-level circuits in float64: the oracle for edge patching, EAP, EAP-IG and MIB's faithfulness
// scores. Written from the definitions in hannamw/EAP-IG (src/eap/graph.py, attribute.py,
// evaluate.py) and hannamw/MIB-circuit-track (MIB_circuit_track/evaluation.py, print_results.py),
// as /work/shared/specs/edge-circuits.md cites them, on top of the float64 forward (forward64.ts).
// It shares nothing with src/: names, not index layouts; gradients by central finite differences.
//
// The graph: upstream nodes `input` (hook_embed), `a{l}.h{h}` (z_h · W_O[h], no bias), `m{l}`
// (hook_mlp_out); downstream inputs `a{l}.h{h}<q|k|v>` (each head's own copy of the residual
// stream before ln1; grouped k/v weights repeated per query head, TL's ungrouping), `m{l}` (before
// ln2) and `logits` (before ln_final). Edges from every node to every input that reads the
// residual stream after it (an MLP reads its own layer's heads unless the block is parallel).
// A forward with `add` computes each input as resid + add(input, outputs so far).
//
// A mixture-of-experts layer (Loupe's extension; the library has none): upstream nodes `m{l}.e{e}`
// (expert e's output times its routing weight, zero at tokens not routed to it) and `m{l}.shared`;
// expert e's MLP reads input `m{l}.e{e}<in>` and its weight comes from softmax → top-k (→ renormalised)
// of the router applied to input `m{l}.e{e}<router>`; the shared expert and its sigmoid gate read
// `m{l}.shared`. Edges into an MoE layer: per upstream node, each expert's <in> then <router>, then shared.

import {
  describe as archOf,
  matmul,
  normalize,
  applyRotary,
  type RefModel,
  type RefMoe,
  type RefNorm,
} from './forward64';

export interface EdgeGraph64 {
  /** upstream nodes in residual-stream order */
  nodes: string[];
  /** edges in Graph.from_model's insertion order (the order Graph.to_json writes them) */
  edges: { name: string; parent: string; child: string; input: string }[];
}

/** the library's graph for L layers of H heads (graph.py from_model); `moe`: E experts per layer (+ shared) */
export function edgeGraph64(
  L: number,
  H: number,
  parallel: boolean,
  moe?: { E: number; shared: boolean },
): EdgeGraph64 {
  const nodes = ['input'];
  const edges: EdgeGraph64['edges'] = [];
  const add = (parent: string, child: string, qkv?: string) => {
    const input = qkv ? `${child}<${qkv}>` : child;
    edges.push({ name: `${parent}->${input}`, parent, child, input });
  };
  let stream = ['input'];
  for (let l = 0; l < L; l++) {
    const heads = Array.from({ length: H }, (_, h) => `a${l}.h${h}`);
    const experts = moe ? Array.from({ length: moe.E }, (_, e) => `m${l}.e${e}`) : [];
    const mlps = moe ? [...experts, ...(moe.shared ? [`m${l}.shared`] : [])] : [`m${l}`];
    const intoMlp = (u: string) => {
      if (!moe) return add(u, `m${l}`);
      for (const x of experts) {
        add(u, x, 'in');
        add(u, x, 'router');
      }
      if (moe.shared) add(u, `m${l}.shared`);
    };
    for (const u of stream) for (const a of heads) for (const x of 'qkv') add(u, a, x);
    if (parallel) for (const u of stream) intoMlp(u);
    stream = [...stream, ...heads];
    if (!parallel) for (const u of stream) intoMlp(u);
    stream = [...stream, ...mlps];
    nodes.push(...heads, ...mlps);
  }
  for (const u of stream) add(u, 'logits');
  return { nodes, edges };
}

export interface EdgeForward64Options {
  /** a value added to downstream input `input` (e.g. 'a1.h2<k>', 'm0', 'logits'), given every upstream output computed so far */
  add?: (input: string, outs: Map<string, Float64Array>) => Float64Array | undefined;
  /** replaces hook_embed [T·D] */
  embed?: Float64Array;
  /** fill with the state at the start of each layer (index L: before logits), for `start` */
  states?: LayerState[];
  /** resume from a state `states` recorded (a run whose `add` is nothing before that layer) */
  start?: LayerState;
}

export interface LayerState {
  layer: number;
  resid: Float64Array;
  outs: Map<string, Float64Array>;
}

export interface EdgeForward64 {
  /** last position's logits [V] */
  last: Float64Array;
  /** every upstream node's output [T·D] */
  outs: Map<string, Float64Array>;
}

export function edgeForward64(model: RefModel, tokens: number[], opts: EdgeForward64Options = {}): EdgeForward64 {
  const A = archOf(model);
  const { D, H, Hkv, Dh, M, V } = A;
  const T = tokens.length;
  if (A.layers.some((l) => l.postAttn || l.postMlp)) throw new Error('edges64: post-norm blocks are not covered');
  const outs = new Map<string, Float64Array>();
  const plus = (a: Float64Array, b: Float64Array | undefined) => {
    if (!b) return a;
    const y = a.slice();
    for (let i = 0; i < y.length; i++) y[i] += b[i];
    return y;
  };
  const input = (name: string, resid: Float64Array) => plus(resid, opts.add?.(name, outs));

  let resid: Float64Array;
  if (opts.start) {
    for (const [k, v] of opts.start.outs) outs.set(k, v);
    resid = opts.start.resid;
  } else {
    let embed = new Float64Array(T * D);
    for (let t = 0; t < T; t++)
      for (let i = 0; i < D; i++) embed[t * D + i] = A.embed[tokens[t] * D + i] * A.embedScale;
    if (opts.embed) embed = opts.embed.slice();
    outs.set('input', embed);
    resid = embed.slice();
    if (A.pos) for (let k = 0; k < T * D; k++) resid[k] += A.pos[k];
  }

  const rep = H / Hkv;
  const save = (layer: number) => opts.states?.push({ layer, resid, outs: new Map(outs) });
  for (let l = opts.start?.layer ?? 0; l < A.layers.length; l++) {
    save(l);
    const L = A.layers[l];
    const residPre = resid;
    // each head's q, k, v from its own input: [T, Dh] per head
    const col = (W: Float64Array, width: number, head: number) => {
      const w = new Float64Array(D * Dh);
      for (let i = 0; i < D; i++) for (let d = 0; d < Dh; d++) w[i * Dh + d] = W[i * width + head * Dh + d];
      return w;
    };
    const bias = (b: Float64Array | null, head: number) => (b ? b.slice(head * Dh, (head + 1) * Dh) : null);
    const project = (x: Float64Array, W: Float64Array, width: number, b: Float64Array | null, head: number) =>
      matmul(normalize(x, T, D, L.ln1!), T, D, col(W, width, head), Dh, bias(b, head));
    const q: Float64Array[] = [];
    const k: Float64Array[] = [];
    const v: Float64Array[] = [];
    // OLMo 2 / OLMoE (qkFull): the copy's whole projection normalised over all n·Dh, then head h's slice
    const wholeNormed = (
      x: Float64Array,
      W: Float64Array,
      n: number,
      b: Float64Array | null,
      nm: RefNorm,
      head: number,
    ) => {
      const y = normalize(matmul(normalize(x, T, D, L.ln1!), T, D, W, n * Dh, b), T, n * Dh, nm);
      return Float64Array.from({ length: T * Dh }, (_, i) => y[Math.floor(i / Dh) * n * Dh + head * Dh + (i % Dh)]);
    };
    for (let h = 0; h < H; h++) {
      const kh = Math.floor(h / rep);
      const xq = input(`a${l}.h${h}<q>`, residPre);
      const xk = input(`a${l}.h${h}<k>`, residPre);
      let qh = L.qkFull && L.qNorm ? wholeNormed(xq, L.Wq, H, L.bq, L.qNorm, h) : project(xq, L.Wq, H * Dh, L.bq, h);
      let khv =
        L.qkFull && L.kNorm ? wholeNormed(xk, L.Wk, Hkv, L.bk, L.kNorm, kh) : project(xk, L.Wk, Hkv * Dh, L.bk, kh);
      const vh = project(input(`a${l}.h${h}<v>`, residPre), L.Wv, Hkv * Dh, L.bv, kh);
      if (L.qNorm && !L.qkFull) qh = normalize(qh, T, Dh, L.qNorm);
      if (L.kNorm && !L.qkFull) khv = normalize(khv, T, Dh, L.kNorm);
      if (A.rotDims > 0 && A.rope) {
        const { inv, mult } = A.rope(L.rope, T); // longrope: by the run's length, as referenceForward
        applyRotary(qh, T, 1, Dh, A.rotDims, inv, mult);
        applyRotary(khv, T, 1, Dh, A.rotDims, inv, mult);
      }
      q.push(qh);
      k.push(khv);
      v.push(vh);
    }
    let attnOut = new Float64Array(T * D);
    if (L.bo) for (let t = 0; t < T; t++) for (let o = 0; o < D; o++) attnOut[t * D + o] = L.bo[o];
    const heads: Float64Array[] = [];
    for (let h = 0; h < H; h++) {
      const z = new Float64Array(T * Dh);
      for (let i = 0; i < T; i++) {
        const s = new Float64Array(T);
        let mx = -Infinity;
        for (let j = 0; j <= i; j++) {
          if (L.window !== null && i - j >= L.window) {
            s[j] = -Infinity;
            continue;
          }
          let x = 0;
          for (let d = 0; d < Dh; d++) x += q[h][i * Dh + d] * k[h][j * Dh + d];
          x *= L.attnScale;
          if (A.attnSoftcap) x = A.attnSoftcap * Math.tanh(x / A.attnSoftcap);
          s[j] = x;
          mx = Math.max(mx, x);
        }
        let sum = 0;
        for (let j = 0; j <= i; j++) {
          s[j] = s[j] === -Infinity ? 0 : Math.exp(s[j] - mx);
          sum += s[j];
        }
        for (let j = 0; j <= i; j++) for (let d = 0; d < Dh; d++) z[i * Dh + d] += (s[j] / sum) * v[h][j * Dh + d];
      }
      const wo = L.Wo.slice(h * Dh * D, (h + 1) * Dh * D); // rows h·Dh … of [H·Dh, D]
      const r = matmul(z, T, Dh, wo, D, null);
      heads.push(r);
      outs.set(`a${l}.h${h}`, r);
      for (let x = 0; x < T * D; x++) attnOut[x] += r[x];
    }
    const mid = new Float64Array(T * D);
    for (let x = 0; x < T * D; x++) mid[x] = residPre[x] + attnOut[x];
    const from = A.parallel ? residPre : mid;
    let mlpOut: Float64Array;
    if (L.moe) mlpOut = moe64(L.moe, l, (name) => normalize(input(name, from), T, D, L.ln2!), T, D, A.act, outs);
    else {
      const x2 = normalize(input(`m${l}`, from), T, D, L.ln2!);
      const pre = matmul(x2, T, D, L.Win, M, L.bin);
      const post = new Float64Array(T * M);
      if (L.gated) {
        const up = matmul(x2, T, D, L.Wup!, M, L.bup);
        for (let x = 0; x < T * M; x++) post[x] = A.act(pre[x]) * up[x];
      } else for (let x = 0; x < T * M; x++) post[x] = A.act(pre[x]);
      mlpOut = matmul(post, T, M, L.Wout, D, L.bout);
      outs.set(`m${l}`, mlpOut);
    }
    resid = new Float64Array(T * D);
    for (let x = 0; x < T * D; x++) resid[x] = mid[x] + mlpOut[x];
  }
  save(A.layers.length);
  const xf = normalize(input('logits', resid).slice((T - 1) * D), 1, D, A.lnf);
  let last = matmul(xf, 1, D, A.WU, V, A.bU);
  if (A.finalSoftcap) last = last.map((x) => A.finalSoftcap! * Math.tanh(x / A.finalSoftcap!));
  return { last, outs };
}

/**
 * An MoE layer as nodes (see the header): `xn(input)` is ln2 of that input's stream. Each expert's
 * weight per token: the router's softmax over E on its <router> copy, kept if among the k largest
 * (ties to the lower index), divided by the kept sum when renormalising. Returns the layer's output.
 */
function moe64(
  m: RefMoe,
  l: number,
  xn: (input: string) => Float64Array,
  T: number,
  D: number,
  act: (v: number) => number,
  outs: Map<string, Float64Array>,
): Float64Array {
  const total = new Float64Array(T * D);
  const swiglu = (x: Float64Array, Wg: Float64Array, Wu: Float64Array, Wd: Float64Array, n: number) => {
    const g = matmul(x, T, D, Wg, n, null);
    const u = matmul(x, T, D, Wu, n, null);
    for (let i = 0; i < T * n; i++) g[i] = act(g[i]) * u[i];
    return matmul(g, T, n, Wd, D, null);
  };
  const keep = (name: string, y: Float64Array) => {
    outs.set(name, y);
    for (let i = 0; i < T * D; i++) total[i] += y[i];
  };
  for (let e = 0; e < m.E; e++) {
    const logits = matmul(xn(`m${l}.e${e}<router>`), T, D, m.router, m.E, null);
    const y = swiglu(xn(`m${l}.e${e}<in>`), m.experts[e].Wg, m.experts[e].Wu, m.experts[e].Wd, m.M);
    for (let t = 0; t < T; t++) {
      const row = Array.from(logits.subarray(t * m.E, (t + 1) * m.E));
      const mx = Math.max(...row);
      const z = row.reduce((a, v) => a + Math.exp(v - mx), 0);
      const p = row.map((v) => Math.exp(v - mx) / z);
      const top = p
        .map((_, i) => i)
        .sort((i, j) => p[j] - p[i] || i - j)
        .slice(0, m.k);
      const w = top.includes(e) ? p[e] / (m.renorm ? top.reduce((a, i) => a + p[i], 0) : 1) : 0;
      for (let d = 0; d < D; d++) y[t * D + d] *= w;
    }
    keep(`m${l}.e${e}`, y);
  }
  if (m.shared) {
    const sh = m.shared;
    const x = xn(`m${l}.shared`);
    const y = swiglu(x, sh.Wg, sh.Wu, sh.Wd, sh.S);
    const gate = sh.gate ? matmul(x, T, D, sh.gate, 1, null) : null;
    for (let t = 0; t < T; t++) {
      const s = gate ? 1 / (1 + Math.exp(-gate[t])) : 1;
      for (let d = 0; d < D; d++) y[t * D + d] *= s;
    }
    keep(`m${l}.shared`, y);
  }
  return total;
}

export interface Pair64 {
  clean: number[];
  corrupted: number[];
  answer: number;
  counterfactual: number;
}

export const metric64 = (last: Float64Array, p: Pair64) => last[p.answer] - last[p.counterfactual];

/** Σ over upstream u of c(u, input) · (src_u − a_u), for the `add` option: the edge-patching construction */
function patchAdd(
  g: EdgeGraph64,
  src: Map<string, Float64Array>,
  coef: (edge: string) => number,
): EdgeForward64Options['add'] {
  const into = new Map<string, { parent: string; name: string }[]>();
  for (const e of g.edges) into.set(e.input, [...(into.get(e.input) ?? []), e]);
  return (input, outs) => {
    let y: Float64Array | undefined;
    for (const e of into.get(input) ?? []) {
      const c = coef(e.name);
      if (c === 0) continue;
      const s = src.get(e.parent)!;
      const a = outs.get(e.parent)!;
      y ??= new Float64Array(a.length);
      for (let i = 0; i < a.length; i++) y[i] += c * (s[i] - a[i]);
    }
    return y;
  };
}

/** M of the clean run where every edge not in the circuit carries the corrupted run's upstream output (evaluate.py) */
export function circuitMetric64(
  model: RefModel,
  g: EdgeGraph64,
  p: Pair64,
  inCircuit: (edge: string) => boolean,
): number {
  const corr = edgeForward64(model, p.corrupted).outs;
  return metric64(edgeForward64(model, p.clean, { add: patchAdd(g, corr, (e) => (inCircuit(e) ? 0 : 1)) }).last, p);
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

/** exact scores (attribute.py get_scores_exact): mean over pairs of M(only that edge patched) − M(clean) */
export function exactScores64(model: RefModel, g: EdgeGraph64, pairs: Pair64[]): Map<string, number> {
  const out = new Map<string, number>(g.edges.map((e) => [e.name, 0]));
  for (const p of pairs) {
    const corr = edgeForward64(model, p.corrupted).outs;
    const base = metric64(edgeForward64(model, p.clean).last, p);
    for (const e of g.edges) {
      const m = metric64(
        edgeForward64(model, p.clean, { add: patchAdd(g, corr, (x) => (x === e.name ? 1 : 0)) }).last,
        p,
      );
      out.set(e.name, out.get(e.name)! + (m - base) / pairs.length);
    }
  }
  return out;
}

/**
 * Σ_{t,d} Δ_u · ∂M/∂x_b for every edge u → b, by central differences of M along x_b ± ε Δ_u,
 * on the clean tokens with hook_embed = `embed` (default the clean embedding); Δ = corrupted − clean.
 */
function linearScores64(
  model: RefModel,
  g: EdgeGraph64,
  p: Pair64,
  delta: Map<string, Float64Array>,
  embed: Float64Array | undefined,
  eps: number,
): Map<string, number> {
  const out = new Map<string, number>();
  const states: LayerState[] = [];
  edgeForward64(model, p.clean, { embed, states });
  for (const e of g.edges) {
    // a perturbation of an input of layer l leaves everything before layer l as it was
    const layer = e.child === 'logits' ? states.length - 1 : Number(/^[am](\d+)/.exec(e.child)![1]);
    const at = (s: number) =>
      metric64(
        edgeForward64(model, p.clean, {
          start: states[layer],
          add: (input) => (input === e.input ? delta.get(e.parent)!.map((x) => s * x) : undefined),
        }).last,
        p,
      );
    out.set(e.name, (at(eps) - at(-eps)) / (2 * eps));
  }
  return out;
}

function differences(model: RefModel, p: Pair64) {
  const clean = edgeForward64(model, p.clean).outs;
  const corr = edgeForward64(model, p.corrupted).outs;
  const delta = new Map([...clean].map(([k, a]) => [k, corr.get(k)!.map((x, i) => x - a[i])]));
  return { clean, corr, delta };
}

/** EAP (attribute.py get_scores_eap): mean over pairs of Σ (a_corr − a_clean) · ∂M/∂x_b on the clean run */
export function eapScores64(model: RefModel, g: EdgeGraph64, pairs: Pair64[], eps = 1e-3): Map<string, number> {
  const out = new Map<string, number>(g.edges.map((e) => [e.name, 0]));
  for (const p of pairs) {
    const s = linearScores64(model, g, p, differences(model, p).delta, undefined, eps);
    for (const [k, v] of s) out.set(k, out.get(k)! + v / pairs.length);
  }
  return out;
}

/**
 * EAP-IG-inputs (attribute.py get_scores_eap_ig at main): the gradient averaged over m runs with
 * hook_embed = e_corr + (k/m)(e_clean − e_corr), k = 0 … m − 1; Δ from the real runs.
 */
export function eapIgInputsScores64(
  model: RefModel,
  g: EdgeGraph64,
  pairs: Pair64[],
  m: number,
  eps = 1e-3,
): Map<string, number> {
  const out = new Map<string, number>(g.edges.map((e) => [e.name, 0]));
  for (const p of pairs) {
    const { clean, corr, delta } = differences(model, p);
    const ec = clean.get('input')!;
    const ek = corr.get('input')!;
    for (let k = 0; k < m; k++) {
      const embed = ek.map((x, i) => x + (k / m) * (ec[i] - x));
      const s = linearScores64(model, g, p, delta, embed, eps);
      for (const [name, v] of s) out.set(name, out.get(name)! + v / (pairs.length * m));
    }
  }
  return out;
}

/** prune (graph.py): drop nodes without an in-circuit outgoing and incoming edge and edges whose ends are gone, to a fixpoint */
export function prune64(g: EdgeGraph64, circuit: Set<string>): Set<string> {
  const c = new Set(circuit);
  for (;;) {
    const outgoing = new Set<string>();
    const incoming = new Set<string>(['input']);
    for (const e of g.edges)
      if (c.has(e.name)) {
        outgoing.add(e.parent);
        incoming.add(e.child);
      }
    const alive = (n: string) => n === 'logits' || (outgoing.has(n) && incoming.has(n));
    let changed = false;
    for (const e of g.edges)
      if (c.has(e.name) && !(alive(e.parent) && alive(e.child))) {
        c.delete(e.name);
        changed = true;
      }
    if (!changed) return c;
  }
}

export const MIB_PCTS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1];

export interface Faithfulness64 {
  cpr: number;
  cmd: number;
  curve: { pct: number; n: number; nAfterPrune: number; metric: number; faithfulness: number }[];
}

/**
 * MIB's evaluate_area_under_curve for one ranking: top-n edges by score (signed: highest first;
 * absolute: by |score|) for n = int(pct · E), pruned, each evaluated as the dataset mean of M;
 * f = (M(C) − M(empty)) / (M(full) − M(empty)); trapezoids of f (CPR) and |1 − f| (CMD) over pct.
 * `scores` are ranked as given: pass −ΔM to rank MIB's signed (loss-convention) way.
 */
export function faithfulness64(
  model: RefModel,
  g: EdgeGraph64,
  pairs: Pair64[],
  rankScore: (edge: string) => number,
): Faithfulness64 & { mFull: number; mEmpty: number } {
  const E = g.edges.length;
  const mFull = mean(pairs.map((p) => metric64(edgeForward64(model, p.clean).last, p)));
  const mEmpty = mean(pairs.map((p) => metric64(edgeForward64(model, p.corrupted).last, p)));
  const order = g.edges.map((e, i) => ({ e: e.name, s: rankScore(e.name), i })).sort((a, b) => b.s - a.s || a.i - b.i);
  const curve = MIB_PCTS.map((pct) => {
    const n = Math.floor(pct * E);
    const c = prune64(g, new Set(order.slice(0, n).map((x) => x.e)));
    const metric = mean(pairs.map((p) => circuitMetric64(model, g, p, (e) => c.has(e))));
    return { pct, n, nAfterPrune: c.size, metric, faithfulness: (metric - mEmpty) / (mFull - mEmpty) };
  });
  let cpr = 0;
  let cmd = 0;
  for (let i = 0; i + 1 < curve.length; i++) {
    const dx = curve[i + 1].pct - curve[i].pct;
    cpr += (dx * (curve[i].faithfulness + curve[i + 1].faithfulness)) / 2;
    cmd += (dx * (Math.abs(1 - curve[i].faithfulness) + Math.abs(1 - curve[i + 1].faithfulness))) / 2;
  }
  return { cpr, cmd, curve, mFull, mEmpty };
}
