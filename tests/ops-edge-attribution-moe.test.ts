/**
 * edge_attribution with experts as nodes (engine/edges.ts) on a random Qwen2-MoE (4 experts, top
 * 2, a gated shared expert) against the float64 edge reference (tests/reference/edges64.ts moe64,
 * routing written again from HF's Qwen2MoeSparseMoeBlock): exact scores equal float64 edge patching
 * and eap scores equal float64 central differences, within 1e-4; the document names the expert
 * edges and its graph_cfg the experts; an MIB export reads back.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { getOperation, type OperationDocument } from '../src/ops/index';
import {
  MOE_FAMILY_CASES,
  makeCaseModel,
  caseTokens,
  edgeGraph64,
  exactScores64,
  eapScores64,
  type RandomModel,
  type Pair64,
} from './reference';

type Doc = OperationDocument<'edge_attribution'>;
const op = { run: (m: LoadedModel, x: unknown): Promise<Doc> => getOperation('edge_attribution')!.run(m, x) };
const CASE = MOE_FAMILY_CASES.find((c) => c.family === 'qwen2_moe')!;

let rm: RandomModel;
let model: LoadedModel;
let pairs: Pair64[];
let dataset: unknown[];

beforeAll(async () => {
  rm = makeCaseModel(CASE);
  model = await loadModelNode(rm.dir, { backend: 'node' });
  pairs = [0, 1].map((i) => ({
    clean: caseTokens(rm, 8, 20 + i),
    corrupted: caseTokens(rm, 8, 30 + i),
    answer: 3 + i,
    counterfactual: 7,
  }));
  dataset = pairs.map((p) => ({
    clean_token_ids: p.clean,
    corrupted_token_ids: p.corrupted,
    answer: `#${p.answer}`,
    counterfactual: `#${p.counterfactual}`,
  }));
});
afterAll(async () => {
  await model?.dispose();
  rm?.cleanup();
});

function worst(d: Doc, ref: Map<string, number>): { diff: number; scale: number; expertScale: number } {
  let diff = 0;
  let scale = 0;
  let expertScale = 0;
  for (const e of d.edges) {
    const r = ref.get(e.name)!;
    diff = Math.max(diff, Math.abs(e.score - r));
    scale = Math.max(scale, Math.abs(r));
    if (/^m\d+\.e\d+->|<router>$/.test(e.name)) expertScale = Math.max(expertScale, Math.abs(r));
  }
  return { diff, scale, expertScale };
}

describe('edge_attribution, experts as nodes, on a random Qwen2-MoE vs float64', () => {
  const g64 = () => edgeGraph64(2, 4, false, { E: 4, shared: true });

  it('exact: each edge (expert edges included) equals float64 edge patching within 1e-4', async () => {
    const d = await op.run(model, { dataset, method: 'exact', mib_export: { top_n: 10 } });
    expect(d.graph_cfg).toMatchObject({ n_layers: 2, n_heads: 4, n_experts: 4, shared_expert: true });
    const g = g64();
    expect(d.edges.map((e) => e.name)).toEqual(g.edges.map((e) => e.name));
    expect(d.n_nodes).toBe(1 + 2 * (4 + 5) + 1);
    expect(d.edges.map((e) => e.name)).toContain('m0.e2->a1.h0<q>');
    expect(d.edges.map((e) => e.name)).toContain('a0.h1->m0.e3<router>');
    expect(d.edges.map((e) => e.name)).toContain('m1.shared->logits');
    const w = worst(d, exactScores64(rm, g, pairs));
    console.log(
      `exact: ${d.n_edges} edges, worst |Δ| ${w.diff.toExponential(2)}, largest |score| ${w.scale.toFixed(4)}`,
    );
    expect(w.expertScale).toBeGreaterThan(1e-3); // the expert edges matter, so the test can fail
    expect(w.diff).toBeLessThan(1e-4 * Math.max(1, w.scale));
    // the MIB export carries the experts' cfg and reads back as a circuit
    const back = await op.run(model, { dataset, circuit: d.mib_graph });
    expect(back.edges.map((e) => e.score)).toEqual(d.edges.map((e) => e.score));
  }, 120_000);

  it('eap: each edge equals float64 central differences within 1e-4', async () => {
    const d = await op.run(model, { dataset, method: 'eap' });
    const w = worst(d, eapScores64(rm, g64(), pairs));
    console.log(`eap: worst |Δ| ${w.diff.toExponential(2)}, largest |score| ${w.scale.toFixed(4)}`);
    expect(w.expertScale).toBeGreaterThan(1e-3);
    expect(w.diff).toBeLessThan(1e-4 * Math.max(1, w.scale));
  }, 120_000);

  it('eap_ig_activations runs with each layer’s experts as one group', async () => {
    const d = await op.run(model, { dataset, method: 'eap_ig_activations', ig_steps: 2 });
    expect(d.edges.every((e) => Number.isFinite(e.score))).toBe(true);
    expect(d.cost.gradient_rows).toBe(2 * 2 * (2 * 2 + 1)); // pairs × m × (2L + 1) groups
  }, 120_000);
});
