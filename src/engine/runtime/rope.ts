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
  // proportional RoPE (Gemma 4): frequencies past `angles` are 0, their dims never turn
  for (let i = 0; i < half; i++) inv[i] = i < (r.angles ?? half) ? 1 / Math.pow(r.theta, (2 * i) / r.dim) : 0;
  const s = r.scaling;
  if (!s) return inv;
  if (s.kind === 'linear') return inv.map((f) => f / s.factor);
  if (s.kind === 'longrope') {
    const ext = seqLen > s.originalMaxPositionEmbeddings! ? s.longFactor! : s.shortFactor!;
    return inv.map((f, i) => f / ext[i]);
  }
  if (s.kind === 'yarn') {
    // YaRN: dims below `low` keep their frequency, above `high` are divided by factor, a linear ramp between
    const rd = r.dim;
    const at = (rotations: number) =>
      (rd * Math.log(s.originalMaxPositionEmbeddings! / (rotations * 2 * Math.PI))) / (2 * Math.log(r.theta));
    let low = at(s.betaFast ?? 32);
    let high = at(s.betaSlow ?? 1);
    if (s.truncate ?? true) [low, high] = [Math.floor(low), Math.ceil(high)];
    low = Math.max(low, 0);
    high = Math.min(high, rd - 1);
    if (low === high) high += 0.001;
    return inv.map((f, i) => {
      const keep = 1 - Math.min(1, Math.max(0, (i - low) / (high - low)));
      return (f / s.factor) * (1 - keep) + f * keep;
    });
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
  // longrope and yarn scale cos and sin (HF: `emb.cos() * attention_scaling`)
  const k = r.scaling?.kind;
  const a = k === 'longrope' || k === 'yarn' ? (r.scaling!.attentionFactor ?? 1) : 1;
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
