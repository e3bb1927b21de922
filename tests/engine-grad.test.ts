/**
 * The backward graph (src/engine/graph/backward.ts) against central finite differences of the
 * independent float64 reference forward (tests/reference), on random-weight models of every
 * family. Metric M = logit[A] − logit[B] at the last position. For every hook the engine can
 * differentiate and the reference exposes, the engine's ∂M/∂hook (float32, one backward) is
 * compared with (M(h + εv) − M(h − εv)) / 2ε along random directions v, and on single elements.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import { OnnxGraph } from '../src/engine/graph/onnx-builder';
import { addBackward } from '../src/engine/graph/backward';
import { deltaRuleScan } from '../src/engine/graph/delta-rule';
import type { LoadedModel } from '../src/engine/api';
import type { Tensor } from '../src/engine/tensor';
import {
  ALL_FAMILY_CASES,
  makeCaseModel,
  caseTokens,
  referenceForward,
  mulberry32,
  gaussian,
  type RandomModel,
  maxAbsDiff,
} from './reference';

const worst: { name: string; rel: number; hook: string }[] = [];

function seedFor(V: number, a: number, b: number): Tensor {
  const s = new Float32Array(V);
  s[a] += 1;
  s[b] -= 1;
  return { dims: [1, 1, V], data: s };
}

describe.each(ALL_FAMILY_CASES)('gradients vs float64 finite differences: $name', (c) => {
  let rm: RandomModel;
  let model: LoadedModel;
  let tokens: number[];
  beforeAll(async () => {
    rm = makeCaseModel(c);
    model = await loadModelNode(rm.dir, { backend: 'node' });
    tokens = caseTokens(rm, c.seqLen);
  });
  afterAll(async () => {
    await model?.dispose();
    rm?.cleanup();
  });

  it('∂(logit[A] − logit[B])/∂hook agrees with central differences at every hook', async () => {
    const V = model.info.d_vocab;
    const T = tokens.length;
    const A = 3,
      Bt = 5;
    const ref0 = referenceForward(rm, tokens, { record: false });
    const refNames = new Set(Object.keys(referenceForward(rm, tokens).hooks));
    const hooks = model.hookNames().filter((h) => refNames.has(h));
    const plain = await model.run(tokens, { hooks, logitPositions: [T - 1] });
    const out = await model.run(tokens, { hooks, logitPositions: [T - 1], grad: { hooks, seed: seedFor(V, A, Bt) } });
    // the forward numbers do not change: the backward nodes only read forward tensors. They are
    // bit-identical except where the hooked graph uses a fused kernel (GELU in either form; the
    // q/k norms, which have no hook_scale) — the backward reads the intermediates, so the gradient
    // graph keeps the decomposed ops (GraphPlan.fused): float32 rounding, a few ulp of each tensor's values
    // (relative to its largest |value|: gemma3-text-bf16's logits reach 38).
    const rel = (a: Float32Array, b: Float32Array) =>
      maxAbsDiff(a, b).maxAbs / Math.max(1, ...Array.from(b, (x) => (Number.isFinite(x) ? Math.abs(x) : 0)));
    let fwdDiff = rel(out.logits.data, plain.logits.data);
    for (const h of hooks) fwdDiff = Math.max(fwdDiff, rel(out.hooks[h].data, plain.hooks[h].data));
    const fused = model.spec.layers.some(
      (l) => (l.mlp!.act !== 'relu' && l.mlp!.act !== 'silu') || l.attn?.qNorm || l.attn?.kNorm,
    );
    if (fused) expect(fwdDiff).toBeLessThan(2e-6);
    else expect(fwdDiff).toBe(0);

    const metric = (hook: string, dir: Float64Array, eps: number) => {
      const r = referenceForward(rm, tokens, {
        record: false,
        hook: (name, v) => {
          if (name !== hook) return;
          for (let i = 0; i < v.length; i++) v[i] += eps * dir[i];
          return v;
        },
      });
      const L = r.logits.data;
      return L[(T - 1) * V + A] - L[(T - 1) * V + Bt];
    };
    const m0 = ref0.logits.data[(T - 1) * V + A] - ref0.logits.data[(T - 1) * V + Bt];
    expect(Math.abs(metric(hooks[0], new Float64Array(out.hooks[hooks[0]].data.length), 0) - m0)).toBe(0);

    const rnd = gaussian(mulberry32(99));
    let caseWorst = { rel: 0, hook: '' };
    for (const h of hooks) {
      const gr = out.grads![h];
      expect(gr.dims, h).toEqual(out.hooks[h].dims);
      const n = gr.data.length;
      const dirs: Float64Array[] = [];
      for (let k = 0; k < 2; k++) dirs.push(Float64Array.from({ length: n }, () => rnd()));
      // one single element: the one with the largest gradient
      let big = 0;
      for (let i = 1; i < n; i++) if (Math.abs(gr.data[i]) > Math.abs(gr.data[big])) big = i;
      const e = new Float64Array(n);
      e[big] = 1;
      dirs.push(e);
      for (const d of dirs) {
        const eps = 1e-4;
        const fd = (metric(h, d, eps) - metric(h, d, -eps)) / (2 * eps);
        let ad = 0;
        for (let i = 0; i < n; i++) if (Number.isFinite(out.hooks[h].data[i]) || d[i] === 0) ad += d[i] * gr.data[i];
        const scale = Math.max(Math.abs(fd), 1e-2);
        const rel = Math.abs(ad - fd) / scale;
        if (rel > caseWorst.rel) caseWorst = { rel, hook: h };
        expect(rel, `${h}: engine ${ad} vs finite difference ${fd}`).toBeLessThan(2e-3);
      }
    }
    worst.push({ name: c.name, ...caseWorst });
    console.log(
      `${c.name}: forward max |Δ| vs the plain graph ${fwdDiff.toExponential(1)}; ${hooks.length} hooks, worst relative error ${caseWorst.rel.toExponential(2)} at ${caseWorst.hook}`,
    );
  }, 120_000);
});

afterAll(() => {
  if (worst.length) {
    const w = worst.reduce((a, b) => (b.rel > a.rel ? b : a));
    console.log(`gradients: worst relative error over all families ${w.rel.toExponential(2)} (${w.name}, ${w.hook})`);
  }
});

describe('backward transform: errors', () => {
  it('an op without a VJP rule on the gradient path is UNSUPPORTED_OP naming the op', () => {
    const g = new OnnxGraph((f) => f);
    const x = g.input('x', 'float', [2, 3]);
    const y = g.o('Pow', [x, g.constF([2], [])]);
    g.identity(g.o('Add', [y, x]), 'out');
    g.output('out');
    g.input('seed', 'float', [2, 3]);
    let err: any;
    try {
      addBackward(g, { output: 'out', seed: 'seed', wrt: ['x'], symbols: [{}, {}] });
    } catch (e) {
      err = e;
    }
    expect(err?.code).toBe('UNSUPPORTED_OP');
    expect(err.message).toContain("'Pow'");
  });

  it("a Scan is differentiated only when it is the gated delta rule's (delta-rule.ts); another body is UNSUPPORTED_OP", () => {
    const scanGraph = (delta: boolean) => {
      const g = new OnnxGraph((f) => f);
      const d = { Hv: 2, Dk: 3, Dv: 4 };
      const x = g.input('x', 'float', [1, 5, 2, 3]);
      const ins = [
        g.input('s0', 'float', [1, 2, 3, 4]),
        x,
        x,
        g.input('v', 'float', [1, 5, 2, 4]),
        g.input('b', 'float', [1, 5, 2]),
        g.input('gl', 'float', [1, 5, 2]),
      ];
      let out: string;
      if (delta) out = deltaRuleScan(g, 'la_', d, ins)[1];
      else {
        // a running sum of x: a different recurrence
        const f = g.body('cs_');
        const [s, xt] = [f.input('cs_s', 'float', [1, 2, 3]), f.input('cs_x', 'float', [1, 2, 3])];
        const next = f.o('Add', [s, xt]);
        f.output(next, 'float', [1, 2, 3]);
        f.output(f.o('Identity', [next]), 'float', [1, 2, 3]);
        const s0 = g.o('ReduceSum', [ins[0], g.constI([3])], { keepdims: 0 });
        out = g.op(
          'Scan',
          [s0, x],
          { body: { graph: f }, num_scan_inputs: 1, scan_input_axes: [1], scan_output_axes: [1] },
          2,
        )[1];
      }
      g.identity(out, 'out');
      g.output('out');
      g.input('seed', 'float', delta ? [1, 5, 2, 4] : [1, 5, 2, 3]);
      return () => addBackward(g, { output: 'out', seed: 'seed', wrt: ['x'], symbols: [{}, {}] });
    };
    expect(scanGraph(true)).not.toThrow();
    let err: any;
    try {
      scanGraph(false)();
    } catch (e) {
      err = e;
    }
    expect(err?.code).toBe('UNSUPPORTED_OP');
    expect(err.message).toContain("'Scan'");
    expect(err.details).toEqual({ op: 'Scan' });
  });

  it('a hook off the path to the logits (hook_result) is refused, not answered with zeros', async () => {
    const rm = makeCaseModel(ALL_FAMILY_CASES[0]);
    const model = await loadModelNode(rm.dir, { backend: 'node' });
    try {
      const V = model.info.d_vocab;
      const toks = caseTokens(rm, 5);
      await expect(
        model.run(toks, {
          logitPositions: [4],
          grad: { hooks: ['blocks.0.attn.hook_result'], seed: seedFor(V, 1, 2) },
        }),
      ).rejects.toMatchObject({ code: 'UNKNOWN_HOOK' });
      await expect(
        model.run(toks, {
          withResult: true,
          logitPositions: [4],
          grad: { hooks: ['blocks.0.attn.hook_result'], seed: seedFor(V, 1, 2) },
        }),
      ).rejects.toMatchObject({ code: 'BAD_INPUT' });
      await expect(
        model.run(toks, {
          logitPositions: [4],
          grad: { hooks: ['blocks.0.hook_resid_pre'], seed: seedFor(V + 1, 1, 2) },
        }),
      ).rejects.toMatchObject({ code: 'BAD_INPUT' });
    } finally {
      await model.dispose();
      rm.cleanup();
    }
  });
});
