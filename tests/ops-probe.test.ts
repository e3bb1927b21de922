/**
 * `capture` + `probe` (and their math) on stories260K.
 *
 * The synthetic set: 120 prompts "{name} was {happy|big} and {ending}" (12 names × 5 endings × 2
 * adjectives), label 1 = happy. Captured at the FINAL position, so the label is not the token
 * there: the information has to be moved to the last position by attention.
 *  - blocks.4.hook_resid_pre: held-out AUROC ≥ 0.95 (30 held-out samples, 15 per class);
 *  - blocks.0.hook_resid_pre (only the final token's embedding, which is independent of the label):
 *    held-out AUROC < 0.8 — a structural negative control;
 *  - shuffled labels: over 20 seeds the mean held-out AUROC is in [0.4, 0.6] (one AUROC on 30
 *    samples has s.d. ≈ 0.1, so the mean of 20 has s.d. ≈ 0.025) and each in [0.15, 0.85];
 *  - the probe's weights are in the raw basis: x·w + b from fresh engine activations equals the
 *    reported logit; the probe handle steers exactly like the same vector given as numbers.
 * Plus the probe math (AUROC, a Newton fit checked against plain gradient descent in both solver
 * regimes, the split) and the handle store (limit, eviction, expiry).
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel, RunOptions } from '../src/engine/api';
import { operation as capture } from '../src/ops/capture';
import { operation as probe } from '../src/ops/probe';
import { operation as steer } from '../src/ops/steer';
import { MemoryHandleStore } from '../src/ops/lib/handle-store';
import { accuracy, auroc, fitLogistic, stratifiedSplit } from '../src/ops/lib/probe-math';
import { rng, gaussian } from '../src/ops/lib/math';
import { schemaErrors, viaJson } from './schema-helpers';
import { SHARED } from './helpers/shared';

const names = ['Lily', 'Tim', 'Timmy', 'Sue', 'Ben', 'Anna', 'Max', 'Mia', 'Sam', 'Tom', 'Jack', 'Lucy'];
const endings = ['went to the park', 'said hello to mom', 'ran home', 'played all day', 'saw a bird'];
const PROMPTS = names.flatMap((n) =>
  endings.flatMap((e) => [
    { text: `${n} was happy and ${e}`, label: 1 },
    { text: `${n} was big and ${e}`, label: 0 },
  ]),
);

let model: LoadedModel;
let store: MemoryHandleStore;
let captureHandle: string;
beforeAll(async () => {
  model = await loadModelNode(SHARED + '/models/stories260K');
  store = new MemoryHandleStore();
  const doc = await capture.run(
    model,
    { prompts: PROMPTS, hooks: ['blocks.0.hook_resid_pre', 'blocks.4.hook_resid_pre'] },
    { store },
  );
  captureHandle = doc.handle;
});
afterAll(async () => {
  await model?.dispose();
});

describe('capture + probe', () => {
  it('capture: a handle, dims, label counts, a valid document', async () => {
    const doc = await capture.run(
      model,
      { prompts: PROMPTS.slice(0, 6), hooks: ['blocks.2.hook_resid_post', 'blocks.1.mlp.hook_post'], position: 'mean' },
      { store },
    );
    expect(schemaErrors('capture', viaJson(doc))).toEqual([]);
    expect(doc.hooks.map((h) => h.dim)).toEqual([model.info.d_model, model.info.d_mlp]);
    expect(doc.label_counts).toEqual([
      { label: 1, count: 3 },
      { label: 0, count: 3 },
    ]);
    expect(doc.bytes).toBe(6 * (64 + 172) * 4);
    expect(doc.handle).toMatch(/^capture_[0-9a-f]{24}$/);
  });

  it('separable set: held-out AUROC ≥ 0.95 at layer 4; the embedding-only layer 0 cannot tell', async () => {
    const doc = await probe.run(model, { capture: captureHandle, hook: 'blocks.4.hook_resid_pre' }, { store });
    expect(schemaErrors('probe', viaJson(doc))).toEqual([]);
    expect(doc.n_test).toBe(30);
    expect(doc.n_train).toBe(90);
    expect(doc.auroc!).toBeGreaterThanOrEqual(0.95);
    expect(doc.accuracy!).toBeGreaterThanOrEqual(0.9);
    expect(doc.fit.converged).toBe(true);
    const l0 = await probe.run(model, { capture: captureHandle, hook: 'blocks.0.hook_resid_pre' }, { store });
    expect(l0.auroc!).toBeLessThan(0.8);
    // deterministic: the same call gives the same numbers
    const again = await probe.run(model, { capture: captureHandle, hook: 'blocks.4.hook_resid_pre' }, { store });
    expect(again.direction.values).toEqual(doc.direction.values);
    expect(again.auroc).toBe(doc.auroc);
    console.log(
      `probe happy/big @ last position: layer 4 AUROC ${doc.auroc} acc ${doc.accuracy} (shuffled control ${doc.shuffled_control.auroc?.toFixed(3)}); layer 0 AUROC ${l0.auroc?.toFixed(3)}`,
    );
  });

  it('shuffled labels: AUROC ≈ 0.5', async () => {
    const a: number[] = [];
    for (let seed = 0; seed < 20; seed++) {
      const doc = await probe.run(
        model,
        { capture: captureHandle, hook: 'blocks.4.hook_resid_pre', shuffle_labels: true, seed },
        { store },
      );
      expect(doc.shuffled_labels).toBe(true);
      a.push(doc.auroc!);
    }
    const mean = a.reduce((x, y) => x + y, 0) / a.length;
    console.log(
      `shuffled-label AUROC over 20 seeds: mean ${mean.toFixed(3)}, range ${Math.min(...a).toFixed(2)}–${Math.max(...a).toFixed(2)}`,
    );
    expect(mean).toBeGreaterThan(0.4);
    expect(mean).toBeLessThan(0.6);
    for (const x of a) {
      expect(x).toBeGreaterThan(0.15);
      expect(x).toBeLessThan(0.85);
    }
  });

  it('weights are in the raw basis: x·w + b from fresh activations equals the reported logit', async () => {
    const doc = await probe.run(model, { capture: captureHandle, hook: 'blocks.4.hook_resid_pre' }, { store });
    const D = model.info.d_model;
    for (const i of [0, 1, 57, 119]) {
      const ids = model.tokenize(PROMPTS[i].text);
      const h = (await model.run(ids, { hooks: ['blocks.4.hook_resid_pre'] })).hooks['blocks.4.hook_resid_pre'].data;
      const T = ids.length;
      let z = doc.bias;
      for (let j = 0; j < D; j++) z += h[(T - 1) * D + j] * doc.direction.values[j];
      expect(Math.abs(z - doc.samples[i].logit)).toBeLessThan(1e-3 * Math.max(1, Math.abs(z)));
      expect(doc.samples[i].y).toBe(PROMPTS[i].label);
    }
  });

  it('the probe direction feeds steer: "probe:<handle>" steers exactly like its weights given as numbers', async () => {
    const doc = await probe.run(model, { capture: captureHandle, hook: 'blocks.4.hook_resid_pre' }, { store });
    const base = {
      prompt: 'Tim was',
      layer: 4,
      alpha: 3,
      targets: [' happy'],
      controls: [' the', ' a'],
      max_new_tokens: 6,
    };
    const viaProbe = await steer.run(model, { ...base, direction: `probe:${doc.handle}` }, { store });
    const viaVector = await steer.run(
      model,
      { ...base, direction: { kind: 'vector', values: doc.direction.values } },
      { store },
    );
    expect(viaProbe.direction.kind).toBe('probe');
    expect(viaProbe.direction.hook).toBe('blocks.4.hook_resid_pre');
    expect(Math.abs(viaProbe.direction.raw_norm - doc.direction.norm)).toBeLessThan(1e-9 * doc.direction.norm);
    expect(viaProbe.target_logprob_delta).toBe(viaVector.target_logprob_delta);
    expect(viaProbe.steered.generated_token_ids).toEqual(viaVector.steered.generated_token_ids);
    expect(viaProbe.target_logprob_delta).not.toBe(0);
  });

  it('errors: caps and the store limit before any run, unknown hooks, labels, expired handles', async () => {
    let n = 0;
    const m = Object.create(model) as LoadedModel;
    m.run = (t: number[] | number[][], o?: RunOptions) => {
      n++;
      return model.run(t, o);
    };
    const many = Array.from({ length: 1025 }, (_, i) => ({ text: `Tim ${i}`, label: i % 2 }));
    await expect(capture.run(m, { prompts: many }, { store })).rejects.toMatchObject({ code: 'TOO_LARGE' });
    const tiny = new MemoryHandleStore({ maxBytes: 1000 });
    await expect(capture.run(m, { prompts: PROMPTS }, { store: tiny })).rejects.toMatchObject({ code: 'TOO_LARGE' });
    await expect(
      capture.run(m, { prompts: PROMPTS, hooks: ['blocks.9.hook_resid_pre'] }, { store }),
    ).rejects.toMatchObject({ code: 'UNKNOWN_HOOK' });
    await expect(
      capture.run(m, { prompts: PROMPTS, hooks: ['blocks.1.attn.hook_pattern'] }, { store }),
    ).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await expect(capture.run(m, { prompts: PROMPTS, position: 40 }, { store })).rejects.toMatchObject({
      code: 'BAD_INPUT',
    });
    expect(n).toBe(0);
    await expect(probe.run(model, { capture: 'capture_000' }, { store })).rejects.toMatchObject({
      code: 'HANDLE_EXPIRED',
    });
    const unl = await capture.run(model, { prompts: ['a b', 'c d', 'e f', 'g h'] }, { store });
    await expect(probe.run(model, { capture: unl.handle }, { store })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    const three = await capture.run(
      model,
      { prompts: ['a', 'b', 'c', 'd', 'e', 'f'].map((t, i) => ({ text: t, label: ['x', 'y', 'z'][i % 3] })) },
      { store },
    );
    await expect(probe.run(model, { capture: three.handle }, { store })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    const one = await capture.run(
      model,
      {
        prompts: [
          { text: 'a', label: 'x' },
          { text: 'b', label: 'y' },
          { text: 'c', label: 'y' },
        ],
      },
      { store },
    );
    await expect(probe.run(model, { capture: one.handle }, { store })).rejects.toMatchObject({ code: 'BAD_INPUT' });
  });
});

describe('probe math', () => {
  it('AUROC and accuracy on known cases', () => {
    expect(auroc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1])).toBe(1);
    expect(auroc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1])).toBe(0);
    expect(auroc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1])).toBe(0.5);
    // one positive ranked below one of two negatives: 3 of 4 pairs ordered
    expect(auroc([0.1, 0.6, 0.5, 0.9], [0, 0, 1, 1])).toBe(0.75);
    expect(Number.isNaN(auroc([0.1, 0.2], [1, 1]))).toBe(true);
    expect(accuracy([0.2, 0.7, 0.5, 0.4], [0, 1, 0, 0])).toBe(0.75);
  });

  /** an independent solver: plain gradient descent on the same objective */
  function gd(X: Float64Array, y: number[], n: number, d: number, l2: number): { w: Float64Array; b: number } {
    const w = new Float64Array(d);
    let b = 0;
    for (let it = 0; it < 40000; it++) {
      const gw = new Float64Array(d);
      let gb = 0;
      for (let i = 0; i < n; i++) {
        let z = b;
        for (let j = 0; j < d; j++) z += X[i * d + j] * w[j];
        const r = (1 / (1 + Math.exp(-z)) - y[i]) / n;
        gb += r;
        for (let j = 0; j < d; j++) gw[j] += X[i * d + j] * r;
      }
      for (let j = 0; j < d; j++) w[j] -= 0.5 * (gw[j] + l2 * w[j]);
      b -= 0.5 * gb;
    }
    return { w, b };
  }

  it.each([
    [40, 5],
    [12, 30],
  ])('Newton fit equals gradient descent (n = %i, d = %i: direct and Woodbury solves)', (n, d) => {
    const u = rng(n * 100 + d);
    const X = new Float64Array(n * d);
    for (let i = 0; i < X.length; i++) X[i] = gaussian(u);
    const y = Array.from({ length: n }, (_, i) => (X[i * d] + 0.5 * gaussian(u) > 0 ? 1 : 0));
    const l2 = 0.1;
    const fit = fitLogistic(X, y, n, d, { l2 });
    const ref = gd(X, y, n, d, l2);
    expect(fit.converged).toBe(true);
    for (let j = 0; j < d; j++) expect(Math.abs(fit.w[j] - ref.w[j])).toBeLessThan(1e-5);
    expect(Math.abs(fit.b - ref.b)).toBeLessThan(1e-5);
  });

  it('stratified split: per-class shares, deterministic, both classes in both splits', () => {
    const labels = [...Array(20).fill(1), ...Array(40).fill(0)];
    const a = stratifiedSplit(labels, 0.25, 3);
    expect(a.test.filter((i) => labels[i] === 1)).toHaveLength(5);
    expect(a.test.filter((i) => labels[i] === 0)).toHaveLength(10);
    expect(a).toEqual(stratifiedSplit(labels, 0.25, 3));
    expect(stratifiedSplit(labels, 0.25, 4)).not.toEqual(a);
    expect(new Set([...a.train, ...a.test]).size).toBe(60);
    expect(() => stratifiedSplit([1, 0, 0], 0.5, 0)).toThrow();
  });
});

describe('handle store', () => {
  it('byte limit with LRU eviction, expiry after disuse, kinds kept apart', () => {
    let t = 0;
    const s = new MemoryHandleStore({ maxBytes: 1000, ttlMs: 100, now: () => t });
    const a = s.put('capture', new Float32Array(100)); // 400 B
    const b = s.put('capture', new Float32Array(100));
    s.get('capture', a); // a is now the most recently used
    const c = s.put('probe', new Float32Array(100)); // needs room: evicts b
    expect(() => s.get('capture', b)).toThrow(expect.objectContaining({ code: 'HANDLE_EXPIRED' }));
    expect(s.get<Float32Array>('capture', a)).toHaveLength(100);
    expect(() => s.get('capture', c)).toThrow(expect.objectContaining({ code: 'HANDLE_EXPIRED' }));
    expect(() => s.put('capture', new Float32Array(300))).toThrow(expect.objectContaining({ code: 'TOO_LARGE' }));
    t = 50;
    s.get('probe', c);
    t = 120; // a unused for 120 ms, c for 70 ms
    expect(() => s.get('capture', a)).toThrow(expect.objectContaining({ code: 'HANDLE_EXPIRED' }));
    expect(s.get<Float32Array>('probe', c)).toHaveLength(100);
    expect(s.bytesUsed).toBe(400);
  });
});
