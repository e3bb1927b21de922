/**
 * Datasets of clean/corrupted pairs (src/ops/lib/dataset.ts) and dataset-mode statistics
 * (src/ops/lib/stats.ts): reading JSON Lines and CSV, one SHA-256 for the same pairs whatever the
 * source, unequal pairs dropped with a reason, bad input; the generators on a gpt2-shaped random
 * model whose tokenizer has single-token names; the bootstrap CI against an independent
 * recomputation of the documented procedure and exact sign-flip p-values; dataset-mode `patch`
 * on induction-gpt2 equal, pair by pair, to single-pair runs.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { realpathSync } from 'node:fs';
import path from 'node:path';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { getOperation, type OperationDocument } from '../src/ops/index';
import { datasetReport, parseDatasetText, resolveDataset, type DatasetInput } from '../src/ops/lib/dataset';
import { DatasetStats } from '../src/ops/lib/stats';
import { makeRandomModel, mulberry32, type RandomModel } from './reference';
import { SHARED } from './helpers/shared';

type PatchDoc = OperationDocument<'patch'>;
const NAMES = ['Mary', 'John', 'Alice', 'Bob', 'Tom', 'James', 'Anna', 'David'];
const ds = (x: Partial<DatasetInput>): DatasetInput => ({ dataset_format: 'auto', prepend_bos: true, ...x });

describe('datasets on a gpt2-shaped random model with single-token names', () => {
  let rm: RandomModel;
  let model: LoadedModel;
  beforeAll(async () => {
    rm = makeRandomModel('gpt2', { seed: 5, dModel: 32, nLayers: 2, nHeads: 4, vocabSize: 420, words: NAMES });
    model = await loadModelNode(rm.dir, { backend: 'node' });
  });
  afterAll(async () => {
    await model?.dispose();
    rm?.cleanup();
  });

  const pairs = [
    {
      clean: 'When Mary and John went, John saw',
      corrupted: 'When Mary and John went, Tom saw',
      answer: ' Mary',
      counterfactual: ' John',
    },
    { clean: 'the cat sat', corrupted: 'the dog sat on', answer: ' Mary', counterfactual: ' Bob' },
  ];

  it('the same pairs inline, as JSON Lines and as CSV have one SHA-256; unequal pairs are dropped with their lengths', async () => {
    const inline = await resolveDataset(model, ds({ dataset: pairs }));
    const jsonl = await resolveDataset(
      model,
      ds({ dataset_text: pairs.map((p) => JSON.stringify(p)).join('\n') + '\n' }),
    );
    const csv = await resolveDataset(model, {
      ...ds({}),
      dataset_format: 'csv',
      dataset_text:
        'clean,corrupted,answer,counterfactual\n' +
        pairs
          .map((p) =>
            [p.clean, p.corrupted, p.answer, p.counterfactual].map((v) => `"${v.replace(/"/g, '""')}"`).join(','),
          )
          .join('\r\n'),
    });
    expect(jsonl.report.sha256).toBe(inline.report.sha256);
    expect(csv.report.sha256).toBe(inline.report.sha256);
    expect(inline.report.format).toBeNull();
    expect(jsonl.report.format).toBe('jsonl');
    expect(csv.report.format).toBe('csv');
    expect(inline.report.n_examples).toBe(1);
    expect(inline.report.dropped).toHaveLength(1);
    expect(inline.report.dropped[0].index).toBe(1);
    expect(inline.report.dropped[0].reason).toMatch(/^clean has \d+ tokens, corrupted \d+$/);
    const other = await resolveDataset(model, ds({ dataset: [pairs[0]] }));
    expect(other.report.sha256).not.toBe(inline.report.sha256);
  });

  it("EAP-IG's CSV columns: correct_idx / incorrect_idx are token ids, an unnamed index column is ignored", () => {
    const { pairs: p } = parseDatasetText(',clean,corrupted,correct_idx,incorrect_idx\n0,"a, b",c,12,34\n', 'auto');
    expect(p).toEqual([{ clean: 'a, b', corrupted: 'c', answer: '#12', counterfactual: '#34' }]);
  });

  it('bad input: empty, several sources, a bad JSON line, a multi-token answer, over the cap', async () => {
    await expect(resolveDataset(model, ds({ dataset: [] }))).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await expect(resolveDataset(model, ds({}))).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await expect(resolveDataset(model, ds({ dataset: pairs, dataset_text: 'x' }))).rejects.toMatchObject({
      code: 'BAD_INPUT',
    });
    await expect(resolveDataset(model, ds({ dataset_text: '{"clean": "a"}\n{oops\n' }))).rejects.toMatchObject({
      code: 'BAD_INPUT',
      message: expect.stringContaining('line 2'),
    });
    await expect(
      resolveDataset(model, ds({ dataset: [{ ...pairs[0] }, { ...pairs[0], answer: ' Mary went' }] })),
    ).rejects.toMatchObject({ code: 'BAD_INPUT', message: expect.stringContaining('dataset pair 1') });
    const many = Array.from({ length: 4097 }, () => pairs[0]);
    await expect(resolveDataset(model, ds({ dataset: many }))).rejects.toMatchObject({ code: 'TOO_LARGE' });
    await expect(
      resolveDataset(model, ds({ generate: { task: 'greater_than', n: 2, seed: 0, length: 10 } })),
    ).rejects.toMatchObject({
      code: 'BAD_INPUT',
      message: expect.stringContaining('two-digit'),
    });
  });

  it('the IOI generator: single-token names, equal lengths, the same pairs for the same seed', async () => {
    const a = await resolveDataset(model, ds({ generate: { task: 'ioi', n: 12, seed: 7, length: 10 } }));
    const b = await resolveDataset(model, ds({ generate: { task: 'ioi', n: 12, seed: 7, length: 10 } }));
    const c = await resolveDataset(model, ds({ generate: { task: 'ioi', n: 12, seed: 8, length: 10 } }));
    expect(a.report.sha256).toBe(b.report.sha256);
    expect(c.report.sha256).not.toBe(a.report.sha256);
    expect(a.report.n_examples + a.report.dropped.length).toBe(12);
    expect(a.report.n_examples).toBeGreaterThan(8);
    for (const p of a.pairs) {
      expect(NAMES.map((x) => ' ' + x)).toContain(p.answer);
      expect(p.clean!.endsWith(' to')).toBe(true);
    }
  });
});

describe('dataset statistics', () => {
  it('the bootstrap CI is the documented procedure: reproducible, and equal to an independent recomputation', () => {
    const r = mulberry32(1);
    const v = Array.from({ length: 20 }, () => r() * 2 - 0.5);
    const a = new DatasetStats(20, 42, 500).of(v, true);
    const b = new DatasetStats(20, 42, 500).of(v, true);
    expect(b).toEqual(a);
    // independent: the same seeded draws (math.ts rng is mulberry32), means, numpy's linear quantiles
    const draw = mulberry32(42);
    const means: number[] = [];
    for (let k = 0; k < 500; k++) {
      let s = 0;
      for (let i = 0; i < 20; i++) s += v[Math.floor(draw() * 20)];
      means.push(s / 20);
    }
    means.sort((x, y) => x - y);
    const q = (p: number) => {
      const h = (means.length - 1) * p;
      return means[Math.floor(h)] + (h - Math.floor(h)) * (means[Math.ceil(h)] - means[Math.floor(h)]);
    };
    expect(a.ci_low).toBeCloseTo(q(0.025), 12);
    expect(a.ci_high).toBeCloseTo(q(0.975), 12);
    expect(a.ci_low).toBeLessThan(a.mean);
    expect(a.ci_high).toBeGreaterThan(a.mean);
    expect(new DatasetStats(20, 43, 500).of(v, true).ci_low).not.toBe(a.ci_low);
  });

  it('the sign-flip p-value is exact for small n: [1, 2, 3] has |mean| reached by 2 of 8 patterns', () => {
    expect(new DatasetStats(3, 0).of([1, 2, 3], true).p_value).toBe(2 / 8);
    expect(new DatasetStats(4, 0).of([1, -1, 1, -1], true).p_value).toBe(1);
    expect(new DatasetStats(3, 0).of([1, 2, 3], false).p_value).toBeNull();
    const big = new DatasetStats(40, 0).of(
      Array.from({ length: 40 }, () => 1),
      true,
    );
    expect(big.p_value).toBeCloseTo(1 / 10000, 8); // only the identity reaches |mean| = 1
  });
});

describe('dataset-mode patch on induction-gpt2', () => {
  let model: LoadedModel;
  beforeAll(async () => {
    model = await loadModelNode(realpathSync(path.join(SHARED, 'models/induction-gpt2')), { backend: 'node' });
  }, 60_000);
  afterAll(async () => {
    await model?.dispose();
  });
  const patch = (x: unknown): Promise<PatchDoc> => getOperation('patch')!.run(model, x);
  const GEN = { task: 'induction' as const, n: 5, seed: 2, length: 6 };

  it('per-pair values equal single-pair runs; means, CIs and p-values per cell; reproducible with the seed', async () => {
    const d = await patch({ generate: GEN, scans: ['head_out', 'mlp_out'], bootstrap_seed: 3 });
    expect(d.dataset!.n_examples).toBe(5);
    const st = d.statistics!;
    expect(st.sign_flips).toBe('exact');
    const dataset = await resolveDataset(model, ds({ generate: GEN }));
    for (const [k, ex] of dataset.examples.entries()) {
      const single = await patch({
        token_ids: ex.clean,
        corrupted_token_ids: ex.corrupted,
        answer: `#${ex.answer}`,
        counterfactual: `#${ex.counterfactual}`,
        scans: ['head_out', 'mlp_out'],
      });
      expect(single.dataset).toBeUndefined();
      for (const c of st.components) {
        const v =
          c.scan === 'head_out'
            ? single.head_out![c.layer][c.index!]
            : c.scan === 'mlp_out'
              ? single.mlp_out![c.layer][c.index!]
              : single.mlp_out_all_pos![c.layer];
        expect(c.per_example[k]).toBe(v);
      }
    }
    const h = st.components.find((c) => c.scan === 'head_out' && c.layer === 1 && c.index === 0)!;
    expect(d.head_out![1][0]).toBeCloseTo(h.per_example.reduce((a, b) => a + b, 0) / 5, 12);
    expect(h.ci_low).toBeLessThanOrEqual(h.mean);
    expect(h.ci_high).toBeGreaterThanOrEqual(h.mean);
    expect(h.p_value).toBeGreaterThan(0);
    const again = await patch({ generate: GEN, scans: ['head_out', 'mlp_out'], bootstrap_seed: 3 });
    expect(again.statistics).toEqual(st);
    // the document records the seed; another seed draws other resamples (the same per-pair values)
    expect(st.seed).toBe(3);
    expect(st.resamples).toBe(1000);
    const other = (await patch({ generate: GEN, scans: ['head_out', 'mlp_out'], bootstrap_seed: 4 })).statistics!;
    expect(other.seed).toBe(4);
    expect(other.components.map((c) => c.per_example)).toEqual(st.components.map((c) => c.per_example));
    expect(other.components.some((c, i) => c.ci_low !== st.components[i].ci_low)).toBe(true);
    // the report shows the pairs as given
    expect(d.dataset!.sample).toHaveLength(5);
    expect(d.dataset!.sample!.every((p) => p.used)).toBe(true);
    // a report from before the sample existed is still a valid report
    expect(datasetReport.safeParse({ ...d.dataset, sample: undefined }).success).toBe(true);
  }, 120_000);

  it('dataset mode of ablate, attribution_patching and integrated_gradients: per-pair values are single-pair runs', async () => {
    const run = (op: string, x: unknown) => getOperation(op)!.run(model, x) as Promise<any>;
    const dataset = await resolveDataset(model, ds({ generate: GEN }));
    const ab = await run('ablate', { generate: GEN, layer: 1, head: 2, method: 'resample' });
    const atp = await run('attribution_patching', { generate: GEN });
    const ig = await run('integrated_gradients', { generate: GEN, steps: 4 });
    for (const [k, ex] of dataset.examples.entries()) {
      const one = { token_ids: ex.clean, answer: `#${ex.answer}` };
      const atp1 = await run('attribution_patching', {
        ...one,
        corrupted_token_ids: ex.corrupted,
        counterfactual: `#${ex.counterfactual}`,
        validate: 0,
      });
      const ig1 = await run('integrated_gradients', { ...one, counterfactual: `#${ex.counterfactual}`, steps: 4 });
      const head = atp.statistics.components.find((c: any) => c.kind === 'head' && c.layer === 1 && c.head === 2);
      expect(head.per_example[k]).toBe(atp1.heads.find((h: any) => h.layer === 1 && h.head === 2).estimate);
      const site = atp.statistics.components.find((c: any) => c.kind === 'site' && c.position === 3);
      expect(site.per_example[k]).toBe(atp1.sites.find((x: any) => x.hook === site.hook && x.position === 3).estimate);
      expect(ig.statistics.components[2].per_example[k]).toBe(ig1.attributions[2].attribution);
    }
    expect(ab.statistics.components.map((c: any) => c.effect)).toEqual(['logit_delta', 'logprob_delta', 'prob_delta']);
    expect(ab.entries[0].logit_delta).toBeCloseTo(
      ab.statistics.components[0].per_example.reduce((a: number, b: number) => a + b, 0) / 5,
      12,
    );
    expect(ab.method).toContain('corrupted prompt');
  }, 120_000);

  it('a dataset beside a prompt is refused; per-position scans need one token length', async () => {
    await expect(patch({ generate: GEN, prompt: 'abc' })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await expect(
      patch({
        scans: ['resid_pre'],
        dataset: [
          { clean_token_ids: [256, 1, 2, 1], corrupted_token_ids: [256, 3, 2, 1], answer: '#2', counterfactual: '#4' },
          {
            clean_token_ids: [256, 1, 2, 1, 2],
            corrupted_token_ids: [256, 3, 2, 1, 2],
            answer: '#1',
            counterfactual: '#4',
          },
        ],
      }),
    ).rejects.toMatchObject({ code: 'BAD_INPUT', message: expect.stringContaining('one token length') });
  });
});
