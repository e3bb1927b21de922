/**
 * The page bench's feeds (bench/page-wasm.ts): built by the engine's feed builder, carried as plain
 * numbers and rebuilt by the harness's own source (FROM_WIRE), they run the hooked graph on
 * onnxruntime-web WASM (as the page's harness does) on a tiny random model, every input fed and the
 * logits the float64 reference's. The bench's copy of the feeds once lacked generate's pick inputs.
 */
import { describe, it, expect, beforeAll } from 'vitest';
import { readFileSync } from 'node:fs';
import { nodeFactory } from '../src/node/load';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { describeModel } from '../src/engine/arch';
import { buildModelGraph } from '../src/engine/graph/build-model';
import type { WeightSet } from '../src/engine/safetensors-types';
import type { OrtModule, OrtTensorLike } from '../src/engine/runtime/ort-session';
import { FROM_WIRE, wireFeeds } from '../bench/page-wasm';
import {
  ALL_FAMILY_CASES,
  makeCaseModel,
  caseTokens,
  referenceForward,
  maxAbsDiff,
  type RandomModel,
} from './reference';

const fromWire = new Function(`return ${FROM_WIRE}`)() as (
  ort: OrtModule,
  wire: ReturnType<typeof wireFeeds>,
) => Record<string, OrtTensorLike>;

describe('bench/page-wasm feeds', () => {
  let rm: RandomModel;
  beforeAll(() => {
    rm = makeCaseModel(ALL_FAMILY_CASES.find((c) => c.name === 'gpt2-tied')!);
  });

  it('feed every input of the hooked graph and give the float64 reference logits on WASM', async () => {
    const files = await loadModelFilesNode(rm.dir);
    const weights = files.weights as WeightSet;
    const spec = describeModel({ config: files.config as Record<string, any>, tensors: weights.tensors });
    for (const [file, p] of weights.paths)
      if (!weights.files.has(file)) weights.files.set(file, new Uint8Array(readFileSync(p))); // ORT-web takes bytes
    const graph = buildModelGraph(spec, weights.tensors, { hooks: true, withResult: false });
    const tokens = caseTokens(rm, 12);
    const wire = wireFeeds(spec, graph, [tokens]);
    expect(Object.keys(wire).sort()).toEqual([...graph.inputNames].sort());
    // what page.evaluate carries: JSON-like values (−Infinity in the mask is carried by Playwright, not by JSON)
    expect(Object.values(wire).every((f) => Array.isArray(f.data) && f.data.every((x) => typeof x === 'number'))).toBe(
      true,
    );
    const factory = await nodeFactory('wasm', 1);
    const session = await factory.create(graph, weights);
    try {
      const outputs = graph.outputNames.filter((n) => !n.startsWith('present.'));
      const out = await session.run(fromWire(factory.ort, wire), outputs);
      const ref = referenceForward(rm, tokens);
      expect(maxAbsDiff(ref.logits.data, out.logits.data as Float32Array).maxAbs).toBeLessThan(1e-4);
    } finally {
      await session.release();
    }
  });
});
