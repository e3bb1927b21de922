/**
 * Rotary tables for the positions of one run, computed on the CPU in float64 (HF computes them in
 * float32; the difference is far below 1e-6). HF rotate_half layout: cos = cos([f, f]) over rd dims.
 */
import type { RotarySpec } from '../spec';

export function inverseFrequencies(r: RotarySpec): Float64Array {
  const half = r.dim / 2;
  const inv = new Float64Array(half);
  for (let i = 0; i < half; i++) inv[i] = 1 / Math.pow(r.theta, (2 * i) / r.dim);
  const s = r.scaling;
  if (!s) return inv;
  if (s.kind === 'linear') return inv.map((f) => f / s.factor);
  // llama3: long wavelengths slowed by `factor`, short ones kept, the band between interpolated
  const old = s.originalMaxPositionEmbeddings ?? 8192;
  const lowF = s.lowFreqFactor ?? 1;
  const highF = s.highFreqFactor ?? 4;
  const lowWavelen = old / lowF;
  const highWavelen = old / highF;
  return inv.map((f) => {
    const wavelen = (2 * Math.PI) / f;
    if (wavelen < highWavelen) return f;
    if (wavelen > lowWavelen) return f / s.factor;
    const smooth = (old / wavelen - lowF) / (highF - lowF);
    return (1 - smooth) * (f / s.factor) + smooth * f;
  });
}

export function ropeTables(r: RotarySpec, positions: number[]): { cos: Float32Array; sin: Float32Array } {
  const inv = inverseFrequencies(r);
  const half = r.dim / 2;
  const cos = new Float32Array(positions.length * r.dim);
  const sin = new Float32Array(positions.length * r.dim);
  positions.forEach((p, t) => {
    for (let i = 0; i < half; i++) {
      // HF multiplies in float32: match its rounding of the angle
      const angle = Math.fround(Math.fround(p) * Math.fround(inv[i]));
      const c = Math.cos(angle),
        s = Math.sin(angle);
      cos[t * r.dim + i] = c;
      cos[t * r.dim + half + i] = c;
      sin[t * r.dim + i] = s;
      sin[t * r.dim + half + i] = s;
    }
  });
  return { cos, sin };
}
