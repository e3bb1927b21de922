/**
 * The edge-patching variant of the model graph: every node input is the residual stream of this
 * run plus, for each upstream node u, a weighted correction, so that a circuit (a set of edges,
 * edges.ts) is data fed to one session run:
 *
 *   x_b = resid_b + Σ_{u < prevIndex(b)} w[u, b] · d_u,    d_u = src_u − κ · a_u
 *
 * a_u is u's output in THIS run (the embedding, a head's z_h·W_O[h], an MLP's output), resid_b
 * the residual stream b reads (which carries this run's a_u), src a fed tensor of upstream
 * outputs and κ a fed scalar. With κ = 1 and src = the corrupted run's outputs, w[u, b] = 1 makes
 * edge u → b deliver the corrupted value of u and w = 0 this run's: a circuit is w = 1 − in-circuit,
 * one batch row per circuit or example (EAP-IG evaluate.py's input construction, as data). With
 * κ = 0, d_u = src_u is a fixed difference: w = 0 runs the clean model and ∂M/∂w[u,b] =
 * Σ_{t,d} src_u · ∂M/∂x_b is the edge's attribution (EAP with src = corrupted − clean).
 *
 * Heads read their own q, k and v inputs [B, 3H, T, D] (ln1 per input, then that head's W_Q, W_K
 * or W_V; grouped-query k/v weights are repeated per query head), so each is patched apart; a
 * mixture-of-experts layer's experts read their own <in> and <router> inputs (edgeMoe).
 *
 * Inputs besides the plain graph's (no KV cache):
 *   edge::w     float [WB, Nf, Nb]     per-edge weights (WB = 1 broadcasts over the batch; B for gradients)
 *   edge::src   float [SB, Nf, TS, DS] upstream values (TS, DS may be 1: broadcast)
 *   edge::self  float [1]              κ
 *   edge::gate  float [GB, Nf]         gradient variant only: s_u scales the gradient through a_u
 *                                      (its value is kept: a_u' = stop(a_u) + s_u (a_u − stop(a_u)));
 *                                      s = 0 makes u's output a constant, as EAP-IG-activations does
 * Outputs: logits [B, P', V]; the forward variant also edge::out [B, Nf, T, D] (every a_u); the
 * gradient variant grad:edge::w [B, Nf, Nb] (the differences d are constants to the backward pass)
 * and edge::grad_sum [1, Nf, Nb], its sum over the batch.
 */
import { LoupeError } from '../errors';
import {
  attentionOf,
  type ModelSpec,
  type LayerSpec,
  type LinearRef,
  type MoeSpec,
  type NormSpec,
  type QKVSpec,
} from '../spec';
import type { TensorEntry } from '../safetensors-types';
import { ModelGraph, type BuiltGraph, type GraphPlan } from './build-model';
import { addModelBackward } from './backward-model';
import { gradName } from './backward';
import { edgeLayout, forwardHead, forwardMlp, backwardHead, backwardMlp, type EdgeLayout } from '../edges';

export const EDGE_W = 'edge::w';
export const EDGE_SRC = 'edge::src';
export const EDGE_SELF = 'edge::self';
export const EDGE_GATE = 'edge::gate';
export const EDGE_OUT = 'edge::out';
export const EDGE_GRAD_SUM = 'edge::grad_sum';

export interface EdgePlan {
  /** append the backward pass: seed logits::grad, output grad:edge::w */
  grad: boolean;
  weights: GraphPlan['weights'];
  vocabRows?: number;
  fused?: GraphPlan['fused'];
}

/** the edge layout of a model description */
export function edgeLayoutOf(spec: ModelSpec): EdgeLayout {
  const moe = spec.layers[0].moe;
  return edgeLayout(
    spec.nLayers,
    spec.nHeads,
    spec.layers.some((l) => l.parallel),
    moe ? { experts: moe.experts.length, shared: !!moe.shared } : undefined,
  );
}

/** why post-norm blocks have no edge graph (edge_attribution refuses them before reading its dataset) */
export const POST_NORM_GAP =
  "post-norm blocks (Gemma 2, 3 and 4, OLMo 2): the heads' summed output passes through the layer's " +
  "post-attention norm before the residual stream, so no head's output z_h·W_O[h] is what the stream carries of it";
export const EDGE_GAP_HINT =
  'Use head- and neuron-level methods on its hooks (attribution_patching, patch, ablate, circuit), which cover this model.';

/**
 * What the edge graph does not model, each as a reason (empty: it models the whole block). The graph
 * needs every head and MLP to write its output straight into the residual stream (a node's output
 * is what the stream carries of it) and every head to read its own q/k/v copy of that stream through
 * weights of the model's one head shape (headWeights); each feature below breaks one of those.
 */
export function edgeGaps(spec: ModelSpec): string[] {
  const L = spec.layers;
  const at = (f: (l: LayerSpec) => unknown) => L.flatMap((l, i) => (f(l) ? [i] : []));
  const list = (ls: number[]) =>
    ls.length > 4 ? `${ls.slice(0, 4).join(', ')}, … (${ls.length} layers)` : ls.join(', ');
  const out: string[] = [];
  const post = at((l) => l.postAttnNorm || l.postMlpNorm);
  if (post.length) out.push(POST_NORM_GAP);
  const shape = at(
    (l) =>
      l.attn && ((l.attn.dHead ?? spec.dHead) !== spec.dHead || (l.attn.nKvHeads ?? spec.nKvHeads) !== spec.nKvHeads),
  );
  if (shape.length)
    out.push(
      `layers ${list(shape)} with another head width or number of key/value heads than the model's ` +
        `(${spec.dHead} wide, ${spec.nKvHeads} KV heads): each head's q/k/v weights are built at one width`,
    );
  const shared = at((l) => l.attn?.kvFrom !== undefined);
  if (shared.length)
    out.push(`layers ${list(shared)} attend with an earlier layer's keys and values: their heads have no k/v input`);
  if (at((l) => l.attn?.vNorm).length)
    out.push("v normalised per head (v_norm), which the edge graph's heads do not apply");
  if (at((l) => l.perLayer).length) out.push('per-layer inputs added to the stream after each block (not a node)');
  if (at((l) => l.scalar).length) out.push("each block's output scaled by its layer_scalar");
  if (at((l) => l.moe?.beside).length) out.push('a dense MLP beside the experts');
  if (new Set(L.map((l) => l.parallel)).size > 1) out.push('some blocks parallel and some not');
  return out;
}

/** UNSUPPORTED_ARCHITECTURE naming every gap of edgeGaps, where there is one */
export function refuseEdgeGaps(spec: ModelSpec, what: string): void {
  const gaps = edgeGaps(spec);
  if (gaps.length)
    throw new LoupeError(
      'UNSUPPORTED_ARCHITECTURE',
      `${what} does not model this ${spec.family} model's ${gaps.join('; ')}.`,
      EDGE_GAP_HINT,
      { family: spec.family, gaps },
    );
}

class EdgeModelGraph extends ModelGraph {
  private readonly layout: EdgeLayout;
  private readonly stops: string[] = [];
  private w = '';
  private src = '';
  private kappa = '';
  private gate = '';

  constructor(
    spec: ModelSpec,
    tensors: Map<string, TensorEntry>,
    private readonly edge: EdgePlan,
  ) {
    super(
      spec,
      tensors,
      {
        hooks: false,
        withResult: false,
        weights: edge.weights,
        vocabRows: edge.vocabRows,
        fused: edge.fused,
        ...(edge.grad ? { grad: { hooks: [] } } : {}),
      },
      (f) => f,
    );
    this.layout = edgeLayoutOf(spec);
    refuseEdgeGaps(spec, 'Edge patching');
  }

  /** d_u for a group of upstream nodes [first, first + n): src's slice − κ · a (a [B, n, T, D]); a constant to the backward pass */
  private difference(a: string, first: number, n: number): string {
    const { g } = this;
    const s = g.o('Slice', [this.src, g.constI([first]), g.constI([first + n]), g.constI([1])]);
    const d = g.o('Sub', [s, g.o('Mul', [a, this.kappa])]);
    this.stops.push(d);
    return d;
  }

  /** Σ_u w[u, c] d_u for the first n upstream nodes and downstream inputs [c0, c1): [B, c1 − c0, T, D] */
  private mix(diffs: string[], n: number, c0: number, c1: number): string {
    const { g, D } = this;
    const d = g.concat(diffs, 1); // [B, n, T, D]
    const w = g.o('Slice', [this.w, g.constI([0, c0]), g.constI([n, c1]), g.constI([1, 2])]); // [WB, n, c]
    const wt = g.o('Transpose', [w], { perm: [0, 2, 1] }); // [WB, c, n]
    const y = g.o('MatMul', [wt, g.o('Reshape', [d, g.constI([0, n, -1])])]); // `b c n, b n (t d) -> b c (t d)`
    return g.o('Reshape', [y, g.constI([0, c1 - c0, -1, D])]);
  }

  /** a node group's output as the rest of the graph uses it: gated for the gradient (see the header); gate columns [first, first + n) */
  private gated(a: string, first: number, n: number, dims: number[]): string {
    if (!this.edge.grad) return a;
    const { g } = this;
    const fixed = g.o('Identity', [a]);
    this.stops.push(fixed);
    const s = g.o('Reshape', [
      g.o('Slice', [this.gate, g.constI([first]), g.constI([first + n]), g.constI([1])]),
      g.constI(dims),
    ]);
    return g.o('Add', [fixed, g.o('Mul', [s, g.o('Sub', [a, fixed])])]);
  }

  /** per-head weights [H, D, Dh] and biases [H, 1, Dh] of q, k, v (grouped k/v repeated per query head) */
  private headWeights(layer: LayerSpec, after: string): { w: string; b?: string }[] {
    const { g, D, H, Hkv, Dh } = this;
    const qkv = layer.attn!.qkv; // edgeBlock checked the layer has attention
    const split3 = (t: string) =>
      g.op('Split', [t, g.constI([1, 1, 1])], { axis: 0 }, 3).map((p) => g.o('Squeeze', [p, g.constI([0])]));
    if (qkv.kind === 'gpt2_fused') {
      // Conv1D [D, 3D], columns `(three h dh)` → `three h d dh`
      const w = g.o('Transpose', [g.o('Reshape', [this.W(qkv.qkv.w, after), g.constI([D, 3, H, Dh])])], {
        perm: [1, 2, 0, 3],
      });
      const bs = qkv.qkv.b ? split3(g.o('Reshape', [this.W(qkv.qkv.b), g.constI([3, H, 1, Dh])])) : [];
      return split3(w).map((wi, i) => ({ w: wi, b: bs[i] }));
    }
    if (qkv.kind === 'neox_fused') {
      // Linear [3D, D], rows `(h three dh)` → `three h d dh`
      const w = g.o('Transpose', [g.o('Reshape', [this.W(qkv.qkv.w, after), g.constI([H, 3, Dh, D])])], {
        perm: [1, 0, 3, 2],
      });
      const bs = qkv.qkv.b
        ? split3(
            g.o('Transpose', [g.o('Reshape', [this.W(qkv.qkv.b), g.constI([H, 3, 1, Dh])])], { perm: [1, 0, 2, 3] }),
          )
        : [];
      return split3(w).map((wi, i) => ({ w: wi, b: bs[i] }));
    }
    const one = (ref: LinearRef, heads: number) => {
      // a fused projection's rows (Phi-3's qkv_proj: q | k | v): that block of the out_in matrix and its bias
      const rows = (t: string) =>
        ref.rows
          ? g.o('Slice', [t, g.constI([ref.rows.start]), g.constI([ref.rows.start + ref.rows.count]), g.constI([0])])
          : t;
      // out_in `(h dh) d -> h d dh`, in_out `d (h dh) -> h d dh`
      let w =
        ref.layout === 'out_in'
          ? g.o('Transpose', [g.o('Reshape', [rows(this.W(ref.w, after)), g.constI([heads, Dh, D])])], {
              perm: [0, 2, 1],
            })
          : g.o('Transpose', [g.o('Reshape', [this.W(ref.w, after), g.constI([D, heads, Dh])])], { perm: [1, 0, 2] });
      let b = ref.b ? g.o('Reshape', [rows(this.W(ref.b)), g.constI([heads, 1, Dh])]) : undefined;
      if (heads !== H) {
        // ungrouped: query head h reads kv head floor(h / rep)
        const idx = g.constI(Array.from({ length: H }, (_, h) => Math.floor((h * heads) / H)));
        w = g.o('Gather', [w, idx], { axis: 0 });
        if (b) b = g.o('Gather', [b, idx], { axis: 0 });
      }
      return { w, b };
    };
    return [one(qkv.q, H), one(qkv.k, Hkv), one(qkv.v, Hkv)];
  }

  /**
   * q or k of every head's own copy x [B, H, T, D] under a norm over the whole projection: the copy's
   * full projection [B, H, T, n·Dh] normalised, then head h's slice (k: its kv head's) → [B, H, T, Dh]
   */
  private fullNormed(x: string, qkv: QKVSpec, which: 'q' | 'k', n: NormSpec): string {
    const { g, D, H, Hkv, Dh } = this;
    if (qkv.kind !== 'separate' || qkv[which].rows)
      throw new LoupeError('UNSUPPORTED_OP', 'Edge patching: a whole-projection q/k norm on a fused projection.');
    const ref = qkv[which];
    const heads = which === 'q' ? H : Hkv;
    const w = ref.layout === 'out_in' ? g.o('Transpose', [this.W(ref.w, x)], { perm: [1, 0] }) : this.W(ref.w, x);
    let y = g.o('MatMul', [x, w]); // [B, H, T, heads·Dh]
    if (ref.b) y = g.o('Add', [y, this.W(ref.b)]);
    y = g.o('Reshape', [this.norm(y, n), g.constI([0, 0, 0, heads, Dh])]);
    // copy h keeps head floor(h·heads/H): a 0/1 mask [H, 1, heads, 1], summed over the heads axis
    const mask = Array.from({ length: H * heads }, (_, i) =>
      i % heads === Math.floor((Math.floor(i / heads) * heads) / H) ? 1 : 0,
    );
    return g.o('ReduceSum', [g.o('Mul', [y, g.constF(mask, [H, 1, heads, 1])]), g.constI([3])], { keepdims: 0 });
  }

  /** one block: heads from their own inputs, then the MLP; returns the new residual stream */
  private edgeBlock(l: number, resid: string, diffs: string[]): string {
    const { g, D, H, Dh, layout } = this;
    const layer = this.spec.layers[l];
    const a = attentionOf(this.spec, l);
    if (a.outputGate)
      throw new LoupeError('UNSUPPORTED_OP', `Edge patching does not model layer ${l}'s gated attention output.`);
    const first = forwardHead(layout, l, 0);
    // q, k, v inputs of every head: [B, 3H, T, D]
    const xin = g.o('Add', [
      g.o('Unsqueeze', [resid, g.constI([1])]),
      this.mix(diffs, first, backwardHead(layout, l, 'q', 0), backwardHead(layout, l, 'q', 0) + 3 * H),
    ]);
    const xn = this.norm(xin, layer.ln1);
    const [xq, xk, xv] = g.op('Split', [xn, g.constI([H, H, H])], { axis: 1 }, 3); // each [B, H, T, D]
    const proj = (x: string, p: { w: string; b?: string }) => {
      const y = g.o('MatMul', [x, p.w]); // `b h t d, h d dh -> b h t dh`
      return p.b ? g.o('Add', [y, p.b]) : y;
    };
    const [pq, pk, pv] = this.headWeights(layer, xn);
    const toBTHD = (t: string) => g.o('Transpose', [t], { perm: [0, 2, 1, 3] });
    let q = proj(xq, pq);
    let k = proj(xk, pk);
    if (a.qkNormWidth === 'full') {
      // OLMo 2 / OLMoE normalise the whole projection: each head's copy computes every head's q (k),
      // normalises them together, and keeps its own head's slice (its kv head's for k)
      q = this.fullNormed(xq, layer.attn!.qkv, 'q', a.qNorm!);
      k = this.fullNormed(xk, layer.attn!.qkv, 'k', a.kNorm!);
    }
    const v = proj(xv, pv); // [B, H, T, Dh]
    if (a.qNorm && a.qkNormWidth !== 'full') q = this.norm(q, a.qNorm);
    if (a.kNorm && a.qkNormWidth !== 'full') k = this.norm(k, a.kNorm);
    const qT = this.rope(toBTHD(q)); // [B, T, H, Dh]
    const kH = this.spec.rotary ? toBTHD(this.rope(toBTHD(k))) : k; // [B, H, T, Dh]
    const mask = a.slidingWindow !== null ? this.maskLocal : this.mask;
    const z = this.attend(`blocks.${l}.attn`, qT, kH, v, mask, a.scale, a.softcap, a.sinks?.w); // [B, T, H, Dh]
    // per-head results z_h · W_O[h]: out_in `d (h dh) -> h dh d`, in_out `(h dh) d -> h dh d`
    const wo =
      a.o.layout === 'out_in'
        ? g.o('Transpose', [g.o('Reshape', [this.W(a.o.w, z), g.constI([D, H, Dh])])], { perm: [1, 2, 0] })
        : g.o('Reshape', [this.W(a.o.w, z), g.constI([H, Dh, D])]);
    const result = g.o('MatMul', [toBTHD(z), wo]); // [B, H, T, D]
    const resultG = this.gated(result, first, H, [0, H, 1, 1]);
    let attnOut = g.o('ReduceSum', [resultG, g.constI([1])], { keepdims: 0 });
    if (a.o.b) attnOut = g.o('Add', [attnOut, this.W(a.o.b)]);
    const heads = this.difference(result, first, H);
    this.outs.push(result);

    const mlpCol = backwardMlp(layout, l);
    const fm = forwardMlp(layout, l);
    // the MLP's inputs read the block's input (parallel) or resid_mid, which carries the heads
    const base = g.o('Add', [resid, attnOut]); // resid_mid
    if (!layer.parallel) diffs.push(heads);
    const readFrom = layer.parallel ? resid : base;
    const mixed = this.mix(diffs, layer.parallel ? first : fm, mlpCol, mlpCol + layout.nMlpIn);
    if (layer.parallel) diffs.push(heads);
    if (layer.moe) return g.o('Add', [base, this.edgeMoe(layer, layer.moe, readFrom, mixed, diffs, fm)]);
    const mlpIn = g.o('Add', [readFrom, g.o('Squeeze', [mixed, g.constI([1])])]);
    const mlpOut = this.mlp(l, layer, this.norm(mlpIn, layer.ln2));
    const m4 = g.o('Unsqueeze', [mlpOut, g.constI([1])]);
    diffs.push(this.difference(m4, fm, 1));
    this.outs.push(m4);
    return g.o('Add', [base, this.gated(mlpOut, fm, 1, [0, 1, 1])]);
  }

  /**
   * A mixture-of-experts MLP as nodes (edges.ts): expert e computes from its own input <in> and
   * is weighted by the router run on its own <router> input (its column of the dense routing
   * weights); the shared expert and its gate read one input. `mixed`: the inputs' corrections
   * [B, I, T, D]. Returns the MLP's output [B, T, D].
   */
  private edgeMoe(layer: LayerSpec, m: MoeSpec, readFrom: string, mixed: string, diffs: string[], fm: number): string {
    const { g, layout } = this;
    const E = layout.experts;
    const F = layout.nMlp;
    const xin = g.o('Add', [g.o('Unsqueeze', [readFrom, g.constI([1])]), mixed]);
    const xn = this.norm(xin, layer.ln2); // [B, I, T, D]
    const copy = (j: number) =>
      g.o('Squeeze', [g.o('Slice', [xn, g.constI([j]), g.constI([j + 1]), g.constI([1])]), g.constI([1])]);
    const ys = m.experts.map((ex, e) => {
      const w = g.o('Slice', [this.routing(m, copy(E + e)), g.constI([e]), g.constI([e + 1]), g.constI([-1])]);
      return g.o('Mul', [this.expertMlp(m, ex, m.dExpert, copy(e)), w]); // [B, T, D]
    });
    if (m.shared) ys.push(this.sharedExpert(m, copy(2 * E)));
    const y = g.concat(
      ys.map((t) => g.o('Unsqueeze', [t, g.constI([1])])),
      1,
    ); // [B, F, T, D]
    diffs.push(this.difference(y, fm, F));
    this.outs.push(y);
    return g.o('ReduceSum', [this.gated(y, fm, F, [0, F, 1, 1]), g.constI([1])], { keepdims: 0 });
  }

  private readonly outs: string[] = [];

  override build(): BuiltGraph {
    const { g, spec, layout } = this;
    const { nForward: Nf, nBackward: Nb } = layout;
    this.w = g.input(EDGE_W, 'float', ['WB', Nf, Nb]);
    this.src = g.input(EDGE_SRC, 'float', ['SB', Nf, 'TS', 'DS']);
    this.kappa = g.input(EDGE_SELF, 'float', [1]);
    if (this.edge.grad) this.gate = g.input(EDGE_GATE, 'float', ['GB', Nf]);
    const [x, posB] = this.embed();
    const x4 = g.o('Unsqueeze', [x, g.constI([1])]);
    const diffs = [this.difference(x4, 0, 1)];
    this.outs.push(x4);
    let resid = posB ? g.o('Add', [x, posB]) : x;
    for (let l = 0; l < spec.nLayers; l++) resid = this.edgeBlock(l, resid, diffs);
    const xLogits = g.o('Add', [resid, g.o('Squeeze', [this.mix(diffs, Nf, Nb - 1, Nb), g.constI([1])])]);
    this.logits(this.norm(xLogits, spec.lnFinal));
    if (this.edge.grad) {
      addModelBackward(g, spec, [EDGE_W], {
        stop: this.stops,
        inputDims: (name, ev, sym) =>
          name === EDGE_W
            ? [sym.B, Nf, Nb]
            : name === EDGE_SRC
              ? [sym.B, Nf, sym.T, this.D]
              : name === EDGE_GATE
                ? [sym.B, Nf]
                : undefined,
      });
      // the gradient summed over the batch's rows, for runs whose rows are one pair's (EAP-IG)
      g.rename(g.o('ReduceSum', [gradName(EDGE_W), g.constI([0])], { keepdims: 1 }), EDGE_GRAD_SUM);
      g.output(EDGE_GRAD_SUM);
    } else {
      g.identity(g.concat(this.outs, 1), EDGE_OUT);
      g.output(EDGE_OUT);
    }
    return this.built();
  }
}

export function buildEdgeGraph(spec: ModelSpec, tensors: Map<string, TensorEntry>, plan: EdgePlan): BuiltGraph {
  return new EdgeModelGraph(spec, tensors, plan).build();
}
