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
   * `of` for many components at once: `rows[i][c]` is pair i's value of component c. The same
   * draws and patterns as `of`, summed in the same order (the same numbers), but over contiguous
   * blocks of components (about 3× faster on a graph of 32 000 edges).
   */
  many(
    rows: ArrayLike<number>[],
    count: number,
    effect: boolean,
    /** after each block of components (progress; a throw here cancels) */
    onBlock?: (done: number, total: number) => void,
  ): { ci_low: number; ci_high: number; p_value: number | null }[] {
    const n = this.n;
    if (rows.length !== n) throw new Error(`stats: ${rows.length} rows for ${n} pairs`);
    const out: { ci_low: number; ci_high: number; p_value: number | null }[] = [];
    const B = 512;
    const R = this.resamples;
    const F = this.exact ? 0 : this.signFlips;
    const block = new Float64Array(n * B);
    const acc = new Float64Array(B);
    const means = new Float64Array(R * B);
    const col = new Float64Array(R);
    const hits = new Float64Array(B);
    const obs = new Float64Array(B);
    for (let c0 = 0; c0 < count; c0 += B) {
      const w = Math.min(B, count - c0);
      for (let i = 0; i < n; i++) for (let j = 0; j < w; j++) block[i * B + j] = rows[i][c0 + j];
      for (let b = 0; b < R; b++) {
        acc.fill(0);
        for (let i = 0; i < n; i++) {
          const o = this.draws[b * n + i] * B;
          for (let j = 0; j < w; j++) acc[j] += block[o + j];
        }
        for (let j = 0; j < w; j++) means[j * R + b] = acc[j] / n;
      }
      if (effect && !this.exact) {
        acc.fill(0);
        for (let i = 0; i < n; i++) for (let j = 0; j < w; j++) acc[j] += block[i * B + j];
        for (let j = 0; j < w; j++) obs[j] = Math.abs(acc[j] / n);
        hits.fill(0);
        for (let k = 0; k < F; k++) {
          acc.fill(0);
          for (let i = 0; i < n; i++) {
            const o = i * B;
            if (this.flips![k * n + i]) for (let j = 0; j < w; j++) acc[j] -= block[o + j];
            else for (let j = 0; j < w; j++) acc[j] += block[o + j];
          }
          for (let j = 0; j < w; j++) if (Math.abs(acc[j] / n) >= obs[j] - 1e-12 * Math.max(1, obs[j])) hits[j]++;
        }
      }
      const v = new Float64Array(n);
      for (let j = 0; j < w; j++) {
        col.set(means.subarray(j * R, j * R + R));
        col.sort();
        let p: number | null = null;
        if (effect) {
          if (this.exact) {
            for (let i = 0; i < n; i++) v[i] = block[i * B + j];
            let sum = 0;
            for (let i = 0; i < n; i++) sum += v[i];
            p = this.signFlipP(v, Math.abs(sum / n));
          } else p = (1 + hits[j]) / (1 + F);
        }
        out.push({ ci_low: quantile(col, 0.025), ci_high: quantile(col, 0.975), p_value: p });
      }
      onBlock?.(c0 + w, count);
    }
    return out;
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
