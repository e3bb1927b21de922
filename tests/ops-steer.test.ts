/**
 * `steer` on stories260K against the independent float64 reference forward (tests/reference):
 *  - α = 0: steered generation = base generation = an unsteered generate; every delta ≈ 0;
 *  - α ≠ 0: every reported log-prob (base, steered, deltas, KL, resid norm) equals the reference
 *    forward with the same resid_pre edit within 1e-4, for a token direction at all positions, a
 *    given vector at chosen positions, and a mean-difference direction (whose vector and norm the
 *    test recomputes from the reference's own activations);
 *  - the steered greedy text equals the reference's greedy decoding with the edit at every position;
 *  - caps and bad inputs fail before any engine run; progress and cancellation.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel, RunOptions } from '../src/engine/api';
import { generateTokens } from '../src/ops/lib/generation';
import { operation as steer } from '../src/ops/steer';
import { loadModelDir, referenceForward, lastLogits, argmax, type RefModel, logSoftmax64 } from './reference';
import { schemaErrors, viaJson } from './schema-helpers';
import { SHARED } from './helpers/shared';
import type { OperationDocument } from '../src/ops/index';
type SteerDocument = OperationDocument<'steer'>;

const DIR = SHARED + '/models/stories260K';
const TOL = 1e-4;
const PROMPT = 'Once upon a time, there was a';

let model: LoadedModel;
let ref: RefModel;
beforeAll(async () => {
  model = await loadModelNode(DIR);
  ref = loadModelDir(DIR);
});
afterAll(async () => {
  await model?.dispose();
});

// ---------------------------------------------------------------- float64 oracle helpers (no src/ math)

/** unembedding column of token a, read from lm_head.weight [V, D] */
function wuCol(a: number): Float64Array {
  const t = ref.tensors['lm_head.weight'];
  const D = t.dims[1];
  return Float64Array.from({ length: D }, (_, j) => t.data[a * D + j]);
}

function unit(v: Float64Array): { v: Float64Array; norm: number } {
  const norm = Math.sqrt(v.reduce((a, b) => a + b * b, 0));
  return { v: v.map((x) => x / norm), norm };
}

/** reference forward with resid_pre[layer] += alpha·d at positions (all when undefined) */
function refSteered(tokens: number[], layer: number, d: Float64Array, alpha: number, positions?: number[]) {
  const name = `blocks.${layer}.hook_resid_pre`;
  return referenceForward(ref, tokens, {
    record: (n) => n === name,
    hook: (n, value, dims) => {
      if (n !== name) return;
      const [, T, D] = dims;
      const out = Float64Array.from(value);
      for (let t = 0; t < T; t++) {
        if (positions && !positions.includes(t)) continue;
        for (let j = 0; j < D; j++) out[t * D + j] += alpha * d[j];
      }
      return out;
    },
  });
}

function refGreedySteered(tokens: number[], n: number, layer: number, d: Float64Array, alpha: number): number[] {
  const seq = tokens.slice();
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const next = argmax(lastLogits(refSteered(seq, layer, d, alpha)));
    out.push(next);
    seq.push(next);
  }
  return out;
}

/** compare every number of a steer document with the reference; returns the worst |Δ| */
function checkAgainstReference(doc: SteerDocument, d: Float64Array, positions?: number[]): number {
  const ids = doc.tokens.map((t) => t.id);
  const base = refSteered(ids, doc.layer, d, 0);
  const baseLp = logSoftmax64(lastLogits(base));
  const stLp = logSoftmax64(lastLogits(refSteered(ids, doc.layer, d, doc.alpha, positions)));
  let worst = 0;
  const near = (got: number, want: number, what: string) => {
    worst = Math.max(worst, Math.abs(got - want));
    expect(Math.abs(got - want), `${what}: ${got} vs ${want}`).toBeLessThan(TOL);
  };
  for (const t of [...doc.targets, ...doc.controls]) {
    near(t.base_logprob, baseLp[t.token_id], `base logprob of ${t.token}`);
    near(t.steered_logprob, stLp[t.token_id], `steered logprob of ${t.token}`);
    near(t.delta, stLp[t.token_id] - baseLp[t.token_id], `delta of ${t.token}`);
  }
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const td = mean(doc.targets.map((t) => stLp[t.token_id] - baseLp[t.token_id]));
  const cd = mean(doc.controls.map((t) => stLp[t.token_id] - baseLp[t.token_id]));
  near(doc.target_logprob_delta, td, 'target_logprob_delta');
  near(doc.control_logprob_delta, cd, 'control_logprob_delta');
  near(doc.normalized_effect, td - cd, 'normalized_effect');
  let kl = 0;
  for (let v = 0; v < baseLp.length; v++) kl += Math.exp(baseLp[v]) * (baseLp[v] - stLp[v]);
  near(doc.kl_from_base, kl, 'kl_from_base');
  // resid norm: mean over non-BOS positions of ‖resid_pre‖
  const r = base.hooks[`blocks.${doc.layer}.hook_resid_pre`];
  const [, T, D] = r.dims;
  let s = 0;
  for (let t = 1; t < T; t++)
    s += Math.sqrt(Array.from({ length: D }, (_, j) => r.data[t * D + j] ** 2).reduce((a, b) => a + b, 0));
  near(doc.resid_norm, s / (T - 1), 'resid_norm');
  return worst;
}

/** a model wrapper that counts engine runs */
function counting(): { m: LoadedModel; runs: () => number } {
  let n = 0;
  const m = Object.create(model) as LoadedModel;
  m.run = (t: number[] | number[][], o?: RunOptions) => {
    n++;
    return model.run(t, o);
  };
  return { m, runs: () => n };
}

describe('steer', () => {
  it('α = 0: steered = base = plain generation, and every delta is ~0', async () => {
    const doc = await steer.run(
      model,
      { prompt: PROMPT, layer: 2, direction: 'tokens: happy - big', alpha: 0, max_new_tokens: 24, stop_at_eos: false },
      {},
    );
    const plain = await generateTokens(
      model,
      doc.tokens.map((t) => t.id),
      { maxNewTokens: 24, stopAtEos: false },
    );
    expect(doc.steered.generated_token_ids).toEqual(doc.base.generated_token_ids);
    expect(doc.base.generated_token_ids).toEqual(plain.ids);
    expect(doc.steered.generated_text).toBe(plain.text);
    expect(Math.abs(doc.target_logprob_delta)).toBeLessThan(1e-5);
    expect(Math.abs(doc.control_logprob_delta)).toBeLessThan(1e-5);
    expect(doc.kl_from_base).toBeLessThan(1e-6);
    expect(schemaErrors('steer', viaJson(doc))).toEqual([]);
    // sampled too: same seed, α = 0 → same tokens
    const s = await steer.run(
      model,
      {
        prompt: PROMPT,
        layer: 2,
        direction: 'random:4',
        alpha: 0,
        max_new_tokens: 24,
        temperature: 1,
        seed: 9,
        stop_at_eos: false,
      },
      {},
    );
    expect(s.steered.generated_token_ids).toEqual(s.base.generated_token_ids);
  });

  it("token direction, all positions: numbers equal the float64 reference; greedy text equals the reference's", async () => {
    const doc = await steer.run(
      model,
      { prompt: PROMPT, layer: 2, direction: 'tokens: happy - big', alpha: 4, max_new_tokens: 12, stop_at_eos: false },
      {},
    );
    const happy = model.tokenId(' happy')!;
    const big = model.tokenId(' big')!;
    const raw = wuCol(happy).map((x, j) => x - wuCol(big)[j]);
    const { v: d, norm } = unit(raw);
    expect(Math.abs(doc.direction.raw_norm - norm)).toBeLessThan(1e-5);
    expect(doc.targets.map((t) => t.token_id)).toEqual([happy]);
    const worst = checkAgainstReference(doc, d);
    // the edit must matter, or agreement proves little
    expect(Math.abs(doc.target_logprob_delta)).toBeGreaterThan(0.5);
    expect(doc.steered.generated_token_ids).not.toEqual(doc.base.generated_token_ids);
    // steering applies at every generated position too: the reference re-decodes with the edit everywhere
    expect(doc.steered.generated_token_ids).toEqual(
      refGreedySteered(
        doc.tokens.map((t) => t.id),
        12,
        2,
        d,
        4,
      ),
    );
    console.log(
      `steer tokens/all: target Δ ${doc.target_logprob_delta.toFixed(4)}, control Δ ${doc.control_logprob_delta.toFixed(4)}, worst |Δ| vs reference ${worst.toExponential(2)}`,
    );
    expect(schemaErrors('steer', viaJson(doc))).toEqual([]);
  });

  it('given vector at chosen positions, and unnormalised: numbers equal the reference', async () => {
    const D = model.info.d_model;
    const values = Array.from({ length: D }, (_, j) => Math.sin(j * 1.7) + 0.3 * Math.cos(j * 0.3));
    const doc = await steer.run(
      model,
      {
        prompt: PROMPT,
        layer: 1,
        direction: { kind: 'vector', values },
        normalize: false,
        alpha: -1.5,
        positions: [3, 8],
        targets: [' little', ' happy'],
        controls: [' the', ' and', '#300'],
        max_new_tokens: 4,
      },
      {},
    );
    expect(doc.direction.normalized).toBe(false);
    const worst = checkAgainstReference(doc, Float64Array.from(values), [3, 8]);
    expect(Math.abs(doc.normalized_effect)).toBeGreaterThan(0.05);
    console.log(
      `steer vector/[3,8]: normalized effect ${doc.normalized_effect.toFixed(4)}, worst |Δ| ${worst.toExponential(2)}`,
    );
  });

  it("mean-difference direction: vector and norm from the reference's activations; numbers equal the reference", async () => {
    const pos = ['Lily was happy', 'Tim was very happy', 'The girl was happy'];
    const neg = ['Lily was big', 'Tim was very big', 'The girl was big'];
    const layer = 3;
    const doc = await steer.run(
      model,
      {
        prompt: 'One day, Tim was',
        layer,
        direction: { kind: 'mean_diff', positive: pos, negative: neg },
        alpha: 3,
        max_new_tokens: 4,
        targets: [' happy'],
        controls: [' the', ' a', ' to'],
      },
      {},
    );
    const name = `blocks.${layer}.hook_resid_pre`;
    const D = model.info.d_model;
    const lastAct = (p: string) => {
      const h = referenceForward(ref, model.tokenize(p), { record: (n) => n === name }).hooks[name];
      const T = h.dims[1];
      return h.data.slice((T - 1) * D, T * D);
    };
    const raw = new Float64Array(D);
    for (const p of pos)
      lastAct(p).forEach((x, j) => {
        raw[j] += x / pos.length;
      });
    for (const p of neg)
      lastAct(p).forEach((x, j) => {
        raw[j] -= x / neg.length;
      });
    const { v: d, norm } = unit(raw);
    expect(Math.abs(doc.direction.raw_norm - norm) / norm).toBeLessThan(1e-4);
    const worst = checkAgainstReference(doc, d);
    console.log(
      `steer mean_diff: ‖d‖ ${norm.toFixed(4)}, target Δ ${doc.target_logprob_delta.toFixed(4)}, worst |Δ| ${worst.toExponential(2)}`,
    );
  });

  it('bad inputs and caps fail before any engine run', async () => {
    const { m, runs } = counting();
    const base = { prompt: PROMPT, layer: 2, direction: 'tokens: happy - big', alpha: 1 };
    await expect(steer.run(m, { ...base, max_new_tokens: 300 }, {})).rejects.toMatchObject({ code: 'TOO_LARGE' });
    await expect(steer.run(m, { ...base, layer: 9 }, {})).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await expect(steer.run(m, { ...base, direction: 'tokens: happy - elephant' }, {})).rejects.toMatchObject({
      code: 'UNKNOWN_TOKEN',
    });
    await expect(steer.run(m, { ...base, targets: [' sad'] }, {})).rejects.toMatchObject({ code: 'UNKNOWN_TOKEN' });
    await expect(steer.run(m, { ...base, direction: { kind: 'vector', values: [1, 2, 3] } }, {})).rejects.toMatchObject(
      { code: 'BAD_INPUT' },
    );
    await expect(steer.run(m, { ...base, positions: [40] }, {})).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await expect(steer.run(m, { ...base, direction: 'probe:nope' }, {})).rejects.toMatchObject({
      code: 'HANDLE_EXPIRED',
    });
    await expect(steer.run(m, { ...base, direction: 'sideways' }, {})).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await expect(steer.run(m, { ...base, alpha: 'big' } as never, {})).rejects.toMatchObject({ code: 'BAD_INPUT' });
    expect(runs()).toBe(0);
  });

  it('reports progress and honours cancellation between engine runs', async () => {
    const stages = new Set<string>();
    await steer.run(
      model,
      { prompt: PROMPT, layer: 2, direction: 'random:1', alpha: 2, max_new_tokens: 5 },
      { onProgress: (p) => stages.add(p.stage) },
    );
    expect([...stages]).toEqual(['base run', 'generating']);
    const ac = new AbortController();
    const { m, runs } = counting();
    const p = steer.run(
      m,
      { prompt: PROMPT, layer: 2, direction: 'random:1', alpha: 2, max_new_tokens: 50, stop_at_eos: false },
      {
        signal: ac.signal,
        onProgress: (q) => {
          if (q.stage === 'generating' && q.done === 2) ac.abort();
        },
      },
    );
    await expect(p).rejects.toMatchObject({ code: 'ABORTED' });
    expect(runs()).toBeLessThan(6);
  });
});

describe('steer on a LayerNorm model (induction-gpt2)', () => {
  const GDIR = SHARED + '/models/induction-gpt2';
  let g: LoadedModel;
  let gref: RefModel;
  beforeAll(async () => {
    g = await loadModelNode(GDIR);
    gref = loadModelDir(GDIR);
  });
  afterAll(async () => {
    await g?.dispose();
  });

  it('token direction at layer 1: log-prob deltas and the steered greedy text equal the float64 reference', async () => {
    const doc = await steer.run(
      g,
      { prompt: 'xqzkwxqzk', layer: 1, direction: 'tokens: a - w', alpha: 3, max_new_tokens: 8, stop_at_eos: false },
      {},
    );
    expect(schemaErrors('steer', viaJson(doc))).toEqual([]);
    const a = g.tokenId('a')!;
    const w = g.tokenId('w')!;
    const E = gref.tensors['transformer.wte.weight'];
    const D = E.dims[1];
    const raw = Float64Array.from({ length: D }, (_, j) => E.data[a * D + j] - E.data[w * D + j]);
    const { v: d } = unit(raw);
    const ids = doc.tokens.map((t) => t.id);
    const name = 'blocks.1.hook_resid_pre';
    const fwd = (seq: number[], alpha: number) =>
      referenceForward(gref, seq, {
        record: false,
        hook: (n, value, dims) => {
          if (n !== name) return;
          const out = Float64Array.from(value);
          for (let t = 0; t < dims[1]; t++) for (let j = 0; j < D; j++) out[t * D + j] += alpha * d[j];
          return out;
        },
      });
    const b = logSoftmax64(lastLogits(fwd(ids, 0)));
    const s = logSoftmax64(lastLogits(fwd(ids, 3)));
    expect(Math.abs(doc.target_logprob_delta - (s[a] - b[a]))).toBeLessThan(TOL);
    for (const c of doc.controls) expect(Math.abs(c.delta - (s[c.token_id] - b[c.token_id]))).toBeLessThan(TOL);
    expect(doc.target_logprob_delta).toBeGreaterThan(0.1);
    const seq = ids.slice();
    const want: number[] = [];
    for (let i = 0; i < 8; i++) {
      const nx = argmax(lastLogits(fwd(seq, 3)));
      want.push(nx);
      seq.push(nx);
    }
    expect(doc.steered.generated_token_ids).toEqual(want);
    console.log(
      `gpt2 steer 'a' − 'w' @L1: target Δ ${doc.target_logprob_delta.toFixed(4)}; base ${JSON.stringify(doc.base.generated_text)} → steered ${JSON.stringify(doc.steered.generated_text)}`,
    );
  });
});
