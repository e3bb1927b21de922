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
  per_example: z.array(z.number()).describe('the value of each pair used, in dataset order'),
});
export type ComponentStats = z.infer<typeof componentStats>;

export const statisticsBlock = z.object({
  method: z.string(),
  seed: z.number().int(),
  resamples: z.number().int(),
  sign_flips: z.union([z.number().int(), z.literal('exact')]),
  level: z.literal(0.95),
});

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
  ) {
    const r = rng(seed);
    this.draws = new Uint32Array(resamples * n);
    for (let i = 0; i < this.draws.length; i++) this.draws[i] = Math.floor(r() * n);
    this.exact = n <= EXACT_FLIPS_UP_TO;
    if (this.exact) this.flips = null;
    else {
      const f = rng(seed ^ 0x5bd1e995);
      this.flips = new Uint8Array(SIGN_FLIPS * n);
      for (let i = 0; i < this.flips.length; i++) this.flips[i] = f() < 0.5 ? 1 : 0;
    }
  }

  block(): z.infer<typeof statisticsBlock> {
    return {
      method:
        `mean over ${this.n} pairs; 95% CI: percentile bootstrap of the mean, ` +
        `${this.resamples} resamples with replacement (seeded, the same for every component); ` +
        'p-value: two-sided sign-flip test of mean = 0, ' +
        `${this.exact ? `all 2^${this.n} sign patterns` : `${SIGN_FLIPS} seeded random sign patterns, (1 + hits)/(1 + ${SIGN_FLIPS})`}.`,
      seed: this.seed,
      resamples: this.resamples,
      sign_flips: this.exact ? 'exact' : SIGN_FLIPS,
      level: 0.95,
    };
  }

  /** the statistics of one component's per-pair values (`effect`: also its p-value) */
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
      per_example: Array.from(values),
    };
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
    for (let k = 0; k < SIGN_FLIPS; k++) {
      let s = 0;
      for (let i = 0; i < n; i++) s += this.flips![k * n + i] ? -values[i] : values[i];
      if (Math.abs(s / n) >= observed - tol) hits++;
    }
    return (1 + hits) / (1 + SIGN_FLIPS);
  }
}
