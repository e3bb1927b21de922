/**
 * Rotary tables for the positions of one run, computed on the CPU in float64 (HF computes them in
 * float32; the difference is far below 1e-6). HF rotate_half layout: cos = cos([f, f]) over rd dims.
 */
import type { RotarySpec } from '../spec';

/**
 * The inverse frequencies for a run whose positions end at seqLen − 1 (transformers'
 * modeling_rope_utils: `_compute_*_parameters`; longrope's factors are picked per forward by
 * `dynamic_rope_update`'s longrope_frequency_update, seq_len = max(position_ids) + 1).
 */
export function inverseFrequencies(r: RotarySpec, seqLen = 1): Float64Array {
  const half = r.dim / 2;
  const inv = new Float64Array(half);
  for (let i = 0; i < half; i++) inv[i] = 1 / Math.pow(r.theta, (2 * i) / r.dim);
  const s = r.scaling;
  if (!s) return inv;
  if (s.kind === 'linear') return inv.map((f) => f / s.factor);
  if (s.kind === 'longrope') {
    const ext = seqLen > s.originalMaxPositionEmbeddings! ? s.longFactor! : s.shortFactor!;
    return inv.map((f, i) => f / ext[i]);
  }
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
  const seqLen = positions.reduce((m, p) => Math.max(m, p), 0) + 1;
  const inv = inverseFrequencies(r, seqLen);
  // longrope scales cos and sin (HF: `emb.cos() * attention_scaling`)
  const a = r.scaling?.kind === 'longrope' ? (r.scaling.attentionFactor ?? 1) : 1;
  const half = r.dim / 2;
  const cos = new Float32Array(positions.length * r.dim);
  const sin = new Float32Array(positions.length * r.dim);
  positions.forEach((p, t) => {
    for (let i = 0; i < half; i++) {
      // HF multiplies in float32: match its rounding of the angle
      const angle = Math.fround(Math.fround(p) * Math.fround(inv[i]));
      const c = Math.cos(angle) * a,
        s = Math.sin(angle) * a;
      cos[t * r.dim + i] = c;
      cos[t * r.dim + half + i] = c;
      sin[t * r.dim + i] = s;
      sin[t * r.dim + half + i] = s;
    }
  });
  return { cos, sin };
}
