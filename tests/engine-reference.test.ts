/**
 * The engine (ONNX graph on onnxruntime-node) against the independent float64 reference forward
 * (tests/reference, no shared code) on random-weight models of every supported family: every
 * TransformerLens hook and the logits within 1e-4, plus interventions and batching, and the fused
 * kernels of the plain graph and the lean variant within 1e-5.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { readFileSync } from 'node:fs';
import { loadModelNode, nodeFactory } from '../src/node/load';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { createModel, modelPartsFrom } from '../src/engine/model';
import { describeModel } from '../src/engine/arch';
import { buildModelGraph, type BuiltGraph } from '../src/engine/graph/build-model';
import onnxProto from 'onnx-proto';
import { buildFeeds } from '../src/engine/runtime/feeds';
import type { WeightSet } from '../src/engine/safetensors-types';
import type { LoadedModel } from '../src/engine/api';
import {
  ALL_FAMILY_CASES,
  makeCaseModel,
  caseTokens,
  referenceForward,
  compareHooks,
  maxAbsDiff,
  type RandomModel,
} from './reference';

const { onnx } = onnxProto as any;

const TOL = 1e-4;
/**
 * onnxruntime's fused kernels (GraphPlan.fused: FastGelu / Gelu; LayerNormalization /
 * SimplifiedLayerNormalization where no hook reads the norm's scale; and, asked for with
 * ALL_KERNELS, SkipLayerNormalization / SkipSimplifiedLayerNormalization and MultiHeadAttention
 * where no hook needs their intermediates) against the decomposed graph and the reference:
 * float32 rounding of another summation order (measured ≤ 7e-6)
 */
const FUSED_TOL = 1e-5;
/**
 * FUSED_TOL for values of this size: float32 rounding grows with the values, and a few cases run
 * larger than the ~10 most reach (gemma3-text-bf16: residual stream to 12.8, logits to 38)
 */
const fusedTol = (v: ArrayLike<number>) => {
  let m = 0;
  for (let i = 0; i < v.length; i++) if (Number.isFinite(v[i])) m = Math.max(m, Math.abs(v[i]));
  return FUSED_TOL * Math.max(1, m / 8);
};

/** how many nodes of each of these op types a graph has */
function opCounts(graph: BuiltGraph, types: string[]): Record<string, number> {
  const counts = Object.fromEntries(types.map((t) => [t, 0]));
  for (const n of (onnx.ModelProto.decode(graph.bytes) as { graph: { node: { opType: string }[] } }).graph.node)
    if (n.opType in counts) counts[n.opType] += 1;
  return counts;
}
const SKIP_NORMS = ['SkipLayerNormalization', 'SkipSimplifiedLayerNormalization'];
/** the fused kernels a graph may add beyond the activation and norm ones: residual add + norm, attention */
const NEW_KERNELS = [...SKIP_NORMS, 'MultiHeadAttention'];
const skipNorms = (c: Record<string, number>) => c.SkipLayerNormalization + c.SkipSimplifiedLayerNormalization;
/** GraphPlan.fused with the kernels that are off by default on too */
const ALL_KERNELS = { skipNorm: true, attention: true };

describe.each(ALL_FAMILY_CASES)('engine vs float64 reference: $name', (c) => {
  let rm: RandomModel;
  let model: LoadedModel;
  let tokens: number[];
  beforeAll(async () => {
    rm = makeCaseModel(c);
    model = await loadModelNode(rm.dir);
    tokens = caseTokens(rm, c.seqLen);
  });
  afterAll(async () => {
    await model?.dispose();
    rm?.cleanup();
  });

  it('every hook (hook_result included) and the logits agree within 1e-4', async () => {
    const ref = referenceForward(rm, tokens);
    const out = await model.run(tokens, { hooks: 'all', withResult: true });
    const names = model.hookNames({ withResult: true });
    const refNames = Object.keys(ref.hooks);
    // the engine offers TL hooks the reference computes, and nothing the reference lacks
    for (const n of names) expect(refNames, n).toContain(n);
    const cmp = compareHooks(
      ref.hooks,
      out.hooks,
      names.filter((n) => n in ref.hooks),
      TOL,
    );
    const bad = cmp.filter((r) => !r.ok);
    expect(bad, JSON.stringify(bad.slice(0, 5))).toEqual([]);
    expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs).toBeLessThan(TOL);
    const worst = Math.max(...cmp.map((r) => r.maxAbs));
    console.log(
      `${c.name}: ${cmp.length} hooks, worst |Δ| ${worst.toExponential(2)}, logits |Δ| ${maxAbsDiff(ref.logits.data, out.logits.data).maxAbs.toExponential(2)}`,
    );
  });

  it('zero-ablating one head equals the reference with that head of hook_z zeroed', async () => {
    const layer = model.info.n_layers - 1;
    const head = 1 % model.info.n_heads;
    const Dh = model.info.d_head;
    const ref = referenceForward(rm, tokens, {
      hook: (name, v, dims) => {
        if (name !== `blocks.${layer}.attn.hook_z`) return;
        const H = dims[2];
        for (let t = 0; t < dims[1]; t++) for (let d = 0; d < Dh; d++) v[(t * H + head) * Dh + d] = 0;
        return v;
      },
    });
    const interventions = [{ hook: `blocks.${layer}.attn.hook_z`, op: 'zero' as const, head }];
    const out = await model.run(tokens, { interventions });
    expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs).toBeLessThan(TOL);
    // the scans' lean variant (fused norms: no hook reads their scale) gives the same numbers
    const lean = await model.run(tokens, { interventions, lean: true });
    expect(maxAbsDiff(out.logits.data, lean.logits.data).maxAbs).toBeLessThan(fusedTol(ref.logits.data));
    expect(maxAbsDiff(ref.logits.data, lean.logits.data).maxAbs).toBeLessThan(fusedTol(ref.logits.data));
  });

  it('the plain graph with every fused kernel equals the decomposed one and the float64 reference (1e-5), on onnxruntime-node and WASM', async () => {
    const files = await loadModelFilesNode(rm.dir);
    const weights = files.weights as WeightSet;
    const spec = describeModel({ config: files.config as Record<string, any>, tensors: weights.tensors });
    for (const [file, p] of weights.paths)
      if (!weights.files.has(file)) weights.files.set(file, new Uint8Array(readFileSync(p))); // ORT-web takes external data as bytes
    const ref = referenceForward(rm, tokens);
    // by default the activation and norm kernels only (the others measured no faster on CPU)
    const byDefault = opCounts(buildModelGraph(spec, weights.tensors, { hooks: false, withResult: false }), [
      ...NEW_KERNELS,
      'LayerNormalization',
      'SimplifiedLayerNormalization',
    ]);
    expect(skipNorms(byDefault) + byDefault.MultiHeadAttention).toBe(0);
    expect(byDefault.LayerNormalization + byDefault.SimplifiedLayerNormalization).toBeGreaterThan(0);
    for (const backend of ['node', 'wasm'] as const) {
      const factory = await nodeFactory(backend, 1);
      const logits = async (fused: boolean) => {
        const graph = buildModelGraph(spec, weights.tensors, {
          hooks: false,
          withResult: false,
          fused: fused && ALL_KERNELS,
        });
        const counts = opCounts(graph, [
          ...NEW_KERNELS,
          'LayerNormalization',
          'SimplifiedLayerNormalization',
          'Softmax',
        ]);
        // every residual add with the norm after it is one kernel (the first block's too, where there are learned
        // positions): each pre-attention norm but the first block's, each pre-MLP norm of a sequential block, ln_final
        const addNorms =
          spec.layers.filter((l, i) => l.ln1 && (i > 0 || spec.posEmbed)).length +
          spec.layers.filter((l) => l.ln2 && !l.parallel).length +
          1;
        expect(skipNorms(counts)).toBe(fused ? addNorms : 0);
        // MultiHeadAttention in every layer without an attention soft-cap (the kernel has none)
        const capped = spec.layers.filter((l) => l.attn!.softcap !== null).length;
        expect(counts.MultiHeadAttention).toBe(fused ? spec.nLayers - capped : 0);
        expect(counts.Softmax).toBe(fused ? capped : spec.nLayers);
        const session = await factory.create(graph, weights);
        try {
          return (
            await session.run(buildFeeds(factory.ort, spec, graph, { rows: [tokens], sites: new Map() }), ['logits'])
          ).logits.data as Float32Array;
        } finally {
          await session.release();
        }
      };
      const fused = await logits(true);
      const plain = await logits(false);
      const dFused = maxAbsDiff(plain, fused).maxAbs,
        dRef = maxAbsDiff(ref.logits.data, fused).maxAbs;
      console.log(
        `${c.name} ${backend}: plain fused − decomposed |Δ| ${dFused.toExponential(2)}, fused − float64 ${dRef.toExponential(2)}, decomposed − float64 ${maxAbsDiff(ref.logits.data, plain).maxAbs.toExponential(2)}`,
      );
      expect(dFused).toBeLessThan(fusedTol(ref.logits.data));
      expect(dRef).toBeLessThan(fusedTol(ref.logits.data));
    }
  });

  it('a lean variant with SkipLayerNormalization and MultiHeadAttention keeps its site, its outputs, the KV cache and logit positions (reference, 1e-5)', async () => {
    const L = model.info.n_layers;
    const D = model.info.d_model;
    const d = Array.from({ length: D }, (_, i) => Math.cos(i + 2));
    const alpha = 0.5;
    // a site on the last block's residual (that add and norm stay apart), outputs on sums the kernels give out
    const site = `blocks.${L - 1}.hook_resid_pre`;
    const outputs = ['blocks.0.hook_resid_post', `blocks.${L - 1}.attn.hook_z`, `blocks.${L - 1}.hook_resid_post`];
    const interventions = [{ hook: site, op: 'add' as const, value: d, alpha }];
    // a copy: the reference keeps blocks.{L-2}.hook_resid_post, the same array, as it was before this edit
    const ref = referenceForward(rm, tokens, {
      hook: (name, v) => (name === site ? v.map((x, i) => x + alpha * d[i % D]) : undefined),
    });

    // the variant those runs take uses both kernels wherever no site or scores/pattern hook is in the way
    const files = await loadModelFilesNode(rm.dir);
    const lean = buildModelGraph(model.spec, files.weights.tensors, {
      hooks: true,
      withResult: false,
      lean: { sites: [site], outputs: [...outputs].sort() },
      fused: ALL_KERNELS,
    });
    const counts = opCounts(lean, NEW_KERNELS);
    expect(counts.MultiHeadAttention).toBe(model.spec.layers.filter((l) => l.attn!.softcap === null).length);
    expect(skipNorms(counts)).toBeGreaterThan(0);
    const fused = await createModel(
      { ...modelPartsFrom(files, { bundled: false, id: rm.dir }), fused: ALL_KERNELS },
      await nodeFactory('node'),
    );
    try {
      const out = await fused.run(tokens, { lean: true, interventions, hooks: outputs });
      for (const h of outputs)
        expect(maxAbsDiff(ref.hooks[h].data, out.hooks[h].data).maxAbs, h).toBeLessThan(fusedTol(ref.hooks[h].data));
      expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs).toBeLessThan(fusedTol(ref.logits.data));

      // continued from a KV cache, logits at the last position only
      const split = Math.floor(tokens.length / 2);
      const first = await fused.run(tokens.slice(0, split), { lean: true, interventions, returnCache: true });
      const rest = await fused.run(tokens.slice(split), {
        lean: true,
        interventions,
        past: first.present,
        logitPositions: [tokens.length - split - 1],
      });
      const V = model.info.d_vocab;
      expect(rest.logits.data.length).toBe(V);
      expect(maxAbsDiff(ref.logits.data.subarray((tokens.length - 1) * V), rest.logits.data).maxAbs).toBeLessThan(
        fusedTol(ref.logits.data),
      );
    } finally {
      await fused.dispose();
    }
  });

  it('adding α·d at hook_resid_pre equals the reference doing the same; a batch of variants equals one-by-one runs', async () => {
    const D = model.info.d_model;
    const d = Array.from({ length: D }, (_, i) => Math.sin(i + 1));
    const alpha = 0.7;
    const hook = `blocks.${Math.min(1, model.info.n_layers - 1)}.hook_resid_pre`;
    const ref = referenceForward(rm, tokens, {
      hook: (name, v) => {
        if (name !== hook) return;
        for (let i = 0; i < v.length; i++) v[i] += alpha * d[i % D];
        return v;
      },
    });
    const single = await model.run(tokens, { interventions: [{ hook, op: 'add', value: d, alpha }] });
    expect(maxAbsDiff(ref.logits.data, single.logits.data).maxAbs).toBeLessThan(TOL);

    // row 0 clean, row 1 steered, row 2 a head ablation: one run
    const z = `blocks.0.attn.hook_z`;
    const batched = await model.run(tokens, {
      batch: 3,
      interventions: [
        { hook, op: 'add', value: d, alpha, batch: [1] },
        { hook: z, op: 'zero', head: 0, batch: [2] },
      ],
    });
    const clean = await model.run(tokens);
    const abl = await model.run(tokens, { interventions: [{ hook: z, op: 'zero', head: 0 }] });
    const n = clean.logits.data.length;
    expect(maxAbsDiff(batched.logits.data.subarray(0, n), clean.logits.data).maxAbs).toBeLessThan(1e-5);
    expect(maxAbsDiff(batched.logits.data.subarray(n, 2 * n), single.logits.data).maxAbs).toBeLessThan(1e-5);
    expect(maxAbsDiff(batched.logits.data.subarray(2 * n), abl.logits.data).maxAbs).toBeLessThan(1e-5);
  });

  it('KV-cached continuation equals the full run', async () => {
    const split = Math.floor(tokens.length / 2);
    const first = await model.run(tokens.slice(0, split), { returnCache: true });
    const rest = await model.run(tokens.slice(split), { past: first.present, hooks: [`blocks.0.attn.hook_pattern`] });
    const full = await model.run(tokens, { hooks: [`blocks.0.attn.hook_pattern`] });
    const V = model.info.d_vocab;
    expect(maxAbsDiff(rest.logits.data, full.logits.data.subarray(split * V)).maxAbs).toBeLessThan(1e-5);
    const T = tokens.length;
    const H = model.info.n_heads;
    // the continuation's pattern rows are the full run's last rows
    const p = rest.hooks['blocks.0.attn.hook_pattern'];
    expect(p.dims).toEqual([1, H, T - split, T]);
    for (let h = 0; h < H; h++) {
      const a = p.data.subarray(h * (T - split) * T, (h + 1) * (T - split) * T);
      const b = full.hooks['blocks.0.attn.hook_pattern'].data.subarray((h * T + split) * T, (h + 1) * T * T);
      expect(maxAbsDiff(a, b).maxAbs).toBeLessThan(1e-5);
    }
  });
});
