/**
 * Gemma 4's mixture-of-experts block (enable_moe_block, the 26B-A4B layout: experts beside the dense
 * MLP, a normed and scaled router, per_expert_scale) against the float64 reference of
 * tests/reference/gemma4-64.ts: every hook and the logits within 1e-4 on onnxruntime-node, WASM and
 * onnxruntime-node's WebGPU provider (SwiftShader here); greedy continuations through the KV cache
 * equal the reference's full re-runs; an expert ablated, its routing forbidden and forced equal the
 * reference doing the same (as interventions and through ablate); trace's terms (dense MLP, its
 * neurons, every expert) equal a float64 decomposition; activations' expert load and router entropy,
 * patch's expert_out cells and attribution_patching's expert estimates equal the reference (the last
 * against float64 central differences, as are gradients through the router); q8 equals the reference on q8's weights; edge patching is refused as for dense Gemma 4; each part of the block the reference can leave out moves the logits past
 * the tolerance; bad MoE configs and expert tensors are structured errors before any weight byte.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import { checkConfig } from '../src/engine/arch';
import { LoupeError } from '../src/engine/errors';
import { generateTokens } from '../src/ops/lib/generation';
import type { LoadedModel } from '../src/engine/api';
import { operation as trace } from '../src/ops/trace';
import { operation as ablate } from '../src/ops/ablate';
import { operation as activations } from '../src/ops/activations';
import { operation as atp } from '../src/ops/attribution_patching';
import { operation as patch } from '../src/ops/patch';
import { operation as edgeAttribution } from '../src/ops/edge_attribution';
import { schemaErrors, viaJson } from './schema-helpers';
import { decomposeLogit, dlaHookNames } from '../src/ops/lib/dla';
import { compareHooks, maxAbsDiff } from './reference';
import { q8Reference } from './helpers/q8-reference';
import {
  makeGemma4Model,
  gemma4Forward,
  gemma4Greedy,
  gemma4Dla,
  GEMMA4_MOE_FEATURES,
  type Gemma4Model,
  type Gemma4Options,
} from './reference/gemma4-64';

const TOL = 1e-4;
const S = 'sliding_attention' as const;
const F = 'full_attention' as const;

/** prompt tokens: BOS then ids that are no special token */
function promptOf(m: Gemma4Model, T: number, seed = 5): number[] {
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

const CASES: { name: string; options: Gemma4Options; T: number }[] = [
  {
    name: 'causal-lm: 6 experts, top 2, per-layer inputs',
    options: { layerTypes: [S, F, S, F], nLayers: 4, moe: { experts: 6, topK: 2, width: 12 }, seed: 11 },
    T: 14,
  },
  {
    name: 'multimodal bf16: 8 experts, top 3, k_eq_v, KV sharing, no per-layer inputs',
    options: {
      multimodal: true,
      dtype: 'BF16',
      nLayers: 4,
      layerTypes: [S, F, S, F],
      kEqV: true,
      kvShared: 1,
      perLayer: 0,
      moe: { experts: 8, topK: 3, width: 8 },
      seed: 12,
    },
    T: 10,
  },
];

describe.each(CASES)('gemma4 MoE vs float64 reference: $name', ({ options, T }) => {
  let m: Gemma4Model;
  const models: Partial<Record<'node' | 'wasm' | 'webgpu', LoadedModel>> = {};
  let tokens: number[];
  beforeAll(async () => {
    m = makeGemma4Model(options);
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
    expect(model.info.num_experts).toBe(options.moe!.experts);
    expect(model.info.experts_per_token).toBe(options.moe!.topK);
    const ref = gemma4Forward(m, tokens);
    const out = await model.run(tokens, { hooks: 'all' });
    const names = model.hookNames();
    expect(names.filter((n) => !(n in ref.hooks))).toEqual([]);
    expect(Object.keys(ref.hooks).filter((n) => !names.includes(n))).toEqual([]);
    expect(names).toContain('blocks.0.mlp.hook_post'); // the dense MLP beside the experts
    expect(names).toContain(`blocks.1.mlp.experts.${options.moe!.experts - 1}.hook_out`);
    const cmp = compareHooks(ref.hooks, out.hooks, names, TOL);
    const bad = cmp.filter((r) => !r.ok);
    expect(bad, JSON.stringify(bad.slice(0, 5))).toEqual([]);
    const logits = maxAbsDiff(ref.logits.data, out.logits.data).maxAbs;
    expect(logits).toBeLessThan(TOL);
    // the indices are the reference's top k exactly, and routing is not degenerate (several experts used)
    const idx = out.hooks['blocks.0.mlp.hook_expert_indices'].data;
    expect(Array.from(idx)).toEqual(Array.from(ref.hooks['blocks.0.mlp.hook_expert_indices'].data));
    expect(new Set(idx).size).toBeGreaterThan(options.moe!.topK);
    const worst = Math.max(...cmp.map((r) => r.maxAbs));
    console.log(
      `gemma4 MoE ${backend} T=${T}: ${cmp.length} hooks, worst |Δ| ${worst.toExponential(2)}, logits |Δ| ${logits.toExponential(2)}`,
    );
  });

  it.each(['node', 'wasm', 'webgpu'] as const)(
    'greedy continuation through the KV cache equals the reference (%s)',
    async (backend) => {
      const n = 6;
      const want = gemma4Greedy(m, tokens, n);
      const got = await generateTokens(models[backend]!, tokens, { maxNewTokens: n, temperature: 0, stopAtEos: false });
      expect(got.ids).toEqual(want);
    },
  );

  it('an expert ablated, its routing forbidden and forced (interventions as data) equal the reference doing the same', async () => {
    const model = models.node!;
    const E = options.moe!.experts;
    const b = `blocks.${m.text.num_hidden_layers - 1}.mlp`;
    const ref0 = gemma4Forward(m, tokens);
    const w = ref0.hooks[`${b}.hook_router_weights`].data;
    const load = Array.from({ length: E }, (_, e) => tokens.reduce((a, _t, t) => a + (w[t * E + e] !== 0 ? 1 : 0), 0));
    const e = load.indexOf(Math.max(...load));
    const f = (e + 1) % E;
    type Edit = (name: string, v: Float64Array) => Float64Array | void;
    const cases: [string, any[], Edit][] = [
      [
        'ablate',
        [{ hook: `${b}.experts.${e}.hook_out`, op: 'zero' }],
        (name, v) => (name === `${b}.experts.${e}.hook_out` ? v.fill(0) : undefined),
      ],
      [
        'forbid',
        [{ hook: `${b}.hook_router_logits`, op: 'add', neuron: e, value: [-1e9] }],
        (name, v) => (name === `${b}.hook_router_logits` ? v.map((x, i) => (i % E === e ? x - 1e9 : x)) : undefined),
      ],
      [
        'force',
        [{ hook: `${b}.hook_router_logits`, op: 'add', neuron: f, value: [30] }],
        (name, v) => (name === `${b}.hook_router_logits` ? v.map((x, i) => (i % E === f ? x + 30 : x)) : undefined),
      ],
    ];
    const scale = m.tensors[`${m.prefix}layers.${m.text.num_hidden_layers - 1}.router.per_expert_scale`].data;
    for (const [label, interventions, hook] of cases) {
      const ref = gemma4Forward(m, tokens, { hook });
      const out = await model.run(tokens, { interventions, hooks: [`${b}.hook_router_weights`] });
      expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs, label).toBeLessThan(TOL);
      expect(maxAbsDiff(ref0.logits.data, out.logits.data).maxAbs, label).toBeGreaterThan(10 * TOL);
      const rw = out.hooks[`${b}.hook_router_weights`].data;
      for (let t = 0; t < tokens.length; t++) {
        if (label === 'forbid') expect(rw[t * E + e]).toBe(0);
        // forced: its renormalised weight is ~1, times its per_expert_scale
        if (label === 'force') expect(Math.abs(rw[t * E + f] - scale[f])).toBeLessThan(1e-3);
      }
    }
  });

  // (renormalising the chosen weights is a factor per token that post_feedforward_layernorm_2 divides
  // out, bar its eps: the logits cannot show it, hook_router_weights does, in the hook comparison)
  it.each(['node', 'wasm', 'webgpu'] as const)(
    'trace: every head, dense neuron and expert term equals the float64 decomposition (%s)',
    async (backend) => {
      const model = models[backend]!;
      const ref = gemma4Forward(m, tokens);
      const refDla = gemma4Dla(m, ref.hooks, T - 1, 5);
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
      for (const [name, v] of got) if (!refDla.terms.has(name)) expect(Math.abs(v), name).toBeLessThan(1e-6);
      expect([...refDla.terms.keys()].filter((k) => /^L\d+\.E\d+$/.test(k)).length).toBe(
        m.text.num_hidden_layers * options.moe!.experts,
      );
      let worstNeuron = 0;
      refDla.neurons.forEach((row, l) =>
        row.forEach((want, n) => (worstNeuron = Math.max(worstNeuron, rel(dla.neuronAttribution[l][n], want)))),
      );
      expect(worst).toBeLessThan(TOL);
      expect(worstNeuron).toBeLessThan(TOL);
      expect(rel(dla.sum, dla.target)).toBeLessThan(TOL);
      expect(rel(dla.target, refDla.logit)).toBeLessThan(TOL);
      expect(dla.checks.residual_reconstruction_max_abs).toBeLessThan(TOL);
      // the operation end to end: experts and the dense MLP's neurons both listed
      const doc: any = await trace.run(model, { prompt: model.decode(tokens.slice(1)), top_k: 5 } as any, {});
      expect(doc.top_neurons.length).toBe(5);
      expect(doc.top_experts.length).toBe(5);
      expect(Math.abs(doc.checks.sum_minus_target)).toBeLessThan(TOL * Math.max(1, Math.abs(doc.decomposition.target)));
      console.log(
        `gemma4 MoE trace ${backend} T=${T}: ${refDla.terms.size} terms, worst rel |Δ| ${worst.toExponential(2)}, ` +
          `neurons ${worstNeuron.toExponential(2)}, sum − logit ${(dla.sum - dla.target).toExponential(2)}`,
      );
    },
  );

  it('ablate an expert (its output; its routing forbidden or forced): the logit deltas equal the reference doing the same', async () => {
    const model = models.node!;
    const prompt = model.decode(tokens.slice(1, 9));
    const l = m.text.num_hidden_layers - 1;
    const E = options.moe!.experts;
    const b = `blocks.${l}.mlp`;
    const doc0: any = await ablate.run(model, { prompt, layer: l, expert: 0 } as any, {});
    expect(schemaErrors('ablate', viaJson(doc0))).toEqual([]);
    const ids = doc0.tokens.map((t: { id: number }) => t.id);
    const V = m.text.vocab_size;
    const ans = doc0.answer.token_id;
    const last = (r: { logits: { data: ArrayLike<number> } }) => r.logits.data[(ids.length - 1) * V + ans];
    const clean = last(gemma4Forward(m, ids));
    type Edit = (name: string, v: Float64Array) => Float64Array | void;
    const cases: [Record<string, unknown>, Edit][] = [
      [{ expert: 1 }, (name, v) => (name === `${b}.experts.1.hook_out` ? v.fill(0) : undefined)],
      [
        { expert: 1, route: 'forbid' },
        (name, v) => (name === `${b}.hook_router_logits` ? v.map((x, i) => (i % E === 1 ? x - 1e9 : x)) : undefined),
      ],
      [
        { expert: 2, route: 'force' },
        (name, v) => (name === `${b}.hook_router_logits` ? v.map((x, i) => (i % E === 2 ? x + 1e4 : x)) : undefined),
      ],
    ];
    for (const [target, hook] of cases) {
      const doc: any = await ablate.run(model, { prompt, layer: l, ...target } as any, {});
      expect(schemaErrors('ablate', viaJson(doc))).toEqual([]);
      const want = last(gemma4Forward(m, ids, { hook })) - clean;
      expect(Math.abs(doc.entries[0].logit_delta - want), JSON.stringify(target)).toBeLessThan(TOL);
    }
  });

  it("activations: each expert's load and the router's entropy equal the float64 reference's", async () => {
    const model = models.node!;
    const doc: any = await activations.run(
      model,
      { prompt: model.decode(tokens.slice(1, 9)), sites: ['resid_post'] } as any,
      {},
    );
    expect(schemaErrors('activations', viaJson(doc))).toEqual([]);
    const ids = doc.tokens.map((t: { id: number }) => t.id);
    const ref = gemma4Forward(m, ids);
    const [E, k, n] = [options.moe!.experts, options.moe!.topK, ids.length];
    expect(doc.experts.length).toBe(m.text.num_hidden_layers);
    for (const x of doc.experts) {
      const idx = ref.hooks[`blocks.${x.layer}.mlp.hook_expert_indices`].data;
      const load = new Array(E).fill(0);
      for (let i = 0; i < n * k; i++) load[idx[i]] += 1 / n;
      for (let e = 0; e < E; e++) expect(x.load[e]).toBeCloseTo(load[e], 12);
      const lg = ref.hooks[`blocks.${x.layer}.mlp.hook_router_logits`].data;
      for (let p = 0; p < n; p++) {
        const row = Array.from(lg.subarray(p * E, (p + 1) * E));
        const mx = Math.max(...row);
        const z = row.reduce((a, v) => a + Math.exp(v - mx), 0);
        const h = -row.reduce((a, v) => a + (Math.exp(v - mx) / z) * (v - mx - Math.log(z)), 0);
        expect(Math.abs(x.entropy_per_position[p] - h)).toBeLessThan(1e-4);
      }
    }
  });

  it("patch (expert_out) and attribution_patching: each expert's cell equals the reference, its estimate float64 central differences", async () => {
    const model = models.node!;
    // the prompt after BOS reversed: a corrupted run whose prediction differs in both cases
    const corrupted = [tokens[0], ...tokens.slice(1).reverse()];
    const V = m.text.vocab_size;
    const E = options.moe!.experts;
    const L = m.text.num_hidden_layers;
    const pdoc: any = await patch.run(
      model,
      { token_ids: tokens, corrupted_token_ids: corrupted, scans: ['expert_out'] } as any,
      {},
    );
    expect(schemaErrors('patch', viaJson(pdoc))).toEqual([]);
    const [a, cf] = [pdoc.answer.token_id, pdoc.counterfactual.token_id];
    const ld = (r: { logits: { data: ArrayLike<number> } }) =>
      r.logits.data[(T - 1) * V + a] - r.logits.data[(T - 1) * V + cf];
    const clean = gemma4Forward(m, tokens);
    const corr = gemma4Forward(m, corrupted);
    const [ldClean, ldCorr] = [ld(clean), ld(corr)];
    let worstPatch = 0;
    for (let l = 0; l < L; l++)
      for (let e = 0; e < E; e++) {
        const hook = `blocks.${l}.mlp.experts.${e}.hook_out`;
        const r = gemma4Forward(m, corrupted, {
          hook: (name) => (name === hook ? Float64Array.from(clean.hooks[hook].data) : undefined),
        });
        const want = (ld(r) - ldCorr) / (ldClean - ldCorr);
        worstPatch = Math.max(worstPatch, Math.abs(pdoc.expert_out[l][e] - want));
        expect(Math.abs(pdoc.expert_out[l][e] - want), hook).toBeLessThan(1e-3 * Math.max(1, Math.abs(want)));
      }
    const adoc: any = await atp.run(
      model,
      { token_ids: tokens, corrupted_token_ids: corrupted, validate: 0 } as any,
      {},
    );
    expect(schemaErrors('attribution_patching', viaJson(adoc))).toEqual([]);
    expect(adoc.experts.length).toBe(L * E);
    const [a2, cf2] = [adoc.answer.token_id, adoc.counterfactual.token_id];
    const metric = (hook: string, eps: number) => {
      const c = clean.hooks[hook].data,
        k = corr.hooks[hook].data;
      const r = gemma4Forward(m, corrupted, {
        hook: (name, v) => (name === hook ? v.map((x, i) => x + eps * (c[i] - k[i])) : undefined),
      });
      return r.logits.data[(T - 1) * V + a2] - r.logits.data[(T - 1) * V + cf2];
    };
    let checked = 0;
    let worstAtp = 0;
    for (const x of adoc.experts) {
      if (x.estimate === 0) continue;
      const hook = `blocks.${x.layer}.mlp.experts.${x.expert}.hook_out`;
      const fd = (metric(hook, 1e-3) - metric(hook, -1e-3)) / 2e-3;
      worstAtp = Math.max(worstAtp, Math.abs(x.estimate - fd));
      expect(Math.abs(x.estimate - fd), hook).toBeLessThan(1e-3 * Math.max(1, Math.abs(fd)));
      checked++;
    }
    expect(checked).toBeGreaterThan(options.moe!.topK);
    console.log(
      `gemma4 MoE patch expert_out worst |Δ| ${worstPatch.toExponential(2)}; attribution_patching ${checked} experts vs ` +
        `central differences worst |Δ| ${worstAtp.toExponential(2)}`,
    );
  });

  it('edge patching stays refused (post-norm blocks, as for the dense Gemma 4): a structured error', async () => {
    const corrupted = [tokens[0], ...tokens.slice(1).reverse()];
    const run = edgeAttribution.run(models.node!, { token_ids: tokens, corrupted_token_ids: corrupted } as any, {});
    await expect(run).rejects.toMatchObject({
      code: 'UNSUPPORTED_ARCHITECTURE',
      message: expect.stringContaining('post-norm'),
    });
  });

  it('q8 and q4 weights quantise the experts and the dense MLP (not the router): q8 equals the reference on the q8 weights', async () => {
    for (const weights of ['q8', 'q4'] as const) {
      const q = await loadModelNode(m.dir, { weights });
      try {
        expect(q.info.weights).toBe(weights);
        expect(q.info.weight_bytes).toBeLessThan(models.node!.info.weight_bytes / 2);
        if (weights !== 'q8') continue;
        // the q8 scheme from its definition on every matrix (a stacked [E, R, in] expert tensor row by row, as
        // its per-expert matrices) but the routers
        const flat = Object.fromEntries(
          Object.entries(m.tensors).map(([n, t]) => [
            n,
            { dims: t.dims.length === 3 ? [t.dims[0] * t.dims[1], t.dims[2]] : t.dims, data: t.data },
          ]),
        );
        const qt = q8Reference({ config: m.config, tensors: flat } as any).tensors;
        const tensors = Object.fromEntries(
          Object.entries(m.tensors).map(([n, t]) => [
            n,
            { dims: t.dims, data: n.endsWith('router.proj.weight') ? t.data : Float32Array.from(qt[n].data) },
          ]),
        );
        const ref = gemma4Forward({ ...m, tensors }, tokens);
        const out = await q.run(tokens);
        expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs).toBeLessThan(TOL);
        expect(maxAbsDiff(gemma4Forward(m, tokens).logits.data, out.logits.data).maxAbs).toBeGreaterThan(10 * TOL);
      } finally {
        await q.dispose();
      }
    }
  });

  it('gradients through the routed block equal float64 central differences (the router logits, the stream it reads)', async () => {
    const model = models.node!;
    const V = m.text.vocab_size;
    const answer = 5;
    const L = m.text.num_hidden_layers;
    const hooks = [
      `blocks.${L - 1}.mlp.hook_router_logits`,
      'blocks.1.hook_resid_mid',
      'blocks.0.mlp.experts.1.hook_out',
    ];
    const seed = { dims: [1, 1, V], data: Float32Array.from({ length: V }, (_, v) => (v === answer ? 1 : 0)) };
    const out = await model.run(tokens, { hooks, logitPositions: [T - 1], grad: { hooks, seed } });
    const logitOf = (hook: string, i: number, eps: number) =>
      gemma4Forward(m, tokens, {
        hook: (name, v) => (name === hook ? v.map((x, j) => (j === i ? x + eps : x)) : undefined),
      }).logits.data[(T - 1) * V + answer];
    // the router logits reach the last position's logit through its chosen experts only (renormalised
    // top-k weights do not move with the others' logits): those, and one not chosen (gradient 0)
    const E = options.moe!.experts;
    const chosen = gemma4Forward(m, tokens).hooks[`blocks.${L - 1}.mlp.hook_expert_indices`].data;
    const last = Array.from(chosen.subarray((T - 1) * options.moe!.topK, T * options.moe!.topK));
    const other = Array.from({ length: E }, (_, e) => e).find((e) => !last.includes(e))!;
    let worst = 0;
    for (const hook of hooks) {
      const g = out.grads![hook];
      const n = g.data.length;
      let nonzero = 0;
      const at =
        hook === hooks[0] ? [...last, other].map((e) => (T - 1) * E + e) : [1, Math.floor(n / 3), n - 2, n - 5];
      for (const i of at) {
        const fd = (logitOf(hook, i, 1e-4) - logitOf(hook, i, -1e-4)) / 2e-4;
        worst = Math.max(worst, Math.abs(fd - g.data[i]));
        if (Math.abs(fd) > 1e-6) nonzero++;
        expect(Math.abs(fd - g.data[i]), `${hook}[${i}]`).toBeLessThan(1e-3 * Math.max(1, Math.abs(fd)));
      }
      expect(nonzero, hook).toBeGreaterThan(0);
    }
    console.log(`gemma4 MoE grad vs central differences: worst |Δ| ${worst.toExponential(2)}`);
  });

  it("parameters: the dense MLP keeps TransformerLens's names, the router is mlp.W_router, each expert's rows of the stacked tensors", () => {
    const model = models.node!;
    const { hidden_size: D, intermediate_size: M } = m.text;
    const { experts: E, width: Me } = options.moe!;
    const l = 1;
    const p = `${m.prefix}layers.${l}`;
    const stored = (name: string) => m.tensors[`${p}.${name}`].data;
    expect(model.param(`blocks.${l}.mlp.W_gate`).dims).toEqual([D, M]);
    const router = model.param(`blocks.${l}.mlp.W_router`);
    expect(router.dims).toEqual([D, E]);
    expect(router.data[3 * E + 2]).toBe(stored('router.proj.weight')[2 * D + 3]);
    // expert e's W_gate [D, Me]: (d, j) is gate_up_proj[e, j, d]; W_in: gate_up_proj[e, Me + j, d]; W_out [Me, D]: down_proj[e, d, j]
    const e = E - 1;
    const [gu, dp] = [stored('experts.gate_up_proj'), stored('experts.down_proj')];
    const [wg, wi, wo] = ['W_gate', 'W_in', 'W_out'].map((w) => model.param(`blocks.${l}.mlp.experts.${e}.${w}`));
    expect([wg.dims, wi.dims, wo.dims]).toEqual([
      [D, Me],
      [D, Me],
      [Me, D],
    ]);
    expect(wg.data[5 * Me + 1]).toBe(gu[(e * 2 * Me + 1) * D + 5]);
    expect(wi.data[5 * Me + 1]).toBe(gu[(e * 2 * Me + Me + 1) * D + 5]);
    expect(wo.data[1 * D + 5]).toBe(dp[(e * D + 5) * Me + 1]);
    expect(Array.from(model.param(`blocks.${l}.mlp.per_expert_scale`).data)).toEqual(
      Array.from(stored('router.per_expert_scale')),
    );
    for (const n of ['ln2_experts.w', 'ln2_post_dense.w', 'ln2_post_experts.w', 'mlp.router_scale'])
      expect(model.hasParam(`blocks.${l}.${n}`), n).toBe(true);
  });

  it('leaving out each part of the MoE block moves the logits by more than the tolerance', () => {
    const base = gemma4Forward(m, tokens).logits.data;
    const moved: Record<string, number> = {};
    for (const f of GEMMA4_MOE_FEATURES) {
      moved[f] = maxAbsDiff(gemma4Forward(m, tokens, { drop: [f] }).logits.data, base).maxAbs;
      expect(moved[f], f).toBeGreaterThan(100 * TOL);
    }
    console.log(`gemma4 MoE sensitivity (max |Δ logit|): ${JSON.stringify(moved)}`);
  });
});

describe('gemma4 MoE configs and tensors Loupe cannot run are refused before any weight byte', () => {
  const m = makeGemma4Model({ nLayers: 2, layerTypes: [S, F], moe: { experts: 4, topK: 2, width: 8 } });
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
    [{ top_k_experts: 5 }, 'BAD_CONFIG', 'top_k_experts'],
    [{ num_experts: null }, 'BAD_CONFIG', 'num_experts'],
    [{ moe_intermediate_size: 0 }, 'BAD_CONFIG', 'moe_intermediate_size'],
    [{ num_experts: 100_000 }, 'BAD_CONFIG', 'num_experts'],
  ])('%j → %s naming %s', (patch, code, field) => {
    const e = refused(patch);
    expect(e.code).toBe(code);
    expect(JSON.stringify(e.details ?? {}) + e.message).toContain(field);
  });
});
