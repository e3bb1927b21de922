/**
 * Inflating compressed input (a gzip file, a raw DEFLATE stream) with a running bound: the input
 * is pushed to fflate in slices of SLICE bytes, the output counted as it comes, and inflation
 * stops at the first slice past the cap. fflate inflates all it is given per push (DEFLATE
 * expands at most ~1,032×), so a 1 MiB push of a bomb was ~1 GiB at once; a 4 KiB slice is at
 * most ~4 MiB past the cap. The one place compressed input is inflated.
 */
import { Gunzip, Inflate } from 'fflate';

/** compressed bytes per push */
export const SLICE = 4096;

export function isGzip(b: Uint8Array): boolean {
  return b.length >= 2 && b[0] === 0x1f && b[1] === 0x8b;
}

/**
 * The inflated bytes of `bytes` (gzip, multi-member too, or raw DEFLATE); `tooLarge()` is thrown
 * as soon as the output passes `maxBytes`; corrupt input throws fflate's error.
 */
export function inflateCapped(
  bytes: Uint8Array,
  opts: { format: 'gzip' | 'deflate'; maxBytes: number; tooLarge: () => Error },
): Uint8Array {
  const parts: Uint8Array[] = [];
  let total = 0;
  const onData = (chunk: Uint8Array) => {
    total += chunk.byteLength;
    if (total > opts.maxBytes) throw opts.tooLarge();
    parts.push(chunk);
  };
  const z = opts.format === 'gzip' ? new Gunzip(onData) : new Inflate(onData);
  if (bytes.byteLength === 0) z.push(bytes, true);
  for (let off = 0; off < bytes.byteLength; off += SLICE)
    z.push(bytes.subarray(off, Math.min(off + SLICE, bytes.byteLength)), off + SLICE >= bytes.byteLength);
  const out = new Uint8Array(total);
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.byteLength;
  }
  return out;
}
