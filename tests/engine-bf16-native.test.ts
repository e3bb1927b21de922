/**
 * BF16 checkpoints on onnxruntime-web's native WebGPU build (ort.webgpu.min.mjs, the asyncify
 * runtime the page runs on). That build has no provider for Cast from bfloat16 (its CPU kernel is
 * missing; its WebGPU Cast takes no bfloat16), so a graph holding one cannot become a session.
 * The weights are handed over widened to float32 instead (runtime/pieces.ts): the graph holds no
 * BF16 tensor at f32. Checked in Node on that build's WASM provider (the same CPU kernels the
 * WebGPU session's CPU nodes get), against the float64 reference.
 */
import { describe, it, expect, afterAll } from 'vitest';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import { pathToFileURL } from 'node:url';
import onnxProto from 'onnx-proto';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { createModel, modelPartsFrom } from '../src/engine/model';
import { webSessionFactory, type OrtModule } from '../src/engine/runtime/ort-session';
import { pieceData, pieceGraph } from '../src/engine/runtime/pieces';
import {
  ALL_FAMILY_CASES,
  makeCaseModel,
  caseTokens,
  referenceForward,
  maxAbsDiff,
  type RandomModel,
} from './reference';

const { onnx } = onnxProto as any;
const DIST = dirname(createRequire(import.meta.url).resolve('onnxruntime-web/ort-wasm-simd-threaded.asyncify.wasm'));

/** onnxruntime-web's native WebGPU build, on its WASM provider */
async function nativeOrt(): Promise<OrtModule> {
  const ort = (await import(pathToFileURL(`${DIST}/ort.webgpu.min.mjs`).href)) as OrtModule;
  ort.env.wasm.numThreads = 1;
  ort.env.wasm.wasmPaths = `${DIST}/`;
  ort.env.logLevel = 'error';
  return ort;
}

/** one BF16 initializer (external data) → Cast to float32 → + x */
function castGraph(): Uint8Array {
  const init = onnx.TensorProto.create({
    name: 'w',
    dims: [4],
    dataType: 16,
    dataLocation: 1,
    externalData: [
      { key: 'location', value: 'w.bin' },
      { key: 'offset', value: '0' },
      { key: 'length', value: '8' },
    ],
  });
  const vi = (name: string) =>
    onnx.ValueInfoProto.create({ name, type: { tensorType: { elemType: 1, shape: { dim: [{ dimValue: 4 }] } } } });
  const graph = onnx.GraphProto.create({
    name: 'g',
    initializer: [init],
    node: [
      onnx.NodeProto.create({
        opType: 'Cast',
        input: ['w'],
        output: ['wf'],
        attribute: [onnx.AttributeProto.create({ name: 'to', type: 2, i: 1 })],
      }),
      onnx.NodeProto.create({ opType: 'Add', input: ['x', 'wf'], output: ['y'] }),
    ],
    input: [vi('x')],
    output: [vi('y')],
  });
  return onnx.ModelProto.encode(
    onnx.ModelProto.create({ irVersion: 8, opsetImport: [{ domain: '', version: 17 }], graph }),
  ).finish();
}

/** float32 values → their BF16 bits (exact for these values) */
const bf16 = (v: number[]) =>
  new Uint8Array(new Uint16Array(new Uint32Array(new Float32Array(v).buffer).map((u) => u >>> 16)).buffer);

describe('BF16 weights on the native WebGPU build of onnxruntime-web', () => {
  const values = [1.5, -2.25, 3.0e-5, -65280];
  let rm: RandomModel | undefined;
  afterAll(() => rm?.cleanup());

  it('that build cannot make a session of a BF16 → float32 Cast; the same graph with the weight widened by pieceGraph runs exactly', async () => {
    const ort = await nativeOrt();
    const bytes = bf16(values);
    const x = new ort.Tensor('float32', new Float32Array([1, 2, 3, 4]), [4]);
    const opts = { executionProviders: ['wasm'], externalData: [{ path: 'w.bin', data: bytes }] };
    await expect(ort.InferenceSession.create(castGraph(), opts)).rejects.toThrow(/Cast/);
    const { graphBytes, pieces } = pieceGraph(castGraph());
    expect(pieces).toEqual([{ path: 'w.bin.f32.0', file: 'w.bin', start: 0, end: 8, used: 16, widen: true }]);
    const inits = onnx.ModelProto.decode(graphBytes).graph.initializer;
    expect(inits.map((i: any) => i.dataType)).toEqual([1]);
    const s = await ort.InferenceSession.create(graphBytes, {
      executionProviders: ['wasm'],
      externalData: [{ path: pieces[0].path, data: pieceData(pieces[0], bytes) }],
    });
    const y = (await s.run({ x })).y.data as Float32Array;
    expect(Array.from(y)).toEqual(values.map((v, i) => Math.fround(v + i + 1)));
    await s.release();
  });

  it('a Gemma 3 BF16 checkpoint at f32 runs there with the float64 reference numbers, read tensor by tensor', async () => {
    const c = ALL_FAMILY_CASES.find((x) => x.name === 'gemma3-text-bf16')!;
    rm = makeCaseModel(c);
    const files = await loadModelFilesNode(rm.dir);
    expect(new Set([...files.weights.tensors.values()].map((t) => t.dtype))).toEqual(new Set(['BF16']));
    const model = await createModel(
      modelPartsFrom(files, { bundled: false, weightsMode: 'f32' }),
      webSessionFactory(await nativeOrt(), 'wasm'),
    );
    try {
      expect(model.info.weights).toBe('f32');
      const tokens = caseTokens(rm, c.seqLen);
      const out = await model.run(tokens, { hooks: 'all' });
      const d = maxAbsDiff(referenceForward(rm, tokens).logits.data, out.logits.data).maxAbs;
      expect(d).toBeLessThan(1e-4);
    } finally {
      await model.dispose();
    }
  });
});
