/**
 * Statistics of a dataset-mode result: for each component (a head, a layer, a site) its mean over
 * the pairs, the per-pair values, a seeded percentile-bootstrap 95% confidence interval of the
 * mean, and for effects a two-sided sign-flip permutation p-value of "the mean is 0".
 *
 *  - bootstrap: `resamples` datasets of n pairs drawn with replacement (the same draws for every
 *    component, so components are compared on the same resamples), the mean of each; the CI is the
 *    2.5 % and 97.5 % quantiles of those means (linear interpolation between order statistics,
 *    numpy's default). A pure function of (values, seed, resamples).
 *  - sign flip: under H0 the per-pair effects are symmetric about 0, so flipping the sign of any
 *    of them is as likely as not; p = the share of sign patterns whose |mean| ≥ the observed
 *    |mean|: all 2^n patterns when n ≤ 16 (exact), else (1 + #hits) / (1 + permutations) over
 *    seeded random patterns. The same patterns for every component.
 *  - multiple comparisons: a table of components tests one hypothesis per row, so each row also
 *    carries its p-value adjusted over the table (the family): Holm's step-down (controls the
 *    family-wise error rate) and Benjamini–Hochberg's step-up (controls the false discovery rate).
 *    Holm 1979: with p(1) ≤ … ≤ p(m), p̃(i) = max_{j ≤ i} min(1, (m − j + 1)·p(j)); BH 1995:
 *    p̃(i) = min_{j ≥ i} min(1, m·p(j)/j). Rows without a p-value are not in the family.
 */
import { z } from 'zod';
import { rng } from './math';

export const BOOTSTRAP_RESAMPLES = 1000;
export const SIGN_FLIPS = 9999;
/** pairs up to which the sign-flip test enumerates every pattern */
export const EXACT_FLIPS_UP_TO = 12;

export const statsFields = {
  bootstrap_seed: z
    .number()
    .int()
    .default(0)
    .describe('Dataset mode: seed of the bootstrap resamples and the sign-flip patterns.'),
};

export const componentStats = z.object({
  mean: z.number(),
  ci_low: z.number().describe('2.5 % quantile of the bootstrap means'),
  ci_high: z.number().describe('97.5 % quantile of the bootstrap means'),
  p_value: z.number().nullable().describe('two-sided sign-flip p-value of mean = 0 (null: not an effect)'),
  // defaults: documents made before the corrections (a link, a stored session) still read
  p_holm: z
    .number()
    .nullable()
    .default(null)
    .describe("p_value adjusted over the table by Holm's step-down (family-wise)"),
  p_bh: z
    .number()
    .nullable()
    .default(null)
    .describe('p_value adjusted over the table by Benjamini–Hochberg (false discovery rate)'),
  per_example: z.array(z.number()).describe('the value of each pair used, in dataset order'),
});
export type ComponentStats = z.infer<typeof componentStats>;

export const statisticsBlock = z.object({
  method: z.string(),
  seed: z.number().int(),
  resamples: z.number().int(),
  sign_flips: z.union([z.number().int(), z.literal('exact')]),
  level: z.literal(0.95),
  correction: z
    .string()
    .default('none (made before the corrections)')
    .describe('the multiple-comparison corrections of p_holm and p_bh, and their family'),
});

/** the order of `ps` ascending (ties in their given order) */
const ascending = (ps: readonly number[]) => ps.map((_, i) => i).sort((a, b) => ps[a] - ps[b] || a - b);

/** Holm's step-down adjusted p-values (family-wise error rate), in the order given */
export function holm(ps: readonly number[]): number[] {
  const m = ps.length;
  const out = new Array<number>(m);
  let run = 0;
  ascending(ps).forEach((i, k) => {
    run = Math.max(run, Math.min(1, (m - k) * ps[i]));
    out[i] = run;
  });
  return out;
}

/** Benjamini–Hochberg's step-up adjusted p-values (false discovery rate), in the order given */
export function benjaminiHochberg(ps: readonly number[]): number[] {
  const m = ps.length;
  const out = new Array<number>(m);
  const order = ascending(ps);
  let run = 1;
  for (let k = m - 1; k >= 0; k--) {
    const i = order[k];
    run = Math.min(run, (m * ps[i]) / (k + 1));
    out[i] = Math.min(1, run);
  }
  return out;
}

/** rows with their p-values adjusted over all of them (those without a p-value keep null) */
export function adjustFamily<T extends { p_value: number | null }>(
  rows: T[],
): (T & { p_holm: number | null; p_bh: number | null })[] {
  const tested = rows.flatMap((r, i) => (r.p_value === null ? [] : [i]));
  const ps = tested.map((i) => rows[i].p_value!);
  const h = holm(ps);
  const b = benjaminiHochberg(ps);
  const out = rows.map((r) => ({ ...r, p_holm: null as number | null, p_bh: null as number | null }));
  tested.forEach((i, k) => {
    out[i].p_holm = h[k];
    out[i].p_bh = b[k];
  });
  return out;
}

/** quantile q of sorted values (linear interpolation, numpy's default) */
function quantile(sorted: Float64Array, q: number): number {
  const h = (sorted.length - 1) * q;
  const lo = Math.floor(h);
  const hi = Math.ceil(h);
  return sorted[lo] + (h - lo) * (sorted[hi] - sorted[lo]);
}

/**
 * `quantile(sorted a, q)` without sorting all of `a` (which it reorders): the two order statistics
 * the interpolation reads, by selection. The same value as sorting; NaN anywhere: sorts.
 */
function quantileUnsorted(a: Float64Array, q: number): number {
  for (let i = 0; i < a.length; i++) if (a[i] !== a[i]) return quantile(a.sort(), q);
  const h = (a.length - 1) * q;
  const lo = Math.floor(h);
  const vLo = select(a, lo);
  if (lo === h) return vLo;
  let vHi = Infinity;
  for (let i = lo + 1; i < a.length; i++) if (a[i] < vHi) vHi = a[i];
  return vLo + (h - lo) * (vHi - vLo);
}

/** the k-th smallest of `a` (Hoare's selection; `a` is left partitioned about it) */
function select(a: Float64Array, k: number): number {
  let lo = 0;
  let hi = a.length - 1;
  while (hi > lo) {
    const mid = (lo + hi) >> 1;
    // median of three as the pivot
    const x = a[lo];
    const y = a[mid];
    const z = a[hi];
    const pivot = x < y ? (y < z ? y : x < z ? z : x) : x < z ? x : y < z ? z : y;
    let i = lo;
    let j = hi;
    while (i <= j) {
      while (a[i] < pivot) i++;
      while (a[j] > pivot) j--;
      if (i <= j) {
        const t = a[i];
        a[i] = a[j];
        a[j] = t;
        i++;
        j--;
      }
    }
    if (k <= j) hi = j;
    else if (k >= i) lo = i;
    else return a[k];
  }
  return a[k];
}

/** The resamples and sign patterns for n pairs, drawn once and used for every component. */
export class DatasetStats {
  private readonly draws: Uint32Array;
  private readonly flips: Uint8Array | null;
  readonly exact: boolean;

  constructor(
    readonly n: number,
    readonly seed: number,
    readonly resamples = BOOTSTRAP_RESAMPLES,
    readonly signFlips = SIGN_FLIPS,
  ) {
    const r = rng(seed);
    this.draws = new Uint32Array(resamples * n);
    for (let i = 0; i < this.draws.length; i++) this.draws[i] = Math.floor(r() * n);
    this.exact = n <= EXACT_FLIPS_UP_TO;
    if (this.exact) this.flips = null;
    else {
      const f = rng(seed ^ 0x5bd1e995);
      this.flips = new Uint8Array(signFlips * n);
      for (let i = 0; i < this.flips.length; i++) this.flips[i] = f() < 0.5 ? 1 : 0;
    }
  }

  block(family = 0): z.infer<typeof statisticsBlock> {
    return {
      method:
        `mean over ${this.n} pairs; 95% CI: percentile bootstrap of the mean, ` +
        `${this.resamples} resamples with replacement (seeded, the same for every component); ` +
        'p-value: two-sided sign-flip test of mean = 0, ' +
        `${this.exact ? `all 2^${this.n} sign patterns` : `${this.signFlips} seeded random sign patterns, (1 + hits)/(1 + ${this.signFlips})`}.`,
      seed: this.seed,
      resamples: this.resamples,
      sign_flips: this.exact ? 'exact' : this.signFlips,
      level: 0.95,
      correction:
        `p_holm: Holm's step-down (family-wise error rate); p_bh: Benjamini–Hochberg (false discovery rate); ` +
        `each over the ${family} p-values of this table.`,
    };
  }

  /** the statistics block of a table: the method, and its rows with their p-values adjusted over the table */
  table<T extends { p_value: number | null }>(rows: T[]) {
    return { ...this.block(rows.filter((r) => r.p_value !== null).length), components: adjustFamily(rows) };
  }

  /** the statistics of one component's per-pair values (`effect`: also its p-value; adjusted by `table`) */
  of(values: ArrayLike<number>, effect: boolean): ComponentStats {
    const n = this.n;
    if (values.length !== n) throw new Error(`stats: ${values.length} values for ${n} pairs`);
    let sum = 0;
    for (let i = 0; i < n; i++) sum += values[i];
    const mean = sum / n;
    const means = new Float64Array(this.resamples);
    for (let b = 0; b < this.resamples; b++) {
      let s = 0;
      for (let i = 0; i < n; i++) s += values[this.draws[b * n + i]];
      means[b] = s / n;
    }
    means.sort();
    return {
      mean,
      ci_low: quantile(means, 0.025),
      ci_high: quantile(means, 0.975),
      p_value: effect ? this.signFlipP(values, Math.abs(mean)) : null,
      p_holm: null,
      p_bh: null,
      per_example: Array.from(values),
    };
  }

  /**
   * `of` for many components at once: `rows[i][c]` is pair i's value of component c, with the same
   * draws and patterns as `of`. The pairs go in groups of 8 whose 256 subset sums are tabled once
   * per block of components (one addition each); a resample's sum is then Σ over the bits p of its
   * draw counts of 2^p · (the subset sums of the pairs whose count has bit p): about 16 table rows
   * for 64 pairs instead of 64 values; a sign pattern's sum is total − 2 · (its flipped pairs'
   * sum), 8 rows. Each row adds into a whole block of components in one typed-array pass. The same
   * numbers as `of` up to the order of the additions (tests/stats-round2.test.ts).
   */
  many(
    rows: ArrayLike<number>[],
    count: number,
    effect: boolean,
    /** after each block of components (progress; a throw here cancels) */
    onBlock?: (done: number, total: number) => void,
  ): { ci_low: number; ci_high: number; p_value: number | null }[] {
    const n = this.n;
    if (rows.length !== n) throw new Error(`stats: ${rows.length} values per component for ${n} pairs`);
    const G = Math.ceil(n / 8);
    // a block's table of subset sums stays within about 2 MiB (cache-sized)
    const B = Math.max(8, Math.min(128, Math.floor(2 ** 18 / (G * 256))));
    const R = this.resamples;
    const boot = this.bootPlan(G);
    const flips = effect ? this.flipPlan(G) : null;
    const table = new Float64Array(G * 256 * B);
    const acc = new Float64Array(B);
    const total = new Float64Array(B);
    const thr = new Float64Array(B);
    const hits = new Float64Array(B);
    const means = new Float64Array(R * B);
    const col = new Float64Array(R);
    const out: { ci_low: number; ci_high: number; p_value: number | null }[] = [];
    /** acc[0..w) = Σ of the table rows start..end (each times its scale) */
    const sumRows = (w: number, rowsAt: Uint32Array, scale: Float64Array | null, start: number, end: number) => {
      acc.fill(0);
      for (let t = start; t < end; t++) {
        const o = rowsAt[t] * B;
        const k = scale ? scale[t] : 1;
        if (k === 1) for (let j = 0; j < w; j++) acc[j] += table[o + j];
        else for (let j = 0; j < w; j++) acc[j] += k * table[o + j];
      }
    };
    for (let c0 = 0; c0 < count; c0 += B) {
      const w = Math.min(B, count - c0);
      for (let g = 0; g < G; g++) {
        const base = g * 256;
        table.fill(0, base * B, base * B + B);
        for (let m = 1; m < 1 << Math.min(8, n - g * 8); m++) {
          const low = m & -m;
          const x = rows[g * 8 + 31 - Math.clz32(low)];
          const o = (base + m) * B;
          const prev = (base + (m ^ low)) * B;
          for (let j = 0; j < w; j++) table[o + j] = table[prev + j] + x[c0 + j];
        }
      }
      for (let b = 0; b < R; b++) {
        sumRows(w, boot.rows, boot.scale, boot.start[b], boot.start[b + 1]);
        for (let j = 0; j < w; j++) means[b * B + j] = acc[j] / n;
      }
      if (flips) {
        sumRows(w, flips.full, null, 0, G);
        total.set(acc);
        for (let j = 0; j < w; j++) {
          const obs = Math.abs(total[j] / n);
          // a small tolerance so that the observed pattern itself counts despite rounding
          thr[j] = obs - 1e-12 * Math.max(1, obs);
        }
        hits.fill(0);
        for (let k = 0; k < flips.patterns; k++) {
          sumRows(w, flips.rows, null, flips.start[k], flips.start[k + 1]);
          for (let j = 0; j < w; j++) if (Math.abs((total[j] - 2 * acc[j]) / n) >= thr[j]) hits[j]++;
        }
      }
      for (let j = 0; j < w; j++) {
        for (let b = 0; b < R; b++) col[b] = means[b * B + j];
        const p = !flips ? null : this.exact ? hits[j] / flips.patterns : (1 + hits[j]) / (1 + flips.patterns);
        const ci_low = quantileUnsorted(col, 0.025);
        out.push({ ci_low, ci_high: quantileUnsorted(col, 0.975), p_value: p });
      }
      onBlock?.(c0 + w, count);
    }
    return out;
  }

  /** each resample as table rows: for each bit p of the draw counts and group g, the pairs with that bit, scaled 2^p */
  private bootPlan(G: number): { start: Uint32Array; rows: Uint32Array; scale: Float64Array } {
    const n = this.n;
    const start = new Uint32Array(this.resamples + 1);
    const rows: number[] = [];
    const scale: number[] = [];
    const counts = new Uint32Array(n);
    for (let b = 0; b < this.resamples; b++) {
      counts.fill(0);
      for (let i = 0; i < n; i++) counts[this.draws[b * n + i]]++;
      for (let p = 0; 1 << p <= n; p++)
        for (let g = 0; g < G; g++) {
          let mask = 0;
          for (let i = g * 8; i < Math.min(n, g * 8 + 8); i++) if (counts[i] & (1 << p)) mask |= 1 << (i - g * 8);
          if (mask) (rows.push(g * 256 + mask), scale.push(2 ** p));
        }
      start[b + 1] = rows.length;
    }
    return { start, rows: Uint32Array.from(rows), scale: Float64Array.from(scale) };
  }

  /** each sign pattern (all 2^n when exact) as the table rows of its flipped pairs; `full`: every pair */
  private flipPlan(G: number): { patterns: number; start: Uint32Array; rows: Uint32Array; full: Uint32Array } {
    const n = this.n;
    const patterns = this.exact ? 2 ** n : this.signFlips;
    const start = new Uint32Array(patterns + 1);
    const rows: number[] = [];
    for (let k = 0; k < patterns; k++) {
      for (let g = 0; g < G; g++) {
        let mask = 0;
        for (let i = g * 8; i < Math.min(n, g * 8 + 8); i++)
          if (this.exact ? k & (1 << i) : this.flips![k * n + i]) mask |= 1 << (i - g * 8);
        if (mask) rows.push(g * 256 + mask);
      }
      start[k + 1] = rows.length;
    }
    const full = Uint32Array.from({ length: G }, (_, g) => g * 256 + (1 << Math.min(8, n - g * 8)) - 1);
    return { patterns, start, rows: Uint32Array.from(rows), full };
  }

  private signFlipP(values: ArrayLike<number>, observed: number): number {
    const n = this.n;
    // a small tolerance so that the observed pattern itself counts despite rounding
    const tol = 1e-12 * Math.max(1, observed);
    if (this.exact) {
      let hits = 0;
      const total = 2 ** n;
      for (let mask = 0; mask < total; mask++) {
        let s = 0;
        for (let i = 0; i < n; i++) s += mask & (1 << i) ? -values[i] : values[i];
        if (Math.abs(s / n) >= observed - tol) hits++;
      }
      return hits / total;
    }
    let hits = 0;
    for (let k = 0; k < this.signFlips; k++) {
      let s = 0;
      for (let i = 0; i < n; i++) s += this.flips![k * n + i] ? -values[i] : values[i];
      if (Math.abs(s / n) >= observed - tol) hits++;
    }
    return (1 + hits) / (1 + this.signFlips);
  }
}
