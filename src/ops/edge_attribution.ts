/**
 * edge_attribution — which edges of the transformer's computational graph carry a behaviour over a
 * dataset of clean/corrupted pairs, as the EAP-IG library (Hanna et al. 2024, "Have Faith in
 * Faithfulness") scores them and as MIB (the Mechanistic Interpretability Benchmark) judges the
 * circuits they give. Definitions: /work/shared/specs/edge-circuits.md; the graph and the circuit
 * format: lib/edge-circuits.ts; the engine's edge variant: engine/graph/edge-graph.ts.
 *
 * Metric M = logit[answer] − logit[counterfactual] at the last position, per pair; scores are
 * means over the pairs. A score estimates ΔM when that edge alone is patched (its upstream output
 * replaced by the corrupted run's, in the clean run): an edge the behaviour needs has a large
 * NEGATIVE score.
 *  - eap:                Σ_{pos,d} (a_u(corr) − a_u(clean)) · ∂M/∂x_b, the gradient on the clean run
 *  - eap_ig_inputs:      the same with ∂M/∂x_b averaged over m runs whose token embedding is
 *                        e_corr + α(e_clean − e_corr), α = k/m, k = 0 … m−1 (the library's current rule)
 *  - eap_ig_activations: for each group (input, each layer's heads, each MLP) and k = 1 … m, that
 *                        group's output set to α clean + (1−α) corrupted as a constant; the gradients
 *                        of all 2L+1 groups' runs summed into every edge, / (m(2L+1))
 *  - exact:              M(only that edge patched) − M(clean), one forward per edge and pair
 * evaluate: MIB's faithfulness curve, f = (M(C) − M(corrupted)) / (M(clean) − M(corrupted)) for the
 * top n = floor(pct·E) edges, pruned, every other edge carrying the corrupted value; CPR = area
 * under f (signed ranking: most negative first), CMD = area of |1 − f| (ranking by |score|).
 */
import { z } from 'zod';
import type { DeviceTensor, LoadedModel, RunResult } from '../engine/api';
import type { Tensor } from '../engine/tensor';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { defineOperation } from './types';
import { documentBase, documentHead } from '../schema/common';
import { CAPS, checkDocumentSize, finite } from '../engine/caps';
import { fmtGB } from '../engine/budget';
import { batchesByLength, datasetFields, datasetReport, resolveDataset, type Example } from './lib/dataset';
import { metricSeed } from './lib/gradients';
import { adjustFamily, BOOTSTRAP_RESAMPLES, DatasetStats, SIGN_FLIPS, statisticsBlock, statsFields } from './lib/stats';
import { gapWarnings, warningsSchema } from './lib/metric';
import {
  MIB_PCTS,
  areas,
  circuitOfNames,
  edgeGraphOf,
  edgeShapeOf,
  fromMibGraph,
  mibGraphSchema,
  patchWeights,
  prune,
  ranking,
  toMibGraph,
  topCircuit,
  type EdgeGraph,
  type Ranking,
} from './lib/edge-circuits';
import { forwardHead, forwardMlp, prevIndex } from '../engine/edges';
import { EDGE_GAP_HINT, POST_NORM_GAP } from '../engine/graph/edge-graph';
import { edgeCount, fitEdgeRows, layoutOf } from './lib/edge-memory';
import { isLinearLayer } from './lib/dla';

export const METHODS = ['eap', 'eap_ig_inputs', 'eap_ig_activations', 'exact'] as const;
/** `exact` above this many edges needs allow_large_exact (its cost: edges × pairs forward rows) */
export const EXACT_MAX_EDGES = CAPS.maxExactEdges;

export const edgeAttributionInput = z.object({
  ...datasetFields,
  prepend_bos: z.boolean().default(true).describe('Prepend BOS to prompts given as text.'),
  method: z
    .enum(METHODS)
    .default('eap_ig_inputs')
    .describe('eap, eap_ig_inputs (MIB’s best), eap_ig_activations, or exact (one forward per edge and pair).'),
  ig_steps: z.number().int().min(1).max(64).default(5).describe('m for the EAP-IG methods (MIB uses 5).'),
  evaluate: z
    .boolean()
    .default(false)
    .describe('Also MIB’s faithfulness curve over pct ∈ {0.001 … 1} of the edges, with CPR and CMD.'),
  circuit: z
    .unknown()
    .optional()
    .describe(
      'A circuit made elsewhere, in MIB’s format (EAP-IG Graph.to_json: {cfg, nodes, ' +
        'edges}): its scores replace attribution, and its in_graph edges are evaluated.',
    ),
  circuit_edges: z
    .array(z.string())
    .optional()
    .describe('A circuit as a list of edge names ("input->a0.h1<q>", "a1.h0->logits", …) to evaluate.'),
  allow_large_exact: z
    .boolean()
    .default(false)
    .describe(`method exact on a graph of more than ${EXACT_MAX_EDGES} edges (it costs edges × pairs forward rows).`),
  per_example: z.boolean().default(false).describe('List every edge’s per-pair scores too.'),
  ...statsFields,
  mib_export: z
    .object({
      top_n: z.number().int().min(0).default(0).describe('Mark the top n edges (and their nodes) in_graph.'),
      absolute: z.boolean().default(false).describe('Rank by |score| instead of most negative first.'),
    })
    .optional()
    .describe('Return the scores as MIB’s circuit file (Graph.to_json layout) in mib_graph.'),
  batch_size: z
    .number()
    .int()
    .min(1)
    .max(CAPS.maxBatch)
    .default(8)
    .describe('Pairs per batched engine run (fewer where the memory budget needs it: a warning says so).'),
});
export type EdgeAttributionInput = z.input<typeof edgeAttributionInput>;

const curvePoint = z.object({
  pct: z.number(),
  n: z.number().int().describe('int(pct · E) edges taken from the ranking'),
  n_after_prune: z.number().int(),
  metric: z.number().describe('mean M of the circuit'),
  faithfulness: z.number().describe('(M(C) − m_empty) / (m_full − m_empty)'),
});
const rankingResult = z.object({
  cpr: z.number().describe('trapezoid area under the faithfulness curve over pct (higher is better)'),
  cmd: z.number().describe('trapezoid area of |1 − faithfulness| over pct (lower is better)'),
  curve: z.array(curvePoint),
});
const circuitResult = z.object({
  source: z.enum(['circuit_edges', 'circuit']),
  n_edges: z.number().int(),
  n_after_prune: z.number().int(),
  metric: z.number(),
  faithfulness: z.number(),
});

export const edgeAttributionOutput = documentBase('edge_attribution').extend({
  method: z.enum([...METHODS, 'imported']).describe('how the scores were made (imported: from `circuit`)'),
  ig_steps: z.number().int().nullable(),
  description: z.string().describe('exactly what was computed'),
  metric: z.literal('logit_difference'),
  dataset: datasetReport,
  graph_cfg: mibGraphSchema.shape.cfg.describe("the graph's shape, as MIB's circuit files name it"),
  n_edges: z.number().int(),
  n_nodes: z.number().int().describe('nodes of the graph, input and logits included'),
  m_clean: z.number().describe('mean M over the pairs, clean runs (the full model: m_full)'),
  m_corrupted: z.number().describe('mean M, corrupted runs (the empty circuit: m_empty)'),
  edges: z
    .array(
      z.object({
        name: z.string(),
        upstream: z.string(),
        downstream: z.string().describe('the node the edge enters'),
        qkv: z.enum(['q', 'k', 'v']).nullable().describe('which input of a head it enters'),
        score: z.number().describe('estimated ΔM when this edge alone is patched (mean over pairs)'),
        ci_low: z
          .number()
          .nullable()
          .default(null)
          .describe('2.5 % bootstrap quantile of the mean score (null: imported, or one pair)'),
        ci_high: z.number().nullable().default(null).describe('97.5 % bootstrap quantile of the mean score'),
        p_value: z.number().nullable().default(null).describe('two-sided sign-flip p-value of mean score = 0'),
        p_holm: z.number().nullable().default(null).describe('p_value adjusted over every edge by Holm (family-wise)'),
        p_bh: z
          .number()
          .nullable()
          .default(null)
          .describe('p_value adjusted over every edge by Benjamini–Hochberg (FDR)'),
        per_example: z.array(z.number()).optional(),
      }),
    )
    .describe("every edge, in the library's order (Graph.from_model)"),
  statistics: statisticsBlock
    .nullable()
    .default(null)
    .describe("how each edge's CI and p-values were made (null: imported scores, or one pair)"),
  warnings: warningsSchema.default([]),
  completeness: z
    .object({
      input_scores: z.number().describe('Σ of the scores of the edges out of input'),
      target: z.number().describe('m_corrupted − m_clean, which that sum approaches as m grows'),
      error: z.number(),
    })
    .nullable()
    .describe('eap_ig_inputs only'),
  evaluation: z
    .object({ signed: rankingResult, abs: rankingResult, m_full: z.number(), m_empty: z.number() })
    .nullable(),
  circuit_evaluation: z.array(circuitResult).describe('the circuits given (circuit_edges, circuit’s in_graph)'),
  mib_graph: mibGraphSchema.nullable().describe('the scores as MIB’s circuit file (mib_export), else null'),
  cost: z.object({
    forward_equivalents: z
      .number()
      .describe('per pair, counting a forward row as 1 and a forward + backward row as 2 (no weight gradients)'),
    forward_rows: z.number().int(),
    gradient_rows: z.number().int(),
    engine_runs: z.number().int(),
  }),
});

/** per-example state kept between the passes */
interface Item {
  ex: Example;
  /** the corrupted run's node outputs, where a later run needs them in JS (eap without evaluation does not) */
  corr?: Float32Array;
  clean?: Float32Array;
  /** the pair's scores where they were made with its batch's runs (eap; EAP-IG on the device) */
  scores?: Float64Array;
  mClean: number;
  mCorr: number;
}

/** one gradient run's rows of EAP-IG weights [B, Nf, Nb] and gates [B, Nf], here or on the device */
interface IgBatch {
  B: number;
  weights: Tensor | DeviceTensor;
  gate?: Tensor | DeviceTensor;
}

const releaseBatch = (b: IgBatch) => [b.weights, b.gate].forEach((t) => t && 'release' in t && t.release());

export const operation = defineOperation({
  name: 'edge_attribution',
  title: 'Edge attribution',
  description:
    "Edge attribution patching over a dataset of clean/corrupted pairs, in the EAP-IG library's graph (nodes " +
    "input, a{l}.h{h}, m{l}, logits; edges into each head's q/k/v input, each MLP and logits; " +
    'a mixture-of-experts MLP is its experts, m{l}.e{e} entered at <in> and <router>, and m{l}.shared; ' +
    "names as 'a0.h1->a1.h3<v>') so results exchange with MIB's tools. Methods: eap, eap_ig_inputs (default, " +
    'm = ig_steps = 5, α = k/m, k = 0..m−1), eap_ig_activations, exact. M = logit[answer] − ' +
    'logit[counterfactual] at the last position; a score estimates ΔM when that edge is patched (an important ' +
    "edge scores large negative). evaluate: MIB's faithfulness curve (top int(pct·E) edges, pruned, " +
    'others patched to the corrupted run) with CPR (signed ranking) and CMD (|score| ranking). ' +
    'Import a Graph.to_json circuit (circuit) or a list of edge names (circuit_edges) to evaluate it; ' +
    'mib_export returns the scores in that format. Cost per pair: eap ≈ 3 forward-equivalents, eap_ig_inputs ≈ ' +
    '2m + 2, exact = E forwards, evaluate ≈ 20 forwards.',
  input: edgeAttributionInput,
  output: edgeAttributionOutput,
  long: true,
}).implement(async (model, input, ctx) => {
  // before the dataset is read; the edge variant names every other part it does not model (edgeGaps)
  if (model.info.post_norms)
    throw new LoupeError(
      'UNSUPPORTED_ARCHITECTURE',
      `edge_attribution does not model this ${model.info.architecture} model's ${POST_NORM_GAP}.`,
      EDGE_GAP_HINT,
      { architecture: model.info.architecture },
    );
  // EAP's graph has a node per head; a linear-attention layer has none (a whole-layer node is not modelled yet)
  const linear = Array.from({ length: model.info.n_layers }, (_, l) => l).filter((l) => isLinearLayer(model, l));
  if (linear.length)
    throw new LoupeError(
      'UNSUPPORTED_OP',
      `edge_attribution does not model linear-attention layers: layers ${linear.join(', ')} of this ` +
        `${model.info.architecture} model are gated delta-net layers without attention heads, for which the edge ` +
        "graph (a node per head) has no node; its full-attention layers' gated output is not modelled either.",
      'On this model use attribution_patching (a linear layer’s output is a site), patch, ablate or circuit.',
      { layers: linear, architecture: model.info.architecture },
    );
  const ds = await resolveDataset(model, input);
  const shape = edgeShapeOf(model.info);
  // the edge count, the document's size and the memory judged from the layout, before the edge list is made
  const layout = layoutOf(shape);
  const E = edgeCount(layout);
  const method = input.circuit !== undefined ? 'imported' : input.method;
  if (method === 'exact' && E > EXACT_MAX_EDGES && !input.allow_large_exact)
    throw new LoupeError(
      'TOO_LARGE',
      `exact scoring of this model's ${E.toLocaleString('en-US')} edges costs ` +
        `${(E * ds.examples.length).toLocaleString('en-US')} forward rows (edges × pairs); the limit without ` +
        `asking is ${EXACT_MAX_EDGES} edges.`,
      'Use eap_ig_inputs, or set allow_large_exact to run it anyway.',
    );
  const n = ds.examples.length;
  checkDocumentSize(
    E * (input.per_example ? n + 1 : 1),
    'This edge list',
    'Leave per_example off, or give fewer pairs.',
  );
  const { nForward: Nf, nBackward: Nb } = layout;
  const D = model.info.d_model;
  const T0 = (ex: Example) => ex.clean.length;
  const V = model.info.d_vocab;
  const m = input.ig_steps;
  const needClean = method === 'eap_ig_inputs' || method === 'eap_ig_activations';
  const nCircuits =
    (input.evaluate ? 2 * MIB_PCTS.length : 0) + (input.circuit_edges ? 1 : 0) + (input.circuit !== undefined ? 1 : 0);
  // rows per engine run that fit the memory budget (lib/edge-memory.ts), or TOO_LARGE before any run
  const fit = fitEdgeRows(
    model,
    {
      layout,
      nEdges: E,
      dModel: D,
      T: ds.examples.reduce((t, ex) => Math.max(t, T0(ex)), 0),
      pairs: n,
      gradient: method !== 'exact' && method !== 'imported',
      weightedForward: method === 'exact' || nCircuits > 0,
      keptNodes: needClean ? 2 : 1,
      igRows: method === 'eap_ig_inputs' ? m : method === 'eap_ig_activations' ? (2 * layout.nLayers + 1) * m : 0,
      circuits: nCircuits,
    },
    CAPS.maxBatch,
  );
  const batchSize = Math.min(input.batch_size, fit.rows);
  const chunk = Math.min(CAPS.maxBatch, fit.rows);
  const chunked = method === 'exact' || needClean || nCircuits > 0;
  const memoryWarnings =
    batchSize < input.batch_size || (chunked && chunk < CAPS.maxBatch)
      ? [
          `Memory: about ${fmtGB(fit.mem.rowBytes)} per row of a run beside ${fmtGB(fit.mem.fixedBytes)} held ` +
            `for the call, the ${fmtGB(fit.mem.roomBytes)} ${fit.mem.limitName} hold ${fit.rows} rows per run, so ` +
            `runs have at most ` +
            `${fit.rows} rows` +
            (batchSize < input.batch_size ? ` (batch_size ${input.batch_size} → ${batchSize})` : '') +
            ': the same scores, more runs.',
        ]
      : [];
  const g = edgeGraphOf(shape);
  const imported = input.circuit !== undefined ? fromMibGraph(g, model.info, parseCircuit(input.circuit)) : undefined;
  const explicit = input.circuit_edges ? circuitOfNames(g, input.circuit_edges) : undefined;
  const cost = { forward_rows: 0, gradient_rows: 0, engine_runs: 0 };
  const run = async (tokens: number[][], opts: Parameters<LoadedModel['run']>[1]) => {
    throwIfAborted(ctx.signal);
    cost.engine_runs++;
    if (opts?.grad) cost.gradient_rows += tokens.length;
    else cost.forward_rows += tokens.length;
    return model.run(tokens, { ...opts, signal: ctx.signal });
  };
  const M = (logits: Tensor, row: number, ex: Example) =>
    logits.data[row * V + ex.answer] - logits.data[row * V + ex.counterfactual];

  // EAP-IG's rows of weights, made on first use (igRows)
  let igBatches: Promise<IgBatch[]> | undefined;
  // ---- pass 1: the corrupted (and, for the IG methods, clean) node outputs of every pair
  const items: Item[] = [];
  const perExample: Float64Array[] = [];
  const progress = (stage: string, done: number, total: number) => ctx.onProgress?.({ stage, done, total });
  const mean = (xs: number[]) => xs.reduce((s, x) => s + x, 0) / xs.length;
  try {
    const batches = batchesByLength(ds.examples, batchSize);
    progress('corrupted and clean runs', 0, n);
    // eap scores each batch in one gradient run fed the corrupted outputs as they are; EAP-IG feeds
    // each pair's difference corrupted − clean, made on the device where the backend keeps the outputs
    // there. They come to JS only for the exact method and evaluation.
    const inJs = method === 'exact' || imported !== undefined || input.evaluate || explicit !== undefined;
    const outputs = inJs ? true : 'device';
    for (const batch of batches) {
      const T = T0(batch[0]);
      const size = Nf * T * D;
      const corr = await run(
        batch.map((e) => e.corrupted),
        { logitPositions: [T - 1], edges: { subtract: true, outputs } },
      );
      const eap = method === 'eap' ? await eapBatch(batch, corr) : undefined;
      // EAP reads M(clean) off its gradient runs
      const clean =
        method === 'eap'
          ? undefined
          : await run(
              batch.map((e) => e.clean),
              { logitPositions: [T - 1], edges: { subtract: true, outputs: needClean ? outputs : false } },
            );
      const onDevice = corr.edgeOutputsOnDevice && clean?.edgeOutputsOnDevice;
      try {
        for (const [r, ex] of batch.entries()) {
          const it: Item = {
            ex,
            corr: corr.edgeOutputs?.data.slice(r * size, (r + 1) * size),
            clean: clean?.edgeOutputs?.data.slice(r * size, (r + 1) * size),
            mClean: eap ? eap.mClean[r] : clean ? M(clean.logits, r, ex) : NaN,
            mCorr: M(corr.logits, r, ex),
            scores: eap?.scores[r],
          };
          if (onDevice) {
            const delta = await model.deviceDifference(corr.edgeOutputsOnDevice!, clean!.edgeOutputsOnDevice!, r);
            try {
              it.scores = await scorePair(it, method as (typeof METHODS)[number], delta);
            } finally {
              delta.release();
            }
          }
          items.push(it);
        }
      } finally {
        corr.edgeOutputsOnDevice?.release();
        clean?.edgeOutputsOnDevice?.release();
      }
      progress('corrupted and clean runs', items.length, n);
    }
    items.sort((a, b) => a.ex.index - b.ex.index);

    // ---- pass 2: scores, per pair
    if (!imported) {
      progress('attributing', 0, n);
      for (const it of items) {
        perExample.push(it.scores ?? (await scorePair(it, method as (typeof METHODS)[number])));
        progress('attributing', perExample.length, n);
      }
    }
  } finally {
    igBatches?.then((b) => b.forEach(releaseBatch)).catch(() => undefined);
  }
  const mClean = mean(items.map((i) => i.mClean));
  const mCorr = mean(items.map((i) => i.mCorr));
  const scores = imported
    ? imported.scores
    : Float64Array.from({ length: E }, (_, i) => perExample.reduce((s, p) => s + p[i], 0) / n);
  // per-edge bootstrap CI and sign-flip p-value over the pairs, adjusted over every edge (lib/stats.ts);
  // a large graph gets 999 sign patterns instead of 9999: the cost is E·n·(resamples + patterns) additions
  let edgeStats: { ci_low: number; ci_high: number; p_value: number | null }[] | null = null;
  let stats: DatasetStats | null = null;
  if (!imported && n >= 2) {
    progress('statistics', 0, E);
    stats = new DatasetStats(n, input.bootstrap_seed, BOOTSTRAP_RESAMPLES, E * n > 1e5 ? 999 : SIGN_FLIPS);
    edgeStats = stats.many(perExample, E, true, (done) => {
      throwIfAborted(ctx.signal);
      progress('statistics', done, E);
    });
  }
  const adjusted = edgeStats ? adjustFamily(edgeStats) : null;

  /**
   * eap for a batch of pairs of one length: one gradient run on the clean prompts, each row fed its
   * pair's corrupted outputs (d_u = a_u(corrupted) − a_u(clean), held constant); row r's ∂M/∂w are
   * that pair's scores, its logits M(clean)
   */
  async function eapBatch(batch: Example[], corr: RunResult): Promise<{ scores: Float64Array[]; mClean: number[] }> {
    const B = batch.length;
    const T = T0(batch[0]);
    const seed = new Float32Array(B * V);
    batch.forEach((ex, r) => seed.set(metricSeed(V, 1, ex.answer, ex.counterfactual).data, r * V));
    try {
      const res = await run(
        batch.map((e) => e.clean),
        {
          logitPositions: [T - 1],
          edges: { subtract: true, source: corr.edgeOutputsOnDevice ?? corr.edgeOutputs },
          grad: { hooks: [], seed: { dims: [B, 1, V], data: seed } },
        },
      );
      const gr = res.edgeGrad!.data;
      return {
        scores: batch.map((_, r) => Float64Array.from(g.edges, (e) => gr[r * Nf * Nb + e.f * Nb + e.b])),
        mClean: batch.map((ex, r) => M(res.logits, r, ex)),
      };
    } finally {
      corr.edgeOutputsOnDevice?.release();
    }
  }

  /** a pair's scores; EAP-IG's difference corrupted − clean is given where it is on the device */
  async function scorePair(it: Item, how: (typeof METHODS)[number], difference?: DeviceTensor): Promise<Float64Array> {
    const { ex } = it;
    const T = T0(ex);
    const out = new Float64Array(E);
    const src = (data: Float32Array): Tensor => ({ dims: [1, Nf, T, D], data });
    if (how === 'exact') {
      const base = it.mClean;
      for (let first = 0; first < E; first += chunk) {
        const rows = Math.min(chunk, E - first);
        const w = new Float32Array(rows * Nf * Nb);
        for (let r = 0; r < rows; r++) {
          const e = g.edges[first + r];
          w[r * Nf * Nb + e.f * Nb + e.b] = 1;
        }
        const res = await run(Array(rows).fill(ex.clean), {
          logitPositions: [T - 1],
          edges: { subtract: true, weights: { dims: [rows, Nf, Nb], data: w }, source: src(it.corr!) },
        });
        for (let r = 0; r < rows; r++) out[first + r] = M(res.logits, r, ex) - base;
      }
      return out;
    }
    // the EAP-IG methods: rows of weights, one backward each, d = corrupted − clean fed as a fixed
    // difference; the edge's score is Σ_rows grad[u, b] / rows
    const source = difference ?? src(Float32Array.from(it.corr!, (c, i) => c - it.clean![i]));
    const batches = await (igBatches ??= igRows(how));
    const rows = batches.reduce((s, x) => s + x.B, 0);
    const acc = new Float64Array(Nf * Nb);
    for (const { B, weights, gate } of batches) {
      const res = await run(Array(B).fill(ex.clean), {
        logitPositions: [T - 1],
        edges: {
          subtract: false,
          source,
          weights,
          ...(gate ? { gate } : {}),
          sumRows: true, // the rows are one pair's: their sum is what is needed, and no logits
          logits: false,
        },
        grad: { hooks: [], seed: metricSeed(V, B, ex.answer, ex.counterfactual) },
      });
      const gr = res.edgeGrad!.data;
      for (let i = 0; i < Nf * Nb; i++) acc[i] += gr[i];
    }
    g.edges.forEach((e, i) => {
      out[i] = acc[e.f * Nb + e.b] / rows;
    });
    return out;
  }

  /**
   * The EAP-IG methods' rows of weights (and gates) in batches of at most `chunk` rows: the same for
   * every pair, so made once per call and, where the backend keeps values on the device, copied there
   * once and fed to every pair's runs (released after pass 2)
   */
  async function igRows(how: (typeof METHODS)[number]): Promise<IgBatch[]> {
    let weights: Float32Array;
    let gate: Float32Array | undefined;
    let rows: number;
    if (how === 'eap_ig_inputs') {
      // row k: the input's outputs reach every input b as e_clean + (1 − k/m)(e_corr − e_clean)
      rows = m;
      weights = new Float32Array(rows * Nf * Nb);
      for (let k = 0; k < m; k++) weights.fill(1 - k / m, k * Nf * Nb, k * Nf * Nb + Nb);
    } else {
      // row (group, k): the group's outputs set to α clean + (1 − α) corrupted, α = k/m, k = 1..m,
      // as constants (gate 0: no gradient through the group's own computation)
      const lay = g.layout;
      const groups: number[][] = [[0]];
      for (let l = 0; l < lay.nLayers; l++)
        groups.push(
          Array.from({ length: lay.nHeads }, (_, h) => forwardHead(lay, l, h)),
          Array.from({ length: lay.nMlp }, (_, j) => forwardMlp(lay, l, j)),
        );
      rows = groups.length * m;
      weights = new Float32Array(rows * Nf * Nb);
      gate = new Float32Array(rows * Nf).fill(1);
      groups.forEach((grp, gi) => {
        for (let k = 1; k <= m; k++) {
          const r = gi * m + (k - 1);
          for (const f of grp) {
            gate![r * Nf + f] = 0;
            for (let b = 0; b < Nb; b++) if (f < prevIndex(g.layout, b)) weights[r * Nf * Nb + f * Nb + b] = 1 - k / m;
          }
        }
      });
    }
    const out: IgBatch[] = [];
    try {
      for (let first = 0; first < rows; first += chunk) {
        const B = Math.min(chunk, rows - first);
        const w = { dims: [B, Nf, Nb], data: weights.slice(first * Nf * Nb, (first + B) * Nf * Nb) };
        const batch: IgBatch = { B, weights: await model.toDevice(w) };
        out.push(batch);
        if (gate) batch.gate = await model.toDevice({ dims: [B, Nf], data: gate.slice(first * Nf, (first + B) * Nf) });
      }
    } catch (e) {
      out.forEach(releaseBatch);
      throw e;
    }
    return out;
  }

  // ---- pass 3: circuits evaluated, one run per pair with a row per circuit
  const circuits: { key: string; set: Set<number> }[] = [];
  const keyOf = (s: Set<number>) => [...s].sort((a, b) => a - b).join(',');
  const slot = (s: Set<number>) => {
    const key = keyOf(s);
    let i = circuits.findIndex((c) => c.key === key);
    if (i < 0) i = circuits.push({ key, set: s }) - 1;
    return i;
  };
  const plan: { how: Ranking; pct: number; n: number; size: number; slot: number }[] = [];
  if (input.evaluate) {
    for (const how of ['signed', 'abs'] as const) {
      const order = ranking(scores, how);
      for (const pct of MIB_PCTS) {
        const { n: k, circuit } = topCircuit(g, order, pct);
        plan.push({ how, pct, n: k, size: circuit.size, slot: slot(circuit) });
      }
    }
  }
  const given: { source: 'circuit_edges' | 'circuit'; n: number; set: Set<number>; slot: number }[] = [];
  for (const [source, c] of [
    ['circuit_edges', explicit],
    ['circuit', imported?.circuit],
  ] as const) {
    if (!c) continue;
    const pruned = prune(g, c);
    given.push({ source, n: c.size, set: pruned, slot: slot(pruned) });
  }
  const circuitMetric = new Float64Array(circuits.length);
  if (circuits.length) {
    if (input.evaluate && !(Math.abs(mClean - mCorr) > 1e-9))
      throw new LoupeError(
        'BAD_INPUT',
        `The mean metric is the same on the clean and the corrupted runs (${mClean}), so faithfulness is undefined.`,
        'Use pairs whose corruption changes the logit difference.',
      );
    const C = circuits.length;
    const w = new Float32Array(C * Nf * Nb);
    circuits.forEach((c, i) => patchWeights(g, (e) => c.set.has(e), w.subarray(i * Nf * Nb, (i + 1) * Nf * Nb)));
    progress('evaluating circuits', 0, n);
    let done = 0;
    for (const it of items) {
      const T = T0(it.ex);
      for (let first = 0; first < C; first += chunk) {
        const B = Math.min(chunk, C - first);
        const res = await run(Array(B).fill(it.ex.clean), {
          logitPositions: [T - 1],
          edges: {
            subtract: true,
            source: { dims: [1, Nf, T, D], data: it.corr! },
            weights: { dims: [B, Nf, Nb], data: w.subarray(first * Nf * Nb, (first + B) * Nf * Nb) },
          },
        });
        for (let r = 0; r < B; r++) circuitMetric[first + r] += M(res.logits, r, it.ex) / n;
      }
      progress('evaluating circuits', ++done, n);
    }
  }
  const faith = (x: number) => finite((x - mCorr) / (mClean - mCorr));
  const rankingOf = (how: Ranking) => {
    const curve = plan
      .filter((p) => p.how === how)
      .map((p) => ({
        pct: p.pct,
        n: p.n,
        n_after_prune: p.size,
        metric: finite(circuitMetric[p.slot]),
        faithfulness: faith(circuitMetric[p.slot]),
      }));
    return { ...areas(curve), curve };
  };

  const first = items[0].ex;
  const forwardEquivalents = (cost.forward_rows + 2 * cost.gradient_rows) / n;
  const qkvOf = (input: string) => (/<([qkv])>$/.exec(input)?.[1] as 'q' | 'k' | 'v' | undefined) ?? null;
  const inputSum = g.edges.reduce((s, e, i) => (e.upstream === 'input' ? s + scores[i] : s), 0);
  let mib = null;
  if (input.mib_export) {
    const order = ranking(scores, input.mib_export.absolute ? 'abs' : 'signed');
    mib = toMibGraph(
      g,
      { ...edgeShapeOf(model.info), d_model: model.info.d_model },
      scores,
      prune(g, new Set(order.slice(0, input.mib_export.top_n))),
    );
  }
  return {
    ...documentHead('edge_attribution', model, model.decode(first.clean), first.clean),
    method,
    ig_steps: method === 'eap_ig_inputs' || method === 'eap_ig_activations' ? m : null,
    description: describeMethod(method, m, n, g.layout.experts > 0),
    metric: 'logit_difference' as const,
    dataset: ds.report,
    graph_cfg: { ...edgeShapeOf(model.info), d_model: model.info.d_model },
    n_edges: E,
    n_nodes: Nf + 1,
    m_clean: finite(mClean),
    m_corrupted: finite(mCorr),
    edges: g.edges.map((e, i) => ({
      name: e.name,
      upstream: e.upstream,
      downstream: e.downstream,
      qkv: qkvOf(e.input),
      score: finite(scores[i]),
      ci_low: adjusted ? finite(adjusted[i].ci_low) : null,
      ci_high: adjusted ? finite(adjusted[i].ci_high) : null,
      p_value: adjusted ? adjusted[i].p_value : null,
      p_holm: adjusted ? adjusted[i].p_holm : null,
      p_bh: adjusted ? adjusted[i].p_bh : null,
      ...(input.per_example && !imported ? { per_example: perExample.map((p) => finite(p[i])) } : {}),
    })),
    statistics: stats ? stats.block(E) : null,
    warnings: [...gapWarnings(mClean, mCorr), ...memoryWarnings],
    completeness:
      method === 'eap_ig_inputs'
        ? { input_scores: finite(inputSum), target: finite(mCorr - mClean), error: finite(inputSum - (mCorr - mClean)) }
        : null,
    evaluation: input.evaluate
      ? { signed: rankingOf('signed'), abs: rankingOf('abs'), m_full: mClean, m_empty: mCorr }
      : null,
    circuit_evaluation: given.map((c) => ({
      source: c.source,
      n_edges: c.n,
      n_after_prune: c.set.size,
      metric: finite(circuitMetric[c.slot]),
      faithfulness: faith(circuitMetric[c.slot]),
    })),
    mib_graph: mib,
    cost: { forward_equivalents: forwardEquivalents, ...cost },
  };
});

/** `circuit` as given: the file's object, or its JSON text (the CLI's --circuit FILE, a pasted file) */
function parseCircuit(c: unknown): unknown {
  if (typeof c !== 'string') return c;
  try {
    return JSON.parse(c);
  } catch (e) {
    throw new LoupeError(
      'BAD_INPUT',
      `circuit is not JSON: ${(e as Error).message}.`,
      'Give the Graph.to_json file (MIB’s circuit format).',
    );
  }
}

function describeMethod(method: string, m: number, n: number, moe: boolean): string {
  const what: Record<string, string> = {
    eap: 'EAP: score(u→b) = Σ_{pos,d} (a_u(corrupted) − a_u(clean)) · ∂M/∂x_b, the gradient of the clean run (one backward)',
    eap_ig_inputs:
      `EAP-IG (inputs): Σ (a_u(corrupted) − a_u(clean)) · (1/${m}) Σ_k ∂M/∂x_b at a ` +
      `run whose token embedding is e_corr + (k/${m})(e_clean − e_corr), ` +
      `k = 0 … ${m - 1} (EAP-IG's current left Riemann sum; the 2024 paper's code used k = 1 … m)`,
    eap_ig_activations:
      `EAP-IG (activations): for each group (input, each layer's heads, each MLP) and k = 1 … ${m}, ` +
      `that group's output set to (k/${m}) clean + (1 − k/${m}) corrupted as a constant; Σ (a_u(corrupted) ` +
      `− a_u(clean)) · ∂M/∂x_b summed over every run into every edge, divided by ${m}·(2L+1)`,
    exact: 'exact: M(clean run with only that edge delivering its upstream node’s corrupted output) − M(clean)',
    imported: 'scores imported from a Graph.to_json circuit (MIB’s convention −ΔM, negated here)',
  };
  return (
    `${what[method]}; mean over ${n} pairs. M = logit[answer] − logit[counterfactual] at the last position (raw logits). ` +
    'A score estimates ΔM when that edge alone is patched to the corrupted run, so an important edge scores large negative (MIB stores −score). ' +
    'Nodes: input = hook_embed (positions are the same in both runs), a{l}.h{h} = z_h·W_O[h] without b_O, ' +
    "m{l} = hook_mlp_out; each head's q, k, v input is its own copy of the residual stream before " +
    "ln1 (grouped-query k/v counted per query head, as TransformerLens's ungrouping does). " +
    (moe
      ? 'Mixture-of-experts layers: m{l}.e{e} = experts.{e}.hook_out (routing-weighted), its <in> the ' +
        'stream its MLP reads and <router> the one the router reads to weigh it; m{l}.shared the shared expert. '
      : '') +
    'Faithfulness (evaluate): a circuit C = the top int(pct·E) edges, pruned; ' +
    'in a clean run every edge not in C delivers its upstream node’s corrupted output; f = (M(C) ' +
    '− M(corrupted)) / (M(clean) − M(corrupted)) with dataset means; CPR = trapezoid area of ' +
    'f over pct (signed ranking), CMD = of |1 − f| (|score| ranking), as MIB reports them.'
  );
}
