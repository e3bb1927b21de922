/**
 * GPT-OSS against the float64 reference of tests/reference/gpt_oss-64.ts (written from
 * modeling_gpt_oss.py, _compute_yarn_parameters and convert_moe_packed_tensors, sharing no code
 * with src/): a checkpoint with dense float32 experts and explicit layer_types and YaRN, and one
 * as published (experts as MXFP4 blocks and scales, the rest bfloat16, HF's defaults for
 * layer_types and rope): every hook and the logits within 1e-4 on onnxruntime-node, WASM and
 * onnxruntime-node's WebGPU provider (SwiftShader here); greedy continuations through the KV
 * cache equal the reference's full re-runs; leaving out each feature moves the logits by more
 * than the tolerance; bad configs and MXFP4 scales of the wrong size are structured errors from
 * config.json and the headers, before any weight byte is read.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { checkConfig, describeModel } from '../src/engine/arch';
import { LoupeError } from '../src/engine/errors';
import { judgeEntry, lookupModelName } from '../src/engine/catalog';
import { generateTokens } from '../src/ops/lib/generation';
import type { LoadedModel } from '../src/engine/api';
import { compareHooks, maxAbsDiff } from './reference';
import {
  makeGptOssModel,
  gptOssForward,
  gptOssGreedy,
  GPT_OSS_FEATURES,
  type GptOssModel,
  type GptOssOptions,
} from './reference/gpt_oss-64';

const TOL = 1e-4;

function promptOf(m: GptOssModel, T: number, seed = 3): number[] {
  const specials = new Set(Object.values(m.tokenizer.specialIds));
  const out = [m.bosId];
  let s = seed;
  while (out.length < T) {
    s = (s * 1103515245 + 12345) % 2 ** 31;
    const t = s % m.c.vocab_size;
    if (!specials.has(t)) out.push(t);
  }
  return out;
}

const CASES: { name: string; options: GptOssOptions; T: number }[] = [
  {
    name: 'dense float32 experts, explicit layer_types, YaRN (truncated ramp)',
    options: { layerTypes: ['sliding_attention', 'full_attention', 'full_attention', 'sliding_attention'] },
    T: 12,
  },
  {
    name: 'MXFP4 experts, bfloat16, HF defaults (even layers slide, YaRN factor 32 of 4096)',
    options: { mxfp4: true, dtype: 'BF16', rope: 'default', seed: 5 },
    T: 14,
  },
];

describe.each(CASES)('gpt_oss vs float64 reference: $name', ({ options, T }) => {
  let m: GptOssModel;
  const models: Partial<Record<'node' | 'wasm' | 'webgpu', LoadedModel>> = {};
  let tokens: number[];
  beforeAll(async () => {
    m = makeGptOssModel(options);
    tokens = promptOf(m, T);
    for (const backend of ['node', 'wasm', 'webgpu'] as const)
      models[backend] = await loadModelNode(m.dir, { backend });
  });
  afterAll(async () => {
    for (const model of Object.values(models)) await model?.dispose();
    m?.cleanup();
  });

  it.each(['node', 'wasm', 'webgpu'] as const)('every hook and the logits within 1e-4 (%s)', async (backend) => {
    const model = models[backend]!;
    const ref = gptOssForward(m, tokens);
    const out = await model.run(tokens, { hooks: 'all', withResult: true });
    const names = model.hookNames({ withResult: true });
    expect(names.filter((n) => !(n in ref.hooks))).toEqual([]);
    expect(Object.keys(ref.hooks).filter((n) => !names.includes(n))).toEqual([]);
    const cmp = compareHooks(ref.hooks, out.hooks, names, TOL);
    const bad = cmp.filter((r) => !r.ok);
    expect(bad, JSON.stringify(bad.slice(0, 5))).toEqual([]);
    const logits = maxAbsDiff(ref.logits.data, out.logits.data).maxAbs;
    expect(logits).toBeLessThan(TOL);
    const worst = Math.max(...cmp.map((r) => r.maxAbs));
    console.log(
      `gpt_oss ${backend} T=${T}: ${cmp.length} hooks, worst |Δ| ${worst.toExponential(2)}, logits |Δ| ${logits.toExponential(2)}`,
    );
  });

  it('routing is not degenerate: every layer routes to more than k experts', () => {
    const ref = gptOssForward(m, tokens);
    const { num_local_experts: E, num_experts_per_tok: k, num_hidden_layers: L } = m.c;
    for (let l = 0; l < L; l++) {
      const w = ref.hooks[`blocks.${l}.mlp.hook_router_weights`].data;
      const used = new Set<number>();
      for (let t = 0; t < T; t++) for (let e = 0; e < E; e++) if (w[t * E + e] > 0) used.add(e);
      expect(used.size, `layer ${l}`).toBeGreaterThan(k);
    }
  });

  it('a prompt continued from its KV cache equals the whole prompt at once', async () => {
    const model = models.node!;
    const whole = await model.run(tokens);
    const V = m.c.vocab_size;
    const cut = Math.floor(T / 2);
    const head = await model.run(tokens.slice(0, cut), { returnCache: true });
    const rest = await model.run(tokens.slice(cut), { past: head.present! });
    const joined = new Float32Array(T * V);
    joined.set(head.logits.data, 0);
    joined.set(rest.logits.data, cut * V);
    expect(maxAbsDiff(whole.logits.data, joined).maxAbs).toBeLessThan(TOL);
  });

  it.each(['node', 'wasm', 'webgpu'] as const)(
    'greedy continuation through the KV cache equals the reference (%s)',
    async (backend) => {
      const n = 8;
      const want = gptOssGreedy(m, tokens, n);
      const got = await generateTokens(models[backend]!, tokens, { maxNewTokens: n, temperature: 0, stopAtEos: false });
      expect(got.ids).toEqual(want);
    },
  );

  it('leaving out each feature moves the logits by more than the tolerance', () => {
    const base = gptOssForward(m, tokens).logits.data;
    const moved: Record<string, number> = {};
    for (const f of GPT_OSS_FEATURES) {
      const d = maxAbsDiff(gptOssForward(m, tokens, { drop: [f] }).logits.data, base).maxAbs;
      moved[f] = Number(d.toExponential(2));
      expect(d, f).toBeGreaterThan(100 * TOL);
    }
    console.log(`gpt_oss sensitivity T=${T}: ${JSON.stringify(moved)}`);
  });
});

describe('gpt_oss: what Loupe cannot run is refused from config.json and the headers', () => {
  let m: GptOssModel;
  beforeAll(() => {
    m = makeGptOssModel({ mxfp4: true, dtype: 'BF16', rope: 'default' });
  });
  afterAll(() => m?.cleanup());
  const refused = (patch: Record<string, unknown>) => {
    try {
      checkConfig({ ...m.config, ...patch });
    } catch (e) {
      expect(e).toBeInstanceOf(LoupeError);
      return e as LoupeError;
    }
    throw new Error('expected a refusal');
  };

  it.each([
    [{ num_local_experts: 100_000 }, 'BAD_CONFIG', 'num_local_experts'],
    [{ num_experts_per_tok: 5 }, 'BAD_CONFIG', 'num_experts_per_tok'],
    [{ num_experts_per_tok: 1000 }, 'BAD_CONFIG', 'num_experts_per_tok'],
    [{ quantization_config: { quant_method: 'bitsandbytes' } }, 'UNSUPPORTED_CONFIG', 'quantization_config'],
    [{ rope_scaling: { rope_type: 'yarn', factor: 32 } }, 'BAD_CONFIG', 'original_max_position_embeddings'],
    [{ rope_scaling: { rope_type: 'dynamic', factor: 2 } }, 'UNSUPPORTED_CONFIG', 'rope_scaling.rope_type'],
    [{ swiglu_limit: -1 }, 'UNSUPPORTED_CONFIG', 'swiglu_limit'],
    [{ layer_types: ['sliding_attention'] }, 'BAD_CONFIG', 'layer_types'],
    [
      { layer_types: ['full_attention', 'mamba', 'full_attention', 'full_attention'] },
      'UNSUPPORTED_CONFIG',
      'layer_types[1]',
    ],
  ])('%j → %s naming %s', (patch, code, field) => {
    const e = refused(patch);
    expect(e.code).toBe(code);
    expect(JSON.stringify(e.details ?? {}) + e.message).toContain(field);
  });

  it('the published config passes', () => {
    expect(() => checkConfig(m.config)).not.toThrow();
  });

  it('MXFP4 scales of the wrong size, a wrong router and a missing expert tensor: errors naming the tensor, from the headers alone', async () => {
    // loadModelFilesNode reads the safetensors headers only: no weight byte is in memory
    const files = await loadModelFilesNode(m.dir);
    expect(files.weights.files.size).toBe(0);
    const refusedBy = (edit: (t: Map<string, any>) => void) => {
      const tensors = new Map(files.weights.tensors);
      edit(tensors);
      try {
        describeModel({ config: m.config, tensors });
      } catch (e) {
        expect(e).toBeInstanceOf(LoupeError);
        return e as LoupeError;
      }
      throw new Error('expected a refusal');
    };
    const scales = 'model.layers.1.mlp.experts.down_proj_scales';
    const s = files.weights.tensors.get(scales)!;
    let e = refusedBy((t) => t.set(scales, { ...s, shape: [s.shape[0], s.shape[1], s.shape[2] + 1] }));
    expect(e.code).toBe('BAD_TENSOR_SHAPE');
    expect(e.details).toMatchObject({ tensor: scales });
    e = refusedBy((t) => t.set(scales, { ...s, dtype: 'BF16' }));
    expect(e.code).toBe('SAFETENSORS_UNKNOWN_DTYPE');
    e = refusedBy((t) => t.delete('model.layers.0.mlp.experts.gate_up_proj_scales'));
    expect([e.code, (e.details as { tensor?: string })?.tensor]).toEqual([
      'MISSING_TENSOR',
      'model.layers.0.mlp.experts.gate_up_proj_scales',
    ]);
    const router = 'model.layers.2.mlp.router.weight';
    e = refusedBy((t) => t.set(router, { ...t.get(router), shape: [7, m.c.hidden_size] }));
    expect([e.code, (e.details as { tensor?: string })?.tensor]).toEqual(['BAD_TENSOR_SHAPE', router]);
    e = refusedBy((t) => t.delete('model.layers.3.self_attn.sinks'));
    expect([e.code, (e.details as { tensor?: string })?.tensor]).toEqual([
      'MISSING_TENSOR',
      'model.layers.3.self_attn.sinks',
    ]);
    e = refusedBy((t) => t.delete('model.layers.0.mlp.experts.down_proj_bias'));
    expect([e.code, (e.details as { tensor?: string })?.tensor]).toEqual([
      'MISSING_TENSOR',
      'model.layers.0.mlp.experts.down_proj_bias',
    ]);
  });
});

describe('gpt_oss in the catalog', () => {
  it('gpt-oss-20b: its Hub id, the download its MXFP4 experts take and the BF16 a load holds', () => {
    const hit = lookupModelName('gpt-oss-20b')!;
    expect(hit.entry).toMatchObject({ id: 'openai/gpt-oss-20b', family: 'gpt_oss', dtype: 'BF16' });
    const j = judgeEntry(hit.entry);
    expect(j.downloadBytes).toBe(13.8e9);
    // the download is the MXFP4 checkpoint's, not params × BF16 (what a load holds)
    expect(j.downloadBytes).toBeLessThan((2 * hit.entry.params) / 2.5);
  });
});
