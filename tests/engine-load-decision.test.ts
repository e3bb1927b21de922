/**
 * The load decision (src/engine/plan.ts): precision, budget, vocabulary split and the largest GPU
 * buffer decided once, at the precision the model runs at, from headers alone. On the
 * Llama-3.1-8B shape stored as F16 (tensors described, no bytes): with an adapter's limits that
 * hold its largest buffer it passes with no variable set; at the WebGPU spec's minimum it is
 * refused before any weight byte, naming the limit, its source and what would fit; a limit that
 * Node has to probe (src/node/gpu-buffer-probe.ts) is asked for exactly the size needed.
 */
import { describe, it, expect, afterAll } from 'vitest';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { describeModel } from '../src/engine/arch/index';
import { gpuCaps, type GpuCaps } from '../src/engine/env';
import { LoupeError } from '../src/engine/errors';
import { decideLoad, largestGpuBuffer } from '../src/engine/plan';
import type { TensorEntry } from '../src/engine/safetensors-types';
import { judgeModel, planModel } from '../src/engine/source/preflight';
import { GiB } from '../src/engine/budget';
import { FolderSource } from '../src/node/folder-source';
import { writeSparseSafetensors, type SparseTensor } from './helpers/sparse-model';

// Llama-3.1-8B (its config.json's numbers)
const L = 32,
  D = 4096,
  H = 32,
  KV = 8,
  DH = 128,
  M = 14336,
  V = 128256;
const CONFIG = {
  model_type: 'llama',
  architectures: ['LlamaForCausalLM'],
  hidden_size: D,
  num_hidden_layers: L,
  num_attention_heads: H,
  num_key_value_heads: KV,
  head_dim: DH,
  intermediate_size: M,
  vocab_size: V,
  rms_norm_eps: 1e-5,
  rope_theta: 500000,
  max_position_embeddings: 131072,
  hidden_act: 'silu',
  tie_word_embeddings: false,
  torch_dtype: 'float16',
};

function llama8bTensors(): SparseTensor[] {
  const t: SparseTensor[] = [
    { name: 'model.embed_tokens.weight', dtype: 'F16', shape: [V, D] },
    { name: 'lm_head.weight', dtype: 'F16', shape: [V, D] },
    { name: 'model.norm.weight', dtype: 'F16', shape: [D] },
  ];
  for (let l = 0; l < L; l++) {
    const p = `model.layers.${l}.`;
    t.push(
      { name: p + 'input_layernorm.weight', dtype: 'F16', shape: [D] },
      { name: p + 'post_attention_layernorm.weight', dtype: 'F16', shape: [D] },
      { name: p + 'self_attn.q_proj.weight', dtype: 'F16', shape: [H * DH, D] },
      { name: p + 'self_attn.k_proj.weight', dtype: 'F16', shape: [KV * DH, D] },
      { name: p + 'self_attn.v_proj.weight', dtype: 'F16', shape: [KV * DH, D] },
      { name: p + 'self_attn.o_proj.weight', dtype: 'F16', shape: [D, H * DH] },
      { name: p + 'mlp.gate_proj.weight', dtype: 'F16', shape: [M, D] },
      { name: p + 'mlp.up_proj.weight', dtype: 'F16', shape: [M, D] },
      { name: p + 'mlp.down_proj.weight', dtype: 'F16', shape: [D, M] },
    );
  }
  return t;
}

function entries(ts: SparseTensor[]): Map<string, TensorEntry> {
  let off = 0;
  return new Map(
    ts.map((t) => {
      const byteLength = t.shape.reduce((a, b) => a * b, 1) * 2;
      const e: TensorEntry = { ...t, fileOffset: off, byteLength, file: 'model.safetensors' };
      off += byteLength;
      return [t.name, e];
    }),
  );
}

const tensors = entries(llama8bTensors());
const spec = describeModel({ config: CONFIG, tensors });
/** the MLP matrices: 14336 × 4096 = 58.7M parameters, 117 MB as F16, 235 MB as float32 */
const MLP_F32 = M * D * 4;
/** the host memory of the machine the GPU table was taken on (128 GiB): the page's peak must fit it */
const memory = { hostBytes: 128 * GiB };

/** an adapter reporting 1 GiB for both buffer limits, as SwiftShader does in headless Chromium (and below discrete GPUs) */
const adapter1GiB = gpuCaps({
  features: ['shader-f16'],
  limits: { maxStorageBufferBindingSize: 2 ** 30, maxBufferSize: 2 ** 30 },
});
/** an adapter that says nothing of its limits: the WebGPU spec's minimums (128 MiB binding) */
const adapterMinimum = gpuCaps({ features: ['shader-f16'], limits: {} });

async function refusal(p: Promise<unknown>): Promise<LoupeError> {
  const e = await p.then(
    () => null,
    (x) => x,
  );
  expect(e).toBeInstanceOf(LoupeError);
  return e as LoupeError;
}

describe('the load decision on the Llama-3.1-8B shape stored as F16', () => {
  it("the largest buffer a run makes: an MLP matrix's float32 copy at use (stored, q8), its 4-bit blocks (q4)", () => {
    const stored = largestGpuBuffer(spec, tensors, 'stored')!;
    expect(stored.bytes).toBe(MLP_F32);
    expect(stored.tensor).toMatch(/mlp\.(gate|up|down)_proj/);
    expect(stored.form).toBe('float32 copy at use');
    expect(largestGpuBuffer(spec, tensors, 'q8')!.bytes).toBe(MLP_F32);
    const q4 = largestGpuBuffer(spec, tensors, 'q4')!;
    // q4: every Linear held as 4-bit (the largest: an MLP matrix at half a byte a parameter); norms are tiny
    expect(q4.bytes).toBe((M * D) / 2);
    expect(q4.form).toBe('held as 4-bit blocks');
  });

  it('passes with no variable set on an adapter whose limits hold it: 16-bit weights kept, one decision', async () => {
    const d = await decideLoad({ spec, tensors, backend: 'webgpu', mode: 'auto', gpu: adapter1GiB, memory });
    expect(d.precision).toBe('stored');
    expect(d.estimate.fits).toBe(true);
    expect(d.estimate.weightBytes).toBeCloseTo(d.stats.nParams * 2, -3);
    expect(d.buffer!.largest!.bytes).toBe(MLP_F32);
    expect(d.buffer!.limitBytes).toBe(2 ** 30);
    expect(d.buffer!.source).toMatch(/GPUAdapter\.limits: maxStorageBufferBindingSize 1073741824/);
    // the vocabulary tables (128256 × 4096: 2.1 GB as float32) split, each chunk within the 64 MB widening chunk
    expect(d.vocab.chunks).toBeGreaterThan(1);
    expect(d.vocab.rows * D * 4).toBeLessThanOrEqual(64 * 1024 ** 2);
    expect(d.reason).toMatch(/largest GPU buffer 235 MB .*within 1\.1 GB \(GPUAdapter\.limits/);
  });

  it('Node: a limit above the known one is probed at exactly the size needed, and its source recorded', async () => {
    const asked: number[] = [];
    const gpu: GpuCaps = {
      shaderF16: true,
      maxBufferBytes: 128 * 1024 ** 2,
      limitSource: 'the WebGPU default',
      probeBuffer: async (bytes) => (asked.push(bytes), { ok: true, source: 'probed: made and read back' }),
    };
    const d = await decideLoad({ spec, tensors, backend: 'webgpu', gpu, memory });
    expect(asked).toEqual([MLP_F32]);
    expect(d.precision).toBe('stored');
    expect(d.buffer).toMatchObject({ limitBytes: MLP_F32, source: 'probed: made and read back' });
  });

  it("refused at the spec's minimum, naming the limit, its source and what would fit (q4, the node backend)", async () => {
    const e = await refusal(
      decideLoad({
        spec,
        tensors,
        backend: 'webgpu',
        gpu: adapterMinimum,
        memory,
        offer: { backends: ['node', 'wasm'] },
      }),
    );
    expect(e.code).toBe('TOO_LARGE');
    expect(e.message).toMatch(/needs a 235 MB GPU buffer at stored \(float32 copy at use\)/);
    expect(e.message).toMatch(/maxStorageBufferBindingSize/);
    expect(e.message).toMatch(/the adapter did not say/);
    expect(e.hint).toContain('--weights q4');
    expect(e.hint).not.toContain('--weights q8'); // q8 widens to float32 at use too: its largest buffer is the same
    expect(e.hint).toContain('the node backend');
    expect(e.hint).not.toContain('the wasm backend'); // 16 GB of weights: more than the 4 GiB WebAssembly heap
    expect(e.details).toMatchObject({ bytes: MLP_F32, limit_bytes: 128 * 1024 ** 2, precision: 'stored' });
  });

  it('refused for GPU memory given by the caller, naming it, its source and what would fit (q4, node)', async () => {
    // buffers pass (1 GiB limits); 16 GB of F16 weights do not fit 8 GB: q8 (8.6 GB) does not either, q4 does
    const e = await refusal(
      decideLoad({
        spec,
        tensors,
        backend: 'webgpu',
        mode: 'stored',
        gpu: adapter1GiB,
        memory: { ...memory, gpuBytes: 8e9 },
        offer: { backends: ['node', 'wasm'] },
      }),
    );
    expect(e.code).toBe('TOO_LARGE');
    expect(e.message).toMatch(/more than GPU memory \(8\.0 GB, as the caller gave it \(memory\.gpuBytes\)/);
    expect(e.hint).toContain('--weights q4 on webgpu');
    expect(e.hint).not.toContain('--weights q8');
    expect(e.hint).toContain('the node backend');
    expect(e.details).toMatchObject({ limit_bytes: 8e9, limit_source: expect.stringMatching(/memory\.gpuBytes/) });
  });

  it('a probe that fails refuses, with what the probe found', async () => {
    const gpu: GpuCaps = {
      shaderF16: true,
      maxBufferBytes: 128 * 1024 ** 2,
      limitSource: 'the WebGPU default',
      probeBuffer: async () => ({ ok: false, source: 'probed: failed (out of memory)' }),
    };
    const e = await refusal(decideLoad({ spec, tensors, backend: 'webgpu', gpu, memory }));
    expect(e.code).toBe('TOO_LARGE');
    expect((e.details as any).limit_source).toMatch(/the WebGPU default; probed: failed \(out of memory\)/);
  });

  describe('before any weight byte: the judgement of a plan read from headers', () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'loupe-8b-'));
    afterAll(() => rmSync(dir, { recursive: true, force: true }));

    it("a sparse folder (header, then a hole): refused in planModel's judge at the minimum, passing at 1 GiB", async () => {
      writeFileSync(path.join(dir, 'config.json'), JSON.stringify(CONFIG));
      writeFileSync(
        path.join(dir, 'tokenizer.json'),
        JSON.stringify({ model: { type: 'BPE', vocab: {}, merges: [] } }),
      );
      writeSparseSafetensors(path.join(dir, 'model.safetensors'), llama8bTensors());
      let judged = 0;
      const judge = (gpu: GpuCaps) => async (plan: any) => {
        judged++;
        const j = (await judgeModel(plan, 'webgpu', 'auto', memory, {}, gpu))!;
        expect(j.decision.precision).toBe('stored');
      };
      const e = await refusal(planModel(new FolderSource(dir), { judge: judge(adapterMinimum) }));
      expect(e.code).toBe('TOO_LARGE');
      expect(judged).toBe(1);
      await planModel(new FolderSource(dir), { judge: judge(adapter1GiB) });
      expect(judged).toBe(2);
    });
  });
});
