/**
 * Issue 42, statistics on dataset results: Holm and Benjamini–Hochberg against values worked by
 * hand from their definitions (Holm 1979; Benjamini & Hochberg 1995), the sign-flip test against
 * an exact enumeration written here, and edge_attribution's per-edge CIs, p-values and the small
 * gap warning on real runs.
 */
import path from 'node:path';
import { realpathSync } from 'node:fs';
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { DatasetStats, adjustFamily, benjaminiHochberg, holm } from '../src/ops/lib/stats';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { operations } from '../src/ops/index';
import { makeRandomModel, mulberry32, type RandomModel } from './reference';
import { SHARED } from './helpers/shared';

/** two-sided sign-flip p of mean = 0 by visiting every sign pattern (independent of lib/stats.ts) */
function exactSignFlip(v: number[]): number {
  const obs = Math.abs(v.reduce((a, b) => a + b, 0));
  let hits = 0;
  let total = 0;
  const walk = (i: number, s: number) => {
    if (i === v.length) {
      total++;
      if (Math.abs(s) >= obs - 1e-12 * Math.max(1, obs)) hits++;
      return;
    }
    walk(i + 1, s + v[i]);
    walk(i + 1, s - v[i]);
  };
  walk(0, 0);
  return hits / total;
}

describe('multiple-comparison corrections', () => {
  it('Holm and BH equal hand-worked values', () => {
    // sorted: 0.005 (#3), 0.01 (#0), 0.03 (#2), 0.04 (#1), m = 4
    // Holm: 4·0.005 = 0.02; max(0.02, 3·0.01) = 0.03; max(0.03, 2·0.03) = 0.06; max(0.06, 1·0.04) = 0.06
    // BH from the top: 4·0.04/4 = 0.04; min(0.04, 4·0.03/3) = 0.04; 4·0.01/2 = 0.02; min(0.02, 4·0.005/1) = 0.02
    const ps = [0.01, 0.04, 0.03, 0.005];
    expect(holm(ps).map((x) => +x.toFixed(12))).toEqual([0.03, 0.06, 0.06, 0.02]);
    expect(benjaminiHochberg(ps).map((x) => +x.toFixed(12))).toEqual([0.02, 0.04, 0.04, 0.02]);
    // capped at 1, and BH's step-up carries a smaller later value down: 2·0.9/2 = 0.9 < 2·0.5/1
    expect(holm([0.5, 0.9])).toEqual([1, 1]);
    expect(benjaminiHochberg([0.5, 0.9]).map((x) => +x.toFixed(12))).toEqual([0.9, 0.9]);
    // ties
    expect(holm([0.02, 0.02, 0.02]).map((x) => +x.toFixed(12))).toEqual([0.06, 0.06, 0.06]);
    expect(benjaminiHochberg([0.02, 0.02, 0.02]).map((x) => +x.toFixed(12))).toEqual([0.02, 0.02, 0.02]);
  });
  it('agree with the definitions on random p-values (O(m²) from the formulas)', () => {
    const r = mulberry32(7);
    const ps = Array.from({ length: 40 }, () => r() ** 3);
    const m = ps.length;
    const sorted = [...ps].sort((a, b) => a - b);
    const rank = (p: number) => sorted.indexOf(p); // values are distinct
    for (let i = 0; i < m; i++) {
      const k = rank(ps[i]);
      let h = 0;
      for (let j = 0; j <= k; j++) h = Math.max(h, Math.min(1, (m - j) * sorted[j]));
      let b = 1;
      for (let j = k; j < m; j++) b = Math.min(b, (m * sorted[j]) / (j + 1));
      expect(holm(ps)[i]).toBeCloseTo(h, 12);
      expect(benjaminiHochberg(ps)[i]).toBeCloseTo(Math.min(1, b), 12);
    }
  });
  it('a table keeps rows without a p-value out of the family', () => {
    const rows = adjustFamily([{ p_value: 0.01 }, { p_value: null }, { p_value: 0.04 }]);
    expect(rows[1]).toEqual({ p_value: null, p_holm: null, p_bh: null });
    expect(rows[0].p_holm).toBeCloseTo(0.02, 12); // m = 2, not 3
    expect(rows[2].p_bh).toBeCloseTo(0.04, 12);
  });
});

describe('the sign-flip test', () => {
  it('equals the exact enumeration for small n (by hand: [1, 2, 3] → 2 of 8 patterns reach |Σ| = 6)', () => {
    expect(new DatasetStats(3, 0).of([1, 2, 3], true).p_value).toBe(0.25);
    const r = mulberry32(3);
    for (const n of [2, 5, 8, 12]) {
      const v = Array.from({ length: n }, () => r() * 2 - 0.6);
      expect(new DatasetStats(n, 1).of(v, true).p_value).toBeCloseTo(exactSignFlip(v), 12);
    }
  });
  it('with random patterns (n = 16) is within Monte Carlo error of the exact value', () => {
    const r = mulberry32(5);
    const v = Array.from({ length: 16 }, () => r() * 2 - 0.8);
    const exact = exactSignFlip(v);
    const p = new DatasetStats(16, 2).of(v, true).p_value!;
    const se = Math.sqrt((exact * (1 - exact)) / 9999);
    expect(Math.abs(p - exact)).toBeLessThan(4 * se + 1e-4);
  });
});

/** DatasetStats.many's output for the pinned input below, to 12 digits, by main's stats.ts at f2e4f1c (before the tabled sums) */
const PINNED = [
  -0.145652301588, 0.198033310067, 0.811, -0.0284487758084, 0.314189669021, 0.158, 0.0478746157544, 0.391764438588,
  0.02,
];

describe('many components at once', () => {
  it("gives one component at a time's numbers (today's), across block edges, exact and sampled", () => {
    // `of` is the plain definition (each resample's mean summed in draw order, sorted quantiles);
    // `many` sums the same draws and patterns from tabled subset sums, so only the order of the
    // additions differs: the CIs agree to rounding and the p-values exactly
    for (const [n, count, flips] of [
      [8, 700, 9999],
      [10, 300, 9999],
      [20, 530, 9999],
      [37, 300, 999],
      [64, 300, 999],
    ]) {
      const st = new DatasetStats(n, 4, 1000, flips);
      const rows = Array.from({ length: n }, (_, k) =>
        // ties and zeros too: a column of zeros, repeated values
        Float64Array.from({ length: count }, (_, i) =>
          i % 7 === 0 ? 0 : i % 5 === 0 ? 0.25 : Math.cos(i * 3 + k) + 0.2,
        ),
      );
      const all = st.many(rows, count, true);
      expect(all).toHaveLength(count);
      for (let c = 0; c < count; c++) {
        const one = st.of(
          rows.map((x) => x[c]),
          true,
        );
        expect(all[c].p_value).toBe(one.p_value);
        expect(Math.abs(all[c].ci_low - one.ci_low)).toBeLessThan(1e-12);
        expect(Math.abs(all[c].ci_high - one.ci_high)).toBeLessThan(1e-12);
      }
      const noP = st.many(rows, 3, false);
      expect(noP.map((r) => r.p_value)).toEqual([null, null, null]);
      expect(noP[2].ci_low).toBe(all[2].ci_low);
    }
  });

  it('a fixed seed gives the same statistics as before the tabled sums (pinned)', () => {
    const n = 64;
    const st = new DatasetStats(n, 0, 1000, 999);
    const rows = Array.from({ length: n }, (_, k) =>
      Float64Array.from({ length: 3 }, (_, i) => Math.sin(k * 7 + i) + 0.1 * i),
    );
    const got = st.many(rows, 3, true).map((r) => [r.ci_low, r.ci_high, r.p_value]);
    expect(got.flat().map((v) => +v!.toPrecision(12))).toEqual(PINNED);
  });
});

describe('edge_attribution statistics', () => {
  let gpt2: LoadedModel;
  let rm: RandomModel;
  let rnd: LoadedModel;
  beforeAll(async () => {
    gpt2 = await loadModelNode(realpathSync(path.join(SHARED, 'models/induction-gpt2')), { backend: 'node' });
    const names = ['Mary', 'John', 'Alice', 'Bob', 'Tom', 'James', 'Anna', 'David'];
    rm = makeRandomModel('gpt2', { seed: 9, dModel: 32, nLayers: 2, nHeads: 4, vocabSize: 420, words: names });
    rnd = await loadModelNode(realpathSync(rm.dir), { backend: 'node' });
  }, 120_000);
  afterAll(async () => {
    await gpt2?.dispose();
    await rnd?.dispose();
    rm?.cleanup();
  });

  it('gives every edge a CI around its score, the exact sign-flip p and Holm/BH over the edges', async () => {
    const doc: any = await operations.edge_attribution.run(gpt2, {
      generate: { task: 'induction', n: 8, seed: 3, length: 8 },
      method: 'eap',
      per_example: true,
    });
    expect(doc.statistics.correction).toMatch(/Holm.*Benjamini–Hochberg.*over the \d+ p-values/);
    expect(doc.warnings).toEqual([]); // induction-gpt2's gap is about 12 logits
    const ps: number[] = doc.edges.map((e: any) => e.p_value);
    const m = ps.length;
    const sorted = [...ps].map((p, i) => ({ p, i })).sort((a, b) => a.p - b.p || a.i - b.i);
    let run = 0;
    const holmRef = new Array<number>(m);
    sorted.forEach(({ p, i }, k) => (holmRef[i] = run = Math.max(run, Math.min(1, (m - k) * p))));
    for (const [i, e] of doc.edges.entries()) {
      const lo = Math.min(...e.per_example);
      const hi = Math.max(...e.per_example);
      expect(e.ci_low).toBeLessThanOrEqual(e.score + 1e-12);
      expect(e.ci_high).toBeGreaterThanOrEqual(e.score - 1e-12);
      expect(e.ci_low).toBeGreaterThanOrEqual(lo - 1e-12);
      expect(e.ci_high).toBeLessThanOrEqual(hi + 1e-12);
      expect(e.p_value).toBeCloseTo(exactSignFlip(e.per_example), 12);
      expect(e.p_holm).toBeCloseTo(holmRef[i], 12);
      expect(e.p_bh).toBeLessThanOrEqual(e.p_holm + 1e-12);
      expect(e.p_bh).toBeGreaterThanOrEqual(e.p_value - 1e-12);
    }
  }, 120_000);

  it('warns when the clean/corrupted gap is too small for faithfulness to mean anything', async () => {
    const doc: any = await operations.edge_attribution.run(rnd, {
      generate: { task: 'ioi', n: 6, seed: 4, length: 10 },
      method: 'eap',
      evaluate: true,
    });
    const gap = Math.abs(doc.m_clean - doc.m_corrupted);
    expect(gap).toBeLessThan(1); // a random model barely tells the names apart
    expect(doc.warnings).toEqual([expect.stringMatching(/M\(clean\) − M\(corrupted\) = .* below 1/)]);
  }, 120_000);

  it("a dataset table's p-values are adjusted over the table, and small per-pair gaps are named", async () => {
    const doc: any = await operations.patch.run(rnd, {
      generate: { task: 'ioi', n: 6, seed: 4, length: 10 },
      scans: ['head_out'],
    });
    const rows = doc.statistics.components;
    expect(doc.statistics.correction).toContain(`over the ${rows.length} p-values`);
    const h = holm(rows.map((r: any) => r.p_value));
    const b = benjaminiHochberg(rows.map((r: any) => r.p_value));
    rows.forEach((r: any, i: number) => {
      expect(r.p_holm).toBe(h[i]);
      expect(r.p_bh).toBe(b[i]);
    });
    // the warning is about the dataset's mean gap (the first pair's own gap is above 1 here)
    const gap = doc.clean_logit_diff - doc.corrupted_logit_diff;
    expect(Math.abs(gap)).toBeLessThan(1);
    expect(doc.warnings).toContainEqual(expect.stringContaining(`= ${gap.toFixed(3)} logits, below 1`));
  }, 120_000);
});
