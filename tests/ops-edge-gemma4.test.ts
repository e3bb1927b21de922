/**
 * Gemma 4 and edge patching: refused, naming every part of its blocks the edge graph does not model
 * (engine/graph/edge-graph.ts edgeGaps): edge_attribution for its post-norms before it reads the
 * dataset, the edge variant (a direct `edges` run) for all six before it is built, on a checkpoint of tests/reference/gemma4-64.ts with per-layer
 * inputs, KV sharing and full-attention layers of another head width and key/value heads.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { operation as edgeAttribution } from '../src/ops/edge_attribution';
import { edgeGaps } from '../src/engine/graph/edge-graph';
import { makeGemma4Model, type Gemma4Model } from './reference/gemma4-64';

const S = 'sliding_attention' as const;
const F = 'full_attention' as const;

describe('gemma4: edge patching refused with its exact reasons', () => {
  let m: Gemma4Model;
  let model: LoadedModel;
  beforeAll(async () => {
    m = makeGemma4Model({ layerTypes: [S, S, F, S, S, F], kvShared: 2, kEqV: true, globalKvHeads: 1, nKvHeads: 2 });
    model = await loadModelNode(m.dir, { backend: 'node' });
  });
  afterAll(async () => {
    await model?.dispose();
    m?.cleanup();
  });

  it('edgeGaps names post-norms, the full layers (2, 5) of another shape, KV sharing (4, 5), v_norm, per-layer inputs, layer_scalar', () => {
    const gaps = edgeGaps(model.spec);
    expect(gaps).toHaveLength(6);
    expect(gaps[0]).toMatch(/^post-norm blocks/);
    expect(gaps[1]).toMatch(/^layers 2, 5 with another head width or number of key\/value heads/);
    expect(gaps[2]).toMatch(/^layers 4, 5 attend with an earlier layer's keys and values/);
    expect(gaps.slice(3).join('|')).toMatch(/v_norm.*\|per-layer inputs.*\|.*layer_scalar/);
  });

  it('edge_attribution and a direct edges run: UNSUPPORTED_ARCHITECTURE before any weight is fed', async () => {
    const tokens = [m.bosId, 5, 9, 14, 3, 7];
    const corrupted = [m.bosId, 7, 3, 14, 9, 5];
    const before = model.memory().transfers;
    const err = await edgeAttribution
      .run(
        model,
        { dataset: [{ clean_token_ids: tokens, corrupted_token_ids: corrupted, answer: '#5', counterfactual: '#6' }] },
        {},
      )
      .catch((e) => e);
    expect(err).toMatchObject({ code: 'UNSUPPORTED_ARCHITECTURE', details: { architecture: model.info.architecture } });
    expect(err.message).toMatch(
      /^edge_attribution does not model this gemma4\w* model's post-norm blocks \(Gemma 2, 3 and 4/,
    );
    expect(err.hint).toMatch(/attribution_patching/);
    expect(model.memory().transfers).toEqual(before);
    const direct = await model.run([tokens], { edges: { subtract: true, outputs: true } }).catch((e) => e);
    expect(direct).toMatchObject({ code: 'UNSUPPORTED_ARCHITECTURE', details: { gaps: edgeGaps(model.spec) } });
    expect(direct.message).toMatch(/^Edge patching does not model this/);
    console.log(err.message);
  });
});
