/**
 * `Range: bytes=a-b` (or `a-`, `-n`) as [start, end] inclusive; undefined for no header or one not answered with a
 * part (several ranges, another unit: the whole file); null for a range outside the file (416). Static servers (the
 * preview, `npm start`) and the page's service worker answer ranges with it.
 */
export function byteRange(h: string | null | undefined, size: number): [number, number] | null | undefined {
  const m = h ? /^bytes=(\d*)-(\d*)$/.exec(h.trim()) : null;
  if (!m || (m[1] === '' && m[2] === '')) return undefined;
  if (m[1] === '') {
    const n = Number(m[2]);
    return n === 0 || size === 0 ? null : [Math.max(0, size - n), size - 1];
  }
  const start = Number(m[1]);
  const end = m[2] === '' ? size - 1 : Math.min(Number(m[2]), size - 1);
  return start >= size || end < start ? null : [start, end];
}
