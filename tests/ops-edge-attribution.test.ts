/**
 * edge_attribution on induction-gpt2 with generated repeated-sequence pairs, against the float64
 * edge reference (tests/reference/edges64.ts: EAP-IG's definitions, gradients by central
 * differences, MIB's faithfulness written again): exact, eap and eap_ig_inputs scores within 1e-4,
 * CPR and CMD within 1e-3, EAP-IG completeness as m grows; MIB's circuit format written and read;
 * bad input.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { realpathSync } from 'node:fs';
import path from 'node:path';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { getOperation, type OperationDocument } from '../src/ops/index';
import { LoupeError } from '../src/engine/errors';
import {
  loadModelDir,
  edgeGraph64,
  exactScores64,
  eapScores64,
  eapIgInputsScores64,
  faithfulness64,
  type RefModel,
  type Pair64,
} from './reference';
import { SHARED } from './helpers/shared';

type Doc = OperationDocument<'edge_attribution'>;
const INDUCTION = realpathSync(path.join(SHARED, 'models/induction-gpt2'));
const op = { run: (m: LoadedModel, x: unknown): Promise<Doc> => getOperation('edge_attribution')!.run(m, x) };
const GEN = { task: 'induction' as const, n: 4, seed: 3, length: 8 };
/** fewer pairs for EAP-IG, whose reference takes m × 2 forwards per edge */
const GEN2 = { ...GEN, n: 2 };

let model: LoadedModel;
let ref: RefModel;
let pairs: Pair64[];

beforeAll(async () => {
  model = await loadModelNode(INDUCTION, { backend: 'node' });
  ref = loadModelDir(INDUCTION);
}, 60_000);
afterAll(async () => {
  await model?.dispose();
});

const byName = (d: Doc) => new Map(d.edges.map((e) => [e.name, e.score]));
function worst(d: Doc, refScores: Map<string, number>): { diff: number; scale: number } {
  let diff = 0;
  let scale = 0;
  for (const e of d.edges) {
    diff = Math.max(diff, Math.abs(e.score - refScores.get(e.name)!));
    scale = Math.max(scale, Math.abs(refScores.get(e.name)!));
  }
  return { diff, scale };
}

describe('edge_attribution on induction-gpt2 vs float64', () => {
  let exact: Doc;
  beforeAll(async () => {
    exact = await op.run(model, { generate: GEN, method: 'exact', evaluate: true });
    // the pairs as the generator made them (token ids), for the reference
    const gen = await op.run(model, { generate: GEN, method: 'eap' });
    expect(gen.dataset.sha256).toBe(exact.dataset.sha256);
    pairs = [];
  }, 120_000);

  it('the dataset: 4 generated pairs, none dropped, the graph has 110 edges', () => {
    expect(exact.dataset).toMatchObject({ source: 'generated', n_given: 4, n_examples: 4, dropped: [] });
    expect(exact.n_edges).toBe(110);
    expect(exact.edges[0].name).toBe('input->a0.h0<q>');
    expect(exact.edges.at(-1)!.name).toBe('m1->logits');
  });

  it('exact equals float64 edge patching within 1e-4', async () => {
    const ds = await datasetPairs();
    const g = edgeGraph64(2, 4, false);
    expect(g.edges.map((e) => e.name)).toEqual(exact.edges.map((e) => e.name));
    const r = exactScores64(ref, g, ds);
    const w = worst(exact, r);
    console.log(`exact: worst |Δ| ${w.diff.toExponential(2)} (largest |score| ${w.scale.toFixed(3)})`);
    expect(w.scale).toBeGreaterThan(0.1);
    expect(w.diff).toBeLessThan(1e-4);
  });

  it('eap equals float64 central differences within 1e-4', async () => {
    const d = await op.run(model, { generate: GEN, method: 'eap' });
    const r = eapScores64(ref, edgeGraph64(2, 4, false), await datasetPairs());
    const w = worst(d, r);
    console.log(
      `eap: worst |Δ| ${w.diff.toExponential(2)} (largest |score| ${w.scale.toFixed(3)}); ${d.cost.forward_equivalents} fwd-eq/pair`,
    );
    expect(w.diff).toBeLessThan(1e-4);
  });

  it('eap_ig_inputs (m = 5) equals float64 within 1e-4', async () => {
    const d = await op.run(model, { generate: GEN2, method: 'eap_ig_inputs', ig_steps: 5 });
    const r = eapIgInputsScores64(ref, edgeGraph64(2, 4, false), (await datasetPairs()).slice(0, 2), 5);
    const w = worst(d, r);
    console.log(`eap_ig_inputs: worst |Δ| ${w.diff.toExponential(2)} (largest |score| ${w.scale.toFixed(3)})`);
    expect(w.diff).toBeLessThan(1e-4);
  }, 120_000);

  it('CPR and CMD equal a float64 evaluation within 1e-3', async () => {
    const ds = await datasetPairs();
    const g = edgeGraph64(2, 4, false);
    const s = byName(exact);
    const signed = faithfulness64(ref, g, ds, (e) => -s.get(e)!);
    const abs = faithfulness64(ref, g, ds, (e) => Math.abs(s.get(e)!));
    const ev = exact.evaluation!;
    console.log(
      `CPR ${ev.signed.cpr.toFixed(5)} vs ${signed.cpr.toFixed(5)}; CMD ${ev.abs.cmd.toFixed(5)} vs ${abs.cmd.toFixed(5)}`,
    );
    expect(Math.abs(ev.signed.cpr - signed.cpr)).toBeLessThan(1e-3);
    expect(Math.abs(ev.abs.cmd - abs.cmd)).toBeLessThan(1e-3);
    expect(Math.abs(ev.abs.cpr - abs.cpr)).toBeLessThan(1e-3);
    expect(Math.abs(ev.signed.cmd - signed.cmd)).toBeLessThan(1e-3);
    expect(ev.signed.curve.map((p) => p.n_after_prune)).toEqual(signed.curve.map((p) => p.nAfterPrune));
    expect(ev.signed.curve.at(-1)!.faithfulness).toBeCloseTo(1, 4);
    expect(Math.abs(ev.m_full - signed.mFull)).toBeLessThan(1e-4);
  }, 120_000);

  it('EAP-IG completeness: Σ of the input scores → m_corrupted − m_clean as m grows', async () => {
    const errs: number[] = [];
    for (const m of [1, 4, 16]) {
      const d = await op.run(model, { generate: GEN, method: 'eap_ig_inputs', ig_steps: m });
      errs.push(Math.abs(d.completeness!.error));
    }
    console.log(`completeness |error| at m = 1, 4, 16: ${errs.map((e) => e.toExponential(2)).join(', ')}`);
    expect(errs[1]).toBeLessThan(errs[0]);
    expect(errs[2]).toBeLessThan(errs[1]);
  }, 120_000);

  it('MIB circuit format: exported, read back, and an unknown edge name is refused', async () => {
    const d = await op.run(model, { generate: GEN, method: 'exact', mib_export: { top_n: 10 } });
    const f = d.mib_graph!;
    expect(Object.keys(f)).toEqual(['cfg', 'nodes', 'edges']);
    expect(f.cfg).toEqual({ n_layers: 2, n_heads: 4, parallel_attn_mlp: false, d_model: 64 });
    expect(Object.keys(f.nodes)[0]).toBe('input');
    expect(Object.keys(f.nodes).at(-1)).toBe('logits');
    expect(Object.keys(f.edges)).toEqual(d.edges.map((e) => e.name));
    expect(f.edges['input->a0.h0<q>'].score).toBe(-d.edges[0].score);
    // read back: the same scores, so the same curve
    const back = await op.run(model, { generate: GEN, circuit: f, evaluate: true });
    expect(back.method).toBe('imported');
    expect(back.edges.map((e) => e.score)).toEqual(d.edges.map((e) => e.score));
    expect(back.circuit_evaluation[0].source).toBe('circuit');
    const inGraph = Object.values(f.edges).filter((e) => e.in_graph).length;
    expect(back.circuit_evaluation[0].n_edges).toBe(inGraph);
    const bad = structuredClone(f);
    (bad.edges as Record<string, unknown>)['a9.h0->logits'] = { score: 1, in_graph: true };
    await expect(op.run(model, { generate: GEN, circuit: bad })).rejects.toMatchObject({
      code: 'BAD_INPUT',
      details: { edge: 'a9.h0->logits' },
    });
    await expect(op.run(model, { generate: GEN, circuit_edges: ['input->a0.h9<q>'] })).rejects.toThrow(LoupeError);
  }, 120_000);

  it('bad input: empty dataset, unequal pairs dropped with a count, a multi-token answer names the pair', async () => {
    await expect(op.run(model, { dataset: [] })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    const d = await op.run(model, {
      method: 'eap',
      dataset: [
        {
          clean_token_ids: [256, 1, 2, 3, 1, 2],
          corrupted_token_ids: [256, 4, 5, 6, 1, 2],
          answer: '#3',
          counterfactual: '#6',
        },
        {
          clean_token_ids: [256, 1, 2, 3, 1, 2],
          corrupted_token_ids: [256, 4, 5, 1, 2],
          answer: '#3',
          counterfactual: '#6',
        },
      ],
    });
    expect(d.dataset.n_examples).toBe(1);
    expect(d.dataset.dropped).toEqual([
      { index: 1, reason: 'clean has 6 tokens, corrupted 5', clean_tokens: 6, corrupted_tokens: 5 },
    ]);
    await expect(
      op.run(model, { dataset: [{ clean: 'abc', corrupted: 'abd', answer: 'xyz', counterfactual: 'q' }] }),
    ).rejects.toMatchObject({ code: 'BAD_INPUT', message: expect.stringContaining('dataset pair 0') });
  });
});

/** the generated pairs as the engine's dataset module made them, for the reference */
async function datasetPairs(): Promise<Pair64[]> {
  if (pairs.length) return pairs;
  const { resolveDataset } = await import('../src/ops/lib/dataset');
  const ds = await resolveDataset(model, { generate: { ...GEN }, dataset_format: 'auto', prepend_bos: true });
  pairs = ds.examples.map((e) => ({
    clean: e.clean,
    corrupted: e.corrupted,
    answer: e.answer,
    counterfactual: e.counterfactual,
  }));
  return pairs;
}
