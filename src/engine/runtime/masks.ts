/** Additive attention masks [T, P + T]: 0 where query t may attend key k, -inf elsewhere. */
export function attentionMask(T: number, past: number, window: number | null): Float32Array {
  const Tk = past + T;
  const m = new Float32Array(T * Tk);
  for (let t = 0; t < T; t++) {
    const q = past + t; // absolute position of this query
    for (let k = 0; k < Tk; k++) {
      const ok = k <= q && (window === null || q - k < window);
      m[t * Tk + k] = ok ? 0 : -Infinity;
    }
  }
  return m;
}
