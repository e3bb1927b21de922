/**
 * The edge-patching variant (src/engine/graph/edge-graph.ts) against the float64 edge reference
 * (tests/reference/edges64.ts, written from EAP-IG's definitions, central differences for
 * gradients), on random-weight models of every family the variant builds (not Gemma 2's post-norm
 * blocks), on the random mixture-of-experts models with each expert a node (OLMoE's q/k norm over
 * the whole projection included) and on induction-gpt2: the plain forward
 * (w = 0), every node output, a random circuit patched to the corrupted run, and ∂M/∂w = EAP's
 * Σ Δ · ∂M/∂x at w = 0.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { realpathSync } from 'node:fs';
import path from 'node:path';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import type { Tensor } from '../src/engine/tensor';
import { edgeLayout, forwardHead, forwardMlp, backwardHead, backwardMlp, backwardLogits } from '../src/engine/edges';
import {
  ALL_FAMILY_CASES,
  MOE_FAMILY_CASES,
  makeCaseModel,
  caseTokens,
  mulberry32,
  loadModelDir,
  edgeGraph64,
  edgeForward64,
  type RandomModel,
  type RefModel,
  type EdgeGraph64,
} from './reference';
import { SHARED } from './helpers/shared';
import { edgeGraphOf, edgeShapeOf } from '../src/ops/lib/edge-circuits';

/**
 * forward / backward index of a reference node / input name, from the library's formulas (graph.py),
 * written again here; a mixture-of-experts layer's MLP is E (+1 shared) nodes after the heads and
 * 2E (+1) inputs after the heads' q, k, v: every expert's <in>, every expert's <router>, shared
 */
function indexer(L: number, H: number, E = 0, shared = false) {
  const F = E ? E + (shared ? 1 : 0) : 1;
  const I = E ? 2 * E + (shared ? 1 : 0) : 1;
  const mlp = (rest: string) => {
    const e = /^\.e(\d+)/.exec(rest);
    return e ? +e[1] : rest.startsWith('.shared') ? E : 0;
  };
  const fwd = (n: string) => {
    if (n === 'input') return 0;
    const m = /^a(\d+)\.h(\d+)$/.exec(n);
    if (m) return 1 + +m[1] * (H + F) + +m[2];
    const x = /^m(\d+)(.*)$/.exec(n)!;
    return 1 + +x[1] * (H + F) + H + mlp(x[2]);
  };
  const bwd = (n: string) => {
    if (n === 'logits') return L * (3 * H + I);
    const m = /^a(\d+)\.h(\d+)<([qkv])>$/.exec(n);
    if (m) return +m[1] * (3 * H + I) + 'qkv'.indexOf(m[3]) * H + +m[2];
    const x = /^m(\d+)(.*)$/.exec(n)!;
    const j = x[2].startsWith('.shared') ? 2 * E : mlp(x[2]) + (x[2].endsWith('<router>') ? E : 0);
    return +x[1] * (3 * H + I) + 3 * H + j;
  };
  return { fwd, bwd };
}

function seed(V: number, a: number, b: number, rows = 1): Tensor {
  const s = new Float32Array(rows * V);
  for (let r = 0; r < rows; r++) {
    s[r * V + a] += 1;
    s[r * V + b] -= 1;
  }
  return { dims: [rows, 1, V], data: s };
}

// post-norm blocks (Gemma 2 and 3, OLMo 2) are refused by the edge variant
const CASES = ALL_FAMILY_CASES.filter((c) => !['gemma2', 'gemma3', 'olmo2'].includes(c.family));

interface Subject {
  model: LoadedModel;
  ref: RefModel;
  clean: number[];
  corrupted: number[];
  A: number;
  Bt: number;
}

function checks(get: () => Subject, tol: { logits: number; grad: number }) {
  let g: EdgeGraph64;
  let idx: ReturnType<typeof indexer>;
  let Nf: number, Nb: number;
  beforeAll(() => {
    const { model } = get();
    const { n_layers: L, n_heads: H, parallel_attn_mlp, num_experts: E = 0, shared_expert = false } = model.info;
    const moe = E ? { E, shared: shared_expert } : undefined;
    g = edgeGraph64(L, H, parallel_attn_mlp, moe);
    idx = indexer(L, H, E, shared_expert);
    const lay = edgeLayout(L, H, parallel_attn_mlp, moe && { experts: E, shared: shared_expert });
    Nf = lay.nForward;
    Nb = lay.nBackward;
    // the engine's layout module says what the library's formulas say
    expect(forwardHead(lay, L - 1, H - 1)).toBe(idx.fwd(`a${L - 1}.h${H - 1}`));
    expect(forwardMlp(lay, L - 1)).toBe(idx.fwd(`m${L - 1}`));
    expect(backwardHead(lay, L - 1, 'v', H - 1)).toBe(idx.bwd(`a${L - 1}.h${H - 1}<v>`));
    expect(backwardMlp(lay, 0)).toBe(idx.bwd('m0'));
    expect(backwardLogits(lay)).toBe(idx.bwd('logits'));
    if (E) {
      expect(forwardMlp(lay, L - 1, E - 1)).toBe(idx.fwd(`m${L - 1}.e${E - 1}`));
      expect(backwardMlp(lay, L - 1, E + 1)).toBe(idx.bwd(`m${L - 1}.e1<router>`));
      expect(backwardMlp(lay, 0, E - 1)).toBe(idx.bwd(`m0.e${E - 1}<in>`));
      if (shared_expert) {
        expect(forwardMlp(lay, 0, E)).toBe(idx.fwd('m0.shared'));
        expect(backwardMlp(lay, 0, 2 * E)).toBe(idx.bwd('m0.shared'));
      }
    }
    // the op's graph (names, order, indices) is the reference's
    const og = edgeGraphOf(edgeShapeOf(model.info));
    expect(og.edges.map((e) => e.name)).toEqual(g.edges.map((e) => e.name));
    for (const e of og.edges) expect([e.f, e.b], e.name).toEqual([idx.fwd(e.upstream), idx.bwd(e.input)]);
  });

  const last = (t: Tensor, row = 0) => {
    const V = t.dims[2];
    const P = t.dims[1];
    return t.data.slice((row * P + P - 1) * V, (row * P + P) * V);
  };
  const maxDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
    let m = 0;
    for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
    return m;
  };

  it('w = 0 runs the plain model; edge::out holds every node output', async () => {
    const { model, ref, clean } = get();
    const T = clean.length;
    const plain = await model.run(clean, { logitPositions: [T - 1] });
    const run = await model.run(clean, { logitPositions: [T - 1], edges: { subtract: true, outputs: true } });
    const r64 = edgeForward64(ref, clean);
    expect(maxDiff(last(run.logits), r64.last)).toBeLessThan(tol.logits);
    expect(maxDiff(last(run.logits), last(plain.logits))).toBeLessThan(tol.logits);
    const D = model.info.d_model;
    expect(run.edgeOutputs!.dims).toEqual([1, Nf, T, D]);
    for (const n of g.nodes) {
      const i = idx.fwd(n);
      const a = run.edgeOutputs!.data.slice(i * T * D, (i + 1) * T * D);
      expect(maxDiff(a, r64.outs.get(n)!), n).toBeLessThan(tol.logits);
    }
  });

  it('a random circuit, the rest patched to the corrupted run: logits as the float64 construction', async () => {
    const { model, ref, clean, corrupted } = get();
    const T = clean.length;
    const corrRun = await model.run(corrupted, { logitPositions: [T - 1], edges: { subtract: true, outputs: true } });
    const r = mulberry32(3);
    const inCircuit = new Set(g.edges.filter(() => r() < 0.5).map((e) => e.name));
    const w = new Float32Array(Nf * Nb);
    for (const e of g.edges) if (!inCircuit.has(e.name)) w[idx.fwd(e.parent) * Nb + idx.bwd(e.input)] = 1;
    // two rows: the circuit, and every edge patched (= the corrupted run)
    const w2 = new Float32Array(2 * Nf * Nb);
    w2.set(w);
    for (const e of g.edges) w2[Nf * Nb + idx.fwd(e.parent) * Nb + idx.bwd(e.input)] = 1;
    const run = await model.run([clean, clean], {
      logitPositions: [T - 1],
      edges: { subtract: true, weights: { dims: [2, Nf, Nb], data: w2 }, source: corrRun.edgeOutputs },
    });
    const corr64 = edgeForward64(ref, corrupted).outs;
    const into = new Map<string, string[]>();
    for (const e of g.edges) if (!inCircuit.has(e.name)) into.set(e.input, [...(into.get(e.input) ?? []), e.parent]);
    const r64 = edgeForward64(ref, clean, {
      add: (input, outs) => {
        const us = into.get(input);
        if (!us) return undefined;
        const y = new Float64Array(outs.get('input')!.length);
        for (const u of us) {
          const s = corr64.get(u)!;
          const a = outs.get(u)!;
          for (let i = 0; i < y.length; i++) y[i] += s[i] - a[i];
        }
        return y;
      },
    });
    expect(maxDiff(last(run.logits, 0), r64.last)).toBeLessThan(tol.logits);
    expect(maxDiff(last(run.logits, 1), last(corrRun.logits))).toBeLessThan(tol.logits);
  });

  it('∂M/∂w at w = 0 is Σ (a_corr − a_clean) · ∂M/∂x_b: central differences in float64 (EAP)', async () => {
    const { model, ref, clean, corrupted, A, Bt } = get();
    const T = clean.length;
    const V = model.info.d_vocab;
    const corrRun = await model.run(corrupted, { logitPositions: [T - 1], edges: { subtract: true, outputs: true } });
    const run = await model.run(clean, {
      logitPositions: [T - 1],
      edges: {
        subtract: true,
        source: corrRun.edgeOutputs,
        weights: { dims: [1, Nf, Nb], data: new Float32Array(Nf * Nb) },
      },
      grad: { hooks: [], seed: seed(V, A, Bt) },
    });
    const c64 = edgeForward64(ref, clean).outs;
    const k64 = edgeForward64(ref, corrupted).outs;
    const eps = 1e-3;
    let worst = 0;
    let scale = 0;
    for (const e of g.edges) {
      const d = k64.get(e.parent)!.map((x, i) => x - c64.get(e.parent)![i]);
      const at = (s: number) => {
        const l = edgeForward64(ref, clean, {
          add: (input) => (input === e.input ? d.map((x) => s * x) : undefined),
        }).last;
        return l[A] - l[Bt];
      };
      const fd = (at(eps) - at(-eps)) / (2 * eps);
      const got = run.edgeGrad!.data[idx.fwd(e.parent) * Nb + idx.bwd(e.input)];
      worst = Math.max(worst, Math.abs(got - fd));
      scale = Math.max(scale, Math.abs(fd));
    }
    expect(scale).toBeGreaterThan(1e-3); // the test can fail: some edge matters
    expect(worst).toBeLessThan(tol.grad * Math.max(1, scale));
  });
}

describe.each(CASES)('edge variant vs float64: $name', (c) => {
  let rm: RandomModel;
  let s: Subject;
  beforeAll(async () => {
    rm = makeCaseModel(c);
    const model = await loadModelNode(rm.dir, { backend: 'node' });
    const clean = caseTokens(rm, c.seqLen);
    const corrupted = caseTokens(rm, c.seqLen, 11);
    s = { model, ref: rm, clean, corrupted, A: 3, Bt: 5 };
  });
  afterAll(async () => {
    await s?.model.dispose();
    rm?.cleanup();
  });
  checks(() => s, { logits: 1e-4, grad: 1e-4 });
});

// mixture-of-experts models: each expert a node with its own <in> and <router> inputs (engine/edges.ts)
describe.each(MOE_FAMILY_CASES)('edge variant vs float64, experts as nodes: $name', (c) => {
  let rm: RandomModel;
  let s: Subject;
  beforeAll(async () => {
    rm = makeCaseModel(c);
    const model = await loadModelNode(rm.dir, { backend: 'node' });
    const clean = caseTokens(rm, c.seqLen);
    const corrupted = caseTokens(rm, c.seqLen, 11);
    s = { model, ref: rm, clean, corrupted, A: 3, Bt: 5 };
  });
  afterAll(async () => {
    await s?.model.dispose();
    rm?.cleanup();
  });
  checks(() => s, { logits: 1e-4, grad: 1e-4 });
});

describe('edge variant vs float64: induction-gpt2', () => {
  let s: Subject;
  beforeAll(async () => {
    const dir = realpathSync(path.join(SHARED, 'models/induction-gpt2'));
    const model = await loadModelNode(dir, { backend: 'node' });
    const r = mulberry32(5);
    const R = Array.from({ length: 10 }, () => Math.floor(r() * 256));
    const R2 = Array.from({ length: 10 }, () => Math.floor(r() * 256));
    s = {
      model,
      ref: loadModelDir(dir),
      clean: [256, ...R, ...R.slice(0, -1)],
      corrupted: [256, ...R2, ...R.slice(0, -1)],
      A: R[R.length - 1],
      Bt: R2[R2.length - 1],
    };
  });
  afterAll(async () => {
    await s?.model.dispose();
  });
  checks(() => s, { logits: 1e-4, grad: 1e-4 });
});
