/**
 * Operations on Qwen3.5's linear-attention (gated delta-net) layers against the float64 reference
 * (tests/reference/qwen3_5-64.ts, the delta rule token by token): `ablate` of each linear-attention
 * layer's output (zero and mean over positions) equals the reference with that hook replaced;
 * `steer` at the layer after a linear-attention layer gives the reference's steered next-token
 * log-probabilities and greedy continuation (full re-runs, the edit at every position); gradients at
 * hooks after the last linear-attention layer equal float64 central differences; and gradients that
 * would pass through the delta rule's recurrence (an ONNX Scan, which the backward builder has no rule
 * for) are UNSUPPORTED_OP naming the Scan, from the engine and from attribution_patching.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { rmSync } from 'node:fs';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { getOperation } from '../src/ops/index';
import { makeQwen35Model, qwen35Forward, type Qwen35Model } from './reference/qwen3_5-64';
import { mulberry32 } from './reference';

const TOL = 1e-4;
let m: Qwen35Model;
let model: LoadedModel;
let tokens: number[];
let V: number;
let D: number;
let linear: number[];

const lastRow = (x: ArrayLike<number>, T: number) => Array.from(x).slice((T - 1) * V, T * V);
const logSoftmax = (row: number[]) => {
  const mx = Math.max(...row);
  const z = Math.log(row.reduce((a, v) => a + Math.exp(v - mx), 0)) + mx;
  return row.map((v) => v - z);
};
const argmax = (row: number[]) => row.indexOf(Math.max(...row));

beforeAll(async () => {
  m = makeQwen35Model({ seed: 5 });
  model = await loadModelNode(m.dir, { backend: 'node' });
  V = m.text.vocab_size;
  D = m.text.hidden_size;
  const specials = new Set(Object.values(m.tokenizer.specialIds));
  const r = mulberry32(9);
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

describe('Qwen3.5 linear-attention layers: ablate, steer and gradients vs float64', () => {
  it('ablate (zero, mean) of each linear-attention layer’s output: the answer’s logit change equals the reference’s', async () => {
    expect(linear.length).toBeGreaterThanOrEqual(2);
    const T = tokens.length;
    const clean = lastRow(qwen35Forward(m, tokens).logits.data, T);
    const answer = argmax(clean);
    let worst = 0;
    let smallest = Infinity;
    for (const l of linear)
      for (const method of ['zero', 'mean'] as const) {
        const doc: any = await getOperation('ablate')!.run(model, {
          token_ids: tokens,
          layer: l,
          component: 'attn_out',
          method,
          answer: `#${answer}`,
        });
        expect(doc.interventions[0].hook).toBe(`blocks.${l}.hook_attn_out`);
        const name = `blocks.${l}.hook_attn_out`;
        const ref = qwen35Forward(m, tokens, {
          hook: (n, v) => {
            if (n !== name) return undefined;
            if (method === 'zero') return v.map(() => 0);
            const mean = Array.from({ length: D }, (_, d) => {
              let s = 0;
              for (let t = 0; t < T; t++) s += v[t * D + d];
              return s / T;
            });
            return v.map((_, i) => mean[i % D]);
          },
        });
        const want = lastRow(ref.logits.data, T)[answer] - clean[answer];
        worst = Math.max(worst, Math.abs(doc.entries[0].logit_delta - want));
        smallest = Math.min(smallest, Math.abs(want));
      }
    console.log(`qwen3_5 ablate: layers ${linear.join(',')} × zero/mean, worst |Δ| ${worst.toExponential(2)}`);
    expect(smallest).toBeGreaterThan(1e-3); // each ablation moves the answer, so the check can fail
    expect(worst).toBeLessThan(TOL);
  });

  it('steer after a linear-attention layer: steered log-probabilities and greedy tokens equal the reference', async () => {
    const layer = linear[0] + 1;
    const r = mulberry32(17);
    const values = Array.from({ length: D }, () => r() * 2 - 1);
    const alpha = 3;
    const n = 5;
    const doc: any = await getOperation('steer')!.run(model, {
      prompt: model.decode(tokens.slice(1)),
      layer,
      direction: { kind: 'vector', values },
      normalize: false,
      alpha,
      max_new_tokens: n,
      stop_at_eos: false,
    });
    const name = `blocks.${layer}.hook_resid_pre`;
    const steered = (ids: number[]) =>
      qwen35Forward(m, ids, { hook: (h, v) => (h === name ? v.map((x, i) => x + alpha * values[i % D]) : undefined) });
    const prompt = doc.tokens.map((t: { id: number }) => t.id);
    const lp = logSoftmax(lastRow(steered(prompt).logits.data, prompt.length));
    let worst = 0;
    for (const t of [...doc.targets, ...doc.controls])
      worst = Math.max(worst, Math.abs(t.steered_logprob - lp[t.token_id]));
    // greedy through the recurrent state (the engine) = full re-runs with the edit at every position (the reference)
    const ids = prompt.slice();
    for (let i = 0; i < n; i++) ids.push(argmax(lastRow(steered(ids).logits.data, ids.length)));
    console.log(`qwen3_5 steer at layer ${layer}: worst log-prob |Δ| ${worst.toExponential(2)}`);
    expect(worst).toBeLessThan(TOL);
    expect(doc.steered.generated_token_ids).toEqual(ids.slice(prompt.length));
    expect(doc.steered.generated_token_ids).not.toEqual(doc.base.generated_token_ids);
  });

  it('gradients at hooks after the last linear-attention layer equal float64 central differences', async () => {
    const after = linear[linear.length - 1] + 1;
    expect(m.text.layer_types[after]).toBe('full_attention');
    const T = tokens.length;
    const [a, b] = [3, 5];
    const seed = new Float32Array(T * V);
    seed[(T - 1) * V + a] = 1;
    seed[(T - 1) * V + b] = -1;
    for (const name of [`blocks.${after}.hook_resid_pre`, `blocks.${after}.hook_resid_mid`]) {
      const out = await model.run(tokens, { grad: { hooks: [name], seed: { dims: [1, T, V], data: seed } } });
      const g = out.grads![name].data;
      const r = mulberry32(23);
      const u = Array.from({ length: T * D }, () => r() * 2 - 1);
      const M = (eps: number) => {
        const hook = (h: string, v: Float64Array) => (h === name ? v.map((x, i) => x + eps * u[i]) : undefined);
        const row = lastRow(qwen35Forward(m, tokens, { hook }).logits.data, T);
        return row[a] - row[b];
      };
      const fd = (M(1e-4) - M(-1e-4)) / 2e-4;
      const got = u.reduce((s, x, i) => s + x * g[i], 0);
      console.log(`qwen3_5 ∂M/∂${name} · u: engine ${got.toFixed(6)}, float64 central difference ${fd.toFixed(6)}`);
      expect(Math.abs(fd)).toBeGreaterThan(1e-2);
      expect(Math.abs(got - fd)).toBeLessThan(TOL * Math.max(1, Math.abs(fd)));
    }
  });

  it('a gradient through the gated delta rule is UNSUPPORTED_OP naming the Scan (engine and attribution_patching)', async () => {
    const T = tokens.length;
    const seed = { dims: [1, T, V], data: new Float32Array(T * V).fill(1 / V) };
    const e: any = await model
      .run(tokens, { grad: { hooks: [`blocks.${linear[0]}.hook_resid_pre`], seed } })
      .catch((x) => x);
    expect(e.code, e.message).toBe('UNSUPPORTED_OP');
    expect(e.message).toContain("'Scan'");
    expect(e.message).toContain('delta rule');
    expect(e.hint).toContain('after the last linear-attention layer');
    expect(e.details).toEqual({ op: 'Scan' });
    const dataset = [
      {
        clean_token_ids: tokens,
        corrupted_token_ids: [...tokens.slice(0, -1), tokens[1]],
        answer: '#3',
        counterfactual: '#5',
      },
    ];
    const e2: any = await getOperation('attribution_patching')!
      .run(model, { dataset })
      .catch((x: unknown) => x);
    expect(e2.code, e2.message).toBe('UNSUPPORTED_OP');
    expect(e2.message).toContain("'Scan'");
  });
});
