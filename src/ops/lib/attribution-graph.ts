/**
 * Attribution graphs after the engine's rows (engine/replacement.ts): circuit-tracer's node
 * selection, pruning, scores and graph JSON (decoderesearch/circuit-tracer 4bb8c0e):
 *
 *  - logit nodes (targets.py:185-217): the top `max_n_logits` by probability until their
 *    cumulative probability reaches `desired_logit_prob`; weights = the probabilities;
 *  - rows (attribute_transformerlens.py Phase 3–4): the logit rows, then feature rows, all of
 *    them in index order, or (max_feature_nodes) chosen by `compute_partial_influences` over the
 *    rows so far, re-ranked every update_interval batches of batch_size;
 *  - the adjacency over [selected features, errors l·T + p, tokens, logits] (graph.py:46-64);
 *  - prune_graph (graph.py:234-308), compute_graph_scores (graph.py:311-358);
 *  - the JSON of create_graph_files.py and frontend/graph_models.py, field by field.
 *
 * The arithmetic is circuit-tracer's on the float32 adjacency, done in float64 (circuit-tracer
 * does it in float32): scores and cumulative influences may differ from its in the last float32
 * digits, and a node or edge within that distance of a threshold may fall the other way.
 * The adjacency is held as its nonzero rows only (feature and logit targets; error and token rows
 * are zero), each a Float32Array.
 */
import { LoupeError, throwIfAborted } from '../../engine/errors';

export interface Adjacency {
  /** nodes */
  N: number;
  /** row t of A[target, source], or null where the row is zero */
  rows: (Float32Array | null)[];
}

/** |A| as compressed rows (nonzeros only), for the influence sums: each pass touches only the edges that exist */
export interface SparseAbs {
  N: number;
  rowPtr: Int32Array;
  col: Int32Array;
  val: Float32Array;
}

export function sparseAbs(A: Adjacency): SparseAbs {
  let nnz = 0;
  for (const r of A.rows) if (r) for (let j = 0; j < r.length; j++) if (r[j] !== 0) nnz++;
  const rowPtr = new Int32Array(A.N + 1);
  const col = new Int32Array(nnz);
  const val = new Float32Array(nnz);
  let k = 0;
  A.rows.forEach((r, t) => {
    if (r)
      for (let j = 0; j < r.length; j++)
        if (r[j] !== 0) {
          col[k] = j;
          val[k++] = Math.abs(r[j]);
        }
    rowPtr[t + 1] = k;
  });
  return { N: A.N, rowPtr, col, val };
}

/** |A| row sums over the kept rows and columns, clamped at `clamp` (graph.py normalize_matrix: 1e-10) */
function rowSums(S: SparseAbs, clamp: number, keep?: Uint8Array): Float64Array {
  const s = new Float64Array(S.N);
  for (let t = 0; t < S.N; t++) {
    let acc = 0;
    if (!keep || keep[t])
      for (let k = S.rowPtr[t]; k < S.rowPtr[t + 1]; k++) if (!keep || keep[S.col[k]]) acc += S.val[k];
    s[t] = Math.max(acc, clamp);
  }
  return s;
}

/**
 * Σ_{k≥1} w Âᵏ with Â = |A| / rowsum (graph.py compute_influence: no identity term, iterated until
 * the term is exactly zero); rows and columns outside `keep` count as zero (prune_graph's pruned matrix).
 */
export function influence(S: SparseAbs, w: Float64Array, keep?: Uint8Array): Float64Array {
  const N = S.N;
  const sums = rowSums(S, 1e-10, keep);
  const step = (v: Float64Array) => {
    const out = new Float64Array(N);
    for (let t = 0; t < N; t++) {
      if (v[t] === 0 || (keep && !keep[t])) continue;
      const c = v[t] / sums[t];
      for (let k = S.rowPtr[t]; k < S.rowPtr[t + 1]; k++) {
        const j = S.col[k];
        if (!keep || keep[j]) out[j] += c * S.val[k];
      }
    }
    return out;
  };
  let cur = step(w);
  const inf = cur.slice();
  for (let it = 0; cur.some((x) => x !== 0); it++) {
    if (it >= 1000) throw new LoupeError('INTERNAL', 'The influence computation did not converge in 1000 iterations.');
    cur = step(cur);
    for (let j = 0; j < N; j++) inf[j] += cur[j];
  }
  return inf;
}

/** graph.py find_threshold: sort descending, the score at the first cumulative fraction ≥ τ (zeros trail the sort) */
export function findThreshold(nonzero: Float64Array, total: number, tau: number): number {
  const s = nonzero.slice().sort();
  let sum = 0;
  for (let i = 0; i < s.length; i++) sum += s[i];
  let c = 0;
  for (let i = s.length - 1; i >= 0; i--) {
    c += s[i];
    if (c / sum >= tau) return s[i];
  }
  // past the nonzero scores: the zeros (torch.searchsorted over the whole sorted list), clamped to the last
  return s.length < total ? 0 : s[0];
}

/**
 * compute_partial_influences (graph.py:361-404): the influence of every node through the rows
 * computed so far (`rowNode[r]`: the node index of row r), |rows| normalised with clamp 1e-8.
 */
export function partialInfluences(rows: Float32Array[], rowNode: number[], N: number, logitP: number[]): Float64Array {
  const sums = rows.map((r) => {
    let s = 0;
    for (let j = 0; j < r.length; j++) s += Math.abs(r[j]);
    return Math.max(s, 1e-8);
  });
  const inf = new Float64Array(N);
  let prod = new Float64Array(N);
  logitP.forEach((p, i) => (prod[N - logitP.length + i] = p));
  for (let it = 0; it < 128; it++) {
    const next = new Float64Array(N);
    rows.forEach((r, k) => {
      const v = prod[rowNode[k]];
      if (v === 0) return;
      const c = v / sums[k];
      for (let j = 0; j < r.length; j++) next[j] += c * Math.abs(r[j]);
    });
    prod = next;
    if (!prod.some((x) => x !== 0)) return inf;
    for (let j = 0; j < N; j++) inf[j] += prod[j];
  }
  throw new LoupeError('INTERNAL', 'The partial influences did not converge in 128 iterations.');
}

/** edges as (target, source, A's weight), in row-major order (target, then source) */
export interface KeptEdges {
  target: Int32Array;
  source: Int32Array;
  weight: Float32Array;
}

export interface PruneResult {
  nodeMask: Uint8Array;
  /** the kept edges, in row-major order */
  edges: KeptEdges;
  cumulativeScores: Float64Array;
  nodeInfluence: Float64Array;
  /** the score thresholds the two cumulative fractions gave */
  thresholds: { node: number; edge: number };
}

/** prune_graph's node mask: influence ≥ its threshold; tokens and logits (the last nTok + nLog) always kept */
export function nodeMaskOf(
  nodeInfluence: ArrayLike<number>,
  nTok: number,
  nLog: number,
  nodeThreshold: number,
): { mask: Uint8Array; threshold: number } {
  const N = nodeInfluence.length;
  const nz = Float64Array.from(nodeInfluence).filter((x) => x !== 0);
  const threshold = findThreshold(nz, N, nodeThreshold);
  const mask = Uint8Array.from(nodeInfluence, (x) => (x >= threshold ? 1 : 0));
  for (let i = N - nLog - nTok; i < N; i++) mask[i] = 1;
  return { mask, threshold };
}

/**
 * prune_graph: node influence ≥ its 0.8-threshold (tokens and logits always kept); edge scores
 * Â'·(I' + w) over the pruned matrix ≥ its 0.98-threshold; then features and errors need a kept
 * outgoing edge and features a kept incoming one, to a fixpoint (finishPrune).
 */
export function pruneGraph(
  A: Adjacency,
  w: Float64Array,
  nFeat: number,
  nTok: number,
  nLog: number,
  nodeThreshold: number,
  edgeThreshold: number,
  signal?: AbortSignal,
): PruneResult & { sparse: SparseAbs } {
  const N = A.N;
  const S = sparseAbs(A);
  const nodeInfluence = influence(S, w);
  const { mask: nodeMask, threshold: nodeThr } = nodeMaskOf(nodeInfluence, nTok, nLog, nodeThreshold);
  throwIfAborted(signal);
  // edge scores on the matrix with dropped nodes' rows and columns zeroed
  const I2 = influence(S, w, nodeMask);
  for (let i = 0; i < N; i++) I2[i] += w[i];
  const sums = rowSums(S, 1e-10, nodeMask);
  // edge scores Â'[t, s]·I'[t] (float64, computed where they are needed rather than kept)
  const scale = A.rows.map((r, t) => (r && nodeMask[t] ? I2[t] / sums[t] : 0));
  let count = 0;
  A.rows.forEach((r, t) => {
    if (r && scale[t] !== 0) for (let j = 0; j < N; j++) if (nodeMask[j] && r[j] !== 0) count++;
  });
  const scores = new Float64Array(count);
  let k = 0;
  A.rows.forEach((r, t) => {
    if (r && scale[t] !== 0)
      for (let j = 0; j < N; j++) if (nodeMask[j] && r[j] !== 0) scores[k++] = Math.abs(r[j]) * scale[t];
  });
  const edgeThr = findThreshold(scores, N * N, edgeThreshold);
  throwIfAborted(signal);
  const t: number[] = [],
    s: number[] = [],
    wt: number[] = [];
  A.rows.forEach((r, i) => {
    if (edgeThr <= 0) {
      // every entry scores ≥ 0: every edge, zero ones too (as circuit-tracer's mask)
      for (let j = 0; j < N; j++) (t.push(i), s.push(j), wt.push(r ? r[j] : 0));
      return;
    }
    if (!r || scale[i] === 0) return;
    for (let j = 0; j < N; j++)
      if (nodeMask[j] && r[j] !== 0 && Math.abs(r[j]) * scale[i] >= edgeThr) (t.push(i), s.push(j), wt.push(r[j]));
  });
  const edges = { target: Int32Array.from(t), source: Int32Array.from(s), weight: Float32Array.from(wt) };
  return {
    sparse: S,
    ...finishPrune(nodeInfluence, nodeMask, edges, { node: nodeThr, edge: edgeThr }, nFeat, nTok, nLog),
  };
}

/**
 * The rest of prune_graph once the edges at or above the edge threshold are known (row-major):
 * features and errors without a kept outgoing edge, and features without a kept incoming one,
 * dropped, their edges with them, to a fixpoint; then the cumulative scores.
 */
export function finishPrune(
  nodeInfluence: Float64Array,
  nodeMask: Uint8Array,
  edges: KeptEdges,
  thresholds: { node: number; edge: number },
  nFeat: number,
  nTok: number,
  nLog: number,
): PruneResult {
  const N = nodeInfluence.length;
  const nE = edges.target.length;
  const alive = new Uint8Array(nE).fill(1);
  const featOrErr = N - nLog - nTok;
  const step = () => {
    const out = new Uint8Array(N),
      into = new Uint8Array(N);
    for (let k = 0; k < nE; k++)
      if (alive[k]) {
        out[edges.source[k]] = 1;
        into[edges.target[k]] = 1;
      }
    for (let j = 0; j < featOrErr; j++) if (!out[j]) nodeMask[j] = 0;
    for (let t = 0; t < nFeat; t++) if (nodeMask[t] && !into[t]) nodeMask[t] = 0;
  };
  let old = nodeMask.slice();
  step();
  while (nodeMask.some((m, i) => m !== old[i])) {
    old = nodeMask.slice();
    for (let k = 0; k < nE; k++) if (!nodeMask[edges.target[k]] || !nodeMask[edges.source[k]]) alive[k] = 0;
    step();
  }
  const keep = (a: Int32Array | Float32Array) => a.filter((_, k) => alive[k] === 1);
  const kept = {
    target: keep(edges.target) as Int32Array,
    source: keep(edges.source) as Int32Array,
    weight: keep(edges.weight) as Float32Array,
  };
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
  return { nodeMask, edges: kept, cumulativeScores, nodeInfluence, thresholds };
}

/** per node, Â's mass on the error columns [nFeat, nFeat + L·T) (compute_graph_scores) */
export function errorMass(S: SparseAbs, nFeat: number, L: number, T: number): Float64Array {
  const sums = rowSums(S, 1e-10);
  const out = new Float64Array(S.N);
  for (let n = 0; n < S.N; n++)
    for (let k = S.rowPtr[n]; k < S.rowPtr[n + 1]; k++)
      if (S.col[k] >= nFeat && S.col[k] < nFeat + L * T) out[n] += S.val[k] / sums[n];
  return out;
}

/**
 * compute_graph_scores on the unpruned graph, from its node influence I and each node's error
 * mass e: replacement = Σ I[tokens] / (Σ I[tokens] + Σ I[errors]);
 * completeness = Σ_n (1 − e_n)(I_n + w_n) / Σ_n (I_n + w_n).
 */
export function graphScores(
  I: ArrayLike<number>,
  w: Float64Array,
  errors: ArrayLike<number>,
  nFeat: number,
  L: number,
  T: number,
) {
  const errEnd = nFeat + L * T,
    tokEnd = errEnd + T;
  let tok = 0,
    err = 0;
  for (let i = errEnd; i < tokEnd; i++) tok += I[i];
  for (let i = nFeat; i < errEnd; i++) err += I[i];
  let num = 0,
    den = 0;
  for (let n = 0; n < w.length; n++) {
    num += (1 - errors[n]) * (I[n] + w[n]);
    den += I[n] + w[n];
  }
  return { replacement: tok / (tok + err), completeness: num / den };
}

// ------------------------------------------------------------------ the graph JSON

export interface GraphNode {
  node_id: string;
  feature: number;
  layer: string;
  ctx_idx: number;
  feature_type: 'cross layer transcoder' | 'mlp reconstruction error' | 'embedding' | 'logit';
  token_prob: number;
  is_target_logit: boolean;
  run_idx: number;
  reverse_ctx_idx: number;
  jsNodeId: string;
  clerp: string;
  influence: number | null;
  activation: number | null;
}

export interface GraphLink {
  source: string;
  target: string;
  weight: number;
}

export interface GraphJson {
  metadata: {
    slug: string;
    scan: string;
    transcoder_list: string[];
    prompt_tokens: string[];
    prompt: string;
    node_threshold: number | null;
    schema_version: number;
  };
  qParams: { pinnedIds: string[]; supernodes: string[][]; linkType: string; clickedId: string; sg_pos: string };
  nodes: GraphNode[];
  links: GraphLink[];
}

/** What a node of the unpruned graph is, in circuit-tracer's order. */
export type NodeKind =
  | { kind: 'feature'; layer: number; pos: number; feature: number; activation: number }
  | { kind: 'error'; layer: number; pos: number }
  | { kind: 'token'; pos: number; token: number }
  | { kind: 'logit'; token: number; text: string; prob: number; rank: number };

const f32 = Math.fround;

/** Python's f'{x:.3f}': round half to even where the double is exactly halfway (JS toFixed rounds those up) */
function fixed3(x: number): string {
  const s = x * 1000;
  const f = Math.floor(s);
  if (s - f === 0.5 && f / 1000 + 0.0005 === x) return ((f % 2 === 0 ? f : f + 1) / 1000).toFixed(3);
  return x.toFixed(3);
}

/** graph_models.py Node.feature_node / error_node / token_node / logit_node (fields in its order) */
export function graphNode(k: NodeKind, nLayers: number, T: number, influence: number | null): GraphNode {
  const node = (
    node_id: string,
    feature: number,
    layer: string,
    ctx_idx: number,
    feature_type: GraphNode['feature_type'],
    jsNodeId: string,
    extra: Partial<GraphNode> = {},
  ): GraphNode => ({
    node_id,
    feature,
    layer,
    ctx_idx,
    feature_type,
    token_prob: extra.token_prob ?? 0,
    is_target_logit: extra.is_target_logit ?? false,
    run_idx: 0,
    reverse_ctx_idx: 0,
    jsNodeId,
    clerp: extra.clerp ?? '',
    influence: extra.influence === undefined ? influence : extra.influence,
    activation: extra.activation ?? null,
  });
  switch (k.kind) {
    case 'feature': {
      const cantor = ((k.layer + k.feature) * (k.layer + k.feature + 1)) / 2 + k.feature;
      return node(
        `${k.layer}_${k.feature}_${k.pos}`,
        cantor,
        String(k.layer),
        k.pos,
        'cross layer transcoder',
        `${k.layer}_${k.feature}-0`,
        {
          activation: f32(k.activation),
        },
      );
    }
    case 'error':
      return node(
        `0_${k.layer}_${k.pos}`,
        -1,
        String(k.layer),
        k.pos,
        'mlp reconstruction error',
        `${k.layer}_${k.pos}-0`,
      );
    case 'token':
      return node(`E_${k.token}_${k.pos}`, k.pos, 'E', k.pos, 'embedding', `E_${k.token}-${k.pos}`);
    case 'logit': {
      const layer = String(nLayers + 1);
      const p = f32(k.prob);
      return node(`${layer}_${k.token}_${T - 1}`, k.token, layer, T - 1, 'logit', `L_${k.token}-${T - 1}`, {
        token_prob: p,
        is_target_logit: k.rank === 0,
        clerp: `Output "${k.text}" (p=${fixed3(p)})`,
        influence: null,
      });
    }
  }
}

/**
 * create_nodes + create_used_nodes_and_edges + build_model: the kept nodes in index order (only
 * those with a kept link, plus every embedding and logit node) and the kept links in row-major
 * order (target, then source), each weight the float32 A[target, source].
 */
export function graphJson(
  kinds: NodeKind[],
  pr: PruneResult,
  meta: {
    slug: string;
    scan: string;
    promptTokens: string[];
    prompt: string;
    nodeThreshold: number;
    nLayers: number;
    T: number;
  },
): { graph: GraphJson; linkNodes: [number, number][] } {
  const nodes = new Map<number, GraphNode>();
  kinds.forEach((k, i) => {
    if (pr.nodeMask[i])
      nodes.set(i, graphNode(k, meta.nLayers, meta.T, k.kind === 'logit' ? null : f32(pr.cumulativeScores[i])));
  });
  const links: GraphLink[] = [];
  const ends: [number, number][] = []; // node indices of each link: ids alone can be ambiguous
  const connected = new Set<number>();
  const { target, source, weight } = pr.edges;
  for (let k = 0; k < target.length; k++) {
    const t = target[k],
      s = source[k];
    const src = nodes.get(s),
      dst = nodes.get(t);
    if (!src || !dst) continue;
    links.push({ source: src.node_id, target: dst.node_id, weight: weight[k] });
    ends.push([s, t]);
    connected.add(s);
    connected.add(t);
  }
  // circuit-tracer keeps nodes whose id is on a used link; an id shared by a feature and an error keeps both
  const connectedIds = new Set([...connected].map((i) => nodes.get(i)!.node_id));
  const used = [...nodes.entries()].filter(
    ([, n]) => connectedIds.has(n.node_id) || n.feature_type === 'embedding' || n.feature_type === 'logit',
  );
  const position = new Map(used.map(([i], k) => [i, k]));
  return {
    graph: {
      metadata: {
        slug: meta.slug,
        scan: meta.scan,
        transcoder_list: [],
        prompt_tokens: meta.promptTokens,
        prompt: meta.prompt,
        node_threshold: meta.nodeThreshold,
        schema_version: 1,
      },
      qParams: { pinnedIds: [], supernodes: [], linkType: 'both', clickedId: '', sg_pos: '' },
      nodes: used.map(([, n]) => n),
      links,
    },
    linkNodes: ends.map(([s, t]) => [position.get(s)!, position.get(t)!]),
  };
}
