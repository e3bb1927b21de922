import { describe, it, expect } from 'vitest';
import { compareDocuments } from '../src/share/compare';

const doc = {
  operation: 'trace',
  model: { id: 'm', backend: 'webgpu' },
  predicted_token: ' the',
  top_heads: [
    { layer: 0, head: 1, logit_attribution: 0.5 },
    { layer: 1, head: 0, logit_attribution: -2.25 },
  ],
  decomposition: { sum: 12.5 },
};
const clone = () => JSON.parse(JSON.stringify(doc));

describe('compareDocuments', () => {
  it('matches an identical document and counts the numbers it compared', () => {
    const r = compareDocuments(doc, clone());
    expect(r.match).toBe(true);
    expect(r.compared).toBe(7);
    expect(r.maxAbsDiff).toBe(0);
  });
  it('accepts differences within 1e-4 and ignores the backend that ran it', () => {
    const b = clone();
    b.top_heads[0].logit_attribution += 9e-5;
    b.model.backend = 'wasm';
    const r = compareDocuments(doc, b);
    expect(r.match).toBe(true);
    expect(r.maxAbsDiff).toBeCloseTo(9e-5, 8);
  });
  it('flags a number off by more than 1e-4 with its path', () => {
    const b = clone();
    b.top_heads[0].logit_attribution += 2e-4;
    const r = compareDocuments(doc, b);
    expect(r.match).toBe(false);
    expect(r.mismatches[0].path).toBe('top_heads[0].logit_attribution');
  });
  it('uses a relative tolerance for large magnitudes', () => {
    const b = clone();
    b.decomposition.sum = 12.5 + 1e-3; // 8e-5 relative
    expect(compareDocuments(doc, b).match).toBe(true);
    b.decomposition.sum = 12.5 + 5e-3;
    expect(compareDocuments(doc, b).match).toBe(false);
  });
  it('flags changed strings, lengths, missing fields and NaN vs number', () => {
    const a = clone();
    a.predicted_token = ' a';
    expect(compareDocuments(doc, a).mismatches[0].path).toBe('predicted_token');
    const b = clone();
    b.top_heads.pop();
    expect(compareDocuments(doc, b).mismatches[0].path).toBe('top_heads.length');
    const c = clone();
    delete c.decomposition;
    expect(compareDocuments(doc, c).match).toBe(false);
    expect(compareDocuments({ x: NaN }, { x: 1 }).match).toBe(false);
    expect(compareDocuments({ x: NaN }, { x: NaN }).match).toBe(true);
  });
});
