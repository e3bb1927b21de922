/**
 * Operations on Qwen3.5's linear-attention (gated delta-net) layers against the float64 reference
 * (tests/reference/qwen3_5-64.ts, the delta rule token by token): `ablate` of each linear-attention
 * layer's output (zero and mean over positions) equals the reference with that hook replaced;
 * `steer` at the layer after a linear-attention layer gives the reference's steered next-token
 * log-probabilities and greedy continuation (full re-runs, the edit at every position); gradients at
 * hooks after the last linear-attention layer equal float64 central differences; attribution_patching
 * runs through the delta rule (its reverse Scan, graph/delta-rule.ts): every estimate equals the float64
 * derivative along clean − corrupted and every validated site the reference's patched metric, and on a
 * small corruption the estimates match real patching; integrated_gradients' attributions equal float64
 * Riemann sums of central differences.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { encodeSafetensors } from './reference/safetensors-io';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { getOperation } from '../src/ops/index';
import { makeQwen35Model, qwen35Forward, type Qwen35Model } from './reference/qwen3_5-64';
import { mulberry32 } from './reference';
import { schemaErrors, viaJson } from './schema-helpers';

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

  it('attribution_patching runs through the delta rule: estimates = float64 central differences, validated by patching', async () => {
    const T = tokens.length;
    const corrupted = tokens.slice();
    corrupted[3] = tokens[7];
    const doc: any = await getOperation('attribution_patching')!.run(model, {
      token_ids: tokens,
      corrupted_token_ids: corrupted,
      validate_scope: 'all',
    });
    expect(schemaErrors('attribution_patching', viaJson(doc))).toEqual([]);
    const full = m.text.layer_types.flatMap((t: string, l: number) => (t === 'full_attention' ? [l] : []));
    // heads only on the full-attention layers; a linear-attention layer's output is a site
    expect([...new Set(doc.heads.map((h: any) => h.layer))]).toEqual(full);
    expect(doc.sites.length).toBe(3 * m.text.num_hidden_layers * T);
    const [a, cf] = [doc.answer.token_id, doc.counterfactual.token_id];
    const cleanRef = qwen35Forward(m, tokens);
    const metric = (hook: string, edit: (v: Float64Array) => Float64Array) => {
      const row = lastRow(
        qwen35Forward(m, corrupted, { hook: (n, v) => (n === hook ? edit(v) : undefined) }).logits.data,
        T,
      );
      return row[a] - row[cf];
    };
    const corrRef = qwen35Forward(m, corrupted);
    // each estimate is Σ Δ·∂M/∂a: the float64 derivative of M along Δ = clean − corrupted at that site
    const eps = 1e-5;
    const fds: number[] = [];
    const check = (hook: string, mask: (i: number) => boolean) => {
      const c = cleanRef.hooks[hook].data,
        k = corrRef.hooks[hook].data;
      const along = (e: number) => (v: Float64Array) => v.map((x, i) => (mask(i) ? x + e * (c[i] - k[i]) : x));
      fds.push((metric(hook, along(eps)) - metric(hook, along(-eps))) / (2 * eps));
    };
    const { n_heads: H, d_head: Dh } = model.info;
    for (const h of doc.heads) check(`blocks.${h.layer}.attn.hook_z`, (i) => Math.floor(i / Dh) % H === h.head);
    for (const x of doc.sites) check(x.hook, (i) => Math.floor(i / D) === x.position);
    const worstOf = (d: any) =>
      Math.max(
        ...[...d.heads, ...d.sites].map(
          (x: any, i: number) => Math.abs(x.estimate - fds[i]) / Math.max(1, Math.abs(fds[i])),
        ),
      );
    const worstFd = worstOf(doc);
    // WASM and WebGPU (SwiftShader; products summed on the device) against the same float64 derivatives
    const others: string[] = [];
    for (const backend of ['wasm', 'webgpu'] as const) {
      const other = await loadModelNode(m.dir, { backend });
      try {
        const d: any = await getOperation('attribution_patching')!.run(other, {
          token_ids: tokens,
          corrupted_token_ids: corrupted,
          validate: 0,
        });
        const w = worstOf(d);
        others.push(`${backend} ${w.toExponential(2)}`);
        expect(w, backend).toBeLessThan(1e-4);
      } finally {
        await other.dispose();
      }
    }
    // the validation's actual effects: the reference with that site's clean value patched in
    let worstActual = 0;
    const v = doc.validation;
    for (const x of v.sites) {
      const c = cleanRef.hooks[x.hook].data;
      const want =
        metric(x.hook, (val) => val.map((y, i) => (Math.floor(i / D) === x.position ? c[i] : y))) -
        doc.metric.corrupted;
      worstActual = Math.max(worstActual, Math.abs(x.actual - want));
    }
    // first order against real patching of a whole token's change: reported only (the next test asserts it)
    const big = v.sites.filter(
      (x: any) => Math.abs(x.actual) > 0.1 * Math.abs(doc.metric.clean - doc.metric.corrupted),
    );
    const relErr = big.map((x: any) => Math.abs(x.estimate - x.actual) / Math.abs(x.actual));
    const linearSites = big.filter((x: any) => linear.includes(x.layer) && x.hook.endsWith('attn_out'));
    console.log(
      `qwen3_5 AtP: ${doc.heads.length} heads + ${doc.sites.length} sites, worst |estimate − float64 FD| ` +
        `${worstFd.toExponential(2)} (${others.join(', ')}), worst |actual − reference| ${worstActual.toExponential(2)}; ` +
        `${big.length} sites with |actual| > 10% of the gap (${linearSites.length} linear-attention outputs), ` +
        `worst relative |estimate − actual| ${Math.max(...relErr).toFixed(3)}; ρ sites ${v.rank_correlation.sites.toFixed(3)}, ` +
        `heads ${v.rank_correlation.heads?.toFixed(3)}; sign agreement ${v.sign_agreement.sites}`,
    );
    expect(worstFd).toBeLessThan(1e-4);
    expect(worstActual).toBeLessThan(TOL);
  }, 240_000);

  it('attribution_patching on a small corruption: every site estimate is close to its actual patching effect', async () => {
    // token c's embedding moved 3% from token t's (rewritten checkpoint): the patches are small, so AtP's
    // first-order estimates should match real patching; through the delta rule at every later position
    const near = makeQwen35Model({ seed: 5 });
    const T = tokens.length;
    const [t, c] = [tokens[3], tokens.find((x, i) => i > 0 && x !== tokens[3] && !tokens.slice(0, 3).includes(x))!];
    const E = near.tensors[`${near.prefix}embed_tokens.weight`].data;
    const r = mulberry32(31);
    for (let d = 0; d < D; d++) E[c * D + d] = E[t * D + d] * (1 + 0.03 * (r() * 2 - 1));
    writeFileSync(join(near.dir, 'model.safetensors'), encodeSafetensors(near.tensors, 'F32'));
    const nm = await loadModelNode(near.dir, { backend: 'node' });
    try {
      const corrupted = tokens.slice();
      corrupted[3] = c;
      // the clean top two tokens (the small corruption leaves the prediction as it is)
      const row = lastRow((await nm.run(tokens)).logits.data, T);
      const [ans, cf] = row.map((x, i) => [x, i]).sort((p, q) => q[0] - p[0]);
      const doc: any = await getOperation('attribution_patching')!.run(nm, {
        token_ids: tokens,
        corrupted_token_ids: corrupted,
        answer: `#${ans[1]}`,
        counterfactual: `#${cf[1]}`,
        validate_scope: 'all',
      });
      const v = doc.validation;
      const gap = Math.abs(doc.metric.clean - doc.metric.corrupted);
      const big = v.sites.filter((x: any) => Math.abs(x.actual) > 0.1 * gap);
      const rel = big.map((x: any) => Math.abs(x.estimate - x.actual) / Math.abs(x.actual));
      const later = big.filter((x: any) => x.position > 3 && linear.includes(x.layer) && x.hook.endsWith('attn_out'));
      console.log(
        `qwen3_5 AtP, small corruption: gap ${gap.toFixed(4)}, ${big.length} sites with |actual| > 10% of it ` +
          `(${later.length} linear-attention outputs after the corrupted position), worst relative ` +
          `|estimate − actual| ${Math.max(...rel).toFixed(4)}; ρ sites ${v.rank_correlation.sites.toFixed(3)}, ` +
          `heads ${v.rank_correlation.heads.toFixed(3)}`,
      );
      expect(later.length).toBeGreaterThan(0);
      expect(Math.max(...rel)).toBeLessThan(0.1);
      expect(v.rank_correlation.sites).toBeGreaterThan(0.9);
    } finally {
      await nm.dispose();
      near.cleanup();
    }
  }, 120_000);

  it('integrated_gradients through the delta rule: each attribution equals its float64 Riemann sum of central differences', async () => {
    const T = tokens.length;
    const corrupted = tokens.slice();
    corrupted[3] = tokens[7];
    const steps = 6;
    const doc: any = await getOperation('integrated_gradients')!.run(model, {
      token_ids: tokens,
      corrupted_token_ids: corrupted,
      steps,
    });
    expect(schemaErrors('integrated_gradients', viaJson(doc))).toEqual([]);
    const [a, cf] = [doc.answer.token_id, doc.counterfactual.token_id];
    const hook = 'blocks.0.hook_resid_pre';
    const x = qwen35Forward(m, tokens).hooks[hook].data;
    const x0 = qwen35Forward(m, corrupted).hooks[hook].data;
    // M with x' + α(x − x') + e·(x − x') at one position: a[pos] = (1/n) Σ_k ∂/∂e at α_k = k/n
    const M = (alpha: number, pos: number, e: number) => {
      const at = (v: Float64Array) =>
        v.map((_, i) => x0[i] + (alpha + (Math.floor(i / D) === pos ? e : 0)) * (x[i] - x0[i]));
      const row = lastRow(
        qwen35Forward(m, tokens, { hook: (n, v) => (n === hook ? at(v) : undefined) }).logits.data,
        T,
      );
      return row[a] - row[cf];
    };
    let worst = 0;
    let largest = 0;
    for (let pos = 0; pos < T; pos++) {
      let want = 0;
      for (let k = 1; k <= steps; k++) want += (M(k / steps, pos, 1e-5) - M(k / steps, pos, -1e-5)) / 2e-5 / steps;
      const got = doc.attributions[pos].attribution;
      worst = Math.max(worst, Math.abs(got - want) / Math.max(1, Math.abs(want)));
      largest = Math.max(largest, Math.abs(want));
    }
    console.log(
      `qwen3_5 IG (${steps} steps, corrupted baseline): worst |attribution − float64| ${worst.toExponential(2)} ` +
        `(largest attribution ${largest.toFixed(3)}), Riemann-sum error (completeness) ${doc.completeness.error.toExponential(2)}`,
    );
    expect(largest).toBeGreaterThan(0.1);
    expect(worst).toBeLessThan(1e-4);
  }, 120_000);
});
