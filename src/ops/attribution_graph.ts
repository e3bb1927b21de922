/**
 * attribution_graph — circuit-tracer's attribution graph of one prediction, computed on this
 * machine (decoderesearch/circuit-tracer 4bb8c0e: attribution/attribute_transformerlens.py,
 * graph.py, utils/create_graph_files.py, frontend/graph_models.py).
 *
 * The local replacement model (engine/replacement.ts) freezes attention patterns and norm scales
 * at the clean run and replaces every MLP by a transcoder set plus a frozen error node; the edges
 * A[target, source] are the direct effects in it, one row per target from the frozen backward
 * graph (engine/graph/replacement.ts), a batch of targets per run. Then circuit-tracer's node
 * selection (max_feature_nodes by partial influence), prune_graph, its two scores and its graph
 * JSON (lib/attribution-graph.ts), which Neuronpedia's graph upload and circuit-tracer's viewer read.
 */
import { z } from 'zod';
import { defineOperation } from './types';
import { documentBase, documentHead } from '../schema/common';
import { LoupeError, throwIfAborted } from '../engine/errors';
import type { LoadedModel, ReplacementTarget, TranscoderInfo } from '../engine/api';
import { CAPS } from '../engine/caps';
import { softmax } from './lib/math';
import { inputIds, promptOrIdsFields } from './lib/ablation';
import {
  inputReplacement,
  transcoderBlockSchema,
  transcoderDescriptionsSchema,
  transcoderLabels,
  transcoderRefFields,
} from './lib/transcoders';
import {
  errorMass,
  finishPrune,
  graphJson,
  graphNode,
  graphScores,
  nodeMaskOf,
  partialInfluences,
  pruneGraph,
  type Adjacency,
  type NodeKind,
  type PruneResult,
} from './lib/attribution-graph';

const fraction = (what: string) => z.number().min(0).max(1).describe(what);

export const attributionGraphInput = z.object({
  ...promptOrIdsFields,
  ...transcoderRefFields,
  max_feature_nodes: z
    .number()
    .int()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      "Feature rows (and feature nodes) to compute, chosen by circuit-tracer's partial " +
        'influence (re-ranked every update_interval batches of batch_size); ' +
        "null = every active feature (circuit-tracer's attribute() default; its CLI uses 7500).",
    ),
  max_n_logits: z.number().int().min(1).max(1000).default(10).describe('Most logit nodes.'),
  desired_logit_prob: fraction('Logit nodes are added by probability until their sum reaches this.').default(0.95),
  batch_size: z
    .number()
    .int()
    .min(1)
    .max(65536)
    .default(512)
    .describe(
      "circuit-tracer's batch_size: targets per batch of its schedule (only the choice " +
        'of rows under max_feature_nodes depends on it; the engine runs its own batches).',
    ),
  update_interval: z
    .number()
    .int()
    .min(1)
    .max(1000)
    .default(4)
    .describe('Batches between re-rankings by partial influence (circuit-tracer update_interval).'),
  node_threshold: fraction('prune_graph: keep the nodes holding this fraction of the influence.').default(0.8),
  edge_threshold: fraction('prune_graph: keep the edges holding this fraction of the edge influence.').default(0.98),
  slug: z
    .string()
    .min(1)
    .max(200)
    .default('loupe-graph')
    .describe("The graph JSON's metadata.slug (its name in Neuronpedia's and circuit-tracer's viewers)."),
  scan: z
    .string()
    .min(1)
    .optional()
    .describe("The graph JSON's metadata.scan; default the set's config.yaml scan, else its source and path."),
  full_adjacency: z
    .boolean()
    .default(false)
    .describe(
      'Also return the unpruned adjacency: its nodes (id and type) and its nonzero entries [target, source, weight].',
    ),
});
export type AttributionGraphInput = z.input<typeof attributionGraphInput>;

const graphNodeSchema = z.object({
  node_id: z.string(),
  feature: z.number().int(),
  layer: z.string(),
  ctx_idx: z.number().int(),
  feature_type: z.enum(['cross layer transcoder', 'mlp reconstruction error', 'embedding', 'logit']),
  token_prob: z.number(),
  is_target_logit: z.boolean(),
  run_idx: z.number().int(),
  reverse_ctx_idx: z.number().int(),
  jsNodeId: z.string(),
  clerp: z.string(),
  influence: z.number().nullable().describe("the cumulative influence fraction at this node's rank: small = important"),
  activation: z.number().nullable(),
});

export const graphJsonSchema = z.object({
  metadata: z.object({
    slug: z.string(),
    scan: z.string(),
    transcoder_list: z.array(z.string()),
    prompt_tokens: z.array(z.string()),
    prompt: z.string(),
    node_threshold: z.number().nullable(),
    schema_version: z.number().int(),
  }),
  qParams: z.object({
    pinnedIds: z.array(z.string()),
    supernodes: z.array(z.array(z.string())).describe('each supernode: its name, then its member node ids'),
    linkType: z.string(),
    clickedId: z.string(),
    sg_pos: z.string(),
  }),
  nodes: z.array(graphNodeSchema),
  links: z.array(z.object({ source: z.string(), target: z.string(), weight: z.number() })),
});

export const attributionGraphOutput = documentBase('attribution_graph').extend({
  method: z.string().describe('exactly what was computed'),
  transcoders: transcoderBlockSchema,
  // default: documents made before the labels (a link, a stored session) still read
  descriptions: transcoderDescriptionsSchema
    .nullable()
    .default(null)
    .describe("where the feature nodes' clerp labels came from (the set's explanations), null in older documents"),
  graph: graphJsonSchema.describe(
    "The pruned graph in circuit-tracer's and Neuronpedia's JSON (create_graph_files.py), exportable and uploadable as is.",
  ),
  link_nodes: z
    .array(z.tuple([z.number().int(), z.number().int()]))
    .describe(
      "each link's [source, target] as indices into graph.nodes (a layer-0 feature and an error node can share an id)",
    ),
  scores: z.object({
    replacement: z.number().describe('token influence / (token + error influence), on the unpruned graph'),
    completeness: z.number().describe('the influence-weighted fraction of node inputs not from error nodes'),
  }),
  active_features: z.number().int().describe('features active at positions ≥ 1'),
  selected_features: z.number().int().describe('feature nodes of the graph (all active ones, or max_feature_nodes)'),
  logit_nodes: z.array(z.object({ token: z.number().int(), text: z.string(), prob: z.number() })),
  pruning: z.object({
    node_threshold: z.number(),
    edge_threshold: z.number(),
    node_score_threshold: z.number().describe('the node influence the node threshold became'),
    edge_score_threshold: z.number().describe('the edge score the edge threshold became'),
    nodes: z.number().int().describe('nodes in the JSON'),
    links: z.number().int(),
  }),
  adjacency: z
    .object({
      nodes: z
        .array(z.object({ node_id: z.string(), feature_type: z.string() }))
        .describe(
          "circuit-tracer's node order: features by (layer, position, feature), " +
            'errors (l·T + p), tokens, logits; a layer-0 feature and an error may share an id',
        ),
      entries: z
        .array(z.tuple([z.number().int(), z.number().int(), z.number()]))
        .describe('[target index, source index, weight]'),
    })
    .nullable(),
  cost: z.object({
    forward_equivalents: z
      .number()
      .describe(
        'the multiply-adds of this graph (the forward, encoding, every backward row and its readouts) ÷ those of one forward of the prompt',
      ),
    backward_rows: z.number().int(),
    runs: z.number().int().describe('runs of the frozen backward graph'),
    batch: z.number().int().describe('rows per run'),
    wall_ms: z.number(),
    rows_ms: z.number().describe('time in the frozen backward runs'),
    forward_ms: z.number().describe('one forward of the prompt, timed after the graph'),
  }),
});

/** multiply-adds ×2 of one forward of T tokens, every position unembedded */
function forwardFlops(i: LoadedModel['info'], T: number): number {
  const { d_model: D, n_heads: H, n_kv_heads: Hkv, d_head: Dh, d_mlp: M, d_vocab: V, n_layers: L } = i;
  const gated = i.architecture !== 'gpt2' && i.architecture !== 'gpt_neox';
  const layer =
    2 * T * D * (H + 2 * Hkv) * Dh + 4 * H * T * T * Dh + 2 * T * H * Dh * D + 2 * T * D * M * (gated ? 3 : 2);
  return L * layer + 2 * T * D * V;
}

/** ×2 multiply-adds of one frozen backward row and of its source readouts */
function backwardRowFlops(i: LoadedModel['info'], T: number, tc: TranscoderInfo, decoderEntries: number): number {
  const { d_model: D, n_heads: H, n_kv_heads: Hkv, d_head: Dh, n_layers: L } = i;
  const layer =
    2 * T * D * H * Dh + 2 * H * T * T * Dh + 2 * T * Hkv * Dh * D + (tc.skip ? 2 * T * D * D : 0) + 2 * T * D;
  return L * layer + 2 * T * D + 2 * decoderEntries * D;
}

export const operation = defineOperation({
  name: 'attribution_graph',
  title: 'Attribution graph',
  description:
    "circuit-tracer's attribution graph of the prediction at the last position, on this machine: " +
    "each MLP replaced by a transcoder set (circuit-tracer's PLT or CLT layout, Gemma Scope 2 files, " +
    'SAELens transcoders) with a frozen error node, attention patterns and norm scales frozen at the clean run; ' +
    'nodes are the active features (position 0 excluded), one error per layer and position, the tokens, ' +
    'and the top logits (by probability up to desired_logit_prob, at most max_n_logits); an edge A[target, ' +
    'source] is the direct effect u_tᵀJv_s in that frozen model (feature targets: the encoder row at the ' +
    'feature-input hook, i.e. pre-activation without b_enc; logit targets: the demeaned unembedding at the final ' +
    "norm's output). Pruned exactly as circuit-tracer's graph.py (node_threshold 0.8, edge_threshold 0.98), " +
    "with its replacement and completeness scores; `graph` is circuit-tracer's / Neuronpedia's graph JSON. Cost: " +
    'one forward, the encoders, and one frozen backward row per logit and feature node (cost.forward_equivalents ' +
    'says how much).',
  input: attributionGraphInput,
  output: attributionGraphOutput,
  long: true,
}).implement(async (model, input, ctx) => {
  const t0 = Date.now();
  const { ids, prompt } = inputIds(model, input);
  const { info, rep, block } = await inputReplacement(model, input, ids, ctx);
  const report = (stage: string, done: number, total: number) => ctx.onProgress?.({ stage, done, total });
  const before = { ...rep.stats };
  const T = ids.length;
  const L = model.info.n_layers;
  const nAct = rep.features.layer.length;
  const S = rep.nSources;

  // logit nodes (targets.py _from_salient)
  const probs = softmax(rep.lastLogits);
  const top = Array.from({ length: probs.length }, (_, v) => v)
    .sort((a, b) => probs[b] - probs[a] || a - b)
    .slice(0, Math.min(input.max_n_logits, probs.length));
  let cum = 0,
    cutoff = top.length;
  for (let i = 0; i < top.length; i++) {
    cum += probs[top[i]];
    if (cum >= input.desired_logit_prob) {
      cutoff = i + 1;
      break;
    }
  }
  const logits = top.slice(0, cutoff).map((token) => ({ token, text: model.decode([token]), prob: probs[token] }));
  const nLog = logits.length;
  const total = S + nLog; // every node while rows are chosen: all features, errors, tokens, logits
  const maxFeat = Math.min(input.max_feature_nodes ?? nAct, nAct);
  const rowBytes = (maxFeat + nLog) * total * 4;
  if (rowBytes > CAPS.maxAdjacencyBytes) {
    const fit = Math.max(0, Math.floor(CAPS.maxAdjacencyBytes / 4 / total) - nLog);
    throw new LoupeError(
      'TOO_LARGE',
      `The adjacency rows of ${maxFeat} features and ${nLog} logits over ${total} ` +
        `nodes take ${(rowBytes / 1024 ** 3).toFixed(2)} GiB as float32, ` +
        `more than the cap of ${(CAPS.maxAdjacencyBytes / 1024 ** 3).toFixed(2)} GiB.`,
      fit > 0
        ? `Set max_feature_nodes to at most ${fit}, or shorten the prompt.`
        : 'Shorten the prompt or use a sparser transcoder set.',
      { max_feature_nodes: fit, active_features: nAct },
    );
  }
  /** every row in JS memory (the CPU and WASM paths, and max_feature_nodes): the adjacency over the selected features */
  async function adjacencyRows(): Promise<{ A: Adjacency; selected: number[] }> {
    const widen = (r: Float32Array) => {
      const out = new Float32Array(total);
      out.set(r);
      return out;
    };
    const rowsOf = async (targets: ReplacementTarget[], stage: string, done0: number, all: number) => {
      const flat = await rep.rows(targets, {
        signal: ctx.signal,
        onRows: (d) => report(stage, done0 + d, all),
      });
      return targets.map((_, k) => widen(flat.subarray(k * S, (k + 1) * S)));
    };

    // Phase 3: logit rows; Phase 4: feature rows, all or by partial influence
    const logitRows = await rowsOf(
      logits.map((l) => ({ kind: 'logit', token: l.token })),
      'logit rows',
      0,
      nLog,
    );
    const featRows = new Map<number, Float32Array>();
    const rowList: Float32Array[] = [...logitRows];
    const rowNode: number[] = logits.map((_, i) => S + i);
    const visited = new Uint8Array(nAct);
    let nVisited = 0;
    while (nVisited < maxFeat) {
      throwIfAborted(ctx.signal);
      let pending: number[];
      if (maxFeat === nAct) pending = Array.from({ length: nAct }, (_, i) => i);
      else {
        report('ranking features by partial influence', nVisited, maxFeat);
        const inf = partialInfluences(
          rowList,
          rowNode,
          total,
          logits.map((l) => l.prob),
        );
        const rank = Array.from({ length: nAct }, (_, i) => i).sort((a, b) => inf[b] - inf[a] || a - b);
        const queue = Math.min(input.update_interval * input.batch_size, maxFeat - nVisited);
        pending = rank.filter((i) => !visited[i]).slice(0, queue);
      }
      const rows = await rowsOf(
        pending.map((index) => ({ kind: 'feature', index })),
        'feature rows',
        nVisited,
        maxFeat,
      );
      pending.forEach((i, k) => {
        visited[i] = 1;
        featRows.set(i, rows[k]);
        rowList.push(rows[k]);
        rowNode.push(i);
      });
      nVisited += pending.length;
    }
    rowList.length = 0;

    // the graph over the selected features: columns restricted, rows in node order (Phase 5)
    const selected = Array.from({ length: nAct }, (_, i) => i).filter((i) => visited[i]);
    const nSel = selected.length;
    const N = nSel + L * T + T + nLog;
    const cols = Int32Array.from({ length: N }, (_, j) => (j < nSel ? selected[j] : nAct + (j - nSel)));
    const restrict = (r: Float32Array) => {
      if (nSel === nAct) return r.subarray(0, N); // every feature kept: the columns are the same
      const out = new Float32Array(N);
      for (let j = 0; j < N; j++) out[j] = r[cols[j]];
      return out;
    };
    const A: Adjacency = {
      N,
      rows: [
        ...selected.map((i) => restrict(featRows.get(i)!)),
        ...Array.from({ length: L * T + T }, () => null),
        ...logitRows.map(restrict),
      ],
    };
    featRows.clear();
    return { A, selected };
  }
  // on the device (WebGPU): every feature's row; only the influence and the edges above the threshold come back
  let nodeThr = 0;
  let mask: Uint8Array = new Uint8Array(0);
  let chosen = 0;
  const seen = new Uint8Array(nAct);
  const d =
    rep.pruneOnDevice && !input.full_adjacency
      ? await rep.pruneOnDevice({
          logits: logits.map((l) => ({ token: l.token, prob: l.prob })),
          maxFeatures: maxFeat,
          // circuit-tracer's schedule, as adjacencyRows: every feature, or by partial influence over the rows so far
          next: async (partial) => {
            if (chosen >= maxFeat) return [];
            throwIfAborted(ctx.signal);
            let pending = Array.from({ length: nAct }, (_, i) => i);
            if (maxFeat < nAct) {
              report('ranking features by partial influence', chosen, maxFeat);
              const inf = await partial();
              const queue = Math.min(input.update_interval * input.batch_size, maxFeat - chosen);
              pending = pending
                .sort((a, b) => inf[b] - inf[a] || a - b)
                .filter((i) => !seen[i])
                .slice(0, queue);
            }
            pending.forEach((i) => (seen[i] = 1));
            chosen += pending.length;
            return pending;
          },
          nodeMask: (inf) => {
            const full = new Float64Array(inf.length + nLog);
            full.set(inf);
            const m = nodeMaskOf(full, T, nLog, input.node_threshold);
            nodeThr = m.threshold;
            mask = m.mask;
            return mask.subarray(0, inf.length);
          },
          edgeThreshold: input.edge_threshold,
          signal: ctx.signal,
          onRows: (done, all) => report('rows on the device', done, all),
        })
      : null;
  const device = d !== null;
  const host = device ? null : await adjacencyRows();
  const selected = host?.selected ?? Array.from(d!.selected);
  const nSel = selected.length;
  const N = nSel + L * T + T + nLog;
  const kinds: NodeKind[] = [
    ...selected.map((i): NodeKind => ({
      kind: 'feature',
      layer: rep.features.layer[i],
      pos: rep.features.position[i],
      feature: rep.features.feature[i],
      activation: rep.features.activation[i],
    })),
    ...Array.from({ length: L * T }, (_, k): NodeKind => ({ kind: 'error', layer: Math.floor(k / T), pos: k % T })),
    ...ids.map((token, pos): NodeKind => ({ kind: 'token', pos, token })),
    ...logits.map((l, rank): NodeKind => ({ kind: 'logit', token: l.token, text: l.text, prob: l.prob, rank })),
  ];
  const w = new Float64Array(N);
  logits.forEach((l, i) => (w[N - nLog + i] = l.prob));
  let pruned: { pr: PruneResult; A: Adjacency | null; errors: ArrayLike<number> } | null = null;
  if (d) {
    const Sel = N - nLog; // the sources over the selected features
    const node = (r: number) => (r < nSel ? r : Sel + r - nSel);
    const errors = new Float64Array(N);
    d.errorMass.forEach((x, r) => (errors[node(r)] = x));
    const influence = new Float64Array(N);
    influence.set(d.influence);
    if (d.edges) {
      const e = d.edges;
      const order = Array.from(e.row, (_, k) => k).sort(
        (x, y) => node(e.row[x]) - node(e.row[y]) || e.source[x] - e.source[y],
      );
      const edges = {
        target: Int32Array.from(order, (k) => node(e.row[k])),
        source: Int32Array.from(order, (k) => e.source[k]),
        weight: Float32Array.from(order, (k) => e.weight[k]),
      };
      report('pruning', 0, 1);
      const pr = finishPrune(influence, mask, edges, { node: nodeThr, edge: d.edgeScoreThreshold }, nSel, T, nLog);
      pruned = { pr, A: null, errors };
    } else {
      // every entry kept (an edge threshold of 0): the rows came back, pruned here
      const rows = d.rows!;
      const row = (r: number) => {
        const out = new Float32Array(N);
        out.set(rows.subarray(r * Sel, (r + 1) * Sel));
        return out;
      };
      const A: Adjacency = {
        N,
        rows: [
          ...Array.from({ length: nSel }, (_, r) => row(r)),
          ...Array.from({ length: L * T + T }, () => null),
          ...logits.map((_, i) => row(nSel + i)),
        ],
      };
      report('pruning', 0, 1);
      const pr = pruneGraph(A, w, nSel, T, nLog, input.node_threshold, input.edge_threshold, ctx.signal);
      pruned = { pr, A, errors: errorMass(pr.sparse, nSel, L, T) };
    }
  } else {
    const A = host!.A;
    report('pruning', 0, 1);
    const pr = pruneGraph(A, w, nSel, T, nLog, input.node_threshold, input.edge_threshold, ctx.signal);
    pruned = { pr, A, errors: errorMass(pr.sparse, nSel, L, T) };
  }
  const { pr, A } = pruned;
  const scores = graphScores(pr.nodeInfluence, w, pruned.errors, nSel, L, T);
  const { graph, linkNodes } = graphJson(kinds, pr, {
    slug: input.slug,
    scan: input.scan ?? info.scan,
    promptTokens: ids.map((t) => model.decode([t])),
    prompt: model.decode(ids),
    nodeThreshold: input.node_threshold,
    nLayers: L,
    T,
  });

  // feature labels (circuit-tracer's clerp) from the set's explanations, when it carries them
  const labels = await transcoderLabels(
    model,
    info,
    { source: input.transcoder_source, path: input.transcoder_path },
    ctx,
  );
  for (const n of graph.nodes)
    if (n.feature_type === 'cross layer transcoder') {
      const [layer, feature] = n.node_id.split('_').map(Number);
      n.clerp = labels.label(layer, feature) ?? '';
    }

  let adjacency: z.input<typeof attributionGraphOutput>['adjacency'] = null;
  if (input.full_adjacency && A) {
    const entries: [number, number, number][] = [];
    A.rows.forEach((r, t) => {
      if (r) for (let s = 0; s < N; s++) if (r[s] !== 0) entries.push([t, s, r[s]]);
    });
    if (entries.length * 3 > CAPS.maxDocumentNumbers)
      throw new LoupeError(
        'TOO_LARGE',
        `The unpruned adjacency has ${entries.length.toLocaleString('en-US')} nonzero entries, ` +
          `more than a document carries (${Math.floor(CAPS.maxDocumentNumbers / 3).toLocaleString('en-US')}).`,
        'Leave full_adjacency off, or set a smaller max_feature_nodes.',
      );
    adjacency = {
      nodes: kinds.map((k) => {
        const n = graphNode(k, L, T, null);
        return { node_id: n.node_id, feature_type: n.feature_type };
      }),
      entries,
    };
  }

  // cost: multiply-adds ÷ one forward's, and the wall time beside one timed forward
  const wall = Date.now() - t0;
  const tf = Date.now();
  await model.run(ids, { signal: ctx.signal });
  const forwardMs = Date.now() - tf;
  const fwd = forwardFlops(model.info, T);
  const perLayer = Array.from({ length: L }, (_, l) => rep.features.layer.filter((x) => x === l).length);
  const decEntries = info.kind === 'plt' ? nAct : perLayer.reduce((s, n, l) => s + n * (L - l), 0);
  const encode = 2 * T * info.d_transcoder * info.d_model * L;
  const rows = rep.stats.rows - before.rows;
  const flops = fwd + encode + rows * backwardRowFlops(model.info, T, info, decEntries);

  return {
    ...documentHead('attribution_graph', model, prompt, ids),
    method:
      "circuit-tracer's attribution (attribute_transformerlens.py) in the local replacement model: " +
      'patterns and norm scales frozen, MLPs cut except the transcoder skip, error nodes frozen; ' +
      'rows by the frozen backward graph, float32; pruning and scores as graph.py ' +
      (device
        ? '(on the device: the rows kept there, influence, edge scores and thresholds in float32; the node threshold, ' +
          "the fixpoint and the scores' sums in float64 here)"
        : '(arithmetic in float64)'),
    transcoders: block,
    descriptions: labels.block,
    graph,
    link_nodes: linkNodes,
    scores,
    active_features: nAct,
    selected_features: nSel,
    logit_nodes: logits.map((l) => ({ ...l, prob: Math.fround(l.prob) })),
    pruning: {
      node_threshold: input.node_threshold,
      edge_threshold: input.edge_threshold,
      node_score_threshold: pr.thresholds.node,
      edge_score_threshold: pr.thresholds.edge,
      nodes: graph.nodes.length,
      links: graph.links.length,
    },
    adjacency,
    cost: {
      forward_equivalents: flops / fwd,
      backward_rows: rows,
      runs: rep.stats.runs - before.runs,
      batch: rep.stats.batch,
      wall_ms: wall,
      rows_ms: rep.stats.run_ms - before.run_ms,
      forward_ms: forwardMs,
    },
  };
});
