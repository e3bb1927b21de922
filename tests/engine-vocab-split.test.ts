/**
 * Vocabulary tables split into row chunks (src/engine/graph/vocab.ts, precision.ts
 * chooseVocabSplit). The split is forced on tiny random models with a small `tensorBytes` limit,
 * so every chunked path runs: the embedding lookup on the 16-bit table, the unembedding, the
 * logit lens and the DLA weight products. Judged against the independent float64 reference
 * (tests/reference) and against the unsplit graph, on tied and untied embeddings, F16 and F32,
 * onnxruntime-node and onnxruntime-web WASM.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { chooseVocabSplit, choosePrecisionOnGpu, WIDEN_CHUNK_BYTES } from '../src/engine/precision';
import { gpuCaps } from '../src/engine/env';
import onnxProto from 'onnx-proto';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { describeModel } from '../src/engine/arch';
import { buildModelGraph } from '../src/engine/graph/build-model';
import { buildReadoutGraph } from '../src/engine/readout';
import { CONCAT_MAX_INPUTS } from '../src/engine/graph/onnx-builder';
import { operations } from '../src/ops/index';
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

/** the stored [V, D] unembedding of a generated model (lm_head / embed_out when untied, else the embedding) */
function unembedTable(rm: RandomModel): { dims: number[]; data: Float32Array } {
  const names = [
    'lm_head.weight',
    'embed_out.weight',
    'model.embed_tokens.weight',
    'transformer.wte.weight',
    'gpt_neox.embed_in.weight',
  ];
  return rm.tensors[names.find((n) => rm.tensors[n])!];
}

// tied (gpt2, llama, gemma2 by default) and untied (llama3 with biases, neox embed_out, qwen2)
const CASES = [
  { name: 'gpt2-tied', dtype: 'F16' as const, backend: 'node' as const },
  { name: 'llama-gqa-tied', dtype: 'F16' as const, backend: 'wasm' as const },
  { name: 'llama3-rope-untied-bias', dtype: 'BF16' as const, backend: 'node' as const },
  { name: 'neox-parallel-rot25', dtype: 'F32' as const, backend: 'node' as const },
  { name: 'qwen2-qkv-bias', dtype: 'F16' as const, backend: 'wasm' as const },
  { name: 'gemma2-softcap-window', dtype: 'F16' as const, backend: 'node' as const },
];

describe.each(CASES)('vocabulary split: $name $dtype on $backend', ({ name, dtype, backend }) => {
  const c = ALL_FAMILY_CASES.find((x) => x.name === name)!;
  let rm: RandomModel;
  let split: LoadedModel;
  let whole: LoadedModel;
  let tokens: number[];
  beforeAll(async () => {
    rm = makeCaseModel(c, { dtype });
    const V = rm.config.vocab_size as number;
    const D = (rm.config.hidden_size ?? rm.config.n_embd) as number;
    // about a quarter of the float32 table per chunk: 4 or 5 chunks, the last one shorter
    const tensorBytes = Math.floor((V * D * 4) / 4.5);
    const weights = dtype === 'F32' ? 'f32' : 'stored';
    split = await loadModelNode(rm.dir, { backend, weights, memory: { tensorBytes } });
    whole = await loadModelNode(rm.dir, { backend, weights });
    tokens = caseTokens(rm, c.seqLen);
  });
  afterAll(async () => {
    await split?.dispose();
    await whole?.dispose();
    rm?.cleanup();
  });

  it('says it split, and why', () => {
    expect(split.info.vocab_chunks).toBe(5);
    expect(split.info.vocab_reason).toMatch(/^split into 5 chunks of \d+ rows: the \d+×\d+ vocabulary table/);
    expect(whole.info.vocab_chunks).toBe(1);
    expect(whole.info.vocab_reason).toMatch(/^whole/);
  });

  it('every hook and the logits agree with the float64 reference, and equal the unsplit graph', async () => {
    const ref = referenceForward(rm, tokens);
    const out = await split.run(tokens, { hooks: 'all' });
    const bad = compareHooks(
      ref.hooks,
      out.hooks,
      split.hookNames().filter((n) => n in ref.hooks),
      TOL,
    ).filter((r) => !r.ok);
    expect(bad, JSON.stringify(bad.slice(0, 3))).toEqual([]);
    expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs).toBeLessThan(TOL);
    const base = await whole.run(tokens, { hooks: ['hook_embed'] });
    // the lookup selects whole rows: bit-identical; the logits are the same dot products over D
    expect(maxAbsDiff(out.hooks.hook_embed.data, base.hooks.hook_embed.data).maxAbs).toBe(0);
    expect(maxAbsDiff(out.logits.data, base.logits.data).maxAbs).toBeLessThan(1e-6);
  });

  it('the logit lens and the DLA weight products read the chunked unembedding', async () => {
    const W = unembedTable(rm);
    const [V, D] = W.dims;
    // the lens on the reference's last residual = the reference logits
    const ref = referenceForward(rm, tokens);
    const last = ref.hooks[`blocks.${split.info.n_layers - 1}.hook_resid_post`];
    const T = tokens.length;
    const lens = await split.unembed({ dims: [T, D], data: Float32Array.from(last.data) });
    expect(lens.dims).toEqual([T, V]);
    expect(maxAbsDiff(ref.logits.data, lens.data).maxAbs).toBeLessThan(TOL);
    // rows of W_U for ids in every chunk, and the sum over the whole vocabulary (float64 here)
    const ids = [0, 1, Math.floor(V / 3), Math.floor(V / 2), V - 2, V - 1];
    const p = await split.weightProducts({ unembedIds: ids, unembedSum: true });
    expect(p.unembedRows.dims).toEqual([ids.length, D]);
    let rowDiff = 0;
    ids.forEach((id, i) => {
      for (let d = 0; d < D; d++)
        rowDiff = Math.max(rowDiff, Math.abs(p.unembedRows.data[i * D + d] - W.data[id * D + d]));
    });
    expect(rowDiff).toBe(0);
    const sum = new Float64Array(D);
    for (let v = 0; v < V; v++) for (let d = 0; d < D; d++) sum[d] += W.data[v * D + d];
    expect(maxAbsDiff(sum, p.unembedSum.data).maxAbs).toBeLessThan(1e-4);
    const q = await whole.weightProducts({ unembedIds: ids, unembedSum: false });
    expect(maxAbsDiff(q.unembedRows.data, p.unembedRows.data).maxAbs).toBe(0);
    expect([...q.unembedSum.data].every((x) => x === 0)).toBe(true);
  });

  it("gradients through the chunked unembedding equal the unsplit graph's", async () => {
    const V = split.info.d_vocab;
    const T = tokens.length;
    const seed = new Float32Array(V);
    seed[1] = 1;
    seed[V - 1] = -1; // a logit in the first chunk minus one in the last
    const hooks = ['hook_embed', `blocks.${split.info.n_layers - 1}.hook_resid_post`];
    const run = (m: LoadedModel) =>
      m.run(tokens, { hooks, logitPositions: [T - 1], grad: { hooks, seed: { dims: [1, 1, V], data: seed } } });
    const [a, b] = [await run(split), await run(whole)];
    for (const h of hooks) {
      const scale = Math.max(...b.grads![h].data.map(Math.abs));
      expect(scale).toBeGreaterThan(0);
      expect(maxAbsDiff(a.grads![h].data, b.grads![h].data).maxAbs / scale, h).toBeLessThan(1e-5);
    }
  });
});

describe('when the vocabulary is split', () => {
  const llama = { dtype: 'F16', shape: [128256, 2048] };
  it('16-bit tables widened at use: in float32 chunks of at most WIDEN_CHUNK_BYTES (Llama-3.2-1B: 1.05 GB → 16 chunks)', () => {
    const s = chooseVocabSplit(llama, 'stored');
    expect(s.chunks).toBe(Math.ceil((128256 * 2048 * 4) / WIDEN_CHUNK_BYTES));
    expect(s.rows * 2048 * 4).toBeLessThanOrEqual(WIDEN_CHUNK_BYTES);
    expect(s.rows * s.chunks).toBeGreaterThanOrEqual(128256);
    expect(s.reason).toMatch(/widened to float32 at use/);
  });
  it('float32 weights on WASM / node: whole; a WebGPU buffer limit splits even float32 (Gemma-2-2B: 256000×2304 under 1 GiB)', () => {
    expect(chooseVocabSplit(llama, 'f32').chunks).toBe(1);
    expect(chooseVocabSplit({ dtype: 'F32', shape: [128256, 2048] }, 'stored').chunks).toBe(1);
    const gemma = chooseVocabSplit({ dtype: 'BF16', shape: [256000, 2304] }, 'f32', 1024 ** 3);
    expect(gemma.chunks).toBe(3);
    expect(gemma.rows * 2304 * 4).toBeLessThanOrEqual(1024 ** 3);
    expect(gemma.reason).toMatch(/at most 1\.1 GB here/);
    // the smaller of the two limits wins
    expect(chooseVocabSplit(llama, 'stored', 1024 ** 3).reason).toMatch(/widened/);
    expect(chooseVocabSplit(llama, 'stored', 16 * 1024 ** 2).chunks).toBe(
      Math.ceil((128256 * 2048 * 4) / (16 * 1024 ** 2)),
    );
  });
});

describe('many chunks (Gemma-2-2B widened at use: 36)', () => {
  it('no Concat takes more than 7 inputs (WebGPU binds at most 8 storage buffers per shader), and the numbers equal the unsplit graph', async () => {
    const c = ALL_FAMILY_CASES.find((x) => x.name === 'llama-gqa-tied')!;
    const rm = makeCaseModel(c, { dtype: 'F16' });
    const V = rm.config.vocab_size as number,
      D = rm.config.hidden_size as number;
    // one or two rows per chunk: far more chunks than one Concat may take
    const split = await loadModelNode(rm.dir, {
      backend: 'wasm',
      weights: 'stored',
      memory: { tensorBytes: 2 * D * 4 },
    });
    const whole = await loadModelNode(rm.dir, { backend: 'wasm', weights: 'stored' });
    try {
      expect(split.info.vocab_chunks).toBe(Math.ceil(V / 2));
      expect(split.info.vocab_chunks).toBeGreaterThan(CONCAT_MAX_INPUTS);
      const files = await loadModelFilesNode(rm.dir);
      const spec = describeModel({ config: files.config as Record<string, any>, tensors: files.weights.tensors });
      for (const graph of [
        buildModelGraph(spec, files.weights.tensors, {
          hooks: true,
          withResult: false,
          weights: 'stored',
          vocabRows: 2,
        }),
        buildReadoutGraph(spec, files.weights.tensors, undefined, 'stored'),
      ]) {
        const nodes = (onnxProto as any).onnx.ModelProto.decode(graph.bytes).graph.node as {
          opType: string;
          input: string[];
        }[];
        const concats = nodes.filter((n) => n.opType === 'Concat');
        expect(concats.length).toBeGreaterThan(0);
        expect(Math.max(...concats.map((n) => n.input.length))).toBeLessThanOrEqual(CONCAT_MAX_INPUTS);
      }
      const tokens = caseTokens(rm, c.seqLen);
      const [a, b] = [await split.run(tokens, { hooks: 'all' }), await whole.run(tokens, { hooks: 'all' })];
      expect(maxAbsDiff(a.logits.data, b.logits.data).maxAbs).toBeLessThan(1e-5);
      const input = { prompt: 'hello world', top_k: 3 };
      const [ta, tb] = [await operations.trace.run(split, input, {}), await operations.trace.run(whole, input, {})];
      let d = 0;
      ta.head_attribution.forEach((row: number[], l: number) =>
        row.forEach((v, h) => (d = Math.max(d, Math.abs(v - tb.head_attribution[l][h])))),
      );
      expect(d).toBeLessThan(1e-5);
    } finally {
      await split.dispose();
      await whole.dispose();
      rm.cleanup();
    }
  });
});

describe('16-bit weights on a WebGPU adapter', () => {
  const f16 = { nParams: 1.2e9, byDtype: { F16: 1.2e9 }, storedBytes: 2.4e9 };
  const bf16 = { nParams: 1e6, byDtype: { BF16: 1e6 }, storedBytes: 2e6 };
  it('with shader-f16: auto keeps float16 weights 16-bit; without it they are widened at load, and the reason says why', () => {
    const yes = choosePrecisionOnGpu('auto', f16, { shaderF16: true });
    expect(yes.precision).toBe('stored');
    expect(yes.reason).toMatch(/shader-f16/);
    const no = choosePrecisionOnGpu('stored', f16, { shaderF16: false });
    expect(no.precision).toBe('f32');
    expect(no.reason).toMatch(/no shader-f16/);
    expect(choosePrecisionOnGpu('f32', f16, { shaderF16: true }).precision).toBe('f32');
    const b = choosePrecisionOnGpu('auto', bf16, { shaderF16: true });
    expect(b.precision).toBe('f32');
    expect(b.reason).toMatch(/no bfloat16/);
  });
  it("an adapter's caps: shader-f16 from its features, the buffer limit the smaller of its two limits", () => {
    expect(
      gpuCaps({ features: ['shader-f16'], limits: { maxStorageBufferBindingSize: 2 ** 30, maxBufferSize: 2 ** 31 } }),
    ).toMatchObject({ shaderF16: true, maxBufferBytes: 2 ** 30, shaderF16Source: 'GPUAdapter.features' });
    // SwiftShader in headless Chromium: no shader-f16, 1 GiB
    expect(
      gpuCaps({
        features: new Set(['subgroups']),
        limits: { maxStorageBufferBindingSize: 2 ** 30, maxBufferSize: 2 ** 30 },
      }),
    ).toMatchObject({ shaderF16: false, maxBufferBytes: 2 ** 30 });
    expect(gpuCaps({ features: [], limits: {} }).maxBufferBytes).toBe(128 * 1024 ** 2);
  });
});
