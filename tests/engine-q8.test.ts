/**
 * q8 weights (src/engine/q8.ts), judged against an independent reference: the test quantises the
 * random model's matrices itself, from the scheme's definition written out here (blocks of 32
 * along the input dimension, else one block per output channel; scale = float16(float32(max|w|)/127);
 * q = round half away from zero of w/scale, clamped to ±127), dequantises them to float64 and
 * runs the float64 reference forward (tests/reference) on those weights. The engine's q8 logits
 * and hooks must match it to float32 accuracy. Also: the session really holds the matrices as
 * int8 (the graph onnxruntime optimized), documents say q8, and bad input is structured.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdtempSync, writeFileSync, rmSync, linkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { loadModelNode, nodeFactory } from '../src/node/load';
import { createModel, modelPartsFrom } from '../src/engine/model';
import type { BudgetLimits } from '../src/engine/budget';
import type { LoadedModel } from '../src/engine/api';
import { buildModelGraph } from '../src/engine/graph/build-model';
import { describeModel } from '../src/engine/arch';
import { q8WeightSet, q8ForWebGpu, quantizeMatrix, Q8_FILE } from '../src/engine/q8';
import onnxProto from 'onnx-proto';
import { choosePrecision, choosePrecisionOnGpu, parseWeightsMode } from '../src/engine/precision';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { modelBlockOf } from '../src/schema/common';
import { RUNTIME_SLACK_BYTES } from '../src/engine/budget';
import { operations } from '../src/ops/index';
import {
  ALL_FAMILY_CASES,
  makeCaseModel,
  caseTokens,
  referenceForward,
  compareHooks,
  maxAbsDiff,
  f32ToF16Bits,
  f16BitsToF32,
  type RandomModel,
} from './reference';
import { optimizedGraphStats } from './helpers/ort-optimized';
import { q8Reference } from './helpers/q8-reference';

const TOL = 1e-4;

// learned positions + Conv1D + tied (gpt2), untied lm_head + pos embed per-channel (gpt2 F16 32-wide),
// GQA + SwiGLU (llama), fused NeoX qkv + parallel residual, embedding scale + soft-caps (gemma2), q/k norms (qwen3)
// split: the vocabulary tables in chunks (graph/vocab.ts), forced small: each chunk takes its own rows of the scales
// gpuForm: the WebGPU form (q8.ts q8ForWebGpu: DequantizeLinear, float32 scales), run here on
// onnxruntime-web's WASM through a factory that declares a WebGPU adapter without shader-f16
const CASES: {
  name: string;
  dtype: 'F16' | 'BF16' | 'F32';
  backend: 'node' | 'wasm';
  split?: boolean;
  gpuForm?: boolean;
}[] = [
  { name: 'gpt2-tied', dtype: 'F16', backend: 'node' },
  { name: 'gpt2-tied', dtype: 'F16', backend: 'node', split: true },
  { name: 'llama3-rope-untied-bias', dtype: 'F32', backend: 'wasm', split: true },
  { name: 'gpt2-untied-erf-f16', dtype: 'F16', backend: 'node' },
  { name: 'llama-gqa-tied', dtype: 'BF16', backend: 'node' },
  { name: 'neox-parallel-rot25', dtype: 'F32', backend: 'node' },
  { name: 'gemma2-softcap-window', dtype: 'F16', backend: 'node' },
  { name: 'qwen3-qk-norm', dtype: 'F16', backend: 'node' },
  { name: 'llama3-rope-untied-bias', dtype: 'F16', backend: 'wasm' },
  { name: 'gpt2-tied', dtype: 'BF16', backend: 'wasm' },
  { name: 'gpt2-tied', dtype: 'F16', backend: 'wasm', gpuForm: true },
  { name: 'gemma2-softcap-window', dtype: 'F16', backend: 'wasm', split: true, gpuForm: true },
  { name: 'llama-gqa-tied', dtype: 'BF16', backend: 'wasm', gpuForm: true },
];

/** a model loaded the way loadModelNode does, but its factory declaring a WebGPU adapter (so q8 takes the WebGPU form) */
async function loadGpuForm(dir: string, memory: BudgetLimits): Promise<LoadedModel> {
  const files = await loadModelFilesNode(dir);
  const factory = { ...(await nodeFactory('wasm')), gpu: { shaderF16: false, maxBufferBytes: 2 ** 30 } };
  return createModel(modelPartsFrom(files, { bundled: false, id: dir, memory, weightsMode: 'q8' }), factory);
}

describe.each(CASES)(
  'q8 weights vs the float64 reference on the test-quantised weights: $name $dtype $backend split=$split gpuForm=$gpuForm',
  ({ name, dtype, backend, split, gpuForm }) => {
    const c = ALL_FAMILY_CASES.find((x) => x.name === name)!;
    let rm: RandomModel;
    let model: LoadedModel;
    beforeAll(async () => {
      rm = makeCaseModel(c, { dtype });
      const [V, D] = [rm.config.vocab_size as number, (rm.config.hidden_size ?? rm.config.n_embd) as number];
      const memory = split ? { tensorBytes: Math.floor((V * D * 4) / 3.5) } : {};
      model = gpuForm
        ? await loadGpuForm(rm.dir, memory)
        : await loadModelNode(rm.dir, { weights: 'q8', backend, memory });
      expect(model.info.vocab_chunks).toBe(split ? 4 : 1);
    });
    afterAll(async () => {
      await model?.dispose();
      rm?.cleanup();
    });

    it('every hook and the logits match; the unquantised reference is measurably different', async () => {
      const tokens = caseTokens(rm, c.seqLen);
      const ref = referenceForward(q8Reference(rm), tokens);
      const out = await model.run(tokens, { hooks: 'all' });
      const names = model.hookNames().filter((n) => n in ref.hooks);
      expect(names.length).toBeGreaterThan(10);
      const bad = compareHooks(ref.hooks, out.hooks, names, TOL).filter((r) => !r.ok);
      expect(bad, JSON.stringify(bad.slice(0, 3))).toEqual([]);
      expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs).toBeLessThan(TOL);
      // the comparison can fail: the model's own (unquantised) weights give other logits
      const plain = referenceForward(rm, tokens);
      expect(maxAbsDiff(plain.logits.data, out.logits.data).maxAbs).toBeGreaterThan(100 * TOL);
    });

    it('parameters read in JS (DLA, weight products) are the values the session uses', () => {
      const q = q8Reference(rm);
      const key = Object.keys(rm.tensors).find((k) => /embed|wte/.test(k) && rm.tensors[k].dims.length === 2)!;
      const W_E = model.param('embed.W_E');
      expect(maxAbsDiff(q.tensors[key].data as Float64Array, W_E.data).maxAbs).toBeLessThan(1e-7);
    });

    it('records q8 in ModelInfo and in documents', () => {
      expect(model.info.weights).toBe('q8');
      expect(model.info.weights_reason).toMatch(/q8/);
      expect(modelBlockOf(model).weights).toBe('q8');
    });
  },
);

describe('q8 weights stay 8-bit inside onnxruntime', () => {
  it('the optimized graph holds every matrix as int8 (float16 scales), never as a float32 copy', async () => {
    const rm = makeCaseModel(
      ALL_FAMILY_CASES.find((x) => x.name === 'llama3-rope-untied-bias')!,
      { dtype: 'F16' },
    );
    const dir = mkdtempSync(path.join(tmpdir(), 'loupe-q8-'));
    try {
      const files = await loadModelFilesNode(rm.dir);
      const spec = describeModel({ config: files.config as Record<string, any>, tensors: files.weights.tensors });
      const ws = await q8WeightSet(files.weights, spec);
      const graph = buildModelGraph(spec, ws.tensors, { hooks: true, withResult: false, weights: 'q8' });
      linkSync(path.join(rm.dir, 'model.safetensors'), path.join(dir, 'model.safetensors'));
      writeFileSync(path.join(dir, Q8_FILE), ws.files.get(Q8_FILE)!);
      writeFileSync(path.join(dir, 'model.onnx'), graph.bytes);
      const { byType } = await optimizedGraphStats(path.join(dir, 'model.onnx'));
      const matrices = [...files.weights.tensors.values()].filter((t) => t.shape.length === 2);
      const matrixElems = matrices.reduce((a, t) => a + t.shape[0] * t.shape[1], 0);
      expect(matrices.length).toBeGreaterThan(5);
      // onnx TensorProto data types: 1 float32, 3 int8, 10 float16
      expect(byType[3]).toBe(matrixElems);
      expect(byType[1] ?? 0).toBeLessThan(100); // the graph's own small constants
      const others = [...files.weights.tensors.values()]
        .filter((t) => t.shape.length !== 2)
        .reduce((a, t) => a + t.shape.reduce((x, y) => x * y, 1), 0);
      const scales = [...ws.tensors.values()]
        .filter((t) => t.q8)
        .reduce((a, t) => a + t.q8!.scale.shape.reduce((x, y) => x * y, 1), 0);
      expect(byType[10]).toBe(others + scales);
      expect(scales).toBeLessThan(matrixElems / 8);
    } finally {
      rm.cleanup();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('the WebGPU form too: int8 matrices widened by DequantizeLinear (no int8 Cast), float32 scales, no float16 left', async () => {
    const rm = makeCaseModel(
      ALL_FAMILY_CASES.find((x) => x.name === 'llama3-rope-untied-bias')!,
      { dtype: 'F16' },
    );
    const dir = mkdtempSync(path.join(tmpdir(), 'loupe-q8-'));
    try {
      const files = await loadModelFilesNode(rm.dir);
      const spec = describeModel({ config: files.config as Record<string, any>, tensors: files.weights.tensors });
      const ws = q8ForWebGpu(await q8WeightSet(files.weights, spec));
      const graph = buildModelGraph(spec, ws.tensors, { hooks: true, withResult: false, weights: 'q8' });
      const model = (onnxProto as any).onnx.ModelProto.decode(graph.bytes);
      const int8 = new Set<string>(
        model.graph.initializer.filter((t: any) => t.dataType === 3).map((t: any) => t.name),
      );
      expect(int8.size).toBeGreaterThan(5);
      // every int8 weight reaches a float only through DequantizeLinear (a Reshape view, or a Gather of rows, in between)
      const consumers = (x: string) => model.graph.node.filter((n: any) => n.input.includes(x));
      for (const w of int8) {
        for (let c of consumers(w)) {
          while (c.opType === 'Reshape' || c.opType === 'Gather') c = consumers(c.output[0])[0];
          expect(c.opType).toBe('DequantizeLinear');
        }
      }
      linkSync(path.join(rm.dir, 'model.safetensors'), path.join(dir, 'model.safetensors'));
      for (const [f, bytes] of ws.files) if (f.startsWith('loupe-q8')) writeFileSync(path.join(dir, f), bytes);
      // the float32 forms are widened as they are read, never held in JS (the memory report's "weights in JS")
      expect([...ws.files.keys()]).toEqual([Q8_FILE]);
      for (const [f, r] of ws.ranged ?? []) {
        if (!f.startsWith('loupe-q8')) continue;
        const whole = r.read(0, r.size);
        writeFileSync(path.join(dir, f), whole);
        // any range, aligned to a value or not, is that range of the whole
        if (r.size > 16) expect(Array.from(r.read(6, 10)), f).toEqual(Array.from(whole.subarray(6, 16)));
      }
      writeFileSync(path.join(dir, 'model.onnx'), graph.bytes);
      const { byType } = await optimizedGraphStats(path.join(dir, 'model.onnx'));
      const matrices = [...files.weights.tensors.values()].filter((t) => t.shape.length === 2);
      expect(byType[3]).toBe(matrices.reduce((a, t) => a + t.shape[0] * t.shape[1], 0));
      const scales = [...ws.tensors.values()]
        .filter((t) => t.q8)
        .reduce((a, t) => a + t.q8!.scale.shape.reduce((x, y) => x * y, 1), 0);
      expect(
        [...ws.tensors.values()].filter((t) => t.q8).every((t) => t.q8!.scale.dtype === 'F32' && t.q8!.dequantize),
      ).toBe(true);
      // float32: the scales, the other weights (norms, biases: widened, no float16 is left for a
      // shader without shader-f16), the DequantizeLinear ones and the graph's own small constants; no widened matrix
      const others = [...files.weights.tensors.values()]
        .filter((t) => t.shape.length !== 2)
        .reduce((a, t) => a + t.shape.reduce((x, y) => x * y, 1), 0);
      expect(byType[10] ?? 0).toBe(0);
      expect(byType[1] ?? 0).toBeGreaterThanOrEqual(scales + others);
      expect((byType[1] ?? 0) - scales - others).toBeLessThan(2000);
    } finally {
      rm.cleanup();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('a WASM heap too small for two sessions side by side', () => {
  /** the readout forced into its session (with a heap this tight the default streams it, with no second session) */
  const loadSessionReadout = async (dir: string, memory: BudgetLimits) =>
    createModel(
      {
        ...modelPartsFrom(await loadModelFilesNode(dir), { bundled: false, id: dir, memory, weightsMode: 'q8' }),
        readout: 'session',
      },
      await nodeFactory('wasm'),
    );
  it('releases the forward session to make room for the DLA readout session: the trace is the same, and a second trace works', async () => {
    const c = ALL_FAMILY_CASES.find((x) => x.name === 'llama3-rope-untied-bias')!;
    const rm = makeCaseModel(c, { dtype: 'F16' });
    const roomy = await loadSessionReadout(rm.dir, {});
    // the heap holds the forward's weights and the slack, not the readout's weights as well
    const base = roomy.memory().weight_bytes;
    const tight = await loadSessionReadout(rm.dir, { wasmHeapBytes: RUNTIME_SLACK_BYTES + Math.round(base * 1.2) });
    const streamed = await loadModelNode(rm.dir, {
      weights: 'q8',
      backend: 'wasm',
      memory: { wasmHeapBytes: RUNTIME_SLACK_BYTES + Math.round(base * 1.2) },
    });
    try {
      const input = { prompt: 'hello world', top_k: 3 };
      const want = await operations.trace.run(roomy, input, {});
      expect(roomy.memory().sessions).toBe(2); // forward + readout
      const got = await operations.trace.run(tight, input, {});
      expect(tight.memory().sessions).toBe(1); // the forward was released for the readout
      expect(got.head_attribution).toEqual(want.head_attribution);
      expect(got.decomposition).toEqual(want.decomposition);
      const again = await operations.trace.run(tight, input, {});
      expect(again.head_attribution).toEqual(want.head_attribution);
      // streamed from the weight bytes, the readout needs no room: the forward's session stays
      expect(streamed.info.readout).toBe('stream');
      const s = await operations.trace.run(streamed, input, {});
      expect(streamed.memory().sessions).toBe(1);
      expect(maxAbsDiff(s.head_attribution.flat(), want.head_attribution.flat()).maxAbs).toBeLessThan(1e-5);
    } finally {
      await roomy.dispose();
      await tight.dispose();
      await streamed.dispose();
      rm.cleanup();
    }
  });
});

describe('the q8 option', () => {
  it('is explicit opt-in: auto never picks it; asked for, it is taken with its bytes in the reason', () => {
    const stats = { nParams: 2.6e9, byDtype: { F16: 2.6e9 }, storedBytes: 5.2e9 };
    expect(parseWeightsMode('q8')).toBe('q8');
    expect(choosePrecision('auto', stats, 'wasm').precision).toBe('stored');
    const c = choosePrecision('q8', stats, 'wasm');
    expect(c.precision).toBe('q8');
    expect(c.reason).toMatch(/int8.*2\.8 GB/);
  });

  it('bad modes and unquantisable weights are structured errors with a hint', async () => {
    expect(() => parseWeightsMode('Q8')).toThrow(
      expect.objectContaining({ code: 'BAD_INPUT', hint: expect.stringMatching(/q8/) }),
    );
    expect(() => parseWeightsMode('int8')).toThrow(expect.objectContaining({ code: 'BAD_INPUT' }));
    // WebGPU takes q8 with or without shader-f16 (its form has float32 scales)
    for (const shaderF16 of [true, false])
      expect(
        choosePrecisionOnGpu('q8', { nParams: 1e6, byDtype: { F16: 1e6 }, storedBytes: 2e6 }, { shaderF16 }).precision,
      ).toBe('q8');
    // a matrix stored as integers cannot be quantised from floats
    const rm = makeCaseModel(
      ALL_FAMILY_CASES.find((x) => x.name === 'llama-gqa-tied')!,
      { dtype: 'F16' },
    );
    try {
      const files = await loadModelFilesNode(rm.dir);
      const spec = describeModel({ config: files.config as Record<string, any>, tensors: files.weights.tensors });
      const e = files.weights.tensors.get(spec.layers[0].mlp!.up.w)!;
      files.weights.tensors.set(e.name, { ...e, dtype: 'I16' });
      await expect(q8WeightSet(files.weights, spec)).rejects.toThrow(
        expect.objectContaining({ code: 'UNSUPPORTED_CONFIG', hint: expect.stringMatching(/--weights stored/) }),
      );
    } finally {
      rm.cleanup();
    }
  });
});

describe('quantizeMatrix against the scheme written out', () => {
  /** q and scale bits from the definition: blocks of 32 (else the whole input dim) along `axis`, float64 division, ties away from zero, NaN ignored by max and quantised to 0 */
  function byDefinition(vals: number[], R: number, C: number, axis: 0 | 1): { q: number[]; s: number[] } {
    const nIn = axis === 1 ? C : R,
      nOut = axis === 1 ? R : C,
      block = nIn % 32 === 0 ? 32 : nIn;
    const idx = (o: number, i: number) => (axis === 1 ? o * C + i : i * C + o);
    const q = new Array<number>(R * C).fill(0),
      s: number[] = [];
    const sIdx = (o: number, b: number) => (axis === 1 ? o * (nIn / block) + b : b * nOut + o);
    for (let o = 0; o < nOut; o++)
      for (let b = 0; b < nIn / block; b++) {
        let m = 0;
        for (let i = b * block; i < (b + 1) * block; i++) {
          const a = Math.abs(vals[idx(o, i)]);
          if (a > m) m = a;
        }
        const bits = f32ToF16Bits(Math.fround(m / 127)),
          sv = f16BitsToF32(bits);
        s[sIdx(o, b)] = bits;
        for (let i = b * block; i < (b + 1) * block; i++) {
          const x = sv > 0 ? vals[idx(o, i)] / sv : 0;
          q[idx(o, i)] = Number.isNaN(x)
            ? 0
            : Math.max(-127, Math.min(127, Math.sign(x) * Math.floor(Math.abs(x) + 0.5))) || 0;
        }
      }
    return { q, s };
  }
  const encode = (vals: number[], dtype: 'F16' | 'BF16' | 'F32', offset: number): Uint8Array => {
    const esize = dtype === 'F32' ? 4 : 2;
    const out = new Uint8Array(offset + vals.length * esize);
    const dv = new DataView(out.buffer);
    vals.forEach((v, i) => {
      if (dtype === 'F32') dv.setFloat32(offset + 4 * i, v, true);
      else if (dtype === 'F16') dv.setUint16(offset + 2 * i, f32ToF16Bits(v), true);
      else {
        const f = new Float32Array([v]);
        dv.setUint16(offset + 2 * i, new Uint32Array(f.buffer)[0] >>> 16, true);
      }
    });
    return out.subarray(offset);
  };
  const decodeAs = (raw: Uint8Array, dtype: 'F16' | 'BF16' | 'F32', n: number) =>
    Array.from({ length: n }, (_, i) => {
      const dv = new DataView(raw.buffer, raw.byteOffset);
      if (dtype === 'F32') return dv.getFloat32(4 * i, true);
      const h = dv.getUint16(2 * i, true);
      return dtype === 'F16' ? f16BitsToF32(h) : new Float32Array(new Uint32Array([h << 16]).buffer)[0];
    });

  it.each([
    ['F16', 1],
    ['F16', 0],
    ['BF16', 1],
    ['F32', 0],
    ['F32', 1],
  ] as const)('%s along axis %d: ties, zeros, subnormals, NaN and infinity; any byte offset', async (dtype, axis) => {
    const R = 64,
      C = 96; // 96 and 64 are multiples of 32: blocks of 32 either way
    const vals: number[] = [];
    let seed = 3;
    const rnd = () => (seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32;
    for (let i = 0; i < R * C; i++) vals.push((rnd() - 0.5) * 0.1);
    // a block whose max is 127 so the scale is 1 and x.5 values are ties
    for (let i = 0; i < 32; i++) vals[axis === 1 ? i : i * C] = i === 0 ? 127 : (i % 2 ? 1 : -1) * (i + 0.5);
    // an all-zero block (zero scale) with a negative zero, a subnormal-only block, and NaN / ±∞ in others
    for (let i = 32; i < 64; i++) vals[axis === 1 ? i : i * C] = i === 33 ? -0 : 0;
    for (let i = 0; i < 32; i++) vals[axis === 1 ? C + i : i * C + 1] = (i % 3) * 1e-7;
    vals[axis === 1 ? 2 * C + 5 : 5 * C + 2] = NaN;
    if (dtype !== 'F16') vals[axis === 1 ? 3 * C + 7 : 7 * C + 3] = Infinity;
    for (const offset of [0, 1, 3]) {
      const raw = encode(vals, dtype, offset);
      const stored = decodeAs(raw, dtype, R * C); // what the file holds (rounded to its dtype)
      const want = byDefinition(stored, R, C, axis);
      const got = await quantizeMatrix(dtype, raw, [R, C], axis);
      expect(Array.from(new Int8Array(got.bytes.buffer, 0, R * C)), `q, offset ${offset}`).toEqual(want.q);
      expect(Array.from(new Uint16Array(got.bytes.slice(R * C).buffer)), `scales, offset ${offset}`).toEqual(want.s);
    }
  });
});
