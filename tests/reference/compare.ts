// Helpers to compare engine outputs against the reference.

export interface HookComparison {
  name: string;
  maxAbs: number;
  /** index of the worst element */
  at: number;
  ok: boolean;
  note?: string;
}

/** max |a - b|, treating equal infinities (masked scores) as equal; NaN or mismatched infinities give Infinity. */
export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): { maxAbs: number; at: number } {
  if (a.length !== b.length) return { maxAbs: Infinity, at: -1 };
  let m = 0;
  let at = -1;
  for (let i = 0; i < a.length; i++) {
    const x = a[i],
      y = b[i];
    let d: number;
    if (x === y)
      d = 0; // includes -Inf === -Inf
    else if (!Number.isFinite(x) || !Number.isFinite(y)) d = Infinity;
    else d = Math.abs(x - y);
    if (d > m || (Number.isNaN(d) && m !== Infinity)) {
      m = Number.isNaN(d) ? Infinity : d;
      at = i;
    }
  }
  return { maxAbs: m, at };
}

/**
 * Compare a set of engine hook values with reference ones. Shapes must match exactly (dims).
 * `tolerance` is absolute. Attention scores that are -Infinity in the reference may be any value
 * ≤ `maskedBelow` in the engine (engines often mask with a large negative number instead).
 */
export function compareHooks(
  reference: Record<string, { dims: number[]; data: ArrayLike<number> }>,
  engine: Record<string, { dims: readonly number[]; data: ArrayLike<number> }>,
  names: string[],
  tolerance = 1e-4,
  maskedBelow = -1e4,
): HookComparison[] {
  const out: HookComparison[] = [];
  for (const name of names) {
    const r = reference[name];
    const e = engine[name];
    if (!r || !e) {
      out.push({ name, maxAbs: Infinity, at: -1, ok: false, note: !r ? 'missing in reference' : 'missing in engine' });
      continue;
    }
    if (r.dims.length !== e.dims.length || r.dims.some((d, k) => d !== e.dims[k])) {
      out.push({ name, maxAbs: Infinity, at: -1, ok: false, note: `dims [${e.dims}] != reference [${r.dims}]` });
      continue;
    }
    let ed: ArrayLike<number> = e.data;
    if (name.endsWith('hook_attn_scores')) {
      const fixed = new Float64Array(e.data.length);
      for (let i = 0; i < fixed.length; i++)
        fixed[i] = r.data[i] === -Infinity && e.data[i] <= maskedBelow ? -Infinity : e.data[i];
      ed = fixed;
    }
    const { maxAbs, at } = maxAbsDiff(r.data, ed);
    out.push({ name, maxAbs, at, ok: maxAbs <= tolerance });
  }
  return out;
}
