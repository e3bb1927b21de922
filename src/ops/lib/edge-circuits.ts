/**
 * Edge circuits in the EAP-IG library's terms (hannamw/EAP-IG src/eap/graph.py; MIB's
 * MIB_circuit_track/evaluation.py; /work/shared/specs/edge-circuits.md): the graph's nodes and
 * edges by name, in the library's order, over the engine's layout (engine/edges.ts); top-n
 * selection and pruning; MIB's faithfulness curve and its two areas; and the Graph.to_json
 * circuit format, written and read.
 *
 * Names: nodes `input`, `a{l}.h{h}`, `m{l}`, `logits`; edges `parent->child`, and
 * `parent->a{l}.h{h}<q|k|v>` into a head. Edge order is Graph.from_model's insertion order (per
 * layer: every earlier node into every head's q, k, v; then into the MLP; last into logits), the
 * order to_json writes. A mixture-of-experts layer's MLP is its experts (engine/edges.ts): nodes
 * `m{l}.e{e}` entered at `<in>` and `<router>`, and `m{l}.shared`, in that order.
 */
import { z } from 'zod';
import { LoupeError } from '../../engine/errors';
import type { ModelInfo } from '../../engine/api';
import {
  edgeLayout,
  forwardHead,
  forwardMlp,
  backwardHead,
  backwardMlp,
  backwardLogits,
  type EdgeLayout,
} from '../../engine/edges';

export interface EdgeDef {
  name: string;
  upstream: string;
  /** the node the edge enters (a head, an MLP, logits) */
  downstream: string;
  /** the downstream input: `a1.h2<q>`, `m0`, `logits` */
  input: string;
  /** the engine layout's forward (upstream) and backward (input) indices */
  f: number;
  b: number;
}

export interface EdgeGraph {
  layout: EdgeLayout;
  /** upstream node names by forward index */
  nodes: string[];
  edges: EdgeDef[];
  byName: Map<string, number>;
  /** for each downstream node (not input), its input indices (backward) */
  nodeInputs: Map<string, number[]>;
}

/** the graph's shape: ModelInfo's fields, or a document's graph_cfg (MIB's cfg plus n_experts, shared_expert) */
export interface EdgeShape {
  n_layers: number;
  n_heads: number;
  parallel_attn_mlp: boolean;
  /** mixture-of-experts models: experts per layer (each a node) and Qwen2-MoE's shared expert */
  n_experts?: number;
  shared_expert?: boolean;
}

/** the shape of a model's edge graph from its info */
export const edgeShapeOf = (
  info: Pick<ModelInfo, 'n_layers' | 'n_heads' | 'parallel_attn_mlp' | 'num_experts' | 'shared_expert'>,
): EdgeShape => ({
  n_layers: info.n_layers,
  n_heads: info.n_heads,
  parallel_attn_mlp: info.parallel_attn_mlp,
  ...(info.num_experts ? { n_experts: info.num_experts, shared_expert: !!info.shared_expert } : {}),
});

export function edgeGraphOf(info: EdgeShape): EdgeGraph {
  const L = info.n_layers;
  const H = info.n_heads;
  const E = info.n_experts ?? 0;
  const layout = edgeLayout(L, H, info.parallel_attn_mlp, E ? { experts: E, shared: !!info.shared_expert } : undefined);
  // a layer's MLP nodes and, per node, its inputs (name suffix, backward index)
  const mlpNodes = (l: number): { name: string; inputs: [string, number][] }[] =>
    E === 0
      ? [{ name: `m${l}`, inputs: [['', backwardMlp(layout, l)]] }]
      : [
          ...Array.from({ length: E }, (_, e) => ({
            name: `m${l}.e${e}`,
            inputs: [
              ['<in>', backwardMlp(layout, l, e)],
              ['<router>', backwardMlp(layout, l, E + e)],
            ] as [string, number][],
          })),
          ...(layout.shared
            ? [{ name: `m${l}.shared`, inputs: [['', backwardMlp(layout, l, 2 * E)]] as [string, number][] }]
            : []),
        ];
  const nodes: string[] = new Array(layout.nForward);
  nodes[0] = 'input';
  const fOf = new Map<string, number>([['input', 0]]);
  for (let l = 0; l < L; l++) {
    for (let h = 0; h < H; h++) {
      nodes[forwardHead(layout, l, h)] = `a${l}.h${h}`;
      fOf.set(`a${l}.h${h}`, forwardHead(layout, l, h));
    }
    mlpNodes(l).forEach((m, j) => {
      nodes[forwardMlp(layout, l, j)] = m.name;
      fOf.set(m.name, forwardMlp(layout, l, j));
    });
  }
  const edges: EdgeDef[] = [];
  const nodeInputs = new Map<string, number[]>();
  const add = (u: string, downstream: string, b: number, suffix = '') => {
    const input = downstream + suffix;
    edges.push({ name: `${u}->${input}`, upstream: u, downstream, input, f: fOf.get(u)!, b });
  };
  let stream = ['input'];
  for (let l = 0; l < L; l++) {
    const heads = Array.from({ length: H }, (_, h) => `a${l}.h${h}`);
    for (let h = 0; h < H; h++)
      nodeInputs.set(
        heads[h],
        (['q', 'k', 'v'] as const).map((x) => backwardHead(layout, l, x, h)),
      );
    const mlps = mlpNodes(l);
    for (const m of mlps)
      nodeInputs.set(
        m.name,
        m.inputs.map(([, b]) => b),
      );
    const intoMlps = (u: string) => {
      for (const m of mlps) for (const [suffix, b] of m.inputs) add(u, m.name, b, suffix);
    };
    for (const u of stream)
      for (let h = 0; h < H; h++)
        for (const x of ['q', 'k', 'v'] as const) add(u, heads[h], backwardHead(layout, l, x, h), `<${x}>`);
    if (layout.parallel) for (const u of stream) intoMlps(u);
    stream = [...stream, ...heads];
    if (!layout.parallel) for (const u of stream) intoMlps(u);
    stream = [...stream, ...mlps.map((m) => m.name)];
  }
  nodeInputs.set('logits', [backwardLogits(layout)]);
  for (const u of stream) add(u, 'logits', backwardLogits(layout));
  return { layout, nodes, edges, byName: new Map(edges.map((e, i) => [e.name, i])), nodeInputs };
}

/** w = 1 on every edge NOT in the circuit (it carries the corrupted value), 0 on circuit edges: [Nf·Nb] */
export function patchWeights(g: EdgeGraph, inCircuit: (i: number) => boolean, into?: Float32Array): Float32Array {
  const { nForward: Nf, nBackward: Nb } = g.layout;
  const w = into ?? new Float32Array(Nf * Nb);
  g.edges.forEach((e, i) => {
    w[e.f * Nb + e.b] = inCircuit(i) ? 0 : 1;
  });
  return w;
}

/**
 * The library's prune (graph.py Graph.prune) to its fixpoint: a node stays when it has an
 * in-circuit outgoing edge and an in-circuit incoming edge (input always counts as fed; logits
 * always stays); an edge stays when both its ends do. Under patching this never changes M: a node
 * without circuit inputs computes its corrupted output, and one without circuit outputs is unread.
 */
export function prune(g: EdgeGraph, circuit: Set<number>): Set<number> {
  const c = new Set(circuit);
  for (;;) {
    const outgoing = new Set<string>();
    const incoming = new Set<string>(['input']);
    for (const i of c) {
      outgoing.add(g.edges[i].upstream);
      incoming.add(g.edges[i].downstream);
    }
    const alive = (n: string) => n === 'logits' || (outgoing.has(n) && incoming.has(n));
    let changed = false;
    for (const i of [...c]) {
      const e = g.edges[i];
      if (!alive(e.upstream) || !alive(e.downstream)) {
        c.delete(i);
        changed = true;
      }
    }
    if (!changed) return c;
  }
}

/** MIB's grid of circuit sizes, as fractions of the edges (evaluation.py evaluate_area_under_curve) */
export const MIB_PCTS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1];

export type Ranking = 'signed' | 'abs';

/**
 * Edge indices best first: `signed` = most negative score first (patching it lowers M most: MIB's
 * signed top-n on its loss-convention scores, −ΔM, for CPR); `abs` = largest |score| first (for
 * CMD). Ties keep the library's edge order (torch.argsort leaves them unspecified).
 */
export function ranking(scores: ArrayLike<number>, how: Ranking): number[] {
  const idx = Array.from({ length: scores.length }, (_, i) => i);
  const key = (i: number) => (how === 'abs' ? -Math.abs(scores[i]) : scores[i]);
  return idx.sort((a, b) => key(a) - key(b) || a - b);
}

/** n = int(pct · E) per MIB, then the top n of `order`, pruned */
export function topCircuit(g: EdgeGraph, order: number[], pct: number): { n: number; circuit: Set<number> } {
  const n = Math.floor(pct * g.edges.length);
  return { n, circuit: prune(g, new Set(order.slice(0, n))) };
}

export interface CurvePoint {
  pct: number;
  n: number;
  n_after_prune: number;
  metric: number;
  faithfulness: number;
}

/** CPR (trapezoid area under f over pct) and CMD (trapezoid area of |1 − f|), MIB's linear pct axis from 0.001 to 1 */
export function areas(curve: { pct: number; faithfulness: number }[]): { cpr: number; cmd: number } {
  let cpr = 0;
  let cmd = 0;
  for (let i = 0; i + 1 < curve.length; i++) {
    const dx = curve[i + 1].pct - curve[i].pct;
    const [a, b] = [curve[i].faithfulness, curve[i + 1].faithfulness];
    cpr += (dx * (a + b)) / 2;
    cmd += (dx * (Math.abs(1 - a) + Math.abs(1 - b))) / 2;
  }
  return { cpr, cmd };
}

// ------------------------------------------------------------------ MIB's circuit format (Graph.to_json)

/**
 * Graph.to_json's layout: {cfg: {n_layers, n_heads, parallel_attn_mlp, d_model}, nodes: {name:
 * {in_graph}}, edges: {name: {score, in_graph}}}, nodes and edges in the library's order. Scores
 * are in MIB's convention, the attribution of the loss −M: a file's score is −(this document's
 * score), so MIB's signed top-n (highest first) ranks as CPR does here.
 */
export const mibGraphSchema = z.object({
  cfg: z.object({
    n_layers: z.number().int(),
    n_heads: z.number().int(),
    parallel_attn_mlp: z.boolean(),
    d_model: z.number().int(),
    // Loupe's, on mixture-of-experts models only (MIB's files have neither)
    n_experts: z.number().int().optional(),
    shared_expert: z.boolean().optional(),
  }),
  nodes: z.record(z.string(), z.object({ in_graph: z.boolean() }).passthrough()),
  edges: z.record(z.string(), z.object({ score: z.number().nullable(), in_graph: z.boolean() })),
});
export type MibGraph = z.infer<typeof mibGraphSchema>;

export function toMibGraph(
  g: EdgeGraph,
  cfg: MibGraph['cfg'],
  scores: ArrayLike<number>,
  inCircuit: Set<number>,
): MibGraph {
  const alive = new Set<string>(['logits']);
  for (const i of inCircuit) {
    alive.add(g.edges[i].upstream);
    alive.add(g.edges[i].downstream);
  }
  const nodes: MibGraph['nodes'] = {};
  for (const n of g.nodes) nodes[n] = { in_graph: alive.has(n) };
  nodes.logits = { in_graph: true };
  const edges: MibGraph['edges'] = {};
  g.edges.forEach((e, i) => {
    edges[e.name] = { score: -scores[i] + 0, in_graph: inCircuit.has(i) };
  });
  return {
    cfg,
    nodes,
    edges,
  };
}

/**
 * A Graph.to_json file → scores in this document's convention (−file score; an edge the file
 * leaves out scores 0, as Graph.from_json leaves it) and its in_graph circuit. Its cfg must match
 * the model; an edge name the model's graph does not have is BAD_INPUT naming it.
 */
export function fromMibGraph(
  g: EdgeGraph,
  info: ModelInfo,
  raw: unknown,
): { scores: Float64Array; circuit: Set<number>; missing: number } {
  const r = mibGraphSchema.safeParse(raw);
  if (!r.success)
    throw new LoupeError(
      'BAD_INPUT',
      `circuit is not a Graph.to_json file: ${r.error.issues
        .slice(0, 3)
        .map((i) => `${i.path.join('.') || '(file)'}: ${i.message}`)
        .join('; ')}.`,
      'Give the JSON that EAP-IG’s Graph.to_json (MIB’s circuit format) writes: {cfg, nodes, edges}.',
    );
  const f = r.data;
  const want = edgeShapeOf(info);
  for (const [k, v] of Object.entries(want))
    if ((f.cfg as Record<string, unknown>)[k] !== v)
      throw new LoupeError(
        'BAD_INPUT',
        `The circuit's cfg.${k} is ${JSON.stringify((f.cfg as Record<string, unknown>)[k])}; this model's is ${JSON.stringify(v)}.`,
        'Import a circuit made for this model.',
      );
  const scores = new Float64Array(g.edges.length);
  const circuit = new Set<number>();
  let seen = 0;
  for (const [name, e] of Object.entries(f.edges)) {
    const i = g.byName.get(name);
    if (i === undefined)
      throw new LoupeError(
        'BAD_INPUT',
        `The circuit names an edge this model's graph does not have: ${JSON.stringify(name)}.`,
        `Edges are named as EAP-IG names them: "input->a0.h1<q>", "a0.h1->m0", "m${info.n_layers - 1}->logits".`,
        { edge: name },
      );
    seen++;
    scores[i] = e.score === null ? 0 : -e.score + 0;
    if (e.in_graph) circuit.add(i);
  }
  return { scores, circuit, missing: g.edges.length - seen };
}

/** a circuit given as edge names → indices; an unknown name is BAD_INPUT naming it */
export function circuitOfNames(g: EdgeGraph, names: string[]): Set<number> {
  const out = new Set<number>();
  for (const n of names) {
    const i = g.byName.get(n);
    if (i === undefined)
      throw new LoupeError(
        'BAD_INPUT',
        `circuit_edges names an edge this model's graph does not have: ${JSON.stringify(n)}.`,
        'Edge names look like "input->a0.h1<q>", "a0.h1->m0", "m0->logits".',
        { edge: n },
      );
    out.add(i);
  }
  return out;
}
