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
import { edgeLayout, forwardHead, forwardMlp } from '../src/engine/edges';
import { q8EntryBytesToWrite, type Q8Store } from '../src/engine/q8';
import { EXPERTS_FILE, materializeDerived } from '../src/engine/mxfp4';
import { readTensorF32 } from '../src/engine/safetensors';
import { generateTokens } from '../src/ops/lib/generation';
import { operation as trace } from '../src/ops/trace';
import { schemaErrors, viaJson } from './schema-helpers';
import type { LoadedModel } from '../src/engine/api';
import { compareHooks, maxAbsDiff, mulberry32, gaussian, f32ToF16Bits, f16BitsToF32 } from './reference';
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

/**
 * The q8 scheme (src/engine/q8.ts) from its definition, in float64, on a GPT-OSS reference model:
 * every matrix but the routers (not the biases) in blocks of 32 inputs (the stacked experts along their input axis,
 * D of gate_up_proj [E, D, 2M], M of down_proj [E, M, D]), one float16 scale max|w| / 127 per block
 */
function q8Of(m: GptOssModel): GptOssModel {
  const quant = (data: Float64Array, n: number, at: (i: number) => number) => {
    // the n values at(0…n − 1) of one output: blocks of 32 (or all n)
    const block = n % 32 === 0 ? 32 : n;
    for (let b0 = 0; b0 < n; b0 += block) {
      let mx = 0;
      for (let i = b0; i < b0 + block; i++) mx = Math.max(mx, Math.abs(data[at(i)]));
      const sc = f16BitsToF32(f32ToF16Bits(Math.fround(mx / 127)));
      for (let i = b0; i < b0 + block; i++) {
        const x = sc > 0 ? data[at(i)] / sc : 0;
        data[at(i)] = Math.max(-127, Math.min(127, Math.sign(x) * Math.floor(Math.abs(x) + 0.5))) * sc;
      }
    }
  };
  const tensors: GptOssModel['tensors'] = {};
  for (const [name, t] of Object.entries(m.tensors)) {
    const data = Float64Array.from(t.data);
    if (t.dims.length === 2 && name.endsWith('.weight') && !name.endsWith('.router.weight')) {
      const [R, C] = t.dims; // [out, in] (embeddings [rows, D]): blocks along C
      for (let o = 0; o < R; o++) quant(data, C, (i) => o * C + i);
    } else if (t.dims.length === 3) {
      const [E, I, O] = t.dims; // stacked experts [E, in, out]: blocks along in
      for (let e = 0; e < E; e++) for (let o = 0; o < O; o++) quant(data, I, (i) => (e * I + i) * O + o);
    }
    tensors[name] = { dims: t.dims, data };
  }
  return { ...m, tensors };
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

  it('an expert ablated and routing forced (interventions as data) equal the reference doing the same', async () => {
    const model = models.node!;
    const E = m.c.num_local_experts;
    const b = `blocks.${m.c.num_hidden_layers - 1}.mlp`;
    const ablated = await model.run(tokens, { interventions: [{ hook: `${b}.experts.1.hook_out`, op: 'zero' }] });
    const want = gptOssForward(m, tokens, {
      hook: (name, v) => (name === `${b}.experts.1.hook_out` ? v.map(() => 0) : undefined),
    });
    expect(maxAbsDiff(want.logits.data, ablated.logits.data).maxAbs).toBeLessThan(TOL);
    const forced = await model.run(tokens, {
      interventions: [{ hook: `${b}.hook_router_logits`, op: 'add', neuron: 0, value: [30] }],
    });
    const wantForced = gptOssForward(m, tokens, {
      hook: (name, v) => (name === `${b}.hook_router_logits` ? v.map((x, i) => (i % E === 0 ? x + 30 : x)) : undefined),
    });
    expect(maxAbsDiff(wantForced.logits.data, forced.logits.data).maxAbs).toBeLessThan(TOL);
    expect(maxAbsDiff(wantForced.logits.data, want.logits.data).maxAbs).toBeGreaterThan(100 * TOL);
  });

  it('the edge variant at w = 0 is the plain model: logits and every node (head results with the sinks, experts) as the reference', async () => {
    const model = models.node!;
    const { num_hidden_layers: L, num_attention_heads: H, num_local_experts: E, hidden_size: D, vocab_size: V } = m.c;
    const run = await model.run(tokens, { logitPositions: [T - 1], edges: { subtract: true, outputs: true } });
    const ref = gptOssForward(m, tokens);
    const lastRef = ref.logits.data.subarray((T - 1) * V, T * V);
    expect(maxAbsDiff(lastRef, run.logits.data).maxAbs).toBeLessThan(TOL);
    const lay = edgeLayout(L, H, false, { experts: E, shared: false });
    const out = (i: number) => run.edgeOutputs!.data.subarray(i * T * D, (i + 1) * T * D);
    let worst = maxAbsDiff(out(0), ref.hooks['hook_embed'].data).maxAbs;
    for (let l = 0; l < L; l++) {
      const res = ref.hooks[`blocks.${l}.attn.hook_result`].data; // [T, H, D]
      for (let h = 0; h < H; h++) {
        const want = Float64Array.from({ length: T * D }, (_, i) => res[(Math.floor(i / D) * H + h) * D + (i % D)]);
        worst = Math.max(worst, maxAbsDiff(out(forwardHead(lay, l, h)), want).maxAbs);
      }
      for (let e = 0; e < E; e++)
        worst = Math.max(
          worst,
          maxAbsDiff(out(forwardMlp(lay, l, e)), ref.hooks[`blocks.${l}.mlp.experts.${e}.hook_out`].data).maxAbs,
        );
    }
    expect(worst).toBeLessThan(TOL);
  });

  it('trace: a term per head, the attention bias and each expert (its biases inside), each as the reference, summing to the logit', async () => {
    const model = models.node!;
    const prompt = model.decode(tokens.slice(1));
    const doc: any = await trace.run(model, { prompt, convention: 'raw', top_k: 100 } as any, {});
    expect(schemaErrors('trace', viaJson(doc))).toEqual([]);
    const ids = doc.tokens.map((t: { id: number }) => t.id);
    const T2 = ids.length;
    const ref = gptOssForward(m, ids);
    const D = m.c.hidden_size;
    const at = (name: string) => ref.hooks[name].data.subarray((T2 - 1) * (ref.hooks[name].data.length / T2));
    // raw readout: e = w_norm ⊙ W_U[t] / s at the last position
    const t = doc.target.token_id;
    const U = m.tensors['lm_head.weight'].data;
    const wn = m.tensors['model.norm.weight'].data;
    const s = at('ln_final.hook_scale')[0];
    const e = Float64Array.from({ length: D }, (_, d) => (wn[d] * U[t * D + d]) / s);
    const dot = (x: ArrayLike<number>) => Array.from(x).reduce((a, v, d) => a + v * e[d], 0);
    const terms = new Map<string, number>(doc.decomposition.terms.map((x: any) => [x.name, x.value]));
    let worst = 0;
    for (let l = 0; l < m.c.num_hidden_layers; l++) {
      for (let x = 0; x < m.c.num_local_experts; x++)
        worst = Math.max(worst, Math.abs(terms.get(`L${l}.E${x}`)! - dot(at(`blocks.${l}.mlp.experts.${x}.hook_out`))));
      const res = at(`blocks.${l}.attn.hook_result`);
      for (let h = 0; h < m.c.num_attention_heads; h++)
        worst = Math.max(worst, Math.abs(terms.get(`L${l}H${h}`)! - dot(res.subarray(h * D, (h + 1) * D))));
      const bO = m.tensors[`model.layers.${l}.self_attn.o_proj.bias`].data;
      worst = Math.max(worst, Math.abs(terms.get(`L${l}.attn.b_O`)! - dot(bO)));
    }
    const gap = Math.abs(doc.decomposition.sum - doc.decomposition.target);
    console.log(
      `gpt_oss trace T=${T2}: worst term |Δ| ${worst.toExponential(2)}, |sum − target| ${gap.toExponential(2)}`,
    );
    expect(worst).toBeLessThan(TOL);
    expect(gap).toBeLessThan(TOL);
    expect(doc.top_experts.length).toBeGreaterThan(0);
  });

  it('∂(logit[A] − logit[B])/∂hook agrees with central differences of the reference (sinks, clamp, routing)', async () => {
    const model = models.node!;
    const V = m.c.vocab_size;
    const [A, Bt] = [3, 5];
    const seed = { dims: [1, 1, V], data: new Float32Array(V) };
    seed.data[A] = 1;
    seed.data[Bt] = -1;
    const hooks = model
      .hookNames()
      .filter((h) => !h.endsWith('hook_expert_weights') && !h.endsWith('hook_expert_indices'));
    const out = await model.run(tokens, { hooks, logitPositions: [T - 1], grad: { hooks, seed } });
    const metric = (hook: string, dir: Float64Array, eps: number) => {
      const L = gptOssForward(m, tokens, {
        hook: (name, v) => (name === hook ? v.map((x, i) => x + eps * dir[i]) : undefined),
      }).logits.data;
      return L[(T - 1) * V + A] - L[(T - 1) * V + Bt];
    };
    const rnd = gaussian(mulberry32(99));
    let worst = { rel: 0, hook: '' };
    for (const h of hooks) {
      const gr = out.grads![h];
      const n = gr.data.length;
      const d = Float64Array.from({ length: n }, () => rnd());
      // small steps: a top-k choice near a tie must not flip between the two runs
      const eps = 1e-6;
      const fd = (metric(h, d, eps) - metric(h, d, -eps)) / (2 * eps);
      let ad = 0;
      for (let i = 0; i < n; i++) if (Number.isFinite(out.hooks[h].data[i])) ad += d[i] * gr.data[i];
      const rel = Math.abs(ad - fd) / Math.max(Math.abs(fd), 1e-2);
      if (rel > worst.rel) worst = { rel, hook: h };
      expect(rel, `${h}: engine ${ad} vs finite difference ${fd}`).toBeLessThan(2e-3);
    }
    console.log(
      `gpt_oss gradients T=${T}: ${hooks.length} hooks, worst relative error ${worst.rel.toExponential(2)} at ${worst.hook}`,
    );
  }, 120_000);

  it('q8 quantises every matrix but the routers (the experts dequantised first) and equals the reference on the q8 weights; q4 runs', async () => {
    for (const weights of ['q8', 'q4'] as const) {
      const q = await loadModelNode(m.dir, { weights });
      try {
        expect(q.info.weights).toBe(weights);
        const out = await q.run(tokens);
        if (weights === 'q4') {
          expect(out.logits.data.every(Number.isFinite)).toBe(true);
          continue;
        }
        const d = maxAbsDiff(gptOssForward(q8Of(m), tokens).logits.data, out.logits.data).maxAbs;
        console.log(`gpt_oss q8 T=${T}: logits |Δ| vs the reference on q8 weights ${d.toExponential(2)}`);
        expect(d).toBeLessThan(TOL);
        expect(maxAbsDiff(gptOssForward(m, tokens).logits.data, out.logits.data).maxAbs).toBeGreaterThan(10 * TOL);
      } finally {
        await q.dispose();
      }
    }
  });

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
    [{ swiglu_limit: 5 }, 'UNSUPPORTED_CONFIG', 'swiglu_limit'],
    [{ swiglu_alpha: 1 }, 'UNSUPPORTED_CONFIG', 'swiglu_alpha'],
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

describe('gpt_oss: the experts made at load', () => {
  it('are read by range (no buffer of the whole file): any split of a read gives the same bytes, and each matrix is its rows of the dequantised checkpoint', async () => {
    const m = makeGptOssModel({ mxfp4: true, dtype: 'BF16', rope: 'default' });
    try {
      const { loadModelFilesNode: load } = await import('../src/node/load-files-node');
      const files = await load(m.dir);
      describeModel({ config: m.config, tensors: files.weights.tensors });
      materializeDerived(files.weights);
      expect(files.weights.files.has(EXPERTS_FILE)).toBe(false);
      const f = files.weights.ranged!.get(EXPERTS_FILE)!;
      const whole = f.read(0, f.size);
      const parts = new Uint8Array(f.size);
      const scratch = new Uint8Array(4096);
      for (let o = 0, n = 1000; o < f.size; o += n, n = (n * 7) % 5003 || 1) {
        const k = Math.min(n, f.size - o);
        parts.set(f.read(o, k, k <= scratch.byteLength ? scratch : undefined), o);
      }
      expect(Buffer.compare(Buffer.from(whole), Buffer.from(parts))).toBe(0);
      // expert 2's up matrix of layer 1: the odd columns of the reference's dequantised gate_up_proj [E, D, 2M]
      const { hidden_size: D, intermediate_size: M } = m.c;
      const up = readTensorF32(files.weights, 'model.layers.1.mlp.experts.2.up_proj.weight'); // [M, D]
      const gu = m.tensors['model.layers.1.mlp.experts.gate_up_proj'].data;
      let worst = 0;
      for (let j = 0; j < M; j++)
        for (let d = 0; d < D; d++)
          worst = Math.max(worst, Math.abs(up[j * D + d] - gu[(2 * D + d) * 2 * M + 2 * j + 1]));
      expect(worst).toBe(0);
    } finally {
      m.cleanup();
    }
  });
});

describe('gpt_oss and the q8 cache', () => {
  it("a q8 entry's key names the checkpoint files the experts are derived from, not the file built at load", async () => {
    const m = makeGptOssModel({ mxfp4: true, dtype: 'BF16', rope: 'default' });
    try {
      const files = await loadModelFilesNode(m.dir);
      const tensors = new Map(files.weights.tensors);
      const spec = describeModel({ config: m.config, tensors });
      const asked: string[][] = [];
      const store = {
        identity: async (f: string[]) => (asked.push(f), JSON.stringify(f)),
        open: async () => undefined,
      } as unknown as Q8Store;
      expect(await q8EntryBytesToWrite(tensors, spec, store)).toBeGreaterThan(0);
      expect(asked).toEqual([['model.safetensors']]);
      expect(asked.flat()).not.toContain(EXPERTS_FILE);
    } finally {
      m.cleanup();
    }
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
