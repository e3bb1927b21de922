/**
 * `dashboard` on induction-gpt2 (byte-level: a byte's token id is the byte) against the float64
 * reference forward (tests/reference) and float64 weights read from the model's own files:
 *  - neuron (blocks.1.mlp.hook_post), SAE feature (random SAE at blocks.1.hook_resid_pre,
 *    float64 encoder) and direction (random v at blocks.0.hook_resid_post): every window's
 *    activations, computed here from this file's own windowing of the corpus, give the same top-k
 *    examples (order, values, max position), histogram counts, zero/positive counts, and the same
 *    promoted/suppressed tokens ((r − mean r) ⊙ ln_f.weight · wte, float64);
 *  - generated samples: greedy samples equal the reference's greedy decoding; seeded samples are
 *    per-sample (sample i drawn with seed + i whatever else is generated);
 *  - the cache answers a repeated call, from the process or from the Node cache folder (another
 *    process's result; a damaged file is ignored); the CLI and MCP (`loupe mcp --headless`) run it through the registry;
 *  - bad input (unknown hook, neuron out of range, empty corpus, bad JSON Lines) is a structured
 *    error with a hint; cancelling stops it.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { execFile } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { nodeDocumentCache } from '../src/node/document-cache';
import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { loadModelNode } from '../src/node/load';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import type { LoadedModel } from '../src/engine/api';
import { LoupeError } from '../src/engine/errors';
import { operation as dashboard } from '../src/ops/dashboard';
import { operation as capture } from '../src/ops/capture';
import { operation as probe } from '../src/ops/probe';
import { MemoryHandleStore } from '../src/ops/lib/handle-store';
import { loadModelDir, referenceForward, greedyGenerate64, mulberry32, gaussian, type RefModel } from './reference';
import { makeRandomSae, saeEncode64, type RandomSae } from './helpers/random-sae';
import { INDUCTION, logitWeights64 } from './sae-ref';
import { schemaErrors, viaJson } from './schema-helpers';
import type { OperationDocument } from '../src/ops/index';
type DashboardDocument = OperationDocument<'dashboard'>;

const BOS = 256;
const TOL = 1e-4;
const CORPUS = [
  'The quick brown fox jumps over the lazy dog. The quick brown fox jumps again.',
  'abcabcabc xyzxyz abcabc',
  'Hello world, hello world, hello!',
  'Once upon a time there was a little cat who liked milk.',
].join('\n\n');

let model: LoadedModel;
let ref: RefModel;
let sae: RandomSae;
const loaders = createNodeSaeLoaders({ cache: false });
const ctx = { loadSae: loaders.loadSae, loadSaeFile: loaders.loadSaeFile };

beforeAll(async () => {
  model = await loadModelNode(INDUCTION);
  ref = loadModelDir(INDUCTION);
  sae = makeRandomSae({ hook: 'blocks.1.hook_resid_pre', dIn: 64, dSae: 48, seed: 3 });
});
/** the largest deviations from the reference seen over every check (printed for the README) */
const worst = { activation: 0, weight: 0 };
afterAll(async () => {
  console.log(
    `dashboard vs float64 reference: worst |Δ| activation ${worst.activation.toExponential(2)}, direct-path weight ${worst.weight.toExponential(2)}`,
  );
  await model?.dispose();
});

/** this file's windowing: documents at blank lines, bytes as ids, consecutive windows */
function windowsOf(text: string, w: number): number[][] {
  const out: number[][] = [];
  for (const d of text.split('\n\n')) {
    const ids = [...Buffer.from(d.trim(), 'utf8')];
    for (let s = 0; s < ids.length; s += w) out.push(ids.slice(s, s + w));
  }
  return out;
}

/** reference activation at every content position of every window */
function refActs(
  windows: number[][],
  hook: string,
  at: (x: Float64Array, t: number, width: number) => number,
): number[][] {
  return windows.map((ids) => {
    const r = referenceForward(ref, [BOS, ...ids], { record: (n) => n === hook });
    const h = r.hooks[hook];
    const width = h.dims[h.dims.length - 1];
    return ids.map((_, i) => at(h.data, 1 + i, width));
  });
}

const argmaxOf = (a: number[]) => a.reduce((b, v, i) => (v > a[b] ? i : b), 0);

function expectMatches(doc: DashboardDocument, windows: number[][], acts: number[][], weights: Float64Array | null) {
  expect(schemaErrors('dashboard', viaJson(doc))).toEqual([]);
  expect(doc.corpus.windows).toBe(windows.length);
  // ---- examples
  const maxes = acts.map((r) => Math.max(...r));
  const order = maxes.map((_, i) => i).sort((a, b) => maxes[b] - maxes[a] || a - b);
  expect(doc.examples.length).toBe(Math.min(windows.length, doc.examples.length));
  doc.examples.forEach((e, r) => {
    expect(Math.abs(e.max - maxes[order[r]]), `rank ${r} max`).toBeLessThan(TOL);
    if (e.window !== order[r])
      expect(Math.abs(maxes[e.window] - maxes[order[r]]), `rank ${r}: a near-tie only`).toBeLessThan(TOL);
    expect(e.tokens.map((t) => t.id)).toEqual(windows[e.window]);
    e.values.forEach((v, i) => {
      const d = Math.abs(v - acts[e.window][i]);
      worst.activation = Math.max(worst.activation, d);
      expect(d, `window ${e.window} token ${i}`).toBeLessThan(TOL);
    });
    const a = acts[e.window];
    if (e.max_position !== argmaxOf(a)) expect(Math.abs(a[e.max_position] - a[argmaxOf(a)])).toBeLessThan(TOL);
  });
  // ---- the most negative windows, when any activation is negative (a direction, a GELU's small negatives)
  const mins = acts.map((r) => Math.min(...r));
  const orderMin = mins
    .map((_, i) => i)
    .filter((i) => mins[i] < 0)
    .sort((a, b) => mins[a] - mins[b] || a - b);
  expect(doc.examples_min.length).toBe(Math.min(orderMin.length, doc.examples.length));
  doc.examples_min.forEach((e, r) => {
    expect(Math.abs(e.min - mins[orderMin[r]]), `min rank ${r}`).toBeLessThan(TOL);
    expect(Math.abs(e.values[e.min_position] - mins[e.window])).toBeLessThan(TOL);
  });
  expect(doc.dominant).toBe(Math.max(...maxes) >= -Math.min(...mins) ? 'max' : 'min');
  // ---- histogram, binned here with the document's edges
  const h = doc.histogram;
  const all = acts.flat();
  expect(h.positions).toBe(all.length);
  const ambiguousZero = all.filter((a) => a !== 0 && Math.abs(a) < TOL).length;
  expect(Math.abs(h.zeros - all.filter((a) => a === 0).length)).toBeLessThanOrEqual(ambiguousZero);
  expect(Math.abs(h.positive - all.filter((a) => a > 0).length)).toBeLessThanOrEqual(ambiguousZero);
  expect(Math.abs(h.max - Math.max(...all))).toBeLessThan(TOL);
  expect(Math.abs(h.min - Math.min(...all))).toBeLessThan(TOL);
  const nz = all.filter((a) => a !== 0);
  const counts = new Array(h.counts.length).fill(0);
  let ambiguous = ambiguousZero;
  for (const a of nz) {
    let i = h.counts.length - 1;
    while (i > 0 && a < h.edges[i]) i--;
    counts[i]++;
    if (h.edges.slice(1, -1).some((e) => Math.abs(a - e) < TOL)) ambiguous++;
  }
  const diff = counts.reduce((s, c, i) => s + Math.abs(c - h.counts[i]), 0);
  expect(diff, `histogram counts ${h.counts} vs reference ${counts}`).toBeLessThanOrEqual(2 * ambiguous);
  expect(h.counts.reduce((a, b) => a + b, 0)).toBe(h.positions - h.zeros);
  // ---- direct path
  if (weights) {
    expect(doc.direct_path.available).toBe(true);
    // induction-gpt2's ids are bytes (its model card): only printable ASCII, tab and newline decode
    // to text on their own; bytes ≥ 0x80, other control bytes and <|endoftext|> (256) are never listed
    const shown = (id: number) => (id >= 32 && id < 127) || id === 9 || id === 10;
    expect(doc.direct_path.excluded.count).toBe(weights.length - Array.from(weights.keys()).filter(shown).length);
    const ids = Array.from(weights.keys())
      .filter(shown)
      .sort((a, b) => weights[b] - weights[a] || a - b);
    const k = doc.direct_path.promoted.length;
    const check = (list: DashboardDocument['direct_path']['promoted'], want: number[]) =>
      list.forEach((t, i) => {
        worst.weight = Math.max(worst.weight, Math.abs(t.weight - weights[t.token_id]));
        expect(Math.abs(t.weight - weights[t.token_id]), `token ${t.token_id}`).toBeLessThan(1e-5);
        if (t.token_id !== want[i]) expect(Math.abs(weights[t.token_id] - weights[want[i]])).toBeLessThan(1e-5);
      });
    check(doc.direct_path.promoted, ids.slice(0, k));
    check(doc.direct_path.suppressed, ids.slice(-k).reverse());
  }
}

describe('dashboard against the float64 reference', () => {
  it('a neuron: examples, histogram, promoted/suppressed (W_out row)', async () => {
    const windows = windowsOf(CORPUS, 12);
    const doc = await dashboard.run(
      model,
      {
        subject: 'neuron',
        layer: 1,
        neuron: 5,
        corpus: CORPUS,
        window: 12,
        batch_size: 4,
        top_k: 6,
        bins: 12,
        top_tokens: 8,
      },
      {},
    );
    const acts = refActs(windows, 'blocks.1.mlp.hook_post', (x, t, w) => x[t * w + 5]);
    const cproj = ref.tensors['transformer.h.1.mlp.c_proj.weight']; // Conv1D [d_mlp, d_model]
    const D = cproj.dims[1];
    const row = Float64Array.from({ length: D }, (_, j) => cproj.data[5 * D + j]);
    expectMatches(doc, windows, acts, logitWeights64(ref, row));
    expect(doc.examples).toHaveLength(6);
    expect(doc.corpus).toMatchObject({ format: 'text', documents: 4, window: 12, prepend_bos: true });
    expect(doc.engine_runs).toBe(Math.ceil(windows.length / 4));
    expect(doc.subject).toMatchObject({ kind: 'neuron', hook: 'blocks.1.mlp.hook_post', layer: 1, index: 5 });
    expect(doc.method).toMatch(/final norm's weight is folded in/);
    expect(doc.cache.hit).toBe(false);
    // the same call again comes from the cache; another corpus does not
    const again = await dashboard.run(
      model,
      {
        subject: 'neuron',
        layer: 1,
        neuron: 5,
        corpus: CORPUS,
        window: 12,
        batch_size: 4,
        top_k: 6,
        bins: 12,
        top_tokens: 8,
      },
      {},
    );
    expect(again.cache).toMatchObject({ hit: true, from: 'process', key: doc.cache.key });
    expect(again.examples).toEqual(doc.examples);
    const other = await dashboard.run(
      model,
      {
        subject: 'neuron',
        layer: 1,
        neuron: 5,
        corpus: CORPUS + '.',
        window: 12,
        batch_size: 4,
        top_k: 6,
        bins: 12,
        top_tokens: 8,
      },
      {},
    );
    expect(other.cache.hit).toBe(false);
    expect(other.corpus.hash).not.toBe(doc.corpus.hash);
  });

  it('the cache folder answers another model instance (another process); a damaged entry is recomputed', async () => {
    const root = mkdtempSync(join(tmpdir(), 'loupe-docs-'));
    const documents = nodeDocumentCache(root);
    const other = await loadModelNode(INDUCTION);
    try {
      const args = { layer: 0, neuron: 11, corpus: CORPUS, window: 16 };
      const first = await dashboard.run(model, args, { documents });
      expect(first.cache).toMatchObject({ hit: false, from: 'computed' });
      expect(first.cache.scope).toContain(root);
      const fromStore = await dashboard.run(other, args, { documents });
      expect(fromStore.cache).toMatchObject({ hit: true, from: 'store', key: first.cache.key });
      expect(fromStore.examples).toEqual(first.examples);
      expect(fromStore.histogram).toEqual(first.histogram);
      // damage every stored file: the next instance recomputes (and stores it again)
      const third = await loadModelNode(INDUCTION);
      const files: string[] = [];
      const walk = (d: string) =>
        readdirSync(d, { withFileTypes: true }).forEach((e) =>
          e.isDirectory() ? walk(join(d, e.name)) : files.push(join(d, e.name)),
        );
      walk(root);
      expect(files.filter((f) => f.endsWith('.json'))).toHaveLength(1);
      for (const f of files) writeFileSync(f, '{"not": "a dashboard"');
      const again = await dashboard.run(third, args, { documents });
      expect(again.cache).toMatchObject({ hit: false, from: 'computed' });
      expect(again.examples).toEqual(first.examples);
      await third.dispose();
    } finally {
      await other.dispose();
      rmSync(root, { recursive: true, force: true });
    }
  });

  it('an SAE feature: activations from the float64 encoder, promoted/suppressed from W_dec', async () => {
    const windows = windowsOf(CORPUS, 16);
    const hook = 'blocks.1.hook_resid_pre';
    const enc = windows.map((ids) => {
      const r = referenceForward(ref, [BOS, ...ids], { record: (n) => n === hook });
      return ids.map((_, i) => saeEncode64(sae, r.hooks[hook].data.subarray((1 + i) * 64, (2 + i) * 64)).acts);
    });
    // the feature firing on between 10% and 90% of the tokens, so that examples and histogram say something
    const density = (f: number) => enc.flat().filter((a) => a[f] > 0).length / enc.flat().length;
    const f = Array.from({ length: 48 }, (_, i) => i).find((i) => density(i) > 0.1 && density(i) < 0.9)!;
    expect(f).toBeDefined();
    const doc = await dashboard.run(
      model,
      {
        subject: 'feature',
        sae_source: sae.dir,
        feature: f,
        corpus: CORPUS,
        window: 16,
        batch_size: 3,
        top_k: 5,
        bins: 10,
      },
      ctx,
    );
    const acts = enc.map((row) => row.map((a) => a[f]));
    expectMatches(doc, windows, acts, logitWeights64(ref, sae.W_dec.subarray(f * 64, (f + 1) * 64)));
    expect(doc.histogram.zeros).toBeGreaterThan(0);
    expect(doc.subject.sae?.hook).toBe(hook);
    expect(doc.subject.label).toBe(`feature ${f}`);
  });

  it('a direction given inline: x · v at the hook, promoted/suppressed from v', async () => {
    const g = gaussian(mulberry32(17));
    const v = Array.from({ length: 64 }, () => g());
    const windows = windowsOf(CORPUS, 10);
    const doc = await dashboard.run(
      model,
      {
        subject: 'direction',
        hook: 'blocks.0.hook_resid_post',
        direction: v,
        corpus: CORPUS,
        window: 10,
        batch_size: 8,
        top_k: 4,
        bins: 16,
      },
      {},
    );
    const acts = refActs(windows, 'blocks.0.hook_resid_post', (x, t, w) =>
      v.reduce((s, vi, i) => s + vi * x[t * w + i], 0),
    );
    expectMatches(doc, windows, acts, logitWeights64(ref, Float64Array.from(v)));
    expect(doc.histogram.negative).toBeGreaterThan(0);
    expect(doc.subject.direction).toMatchObject({ source: 'inline', size: 64 });
  });

  it('a probe\'s direction ("probe:<handle>"): its weights at its hook, exactly as given as numbers', async () => {
    const store = new MemoryHandleStore();
    const prompts = ['abcabc', 'xyzxyz', 'hello hello', 'dogdog', 'abab', 'qwqw', 'catcat', 'mnmn'].flatMap((t, i) => [
      { text: t, label: 1 },
      { text: ['abcdef', 'xyzuvw', 'hello world', 'dogcat', 'abcd', 'qwer', 'catdog', 'mnop'][i], label: 0 },
    ]);
    const cap = await capture.run(model, { prompts, hooks: ['blocks.1.hook_resid_pre'] }, { store });
    const pr = await probe.run(model, { capture: cap.handle }, { store });
    const windows = windowsOf(CORPUS, 16);
    const args = { subject: 'direction' as const, corpus: CORPUS, window: 16, top_k: 4 };
    const viaHandle = await dashboard.run(model, { ...args, direction: `probe:${pr.handle}` }, { store });
    expect(viaHandle.subject).toMatchObject({
      kind: 'direction',
      hook: 'blocks.1.hook_resid_pre',
      direction: { source: 'probe', handle: pr.handle },
    });
    const w = pr.direction.values;
    expectMatches(
      viaHandle,
      windows,
      refActs(windows, 'blocks.1.hook_resid_pre', (x, t, d) => w.reduce((s, wi, i) => s + wi * x[t * d + i], 0)),
      logitWeights64(ref, Float64Array.from(w)),
    );
    const viaNumbers = await dashboard.run(model, { ...args, hook: 'blocks.1.hook_resid_pre', direction: w }, {});
    expect(viaNumbers.examples).toEqual(viaHandle.examples);
    expect(viaNumbers.histogram).toEqual(viaHandle.histogram);
    await expect(
      dashboard.run(model, { ...args, hook: 'blocks.0.hook_resid_pre', direction: `probe:${pr.handle}` }, { store }),
    ).rejects.toMatchObject({ code: 'BAD_INPUT' });
  });

  it('JSON Lines corpora read their "text" fields', async () => {
    const jsonl = ['{"text": "abcabc"}', '', '{"text": "hello hello", "id": 2}'].join('\n');
    const doc = await dashboard.run(model, { layer: 0, neuron: 1, corpus: jsonl, top_k: 5 }, {});
    expect(doc.corpus).toMatchObject({ format: 'jsonl', documents: 2, windows: 2, tokens: 17 });
    const windows = [[...Buffer.from('abcabc')], [...Buffer.from('hello hello')]];
    expectMatches(
      doc,
      windows,
      refActs(windows, 'blocks.0.mlp.hook_post', (x, t, w) => x[t * w + 1]),
      null,
    );
  });
});

describe('dashboard on generated samples', () => {
  it("greedy samples are the reference's greedy decoding, and their activations match", async () => {
    const doc = await dashboard.run(
      model,
      { layer: 1, neuron: 7, samples: 2, sample_length: 12, temperature: 0, top_k: 2 },
      {},
    );
    let greedy = greedyGenerate64(ref, [BOS], 12);
    const eos = greedy.indexOf(BOS);
    if (eos >= 0) greedy = greedy.slice(0, eos);
    expect(doc.corpus).toMatchObject({
      format: 'generated',
      documents: 2,
      windows: 2,
      samples: { n: 2, length: 12, seed: 0, temperature: 0 },
    });
    const windows = doc.examples.map((e) => e.tokens.map((t) => t.id)).sort((a, b) => a.length - b.length);
    for (const w of windows) expect(w).toEqual(greedy);
    expect(doc.examples.every((e) => e.origin === 'generated')).toBe(true);
    const byWindow: number[][] = [];
    for (const e of doc.examples) byWindow[e.window] = e.tokens.map((t) => t.id);
    expectMatches(
      doc,
      byWindow,
      refActs(byWindow, 'blocks.1.mlp.hook_post', (x, t, w) => x[t * w + 7]),
      null,
    );
  });

  it('sample i is drawn with seed + i, whatever else is generated', async () => {
    const a = await dashboard.run(model, { layer: 1, neuron: 7, samples: 3, sample_length: 20, seed: 5, top_k: 3 }, {});
    const b = await dashboard.run(model, { layer: 1, neuron: 7, samples: 2, sample_length: 20, seed: 6, top_k: 2 }, {});
    const byDoc = (d: DashboardDocument) => new Map(d.examples.map((e) => [e.document, e.tokens.map((t) => t.id)]));
    expect(byDoc(a).get(1)).toEqual(byDoc(b).get(0));
    expect(byDoc(a).get(2)).toEqual(byDoc(b).get(1));
    expect(byDoc(a).get(0)).not.toEqual(byDoc(a).get(1));
    // and a rerun with the same settings gives the same samples
    const a2 = await dashboard.run(
      model,
      { layer: 1, neuron: 7, samples: 3, sample_length: 20, seed: 5, top_k: 3, bins: 29 },
      {},
    );
    expect(a2.cache.hit).toBe(false);
    expect(byDoc(a2)).toEqual(byDoc(a));
  });
});

describe('dashboard errors, cancel and the CLI', () => {
  const code = async (input: Record<string, unknown>) => {
    try {
      await dashboard.run(model, input as never, ctx);
    } catch (e) {
      expect(e).toBeInstanceOf(LoupeError);
      expect((e as LoupeError).hint, (e as LoupeError).message).toBeTruthy();
      return { code: (e as LoupeError).code, message: (e as LoupeError).message };
    }
    throw new Error('no error');
  };

  it('bad input is a structured error with a hint', async () => {
    expect(
      await code({ subject: 'direction', hook: 'blocks.9.hook_resid_pre', direction: [1], corpus: 'abc' }),
    ).toMatchObject({ code: 'UNKNOWN_HOOK' });
    expect(await code({ layer: 1, neuron: 256, corpus: 'abc' })).toMatchObject({
      code: 'BAD_INPUT',
      message: expect.stringMatching(/neuron 256 does not exist/),
    });
    expect(await code({ layer: 2, neuron: 0, corpus: 'abc' })).toMatchObject({
      code: 'BAD_INPUT',
      message: expect.stringMatching(/layer 2/),
    });
    expect(await code({ layer: 1, neuron: 0 })).toMatchObject({ code: 'BAD_INPUT', message: 'The corpus is empty.' });
    expect(await code({ layer: 1, neuron: 0, corpus: '\n\n  \n' })).toMatchObject({
      code: 'BAD_INPUT',
      message: 'The corpus is empty.',
    });
    expect(await code({ layer: 1, neuron: 0, corpus: '{"text": "a"}\n{"text": oops}' })).toMatchObject({
      code: 'BAD_INPUT',
      message: expect.stringMatching(/^corpus line 2 is not JSON/),
    });
    expect(await code({ layer: 1, neuron: 0, corpus: '{"body": "a"}', corpus_format: 'jsonl' })).toMatchObject({
      code: 'BAD_INPUT',
      message: expect.stringMatching(/no string field "text"/),
    });
    expect(
      await code({ subject: 'direction', hook: 'blocks.0.hook_resid_pre', direction: [1, 2], corpus: 'abc' }),
    ).toMatchObject({ code: 'BAD_INPUT', message: expect.stringMatching(/64 values per position/) });
    expect(
      await code({ subject: 'direction', hook: 'blocks.0.attn.hook_pattern', direction: [1], corpus: 'abc' }),
    ).toMatchObject({ code: 'BAD_INPUT' });
    expect(await code({ subject: 'feature', feature: 1, corpus: 'abc' })).toMatchObject({
      code: 'BAD_INPUT',
      message: expect.stringMatching(/sae_source/),
    });
    expect(await code({ subject: 'feature', sae_source: sae.dir, feature: 48, corpus: 'abc' })).toMatchObject({
      code: 'BAD_INPUT',
      message: expect.stringMatching(/48 features/),
    });
    expect(await code({ layer: 0, neuron: 0, corpus: 'abc', window: 64 })).toMatchObject({
      code: 'BAD_INPUT',
      message: expect.stringMatching(/window 64/),
    });
    expect(await code({ layer: 0, neuron: 0, corpus: 'abc', samples: -1 })).toMatchObject({ code: 'BAD_INPUT' });
  });

  it('reports progress per batch and stops when cancelled', async () => {
    const stages: string[] = [];
    await dashboard.run(
      model,
      { layer: 0, neuron: 2, corpus: CORPUS, window: 8, batch_size: 5 },
      { onProgress: (p) => stages.push(`${p.stage} ${p.done}/${p.total}`) },
    );
    const n = windowsOf(CORPUS, 8).length;
    expect(stages).toEqual([
      ...Array.from({ length: Math.ceil(n / 5) }, (_, i) => `scanning windows ${i * 5}/${n}`),
      `scanning windows ${n}/${n}`,
    ]);
    // generation reports tokens generated, once per step
    const gen: number[] = [];
    await dashboard.run(
      model,
      { layer: 0, neuron: 2, samples: 3, sample_length: 5, seed: 9 },
      {
        onProgress: (p) => {
          if (p.stage.startsWith('generating')) {
            expect(p.total).toBe(15);
            gen.push(p.done);
          }
        },
      },
    );
    expect(gen[0]).toBe(0);
    expect(gen.at(-1)).toBe(15);
    expect(gen.length).toBeGreaterThanOrEqual(5);
    gen.slice(1).forEach((d, i) => expect(d).toBeGreaterThanOrEqual(gen[i]));
    const ac = new AbortController();
    const p = dashboard.run(
      model,
      { layer: 0, neuron: 3, corpus: CORPUS, window: 8, batch_size: 2 },
      {
        signal: ac.signal,
        onProgress: (x) => {
          if (x.done > 0) ac.abort();
        },
      },
    );
    await expect(p).rejects.toMatchObject({ code: 'ABORTED' });
  });

  it('runs from the CLI through the registry', async () => {
    const corpus = '{"text": "abcabcabc"}\n{"text": "the cat sat on the mat"}';
    const cacheDir = mkdtempSync(join(tmpdir(), 'loupe-cli-'));
    const cliRun = () =>
      new Promise<string>((res, rej) =>
        execFile(
          process.execPath,
          [
            resolve(__dirname, '../bin/loupe.mjs'),
            'dashboard',
            INDUCTION,
            '--layer',
            '1',
            '--neuron',
            '9',
            '--corpus',
            corpus,
            '--window',
            '8',
            '--top-k',
            '3',
            '--json',
          ],
          { maxBuffer: 64 << 20, env: { ...process.env, LOUPE_CACHE_DIR: cacheDir } },
          (err, stdout, stderr) => (err ? rej(new Error(stderr)) : res(stdout)),
        ),
      );
    const cli = JSON.parse(await cliRun()) as DashboardDocument;
    // a second CLI process reads the first one's dashboard from the cache folder
    const second = JSON.parse(await cliRun()) as DashboardDocument;
    rmSync(cacheDir, { recursive: true, force: true });
    expect(cli.cache).toMatchObject({ hit: false, from: 'computed' });
    expect(second.cache).toMatchObject({ hit: true, from: 'store', key: cli.cache.key });
    expect(second.examples).toEqual(cli.examples);
    expect(schemaErrors('dashboard', cli)).toEqual([]);
    const windows = [
      [...Buffer.from('abcabcab')],
      [...Buffer.from('c')],
      [...Buffer.from('the cat ')],
      [...Buffer.from('sat on t')],
      [...Buffer.from('he mat')],
    ];
    expect(cli.corpus).toMatchObject({ format: 'jsonl', documents: 2, windows: 5 });
    expectMatches(
      cli,
      windows,
      refActs(windows, 'blocks.1.mlp.hook_post', (x, t, w) => x[t * w + 9]),
      null,
    );
  });
});

describe('dashboard over MCP', () => {
  it("is a tool with the registry's schema (a long one: as_job), and its call equals the operation run directly", async () => {
    const cacheDir = mkdtempSync(join(tmpdir(), 'loupe-mcp-'));
    const transport = new StdioClientTransport({
      command: process.execPath,
      args: [resolve(__dirname, '../bin/loupe.mjs'), 'mcp', '--headless'],
      cwd: resolve(__dirname, '..'),
      stderr: 'pipe',
      env: { ...process.env, LOUPE_CACHE_DIR: cacheDir } as Record<string, string>,
    });
    const client = new Client({ name: 'dashboard-test', version: '1' });
    await client.connect(transport);
    const stories = await loadModelNode('default', { backend: 'node' });
    try {
      const { tools } = await client.listTools();
      const t = tools.find((x) => x.name === 'dashboard');
      expect(t?.description?.startsWith(dashboard.description)).toBe(true);
      const props = t!.inputSchema.properties as Record<string, { enum?: string[] }>;
      for (const k of [
        'subject',
        'layer',
        'neuron',
        'sae_source',
        'feature',
        'hook',
        'direction',
        'corpus',
        'corpus_format',
        'samples',
        'sample_length',
        'seed',
        'window',
        'batch_size',
        'top_k',
        'bins',
        'as_job',
      ])
        expect(props, k).toHaveProperty(k);
      expect(props.subject.enum).toEqual(['neuron', 'feature', 'direction']);
      const args = {
        layer: 1,
        neuron: 3,
        corpus: 'Once upon a time there was a cat.\n\nThe dog ran to the park.',
        window: 8,
        top_k: 3,
      };
      const r = await client.callTool({ name: 'dashboard', arguments: args });
      expect(r.isError).toBeFalsy();
      const direct = await dashboard.run(stories, args, {});
      // equal but for where the cache lives (the companion keeps dashboards in its cache folder too)
      const { cache: c1, method: m1, ...rest1 } = r.structuredContent as DashboardDocument;
      const { cache: c2, method: m2, ...rest2 } = direct;
      expect(rest1).toEqual(rest2);
      expect(c1.key).toBe(c2.key);
      expect(m1.split('Cache:')[0]).toBe(m2.split('Cache:')[0]);
      const bad = await client.callTool({ name: 'dashboard', arguments: { layer: 1, neuron: 3 } });
      expect(bad.isError).toBe(true);
      expect(JSON.stringify(bad.structuredContent ?? bad.content)).toMatch(/The corpus is empty/);
    } finally {
      await client.close();
      await stories.dispose();
      rmSync(cacheDir, { recursive: true, force: true });
    }
  });
});
