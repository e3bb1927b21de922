import { describe, it, expect } from 'vitest';
import { rocCurve, aucOf } from '../src/ui/views/roc-curve';

/** rank AUROC: P(score_pos > score_neg) + ½ P(tie) — the definition the probe reports */
function rankAuroc(s: number[], y: number[]): number {
  let num = 0,
    den = 0;
  for (let i = 0; i < s.length; i++)
    for (let j = 0; j < s.length; j++) {
      if (y[i] === 1 && y[j] === 0) {
        den++;
        num += s[i] > s[j] ? 1 : s[i] === s[j] ? 0.5 : 0;
      }
    }
  return num / den;
}

describe('ROC curve for the probe view', () => {
  it('is (0,0) → (1,1), monotone, and its area equals the rank AUROC, ties included', () => {
    const s = [0.9, 0.8, 0.8, 0.7, 0.4, 0.4, 0.3, 0.1, 0.8];
    const y = [1, 1, 0, 1, 0, 1, 0, 0, 1];
    const pts = rocCurve(s, y);
    expect(pts[0]).toMatchObject({ fpr: 0, tpr: 0 });
    expect(pts.at(-1)).toMatchObject({ fpr: 1, tpr: 1 });
    for (let i = 1; i < pts.length; i++) {
      expect(pts[i].fpr).toBeGreaterThanOrEqual(pts[i - 1].fpr);
      expect(pts[i].tpr).toBeGreaterThanOrEqual(pts[i - 1].tpr);
    }
    expect(aucOf(pts)).toBeCloseTo(rankAuroc(s, y), 12);
  });
  it('gives 1 for a perfect separator and 0.5 for constant scores', () => {
    expect(aucOf(rocCurve([0.9, 0.8, 0.2, 0.1], [1, 1, 0, 0]))).toBe(1);
    expect(aucOf(rocCurve([0.5, 0.5, 0.5, 0.5], [1, 0, 1, 0]))).toBe(0.5);
  });
});
