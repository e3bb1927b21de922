/**
 * Mixture-of-experts families (mixtral, qwen3_moe, qwen2_moe, olmoe) on random checkpoints in HF's
 * per-expert layout, against the float64 reference (tests/reference/forward64.ts moeForward,
 * written from HF's *SparseMoeBlock and *TopKRouter): every hook (router logits, routing weights,
 * each expert's weighted output, the shared expert) and the logits within 1e-4 on onnxruntime-node,
 * WASM and onnxruntime-node's WebGPU provider (SwiftShader here); greedy continuations through the KV cache equal the reference's full re-runs; an
 * expert ablated, routing forced and forbidden as interventions equal the reference doing the same;
 * leaving out renormalisation and the shared expert's gate moves the logits past the tolerance; and
 * config.json beyond the caps, a router of the wrong shape or a missing expert are structured
 * errors before any weight byte.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadModelNode } from '../src/node/load';
import { checkConfig, describeModel } from '../src/engine/arch';
import { LoupeError } from '../src/engine/errors';
import { loadModelFilesNode } from '../src/node/load-files-node';
import type { LoadedModel } from '../src/engine/api';
import { generateTokens } from '../src/ops/lib/generation';
import { operation as trace } from '../src/ops/trace';
import { operation as activations } from '../src/ops/activations';
import { operation as ablate } from '../src/ops/ablate';
import { operation as atp } from '../src/ops/attribution_patching';
import { operation as patch } from '../src/ops/patch';
import { execFile } from 'node:child_process';
import { resolve } from 'node:path';
import { schemaErrors, viaJson } from './schema-helpers';
import { q8Reference } from './helpers/q8-reference';
import {
  MOE_FAMILY_CASES,
  makeCaseModel,
  caseTokens,
  referenceForward,
  compareHooks,
  maxAbsDiff,
  greedyGenerate64,
  loadModelDir,
  type RandomModel,
  type RefFeature,
} from './reference';

const TOL = 1e-4;

describe.each(MOE_FAMILY_CASES)('MoE engine vs float64 reference: $name', (c) => {
  let rm: RandomModel;
  let model: LoadedModel;
  let tokens: number[];
  beforeAll(async () => {
    rm = makeCaseModel(c);
    model = await loadModelNode(rm.dir);
    tokens = caseTokens(rm, c.seqLen);
  });
  afterAll(async () => {
    await model?.dispose();
    rm?.cleanup();
  });

  it('every hook and the logits agree within 1e-4 on node and WASM; routing is not degenerate', async () => {
    const ref = referenceForward(rm, tokens);
    const names = model.hookNames({ withResult: true });
    for (const n of names) expect(Object.keys(ref.hooks), n).toContain(n);
    expect(names).toContain('blocks.0.mlp.hook_router_logits');
    expect(names).toContain(`blocks.1.mlp.experts.${model.info.num_experts! - 1}.hook_out`);
    for (const backend of ['node', 'wasm'] as const) {
      const m = backend === 'node' ? model : await loadModelNode(rm.dir, { backend });
      try {
        const out = await m.run(tokens, { hooks: 'all', withResult: true });
        const cmp = compareHooks(ref.hooks, out.hooks, names, TOL);
        const bad = cmp.filter((r) => !r.ok);
        expect(bad, JSON.stringify(bad.slice(0, 5))).toEqual([]);
        const dl = maxAbsDiff(ref.logits.data, out.logits.data).maxAbs;
        expect(dl).toBeLessThan(TOL);
        console.log(
          `${c.name} ${backend}: ${cmp.length} hooks, worst |Δ| ${Math.max(...cmp.map((r) => r.maxAbs)).toExponential(2)}, logits |Δ| ${dl.toExponential(2)}`,
        );
      } finally {
        if (m !== model) await m.dispose();
      }
    }
    // every expert is chosen somewhere and no token's choice is a near tie (the reference's and the engine's top-k agree by margin)
    const { num_experts: E, experts_per_token: k } = model.info;
    const T = tokens.length;
    for (let l = 0; l < model.info.n_layers; l++) {
      const w = ref.hooks[`blocks.${l}.mlp.hook_router_weights`].data;
      const used = new Set<number>();
      for (let t = 0; t < T; t++) for (let e = 0; e < E!; e++) if (w[t * E! + e] > 0) used.add(e);
      expect(used.size, `layer ${l}`).toBeGreaterThan(k!);
    }
  });

  it('hook_expert_indices holds integers (float32, docs/DESIGN.md): exactly the reference top-k, each in [0, E)', async () => {
    const ref = referenceForward(rm, tokens);
    const E = model.info.num_experts!;
    for (let l = 0; l < model.info.n_layers; l++) {
      const name = `blocks.${l}.mlp.hook_expert_indices`;
      const got = (await model.run(tokens, { hooks: [name] })).hooks[name];
      expect(got.dims).toEqual([1, tokens.length, model.info.experts_per_token]);
      expect(got.data.every((x) => Number.isInteger(x) && x >= 0 && x < E)).toBe(true);
      expect(Array.from(got.data)).toEqual(Array.from(ref.hooks[name].data));
      expect(JSON.parse(JSON.stringify(Array.from(got.data))).every(Number.isInteger)).toBe(true);
    }
  });

  it("WebGPU (onnxruntime-node's WebGPU provider; here SwiftShader): every hook and the logits within 1e-4, and forced routing", async () => {
    const ref = referenceForward(rm, tokens);
    const m = await loadModelNode(rm.dir, { backend: 'webgpu' });
    try {
      expect(m.info.backend).toBe('webgpu');
      const names = m.hookNames({ withResult: true });
      const out = await m.run(tokens, { hooks: 'all', withResult: true });
      const cmp = compareHooks(ref.hooks, out.hooks, names, TOL);
      const bad = cmp.filter((r) => !r.ok);
      expect(bad, JSON.stringify(bad.slice(0, 5))).toEqual([]);
      const dl = maxAbsDiff(ref.logits.data, out.logits.data).maxAbs;
      expect(dl).toBeLessThan(TOL);
      console.log(
        `${c.name} webgpu: ${cmp.length} hooks, worst |Δ| ${Math.max(...cmp.map((r) => r.maxAbs)).toExponential(2)}, logits |Δ| ${dl.toExponential(2)}`,
      );
      const E = m.info.num_experts!;
      const b = `blocks.${m.info.n_layers - 1}.mlp`;
      const forced = await m.run(tokens, {
        interventions: [{ hook: `${b}.hook_router_logits`, op: 'add', neuron: 0, value: [30] }],
      });
      const want = referenceForward(rm, tokens, {
        record: false,
        hook: (name, v) =>
          name === `${b}.hook_router_logits` ? v.map((x, i) => (i % E === 0 ? x + 30 : x)) : undefined,
      });
      expect(maxAbsDiff(want.logits.data, forced.logits.data).maxAbs).toBeLessThan(TOL);
    } finally {
      await m.dispose();
    }
  });

  it('an expert ablated, routing forbidden and forced (interventions as data) equal the reference doing the same', async () => {
    const E = model.info.num_experts!;
    const l = model.info.n_layers - 1;
    const b = `blocks.${l}.mlp`;
    const ref0 = referenceForward(rm, tokens);
    // the expert most used at the last layer
    const w = ref0.hooks[`${b}.hook_router_weights`].data;
    const load = Array.from({ length: E }, (_, e) => tokens.reduce((a, _t, t) => a + (w[t * E + e] > 0 ? 1 : 0), 0));
    const e = load.indexOf(Math.max(...load));
    const cases: [string, any[], (name: string, v: Float64Array) => Float64Array | void][] = [
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
        [{ hook: `${b}.hook_router_logits`, op: 'add', neuron: (e + 1) % E, value: [30] }],
        (name, v) =>
          name === `${b}.hook_router_logits` ? v.map((x, i) => (i % E === (e + 1) % E ? x + 30 : x)) : undefined,
      ],
    ];
    for (const [label, interventions, hook] of cases) {
      const ref = referenceForward(rm, tokens, { hook });
      const out = await model.run(tokens, { interventions, hooks: [`${b}.hook_router_weights`] });
      expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs, label).toBeLessThan(TOL);
      expect(maxAbsDiff(ref0.logits.data, out.logits.data).maxAbs, label).toBeGreaterThan(10 * TOL);
      const rw = out.hooks[`${b}.hook_router_weights`].data;
      for (let t = 0; t < tokens.length; t++) {
        if (label === 'forbid') expect(rw[t * E + e]).toBe(0);
        if (label === 'force') expect(rw[t * E + ((e + 1) % E)]).toBeGreaterThan(0.99);
      }
    }
  });

  it('ablate an expert (its output; its routing forbidden or forced): the logit deltas equal the reference doing the same', async () => {
    const prompt = 'abc ab';
    const l = model.info.n_layers - 1;
    const E = model.info.num_experts!;
    const b = `blocks.${l}.mlp`;
    const doc0 = await ablate.run(model, { prompt, layer: l, expert: 0 } as any, {});
    expect(schemaErrors('ablate', viaJson(doc0))).toEqual([]);
    const toks = doc0.tokens.map((t: { id: number }) => t.id);
    const clean = referenceForward(rm, toks, { record: false });
    const T = toks.length,
      V = model.info.d_vocab;
    const ans = doc0.answer.token_id;
    const lastLogit = (r: { logits: { data: ArrayLike<number> } }) => r.logits.data[(T - 1) * V + ans];
    const cases: [Record<string, unknown>, (name: string, v: Float64Array) => Float64Array | void][] = [
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
      const doc = await ablate.run(model, { prompt, layer: l, ...target } as any, {});
      expect(schemaErrors('ablate', viaJson(doc))).toEqual([]);
      const want = lastLogit(referenceForward(rm, toks, { hook, record: false })) - lastLogit(clean);
      expect(Math.abs(doc.entries[0].logit_delta - want), JSON.stringify(target)).toBeLessThan(1e-4);
      expect(doc.entries[0].label).toBe(`L${l}E${target.expert}${target.route ? `.${target.route}` : ''}`);
    }
    await expect(ablate.run(model, { prompt, layer: l, expert: E } as any, {})).rejects.toMatchObject({
      code: 'BAD_INPUT',
    });
  });

  it('attribution_patching estimates every expert: Σ Δout · ∂M/∂out through the routed graph equals float64 central differences', async () => {
    const doc = await atp.run(
      model,
      {
        token_ids: tokens,
        corrupted_token_ids: [...tokens.slice(0, -3), ...tokens.slice(-3).reverse()],
        validate: 0,
      } as any,
      {},
    );
    expect(schemaErrors('attribution_patching', viaJson(doc))).toEqual([]);
    const E = model.info.num_experts!;
    expect(doc.experts!.length).toBe(model.info.n_layers * E);
    const clean = doc.tokens.map((t: { id: number }) => t.id);
    const corr = doc.corrupted_tokens.map((t: { id: number }) => t.id);
    const T = clean.length,
      V = model.info.d_vocab;
    const [a, cf] = [doc.answer.token_id, doc.counterfactual.token_id];
    const cleanRef = referenceForward(rm, clean);
    const corrRef = referenceForward(rm, corr);
    // M = logit(a) − logit(cf) at the last position, with expert (l, e)'s output moved by ε·(clean − corrupted)
    const metric = (l: number, e: number, eps: number) => {
      const hook = `blocks.${l}.mlp.experts.${e}.hook_out`;
      const c = cleanRef.hooks[hook].data,
        k = corrRef.hooks[hook].data;
      const r = referenceForward(rm, corr, {
        record: false,
        hook: (name, v) => (name === hook ? v.map((x, i) => x + eps * (c[i] - k[i])) : undefined),
      });
      return r.logits.data[(T - 1) * V + a] - r.logits.data[(T - 1) * V + cf];
    };
    let checked = 0;
    for (const x of doc.experts!) {
      if (x.estimate === 0) continue; // routed nowhere in either run's positions that matter
      const eps = 1e-3;
      const fd = (metric(x.layer, x.expert, eps) - metric(x.layer, x.expert, -eps)) / (2 * eps);
      expect(Math.abs(x.estimate - fd), `L${x.layer}E${x.expert}`).toBeLessThan(1e-3 * Math.max(1, Math.abs(fd)));
      checked++;
    }
    expect(checked).toBeGreaterThan(model.info.experts_per_token!);
  });

  it("patch scans every expert (expert_out): each cell equals the reference with that expert's clean output patched in", async () => {
    const corrupted = [...tokens.slice(0, -3), ...tokens.slice(-3).reverse()];
    const doc = await patch.run(
      model,
      { token_ids: tokens, corrupted_token_ids: corrupted, scans: ['expert_out'] } as any,
      {},
    );
    expect(schemaErrors('patch', viaJson(doc))).toEqual([]);
    const E = model.info.num_experts!,
      T = tokens.length,
      V = model.info.d_vocab;
    const [a, cf] = [doc.answer.token_id, doc.counterfactual.token_id];
    const clean = referenceForward(rm, tokens);
    const ld = (r: { logits: { data: ArrayLike<number> } }) =>
      r.logits.data[(T - 1) * V + a] - r.logits.data[(T - 1) * V + cf];
    const [ldClean, ldCorr] = [ld(clean), ld(referenceForward(rm, corrupted, { record: false }))];
    expect(doc.expert_out!.length).toBe(model.info.n_layers);
    for (let l = 0; l < model.info.n_layers; l++)
      for (let e = 0; e < E; e++) {
        const hook = `blocks.${l}.mlp.experts.${e}.hook_out`;
        const r = referenceForward(rm, corrupted, {
          record: false,
          hook: (name) => (name === hook ? Float64Array.from(clean.hooks[hook].data) : undefined),
        });
        const want = (ld(r) - ldCorr) / (ldClean - ldCorr);
        expect(Math.abs(doc.expert_out![l][e] - want), hook).toBeLessThan(1e-3 * Math.max(1, Math.abs(want)));
      }
  });

  it('greedy continuation through the KV cache equals the float64 reference re-run in full', async () => {
    const ids = tokens.slice(0, 5);
    const gen = await generateTokens(model, ids, { maxNewTokens: 6, stopAtEos: false });
    expect(gen.ids).toEqual(greedyGenerate64(loadModelDir(rm.dir), ids, 6));
    const split = 4;
    const first = await model.run(tokens.slice(0, split), { returnCache: true });
    const rest = await model.run(tokens.slice(split), { past: first.present });
    const full = await model.run(tokens);
    const V = model.info.d_vocab;
    expect(maxAbsDiff(rest.logits.data, full.logits.data.subarray(split * V)).maxAbs).toBeLessThan(1e-5);
  });

  it('trace: one term per expert (and the shared expert), each equal to the float64 reference, all summing to the logit', async () => {
    const prompt = 'abc ab';
    const doc = await trace.run(model, { prompt, convention: 'raw', top_k: 5 } as any, {});
    expect(schemaErrors('trace', viaJson(doc))).toEqual([]);
    const { terms, sum, target } = doc.decomposition;
    expect(Math.abs(sum - target)).toBeLessThan(1e-4);
    expect(doc.checks.residual_reconstruction_max_abs).toBeLessThan(1e-4);
    expect(terms.some((t) => t.name.endsWith('.mlp'))).toBe(false);
    expect(doc.top_neurons).toEqual([]);
    expect(doc.top_experts!.length).toBe(5);
    // raw convention, RMSNorm: term(c) = Σ_d c_d · w_d · W_U[t, d] / s, all from the reference in float64
    const ids = doc.tokens.map((t: { id: number }) => t.id);
    const ref = referenceForward(rm, ids);
    const T = ids.length,
      D = model.info.d_model;
    const pos = T - 1;
    const s = ref.hooks['ln_final.hook_scale'].data[pos];
    const w = rm.tensors['model.norm.weight'].data;
    const WU = rm.tensors[rm.config.tie_word_embeddings ? 'model.embed_tokens.weight' : 'lm_head.weight'].data;
    const t = doc.target.token_id;
    const term = (hook: string) => {
      const v = ref.hooks[hook].data;
      let x = 0;
      for (let d = 0; d < D; d++) x += (v[pos * D + d] * w[d] * WU[t * D + d]) / s;
      return x;
    };
    let routed = 0;
    for (let l = 0; l < model.info.n_layers; l++) {
      for (let e = 0; e < model.info.num_experts!; e++) {
        const got = terms.find((x) => x.name === `L${l}.E${e}`)!.value;
        expect(Math.abs(got - term(`blocks.${l}.mlp.experts.${e}.hook_out`)), `L${l}.E${e}`).toBeLessThan(1e-4);
        expect(doc.expert_attribution![l][e]).toBe(got);
        if (got !== 0) routed++;
      }
      const sh = terms.find((x) => x.name === `L${l}.shared_expert`);
      expect(!!sh).toBe(rm.config.model_type === 'qwen2_moe');
      if (sh) expect(Math.abs(sh.value - term(`blocks.${l}.mlp.shared_expert.hook_out`))).toBeLessThan(1e-4);
    }
    expect(routed).toBe(model.info.n_layers * model.info.experts_per_token!); // exactly the routed experts have terms
  });

  it("activations: each expert's load and the router's entropy equal the float64 reference's", async () => {
    const doc = await activations.run(model, { prompt: 'abc ab', sites: ['resid_post'] } as any, {});
    expect(schemaErrors('activations', viaJson(doc))).toEqual([]);
    const ids = doc.tokens.map((t: { id: number }) => t.id);
    const ref = referenceForward(rm, ids);
    const T = ids.length;
    const { num_experts: E, experts_per_token: k } = model.info as { num_experts: number; experts_per_token: number };
    expect(doc.experts!.map((x) => x.layer)).toEqual(Array.from({ length: model.info.n_layers }, (_, l) => l));
    for (const x of doc.experts!) {
      const idx = ref.hooks[`blocks.${x.layer}.mlp.hook_expert_indices`].data;
      const load = new Array(E).fill(0);
      for (let i = 0; i < T * k; i++) load[idx[i]] += 1 / T;
      for (let e = 0; e < E; e++) expect(x.load[e]).toBeCloseTo(load[e], 12);
      expect(x.load.reduce((a, b) => a + b, 0)).toBeCloseTo(k, 12);
      const lg = ref.hooks[`blocks.${x.layer}.mlp.hook_router_logits`].data;
      for (let p = 0; p < T; p++) {
        const row = Array.from(lg.subarray(p * E, (p + 1) * E));
        const z = row.reduce((a, v) => a + Math.exp(v), 0);
        const h = -row.reduce((a, v) => a + (Math.exp(v) / z) * (v - Math.log(z)), 0);
        expect(Math.abs(x.entropy_per_position[p] - h)).toBeLessThan(1e-4);
      }
      expect(x.router_entropy).toBeGreaterThan(0);
      expect(x.router_entropy).toBeLessThan(Math.log(E));
    }
  });

  it('q8 and q4 weights quantise the experts (not the router): q8 equals the reference on the q8 weights', async () => {
    for (const weights of ['q8', 'q4'] as const) {
      const m = await loadModelNode(rm.dir, { weights });
      try {
        expect(m.info.weights).toBe(weights);
        expect(m.info.weight_bytes).toBeLessThan(model.info.weight_bytes / 2);
        if (weights !== 'q8') continue;
        // the q8 scheme from its definition on every matrix but the routers and the embedding-sized ones it leaves
        const q = q8Reference(rm);
        for (const n of Object.keys(rm.tensors))
          if (/\.gate\.weight$|shared_expert_gate/.test(n)) q.tensors[n] = rm.tensors[n];
        const ref = referenceForward(q, tokens);
        const out = await m.run(tokens);
        expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs).toBeLessThan(TOL);
        expect(maxAbsDiff(referenceForward(rm, tokens).logits.data, out.logits.data).maxAbs).toBeGreaterThan(10 * TOL);
      } finally {
        await m.dispose();
      }
    }
  });

  it('the routing features it has matter: leaving each out moves the logits past the tolerance', () => {
    const ref = referenceForward(rm, tokens, { record: false });
    const features: RefFeature[] = [];
    if (rm.config.model_type === 'mixtral' || rm.config.norm_topk_prob) features.push('moe_renorm');
    if (rm.config.model_type === 'qwen2_moe') features.push('shared_expert_gate');
    if (rm.config.model_type === 'olmoe') features.push('qk_norm_full');
    if (rm.config.model_type === 'mixtral') features.push('sliding_window');
    for (const f of features) {
      const d = maxAbsDiff(ref.logits.data, referenceForward(rm, tokens, { record: false, drop: [f] }).logits.data);
      console.log(`${c.name}: without ${f} the logits move by ${d.maxAbs.toExponential(2)}`);
      expect(d.maxAbs, f).toBeGreaterThan(100 * TOL);
    }
  });
});

describe('MoE from the CLI: ablate one expert and force routing', () => {
  it('loupe ablate MODEL --layer --expert [--route force] --json', async () => {
    const rm = makeCaseModel(MOE_FAMILY_CASES[0]);
    try {
      const run = (extra: string[]) =>
        new Promise<{ code: number; stdout: string; stderr: string }>((res) =>
          execFile(
            process.execPath,
            [resolve(__dirname, '../bin/loupe.mjs'), 'ablate', rm.dir, 'abc ab', '--layer', '1', ...extra, '--json'],
            { env: { ...process.env, NO_COLOR: '1' } },
            (err, stdout, stderr) => res({ code: err ? 1 : 0, stdout, stderr }),
          ),
        );
      for (const [extra, label] of [
        [['--expert', '3'], 'L1E3'],
        [['--expert', '3', '--route', 'force'], 'L1E3.force'],
      ] as const) {
        const r = await run([...extra]);
        expect(r.code, r.stderr).toBe(0);
        const doc = JSON.parse(r.stdout);
        expect(doc.entries[0].label).toBe(label);
        expect(doc.interventions[0].hook).toBe(
          extra.length > 2 ? 'blocks.1.mlp.hook_router_logits' : 'blocks.1.mlp.experts.3.hook_out',
        );
      }
    } finally {
      rm.cleanup();
    }
  });
});

describe('MoE bad input: structured errors from config.json and the headers, before any weight byte', () => {
  const base = MOE_FAMILY_CASES[0];
  let rm: RandomModel;
  let config: Record<string, any>;
  beforeAll(() => {
    rm = makeCaseModel(base);
    config = JSON.parse(readFileSync(join(rm.dir, 'config.json'), 'utf8'));
  });
  afterAll(() => rm?.cleanup());

  const refused = (patch: Record<string, unknown>): LoupeError => {
    try {
      checkConfig({ ...config, ...patch });
    } catch (e) {
      expect(e).toBeInstanceOf(LoupeError);
      return e as LoupeError;
    }
    throw new Error('expected a LoupeError');
  };

  it('more experts, a larger top-k than the caps or than the experts, mixed dense layers: BAD_CONFIG / UNSUPPORTED_CONFIG naming the field', () => {
    let e = refused({ num_local_experts: 100_000 });
    expect([e.code, e.message]).toEqual(['BAD_CONFIG', expect.stringContaining('num_local_experts')]);
    e = refused({ num_experts_per_tok: 65 });
    expect([e.code, e.message]).toEqual(['BAD_CONFIG', expect.stringContaining('num_experts_per_tok')]);
    e = refused({ num_experts_per_tok: 9 });
    expect(e.code).toBe('BAD_CONFIG');
    expect(e.details).toMatchObject({ field: 'num_experts_per_tok' });
    e = refused({ model_type: 'qwen3_moe', num_experts: 8, moe_intermediate_size: 24, mlp_only_layers: [0] });
    expect(e.code).toBe('UNSUPPORTED_CONFIG');
    expect(e.details).toMatchObject({ field: 'mlp_only_layers' });
    e = refused({ model_type: 'olmoe', num_experts: 8, clip_qkv: 8 });
    expect(e.details).toMatchObject({ field: 'clip_qkv' });
    expect(() => checkConfig(config)).not.toThrow();
  });

  it('a router of the wrong shape and a missing expert tensor: BAD_TENSOR_SHAPE / MISSING_TENSOR naming the tensor, from the headers', async () => {
    const files = await loadModelFilesNode(rm.dir);
    const tensors = new Map(files.weights.tensors);
    const router = 'model.layers.1.block_sparse_moe.gate.weight';
    tensors.set(router, { ...tensors.get(router)!, shape: [7, config.hidden_size] });
    let err: unknown;
    try {
      describeModel({ config, tensors });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(LoupeError);
    expect((err as LoupeError).code).toBe('BAD_TENSOR_SHAPE');
    expect((err as LoupeError).details).toMatchObject({ tensor: router });
    const missing = new Map(files.weights.tensors);
    missing.delete('model.layers.0.block_sparse_moe.experts.5.w3.weight');
    try {
      describeModel({ config, tensors: missing });
    } catch (e) {
      err = e;
    }
    expect((err as LoupeError).code).toBe('MISSING_TENSOR');
    expect((err as LoupeError).details).toMatchObject({
      tensor: 'model.layers.0.block_sparse_moe.experts.5.w3.weight',
    });
  });
});
