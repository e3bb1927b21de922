/**
 * GraphPlan.unembedApart: on onnxruntime-node a tied float32 embedding's unembedding reads the
 * table through an initializer of its own (so the packed Gemm weight's mapping is let go and the
 * lookup's stays untouched; bench "Peak memory"). The logits are the same bits as with the table
 * shared, and the float64 reference's; the loaded model's hooked graph has it; a 16-bit table or
 * another backend keeps one initializer.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { nodeFactory, loadModelNode } from '../src/node/load';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { describeModel } from '../src/engine/arch';
import { buildModelGraph, type BuiltGraph } from '../src/engine/graph/build-model';
import { buildFeeds } from '../src/engine/runtime/feeds';
import type { WeightSet } from '../src/engine/safetensors-types';
import onnxProto from 'onnx-proto';
import {
  ALL_FAMILY_CASES,
  makeCaseModel,
  caseTokens,
  referenceForward,
  maxAbsDiff,
  type RandomModel,
} from './reference';

const { onnx } = onnxProto as any;
const initializers = (g: BuiltGraph): string[] =>
  (onnx.ModelProto.decode(g.bytes).graph.initializer as { name: string }[]).map((i) => i.name);
const tableInits = (g: BuiltGraph) => initializers(g).filter((n) => n.startsWith('w:transformer.wte.weight'));

describe('unembedApart', () => {
  let tied: RandomModel, half: RandomModel;
  beforeAll(() => {
    tied = makeCaseModel(ALL_FAMILY_CASES.find((c) => c.name === 'gpt2-tied')!);
    half = makeCaseModel(
      ALL_FAMILY_CASES.find((c) => c.name === 'gpt2-tied')!,
      { dtype: 'F16' },
    );
  });
  afterAll(() => {
    for (const m of [tied, half]) m?.cleanup();
  });

  it('a tied float32 table: its own initializer on onnxruntime-node, the same logits bit for bit', async () => {
    const files = await loadModelFilesNode(tied.dir);
    const weights = files.weights as WeightSet;
    const spec = describeModel({ config: files.config as Record<string, any>, tensors: weights.tensors });
    const factory = await nodeFactory('node', 1);
    expect(factory.unembedApart).toBe(true);
    expect((await nodeFactory('wasm', 1)).unembedApart).toBeUndefined();
    const tokens = caseTokens(tied, 12);
    const logits = async (unembedApart: boolean) => {
      const graph = buildModelGraph(spec, weights.tensors, { hooks: true, withResult: false, unembedApart });
      expect(tableInits(graph)).toEqual(
        unembedApart ? ['w:transformer.wte.weight', 'w:transformer.wte.weight#unembed'] : ['w:transformer.wte.weight'],
      );
      const session = await factory.create(graph, weights);
      try {
        const feeds = buildFeeds(factory.ort, spec, graph, { rows: [tokens], sites: new Map() });
        return (await session.run(feeds, ['logits'])).logits.data as Float32Array;
      } finally {
        await session.release();
      }
    };
    const apart = await logits(true);
    expect(maxAbsDiff(await logits(false), apart).maxAbs).toBe(0);
    expect(maxAbsDiff(referenceForward(tied, tokens).logits.data, apart).maxAbs).toBeLessThan(1e-4);
  });

  it('the loaded model builds it; a 16-bit table held as stored keeps one initializer', async () => {
    const model = await loadModelNode(tied.dir, { backend: 'node', threads: 1 });
    try {
      const out = await model.run(caseTokens(tied, 12));
      const built = [...((model as any).created as Map<string, { graph: BuiltGraph }>).values()];
      expect(built.map((b) => tableInits(b.graph))).toContainEqual([
        'w:transformer.wte.weight',
        'w:transformer.wte.weight#unembed',
      ]);
      expect(maxAbsDiff(referenceForward(tied, caseTokens(tied, 12)).logits.data, out.logits.data).maxAbs).toBeLessThan(
        1e-4,
      );
    } finally {
      await model.dispose();
    }
    const files = await loadModelFilesNode(half.dir);
    const weights = files.weights as WeightSet;
    const spec = describeModel({ config: files.config as Record<string, any>, tensors: weights.tensors });
    const graph = buildModelGraph(spec, weights.tensors, {
      hooks: true,
      withResult: false,
      unembedApart: true,
      weights: 'stored',
    });
    expect(tableInits(graph)).toEqual(['w:transformer.wte.weight']);
  });
});
