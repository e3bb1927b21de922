/**
 * Weight precision (src/engine/precision.ts): `stored` keeps F16/BF16 weights 16-bit in the
 * session and widens them at use; `f32` widens them up front. Both are judged against the
 * independent float64 reference forward (tests/reference) on F16 and BF16 random models, and
 * against each other. The optimized graph onnxruntime actually runs is inspected to show that
 * the widening is not folded back into float32 copies of the weights.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdtempSync, linkSync, writeFileSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { buildModelGraph } from '../src/engine/graph/build-model';
import { describeModel } from '../src/engine/arch';
import { readSafetensorsHeaderFromDisk } from '../src/node/load-files-node';
import { choosePrecision, parseWeightsMode } from '../src/engine/precision';
import { modelBlockOf } from '../src/schema/common';
import { optimizedGraphStats } from './helpers/ort-optimized';
import {
  ALL_FAMILY_CASES,
  makeCaseModel,
  caseTokens,
  referenceForward,
  compareHooks,
  maxAbsDiff,
  type RandomModel,
} from './reference';

const TOL = 1e-4;

// families whose graphs differ where weights enter: learned positions + tied unembedding (gpt2),
// GQA + SwiGLU (llama), parallel residual + fused qkv (neox), embedding scale + 1+w norms + soft-caps (gemma2)
const CASES = ['gpt2-tied', 'llama-gqa-tied', 'neox-parallel-rot25', 'gemma2-softcap-window'].flatMap((name) =>
  (['F16', 'BF16'] as const).map((dtype) => ({ c: ALL_FAMILY_CASES.find((x) => x.name === name)!, dtype })),
);

describe.each(CASES)('stored vs f32 weights: $c.name $dtype', ({ c, dtype }) => {
  let rm: RandomModel;
  const models: Record<string, LoadedModel> = {};
  let tokens: number[];
  beforeAll(async () => {
    rm = makeCaseModel(c, { dtype });
    models.stored = await loadModelNode(rm.dir, { weights: 'stored' });
    models.f32 = await loadModelNode(rm.dir, { weights: 'f32' });
    tokens = caseTokens(rm, c.seqLen);
  });
  afterAll(async () => {
    for (const m of Object.values(models)) await m.dispose();
    rm?.cleanup();
  });

  it('both precisions agree with the float64 reference on every hook and the logits; stored equals f32', async () => {
    const ref = referenceForward(rm, tokens);
    const out: Record<string, Awaited<ReturnType<LoadedModel['run']>>> = {};
    for (const [k, m] of Object.entries(models)) {
      out[k] = await m.run(tokens, { hooks: 'all' });
      const names = m.hookNames().filter((n) => n in ref.hooks);
      const bad = compareHooks(ref.hooks, out[k].hooks, names, TOL).filter((r) => !r.ok);
      expect(bad, `${k}: ${JSON.stringify(bad.slice(0, 3))}`).toEqual([]);
      expect(maxAbsDiff(ref.logits.data, out[k].logits.data).maxAbs, k).toBeLessThan(TOL);
    }
    // a Cast is exact: the two differ only by summation order inside the matmul kernels
    expect(maxAbsDiff(out.stored.logits.data, out.f32.logits.data).maxAbs).toBeLessThan(1e-5);
  });

  it('records the precision that ran, and why, in ModelInfo and in documents', () => {
    expect(models.stored.info.weights).toBe('stored');
    expect(models.stored.info.weights_reason).toMatch(/stored/);
    expect(models.f32.info.weights).toBe('f32');
    expect(modelBlockOf(models.stored).weights).toBe('stored');
    expect(modelBlockOf(models.f32).weights).toBe('f32');
  });
});

describe.each(['F16', 'BF16'] as const)('stored weights on onnxruntime-web WASM: %s', (dtype) => {
  let rm: RandomModel;
  let model: LoadedModel;
  afterAll(async () => {
    await model?.dispose();
    rm?.cleanup();
  });

  it('widens 16-bit weights at use (a bfloat16 Cast included) and agrees with the float64 reference', async () => {
    const c = ALL_FAMILY_CASES.find((x) => x.name === 'llama3-rope-untied-bias')!;
    rm = makeCaseModel(c, { dtype });
    model = await loadModelNode(rm.dir, { backend: 'wasm', weights: 'stored' });
    expect(model.info.weights).toBe('stored');
    const tokens = caseTokens(rm, c.seqLen);
    const ref = referenceForward(rm, tokens);
    const out = await model.run(tokens, { hooks: 'all' });
    const bad = compareHooks(
      ref.hooks,
      out.hooks,
      model.hookNames().filter((n) => n in ref.hooks),
      TOL,
    ).filter((r) => !r.ok);
    expect(bad, JSON.stringify(bad.slice(0, 3))).toEqual([]);
    expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs).toBeLessThan(TOL);
  });
});

describe('stored weights stay 16-bit inside onnxruntime', () => {
  let rm: RandomModel;
  let dir: string;
  beforeAll(() => {
    rm = makeCaseModel(
      ALL_FAMILY_CASES.find((x) => x.name === 'llama3-rope-untied-bias')!,
      { dtype: 'F16' },
    );
    dir = mkdtempSync(path.join(tmpdir(), 'loupe-prec-'));
  });
  afterAll(() => {
    rm?.cleanup();
    rmSync(dir, { recursive: true, force: true });
  });

  /** Create a session (onnxruntime-node, optimization level 'all', as the engine does) and read back the graph it optimized. */
  async function optimized(precision: 'f32' | 'stored') {
    const header = readSafetensorsHeaderFromDisk(path.join(rm.dir, 'model.safetensors'), 'model.safetensors');
    const tensors = new Map(header.tensors.map((t) => [t.name, t]));
    const spec = describeModel({ config: JSON.parse(readFileSync(path.join(rm.dir, 'config.json'), 'utf8')), tensors });
    const graph = buildModelGraph(spec, tensors, { hooks: true, withResult: false, weights: precision });
    const d = mkdtempSync(path.join(dir, precision));
    linkSync(path.join(rm.dir, 'model.safetensors'), path.join(d, 'model.safetensors'));
    writeFileSync(path.join(d, 'model.onnx'), graph.bytes);
    // elements held per initializer element type (1 = float32, 10 = float16)
    const { byType, casts } = await optimizedGraphStats(path.join(d, 'model.onnx'));
    const weightElems = header.tensors.reduce((a, t) => a + t.shape.reduce((x, y) => x * y, 1), 0);
    return { byType, weightElems, casts };
  }

  it('f32: onnxruntime holds every weight as float32; stored: as float16, with a Cast at each use', async () => {
    const f32 = await optimized('f32');
    expect(f32.byType[10] ?? 0).toBe(0);
    expect(f32.byType[1]).toBeGreaterThanOrEqual(f32.weightElems);
    const stored = await optimized('stored');
    expect(stored.byType[10]).toBe(stored.weightElems);
    // float32 initializers left are the graph's own small constants, not weights
    expect(stored.byType[1] ?? 0).toBeLessThan(100);
    expect(stored.casts).toBeGreaterThan(0);
  });
});

describe('the weights option', () => {
  it('auto: float32 when stored as float32 or when float32 fits the backend budget (budget.ts), else stored', () => {
    const stats = (dtype: 'F16' | 'F32', nParams: number) => ({
      nParams,
      byDtype: { [dtype]: nParams },
      storedBytes: nParams * (dtype === 'F16' ? 2 : 4),
    });
    // 0.1B params: float32 fits every backend
    expect(choosePrecision('auto', stats('F16', 1e8), 'wasm').precision).toBe('f32');
    // 1.2B F16 params: 4.8 GB as float32 exceeds the 4 GiB WASM heap, 2.4 GB stored fits
    const c = choosePrecision('auto', stats('F16', 1.2e9), 'wasm');
    expect(c.precision).toBe('stored');
    expect(c.reason).toMatch(/more than the 4 GiB WebAssembly heap/);
    // onnxruntime-node: judged against host memory when given
    expect(choosePrecision('auto', stats('F16', 1.2e9), 'node', { hostBytes: 64 * 2 ** 30 }).precision).toBe('f32');
    expect(choosePrecision('auto', stats('F16', 1.2e9), 'node', { hostBytes: 8 * 2 ** 30 }).precision).toBe('stored');
    // already float32: nothing to choose
    expect(choosePrecision('auto', stats('F32', 1.2e9), 'wasm').precision).toBe('f32');
    // explicit modes are taken as asked
    expect(choosePrecision('f32', stats('F16', 1.2e9), 'wasm').precision).toBe('f32');
    expect(choosePrecision('stored', stats('F16', 1e6), 'node').precision).toBe('stored');
  });

  it('an unknown mode is a structured BAD_INPUT', () => {
    expect(parseWeightsMode(undefined)).toBe('auto');
    expect(() => parseWeightsMode('fp8')).toThrow(expect.objectContaining({ code: 'BAD_INPUT' }));
  });
});
