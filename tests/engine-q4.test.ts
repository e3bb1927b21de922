/**
 * q4 weights (src/engine/q4.ts), judged against an independent reference: the test quantises the
 * random model's Linear matrices itself from the scheme's definition, packs them as onnxruntime's
 * com.microsoft MatMulNBits defines its B (bits 4, block_size 32, no zero points), dequantises them
 * back from the packed bytes as the op defines it, in float64, with q8's own reference for the
 * other matrices (tests/helpers/q4-reference.ts), and runs the float64 reference forward on those
 * weights. Every dequantised value is exact in float32, so the engine's logits and hooks must match
 * to float32 accuracy (TOL, as q8's test). Also: the session multiplies by the packed bytes
 * (MatMulNBits, no widened copy), operations that read weights in JS or differentiate through the
 * graph (trace's DLA, integrated gradients) give what a float32 model holding the dequantised
 * weights gives, and the packed bytes equal the definition's bit for bit.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { cpSync, mkdtempSync, writeFileSync, rmSync, linkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import onnxProto from 'onnx-proto';
import { loadModelNode, nodeFactory } from '../src/node/load';
import { createModel, modelPartsFrom } from '../src/engine/model';
import type { LoadedModel } from '../src/engine/api';
import { buildModelGraph } from '../src/engine/graph/build-model';
import { describeModel } from '../src/engine/arch';
import { q8WeightSet, quantizeMatrix, Q4_FILE } from '../src/engine/q8';
import { choosePrecision, choosePrecisionOnGpu, parseWeightsMode, WEIGHTS_MODES } from '../src/engine/precision';
import { checkBudget, estimateMemory, weightBytesAt } from '../src/engine/budget';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { modelBlockOf } from '../src/schema/common';
import { operations } from '../src/ops/index';
import {
  ALL_FAMILY_CASES,
  makeCaseModel,
  makeRandomModel,
  caseTokens,
  referenceForward,
  loadModelDir,
  compareHooks,
  maxAbsDiff,
  encodeSafetensors,
  f32ToF16Bits,
  f16BitsToF32,
  type RandomModel,
} from './reference';
import { q4Pack, q4Reference } from './helpers/q4-reference';
import { optimizedGraphStats } from './helpers/ort-optimized';

const TOL = 1e-4;

// Conv1D stored [in, out] (gpt2: its bytes are transposed to output-channel order), fused NeoX qkv +
// parallel residual, GQA + SwiGLU with an MLP width (80) that is not a multiple of 32 (its down
// projection stays q8), soft-caps + sliding window (gemma2), q/k norms (qwen3), a split vocabulary;
// gpuForm: q8's WebGPU form for the matrices q4 leaves at q8, run on WASM with a declared adapter
const CASES: {
  name: string;
  dtype: 'F16' | 'BF16' | 'F32';
  backend: 'node' | 'wasm';
  split?: boolean;
  gpuForm?: boolean;
}[] = [
  { name: 'gpt2-untied-erf-f16', dtype: 'F16', backend: 'node' },
  { name: 'neox-parallel-rot25', dtype: 'F32', backend: 'node' },
  { name: 'llama-gqa-tied', dtype: 'BF16', backend: 'node' },
  { name: 'gemma2-softcap-window', dtype: 'F16', backend: 'node', split: true },
  { name: 'qwen3-qk-norm', dtype: 'F16', backend: 'wasm' },
  { name: 'gpt2-untied-erf-f16', dtype: 'BF16', backend: 'wasm' },
  { name: 'neox-parallel-rot25', dtype: 'F32', backend: 'wasm', split: true },
  { name: 'llama-gqa-tied', dtype: 'F16', backend: 'wasm', gpuForm: true },
];

describe.each(CASES)(
  'q4 weights vs the float64 reference on the test-quantised weights: $name $dtype $backend split=$split gpuForm=$gpuForm',
  ({ name, dtype, backend, split, gpuForm }) => {
    const c = ALL_FAMILY_CASES.find((x) => x.name === name)!;
    let rm: RandomModel;
    let model: LoadedModel;
    beforeAll(async () => {
      rm = makeCaseModel(c, { dtype });
      const [V, D] = [rm.config.vocab_size as number, (rm.config.hidden_size ?? rm.config.n_embd) as number];
      const memory = split ? { tensorBytes: Math.floor((V * D * 4) / 3.5) } : {};
      model = gpuForm
        ? await createModel(
            modelPartsFrom(await loadModelFilesNode(rm.dir), { bundled: false, id: rm.dir, memory, weightsMode: 'q4' }),
            { ...(await nodeFactory('wasm')), gpu: { shaderF16: false, maxBufferBytes: 2 ** 30 } },
          )
        : await loadModelNode(rm.dir, { weights: 'q4', backend, memory });
      expect(model.info.vocab_chunks).toBe(split ? 4 : 1);
    });
    afterAll(async () => {
      await model?.dispose();
      rm?.cleanup();
    });

    it('every hook and the logits match; the unquantised and the all-q8 references are measurably different', async () => {
      const tokens = caseTokens(rm, c.seqLen);
      const ref = referenceForward(q4Reference(rm), tokens);
      const out = await model.run(tokens, { hooks: 'all' });
      const names = model.hookNames().filter((n) => n in ref.hooks);
      expect(names.length).toBeGreaterThan(10);
      const bad = compareHooks(ref.hooks, out.hooks, names, TOL).filter((r) => !r.ok);
      expect(bad, JSON.stringify(bad.slice(0, 3))).toEqual([]);
      expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs).toBeLessThan(TOL);
      // the comparison can fail: the model's own weights give other logits
      const plain = referenceForward(rm, tokens);
      expect(maxAbsDiff(plain.logits.data, out.logits.data).maxAbs).toBeGreaterThan(100 * TOL);
    });

    it('parameters read in JS (DLA, weight products) are the values the session uses', () => {
      const q = q4Reference(rm);
      // a q4 Linear (the first layer's attention output) in its stored layout, and the q8 embedding
      const [wo] = Object.keys(rm.tensors).filter((k) => /(o_proj|attn\.c_proj|attention\.dense)\.weight$/.test(k));
      const W_O = model.param('blocks.0.attn.W_O');
      const want = q.tensors[wo].data as Float64Array;
      // W_O is [H, Dh, D]: the stored [D, H·Dh] (torch) or [H·Dh, D] (Conv1D) reordered
      const gpt2 = rm.family === 'gpt2';
      const [D, HDh] = gpt2 ? [rm.tensors[wo].dims[1], rm.tensors[wo].dims[0]] : rm.tensors[wo].dims;
      let m = 0;
      for (let i = 0; i < HDh; i++)
        for (let d = 0; d < D; d++)
          m = Math.max(m, Math.abs(W_O.data[i * D + d] - want[gpt2 ? i * D + d : d * HDh + i]));
      expect(m).toBeLessThan(1e-7);
      const key = Object.keys(rm.tensors).find((k) => /embed|wte/.test(k) && rm.tensors[k].dims.length === 2)!;
      expect(maxAbsDiff(q.tensors[key].data as Float64Array, model.param('embed.W_E').data).maxAbs).toBeLessThan(1e-7);
    });

    it('records q4 in ModelInfo and in documents', () => {
      expect(model.info.weights).toBe('q4');
      expect(model.info.weights_reason).toMatch(/q4.*MatMulNBits/);
      expect(modelBlockOf(model).weights).toBe('q4');
    });
  },
);

describe.each(['node', 'wasm'] as const)(
  'the bundled stories260K at q4 on %s vs the float64 reference of its scheme',
  (backend) => {
    it('logits and the residual stream match (its d_mlp 172 keeps the down projections at q8)', async () => {
      const dir = path.resolve(__dirname, '../public/models/stories260K');
      const model = await loadModelNode('default', { weights: 'q4', backend });
      try {
        const tokens = [1, 403, 407, 261, 378, 300, 290, 267, 374, 262];
        const ref = referenceForward(q4Reference(loadModelDir(dir)), tokens);
        const out = await model.run(tokens, { hooks: ['blocks.4.hook_resid_post'] });
        const bad = compareHooks(ref.hooks, out.hooks, ['blocks.4.hook_resid_post'], TOL).filter((r) => !r.ok);
        expect(bad).toEqual([]);
        expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs).toBeLessThan(TOL);
        expect(
          maxAbsDiff(referenceForward(loadModelDir(dir), tokens).logits.data, out.logits.data).maxAbs,
        ).toBeGreaterThan(100 * TOL);
      } finally {
        await model.dispose();
      }
    });
  },
);

/** the random model's directory again, its weights replaced by the q4 reference's (exact in float32) as F32 */
function dequantisedCopy(rm: RandomModel): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(path.join(tmpdir(), 'loupe-q4-f32-'));
  cpSync(rm.dir, dir, { recursive: true });
  const q = q4Reference(rm);
  const tensors: Record<string, { dims: number[]; data: ArrayLike<number> }> = {};
  for (const [n, t] of Object.entries(q.tensors)) tensors[n] = { dims: t.dims, data: t.data };
  writeFileSync(path.join(dir, 'model.safetensors'), encodeSafetensors(tensors, 'F32'));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** every number of two documents (their model blocks aside) within TOL; other values equal */
function docDiffs(a: unknown, b: unknown, at = 'doc', out: string[] = []): string[] {
  if (typeof a === 'number' && typeof b === 'number') {
    if (!(Math.abs(a - b) <= TOL)) out.push(`${at}: ${a} vs ${b}`);
  } else if (Array.isArray(a) && Array.isArray(b)) {
    if (a.length !== b.length) out.push(`${at}: length ${a.length} vs ${b.length}`);
    else a.forEach((x, i) => docDiffs(x, b[i], `${at}[${i}]`, out));
  } else if (a && b && typeof a === 'object' && typeof b === 'object') {
    for (const k of new Set([...Object.keys(a), ...Object.keys(b)]))
      if (k !== 'model') docDiffs((a as any)[k], (b as any)[k], `${at}.${k}`, out);
  } else if (a !== b) out.push(`${at}: ${JSON.stringify(a)} vs ${JSON.stringify(b)}`);
  return out;
}

describe.each([
  ['gpt2-untied-erf-f16', 'node'],
  ['llama-gqa-tied', 'wasm'],
] as const)('operations at q4 equal a float32 model of the dequantised weights: %s %s', (name, backend) => {
  const c = ALL_FAMILY_CASES.find((x) => x.name === name)!;
  let rm: RandomModel;
  let copy: { dir: string; cleanup: () => void };
  let q4: LoadedModel, f32: LoadedModel;
  beforeAll(async () => {
    rm = makeCaseModel(c, { dtype: 'F16' });
    copy = dequantisedCopy(rm);
    q4 = await loadModelNode(rm.dir, { weights: 'q4', backend });
    f32 = await loadModelNode(copy.dir, { weights: 'f32', backend });
  });
  afterAll(async () => {
    await q4?.dispose();
    await f32?.dispose();
    rm?.cleanup();
    copy?.cleanup();
  });

  it('trace (logits, DLA from W_U and W_O read in JS, head attribution)', async () => {
    const input = { prompt: 'hello world', top_k: 3 };
    const a = await operations.trace.run(q4, input, {});
    const b = await operations.trace.run(f32, input, {});
    expect(docDiffs(JSON.parse(JSON.stringify(a)), JSON.parse(JSON.stringify(b))).slice(0, 5)).toEqual([]);
  });

  it('integrated gradients (the backward pass through MatMulNBits)', async () => {
    const ids = caseTokens(rm, 8);
    const input = { token_ids: ids, answer: `#${ids[3]}`, counterfactual: `#${ids[5]}`, steps: 4 };
    const a = await operations.integrated_gradients.run(q4, input, {});
    const b = await operations.integrated_gradients.run(f32, input, {});
    expect(docDiffs(JSON.parse(JSON.stringify(a)), JSON.parse(JSON.stringify(b))).slice(0, 5)).toEqual([]);
  });
});

describe('q4 weights stay 4-bit inside onnxruntime', () => {
  it('every fitting Linear is a MatMulNBits over its packed bytes; the optimized graph holds no float32 copy of them', async () => {
    const rm = makeCaseModel(
      ALL_FAMILY_CASES.find((x) => x.name === 'neox-parallel-rot25')!,
      { dtype: 'F16' },
    );
    const dir = mkdtempSync(path.join(tmpdir(), 'loupe-q4-'));
    try {
      const files = await loadModelFilesNode(rm.dir);
      const spec = describeModel({ config: files.config as Record<string, any>, tensors: files.weights.tensors });
      const ws = await q8WeightSet(files.weights, spec, undefined, 'q4');
      const q4 = [...ws.tensors.values()].filter((t) => t.q4);
      const q8 = [...ws.tensors.values()].filter((t) => t.q8);
      expect(q4.length).toBe(4 * spec.nLayers); // qkv, dense, h_to_4h, 4h_to_h
      expect(q8.length).toBe(2); // embed_in, embed_out
      const graph = buildModelGraph(spec, ws.tensors, { hooks: false, withResult: false, weights: 'q4' });
      const m = (onnxProto as any).onnx.ModelProto.decode(graph.bytes);
      const nbits = m.graph.node.filter((n: any) => n.opType === 'MatMulNBits');
      expect(nbits.length).toBe(q4.length);
      for (const n of nbits) expect(n.domain).toBe('com.microsoft');
      const u8 = m.graph.initializer.filter((t: any) => t.dataType === 2);
      expect(u8.length).toBe(q4.length);
      // in the plain forward every packed matrix feeds MatMulNBits only
      for (const t of u8)
        for (const n of m.graph.node.filter((x: any) => x.input.includes(t.name))) expect(n.opType).toBe('MatMulNBits');
      linkSync(path.join(rm.dir, 'model.safetensors'), path.join(dir, 'model.safetensors'));
      writeFileSync(path.join(dir, Q4_FILE), ws.files.get(Q4_FILE)!);
      writeFileSync(path.join(dir, 'model.onnx'), graph.bytes);
      const { byType } = await optimizedGraphStats(path.join(dir, 'model.onnx'));
      const packed = q4.reduce((a, t) => a + t.byteLength, 0);
      const linearElems = q4.reduce((a, t) => a + t.shape[0] * t.shape[1], 0);
      // onnx TensorProto data types: 1 float32, 2 uint8, 3 int8, 10 float16
      expect(byType[2]).toBe(packed);
      expect(packed).toBe(linearElems / 2);
      expect(byType[3]).toBe(q8.reduce((a, t) => a + t.byteLength, 0));
      // float32: the q4 scales (one per 32 weights) and the graph's own small constants, no widened matrix
      expect(byType[1] ?? 0).toBeLessThan(linearElems / 32 + 2000);
    } finally {
      rm.cleanup();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('the q4 option', () => {
  it('is explicit opt-in: auto never picks it; asked for, it is taken with its bytes in the reason', () => {
    expect(WEIGHTS_MODES).toContain('q4');
    expect(parseWeightsMode('q4')).toBe('q4');
    // a Llama-3.1-8B-like split: 6.98B Linear weights, 1.05B table weights, BF16
    const stats = { nParams: 8.03e9, byDtype: { BF16: 8.03e9 }, storedBytes: 16.06e9, q4Params: 6.98e9 };
    expect(choosePrecision('auto', stats, 'webgpu').precision).not.toBe('q4');
    const c = choosePrecision('q4', stats, 'node');
    expect(c.precision).toBe('q4');
    expect(weightBytesAt(stats, 'q4')).toBeCloseTo(6.98e9 * 0.625 + 1.05e9 * (1 + 2 / 32), -3);
    expect(c.reason).toMatch(/4-bit.*5\.5 GB/);
    expect(choosePrecisionOnGpu('q4', stats, { shaderF16: false }).precision).toBe('q4');
    // fits a 16 GB GPU at q4, not at stored or q8 … and TOO_LARGE's hint names q4
    const gpu = { gpuBytes: 16e9 };
    expect(estimateMemory(stats, 'webgpu', 'q4', gpu).fits).toBe(true);
    expect(estimateMemory(stats, 'webgpu', 'stored', gpu).fits).toBe(false);
    expect(() => checkBudget(stats, 'webgpu', 'stored', { gpuBytes: 7e9 })).toThrow(
      expect.objectContaining({ code: 'TOO_LARGE', hint: expect.stringMatching(/--weights q4 on webgpu/) }),
    );
  });

  it('a model whose structure is not known is judged at q8 bytes for q4 (never less than it will take)', () => {
    const stats = { nParams: 1e9, byDtype: { F16: 1e9 }, storedBytes: 2e9 };
    expect(weightBytesAt(stats, 'q4')).toBe(weightBytesAt(stats, 'q8'));
  });

  it('a model with a Linear input width that is not a multiple of 32 keeps that matrix at q8', async () => {
    // d_mlp 80: the down projection's input
    const rm = makeRandomModel('llama', { seed: 3, dModel: 64, nLayers: 1, nHeads: 2, dMlp: 80, vocabSize: 64 });
    try {
      const files = await loadModelFilesNode(rm.dir);
      const spec = describeModel({ config: files.config as Record<string, any>, tensors: files.weights.tensors });
      const ws = await q8WeightSet(files.weights, spec, undefined, 'q4');
      expect(ws.tensors.get(spec.layers[0].mlp!.down.w)!.q8).toBeTruthy();
      expect(ws.tensors.get(spec.layers[0].mlp!.up.w)!.q4).toBeTruthy();
    } finally {
      rm.cleanup();
    }
  });
});

describe('quantizeMatrix at q4 against the scheme written out', () => {
  const encode = (vals: number[], dtype: 'F16' | 'F32', offset: number): Uint8Array => {
    const esize = dtype === 'F32' ? 4 : 2;
    const out = new Uint8Array(offset + vals.length * esize);
    const dv = new DataView(out.buffer);
    vals.forEach((v, i) => {
      if (dtype === 'F32') dv.setFloat32(offset + 4 * i, v, true);
      else dv.setUint16(offset + 2 * i, f32ToF16Bits(v), true);
    });
    return out.subarray(offset);
  };
  const decodeAs = (raw: Uint8Array, dtype: 'F16' | 'F32', n: number) =>
    Array.from({ length: n }, (_, i) => {
      const dv = new DataView(raw.buffer, raw.byteOffset);
      return dtype === 'F32' ? dv.getFloat32(4 * i, true) : f16BitsToF32(dv.getUint16(2 * i, true));
    });

  it.each([
    ['F16', 1],
    ['F16', 0],
    ['F32', 0],
    ['F32', 1],
  ] as const)('%s along axis %d: ties, zeros, NaN; any byte offset', async (dtype, axis) => {
    const R = 64,
      C = 96;
    const [N, K] = axis === 1 ? [R, C] : [C, R];
    const at = (n: number, k: number) => (axis === 1 ? n * C + k : k * C + n);
    const vals: number[] = [];
    let seed = 5;
    const rnd = () => (seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32;
    for (let i = 0; i < R * C; i++) vals.push((rnd() - 0.5) * 0.1);
    // a block whose max is 7 (scale 1) and x.5 values are ties; an all-zero block; a NaN
    for (let k = 0; k < 32; k++) vals[at(0, k)] = k === 0 ? 7 : (k % 2 ? 1 : -1) * ((k % 7) + 0.5);
    for (let k = 32; k < 64; k++) vals[at(0, k)] = k === 33 ? -0 : 0;
    vals[at(2, 5)] = NaN;
    for (const offset of [0, 1, 3]) {
      const raw = encode(vals, dtype, offset);
      const want = q4Pack(decodeAs(raw, dtype, R * C), N, K, at);
      const got = await quantizeMatrix(dtype, raw, [R, C], axis, 'q4');
      expect(got.bits).toBe(4);
      expect(Array.from(got.bytes.subarray(0, (N * K) / 2)), `bytes, offset ${offset}`).toEqual(Array.from(want.B));
      const scales = new Float32Array(got.bytes.slice((N * K) / 2).buffer);
      expect(Array.from(scales), `scales, offset ${offset}`).toEqual(Array.from(want.scales));
    }
  });
});
