// attribution_graph against the float64 oracle (tests/reference/attribution64.ts, which shares no
// code with src/): on both shared models, with random transcoder sets in circuit-tracer's PLT
// layout (with skip; and without, at the other input hooks and activations) and CLT layout, every
// adjacency entry, the node order, the pruned node set and links, and both scores; columns against
// finite differences in the frozen model (forward64 with the freezes as hook replacements); row
// sums + the oracle's constant part = the clean run's target values; the graph JSON against
// Neuronpedia's graph schema (tests/fixtures, as published).

import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { readFileSync } from 'node:fs';
import Ajv from 'ajv';
import type { LoadedModel } from '../src/engine/api';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import { operation } from '../src/ops/attribution_graph';
import { operation as intervention } from '../src/ops/feature_intervention';
import type { OpContext } from '../src/ops/types';
import { useSharedModels } from './helpers/shared-models';
import { loadModelDir, type RefModel } from './reference';
import { loadModelNode } from '../src/node/load';
import { SHARED } from './helpers/shared';
import * as path from 'node:path';
import {
  cleanState,
  frozenDifference,
  referenceAttribution,
  referenceIntervention,
  type RefAttribution,
} from './reference/attribution64';
import {
  makeRandomTranscoders,
  type RandomTranscoderOptions,
  type RandomTranscoderSet,
} from './helpers/random-transcoders';

/**
 * Neuronpedia's graph schema as published (tests/fixtures/README.md: hijohnnylin/neuronpedia @
 * b8efe8435ea59592690f3d39dc3479b0d4e337c0, apps/webapp/app/api/graph/graph-schema.json, draft-07).
 * ajv runs with strict off because the file carries keywords ajv does not define (`version`).
 */
const NEURONPEDIA_GRAPH_SCHEMA = JSON.parse(
  readFileSync(new URL('./fixtures/neuronpedia-graph-schema.json', import.meta.url), 'utf8'),
);

type Variant = Pick<RandomTranscoderOptions, 'skip' | 'activation' | 'inputHook'>;

const KIND: Record<string, string> = {
  'cross layer transcoder': 'feature',
  'mlp reconstruction error': 'error',
  embedding: 'token',
  logit: 'logit',
};

/** the oracle's JSON node set and links: prune_graph's masks, then create_used_nodes_and_edges (which keeps a node whose id is on a used link) */
function referenceJson(r: RefAttribution) {
  const N = r.nodes.length;
  const links: string[] = [];
  const used = new Set<string>();
  for (let t = 0; t < N; t++)
    for (let s = 0; s < N; s++)
      if (r.edgeMask[t * N + s] && r.nodeMask[t] && r.nodeMask[s]) {
        used.add(r.nodes[t].node_id);
        used.add(r.nodes[s].node_id);
        links.push(`${r.nodes[s].node_id}>${r.nodes[t].node_id}`);
      }
  const nodes = r.nodes
    .filter((n, i) => r.nodeMask[i] && (used.has(n.node_id) || n.kind === 'token' || n.kind === 'logit'))
    .map((n) => `${n.kind}:${n.node_id}`);
  return { nodes, links };
}

const TOKENS = {
  gpt2: [256, 10, 20, 30, 40, 10, 20, 30],
  stories: [1, 300, 301, 302, 40, 300, 301, 302, 40],
};

const sets: RandomTranscoderSet[] = [];

/** a random transcoder set calibrated to the model's feature inputs on `tokens` (about 6 active per position) */
function setFor(ref: RefModel, tokens: number[], kind: 'plt' | 'clt', variant: Variant = {}) {
  const L = ref.config.n_layer ?? ref.config.num_hidden_layers;
  const D = ref.config.n_embd ?? ref.config.hidden_size;
  const opts = { kind, nLayers: L, dModel: D, features: 96, skip: kind === 'plt', ...variant } as const;
  const probe = makeRandomTranscoders(opts);
  const calibrate = cleanState(ref, tokens, probe.ref).xin;
  probe.cleanup();
  const tc = makeRandomTranscoders({ ...opts, calibrate, l0: 6 });
  sets.push(tc);
  return tc;
}

describe('attribution_graph against the float64 oracle', () => {
  let models: { gpt2: LoadedModel; stories: LoadedModel; gpt2Ref: RefModel; storiesRef: RefModel };
  useSharedModels((m) => (models = m));
  const loaders = createNodeSaeLoaders({ cache: false });
  const ctx: OpContext = { loadTranscoders: loaders.loadTranscoders };
  afterAll(() => sets.splice(0).forEach((s) => s.cleanup()));

  const cases: [string, 'gpt2' | 'stories', 'plt' | 'clt', Variant][] = [
    ['induction-gpt2', 'gpt2', 'plt', {}],
    ['induction-gpt2', 'gpt2', 'clt', {}],
    ['stories260K', 'stories', 'plt', {}],
    ['stories260K', 'stories', 'clt', {}],
    // PLTs without the skip, at the other input hooks and activations (LayerNorm and RMSNorm)
    ['induction-gpt2', 'gpt2', 'plt', { skip: false, activation: 'relu', inputHook: 'hook_resid_mid' }],
    ['stories260K', 'stories', 'plt', { skip: false, activation: 'topk', inputHook: 'ln2.hook_normalized' }],
    ['induction-gpt2', 'gpt2', 'plt', { skip: false, inputHook: 'ln2.hook_normalized' }],
  ];

  it.each(cases)(
    '%s, %s %s %o: adjacency, node set, scores, finite differences, row sums, JSON schema',
    async (_n, which, kind, variant) => {
      const model = models[which];
      const ref = which === 'gpt2' ? models.gpt2Ref : models.storiesRef;
      const tokens = TOKENS[which];
      const tc = setFor(ref, tokens, kind, variant);
      const r = referenceAttribution(ref, tokens, tc.ref);
      const doc = await operation.run(
        model,
        {
          prompt: '',
          token_ids: tokens,
          transcoder_source: tc.dir,
          full_adjacency: true,
          slug: `test-${which}-${kind}`,
        },
        ctx,
      );
      const N = r.nodes.length;
      expect(doc.transcoders.kind).toBe(kind);
      expect(doc.transcoders.skip).toBe(variant.skip ?? kind === 'plt');
      expect(doc.active_features).toBe(r.active.length);
      expect(doc.active_features).toBeGreaterThan(40);
      expect(doc.logit_nodes.map((l) => l.token)).toEqual(r.logits.map((l) => l.token));

      // the adjacency: node ids and types in circuit-tracer's order, every entry within 1e-4
      const adj = doc.adjacency!;
      expect(adj.nodes.map((n) => `${KIND[n.feature_type]}:${n.node_id}`)).toEqual(
        r.nodes.map((n) => `${n.kind}:${n.node_id}`),
      );
      const A = new Float64Array(N * N);
      for (const [t, s, w] of adj.entries) A[t * N + s] = w;
      let worst = 0,
        big = 0;
      for (let k = 0; k < N * N; k++) {
        worst = Math.max(worst, Math.abs(A[k] - r.adjacency[k]));
        big = Math.max(big, Math.abs(r.adjacency[k]));
      }
      expect(worst).toBeLessThan(1e-4);
      expect(big).toBeGreaterThan(1);

      // the operation's rows are the frozen model's: finite differences and row sums + constant = target
      const targets = r.nodes.map((_, i) => i).filter((i) => ['feature', 'logit'].includes(r.nodes[i].kind));
      const nF = r.selected.length;
      const T = tokens.length;
      for (const s of [0, nF - 1, nF + T + 2, nF + r.L * T + 3]) {
        const col = frozenDifference(ref, r, tc.ref, s, targets);
        targets.forEach((t, i) => expect(Math.abs(col[i] - A[t * N + s])).toBeLessThan(1e-4));
      }
      let rowWorst = 0;
      for (const t of targets) {
        let sum = 0;
        for (let j = 0; j < N; j++) sum += A[t * N + j];
        rowWorst = Math.max(rowWorst, Math.abs(sum + r.constant[t] - r.targetValue[t]));
      }
      expect(rowWorst).toBeLessThan(1e-4);

      // pruning and scores
      const want = referenceJson(r);
      expect(doc.graph.nodes.map((n) => `${KIND[n.feature_type]}:${n.node_id}`)).toEqual(want.nodes);
      expect(doc.graph.links.map((l) => `${l.source}>${l.target}`)).toEqual(want.links);
      expect(Math.abs(doc.scores.replacement - r.scores.replacement)).toBeLessThan(1e-4);
      expect(Math.abs(doc.scores.completeness - r.scores.completeness)).toBeLessThan(1e-4);
      expect(doc.graph.nodes.length).toBeLessThan(N);
      // each link's weight is A[target, source] (where its ids name one node each: a layer-0 feature
      // `0_f_p` and the error `0_l_p` share an id when f = l); each kept node's influence its cumulative score
      const index = new Map(r.nodes.map((n, i) => [`${n.kind}:${n.node_id}`, i]));
      const byId = new Map(doc.graph.nodes.map((n) => [n.node_id, n]));
      const seen = new Map<string, number>();
      for (const n of doc.graph.nodes) seen.set(n.node_id, (seen.get(n.node_id) ?? 0) + 1);
      for (const l of doc.graph.links
        .filter((x) => seen.get(x.source) === 1 && seen.get(x.target) === 1)
        .slice(0, 80)) {
        const ti = index.get(`${KIND[byId.get(l.target)!.feature_type]}:${l.target}`)!;
        const si = index.get(`${KIND[byId.get(l.source)!.feature_type]}:${l.source}`)!;
        expect(Math.abs(l.weight - r.adjacency[ti * N + si])).toBeLessThan(1e-4);
      }
      for (const n of doc.graph.nodes) {
        const i = index.get(`${KIND[n.feature_type]}:${n.node_id}`)!;
        if (n.feature_type === 'logit') expect(n.influence).toBeNull();
        else expect(Math.abs(n.influence! - r.cumulativeScores[i])).toBeLessThan(1e-4);
      }

      // the JSON: Neuronpedia's schema, and circuit-tracer's fields
      const validate = new Ajv({ strict: false }).compile(NEURONPEDIA_GRAPH_SCHEMA);
      const json = JSON.parse(JSON.stringify(doc.graph));
      expect(validate(json), JSON.stringify(validate.errors)).toBe(true);
      expect(Object.keys(json)).toEqual(['metadata', 'qParams', 'nodes', 'links']);
      expect(Object.keys(json.metadata)).toEqual([
        'slug',
        'scan',
        'transcoder_list',
        'prompt_tokens',
        'prompt',
        'node_threshold',
        'schema_version',
      ]);
      expect(Object.keys(json.nodes[0])).toEqual([
        'node_id',
        'feature',
        'layer',
        'ctx_idx',
        'feature_type',
        'token_prob',
        'is_target_logit',
        'run_idx',
        'reverse_ctx_idx',
        'jsNodeId',
        'clerp',
        'influence',
        'activation',
      ]);
      expect(json.metadata.prompt_tokens).toHaveLength(T);
      expect(json.qParams).toEqual({ pinnedIds: [], supernodes: [], linkType: 'both', clickedId: '', sg_pos: '' });
      const top = json.nodes.find((n: { is_target_logit: boolean }) => n.is_target_logit);
      expect(top.node_id).toBe(`${r.L + 1}_${r.logits[0].token}_${T - 1}`);
      expect(top.clerp).toMatch(/^Output ".*" \(p=\d\.\d{3}\)$/);
      const feats = json.nodes.filter((n: { feature_type: string }) => n.feature_type === 'cross layer transcoder');
      // the pruned graph keeps features (in the variants it may keep only errors and tokens, as the oracle's does)
      if (Object.keys(variant).length === 0) expect(feats.length).toBeGreaterThan(0);
      for (const feat of feats.slice(0, 1)) {
        const [l, f] = feat.node_id.split('_').map(Number);
        expect(feat.feature).toBe(((l + f) * (l + f + 1)) / 2 + f);
        expect(feat.jsNodeId).toBe(`${l}_${f}-0`);
      }
      // the schema check can fail: without a required field, or with a field of the wrong type, it is refused
      expect(validate({ ...json, metadata: { ...json.metadata, scan: undefined } })).toBe(false);
      const { jsNodeId: _, ...noJsId } = json.nodes[0];
      expect(validate({ ...json, nodes: [noJsId, ...json.nodes.slice(1)] })).toBe(false);
      expect(validate({ ...json, nodes: [{ ...json.nodes[0], feature: 1.5 }, ...json.nodes.slice(1)] })).toBe(false);
      expect(validate({ ...json, links: [{ ...json.links[0], weight: String(json.links[0].weight) }] })).toBe(false);
    },
  );

  it('max_feature_nodes picks the rows by partial influence exactly as circuit-tracer schedules them', async () => {
    const tokens = TOKENS.stories;
    const tc = setFor(models.storiesRef, tokens, 'plt');
    const r = referenceAttribution(models.storiesRef, tokens, tc.ref, {
      maxFeatureNodes: 60,
      batchSize: 8,
      updateInterval: 2,
    });
    const doc = await operation.run(
      models.stories,
      {
        prompt: '',
        token_ids: tokens,
        transcoder_source: tc.dir,
        max_feature_nodes: 60,
        batch_size: 8,
        update_interval: 2,
        full_adjacency: true,
      },
      ctx,
    );
    expect(doc.selected_features).toBe(60);
    expect(doc.adjacency!.nodes.map((n) => n.node_id)).toEqual(r.nodes.map((n) => n.node_id));
    const want = referenceJson(r);
    expect(doc.graph.nodes.map((n) => `${KIND[n.feature_type]}:${n.node_id}`)).toEqual(want.nodes);
    expect(Math.abs(doc.scores.replacement - r.scores.replacement)).toBeLessThan(1e-4);
    // and the first 60 features in index order are not what it picked (the ranking matters)
    expect(r.selected).not.toEqual(Array.from({ length: 60 }, (_, i) => i));
    expect(doc.cost.backward_rows).toBe(60 + r.logits.length);
  });

  it.each([
    ['gpt2', 'plt'],
    ['stories', 'clt'],
  ] as const)('feature_intervention on %s %s: both error modes against the oracle', async (which, kind) => {
    const model = models[which];
    const ref = which === 'gpt2' ? models.gpt2Ref : models.storiesRef;
    const tokens = TOKENS[which];
    const tc = setFor(ref, tokens, kind);
    const r = referenceAttribution(ref, tokens, tc.ref);
    // zero a layer-0 feature, triple a middle one, set one at the last layer
    const picks = [0, Math.floor(r.active.length / 2), r.active.length - 1];
    const values = [0, 3 * r.active[picks[1]].activation, 1.5];
    const changes = picks.map((index, k) => ({ index, value: values[k] }));
    const moved: Record<string, number[]> = {};
    for (const errors of ['recomputed', 'frozen'] as const) {
      const want = referenceIntervention(ref, r, tc.ref, changes, errors);
      const doc = await intervention.run(
        model,
        {
          prompt: '',
          token_ids: tokens,
          transcoder_source: tc.dir,
          errors,
          top_k: 5,
          interventions: [
            { ...pos(r, picks[0]), scale: 0 },
            { ...pos(r, picks[1]), scale: 3 },
            { ...pos(r, picks[2]), value: 1.5 },
          ],
        },
        ctx,
      );
      expect(doc.errors).toBe(errors);
      for (const e of doc.after) expect(Math.abs(e.logit - want[e.token])).toBeLessThan(1e-4);
      for (const e of doc.before) expect(Math.abs(e.logit - r.clean.lastLogits[e.token])).toBeLessThan(1e-4);
      moved[errors] = doc.after.map((e) => e.logit);
    }
    // the two modes are different interventions (errors held or not)
    expect(moved.recomputed).not.toEqual(moved.frozen);
    // an inactive feature is refused, naming it
    const inactive = Array.from({ length: 96 }, (_, f) => f).find(
      (f) => !r.active.some((x) => x.layer === 0 && x.pos === 1 && x.feature === f),
    )!;
    await expect(
      intervention.run(
        model,
        {
          prompt: '',
          token_ids: tokens,
          transcoder_source: tc.dir,
          interventions: [{ layer: 0, position: 1, feature: inactive }],
        },
        ctx,
      ),
    ).rejects.toMatchObject({ code: 'BAD_INPUT', message: expect.stringContaining(`0_${inactive}_1`) });
  });
});

function pos(r: RefAttribution, i: number) {
  const a = r.active[i];
  return { layer: a.layer, position: a.pos, feature: a.feature };
}

// On WebGPU (onnxruntime-node, SwiftShader here): the adjacency rows kept on the device and pruned there
// (engine/runtime/adjacency.ts, float32), against the same float64 oracle: the node set and links, scores,
// each link's weight and each node's cumulative influence.
describe('attribution_graph pruned on WebGPU against the float64 oracle', () => {
  const models: Partial<Record<'gpt2' | 'stories', LoadedModel>> = {};
  const refs: Partial<Record<'gpt2' | 'stories', RefModel>> = {};
  const loaders = createNodeSaeLoaders({ cache: false });
  const ctx: OpContext = { loadTranscoders: loaders.loadTranscoders };
  beforeAll(async () => {
    models.gpt2 = await loadModelNode(path.join(SHARED, 'models/induction-gpt2'), { backend: 'webgpu' });
    models.stories = await loadModelNode('default', { backend: 'webgpu' });
    refs.gpt2 = loadModelDir(path.join(SHARED, 'models/induction-gpt2'));
    refs.stories = loadModelDir(path.join(SHARED, 'models/stories260K'));
  }, 120_000);
  afterAll(async () => {
    await models.gpt2?.dispose();
    await models.stories?.dispose();
    sets.splice(0).forEach((s) => s.cleanup());
  });

  it.each([
    ['gpt2', 'plt'],
    ['gpt2', 'clt'],
    ['stories', 'plt'],
    ['stories', 'clt'],
  ] as const)('%s %s: node set, links, weights, influences, scores', async (which, kind) => {
    const ref = refs[which]!;
    const tokens = TOKENS[which];
    const tc = setFor(ref, tokens, kind);
    const r = referenceAttribution(ref, tokens, tc.ref);
    const doc = await operation.run(
      models[which]!,
      { prompt: '', token_ids: tokens, transcoder_source: tc.dir, slug: `webgpu-${which}-${kind}` },
      ctx,
    );
    expect(doc.model.backend).toBe('webgpu');
    expect(doc.method).toContain('on the device');
    const N = r.nodes.length;
    const want = referenceJson(r);
    expect(doc.graph.nodes.map((n) => `${KIND[n.feature_type]}:${n.node_id}`)).toEqual(want.nodes);
    expect(doc.graph.links.map((l) => `${l.source}>${l.target}`)).toEqual(want.links);
    expect(doc.graph.links.length).toBeGreaterThan(0);
    expect(Math.abs(doc.scores.replacement - r.scores.replacement)).toBeLessThan(1e-4);
    expect(Math.abs(doc.scores.completeness - r.scores.completeness)).toBeLessThan(1e-4);
    const index = new Map(r.nodes.map((n, i) => [`${n.kind}:${n.node_id}`, i]));
    const byId = new Map(doc.graph.nodes.map((n) => [n.node_id, n]));
    const seen = new Map<string, number>();
    for (const n of doc.graph.nodes) seen.set(n.node_id, (seen.get(n.node_id) ?? 0) + 1);
    for (const l of doc.graph.links.filter((x) => seen.get(x.source) === 1 && seen.get(x.target) === 1)) {
      const ti = index.get(`${KIND[byId.get(l.target)!.feature_type]}:${l.target}`)!;
      const si = index.get(`${KIND[byId.get(l.source)!.feature_type]}:${l.source}`)!;
      expect(Math.abs(l.weight - r.adjacency[ti * N + si])).toBeLessThan(1e-4);
    }
    for (const n of doc.graph.nodes) {
      const i = index.get(`${KIND[n.feature_type]}:${n.node_id}`)!;
      if (n.feature_type !== 'logit') expect(Math.abs(n.influence! - r.cumulativeScores[i])).toBeLessThan(1e-4);
    }
    expect(Math.abs(doc.pruning.edge_score_threshold - r.thresholds.edge) / r.thresholds.edge).toBeLessThan(1e-4);
  });

  it('max_feature_nodes: the rows chosen by partial influence computed on the device, as circuit-tracer schedules them', async () => {
    const tokens = TOKENS.stories;
    const tc = setFor(refs.stories!, tokens, 'plt');
    const opts = { maxFeatureNodes: 60, batchSize: 8, updateInterval: 2 };
    const r = referenceAttribution(refs.stories!, tokens, tc.ref, opts);
    const input = { prompt: '', token_ids: tokens, transcoder_source: tc.dir, batch_size: 8, update_interval: 2 };
    const doc = await operation.run(models.stories!, { ...input, max_feature_nodes: 60 }, ctx);
    expect(doc.method).toContain('on the device');
    expect(doc.selected_features).toBe(60);
    expect(r.selected).not.toEqual(Array.from({ length: 60 }, (_, i) => i));
    const want = referenceJson(r);
    expect(doc.graph.nodes.map((n) => `${KIND[n.feature_type]}:${n.node_id}`)).toEqual(want.nodes);
    expect(doc.graph.links.map((l) => `${l.source}>${l.target}`)).toEqual(want.links);
    expect(Math.abs(doc.scores.replacement - r.scores.replacement)).toBeLessThan(1e-4);
    expect(Math.abs(doc.scores.completeness - r.scores.completeness)).toBeLessThan(1e-4);
    expect(doc.cost.backward_rows).toBe(60 + r.logits.length);
  });
});
