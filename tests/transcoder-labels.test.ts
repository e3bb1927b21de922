// attribution_graph labels its feature nodes (circuit-tracer's clerp, which the node list and the
// feature card show) from the transcoder set's explanations.json, read as an SAE's are
// (lib/sae.ts explanationsBeside): a random PLT set on the bundled model, its file written here
// with Neuronpedia-style layer names ("3-…") and a numeric layer; a set without the file gets no
// labels; records naming no layer, a layer past the set's or a feature past d_transcoder are refused.

import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { writeFileSync } from 'node:fs';
import * as path from 'node:path';
import type { LoadedModel } from '../src/engine/api';
import { loadModelNode } from '../src/node/load';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import { operation } from '../src/ops/attribution_graph';
import { loadModelDir } from './reference';
import { cleanState } from './reference/attribution64';
import { makeRandomTranscoders, type RandomTranscoderSet } from './helpers/random-transcoders';

const PROMPT = 'Once upon a time, there was a little girl named Lily.';
const F = 64;
let model: LoadedModel;
const sets: RandomTranscoderSet[] = [];
let ids: number[];

/** a fresh set (its own folder, so its labels are read afresh) with `records` as explanations.json, or none */
function setWith(records: unknown[] | null): RandomTranscoderSet {
  const o = { kind: 'plt', nLayers: 5, dModel: 64, features: F, skip: true } as const;
  const probe = makeRandomTranscoders(o);
  const calibrate = cleanState(loadModelDir(path.resolve('public/models/stories260K')), ids, probe.ref).xin;
  probe.cleanup();
  const tc = makeRandomTranscoders({ ...o, calibrate, l0: 8, seed: 5 });
  sets.push(tc);
  if (records) writeFileSync(path.join(tc.dir, 'explanations.json'), JSON.stringify(records));
  return tc;
}

const run = (tc: RandomTranscoderSet) => {
  const loaders = createNodeSaeLoaders({ cache: false });
  return operation.run(
    model,
    { prompt: PROMPT, transcoder_source: tc.dir },
    { loadTranscoders: loaders.loadTranscoders, loadSaeFile: loaders.loadSaeFile },
  );
};

describe("attribution_graph's feature labels from the set's explanations", () => {
  beforeAll(async () => {
    model = await loadModelNode('default');
    ids = model.tokenize(PROMPT);
  }, 120_000);
  afterAll(async () => {
    sets.forEach((s) => s.cleanup());
    await model?.dispose();
  });

  it('labels each described feature node with its own layer and index, and no other', async () => {
    const want = new Map<string, string>();
    const records: unknown[] = [];
    for (let l = 0; l < 5; l++)
      for (let f = 0; f < F; f += 2) {
        want.set(`${l}_${f}`, `L${l} F${f}: a random feature`);
        records.push({
          modelId: 'stories260K',
          layer: `${l}-random-plt`,
          index: String(f),
          description: `L${l} F${f}: a random feature`,
        });
      }
    // a numeric layer, and a second explanation of a described feature (the first listed is kept)
    records.push({ layer: 3, index: 7, description: 'numeric layer' });
    records.push({ layer: '0-random-plt', index: '0', description: 'not this one' });
    want.set('3_7', 'numeric layer');
    const tc = setWith(records);
    const doc = await run(tc);
    const feats = doc.graph.nodes.filter((n) => n.feature_type === 'cross layer transcoder');
    const labelled = feats.filter((n) => n.clerp !== '');
    console.log(
      `[labels] ${labelled.length} of ${feats.length} feature nodes labelled; ${JSON.stringify(doc.descriptions)}`,
    );
    expect(labelled.length).toBeGreaterThan(0);
    expect(labelled.length).toBeLessThan(feats.length);
    for (const n of feats) {
      const [l, f] = n.node_id.split('_');
      expect(n.clerp).toBe(want.get(`${l}_${f}`) ?? '');
    }
    // other nodes keep theirs (logits say their token), errors and tokens none
    expect(doc.graph.nodes.filter((n) => n.feature_type === 'logit').every((n) => n.clerp.startsWith('Output'))).toBe(
      true,
    );
    expect(doc.descriptions).toMatchObject({
      looked_for: [`${tc.dir}/explanations.json`],
      found: [`${tc.dir}/explanations.json`],
      count: want.size,
      records: records.length,
    });
  }, 120_000);

  it('a set without explanations.json gets no labels, and says where it looked', async () => {
    const tc = setWith(null);
    const doc = await run(tc);
    expect(doc.graph.nodes.filter((n) => n.feature_type === 'cross layer transcoder' && n.clerp !== '')).toEqual([]);
    expect(doc.descriptions).toMatchObject({ looked_for: [`${tc.dir}/explanations.json`], found: [], count: 0 });
  }, 120_000);

  it('refuses records that name no layer, a layer past the set, or a feature past d_transcoder', async () => {
    for (const [rec, msg] of [
      [{ index: 1, description: 'which layer?' }, /names no layer/],
      [{ layer: '9-random-plt', index: 1, description: 'too deep' }, /layer 9 is past the set's 5 layers/],
      [{ layer: 1, index: F, description: 'too wide' }, new RegExp(`describe feature ${F}, but the SAE has only ${F}`)],
    ] as const) {
      const e = await run(setWith([rec])).catch((x) => x);
      expect(e.code).toBe('BAD_INPUT');
      expect(e.message).toMatch(msg);
      expect(e.hint).toBeTruthy();
    }
  }, 180_000);
});
