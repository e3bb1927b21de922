/**
 * circuit on Qwen3.5 (linear-attention layers without heads, one full-attention layer with heads):
 * each linear-attention layer's whole output (hook_attn_out) is one attention candidate beside the
 * heads, and every single and group effect (zero and mean ablation) equals the float64 reference
 * (tests/reference/qwen3_5-64.ts) with the same activations replaced, written here from the hook
 * names alone; patch's head_out leaves a linear layer's row null (its output is attn_out_all_pos) and
 * equals the reference. Head-level work on a linear-attention layer, and edge_attribution (its graph has a node
 * per head), are a structured UNSUPPORTED_OP naming the layer(s); every registered operation either runs on
 * this model or is one of those refusals (never UNKNOWN_HOOK or INTERNAL).
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { rmSync } from 'node:fs';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { getOperation, operations } from '../src/ops/index';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import { makeRandomSae } from './helpers/random-sae';
import { makeRandomTranscoders } from './helpers/random-transcoders';
import { circuitOutput } from '../src/ops/circuit';
import { makeQwen35Model, qwen35Forward, type Qwen35Model } from './reference/qwen3_5-64';
import { refEffect } from './ops-ablate-reference';
import { mulberry32 } from './reference';
import { schemaErrors, viaJson } from './schema-helpers';

const TOL = 1e-4;
let m: Qwen35Model;
let model: LoadedModel;
let tokens: number[];
let linear: number[];

type Member = { layer: number; head?: number; neuron?: number; component?: 'attn_out' };

beforeAll(async () => {
  m = makeQwen35Model({ seed: 5 });
  model = await loadModelNode(m.dir, { backend: 'node' });
  const V = m.text.vocab_size;
  const specials = new Set(Object.values(m.tokenizer.specialIds));
  const r = mulberry32(21);
  tokens = [m.bosId];
  while (tokens.length < 10) {
    const t = Math.floor(r() * V);
    if (!specials.has(t)) tokens.push(t);
  }
  linear = m.text.layer_types.flatMap((t: string, l: number) => (t === 'linear_attention' ? [l] : []));
}, 60_000);
afterAll(async () => {
  await model?.dispose();
  if (m) rmSync(m.dir, { recursive: true, force: true });
});

/** the reference's last-position logits with every member replaced (zero, or its mean over positions) */
function refLast(ms: Member[], method: 'zero' | 'mean'): Float64Array {
  const T = tokens.length;
  const edits = new Map<string, { inner: number; pick: (i: number) => boolean }[]>();
  const add = (hook: string, inner: number, pick: (i: number) => boolean) =>
    edits.set(hook, [...(edits.get(hook) ?? []), { inner, pick }]);
  const D = m.text.hidden_size;
  const H = m.text.num_attention_heads;
  const Dh = m.text.head_dim;
  const M = m.text.intermediate_size;
  for (const x of ms) {
    const b = `blocks.${x.layer}`;
    if (x.head !== undefined) add(`${b}.attn.hook_z`, H * Dh, (i) => Math.floor(i / Dh) === x.head);
    else if (x.neuron !== undefined) add(`${b}.mlp.hook_post`, M, (i) => i === x.neuron);
    else add(`${b}.hook_attn_out`, D, () => true);
  }
  // mean ablation's means are the clean run's (upstream edits do not move them)
  const cleanHooks = new Map<string, Float64Array>();
  qwen35Forward(m, tokens, { hook: (name, v) => void (edits.has(name) && cleanHooks.set(name, Float64Array.from(v))) });
  const out = qwen35Forward(m, tokens, {
    hook: (name, v) => {
      const es = edits.get(name);
      if (!es) return undefined;
      const r = Float64Array.from(v);
      const c = cleanHooks.get(name)!;
      for (const { inner, pick } of es)
        for (let i = 0; i < inner; i++) {
          if (!pick(i)) continue;
          let mean = 0;
          for (let t = 0; t < T; t++) mean += c[t * inner + i] / T;
          for (let t = 0; t < T; t++) r[t * inner + i] = method === 'zero' ? 0 : mean;
        }
      return r;
    },
  }).logits;
  const V = m.text.vocab_size;
  return Float64Array.from(out.data).subarray((T - 1) * V, T * V);
}

describe('circuit on Qwen3.5: linear-attention layers as whole candidates, vs float64', () => {
  for (const method of ['zero', 'mean'] as const)
    it(`${method} ablation: every single and group equals the reference`, async () => {
      const doc: any = await getOperation('circuit')!.run(model, {
        token_ids: tokens,
        ablation: method,
        top_k_heads: 7,
        top_k_neurons: 4,
        pair_k: 4,
      });
      expect(circuitOutput.safeParse(doc).success).toBe(true);
      expect(viaJson(doc)).toEqual(doc);
      expect(schemaErrors('circuit', viaJson(doc))).toEqual([]);
      // 3 linear layers + 4 heads of the full-attention layer: all 7 are candidates
      expect(doc.linear_layers.map((r: any) => r.layer).sort()).toEqual(linear);
      expect(doc.heads.every((h: any) => !linear.includes(h.layer))).toBe(true);
      expect(doc.heads.length + doc.linear_layers.length).toBe(7);
      expect(doc.groups.find((g: any) => g.kind === 'all_heads').members.length).toBe(7);
      const t = doc.answer.token_id;
      const clean = refLast([], method);
      const rows: { label: string; members: Member[]; logit_delta: number; logprob_delta: number; kl: number }[] = [
        ...doc.heads.map((h: any) => ({ ...h, members: [{ layer: h.layer, head: h.head }] })),
        ...doc.linear_layers.map((r: any) => ({ ...r, members: [{ layer: r.layer, component: 'attn_out' }] })),
        ...doc.neurons.map((n: any) => ({ ...n, members: [{ layer: n.layer, neuron: n.neuron }] })),
        ...doc.groups,
      ];
      let worst = 0;
      let smallestLinear = Infinity;
      for (const row of rows) {
        const r = refEffect(clean, refLast(row.members, method), t);
        worst = Math.max(
          worst,
          Math.abs(row.logit_delta - r.logit_delta),
          Math.abs(row.logprob_delta - r.logprob_delta),
          Math.abs(row.kl - r.kl),
        );
        if (row.members.length === 1 && row.members[0].component)
          smallestLinear = Math.min(smallestLinear, Math.abs(r.logit_delta));
      }
      console.log(
        `qwen3_5 circuit (${method}): ${rows.length} singles and groups, worst |Δ| ${worst.toExponential(2)}, ` +
          `smallest linear-layer |Δ logit| ${smallestLinear.toExponential(2)}`,
      );
      expect(smallestLinear).toBeGreaterThan(1e-3); // each linear layer's ablation moves the answer: the check can fail
      expect(worst).toBeLessThan(TOL);
    });

  it("patch's default scans: head_out on the full-attention heads (null on linear layers), attn_out_all_pos vs float64", async () => {
    const T = tokens.length;
    const V = m.text.vocab_size;
    const corrupted = [...tokens];
    corrupted[2] = tokens[3];
    corrupted[5] = tokens[6];
    const last = (ids: number[], hook?: (n: string, v: Float64Array) => Float64Array | void) =>
      Float64Array.from(qwen35Forward(m, ids, { hook }).logits.data).subarray((T - 1) * V, T * V);
    const cleanL = last(tokens);
    const order = [...cleanL.keys()].sort((x, y) => cleanL[y] - cleanL[x]);
    const [a, c] = order;
    const doc: any = await getOperation('patch')!.run(model, {
      token_ids: tokens,
      corrupted_token_ids: corrupted,
      answer: `#${a}`,
      counterfactual: `#${c}`,
    });
    expect(schemaErrors('patch', viaJson(doc))).toEqual([]);
    const store = new Map<string, Float64Array>();
    qwen35Forward(m, tokens, { hook: (n, v) => void store.set(n, Float64Array.from(v)) });
    const corrL = last(corrupted);
    const ld = (x: Float64Array) => x[a] - x[c];
    const metric = (x: Float64Array) => (ld(x) - ld(corrL)) / (ld(cleanL) - ld(corrL));
    // denoising: the clean value patched into the corrupted run, at every position
    const patched = (hook: string, pick: (i: number) => boolean, inner: number) =>
      metric(
        last(corrupted, (n, v) => {
          if (n !== hook) return undefined;
          const src = store.get(hook)!;
          return v.map((x, i) => (pick(i % inner) ? src[i] : x));
        }),
      );
    const H = m.text.num_attention_heads;
    const Dh = m.text.head_dim;
    let worst = 0;
    let n = 0;
    for (let l = 0; l < m.text.num_hidden_layers; l++) {
      if (linear.includes(l)) {
        expect(doc.head_out[l].every((v: number | null) => v === null)).toBe(true);
      } else
        for (let h = 0; h < H; h++) {
          const want = patched(`blocks.${l}.attn.hook_z`, (i) => Math.floor(i / Dh) === h, H * Dh);
          worst = Math.max(worst, Math.abs(doc.head_out[l][h] - want));
          n++;
        }
      const want = patched(`blocks.${l}.hook_attn_out`, () => true, m.text.hidden_size);
      worst = Math.max(worst, Math.abs(doc.attn_out_all_pos[l] - want));
      n++;
    }
    console.log(`qwen3_5 patch: ${n} head_out and attn_out_all_pos cells, worst |Δ| ${worst.toExponential(2)}`);
    expect(n).toBe(H + m.text.num_hidden_layers);
    expect(worst).toBeLessThan(TOL);
  });

  it('head-level work on a linear-attention layer is UNSUPPORTED_OP naming the layer', async () => {
    const l = linear[0];
    const calls: [string, object][] = [
      ['ablate', { token_ids: tokens, targets: [{ layer: l, head: 0 }] }],
      ['attention', { token_ids: tokens, heads: [{ layer: l, head: 0 }] }],
      ['attention', { token_ids: tokens, layers: [l] }],
      ['head_scores', { batch: 2 }],
      ['patch', { token_ids: tokens, corrupted_token_ids: tokens, heads: [{ layer: l, head: 0 }] }],
      ['patch', { token_ids: tokens, corrupted_token_ids: tokens, scans: ['path'] }],
      // before the transcoders are read (the folder does not exist)
      ['attribution_graph', { prompt: '', token_ids: tokens, transcoder_source: '/nonexistent-transcoders' }],
      [
        'feature_intervention',
        {
          prompt: '',
          token_ids: tokens,
          transcoder_source: '/nonexistent-transcoders',
          interventions: [{ layer: 0, position: 1, feature: 0, value: 1 }],
        },
      ],
    ];
    for (const [name, input] of calls) {
      const e: any = await getOperation(name)!
        .run(model, input)
        .then(
          () => null,
          (x) => x,
        );
      expect(e?.code, name).toBe('UNSUPPORTED_OP');
      expect(e.message).toMatch(/Layer \d+ of this .* linear-attention/);
      expect(e.details.layer).toBe(/head_scores|patch$|_graph|_intervention/.test(name) && !('heads' in input) ? 0 : l);
    }
    // edge_attribution: refused before any run, naming every linear-attention layer
    const t0 = Date.now();
    const e: any = await getOperation('edge_attribution')!
      .run(model, { generate: { task: 'induction', n: 2, length: 4 }, method: 'eap' })
      .then(
        () => null,
        (x) => x,
      );
    expect(e?.code).toBe('UNSUPPORTED_OP');
    expect(e.message).toBe(
      `edge_attribution does not model linear-attention layers: layers ${linear.join(', ')} of this ` +
        'qwen3_5_text model are gated delta-net layers without attention heads, for which the edge graph ' +
        "(a node per head) has no node; its full-attention layers' gated output is not modelled either.",
    );
    expect(e.hint).toMatch(/attribution_patching/);
    expect(e.details.layers).toEqual(linear);
    expect(Date.now() - t0).toBeLessThan(1000);
    // by default attention shows the full-attention layers' heads only
    const doc: any = await getOperation('attention')!.run(model, { token_ids: tokens });
    expect(doc.heads.length).toBe(4);
    expect(doc.heads.every((h: any) => !linear.includes(h.layer))).toBe(true);
  });

  it('every operation runs, or refuses with a structured error other than UNKNOWN_HOOK or INTERNAL', async () => {
    const ids = tokens;
    const cor = [...ids];
    cor[2] = ids[3];
    const P = model.decode(ids.slice(1));
    const D = m.text.hidden_size;
    const vec = { kind: 'vector', values: Array(D).fill(0.1) };
    const pair = { token_ids: ids, corrupted_token_ids: cor, answer: '#3', counterfactual: '#4' };
    const sae = makeRandomSae({ hook: 'blocks.0.hook_attn_out', dIn: D, dSae: 16 });
    const tc = makeRandomTranscoders({ kind: 'plt', nLayers: m.text.num_hidden_layers, dModel: D, features: 8 });
    const loaders = createNodeSaeLoaders({ cache: false });
    const ctx = { loadSae: loaders.loadSae, loadTranscoders: loaders.loadTranscoders };
    try {
      const cap: any = await getOperation('capture')!.run(model, {
        prompts: ['ab', 'ba', 'abc', 'bca'].map((text, i) => ({ text, label: i % 2 ? 'b' : 'a' })),
      });
      const inputs: Record<string, object> = {
        trace: { prompt: P },
        activations: { prompt: P },
        attention: { token_ids: ids },
        logit_lens: { prompt: P },
        head_scores: { batch: 2 },
        composition_scores: {},
        ablate: { token_ids: ids, layer: linear[0], component: 'attn_out' },
        circuit: { token_ids: ids },
        layer_ablation: { token_ids: ids },
        patch: pair,
        attribution_patching: pair,
        integrated_gradients: { ...pair, steps: 4 },
        edge_attribution: { generate: { task: 'induction', n: 2, length: 4 } },
        attribution_graph: { prompt: '', token_ids: ids, transcoder_source: tc.dir },
        feature_intervention: {
          prompt: '',
          token_ids: ids,
          transcoder_source: tc.dir,
          interventions: [{ layer: 0, position: 1, feature: 0, value: 1 }],
        },
        steer: { prompt: P, layer: 1, direction: vec, alpha: 1, max_new_tokens: 2 },
        sweep: { prompt: P, layer: 1, direction: vec, max_new_tokens: 2 },
        causality: { prompt: P, layer: 1, direction: vec, targets: ['#3'] },
        capture: { prompts: [{ text: P, label: 'a' }] },
        probe: { capture: cap.handle, hook: cap.hooks[0].name ?? cap.hooks[0].hook },
        generate: { prompt: P, max_new_tokens: 2 },
        sae_features: { prompt: P, sae_source: sae.dir },
        feature: { prompt: P, sae_source: sae.dir, feature: 1 },
        sae_steer: { prompt: P, sae_source: sae.dir, feature: 1, alpha: 2, max_new_tokens: 2 },
        dashboard: { layer: 0, neuron: 1, corpus: `${P} ${P}` },
      };
      expect(Object.keys(inputs).sort()).toEqual(Object.keys(operations).sort());
      const refused: string[] = [];
      for (const [name, input] of Object.entries(inputs)) {
        const e: any = await getOperation(name)!
          .run(model, input, ctx)
          .then(
            () => null,
            (x) => x,
          );
        if (!e) continue;
        expect(e.code, `${name}: ${e.message}`).toBe('UNSUPPORTED_OP');
        expect(e.message, name).toMatch(/linear-attention/);
        refused.push(name);
      }
      console.log(`qwen3_5: refused (UNSUPPORTED_OP, named): ${refused.join(', ')}; every other operation ran`);
      expect(refused.sort()).toEqual(
        ['attribution_graph', 'composition_scores', 'edge_attribution', 'feature_intervention', 'head_scores'].sort(),
      );
    } finally {
      tc.cleanup();
      rmSync(sae.dir, { recursive: true, force: true });
    }
  });
});
