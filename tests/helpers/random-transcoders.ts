/**
 * Random transcoder sets in circuit-tracer's on-disk layouts (utils/caching.py, transcoder/*.py
 * to_safetensors), for tests and the bench:
 *   PLT  config.yaml (model_kind: transcoder_set) + layer_{i}.safetensors
 *        {W_enc [F,d], W_dec [F,d], b_enc [F], b_dec [d], activation_function.threshold [F]?, W_skip [d,d]?}
 *   CLT  config.yaml (model_kind: cross_layer_transcoder) + W_enc_{i}.safetensors
 *        {W_enc_i [F,d], b_enc_i [F], b_dec_i [d], threshold_i [F]?} + W_dec_{i}.safetensors {W_dec_i [F, L−i, d]}
 * The stored values (float32, or `dtype`) come back as a float64 RefTranscoders for the oracle.
 * Thresholds (JumpReLU) or encoder biases (ReLU) are set from `calibrate` (each layer's input-hook
 * values on a prompt) so that about `l0` features fire per position.
 */
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { encodeSafetensors, gaussian, mulberry32, roundToDtype, type StDtype } from '../reference';
import type { InputHook, OutputHook, RefTranscoders } from '../reference/attribution64';

export interface RandomTranscoderOptions {
  kind: 'plt' | 'clt';
  nLayers: number;
  dModel: number;
  features: number;
  activation?: 'jumprelu' | 'relu' | 'topk';
  k?: number;
  skip?: boolean;
  inputHook?: InputHook;
  outputHook?: OutputHook;
  /** features active per position, roughly (from `calibrate`) */
  l0?: number;
  /** per layer, [T·d] input-hook values to set thresholds from (positions ≥ 1 are used) */
  calibrate?: Float64Array[];
  seed?: number;
  dtype?: StDtype;
  /** decoder scale (default 0.1) */
  decScale?: number;
  /** extra config.yaml lines */
  extraConfig?: string;
  dir?: string;
}

export interface RandomTranscoderSet {
  dir: string;
  ref: RefTranscoders;
  /** the config.yaml text written */
  config: string;
  cleanup(): void;
}

function quantile(values: number[], q: number): number {
  const s = values.slice().sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.floor(q * s.length)))];
}

export function makeRandomTranscoders(o: RandomTranscoderOptions): RandomTranscoderSet {
  const { kind, nLayers: L, dModel: D, features: F } = o;
  const activation = o.activation ?? 'jumprelu';
  const dtype = o.dtype ?? 'F32';
  const g = gaussian(mulberry32(o.seed ?? 11));
  const rnd = (n: number, s: number) => Float64Array.from({ length: n }, () => s * g());
  const stored = (a: Float64Array) => Float64Array.from(roundToDtype(a, dtype));
  const l0 = o.l0 ?? 6;
  const dir = o.dir ?? mkdtempSync(path.join(tmpdir(), 'loupe-tc-'));
  const layers: RefTranscoders['layers'] = [];
  for (let l = 0; l < L; l++) {
    const W_enc = stored(rnd(F * D, 1 / Math.sqrt(D)));
    let b_enc = stored(rnd(F, 0.05));
    let threshold: Float64Array | null = null;
    const cal = o.calibrate?.[l];
    // a cut at the pre-activation quantile that leaves ~l0 of F features above it
    let cut = 0.5;
    if (cal) {
      const T = cal.length / D;
      const pre: number[] = [];
      for (let t = 1; t < T; t++)
        for (let f = 0; f < F; f++) {
          let s = b_enc[f];
          for (let i = 0; i < D; i++) s += W_enc[f * D + i] * cal[t * D + i];
          pre.push(s);
        }
      cut = quantile(pre, 1 - l0 / F);
    }
    if (activation === 'jumprelu') threshold = stored(Float64Array.from({ length: F }, () => cut * (1 + 0.1 * g())));
    if (activation === 'relu') b_enc = stored(b_enc.map((b) => b - cut));
    const nOut = kind === 'plt' ? 1 : L - l;
    const W_dec = stored(rnd(F * nOut * D, (o.decScale ?? 0.1) / Math.sqrt(nOut)));
    const b_dec = stored(rnd(D, 0.05));
    const W_skip = o.skip ? stored(rnd(D * D, 0.3 / Math.sqrt(D))) : null;
    layers.push({ W_enc, b_enc, b_dec, threshold, W_dec, W_skip });
    const t = (dims: number[], data: Float64Array) => ({ dims, data, dtype });
    if (kind === 'plt') {
      const tensors: Record<string, ReturnType<typeof t>> = {
        W_enc: t([F, D], W_enc),
        W_dec: t([F, D], W_dec),
        b_enc: t([F], b_enc),
        b_dec: t([D], b_dec),
      };
      if (threshold) tensors['activation_function.threshold'] = t([F], threshold);
      if (W_skip) tensors.W_skip = t([D, D], W_skip);
      writeFileSync(path.join(dir, `layer_${l}.safetensors`), encodeSafetensors(tensors));
    } else {
      const enc: Record<string, ReturnType<typeof t>> = {
        [`W_enc_${l}`]: t([F, D], W_enc),
        [`b_enc_${l}`]: t([F], b_enc),
        [`b_dec_${l}`]: t([D], b_dec),
      };
      if (threshold) enc[`threshold_${l}`] = t([F], threshold);
      writeFileSync(path.join(dir, `W_enc_${l}.safetensors`), encodeSafetensors(enc));
      writeFileSync(
        path.join(dir, `W_dec_${l}.safetensors`),
        encodeSafetensors({ [`W_dec_${l}`]: t([F, nOut, D], W_dec) }),
      );
    }
  }
  const inputHook = o.inputHook ?? 'mlp.hook_in';
  const outputHook = o.outputHook ?? (kind === 'plt' ? 'mlp.hook_out' : 'hook_mlp_out');
  const config =
    [
      `model_kind: ${kind === 'plt' ? 'transcoder_set' : 'cross_layer_transcoder'}`,
      `feature_input_hook: "${inputHook}"`,
      `feature_output_hook: '${outputHook}'`,
      '# random weights for tests',
      ...(activation === 'topk'
        ? ['activation: topk', `k: ${o.k ?? l0}`]
        : activation === 'relu'
          ? ['activation: relu']
          : []),
      ...(o.extraConfig ? [o.extraConfig] : []),
    ].join('\n') + '\n';
  writeFileSync(path.join(dir, 'config.yaml'), config);
  return {
    dir,
    config,
    ref: { kind, F, inputHook, outputHook, activation, ...(activation === 'topk' ? { k: o.k ?? l0 } : {}), layers },
    cleanup: () => rmSync(dir, { recursive: true, force: true }),
  };
}
