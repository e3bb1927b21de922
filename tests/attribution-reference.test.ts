// The attribution-graph oracle (tests/reference/attribution64.ts) against itself by two unrelated
// routes: every edge is a forward propagation through its frozen linear model, and a sample of
// columns is recomputed as finite differences through forward64's own forward with the freezes
// applied as hook replacements; every row sum plus the constant part must give the target value
// of the clean run (the replacement reproduces the model exactly). On both shared models, with a
// PLT set with skip and a CLT set, in circuit-tracer's layouts.

import { describe, it, expect } from 'vitest';
import { join } from 'node:path';
import { loadModelDir, type RefModel } from './reference';
import { cleanState, frozenDifference, referenceAttribution } from './reference/attribution64';
import { makeRandomTranscoders } from './helpers/random-transcoders';
import { SHARED } from './helpers/shared';

const MODELS: [string, string, number[]][] = [
  ['induction-gpt2', 'models/induction-gpt2', [256, 10, 20, 30, 40, 10, 20, 30]],
  ['stories260K', 'models/stories260K', [1, 300, 301, 302, 40, 300, 301, 302, 40]],
];

function dims(m: RefModel) {
  return { L: m.config.n_layer ?? m.config.num_hidden_layers, D: m.config.n_embd ?? m.config.hidden_size };
}

describe.each(MODELS)('attribution oracle on %s', (_name, rel, tokens) => {
  const model = loadModelDir(join(SHARED, rel));
  const { L, D } = dims(model);
  it.each(['plt', 'clt'] as const)('%s: row sums + constant = target, columns = finite differences', (kind) => {
    const opts = { kind, nLayers: L, dModel: D, features: 96, skip: kind === 'plt' } as const;
    const probe = makeRandomTranscoders(opts);
    const calibrate = cleanState(model, tokens, probe.ref).xin;
    probe.cleanup();
    const tc = makeRandomTranscoders({ ...opts, calibrate, l0: 6 });
    try {
      const r = referenceAttribution(model, tokens, tc.ref);
      const N = r.nodes.length;
      expect(r.active.length).toBeGreaterThan(40);
      const targets = r.nodes.map((_, i) => i).filter((i) => ['feature', 'logit'].includes(r.nodes[i].kind));
      let worst = 0;
      for (const t of targets) {
        let s = 0;
        for (let j = 0; j < N; j++) s += r.adjacency[t * N + j];
        worst = Math.max(worst, Math.abs(s + r.constant[t] - r.targetValue[t]));
      }
      expect(worst).toBeLessThan(1e-9);
      // a feature, an error, a token column (and one more feature) by finite differences
      const nF = r.selected.length;
      let fd = 0;
      for (const s of [0, nF - 1, nF + 1 * tokens.length + 3, nF + L * tokens.length + 2]) {
        const col = frozenDifference(model, r, tc.ref, s, targets);
        targets.forEach((t, i) => (fd = Math.max(fd, Math.abs(col[i] - r.adjacency[t * N + s]))));
      }
      expect(fd).toBeLessThan(1e-9);
      // edges are not all tiny, and the error nodes take part (0 < replacement score < 1)
      let big = 0;
      for (const t of targets) for (let j = 0; j < N; j++) big = Math.max(big, Math.abs(r.adjacency[t * N + j]));
      expect(big).toBeGreaterThan(0.1);
      expect(r.scores.replacement).toBeGreaterThan(0);
      expect(r.scores.replacement).toBeLessThan(1);
    } finally {
      tc.cleanup();
    }
  });
});
