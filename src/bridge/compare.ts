/**
 * The `compare` tool: two stored results (results.ts) put side by side with the page's own
 * comparison (share/compare-grids.ts: the grids of each operation's document, Δ = B − A with rows
 * and columns matched by name), plus the documents walked as numbers (share/compare.ts).
 */
import { deltaOf, gridsOf, type Grid } from '../share/compare-grids';
import { compareDocuments } from '../share/compare';
import type { StoredResult } from './results';

const ref = (r: StoredResult) => ({
  uri: r.uri,
  operation: r.operation,
  model: r.model ?? null,
  prompt: r.prompt ?? null,
});

export function compareResults(a: StoredResult, b: StoredResult) {
  const docA = JSON.parse(a.json) as unknown;
  const docB = JSON.parse(b.json) as unknown;
  const ga = gridsOf(a.operation, docA) ?? [];
  const gb = gridsOf(b.operation, docB) ?? [];
  const keys = [...new Set([...ga.map((g) => g.key), ...gb.map((g) => g.key)])];
  const grids = keys.map((key) => {
    const x: Grid | undefined = ga.find((g) => g.key === key);
    const y: Grid | undefined = gb.find((g) => g.key === key);
    const g = (x ?? y)!;
    const d =
      a.operation === b.operation
        ? deltaOf(docA, docB, x, y)
        : { ok: false as const, reason: `Not comparable: A is ${a.operation} and B is ${b.operation}.` };
    let max: number | null = null;
    if (d.ok) for (const row of d.values) for (const v of row) if (v !== null) max = Math.max(max ?? 0, Math.abs(v));
    return {
      key,
      what: g.what,
      rows: g.rows,
      cols: g.cols,
      delta: d.ok ? d.values : null,
      max_abs_delta: max,
      note: d.ok ? d.note : null,
      reason: d.ok ? null : d.reason,
    };
  });
  const n = compareDocuments(docA, docB, 1e-4, 5);
  return {
    a: ref(a),
    b: ref(b),
    grids,
    numbers: {
      compared: n.compared,
      max_abs_diff: n.maxAbsDiff,
      match: n.match,
      first_differences: n.mismatches.map((m) => m.path || '(document)'),
    },
  };
}
