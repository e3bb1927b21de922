/**
 * A random per-layer transcoder set (PLT) at a real width for the benches, in circuit-tracer's
 * layout: config.yaml (model_kind: transcoder_set, mlp.hook_in → hook_mlp_out as its Gemma sets
 * have) and layer_{i}.safetensors holding W_enc [F, d], W_dec [F, d], b_enc [F], b_dec [d] and
 * activation_function.threshold [F] in F32, written layer by layer so no set is held in memory
 * (tests/helpers/random-transcoders.ts is the small float64 one the oracle reads).
 *
 * The encoder's entries are N(0, 1/d): on an RMS-normalised input (mlp.hook_in after a unit-weight
 * RMSNorm, as a random Gemma's (1 + 0) norms give) each pre-activation is about N(0, 1), so one
 * JumpReLU threshold z with P(N(0, 1) > z) = l0 / F leaves about l0 features active per position.
 */
import { closeSync, mkdirSync, openSync, writeFileSync, writeSync } from 'node:fs';
import * as path from 'node:path';

export interface BenchTranscoderOptions {
  nLayers: number;
  dModel: number;
  features: number;
  /** features active per position, about (sets the threshold) */
  l0: number;
  seed?: number;
}

/** a table of N(0, 1) float32 values; tensors are filled with random runs of it (fast) */
function normalTable(n: number, seed: number): Float32Array {
  let a = seed >>> 0;
  const u = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (((t ^ (t >>> 14)) >>> 0) + 0.5) / 4294967296;
  };
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = Math.sqrt(-2 * Math.log(u())) * Math.cos(2 * Math.PI * u());
  return out;
}

/** the standard normal's upper quantile: z with P(N(0, 1) > z) = p (bisection on erfc) */
export function normalUpperQuantile(p: number): number {
  const erfc = (x: number) => {
    // Numerical Recipes' erfc (fractional error < 1.2e-7)
    const z = Math.abs(x);
    const t = 1 / (1 + 0.5 * z);
    const r =
      t *
      Math.exp(
        -z * z -
          1.26551223 +
          t *
            (1.00002368 +
              t *
                (0.37409196 +
                  t *
                    (0.09678418 +
                      t *
                        (-0.18628806 +
                          t *
                            (0.27886807 +
                              t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))),
      );
    return x >= 0 ? r : 2 - r;
  };
  let lo = -10,
    hi = 10;
  for (let i = 0; i < 100; i++) {
    const mid = (lo + hi) / 2;
    if (0.5 * erfc(mid / Math.SQRT2) > p) lo = mid;
    else hi = mid;
  }
  return (lo + hi) / 2;
}

/** Write the set into `dir`; returns its weight bytes. */
export function generateTranscoders(o: BenchTranscoderOptions, dir: string): number {
  const { nLayers: L, dModel: D, features: F } = o;
  mkdirSync(dir, { recursive: true });
  writeFileSync(
    path.join(dir, 'config.yaml'),
    [
      'model_kind: transcoder_set',
      'feature_input_hook: "mlp.hook_in"',
      'feature_output_hook: "hook_mlp_out"',
      `# random weights for the benches: ${F} features per layer, about ${o.l0} active per position`,
      '',
    ].join('\n'),
  );
  const table = normalTable(1 << 20, o.seed ?? 5);
  const zCut = normalUpperQuantile(o.l0 / F);
  let seed = o.seed ?? 5;
  const tensors: [string, number[], (out: Float32Array) => void][] = [
    ['W_enc', [F, D], (out) => fillRuns(out, 1 / Math.sqrt(D))],
    ['W_dec', [F, D], (out) => fillRuns(out, 0.02)],
    ['b_enc', [F], (out) => out.fill(0)],
    ['b_dec', [D], (out) => out.fill(0)],
    ['activation_function.threshold', [F], (out) => out.fill(zCut)],
  ];
  function fillRuns(out: Float32Array, scale: number) {
    for (let i = 0; i < out.length; i += 4096) {
      seed = (seed * 1103515245 + 12345) >>> 0;
      const st = seed % (table.length - 4096);
      const n = Math.min(4096, out.length - i);
      for (let k = 0; k < n; k++) out[i + k] = scale * table[st + k];
    }
  }
  let total = 0;
  for (let l = 0; l < L; l++) {
    const header: Record<string, unknown> = { __metadata__: { format: 'pt' } };
    let off = 0;
    for (const [name, dims] of tensors) {
      const bytes = dims.reduce((a, b) => a * b, 1) * 4;
      header[name] = { dtype: 'F32', shape: dims, data_offsets: [off, off + bytes] };
      off += bytes;
    }
    let json = JSON.stringify(header);
    json += ' '.repeat((8 - ((8 + json.length) % 8)) % 8);
    const fd = openSync(path.join(dir, `layer_${l}.safetensors`), 'w');
    try {
      const len = Buffer.alloc(8);
      len.writeBigUInt64LE(BigInt(json.length));
      writeSync(fd, len);
      writeSync(fd, Buffer.from(json));
      for (const [, dims, fill] of tensors) {
        const out = new Float32Array(dims.reduce((a, b) => a * b, 1));
        fill(out);
        writeSync(fd, new Uint8Array(out.buffer));
      }
    } finally {
      closeSync(fd);
    }
    total += off;
  }
  return total;
}
