/** Number formatting shared by the views: enough digits to compare with the CLI, no noise. */

export function fmt(v: number | null | undefined, digits = 4): string {
  if (v === null || v === undefined) return '–';
  if (Number.isNaN(v)) return 'NaN';
  if (!Number.isFinite(v)) return v > 0 ? '∞' : '−∞';
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(Math.max(1, digits - 1));
  const s = v.toFixed(digits);
  // a negative value that rounds to zero is shown as zero, not "-0.00"
  return /^-0\.?0*$/.test(s) ? s.slice(1) : s;
}

/** A difference that is a check's verdict (max |Δ|): 0 when it is 0, else its value to two digits, however small. */
export function fmtDiff(v: number | null | undefined): string {
  if (v === null || v === undefined) return '–';
  return v === 0 ? '0' : Math.abs(v) < 0.01 || Math.abs(v) >= 1e5 ? v.toExponential(1) : v.toFixed(2);
}

export function fmtBytes(n: number | null | undefined): string {
  if (n === null || n === undefined) return '–';
  const u = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  let x = n;
  while (x >= 1024 && i < u.length - 1) {
    x /= 1024;
    i++;
  }
  return `${x < 10 && i > 0 ? x.toFixed(1) : Math.round(x)} ${u[i]}`;
}

export function fmtPct(v: number | null | undefined, digits = 1): string {
  if (v === null || v === undefined || !Number.isFinite(v)) return '–';
  return `${(v * 100).toFixed(digits)}%`;
}

export { showToken } from '../../share/token-text';
