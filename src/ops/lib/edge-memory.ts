/**
 * edge_attribution's memory, judged before any run: the bytes the operation and one engine run
 * hold (a count of the arrays it makes, from the edge layout and the prompt's length), against the
 * room the model's load left in its budget (engine/budget.ts, ModelMemory.budget). Rows per run
 * are cut to what fits; where not even one row fits, TOO_LARGE before anything is allocated.
 *
 *   matrix  Nf·Nb·4        one row of edge weights, or of their gradient
 *   nodes   Nf·T·D·4       one row's upstream node outputs (edge::out, edge::src, the differences d)
 *   inputs  Nb·T·D·4       one row's downstream inputs (each head's q/k/v copy of the stream, each MLP's)
 *   saved   Σ_mix n·T·D·4  the node stacks each input's mix multiplies (edge-graph.ts mix), which a
 *                          gradient run keeps for its backward pass
 *
 * per row of a forward run:  w·matrix·2 (JS and runtime copies; w = 0 where no weights are fed)
 *                            + nodes·4 (d, their stack, edge::out and its JS copy) + inputs·2
 * per row of a gradient run: matrix·4 (w and ∂M/∂w, each in JS and the runtime) + saved
 *                            + nodes·3 + inputs·3
 * held for the whole call:   the edge list (EDGE_LIST_BYTES per edge), each pair's scores (E·8, and as much again for the statistics), the
 *                            node outputs kept in JS (exact, evaluate: nodes per pair, twice for
 *                            EAP-IG), EAP-IG's rows of weights (rows·matrix, twice while they are
 *                            cut into batches) and its float64 sum (Nf·Nb·8), the circuits' weights.
 * The factors count arrays; onnxruntime's arena may hold more (not measured here). WebGPU's limit
 * on one buffer is not judged here.
 */
import { LoupeError } from '../../engine/errors';
import { fmtGB } from '../../engine/budget';
import { edgeLayout, forwardHead, forwardMlp, prevIndex, type EdgeLayout } from '../../engine/edges';
import type { EdgeShape } from './edge-circuits';
import type { LoadedModel } from '../../engine/api';

/** the room assumed where the load's budget is not known (WebGPU without memory.gpuBytes): a wasm32 heap's 4 GiB */
export const UNKNOWN_ROOM_BYTES = 4 * 1024 ** 3;

/**
 * JS heap per edge of the edge list (edge-circuits.ts edgeGraphOf: its names, objects and maps): 212 B
 * measured on a 176,449-edge graph (Node 20, 2026-12-05), rounded up
 */
export const EDGE_LIST_BYTES = 256;

/** the layout edgeGraphOf gives a shape, without making its edge list */
export const layoutOf = (s: EdgeShape): EdgeLayout =>
  edgeLayout(
    s.n_layers,
    s.n_heads,
    s.parallel_attn_mlp,
    s.n_experts ? { experts: s.n_experts, shared: !!s.shared_expert } : undefined,
  );

/** the edges of a layout (edgeGraphOf's count): every upstream node before each input's prevIndex */
export function edgeCount(g: EdgeLayout): number {
  let n = 0;
  for (let b = 0; b < g.nBackward; b++) n += prevIndex(g, b);
  return n;
}

export interface EdgeWork {
  layout: EdgeLayout;
  nEdges: number;
  dModel: number;
  /** the longest prompt's tokens */
  T: number;
  pairs: number;
  /** runs with a backward pass (eap, the EAP-IG methods) */
  gradient: boolean;
  /** forward runs fed a row of weights each (exact, evaluate) */
  weightedForward: boolean;
  /** node outputs kept in JS per pair: 0, 1 (corrupted) or 2 (and clean) */
  keptNodes: number;
  /** EAP-IG's rows of weights, all made at once (0: none) */
  igRows: number;
  /** circuits evaluated (their weights are held together) */
  circuits: number;
}

export interface EdgeMemory {
  fixedBytes: number;
  rowBytes: number;
  roomBytes: number;
  /** where the room comes from, as a sentence says it after "the {room}" */
  limitName: string;
  /** rows one run may have */
  rows: number;
}

const F32 = 4;

/** Σ over the graph's mixes of the upstream nodes each multiplies (edge-graph.ts edgeBlock, build) */
function mixedNodes(g: EdgeLayout): number {
  let n = 0;
  for (let l = 0; l < g.nLayers; l++)
    n += forwardHead(g, l, 0) + (g.parallel ? forwardHead(g, l, 0) : forwardMlp(g, l));
  return n + g.nForward;
}

export function edgeMemory(
  w: EdgeWork,
  budget: { limit_name: string; limit_bytes: number | null; held_bytes: number } | undefined,
): EdgeMemory {
  const { nForward: Nf, nBackward: Nb } = w.layout;
  const matrix = Nf * Nb * F32;
  const nodes = Nf * w.T * w.dModel * F32;
  const inputs = Nb * w.T * w.dModel * F32;
  const saved = mixedNodes(w.layout) * w.T * w.dModel * F32;
  const forwardRow = (w.weightedForward ? 2 * matrix : 0) + 4 * nodes + 2 * inputs;
  const gradientRow = w.gradient ? 4 * matrix + saved + 3 * nodes + 3 * inputs : 0;
  const fixedBytes =
    w.nEdges * EDGE_LIST_BYTES +
    w.pairs * w.nEdges * 8 * 2 +
    w.pairs * w.keptNodes * nodes +
    (w.igRows ? 2 * w.igRows * matrix + Nf * Nb * 8 : 0) +
    w.circuits * matrix;
  const rowBytes = Math.max(forwardRow, gradientRow);
  const known = budget?.limit_bytes != null;
  const roomBytes = known ? Math.max(0, budget!.limit_bytes! - budget!.held_bytes) : UNKNOWN_ROOM_BYTES;
  const limitName = known
    ? `that ${budget!.limit_name} (${fmtGB(budget!.limit_bytes!)}) leaves beside the model (${fmtGB(budget!.held_bytes)})`
    : "assumed where the memory budget is not known (a wasm32 heap's 4 GiB)";
  return { fixedBytes, rowBytes, roomBytes, limitName, rows: Math.floor((roomBytes - fixedBytes) / rowBytes) };
}

/**
 * Rows per run that fit the model's budget, at most `wanted`; TOO_LARGE (before any run) when
 * not even one does, its hint naming what shrinks the work.
 */
export function fitEdgeRows(model: LoadedModel, w: EdgeWork, wanted: number): { rows: number; mem: EdgeMemory } {
  const mem = edgeMemory(w, model.memory().budget);
  if (mem.rows >= 1) return { rows: Math.min(wanted, mem.rows), mem };
  const moe = w.layout.experts > 0;
  throw new LoupeError(
    'TOO_LARGE',
    `edge_attribution on this ${w.layout.nForward.toLocaleString('en-US')} × ` +
      `${w.layout.nBackward.toLocaleString('en-US')} edge graph (${w.nEdges.toLocaleString('en-US')} edges, ` +
      `${w.pairs} pairs, ${w.T} tokens) would hold about ${fmtGB(mem.fixedBytes + mem.rowBytes)} with one row per run ` +
      `(${fmtGB(mem.fixedBytes)} for the whole call, ${fmtGB(mem.rowBytes)} per row), more than the ` +
      `${fmtGB(mem.roomBytes)} ${mem.limitName}.`,
    'Give fewer pairs or shorter prompts' +
      (w.igRows ? ', fewer ig_steps or eap_ig_inputs instead of eap_ig_activations' : '') +
      (w.circuits ? ', or leave evaluate off' : '') +
      (moe ? '; with experts as nodes the graph is large: use a dense model' : '') +
      (model.info.backend === 'node' ? '.' : '; on Node (--backend node) the limit is host memory.'),
    {
      estimate_bytes: mem.fixedBytes + mem.rowBytes,
      fixed_bytes: mem.fixedBytes,
      row_bytes: mem.rowBytes,
      room_bytes: mem.roomBytes,
      n_forward: w.layout.nForward,
      n_backward: w.layout.nBackward,
    },
  );
}
