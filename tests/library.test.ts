/**
 * The library (src/library, docs/LIBRARY.md) on induction-gpt2 against independent references:
 * runWithCache against the CLI's own document and the float64 forward (tests/reference),
 * runWithHooks with a nonlinear function against the float64 forward with the same function
 * (node, WASM and WebGPU: onnxruntime-node's provider, SwiftShader without a Vulkan driver),
 * processed weights against TransformerLens's definitions applied to the engine's hooks, and bad
 * hook functions (a structured error, the model still usable).
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { execFileSync } from 'node:child_process';
import * as path from 'node:path';
import { loadModel, type Model, tensor } from '../src/library';
import { loadModelDir, referenceForward, type RefModel } from './reference';
import { SHARED } from './helpers/shared';

const DIR = path.join(SHARED, 'models/induction-gpt2');
const PROMPT = 'The cat sat on the mat. The cat sat on';
const swish = (x: number) => x / (1 + Math.exp(-x));

function maxAbs(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

let ref: RefModel;
beforeAll(() => {
  ref = loadModelDir(DIR);
});

for (const backend of ['node', 'wasm', 'webgpu'] as const) {
  describe(`library on ${backend}`, () => {
    let model: Model;
    beforeAll(async () => {
      model = await loadModel(DIR, { backend });
    });
    afterAll(async () => {
      await model?.dispose();
    });

    it('cfg has TransformerLens names and values', () => {
      expect(model.cfg).toMatchObject({
        n_layers: 2,
        d_model: 64,
        n_heads: 4,
        d_head: 16,
        d_mlp: 256,
        d_vocab: 257,
        n_ctx: 64,
        act_fn: 'gelu_new',
        normalization_type: 'LN',
        positional_embedding_type: 'standard',
        eps: 1e-5,
        device: backend,
      });
      expect(model.toStrTokens('ab')).toEqual(['<|endoftext|>', 'a', 'b']);
      expect(model.toStr(model.toTokens('hello')[0].slice(1))).toBe('hello');
    });

    it('runWithCache returns the hooks asked for, equal to the float64 forward within 1e-4', async () => {
      const tokens = model.toTokens(PROMPT);
      const names = [
        'blocks.0.attn.hook_pattern',
        'blocks.1.hook_resid_mid',
        'blocks.1.mlp.hook_post',
        'ln_final.hook_scale',
      ];
      const { logits, cache } = await model.runWithCache(tokens, { names });
      expect(Object.keys(cache).sort()).toEqual([...names].sort());
      const r = referenceForward(ref, tokens[0]);
      for (const n of names) {
        expect(cache[n].dims).toEqual(r.hooks[n].dims);
        expect(maxAbs(cache[n].data, r.hooks[n].data)).toBeLessThan(1e-4);
      }
      expect(logits.dims).toEqual([1, tokens[0].length, 257]);
      expect(maxAbs(logits.data, r.logits.data)).toBeLessThan(1e-4);
      // a predicate (TL's names_filter)
      const { cache: c2 } = await model.runWithCache(tokens, { names: (n) => n.endsWith('hook_z') });
      expect(Object.keys(c2)).toEqual(['blocks.0.attn.hook_z', 'blocks.1.attn.hook_z']);
    });

    it('runWithHooks with x·sigmoid(x) at a resid_mid equals the float64 forward with it within 1e-4', async () => {
      const tokens = model.toTokens(PROMPT);
      const hook = 'blocks.0.hook_resid_mid';
      const logits = await model.runWithHooks(tokens, { fwdHooks: [[hook, (x) => tensor.map(x, swish)]] });
      const r = referenceForward(ref, tokens[0], {
        hook: (name, v) => (name === hook ? v.map(swish) : undefined),
        record: false,
      });
      const clean = referenceForward(ref, tokens[0], { record: false });
      expect(maxAbs(logits.data, r.logits.data)).toBeLessThan(1e-4);
      expect(maxAbs(clean.logits.data, r.logits.data)).toBeGreaterThan(0.1); // the hook changes the answer
    });

    it('a batch of prompts: each row hooked as the float64 forward hooks it alone', async () => {
      const tokens = model.toTokens(['The cat sat on the mat.', 'A dog ran in the parks.']);
      expect(tokens.map((r) => r.length)).toEqual([24, 24]);
      const hook = 'blocks.1.hook_resid_mid';
      const logits = await model.runWithHooks(tokens, { fwdHooks: [[hook, (x) => tensor.map(x, swish)]] });
      expect(logits.dims).toEqual([2, 24, 257]);
      tokens.forEach((row, b) => {
        const r = referenceForward(ref, row, {
          hook: (n, v) => (n === hook ? v.map(swish) : undefined),
          record: false,
        });
        expect(maxAbs(tensor.at(logits, b).data, r.logits.data)).toBeLessThan(1e-4);
      });
    });

    it('several hooks compose in forward order, in-place edits count, reading hooks cost nothing', async () => {
      const tokens = model.toTokens(PROMPT);
      const seen: string[] = [];
      let runs = 0;
      const run = model.engine.run.bind(model.engine);
      model.engine.run = (t, o) => (runs++, run(t, o));
      const logits = await model.runWithHooks(tokens, {
        fwdHooks: [
          ['blocks.1.hook_resid_mid', (x) => tensor.map(x, swish)],
          [(n) => n === 'blocks.1.attn.hook_pattern', (_x, { hook }) => void seen.push(hook)],
          [
            'blocks.0.attn.hook_z',
            (z) => {
              // TL idiom: zero head 1 in place, return nothing
              for (let i = 0; i < z.data.length; i++) if (Math.floor(i / 16) % 4 === 1) z.data[i] = 0;
            },
          ],
          ['blocks.1.hook_resid_mid', (x) => tensor.map(x, (v) => 0.5 * v)],
        ],
      });
      model.engine.run = run;
      expect(seen).toEqual(['blocks.1.attn.hook_pattern']);
      expect(runs).toBe(3); // one forward, then one after each of the two sites whose value changed
      const r = referenceForward(ref, tokens[0], {
        hook: (name, v) => {
          if (name === 'blocks.0.attn.hook_z') return v.map((x, i) => (Math.floor(i / 16) % 4 === 1 ? 0 : x));
          if (name === 'blocks.1.hook_resid_mid') return v.map((x) => 0.5 * swish(x));
        },
        record: false,
      });
      expect(maxAbs(logits.data, r.logits.data)).toBeLessThan(1e-4);
    });

    it('a bad hook function is HOOK_FAILED naming the hook; unknown names suggest the nearest; the model stays usable', async () => {
      const tokens = model.toTokens(PROMPT);
      const hook = 'blocks.0.hook_resid_mid';
      const cases: [string, (x: tensor.Tensor) => unknown, RegExp][] = [
        [
          'throws',
          () => {
            throw new Error('boom');
          },
          /threw: boom/,
        ],
        ['wrong shape', (x) => ({ dims: [1, 2], data: x.data.slice(0, 2) }), /shape \[1,2\]/],
        ['wrong size', () => new Float32Array(3), /returned 3 values/],
        ['wrong dtype', (x) => ({ dims: x.dims, data: new Int32Array(x.data.length) }), /Int32Array/],
        ['NaN', (x) => tensor.map(x, (v, i) => (i === 5 ? NaN : v)), /NaN at flat index 5/],
        ['a string', () => 'x', /returned string/],
        ['a promise', async (x: tensor.Tensor) => x, /Promise/],
      ];
      for (const [what, fn, msg] of cases) {
        const e = await model.runWithHooks(tokens, { fwdHooks: [[hook, fn as never]] }).then(
          () => null,
          (err) => err,
        );
        expect(e, what).toMatchObject({ code: 'HOOK_FAILED', details: { hook } });
        expect(e.message, what).toContain(hook);
        expect(e.message, what).toMatch(msg);
      }
      const u = await model.runWithHooks(tokens, { fwdHooks: [['blocks.0.hook_resid_mdi', (x) => x]] }).catch((e) => e);
      expect(u.code).toBe('UNKNOWN_HOOK');
      expect(u.details.nearest[0]).toBe('blocks.0.hook_resid_mid');
      const ro = await model
        .runWithHooks(tokens, { fwdHooks: [['blocks.0.attn.hook_attn_scores', (x) => tensor.map(x, () => 0)]] })
        .catch((e) => e);
      expect(ro).toMatchObject({ code: 'HOOK_FAILED' });
      expect(ro.message).toMatch(/read-only/);
      // still usable: a clean run equals the reference
      const { logits } = await model.runWithCache(tokens, { names: [] });
      expect(maxAbs(logits.data, referenceForward(ref, tokens[0], { record: false }).logits.data)).toBeLessThan(1e-4);
    });
  });
}

describe('library: the CLI document and processed weights (node)', () => {
  let model: Model;
  beforeAll(async () => {
    model = await loadModel(DIR);
  });
  afterAll(async () => {
    await model?.dispose();
  });

  it("runWithCache's values equal the values the CLI's activations document reports", async () => {
    const out = execFileSync(
      process.execPath,
      [
        path.resolve(__dirname, '../bin/loupe.mjs'),
        'activations',
        DIR,
        PROMPT,
        '--json',
        '--quiet',
        '--values-layer',
        '1',
      ],
      { encoding: 'utf8' },
    );
    const doc = JSON.parse(out);
    const { cache } = await model.runWithCache(PROMPT, {
      names: ['blocks.1.mlp.hook_post', 'blocks.0.hook_resid_post'],
    });
    const grid = doc.values.grid as number[][];
    expect(doc.values.hook).toBe('blocks.1.mlp.hook_post');
    expect(maxAbs(cache['blocks.1.mlp.hook_post'].data, grid.flat())).toBeLessThan(1e-6);
    const site = doc.layers[0].sites.find((s: { hook: string }) => s.hook === 'blocks.0.hook_resid_post');
    const v = cache['blocks.0.hook_resid_post'].data;
    expect(site.max).toBeCloseTo(Math.max(...v), 5);
    expect(site.mean).toBeCloseTo(tensor.mean(v), 5);
    // ops as functions give the CLI's document
    const { ops } = await import('../src/library');
    const fromLib = await ops.activations(model, { prompt: PROMPT, values_layer: 1 });
    expect(fromLib.values!.grid).toEqual(doc.values.grid);
  });

  it("processed weights follow TransformerLens's fold_ln, centring and fold_value_biases", async () => {
    const tokens = model.toTokens(PROMPT);
    const { logits, cache } = await model.runWithCache(tokens, {
      names: [
        'hook_embed',
        'hook_pos_embed',
        'blocks.1.hook_resid_pre',
        'blocks.1.ln1.hook_scale',
        'blocks.1.attn.hook_q',
        'blocks.1.attn.hook_z',
        'blocks.1.hook_attn_out',
        'ln_final.hook_scale',
        'blocks.1.hook_resid_post',
      ],
    });
    const P = model.processedWeights;
    const T = tokens[0].length;
    const D = 64;
    const centred = (x: Float32Array, n: number) => {
      const out = Float64Array.from(x);
      for (let r = 0; r < out.length / n; r++) {
        let s = 0;
        for (let i = 0; i < n; i++) s += out[r * n + i];
        for (let i = 0; i < n; i++) out[r * n + i] -= s / n;
      }
      return out;
    };
    // q = (x / scale) · W_Q' + b_Q' (W_Q' centred over d_model, so x need not be)
    const x = cache['blocks.1.hook_resid_pre'].data;
    const s = cache['blocks.1.ln1.hook_scale'].data;
    const WQ = P.W_Q[1];
    const bQ = P.b_Q[1];
    const q = new Float64Array(T * 64);
    for (let t = 0; t < T; t++)
      for (let h = 0; h < 4; h++)
        for (let e = 0; e < 16; e++) {
          let acc = bQ.data[h * 16 + e];
          for (let d = 0; d < D; d++) acc += (x[t * D + d] / s[t]) * WQ.data[(h * D + d) * 16 + e];
          q[t * 64 + h * 16 + e] = acc;
        }
    expect(maxAbs(q, cache['blocks.1.attn.hook_q'].data)).toBeLessThan(1e-4);
    // centred attn_out = Σ_h (z_h − b_V'_h) · W_O'_h + b_O' (value biases folded: b_V' = b_V + b_ln1 · W_V)
    const bV = Float64Array.from(model.weights.b_V[1].data);
    const WV = model.weights.W_V[1].data;
    const bln = model.param('blocks.1.ln1.b').data;
    for (let g = 0; g < 4; g++)
      for (let d = 0; d < D; d++) for (let e = 0; e < 16; e++) bV[g * 16 + e] += bln[d] * WV[(g * D + d) * 16 + e];
    const z = cache['blocks.1.attn.hook_z'].data;
    const out = new Float64Array(T * D);
    for (let t = 0; t < T; t++)
      for (let d = 0; d < D; d++) {
        let acc = P.b_O[1].data[d];
        for (let he = 0; he < 64; he++) acc += (z[t * 64 + he] - bV[he]) * P.W_O[1].data[he * D + d];
        out[t * D + d] = acc;
      }
    expect(maxAbs(out, centred(cache['blocks.1.hook_attn_out'].data, D))).toBeLessThan(1e-4);
    expect(tensor.norm(P.b_V[1])).toBe(0);
    // centred embeddings, and logits = (resid_final / scale) · W_U' + b_U' = the centred logits
    const E = cache['hook_embed'].data;
    expect(
      maxAbs(
        centred(E, D),
        Array.from({ length: T * D }, (_, i) => P.W_E.data[tokens[0][Math.floor(i / D)] * D + (i % D)]),
      ),
    ).toBeLessThan(1e-6);
    const rf = cache['blocks.1.hook_resid_post'].data;
    const sf = cache['ln_final.hook_scale'].data;
    const V = 257;
    const lg = new Float64Array(T * V);
    for (let t = 0; t < T; t++)
      for (let v = 0; v < V; v++) {
        let acc = P.b_U.data[v];
        for (let d = 0; d < D; d++) acc += (rf[t * D + d] / sf[t]) * P.W_U.data[d * V + v];
        lg[t * V + v] = acc;
      }
    expect(maxAbs(lg, centred(logits.data, V))).toBeLessThan(1e-4);
    expect(P.W_Q[1]).toBe(WQ); // computed once and kept
    expect(Array.from(model.param('blocks.0.ln1.w', { processed: true }).data)).toEqual(new Array(D).fill(1));
  });
});
