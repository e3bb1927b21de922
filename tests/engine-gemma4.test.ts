/**
 * Gemma 4's text decoder against the float64 reference of tests/reference/gemma4-64.ts: every hook
 * and the logits within 1e-4 on onnxruntime-node, WASM and onnxruntime-node's WebGPU provider
 * (SwiftShader here), for a Gemma4ForCausalLM checkpoint with per-layer inputs, KV sharing of both
 * layer types and the double-wide MLP, a multimodal bf16 one with attention_k_eq_v (its own key
 * heads on the full layers) and no per-layer inputs, and one with all of them; a prompt continued
 * from its cache equals the whole prompt at once; greedy continuations through the KV cache equal
 * the reference's full re-runs; each feature the reference can leave out moves the logits by more
 * than the tolerance; every term of trace equals a float64 decomposition of the reference
 * (layer_scalar, wide heads and MLPs, per-layer inputs); bad configs are structured errors naming
 * the field before any weight is read.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode, nodeFactory } from '../src/node/load';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { createModel, modelPartsFrom } from '../src/engine/model';
import { checkConfig } from '../src/engine/arch';
import { LoupeError } from '../src/engine/errors';
import { generateTokens } from '../src/ops/lib/generation';
import type { LoadedModel } from '../src/engine/api';
import { operation as trace } from '../src/ops/trace';
import { operation as circuit } from '../src/ops/circuit';
import { decomposeLogit, dlaHookNames } from '../src/ops/lib/dla';
import { compareHooks, maxAbsDiff } from './reference';
import { q8Reference } from './helpers/q8-reference';
import {
  makeGemma4Model,
  gemma4Forward,
  gemma4Greedy,
  gemma4Dla,
  GEMMA4_FEATURES,
  type Gemma4Model,
  type Gemma4Options,
} from './reference/gemma4-64';

const TOL = 1e-4;

/** prompt tokens: BOS then ids that are no special token */
function promptOf(m: Gemma4Model, T: number, seed = 3): number[] {
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

const S = 'sliding_attention' as const;
const F = 'full_attention' as const;
const CASES: { name: string; options: Gemma4Options; T: number; all?: boolean }[] = [
  {
    name: 'causal-lm: per-layer inputs, KV sharing of both types, double-wide MLP',
    options: { layerTypes: [S, S, F, S, S, F], kvShared: 2, doubleWide: true, nKvHeads: 1 },
    T: 12,
  },
  {
    name: 'multimodal bf16: attention_k_eq_v, no per-layer inputs, default layer types, untied',
    options: { multimodal: true, dtype: 'BF16', kEqV: true, globalKvHeads: 1, perLayer: 0, tied: false, seed: 7 },
    T: 10,
  },
  {
    name: 'all features, 40 tokens',
    options: {
      nLayers: 7,
      layerTypes: [S, F, S, S, F, S, F],
      kvShared: 3,
      kEqV: true,
      doubleWide: true,
      window: 6,
      seed: 9,
    },
    T: 40,
    all: true,
  },
];

describe.each(CASES)('gemma4 vs float64 reference: $name', ({ options, T, all }) => {
  let m: Gemma4Model;
  // 'stream': onnxruntime-node with DLA's readout streamed from the weight bytes (the others run it in a graph)
  const models: Partial<Record<'node' | 'wasm' | 'webgpu' | 'stream', LoadedModel>> = {};
  let tokens: number[];
  beforeAll(async () => {
    m = makeGemma4Model(options);
    tokens = promptOf(m, T);
    for (const backend of ['node', 'wasm', 'webgpu'] as const)
      models[backend] = await loadModelNode(m.dir, { backend });
    const parts = modelPartsFrom(await loadModelFilesNode(m.dir), { bundled: false, id: m.dir });
    models.stream = await createModel({ ...parts, readout: 'stream' }, await nodeFactory('node'));
  });
  afterAll(async () => {
    for (const model of Object.values(models)) await model?.dispose();
    m?.cleanup();
  });

  it.each(['node', 'wasm', 'webgpu'] as const)('every hook and the logits within 1e-4 (%s)', async (backend) => {
    const model = models[backend]!;
    const ref = gemma4Forward(m, tokens);
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
      `gemma4 ${backend} T=${T}: ${cmp.length} hooks, worst |Δ| ${worst.toExponential(2)}, logits |Δ| ${logits.toExponential(2)}`,
    );
  });

  it('a prompt continued from its cache equals the whole prompt at once', async () => {
    const model = models.node!;
    const whole = await model.run(tokens);
    const V = m.text.vocab_size;
    const cut = Math.floor(T / 2);
    const head = await model.run(tokens.slice(0, cut), { returnCache: true });
    const mid = await model.run(tokens.slice(cut, T - 1), { past: head.present!, returnCache: true });
    const last = await model.run(tokens.slice(T - 1), { past: mid.present! });
    const joined = new Float32Array(T * V);
    joined.set(head.logits.data, 0);
    joined.set(mid.logits.data, cut * V);
    joined.set(last.logits.data, (T - 1) * V);
    expect(maxAbsDiff(whole.logits.data, joined).maxAbs).toBeLessThan(TOL);
    // a layer that shares keys and values holds its source layer's, not a copy
    const shared = m.text.num_kv_shared_layers;
    if (shared)
      expect(head.present!.keys[m.text.num_hidden_layers - 1]).toBe(
        head.present!.keys[m.text.layer_types.slice(0, m.text.num_hidden_layers - shared).lastIndexOf(F)],
      );
  });

  it.each(['node', 'wasm', 'webgpu'] as const)(
    'greedy continuation through the KV cache equals the reference (%s)',
    async (backend) => {
      const n = 8;
      const want = gemma4Greedy(m, tokens, n);
      const got = await generateTokens(models[backend]!, tokens, { maxNewTokens: n, temperature: 0, stopAtEos: false });
      expect(got.ids).toEqual(want);
    },
  );

  it('an intervention on a shared layer source reaches the layers that read it, as in the reference', async () => {
    const l = m.text.layer_types.indexOf(F);
    const hook = `blocks.${l}.attn.hook_v`;
    const ref = gemma4Forward(m, tokens, { hook: (name, v) => (name === hook ? v.map((x) => 2 * x) : undefined) });
    const out = await models.node!.run(tokens, { interventions: [{ hook, op: 'scale', alpha: 2 }] });
    expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs).toBeLessThan(TOL);
  });

  it.runIf(all)(
    'gradients through the graph equal float64 finite differences (hook_embed: per-layer inputs too; a wide hook_z)',
    async () => {
      const model = models.node!;
      const V = m.text.vocab_size;
      const answer = 5;
      const wide = `blocks.${m.text.layer_types.indexOf(F)}.attn.hook_z`;
      const hooks = ['hook_embed', wide];
      const seed = { dims: [1, 1, V], data: Float32Array.from({ length: V }, (_, v) => (v === answer ? 1 : 0)) };
      const out = await model.run(tokens, { hooks, logitPositions: [T - 1], grad: { hooks, seed } });
      const logitOf = (hook: string, i: number, eps: number) => {
        const r = gemma4Forward(m, tokens, {
          hook: (name, v) => (name === hook ? v.map((x, j) => (j === i ? x + eps : x)) : undefined),
        });
        return r.logits.data[(T - 1) * V + answer];
      };
      let worst = 0;
      for (const hook of hooks) {
        const g = out.grads![hook];
        const n = g.data.length;
        for (const i of [1, Math.floor(n / 3), Math.floor(n / 2) + 7, n - 2]) {
          const h = 1e-4;
          const fd = (logitOf(hook, i, h) - logitOf(hook, i, -h)) / (2 * h);
          worst = Math.max(worst, Math.abs(fd - g.data[i]));
          expect(Math.abs(fd - g.data[i]), `${hook}[${i}]`).toBeLessThan(1e-3 * Math.max(1, Math.abs(fd)));
        }
      }
      console.log(`gemma4 grad vs finite differences: worst |Δ| ${worst.toExponential(2)}`);
    },
  );

  it.runIf(all)("TransformerLens's parameters take each layer's own shapes; a KV-sharing layer has no W_K, W_V", () => {
    const model = models.node!;
    const { hidden_size: D, num_attention_heads: H, global_head_dim: G, intermediate_size: M } = m.text;
    const types: string[] = m.text.layer_types;
    const L = types.length;
    const full = types.indexOf(F); // a full layer computing its own k (= v: attention_k_eq_v)
    const shared = L - 1; // the last layer reads an earlier full layer's keys and values
    const hkv = m.text.num_global_key_value_heads;
    const stored = (name: string) => m.tensors[`${m.prefix}layers.${name}.weight`].data;
    // W_Q [H, D, G]: element (h, d, k) is q_proj[h·G + k, d]
    const wq = model.param(`blocks.${full}.attn.W_Q`);
    expect(wq.dims).toEqual([H, D, G]);
    const q = stored(`${full}.self_attn.q_proj`);
    expect(wq.data[(1 * D + 3) * G + 5]).toBe(q[(1 * G + 5) * D + 3]);
    const wk = model.param(`blocks.${full}.attn.W_K`);
    expect(wk.dims).toEqual([hkv, D, G]);
    expect(Array.from(model.param(`blocks.${full}.attn.W_V`).data)).toEqual(Array.from(wk.data));
    expect(model.param(`blocks.${full}.attn.W_O`).dims).toEqual([H, G, D]);
    expect(model.param(`blocks.${shared}.attn.W_Q`).dims).toEqual([H, D, G]);
    expect(model.param(`blocks.${shared}.mlp.W_in`).dims).toEqual([D, 2 * M]);
    expect(model.hasParam(`blocks.${shared}.attn.W_K`)).toBe(false);
    expect(() => model.param(`blocks.${shared}.attn.W_V`)).toThrow(/attends with layer/);
  });

  it.each(['node', 'wasm', 'webgpu', 'stream'] as const)(
    'trace: every head, neuron, per-layer-input and embedding term equals the float64 decomposition (%s)',
    async (backend) => {
      const model = models[backend]!;
      const ref = gemma4Forward(m, tokens);
      const refDla = gemma4Dla(m, ref.hooks, T - 1, 5);
      // the reference's terms sum to its own logit (read from its last hook_resid_post)
      const refSum = [...refDla.terms.values()].reduce((a, v) => a + v, 0);
      expect(Math.abs(refSum - refDla.logit)).toBeLessThan(1e-9 * Math.max(1, Math.abs(refDla.logit)));
      const run = await model.run(tokens, { hooks: dlaHookNames(model) });
      const dla = await decomposeLogit(model, run, { tokenId: 5 }, { convention: 'raw' });
      const got = new Map(dla.terms.map((t) => [t.name, t.value]));
      const rel = (a: number, b: number) => Math.abs(a - b) / Math.max(1, Math.abs(b));
      let worst = 0;
      for (const [name, want] of refDla.terms) {
        expect(got.has(name), name).toBe(true);
        worst = Math.max(worst, rel(got.get(name)!, want));
      }
      // every term the engine reports is one of the reference's, or a zero bias term
      for (const [name, v] of got) if (!refDla.terms.has(name)) expect(Math.abs(v), name).toBeLessThan(1e-6);
      let worstNeuron = 0;
      refDla.neurons.forEach((row, l) => {
        expect(dla.neuronAttribution[l].length).toBe(row.length);
        row.forEach((want, n) => (worstNeuron = Math.max(worstNeuron, rel(dla.neuronAttribution[l][n], want))));
      });
      expect(worst).toBeLessThan(TOL);
      expect(worstNeuron).toBeLessThan(TOL);
      // the terms sum to the (pre-soft-cap) logit, theirs and the reference's
      expect(rel(dla.sum, dla.target)).toBeLessThan(TOL);
      expect(rel(dla.target, refDla.logit)).toBeLessThan(TOL);
      expect(dla.checks.residual_reconstruction_max_abs).toBeLessThan(TOL);
      expect(dla.checks.attention_reconstruction_max_abs).toBeLessThan(TOL);
      // the operation runs end to end, in TransformerLens's convention too
      const prompt = model.decode(tokens.slice(1));
      const doc: any = await trace.run(model, { prompt, convention: 'transformer_lens', top_k: 5 } as any, {});
      expect(doc.top_neurons.length).toBe(5);
      expect(Math.abs(doc.checks.sum_minus_target)).toBeLessThan(TOL * Math.max(1, Math.abs(doc.decomposition.target)));
      console.log(
        `gemma4 trace ${backend} (readout ${model.info.readout}) T=${T}: ${refDla.terms.size} terms, worst rel |Δ| ${worst.toExponential(2)}, ` +
          `${refDla.neurons.flat().length} neurons ${worstNeuron.toExponential(2)}, ` +
          `sum − logit ${(dla.sum - dla.target).toExponential(2)}`,
      );
    },
  );

  it('circuit: each candidate head and neuron, zero-ablated, moves the logit as in the reference', async () => {
    const model = models.node!;
    const prompt = model.decode(tokens.slice(1));
    const input = { prompt, top_k_heads: 4, top_k_neurons: 4, pair_k: 0, ablation: 'zero' } as any;
    const doc: any = await circuit.run(model, input, {});
    const V = m.text.vocab_size;
    const answer = doc.answer.token_id;
    const ids: number[] = doc.tokens.map((t: { id: number }) => t.id); // the prompt as the tokenizer reads it
    const n = ids.length;
    const logitOf = (hook: string, zero: (i: number, dims: number[]) => boolean) =>
      gemma4Forward(m, ids, {
        hook: (name, v, dims) => (name === hook ? v.map((x, i) => (zero(i, dims) ? 0 : x)) : undefined),
      }).logits.data[(n - 1) * V + answer];
    let worst = 0;
    for (const h of doc.heads) {
      // hook_z [1, T, H, d]: head h's slice at every position
      const want = logitOf(`blocks.${h.layer}.attn.hook_z`, (i, d) => Math.floor(i / d[3]) % d[2] === h.head);
      worst = Math.max(worst, Math.abs(h.ablated_logit - want));
    }
    for (const u of doc.neurons) {
      const want = logitOf(`blocks.${u.layer}.mlp.hook_post`, (i, d) => i % d[2] === u.neuron);
      worst = Math.max(worst, Math.abs(u.ablated_logit - want));
    }
    expect(doc.heads.length + doc.neurons.length).toBe(8);
    expect(worst).toBeLessThan(TOL);
    console.log(`gemma4 circuit T=${n}: 4 heads + 4 neurons ablated, worst |Δ logit| ${worst.toExponential(2)}`);
  });

  it.runIf(all)('leaving out each feature moves the logits by more than the tolerance', () => {
    const base = gemma4Forward(m, tokens).logits.data;
    const moved: Record<string, number> = {};
    for (const f of GEMMA4_FEATURES) {
      moved[f] = maxAbsDiff(gemma4Forward(m, tokens, { drop: [f] }).logits.data, base).maxAbs;
      expect(moved[f], f).toBeGreaterThan(100 * TOL);
    }
    console.log(`gemma4 sensitivity (max |Δ logit|): ${JSON.stringify(moved)}`);
  });
});

describe('gemma4 configs Loupe cannot run are refused from config.json alone', () => {
  const m = makeGemma4Model({ kvShared: 2, layerTypes: [S, S, F, S, S, F] });
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
    [{ enable_moe_block: true }, 'BAD_CONFIG', 'num_experts'],
    [{ use_bidirectional_attention: 'all' }, 'UNSUPPORTED_CONFIG', 'use_bidirectional_attention'],
    [{ num_kv_shared_layers: 6 }, 'BAD_CONFIG', 'num_kv_shared_layers'],
    [{ num_kv_shared_layers: 1, layer_types: [S, S, S, S, S, F] }, 'BAD_CONFIG', 'num_kv_shared_layers'],
    [{ num_key_value_heads: 3 }, 'BAD_CONFIG', 'num_key_value_heads'],
    [{ attention_k_eq_v: true, num_global_key_value_heads: null }, 'BAD_CONFIG', 'num_global_key_value_heads'],
    [{ layer_types: [S, S, 'chunked_attention', S, S, F] }, 'UNSUPPORTED_CONFIG', 'layer_types[2]'],
    [{ layer_types: [S, F] }, 'BAD_CONFIG', 'layer_types'],
    [{ vocab_size_per_layer_input: 10 }, 'UNSUPPORTED_CONFIG', 'vocab_size_per_layer_input'],
    [
      {
        rope_parameters: {
          sliding_attention: { rope_type: 'yarn', rope_theta: 1e4 },
          full_attention: { rope_type: 'proportional', rope_theta: 1e6 },
        },
      },
      'UNSUPPORTED_CONFIG',
      'rope_parameters.sliding_attention.rope_type',
    ],
    [
      { rope_parameters: { sliding_attention: { rope_theta: 1e4 }, full_attention: { rope_theta: 1e6 } } },
      'UNSUPPORTED_CONFIG',
      'rope_parameters.full_attention.rope_type',
    ],
    [{ hidden_activation: 'swiglu' }, 'UNSUPPORTED_CONFIG', 'swiglu'],
  ])('%j → %s naming %s', (patch, code, field) => {
    const e = refused(patch);
    expect(e.code).toBe(code);
    expect(JSON.stringify(e.details ?? {}) + e.message).toContain(field);
  });

  it('a multimodal config without text_config is BAD_CONFIG', () => {
    const e = refused({ model_type: 'gemma4' });
    expect(e.code).toBe('BAD_CONFIG');
  });
});
