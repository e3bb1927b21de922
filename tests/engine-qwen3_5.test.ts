/**
 * Qwen3.5 (gated delta-net + gated attention) against the float64 reference of
 * tests/reference/qwen3_5-64.ts, which runs the delta rule token by token (the engine evaluates
 * a Scan of the same recurrence): every hook and the logits within 1e-4 on onnxruntime-node, WASM
 * and onnxruntime-node's WebGPU provider (SwiftShader here), for a Qwen3_5ForCausalLM checkpoint
 * and a multimodal one (text_config, model.language_model.); trace's terms as the reference's;
 * greedy continuations through the KV cache and the recurrent + conv state equal the
 * reference's full re-runs; gradients through the delta rule (q, k, v, β, g, its read-out and the
 * embedding) equal float64 central differences on every backend; a prompt continued from its state equals the whole prompt run at
 * once; each feature the reference can leave out moves the logits by more than the tolerance;
 * bad configs are structured errors before any weight is read.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import { checkConfig } from '../src/engine/arch';
import { LoupeError } from '../src/engine/errors';
import { generateTokens } from '../src/ops/lib/generation';
import { operation as trace } from '../src/ops/trace';
import { schemaErrors, viaJson } from './schema-helpers';
import type { LoadedModel } from '../src/engine/api';
import { compareHooks, maxAbsDiff, mulberry32 } from './reference';
import {
  makeQwen35Model,
  qwen35Forward,
  qwen35Greedy,
  QWEN35_FEATURES,
  type Qwen35Model,
  type Qwen35Options,
} from './reference/qwen3_5-64';

const TOL = 1e-4;

/** prompt tokens: BOS then ids that are no special token */
function promptOf(m: Qwen35Model, T: number, seed = 3): number[] {
  const specials = new Set(Object.values(m.tokenizer.specialIds));
  const out = [m.bosId];
  let s = seed;
  while (out.length < T) {
    s = (s * 1103515245 + 12345) % 2 ** 31;
    const t = s % m.text.vocab_size;
    if (!specials.has(t)) out.push(t);
  }
  return out;
}

const CASES: { name: string; options: Qwen35Options; T: number }[] = [
  // HF's default layer_types (three linear_attention layers, then full_attention)
  { name: 'causal-lm', options: {}, T: 12 },
  { name: 'causal-lm, 48 tokens', options: { seed: 11 }, T: 48 },
  {
    name: 'multimodal bf16, explicit layer_types, one key head per two value heads, kernel 3',
    options: {
      multimodal: true,
      dtype: 'BF16',
      seed: 7,
      nLayers: 3,
      layerTypes: ['full_attention', 'linear_attention', 'linear_attention'],
      linearKeyHeads: 1,
      linearValueHeads: 2,
      linearKeyDim: 12,
      linearValueDim: 6,
      convKernel: 3,
      tied: true,
    },
    T: 9,
  },
];

describe.each(CASES)('qwen3_5 vs float64 reference: $name', ({ options, T }) => {
  let m: Qwen35Model;
  const models: Partial<Record<'node' | 'wasm' | 'webgpu', LoadedModel>> = {};
  let tokens: number[];
  beforeAll(async () => {
    m = makeQwen35Model(options);
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
    const ref = qwen35Forward(m, tokens);
    const out = await model.run(tokens, { hooks: 'all' });
    const names = model.hookNames();
    expect(names.filter((n) => !(n in ref.hooks))).toEqual([]);
    expect(Object.keys(ref.hooks).filter((n) => !names.includes(n))).toEqual([]);
    const cmp = compareHooks(ref.hooks, out.hooks, names, TOL);
    const bad = cmp.filter((r) => !r.ok);
    expect(bad, JSON.stringify(bad.slice(0, 5))).toEqual([]);
    const logits = maxAbsDiff(ref.logits.data, out.logits.data).maxAbs;
    expect(logits).toBeLessThan(TOL);
    const worst = Math.max(...cmp.map((r) => r.maxAbs));
    console.log(
      `qwen3_5 ${backend} T=${T}: ${cmp.length} hooks, worst |Δ| ${worst.toExponential(2)}, logits |Δ| ${logits.toExponential(2)}`,
    );
  });

  it.each(['node', 'wasm', 'webgpu'] as const)(
    'gradients through the delta rule equal float64 central differences (%s)',
    async (backend) => {
      const model = models[backend]!;
      const V = m.text.vocab_size;
      const l = m.text.layer_types.indexOf('linear_attention');
      // M = logit[a] − logit[b] at the last position; each hook of the Scan's inputs, its output, and the embedding
      const [a, b] = [3, 5];
      const seed = new Float32Array(T * V);
      seed[(T - 1) * V + a] = 1;
      seed[(T - 1) * V + b] = -1;
      const la = `blocks.${l}.linear_attn`;
      const names = ['q', 'k', 'v', 'beta', 'decay', 'core'].map((h) => `${la}.hook_${h}`);
      names.push('blocks.0.hook_resid_pre');
      const out = await model.run(tokens, { grad: { hooks: names, seed: { dims: [1, T, V], data: seed } } });
      let worst = 0;
      const lines: string[] = [];
      for (const name of names) {
        const g = out.grads![name].data;
        const r = mulberry32(name.length * 31 + 7);
        const u = Array.from({ length: g.length }, () => r() * 2 - 1);
        const M = (eps: number) => {
          const hook = (h: string, v: Float64Array) => (h === name ? v.map((x, i) => x + eps * u[i]) : undefined);
          const row = qwen35Forward(m, tokens, { hook }).logits.data.subarray((T - 1) * V, T * V);
          return row[a] - row[b];
        };
        const fd = (M(1e-6) - M(-1e-6)) / 2e-6;
        const got = u.reduce((s, x, i) => s + x * g[i], 0);
        const rel = Math.abs(got - fd) / Math.abs(fd);
        lines.push(`${name.split('.').pop()} ${got.toFixed(5)} vs ${fd.toFixed(5)} (rel ${rel.toExponential(1)})`);
        expect(Math.abs(fd), name).toBeGreaterThan(1e-2); // each direction moves M, so the check can fail
        worst = Math.max(worst, rel);
      }
      console.log(`qwen3_5 ${backend} T=${T} ∂M/∂hook · u, engine vs float64: ${lines.join('; ')}`);
      expect(worst).toBeLessThan(1e-3);
    },
  );

  it('a prompt continued from its cache and recurrent state equals the whole prompt at once', async () => {
    const model = models.node!;
    const whole = await model.run(tokens);
    const V = m.text.vocab_size;
    const cut = Math.floor(T / 2);
    const head = await model.run(tokens.slice(0, cut), { returnCache: true });
    let past = head.present!;
    // the rest in two pieces: several positions, then one
    const mid = await model.run(tokens.slice(cut, T - 1), { past, returnCache: true });
    past = mid.present!;
    const last = await model.run(tokens.slice(T - 1), { past });
    const joined = new Float32Array(T * V);
    joined.set(head.logits.data, 0);
    joined.set(mid.logits.data, cut * V);
    joined.set(last.logits.data, (T - 1) * V);
    expect(maxAbsDiff(whole.logits.data, joined).maxAbs).toBeLessThan(TOL);
  });

  it.each(['node', 'wasm', 'webgpu'] as const)(
    'greedy continuation through the cache and state equals the reference (%s)',
    async (backend) => {
      const n = 8;
      const want = qwen35Greedy(m, tokens, n);
      const got = await generateTokens(models[backend]!, tokens, {
        maxNewTokens: n,
        temperature: 0,
        stopAtEos: false,
      });
      expect(got.ids).toEqual(want);
    },
  );

  it('interventions on the delta-net hooks act as in the reference', async () => {
    const model = models.node!;
    const l = m.text.layer_types.indexOf('linear_attention');
    const hook = `blocks.${l}.linear_attn.hook_decay`;
    // g = 0 at every position (no decay): the engine's edit equals the reference's replaced value
    const ref = qwen35Forward(m, tokens, { hook: (name, v) => (name === hook ? v.map(() => 0) : undefined) });
    const out = await model.run(tokens, { interventions: [{ hook, op: 'zero' }] });
    expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs).toBeLessThan(TOL);
  });

  it.each(['node', 'wasm'] as const)(
    'trace: heads of the attention layers and one term per linear-attention layer, each as the reference (%s)',
    async (backend) => {
      const model = models[backend]!;
      const prompt = model.decode(tokens.slice(1));
      const doc: any = await trace.run(model, { prompt, convention: 'raw', top_k: 100 } as any, {});
      expect(schemaErrors('trace', viaJson(doc))).toEqual([]);
      const ids = doc.tokens.map((t: { id: number }) => t.id);
      const T2 = ids.length;
      const ref = qwen35Forward(m, ids);
      const D = m.text.hidden_size;
      const pos = T2 - 1;
      const at = (name: string) => ref.hooks[name].data.subarray(pos * (ref.hooks[name].data.length / T2));
      // raw readout: e = (1 + w_norm) ⊙ W_U[t] / s at the position
      const t = doc.target.token_id;
      const U = m.tensors[m.text.tie_word_embeddings ? `${m.prefix}embed_tokens.weight` : 'lm_head.weight'].data;
      const wn = m.tensors[`${m.prefix}norm.weight`].data;
      const s = at('ln_final.hook_scale')[0];
      const e = Float64Array.from({ length: D }, (_, d) => ((1 + wn[d]) * U[t * D + d]) / s);
      const dot = (x: ArrayLike<number>) => Array.from(x).reduce((a, v, d) => a + v * e[d], 0);
      const terms = new Map<string, number>(doc.decomposition.terms.map((x: any) => [x.name, x.value]));
      const H = m.text.num_attention_heads;
      const Dh = m.text.head_dim;
      let worst = 0;
      m.text.layer_types.forEach((type: string, l: number) => {
        if (type === 'linear_attention') {
          worst = Math.max(worst, Math.abs(terms.get(`L${l}.linear_attn`)! - dot(at(`blocks.${l}.hook_attn_out`))));
          expect(doc.head_attribution[l]).toEqual([]);
          return;
        }
        const z = at(`blocks.${l}.attn.hook_z`);
        const Wo = m.tensors[`${m.prefix}layers.${l}.self_attn.o_proj.weight`].data; // [D, H·Dh]
        for (let h = 0; h < H; h++) {
          const out = Float64Array.from({ length: D }, (_, d) => {
            let v = 0;
            for (let k = 0; k < Dh; k++) v += z[h * Dh + k] * Wo[d * H * Dh + h * Dh + k];
            return v;
          });
          worst = Math.max(worst, Math.abs(terms.get(`L${l}H${h}`)! - dot(out)));
        }
      });
      const gap = Math.abs(doc.decomposition.sum - doc.decomposition.target);
      console.log(
        `qwen3_5 trace ${backend}: worst term |Δ| ${worst.toExponential(2)}, |sum − target| ${gap.toExponential(2)}`,
      );
      expect(worst).toBeLessThan(TOL);
      expect(gap).toBeLessThan(TOL);
      expect(doc.top_heads.every((h: any) => m.text.layer_types[h.layer] === 'full_attention')).toBe(true);
    },
  );

  it("an attention hook of a linear-attention layer is UNKNOWN_HOOK naming the layer's own hooks", async () => {
    const l = m.text.layer_types.indexOf('linear_attention');
    const e = await models.node!.run(tokens, { hooks: [`blocks.${l}.attn.hook_pattern`] }).catch((x) => x);
    expect(e).toBeInstanceOf(LoupeError);
    expect(e.code).toBe('UNKNOWN_HOOK');
    expect(e.hint).toContain(`blocks.${l}.linear_attn.hook_q|`);
    expect(e.hint).toContain('hook_core');
  });

  it('leaving out each feature moves the logits by more than the tolerance', () => {
    const base = qwen35Forward(m, tokens).logits.data;
    const types = new Set(m.text.layer_types);
    for (const f of QWEN35_FEATURES) {
      const d = maxAbsDiff(qwen35Forward(m, tokens, { drop: [f] }).logits.data, base).maxAbs;
      expect(d, f).toBeGreaterThan(100 * TOL);
    }
    expect(types.size).toBe(2);
  });
});

describe('qwen3_5 configs Loupe cannot run are refused from config.json alone', () => {
  const m = makeQwen35Model({});
  afterAll(() => m.cleanup());
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
    [{ linear_num_value_heads: 3 }, 'BAD_CONFIG', 'linear_num_value_heads'],
    [{ linear_conv_kernel_dim: 1 }, 'UNSUPPORTED_CONFIG', 'linear_conv_kernel_dim'],
    [
      { layer_types: ['linear_attention', 'mamba', 'linear_attention', 'full_attention'] },
      'UNSUPPORTED_CONFIG',
      'layer_types[1]',
    ],
    [{ layer_types: ['full_attention'] }, 'BAD_CONFIG', 'layer_types'],
    [{ hidden_act: 'gelu' }, 'UNSUPPORTED_CONFIG', 'hidden_act'],
    [{ rope_parameters: { rope_type: 'yarn', factor: 4 } }, 'UNSUPPORTED_CONFIG', 'rope_parameters.rope_type'],
    [{ linear_num_key_heads: 0 }, 'BAD_CONFIG', 'linear_num_key_heads'],
  ])('%j → %s naming %s', (patch, code, field) => {
    const e = refused(patch);
    expect(e.code).toBe(code);
    expect(JSON.stringify(e.details ?? {}) + e.message).toContain(field);
  });

  it('a multimodal config without text_config is BAD_CONFIG', () => {
    const e = refused({ model_type: 'qwen3_5' });
    expect(e.code).toBe('BAD_CONFIG');
  });
});
