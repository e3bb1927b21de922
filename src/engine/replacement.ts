/**
 * The local replacement model of one prompt (circuit-tracer's `setup_attribution`,
 * replacement_model_transformerlens.py:424-473, and `compute_batch`, context_transformerlens.py):
 *
 *   prepare  one clean forward: every layer's feature-input hook x_l, MLP output o_l, attention
 *            pattern and norm scales; the transcoders encode x_l (position 0 zeroed), the active
 *            features are listed by (layer, position, feature), their decoder rows × activation
 *            read, and every error e_l = o_l − (Σ a·W_dec + b_dec + skip(x_l)) (0 at position 0);
 *   rows     A[target, ·] for targets (features by their encoder row at x_l, logits by the
 *            demeaned unembedding at ln_final's output), a batch of targets per run of the frozen
 *            backward graph (graph/replacement.ts). Sources, in circuit-tracer's order: the active
 *            features, the errors (l·T + p), the tokens (hook_embed rows).
 *
 * Transcoder weights are read a layer at a time (one layer's encoder as float32 at a time); every
 * weight read is checked to be finite (BAD_WEIGHTS names the tensor).
 */
import type {
  DevicePruned,
  DevicePruneRequest,
  Intervention,
  LocalReplacement,
  ReplacementFeatures,
  ReplacementTarget,
  RunOptions,
  RunResult,
  WeightProducts,
} from './api';
import { LoupeError, throwIfAborted } from './errors';
import { DTYPE_BYTES, decodeValues, readEntryRange, readTensorF32, type ReadableWeightSet } from './safetensors';
import type { TensorEntry } from './safetensors-types';
import type { ModelSpec } from './spec';
import type { Tensor } from './tensor';
import type { TranscoderSpec } from './transcoder';
import { REPLACEMENT_OUTPUTS } from './graph/replacement';
import type { OrtTensorLike, SessionFactory } from './runtime/ort-session';
import {
  edgeScoreGraph,
  influenceGraph,
  keptEdgesGraph,
  partialGraph,
  readGraph,
  rowsGraph,
  selectGraph,
  type AdjacencyShape,
} from './runtime/adjacency';

export interface AttachedTranscoders {
  spec: TranscoderSpec;
  weights: ReadableWeightSet;
}

/** what the loaded model lends the replacement model */
export interface ReplacementHost {
  spec: ModelSpec;
  run(tokens: number[], opts: RunOptions): Promise<RunResult>;
  param(name: string): Tensor;
  unembedVectors(ids: number[], signal?: AbortSignal): Promise<Pick<WeightProducts, 'unembedRows' | 'unembedSum'>>;
  /** the frozen backward graph's session for this transcoder set (forward: the frozen forward's), run in the model's queue */
  runReplacement(
    feeds: Record<string, OrtTensorLike>,
    fetches: string[],
    forward?: boolean,
    keep?: boolean,
  ): Promise<Record<string, OrtTensorLike>>;
  /** where values stay on the device: a session of a weightless graph there (undefined: they do not) */
  deviceHelper?(bytes: Uint8Array): Promise<DeviceHelper | undefined>;
  /** the largest one device buffer (GpuCaps.maxBufferBytes), where known */
  deviceBufferBytes?: number;
  /** feeds copied to the device once for many runs where the backend keeps values there (else as they are) */
  upload(feeds: Record<string, OrtTensorLike>): Promise<{ feeds: Record<string, OrtTensorLike>; release(): void }>;
  /** x_s · W_U for vectors [S, D] (no b_U, no soft-cap), float64 */
  unembedDots(x: Tensor, signal?: AbortSignal): Promise<Float64Array>;
  ort: SessionFactory['ort'];
}

/** a weightless graph's session on the device: the fetches in `keep` stay there, the rest come back */
export interface DeviceHelper {
  run(feeds: Record<string, OrtTensorLike>, fetches: string[], keep?: string[]): Promise<Record<string, OrtTensorLike>>;
  /** its nodes that ran off the device, by op:dtype, once known */
  offDevice(): Record<string, number> | undefined;
  release(): Promise<void>;
}

/** Rows of target vectors per run (the batch); the readouts' memory grows with it. */
export const REPLACEMENT_BATCH = 32;

/** how a local replacement is computed: cancellation, progress by stage, and targets per batch */
export interface ReplacementOptions {
  signal?: AbortSignal;
  onProgress?: (stage: string, done: number, total: number) => void;
  batch?: number;
}

function finite(data: Float32Array, e: TensorEntry, what: string): Float32Array {
  for (let i = 0; i < data.length; i++)
    if (!Number.isFinite(data[i]))
      throw new LoupeError(
        'BAD_WEIGHTS',
        `The transcoders' ${what} (${e.name.split('::').pop()} in ${e.file}) holds a non-finite value (${data[i]}) at element ${i}.`,
        'The file is damaged or was saved from a diverged run: pick another transcoder set (or download it again).',
        { tensor: e.name, file: e.file, index: i },
      );
  return data;
}

/**
 * `n` values at `offset` within row f (rows of `perRow` values) of a tensor, for each f of `rows`,
 * as float32. Rows close together are read in one range (a read from IndexedDB or disk costs per
 * call): runs with gaps of at most READ_GAP rows, at most 64 MiB each.
 */
function readRows(
  w: ReadableWeightSet,
  e: TensorEntry,
  rows: number[],
  perRow: number,
  offset: number,
  n: number,
): Map<number, Float32Array> {
  const READ_GAP = 32;
  const MAX_SPAN = (64 * 1024 * 1024) / 4; // values in one read
  const sorted = rows.slice().sort((a, b) => a - b);
  const out = new Map<number, Float32Array>();
  for (let i = 0; i < sorted.length;) {
    let j = i;
    while (
      j + 1 < sorted.length &&
      sorted[j + 1] - sorted[j] <= READ_GAP &&
      (sorted[j + 1] - sorted[i]) * perRow + n <= MAX_SPAN
    )
      j++;
    const first = sorted[i];
    const span = readValues(w, e, first * perRow + offset, (sorted[j] - first) * perRow + n);
    for (let k = i; k <= j; k++) {
      const at = (sorted[k] - first) * perRow;
      out.set(sorted[k], span.slice(at, at + n));
    }
    i = j + 1;
  }
  return out;
}

/** values [offset, offset + n) of a tensor, as float32 */
function readValues(w: ReadableWeightSet, e: TensorEntry, offset: number, n: number): Float32Array {
  const b = DTYPE_BYTES[e.dtype];
  const raw = readEntryRange(w, e, offset * b, n * b);
  const out = new Float32Array(n);
  decodeValues(e.dtype, raw, 0, n, out);
  return out;
}

export async function prepareReplacement(
  host: ReplacementHost,
  tc: AttachedTranscoders,
  tokens: number[],
  opts: ReplacementOptions = {},
): Promise<LocalReplacement> {
  const t0 = Date.now();
  const spec = host.spec;
  const { nLayers: L, dModel: D, nHeads: H } = spec;
  const T = tokens.length;
  const info = tc.spec.info;
  const F = info.d_transcoder;
  const post = spec.layers.some((l) => l.postAttnNorm);
  if (spec.layers.some((l) => !l.ln1 || !l.ln2))
    throw new LoupeError(
      'UNSUPPORTED_ARCHITECTURE',
      `${spec.family}: the frozen local replacement freezes the norms before attention and the MLP, and this model's blocks have none.`,
      'Attribution graphs run on models with pre-norms (OLMo 2 normalises only the block outputs).',
    );
  opts.onProgress?.('forward pass', 0, 1);
  const hooks = ['hook_embed', 'ln_final.hook_scale', `blocks.${L - 1}.hook_resid_post`];
  for (let l = 0; l < L; l++) {
    const b = `blocks.${l}`;
    hooks.push(
      `${b}.hook_resid_mid`,
      `${b}.ln1.hook_scale`,
      `${b}.ln2.hook_scale`,
      `${b}.attn.hook_pattern`,
      `${b}.hook_mlp_out`,
    );
    if (post) hooks.push(`${b}.ln1_post.hook_scale`);
  }
  const clean = await host.run(tokens, { hooks, logitPositions: [T - 1], signal: opts.signal });
  const h = (n: string) => clean.hooks[n].data;
  const lastLogits = Float32Array.from(clean.logits.data.subarray(0, spec.dVocab));

  // the feature-input hook of every layer, from resid_mid and ln2's frozen scale (api.ts: params are effective weights)
  const inputHook = (l: number, mid: Float32Array, s: Float32Array): Float32Array => {
    if (info.input_hook === 'hook_resid_mid') return Float32Array.from(mid);
    const n = spec.layers[l].ln2!; // prepareReplacement refuses blocks without it
    const weighted = !(info.input_hook === 'ln2.hook_normalized' && n.kind === 'rmsnorm');
    return normRows(
      mid,
      s,
      T,
      D,
      n.kind,
      weighted ? host.param(`blocks.${l}.ln2.w`).data : undefined,
      weighted && n.kind === 'layernorm' ? host.param(`blocks.${l}.ln2.b`).data : undefined,
    );
  };
  const xin = Array.from({ length: L }, (_, l) =>
    inputHook(l, h(`blocks.${l}.hook_resid_mid`), h(`blocks.${l}.ln2.hook_scale`)),
  );
  // ln_final's output at the last position (interventions add to it)
  const lnf = spec.lnFinal;
  const yClean = normRows(
    h(`blocks.${L - 1}.hook_resid_post`).subarray((T - 1) * D, T * D),
    h('ln_final.hook_scale').subarray(T - 1, T),
    1,
    D,
    lnf.kind,
    host.param('ln_final.w').data,
    lnf.kind === 'layernorm' ? host.param('ln_final.b').data : undefined,
  );
  const encoder = (l: number) => {
    const ls = tc.spec.layers[l];
    return {
      W: finite(readTensorF32(tc.weights, ls.W_enc.name), ls.W_enc, `layer ${l} encoder`),
      b: finite(readTensorF32(tc.weights, ls.b_enc.name), ls.b_enc, `layer ${l} encoder bias`),
      thr: ls.threshold
        ? finite(readTensorF32(tc.weights, ls.threshold.name), ls.threshold, `layer ${l} thresholds`)
        : undefined,
      dF: ls.encLayout === 'd_F',
    };
  };
  /** activations [T, F] at `positions` of layer l's features for its input x (0 elsewhere) */
  const encode = (l: number, enc: ReturnType<typeof encoder>, x: Float32Array, positions: number[]) => {
    const pre = new Float32Array(T * F);
    for (const t of positions)
      for (let f = 0; f < F; f++) {
        let acc = 0;
        if (enc.dF) for (let i = 0; i < D; i++) acc += x[t * D + i] * enc.W[i * F + f];
        else for (let i = 0, o = f * D; i < D; i++) acc += x[t * D + i] * enc.W[o + i];
        pre[t * F + f] = acc + enc.b[f];
      }
    return activate(pre, T, F, positions, info.activation, info.k, enc.thr, info.relu_before_threshold);
  };
  const allButFirst = Array.from({ length: T - 1 }, (_, i) => i + 1); // position 0 contributes no feature (zero_positions)

  // encode, layer by layer; decoder rows of the active features; reconstruction and errors
  const fl: number[] = [],
    fp: number[] = [],
    ff: number[] = [],
    fa: number[] = [];
  const encRows: Float32Array[] = []; // per layer: [n_l, D] encoder rows of its active features
  const decVecs: { s: number; m: number; p: number; v: Float32Array }[] = []; // decoder vectors × activation by output layer
  const recon = Array.from({ length: L }, () => new Float64Array(T * D));
  for (let l = 0; l < L; l++) {
    throwIfAborted(opts.signal);
    opts.onProgress?.('encoding features', l, L);
    const ls = tc.spec.layers[l];
    const enc = encoder(l);
    const bdec = finite(readTensorF32(tc.weights, ls.b_dec.name), ls.b_dec, `layer ${l} decoder bias`);
    const x = xin[l];
    const acts = encode(l, enc, x, allButFirst);
    const idx: number[] = [];
    for (let t = 1; t < T; t++)
      for (let f = 0; f < F; f++) {
        const a = acts[t * F + f];
        if (a === 0) continue;
        idx.push(fl.length);
        fl.push(l);
        fp.push(t);
        ff.push(f);
        fa.push(a);
      }
    const rows = new Float32Array(idx.length * D);
    idx.forEach((s, j) => {
      const f = ff[s];
      if (enc.dF) for (let i = 0; i < D; i++) rows[j * D + i] = enc.W[i * F + f];
      else rows.set(enc.W.subarray(f * D, (f + 1) * D), j * D);
    });
    encRows.push(rows);
    // decoder rows: PLT W_dec[f]; CLT W_dec[f, m − l + decFirst] for output layers m = l … L−1
    const nOut = info.kind === 'plt' ? 1 : L - l;
    const perF = ls.W_dec.shape.length === 3 ? ls.W_dec.shape[1] * D : D;
    const blocks = readRows(tc.weights, ls.W_dec, [...new Set(idx.map((s) => ff[s]))], perF, ls.decFirst * D, nOut * D);
    for (const s of idx) {
      const f = ff[s];
      const block = finite(blocks.get(f)!, ls.W_dec, `layer ${l} decoder`);
      for (let j = 0; j < nOut; j++) {
        const v = block.subarray(j * D, (j + 1) * D).map((w) => w * fa[s]);
        decVecs.push({ s, m: l + j, p: fp[s], v });
        const r = recon[l + j];
        for (let i = 0; i < D; i++) r[fp[s] * D + i] += v[i];
      }
    }
    // b_dec (at every position) and the skip
    const r = recon[l];
    for (let t = 0; t < T; t++) for (let i = 0; i < D; i++) r[t * D + i] += bdec[i];
    if (ls.W_skip) {
      const Ws = finite(readTensorF32(tc.weights, ls.W_skip.name), ls.W_skip, `layer ${l} skip`);
      const xt = ls.skipLayout === 'x_Wt';
      for (let t = 0; t < T; t++)
        for (let o = 0; o < D; o++) {
          let acc = 0;
          if (xt) for (let i = 0, b = o * D; i < D; i++) acc += x[t * D + i] * Ws[b + i];
          else for (let i = 0; i < D; i++) acc += x[t * D + i] * Ws[i * D + o];
          r[t * D + o] += acc;
        }
    }
  }
  const nFeat = fl.length;
  const errors = new Float32Array(L * T * D);
  for (let l = 0; l < L; l++) {
    const o = h(`blocks.${l}.hook_mlp_out`);
    for (let k = D; k < T * D; k++) errors[l * T * D + k] = o[k] - recon[l][k];
  }

  // the frozen constants and the sources, fed to every run
  const T_ = host.ort.Tensor;
  const f32 = (data: Float32Array, dims: number[]) => new T_('float32', data, dims);
  const stack = (name: (l: number) => string, per: number) => {
    const out = new Float32Array(L * per);
    for (let l = 0; l < L; l++) out.set(h(name(l)), l * per);
    return out;
  };
  const fixed: Record<string, OrtTensorLike> = {
    pattern: f32(
      stack((l) => `blocks.${l}.attn.hook_pattern`, H * T * T),
      [L, H, T, T],
    ),
    scale_ln1: f32(
      stack((l) => `blocks.${l}.ln1.hook_scale`, T),
      [L, T, 1],
    ),
    scale_ln2: f32(
      stack((l) => `blocks.${l}.ln2.hook_scale`, T),
      [L, T, 1],
    ),
    scale_lnf: f32(Float32Array.from(h('ln_final.hook_scale')), [T, 1]),
    src_embed: f32(Float32Array.from(h('hook_embed')), [T, D]),
    src_err: f32(errors, [L, T, D]),
  };
  if (post)
    fixed.scale_post_attn = f32(
      stack((l) => `blocks.${l}.ln1_post.hook_scale`, T),
      [L, T, 1],
    );
  // decoder vectors per output layer, by position, padded to the same count per position
  const slots: { s: Int32Array; P: number; data: Float32Array }[] = [];
  for (let m = 0; m < L; m++) {
    const mine = decVecs.filter((d) => d.m === m);
    const count = new Int32Array(T);
    for (const d of mine) count[d.p]++;
    const P = Math.max(1, ...count);
    const data = new Float32Array(T * P * D);
    const s = new Int32Array(T * P).fill(-1);
    const next = new Int32Array(T);
    for (const d of mine) {
      const k = d.p * P + next[d.p]++;
      data.set(d.v, k * D);
      s[k] = d.s;
    }
    fixed[`src_dec_${m}`] = f32(data, [T, P, D]);
    slots.push({ s, P, data });
  }
  decVecs.length = 0;
  /** a source's decoder vectors × activation by output layer, read back from the fed arrays */
  const decOf = (src: number): { m: number; v: Float32Array }[] => {
    const out: { m: number; v: Float32Array }[] = [];
    slots.forEach(({ s, data }, m) => {
      for (let k = 0; k < s.length; k++) if (s[k] === src) out.push({ m, v: data.subarray(k * D, (k + 1) * D) });
    });
    return out;
  };

  // logit target vectors: the demeaned unembedding W_U[:, v] − mean_v′ W_U[:, v′] (targets.py:376-411)
  const logitVec = new Map<number, Float32Array>();
  const features: ReplacementFeatures = {
    layer: Int32Array.from(fl),
    position: Int32Array.from(fp),
    feature: Int32Array.from(ff),
    activation: Float32Array.from(fa),
  };
  const encOffset = new Int32Array(L + 1);
  for (let l = 0; l < L; l++) encOffset[l + 1] = encOffset[l] + encRows[l].length / D;
  const nSources = nFeat + L * T + T;
  const batch = Math.max(1, opts.batch ?? REPLACEMENT_BATCH);
  const stats: LocalReplacement['stats'] = { runs: 0, rows: 0, run_ms: 0, setup_ms: Date.now() - t0, batch };

  return {
    transcoders: info,
    tokens: tokens.slice(),
    nLayers: L,
    nPositions: T,
    features,
    lastLogits,
    nSources,
    stats,
    errorNorms: () =>
      Float32Array.from({ length: L * T }, (_, k) => {
        let s = 0;
        for (let i = 0; i < D; i++) s += errors[k * D + i] ** 2;
        return Math.sqrt(s);
      }),
    async intervene(changes, o) {
      for (const c of changes)
        if (!(c.index >= 0 && c.index < nFeat) || !Number.isFinite(c.value))
          throw new LoupeError(
            'BAD_INPUT',
            `Intervention on feature ${c.index} with value ${c.value}: no such active feature or not a finite value.`,
          );
      const V = spec.dVocab;
      const deltas = new Map<string, Float32Array>(); // `${m}:${p}` → Δ at layer m's feature-output hook, position p
      const addDelta = (src: number, scale: number) => {
        for (const { m, v } of decOf(src)) {
          const key = `${m}:${features.position[src]}`;
          const d = deltas.get(key) ?? new Float32Array(D);
          for (let i = 0; i < D; i++) d[i] += scale * v[i];
          deltas.set(key, d);
        }
      };
      const cap = spec.finalSoftcap;
      const bU = host.param('unembed.b_U').data;
      const logitsOf = async (y: Float32Array) => {
        const dots = await host.unembedDots({ dims: [1, D], data: y }, o.signal);
        return Float32Array.from({ length: V }, (_, v) => {
          const z = dots[v] + bU[v];
          return cap !== null ? cap * Math.tanh(z / cap) : z;
        });
      };
      if (o.errors === 'frozen') {
        // the frozen model forward: Δ from the clean activations, its exact effect on ln_final's output
        for (const c of changes) addDelta(c.index, c.value / features.activation[c.index] - 1);
        const delta = new Float32Array(L * T * D);
        for (const [key, d] of deltas) {
          const [m, p] = key.split(':').map(Number);
          delta.set(d, (m * T + p) * D);
        }
        const { pattern, scale_ln1, scale_ln2, scale_lnf } = fixed;
        const feeds: Record<string, OrtTensorLike> = {
          pattern,
          scale_ln1,
          scale_ln2,
          scale_lnf,
          delta: f32(delta, [L, 1, T, D]),
        };
        if (fixed.scale_post_attn) feeds.scale_post_attn = fixed.scale_post_attn;
        const res = await host.runReplacement(feeds, ['y_last'], true);
        const y = Float32Array.from(yClean);
        const dy = res.y_last.data as Float32Array;
        for (let i = 0; i < D; i++) y[i] += dy[i];
        return logitsOf(y);
      }
      // recomputed: patterns frozen; each intervened layer (ascending) re-encodes its current input
      const frozen: Intervention[] = Array.from({ length: L }, (_, l) => ({
        hook: `blocks.${l}.attn.hook_pattern`,
        op: 'patch',
        source: { dims: [1, H, T, T], data: h(`blocks.${l}.attn.hook_pattern`) },
      }));
      const adds = () =>
        [...deltas].map(([key, d]): Intervention => {
          const [m, p] = key.split(':').map(Number);
          return { hook: `blocks.${m}.hook_mlp_out`, op: 'add', positions: [p], value: d };
        });
      const layers = [...new Set(changes.map((c) => features.layer[c.index]))].sort((a, b) => a - b);
      for (const l of layers) {
        const mine = changes.filter((c) => features.layer[c.index] === l);
        let current = (c: { index: number }) => features.activation[c.index];
        if (deltas.size > 0) {
          const r = await host.run(tokens, {
            hooks: [`blocks.${l}.hook_resid_mid`, `blocks.${l}.ln2.hook_scale`],
            interventions: [...frozen, ...adds()],
            logitPositions: [T - 1],
            signal: o.signal,
          });
          const x = inputHook(
            l,
            r.hooks[`blocks.${l}.hook_resid_mid`].data,
            r.hooks[`blocks.${l}.ln2.hook_scale`].data,
          );
          const acts = encode(l, encoder(l), x, [...new Set(mine.map((c) => features.position[c.index]))]);
          current = (c) => acts[features.position[c.index] * F + features.feature[c.index]];
        }
        for (const c of mine) addDelta(c.index, (c.value - current(c)) / features.activation[c.index]);
      }
      const out = await host.run(tokens, {
        interventions: [...frozen, ...adds()],
        logitPositions: [T - 1],
        signal: o.signal,
      });
      return Float32Array.from(out.logits.data.subarray(0, V));
    },
    async rows(targets: ReplacementTarget[], o = {}) {
      await logitVectors(targets, o.signal);
      const out = new Float32Array(targets.length * nSources);
      // the frozen constants and the decoder vectors are written once per call, then fed from the device
      const dev = await host.upload(fixed);
      try {
        for (let b0 = 0; b0 < targets.length; b0 += batch) {
          throwIfAborted(o.signal);
          const res = await runBatch(dev.feeds, targets.slice(b0, b0 + batch), false);
          const B = Math.min(batch, targets.length - b0);
          const emb = res.out_embed.data as Float32Array; // [B, T]
          const err = res.out_err.data as Float32Array; // [B, L, T]
          for (let b = 0; b < B; b++) {
            const row = out.subarray((b0 + b) * nSources, (b0 + b + 1) * nSources);
            row.set(err.subarray(b * L * T, (b + 1) * L * T), nFeat);
            row.set(emb.subarray(b * T, (b + 1) * T), nFeat + L * T);
          }
          for (let m = 0; m < L; m++) {
            const { s, P } = slots[m];
            const d = res[`out_dec_${m}`].data as Float32Array; // [T, B, P]
            for (let p = 0; p < T; p++)
              for (let k = 0; k < P; k++) {
                const src = s[p * P + k];
                if (src < 0) continue;
                for (let b = 0; b < B; b++) out[(b0 + b) * nSources + src] += d[(p * B + b) * P + k];
              }
          }
          for (const t of Object.values(res)) t.dispose?.();
          o.onRows?.(Math.min(targets.length, b0 + B), targets.length);
        }
      } finally {
        dev.release();
      }
      return out;
    },
    ...(host.deviceHelper && nFeat > 0 ? { pruneOnDevice: (r: DevicePruneRequest) => pruneOnDevice(r) } : {}),
  };

  /** the demeaned unembedding of the logit targets not yet made */
  async function logitVectors(targets: ReplacementTarget[], signal?: AbortSignal) {
    const need = [
      ...new Set(targets.filter((t) => t.kind === 'logit').map((t) => (t as { token: number }).token)),
    ].filter((v) => !logitVec.has(v));
    if (!need.length) return;
    const u = await host.unembedVectors(need, signal);
    const V = spec.dVocab;
    need.forEach((v, i) => {
      const row = new Float32Array(D);
      for (let d = 0; d < D; d++) row[d] = u.unembedRows.data[i * D + d] - u.unembedSum.data[d] / V;
      logitVec.set(v, row);
    });
  }

  /** one run of the frozen backward graph for a batch of targets: its readouts, in JS memory or (keep) on the device */
  async function runBatch(feeds: Record<string, OrtTensorLike>, chunk: ReplacementTarget[], keep: boolean) {
    const B = chunk.length;
    const vec = new Float32Array(B * D);
    const atT = new Float32Array((L + 1) * B * T);
    chunk.forEach((t, b) => {
      if (t.kind === 'logit') {
        vec.set(logitVec.get(t.token)!, b * D);
        atT[(L * B + b) * T + (T - 1)] = 1;
      } else {
        const s = t.index;
        if (!(s >= 0 && s < nFeat)) throw new LoupeError('BAD_INPUT', `No active feature ${s} (there are ${nFeat}).`);
        const l = features.layer[s];
        vec.set(encRows[l].subarray((s - encOffset[l]) * D, (s - encOffset[l] + 1) * D), b * D);
        atT[(l * B + b) * T + features.position[s]] = 1;
      }
    });
    const t1 = Date.now();
    const res = await host.runReplacement(
      { ...feeds, seed_vec: f32(vec, [B, D]), seed_at: f32(atT, [L + 1, B, T, 1]) },
      REPLACEMENT_OUTPUTS(L),
      false,
      keep,
    );
    stats.run_ms += Date.now() - t1;
    stats.runs++;
    stats.rows += B;
    return res;
  }

  /**
   * prune_graph on the device (runtime/adjacency.ts): each batch's readouts assembled into rows
   * there, the rows into R, the influence computed there and read back (S floats) for the
   * caller's node mask, which goes back (S floats); the edge scores, their threshold and the
   * edges above it found there; only those edges come back (an index and a weight each).
   */
  async function pruneOnDevice(r: DevicePruneRequest): Promise<DevicePruned | null> {
    const nLog = r.logits.length;
    if (8 * (Math.min(nFeat, r.maxFeatures ?? nFeat) + nLog) * nSources > (host.deviceBufferBytes ?? Infinity))
      return null;
    const full: AdjacencyShape = { L, T, nAct: nFeat, nLog };
    await logitVectors(
      r.logits.map((l): ReplacementTarget => ({ kind: 'logit', token: l.token })),
      r.signal,
    );
    // each feature's decoder readouts: flat indices into [m][T, P_m], padded to J with the zero column
    const at: number[][] = Array.from({ length: nFeat }, () => []);
    let offset = 0;
    slots.forEach(({ s }) => {
      s.forEach((src, k) => src >= 0 && at[src].push(offset + k));
      offset += s.length;
    });
    const J = Math.max(1, ...at.map((a) => a.length));
    const flatSlots = new Array<number>(J * nFeat).fill(offset);
    at.forEach((a, f) => a.forEach((x, j) => (flatSlots[j * nFeat + f] = x)));
    const made: DeviceHelper[] = [];
    const kept: OrtTensorLike[] = [];
    const session = async (bytes: Uint8Array) => {
      const h = await host.deviceHelper!(bytes);
      if (!h) throw new LoupeError('INTERNAL', 'A helper session on the device keeps nothing there.');
      made.push(h);
      return h;
    };
    /** a helper released, the nodes it ran off the device counted */
    const retire = async (h: DeviceHelper) => {
      const off = (stats.off_device_ops ??= {});
      for (const [op, n] of Object.entries(h.offDevice() ?? {})) off[op] = (off[op] ?? 0) + n;
      await h.release().catch(() => undefined);
    };
    const vanished = (x: OrtTensorLike) => {
      if ((x.data as Float32Array)[0] !== 0)
        throw new LoupeError('INTERNAL', `The influence's power series had not vanished after ${L + 2} terms.`);
    };
    const dev = await host.upload(fixed);
    try {
      const assemble = await session(rowsGraph(full, flatSlots, J));
      const batches: OrtTensorLike[] = [];
      const rowNode: number[] = []; // each computed row's node: a feature's index, or nSources + i for logit i
      const feeds = () => Object.fromEntries(batches.map((t, i) => [`r${i}`, t]));
      const compute = async (targets: ReplacementTarget[]) => {
        for (let b0 = 0; b0 < targets.length; b0 += batch) {
          throwIfAborted(r.signal);
          const res = await runBatch(dev.feeds, targets.slice(b0, b0 + batch), true);
          try {
            const f: Record<string, OrtTensorLike> = { emb: res.out_embed, err: res.out_err };
            for (let m = 0; m < L; m++) f[`dec_${m}`] = res[`out_dec_${m}`];
            const y = await assemble.run(f, ['rows'], ['rows']);
            kept.push(y.rows);
            batches.push(y.rows);
          } finally {
            for (const t of Object.values(res)) t.dispose?.();
          }
        }
        for (const t of targets) rowNode.push(t.kind === 'feature' ? t.index : nSources + rowNode.length);
      };
      // the logit rows, then the features the caller picks (all, or by partial influence over the rows so far)
      await compute(r.logits.map((l): ReplacementTarget => ({ kind: 'logit', token: l.token })));
      const wN = new Array<number>(nSources + nLog).fill(0);
      r.logits.forEach((l, i) => (wN[nSources + i] = l.prob));
      const partial = async () => {
        const h = await session(partialGraph(full, batches.length, rowNode, wN));
        const out = await h
          .run(feeds(), ['influence', 'last'])
          .finally(() => retire(made.splice(made.indexOf(h), 1)[0]));
        vanished(out.last);
        return out.influence.data as Float32Array;
      };
      const visited = new Uint8Array(nFeat);
      for (;;) {
        const pending = r.next
          ? await r.next(partial)
          : rowNode.length === nLog
            ? Array.from(visited, (_, i) => i)
            : [];
        if (!pending.length) break;
        for (const i of pending)
          if (!(i >= 0 && i < nFeat) || visited[i])
            throw new LoupeError('BAD_INPUT', `Feature ${i}: not an active feature, or its row is computed already.`);
        pending.forEach((i) => (visited[i] = 1));
        await compute(pending.map((index): ReplacementTarget => ({ kind: 'feature', index })));
        r.onRows?.(rowNode.length, nLog + (r.maxFeatures ?? nFeat));
      }
      // the graph over the selected features (node order: features, errors, tokens; rows: features, logits)
      const selected = Int32Array.from(Array.from(visited, (v, i) => (v ? i : -1)).filter((i) => i >= 0));
      const nSel = selected.length;
      const rowOf = new Map(rowNode.map((n, k) => [n, k]));
      const order = [...Array.from(selected, (f) => rowOf.get(f)!), ...r.logits.map((_, i) => i)];
      const cols = [...selected, ...Array.from({ length: L * T + T }, (_, k) => nFeat + k)];
      const shape: AdjacencyShape = { L, T, nAct: nSel, nLog };
      const Sel = nSel + L * T + T;
      const picked = await (await session(selectGraph(batches.length, order, cols))).run(feeds(), ['R'], ['R']);
      kept.push(picked.R);
      for (const t of batches) t.dispose?.();
      kept.splice(0, batches.length);
      const nR = nSel + nLog;
      const w = new Float32Array(nR);
      r.logits.forEach((l, i) => (w[nSel + i] = l.prob));
      const wT = f32(w, [1, nR]);
      const inf = await (
        await session(influenceGraph(shape, 1))
      ).run({ r0: picked.R, w: wT }, ['R', 'influence', 'last', 'errors'], ['R']);
      kept.push(inf.R);
      vanished(inf.last);
      const influence = Float32Array.from(inf.influence.data as Float32Array);
      const nodeMask = r.nodeMask(influence);
      throwIfAborted(r.signal);
      const sc = await (
        await session(edgeScoreGraph(shape, r.edgeThreshold))
      ).run(
        { R: inf.R, w: wT, mask: f32(Float32Array.from(nodeMask), [1, Sel]) },
        ['order', 'threshold', 'kept', 'last'],
        ['order'],
      );
      kept.push(sc.order);
      vanished(sc.last);
      const edgeScoreThreshold = (sc.threshold.data as Float32Array)[0];
      const base = { selected, influence, errorMass: inf.errors.data as Float32Array, nodeMask, edgeScoreThreshold };
      if (!(edgeScoreThreshold > 0)) {
        // every entry is kept (prune_graph's ≥ 0): the rows themselves come back
        const all = await (await session(readGraph())).run({ x: inf.R }, ['y']);
        return { ...base, edges: null, rows: all.y.data as Float32Array };
      }
      const k = (sc.kept.data as BigInt64Array)[0];
      const e = await (
        await session(keptEdgesGraph())
      ).run({ order: sc.order, R: inf.R, k: new host.ort.Tensor('int64', BigInt64Array.from([k]), [1]) }, [
        'index',
        'weight',
      ]);
      const index = e.index.data as BigInt64Array;
      const n = index.length;
      const row = new Int32Array(n),
        source = new Int32Array(n);
      for (let i = 0; i < n; i++) {
        const x = Number(index[i]);
        row[i] = Math.floor(x / Sel);
        source[i] = x % Sel;
      }
      return { ...base, edges: { row, source, weight: e.weight.data as Float32Array }, rows: null };
    } finally {
      dev.release();
      for (const t of kept) t.dispose?.();
      for (const h of made) await retire(h);
    }
  }
}

/** JumpReLU x·[x > θ] (SAELens: relu first), ReLU, TopK(k) x·[x among the k largest], at `positions` (0 elsewhere) */
function activate(
  pre: Float32Array,
  T: number,
  F: number,
  positions: number[],
  kind: 'jumprelu' | 'relu' | 'topk',
  k: number | null,
  thr: Float32Array | undefined,
  reluFirst: boolean,
): Float32Array {
  const a = new Float32Array(T * F);
  for (const t of positions) {
    const o = t * F;
    if (kind === 'topk') {
      const idx = Array.from({ length: F }, (_, f) => f).sort((i, j) => pre[o + j] - pre[o + i] || i - j);
      for (let j = 0; j < k!; j++) a[o + idx[j]] = pre[o + idx[j]];
      continue;
    }
    for (let f = 0; f < F; f++) {
      const v = pre[o + f];
      if (kind === 'relu') a[o + f] = v > 0 ? v : 0;
      else a[o + f] = v > thr![f] && (!reluFirst || v > 0) ? v : 0;
    }
  }
  return a;
}

/** rows of x [T, D] through a norm with the given scales [T]: LayerNorm (x − x̄)/s·w + b, RMSNorm x/s·w (no w: x/s) */
function normRows(
  x: Float32Array,
  s: Float32Array,
  T: number,
  D: number,
  kind: 'layernorm' | 'rmsnorm',
  w?: Float32Array,
  b?: Float32Array,
): Float32Array {
  const y = new Float32Array(T * D);
  for (let t = 0; t < T; t++) {
    let mean = 0;
    if (kind === 'layernorm') {
      for (let i = 0; i < D; i++) mean += x[t * D + i];
      mean /= D;
    }
    for (let i = 0; i < D; i++) {
      const v = (x[t * D + i] - mean) / s[t];
      y[t * D + i] = w ? v * w[i] + (b ? b[i] : 0) : v;
    }
  }
  return y;
}
