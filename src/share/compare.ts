/**
 * Did a re-run reproduce a shared result? Walk both documents together: numbers must agree within
 * `tol` (absolute, or relative for magnitudes above 1 — logits of large models run into the tens),
 * everything else must be equal. Fields that legitimately differ between machines (the backend
 * that ran it, timings) are skipped.
 */

export interface Mismatch {
  path: string;
  shared: unknown;
  rerun: unknown;
}

export interface CompareResult {
  match: boolean;
  /** largest |Δ| seen over all numeric leaves */
  maxAbsDiff: number;
  /** how many numeric leaves were compared */
  compared: number;
  /** the first few mismatches */
  mismatches: Mismatch[];
}

const SKIP_KEYS = new Set([
  'backend',
  'elapsed_ms',
  'timing',
  'timings',
  'duration_ms',
  'created_at',
  'handle',
  'share_url',
]);

export function compareDocuments(shared: unknown, rerun: unknown, tol = 1e-4, maxReported = 10): CompareResult {
  const res: CompareResult = { match: true, maxAbsDiff: 0, compared: 0, mismatches: [] };
  const fail = (path: string, a: unknown, b: unknown) => {
    res.match = false;
    if (res.mismatches.length < maxReported) res.mismatches.push({ path, shared: a, rerun: b });
  };
  const walk = (a: unknown, b: unknown, path: string): void => {
    if (typeof a === 'number' && typeof b === 'number') {
      res.compared++;
      if (Number.isNaN(a) && Number.isNaN(b)) return;
      if (a === b) return; // also equal infinities
      const d = Math.abs(a - b);
      if (!Number.isFinite(d)) return fail(path, a, b);
      if (d > res.maxAbsDiff) res.maxAbsDiff = d;
      if (d > tol * Math.max(1, Math.abs(a), Math.abs(b))) fail(path, a, b);
      return;
    }
    if (Array.isArray(a) && Array.isArray(b)) {
      if (a.length !== b.length) return fail(`${path}.length`, a.length, b.length);
      for (let i = 0; i < a.length; i++) walk(a[i], b[i], `${path}[${i}]`);
      return;
    }
    if (a && b && typeof a === 'object' && typeof b === 'object' && !Array.isArray(a) && !Array.isArray(b)) {
      const ao = a as Record<string, unknown>;
      const bo = b as Record<string, unknown>;
      const keys = new Set([...Object.keys(ao), ...Object.keys(bo)]);
      for (const k of keys) {
        if (SKIP_KEYS.has(k)) continue;
        walk(ao[k], bo[k], path ? `${path}.${k}` : k);
      }
      return;
    }
    if (a !== b) fail(path, a, b);
  };
  walk(shared, rerun, '');
  return res;
}
