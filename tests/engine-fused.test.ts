/**
 * onnxruntime's fused kernels (GraphPlan.fused: FastGelu / Gelu, LayerNormalization /
 * SimplifiedLayerNormalization where no hook reads the norm's scale) against the decomposed graph
 * and the float64 reference, on random-weight models of every family: the plain graph's logits,
 * and a lean variant's (the scans' graph) with an intervention.
 */
import { readFileSync } from 'node:fs';
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode, nodeFactory } from '../src/node/load';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { describeModel } from '../src/engine/arch';
import { buildModelGraph } from '../src/engine/graph/build-model';
import { buildFeeds } from '../src/engine/runtime/feeds';
import type { LoadedModel } from '../src/engine/api';
import type { WeightSet } from '../src/engine/safetensors-types';
import { ALL_FAMILY_CASES, makeCaseModel, caseTokens, referenceForward, maxAbsDiff, type RandomModel } from './reference';

/** fused vs decomposed: float32 rounding of a different summation order only */
const SAME = 1e-5;
/** against the float64 reference (the engine's own reference tests allow 1e-4; measured here ≤ 6e-6) */
const REF = 1e-5;

/** op types in an ONNX graph's bytes (node op_type strings are stored verbatim) */
const has = (bytes: Uint8Array, op: string) => new TextDecoder('latin1').decode(bytes).includes(op);

describe.each(ALL_FAMILY_CASES)('fused kernels: $name', (c) => {
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

  it('the plain graph with fused kernels equals the decomposed one (1e-5) and the float64 reference (1e-5), on onnxruntime-node and WASM', async () => {
    const files = await loadModelFilesNode(rm.dir);
    const weights = files.weights as WeightSet;
    const spec = describeModel({ config: files.config as Record<string, any>, tensors: weights.tensors });
    for (const [file, p] of weights.paths) if (!weights.files.has(file)) weights.files.set(file, new Uint8Array(readFileSync(p))); // ORT-web takes external data as bytes
    for (const backend of ['node', 'wasm'] as const) {
    const factory = await nodeFactory(backend, 1);
    const logits = async (fused: boolean) => {
      const graph = buildModelGraph(spec, weights.tensors, { hooks: false, withResult: false, fused });
      const norm = spec.norm === 'layernorm' ? 'LayerNormalization' : 'SimplifiedLayerNormalization';
      expect(has(graph.bytes, norm)).toBe(fused);
      const session = await factory.create(graph, weights);
      try {
        const out = await session.run(buildFeeds(factory.ort, spec, graph, { rows: [tokens], sites: new Map() }), ['logits']);
        return out.logits.data as Float32Array;
      } finally {
        await session.release();
      }
    };
    const fused = await logits(true);
    const plain = await logits(false);
    const ref = referenceForward(rm, tokens);
    const dFused = maxAbsDiff(plain, fused).maxAbs;
    const dRef = maxAbsDiff(ref.logits.data, fused).maxAbs;
    console.log(`${c.name} ${backend}: plain fused − decomposed |Δ| ${dFused.toExponential(2)}, fused − float64 ${dRef.toExponential(2)}, decomposed − float64 ${maxAbsDiff(ref.logits.data, plain).maxAbs.toExponential(2)}`);
    expect(dFused).toBeLessThan(SAME);
    expect(dRef).toBeLessThan(REF);
    }
  });

  it('a lean variant (fused norms) with a head ablated equals the hooked graph (1e-5) and the reference (1e-5)', async () => {
    const layer = model.info.n_layers - 1;
    const head = 1 % model.info.n_heads;
    const Dh = model.info.d_head;
    const iv = [{ hook: `blocks.${layer}.attn.hook_z`, op: 'zero' as const, head }];
    const lean = await model.run(tokens, { interventions: iv, lean: true });
    const full = await model.run(tokens, { interventions: iv });
    const ref = referenceForward(rm, tokens, {
      hook: (name, v, dims) => {
        if (name !== `blocks.${layer}.attn.hook_z`) return;
        const H = dims[2];
        for (let t = 0; t < dims[1]; t++) for (let d = 0; d < Dh; d++) v[(t * H + head) * Dh + d] = 0;
        return v;
      },
    });
    expect(maxAbsDiff(full.logits.data, lean.logits.data).maxAbs).toBeLessThan(SAME);
    expect(maxAbsDiff(ref.logits.data, lean.logits.data).maxAbs).toBeLessThan(REF);
  });
});
