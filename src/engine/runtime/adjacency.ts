/**
 * An attribution graph's adjacency on the device (WebGPU): the rows of the frozen backward graph
 * assembled there, and circuit-tracer's pruning arithmetic (graph.py normalize_matrix,
 * compute_influence, prune_graph's edge scores and find_threshold) done there in float32, as
 * circuit-tracer does it on its GPU. The float64 reference of the same arithmetic, and the path
 * every other backend takes, is ops/lib/attribution-graph.ts; tests/engine-transfers.test.ts
 * checks the two agree.
 *
 * The adjacency is held as its nonzero rows R [nR, S]: the active features' rows (index order),
 * then the logits' (all features selected, so the columns are the S sources; the error, token and
 * logit rows and the logit columns are zero). Row r is node r (a feature) for r < nAct, else
 * logit node S + r − nAct.
 */
import { OnnxGraph } from '../graph/onnx-builder';

/** the shapes every graph here is built for (one attribution graph) */
export interface AdjacencyShape {
  L: number;
  T: number;
  /** active features */
  nAct: number;
  nLog: number;
}

const sources = (s: AdjacencyShape) => s.nAct + s.L * s.T + s.T;

/**
 * One batch's rows [B, S] from the frozen backward graph's readouts: emb [B, T], err [B, L, T],
 * dec_m [T, B, P_m] (graph/replacement.ts); `slots` [J, nAct]: for each feature its up to J
 * flat indices into the decoder readouts (every m's [T, P_m], in m order) whose sum is its
 * column, the rest pointing at a zero column (index Σ T·P_m).
 */
export function rowsGraph(s: AdjacencyShape, slots: number[], J: number): Uint8Array {
  const g = new OnnxGraph(() => '');
  const emb = g.input('emb', 'float', ['B', s.T]);
  const err = g.input('err', 'float', ['B', s.L, s.T]);
  const flat = (x: string) => g.o('Reshape', [x, g.constI([0, -1])]);
  const parts = Array.from({ length: s.L }, (_, m) =>
    flat(g.o('Transpose', [g.input(`dec_${m}`, 'float', [s.T, 'B', `P${m}`])], { perm: [1, 0, 2] })),
  );
  const zero = g.o('Mul', [g.o('Slice', [emb, g.constI([0]), g.constI([1]), g.constI([1])]), g.constF([0], [])]);
  const dec = g.concat([...parts, zero], 1);
  const feat = g.o('ReduceSum', [g.o('Gather', [dec, g.constI(slots, [J, s.nAct])], { axis: 1 }), g.constI([1])], {
    keepdims: 0,
  });
  g.rename(g.concat([feat, flat(err), emb], 1), 'rows');
  g.output('rows');
  return g.encode();
}

/** Σ_{k≥1} v·Âᵏ over the sources, v on the rows: unrolled L + 2 times (the last term must vanish) */
function influenceOf(g: OnnxGraph, s: AdjacencyShape, ahat: string, w: string): { sum: string; last: string } {
  const zeros = g.constF(new Array(s.nLog).fill(0), [1, s.nLog]);
  let v = w;
  let sum = '';
  let last = '';
  // a path feeds at most one logit hop and L feature hops (each to a lower layer), then ends at a
  // token or error: the (L + 2)-th term is zero in exact arithmetic, and in float32 (zeros stay zero)
  for (let k = 0; k < s.L + 2; k++) {
    const u = g.o('MatMul', [v, ahat]); // [1, S]
    if (k === s.L + 1) last = g.o('ReduceSum', [g.o('Abs', [u]), g.constI([0, 1])], { keepdims: 0 });
    else {
      sum = sum ? g.o('Add', [sum, u]) : u;
      v = g.o('Concat', [g.o('Slice', [u, g.constI([0]), g.constI([s.nAct]), g.constI([1])]), zeros], { axis: 1 });
    }
  }
  return { sum, last };
}

/** |x| / max(Σ_row |x|, 1e-10) (normalize_matrix) */
function normalised(g: OnnxGraph, abs: string): string {
  const sums = g.o('Max', [g.o('ReduceSum', [abs, g.constI([1])], { keepdims: 1 }), g.constF([1e-10], [])]);
  return g.o('Div', [abs, sums]);
}

/**
 * inputs r0… (each batch's rows [B_i, S], features then logits), w [1, nR] (the logit rows'
 * probabilities); outputs R [nR, S] (kept on the device), influence [1, S] (compute_influence over
 * the unpruned graph), last [] (the term past the bound: 0), errors [nR] (each row's Â mass on
 * the error columns: compute_graph_scores' completeness).
 */
export function influenceGraph(s: AdjacencyShape, batches: number): Uint8Array {
  const g = new OnnxGraph(() => '');
  const S = sources(s);
  const rows = Array.from({ length: batches }, (_, i) => g.input(`r${i}`, 'float', [`b${i}`, S]));
  const R = g.rename(g.concat(rows, 0), 'R');
  const ahat = normalised(g, g.o('Abs', [R]));
  const { sum, last } = influenceOf(g, s, ahat, g.input('w', 'float', [1, s.nAct + s.nLog]));
  g.rename(sum, 'influence');
  g.rename(last, 'last');
  const errCols = g.o('Slice', [ahat, g.constI([s.nAct]), g.constI([s.nAct + s.L * s.T]), g.constI([1])]);
  g.rename(g.o('ReduceSum', [errCols, g.constI([1])], { keepdims: 0 }), 'errors');
  for (const n of ['R', 'influence', 'last', 'errors']) g.output(n);
  return g.encode();
}

/**
 * prune_graph's edge scores and their threshold: inputs R [nR, S] (device), w [1, nR], mask [1, S]
 * (the kept sources: features by node influence, errors, tokens); the pruned matrix zeroes the
 * dropped features' rows and columns; scores = Â'[r, s]·(I'[r] + w[r]), sorted descending (TopK
 * over all of them), find_threshold's cumulative fraction in float32 (cumsum / sum, the first
 * index at or above `tau`, a zero past the rows' entries: there are always zero rows). Outputs
 * order [nR·S] (flat indices by score, kept on the device), threshold [1], kept [1] (int64: the
 * scores ≥ threshold, the first `kept` of order), last [] (0, as in influenceGraph).
 */
export function edgeScoreGraph(s: AdjacencyShape, tau: number): Uint8Array {
  const g = new OnnxGraph(() => '');
  const S = sources(s);
  const nR = s.nAct + s.nLog;
  const R = g.input('R', 'float', [nR, S]);
  const w = g.input('w', 'float', [1, nR]);
  const mask = g.input('mask', 'float', [1, S]);
  const ones = g.constF(new Array(s.nLog).fill(1), [1, s.nLog]);
  const rowMask = g.o('Concat', [g.o('Slice', [mask, g.constI([0]), g.constI([s.nAct]), g.constI([1])]), ones], {
    axis: 1,
  });
  const abs = g.o('Mul', [g.o('Mul', [g.o('Abs', [R]), mask]), g.o('Transpose', [rowMask], { perm: [1, 0] })]);
  const ahat = normalised(g, abs);
  const { sum, last } = influenceOf(g, s, ahat, w);
  g.rename(last, 'last');
  const zeros = g.constF(new Array(s.nLog).fill(0), [1, s.nLog]);
  const onRows = g.o('Concat', [g.o('Slice', [sum, g.constI([0]), g.constI([s.nAct]), g.constI([1])]), zeros], {
    axis: 1,
  });
  const weight = g.o('Transpose', [g.o('Add', [onRows, w])], { perm: [1, 0] }); // [nR, 1]
  const scores = g.o('Reshape', [g.o('Mul', [ahat, weight]), g.constI([-1])]);
  const [sorted, order] = g.op('TopK', [scores, g.constI([nR * S])], { axis: 0, largest: 1, sorted: 1 }, 2);
  g.rename(order, 'order');
  const cum = g.o('Div', [g.o('CumSum', [sorted, g.constI([0], [])]), g.o('ReduceSum', [scores], { keepdims: 0 })]);
  const first = (cond: string) =>
    g.o('ArgMax', [g.o('Concat', [g.o('Cast', [cond], { to: 1 }), g.constF([1])], { axis: 0 })], {
      axis: 0,
      keepdims: 1,
    });
  // torch.searchsorted(cum, τ): the first index with cum ≥ τ; past the end a zero score
  const at = first(g.o('GreaterOrEqual', [cum, g.constF([tau], [])]));
  const thr = g.rename(
    g.o('Gather', [g.o('Concat', [sorted, g.constF([0])], { axis: 0 }), at], { axis: 0 }),
    'threshold',
  );
  g.rename(first(g.o('Less', [sorted, thr])), 'kept');
  g.output('order', 'int64');
  g.output('threshold');
  g.output('kept', 'int64');
  g.output('last');
  return g.encode();
}

/** inputs order (int64, device), R (device), k (int64 [1]): the first k flat indices and A at them */
export function keptEdgesGraph(): Uint8Array {
  const g = new OnnxGraph(() => '');
  const idx = g.rename(
    g.o('Slice', [g.input('order', 'int64', ['n']), g.constI([0]), g.input('k', 'int64', [1])]),
    'index',
  );
  const R = g.o('Reshape', [g.input('R', 'float', ['r', 's']), g.constI([-1])]);
  g.rename(g.o('Gather', [R, idx], { axis: 0 }), 'weight');
  g.output('index', 'int64');
  g.output('weight');
  return g.encode();
}

/** input x, output y = x: a value on the device read back whole */
export function readGraph(): Uint8Array {
  const g = new OnnxGraph(() => '');
  g.rename(g.o('Identity', [g.input('x', 'float', ['r', 's'])]), 'y');
  g.output('y');
  return g.encode();
}

/**
 * compute_partial_influences (graph.py) over the rows so far: inputs r0… (each batch's rows
 * [B_i, S], in the order computed); `rowNode` each row's node (a feature's index, or S + i for
 * logit i); |rows| normalised with the row sums clamped at 1e-8; the logits' probabilities `w`
 * pushed through them, unrolled L + 2 times as in influenceGraph. Outputs influence [1, S], last [].
 */
export function partialGraph(s: AdjacencyShape, batches: number, rowNode: number[], w: number[]): Uint8Array {
  const g = new OnnxGraph(() => '');
  const S = sources(s);
  const rows = g.concat(
    Array.from({ length: batches }, (_, i) => g.input(`r${i}`, 'float', [`b${i}`, S])),
    0,
  );
  const abs = g.o('Abs', [rows]);
  const sums = g.o('Max', [g.o('ReduceSum', [abs, g.constI([1])], { keepdims: 1 }), g.constF([1e-8], [])]);
  const ahat = g.o('Div', [abs, sums]);
  const at = g.constI(rowNode);
  const zeros = g.constF(new Array(s.nLog).fill(0), [1, s.nLog]);
  let prod = g.constF(w, [1, S + s.nLog]);
  let sum = '';
  for (let k = 0; k < s.L + 2; k++) {
    const u = g.o('MatMul', [g.o('Gather', [prod, at], { axis: 1 }), ahat]);
    if (k === s.L + 1) g.rename(g.o('ReduceSum', [g.o('Abs', [u]), g.constI([0, 1])], { keepdims: 0 }), 'last');
    else {
      sum = sum ? g.o('Add', [sum, u]) : u;
      prod = g.o('Concat', [u, zeros], { axis: 1 });
    }
  }
  g.rename(sum, 'influence');
  g.output('influence');
  g.output('last');
  return g.encode();
}

/** inputs r0… (rows in the order computed): R [rows.length, cols.length] = those rows, in that order, at those columns */
export function selectGraph(batches: number, rows: number[], cols: number[]): Uint8Array {
  const g = new OnnxGraph(() => '');
  const all = g.concat(
    Array.from({ length: batches }, (_, i) => g.input(`r${i}`, 'float', [`b${i}`, 's'])),
    0,
  );
  const picked = g.o('Gather', [all, g.constI(rows)], { axis: 0 });
  g.rename(g.o('Gather', [picked, g.constI(cols)], { axis: 1 }), 'R');
  g.output('R');
  return g.encode();
}
