/**
 * QK and OV circuits and Elhage et al.'s (2021) composition scores, from the weights alone.
 *
 * In TransformerLens's row-vector convention (x · W), head h of layer l has
 *   QK = W_Q W_Kᵀ  [d_model, d_model]  (score = x_q · QK · x_kᵀ)
 *   OV = W_V W_O   [d_model, d_model]  (what it writes = x_k · OV, weighted by the pattern)
 * and the composition score of an earlier head A with a later head B is
 *   ‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F),  W_A = OV_A,  W_B = QK_B (Q), QK_Bᵀ (K) or OV_B (V)
 * (TL's all_composition_scores; zero for pairs not in strictly increasing layers). Biases are left
 * out. GQA: a query head uses its key/value head's W_K and W_V.
 *
 * Cost: every matrix is a product of two [d_model, d_head] factors (A Bᵀ), so no d_model² matrix
 * is formed: with M = B_Aᵀ A_B [d_head, d_head], ‖A_A M B_Bᵀ‖²_F = tr(Mᵀ G(A_A) M G(B_B)) where
 * G(X) = XᵀX, and ‖A Bᵀ‖²_F = tr(G(A) G(B)). A pair costs d_head²·d_model (M) + 2·d_head³, in float64.
 */
import { LoupeError } from '../../engine/errors';
import type { LoadedModel } from '../../engine/api';
import type { Tensor } from '../../engine/tensor';
import { processedReader } from './tl-weights';

export type CompositionMode = 'q' | 'k' | 'v';
export const COMPOSITION_MODES = ['q', 'k', 'v'] as const;

/** most multiply-adds a composition_scores call does (about a minute in JavaScript) */
export const COMPOSITION_MAX_FLOPS = 6e10;

/** one head's four factors, each as [d_model, d_head] (W_O transposed), float64 row-major */
interface Factors {
  Q: Float64Array;
  K: Float64Array;
  V: Float64Array;
  Ot: Float64Array;
}

export type WeightReader = (name: string) => Tensor;

/** the reader of TL-named weights an analysis uses: processed (TL's from_pretrained) or as stored */
export function weightReader(model: LoadedModel, processed: boolean): WeightReader {
  const raw = (n: string) => model.param(n, { keep: false });
  return processed ? processedReader(model, raw) : raw;
}

function factorsOf(model: LoadedModel, read: WeightReader, l: number): Factors[] {
  const { n_heads: H, n_kv_heads: Hkv, d_model: D, d_head: Dh } = model.info;
  const WQ = read(`blocks.${l}.attn.W_Q`).data;
  const WK = read(`blocks.${l}.attn.W_K`).data;
  const WV = read(`blocks.${l}.attn.W_V`).data;
  const WO = read(`blocks.${l}.attn.W_O`).data;
  const slice = (W: Float32Array, g: number) => Float64Array.from(W.subarray(g * D * Dh, (g + 1) * D * Dh));
  return Array.from({ length: H }, (_, h) => {
    const g = Math.floor(h / (H / Hkv));
    const Ot = new Float64Array(D * Dh);
    for (let e = 0; e < Dh; e++) for (let d = 0; d < D; d++) Ot[d * Dh + e] = WO[(h * Dh + e) * D + d];
    return { Q: slice(WQ, h), K: slice(WK, g), V: slice(WV, g), Ot };
  });
}

/** XᵀY for X, Y [D, Dh] → [Dh, Dh] */
function gram(X: Float64Array, Y: Float64Array, D: number, Dh: number): Float64Array {
  const out = new Float64Array(Dh * Dh);
  for (let d = 0; d < D; d++) {
    const o = d * Dh;
    for (let i = 0; i < Dh; i++) {
      const x = X[o + i];
      if (x === 0) continue;
      for (let j = 0; j < Dh; j++) out[i * Dh + j] += x * Y[o + j];
    }
  }
  return out;
}

/** a · b for [n, n] matrices */
function mm(a: Float64Array, b: Float64Array, n: number): Float64Array {
  const out = new Float64Array(n * n);
  for (let i = 0; i < n; i++)
    for (let k = 0; k < n; k++) {
      const x = a[i * n + k];
      for (let j = 0; j < n; j++) out[i * n + j] += x * b[k * n + j];
    }
  return out;
}

/** Σ_ij X_ij Y_ij */
function dot(x: Float64Array, y: Float64Array): number {
  let s = 0;
  for (let i = 0; i < x.length; i++) s += x[i] * y[i];
  return s;
}

/** A Bᵀ for A, B [D, Dh] → [D, D] float32 */
function outer(A: Float64Array, B: Float64Array, D: number, Dh: number): Tensor {
  const out = new Float32Array(D * D);
  for (let i = 0; i < D; i++)
    for (let j = 0; j < D; j++) {
      let s = 0;
      for (let e = 0; e < Dh; e++) s += A[i * Dh + e] * B[j * Dh + e];
      out[i * D + j] = s;
    }
  return { dims: [D, D], data: out };
}

function checkHead(model: LoadedModel, l: number, h: number): void {
  const { n_layers: L, n_heads: H } = model.info;
  if (!Number.isInteger(l) || l < 0 || l >= L || !Number.isInteger(h) || h < 0 || h >= H)
    throw new LoupeError(
      'BAD_INPUT',
      `L${l}H${h} is not a head of this model (layers 0..${L - 1}, heads 0..${H - 1}).`,
    );
}

/** head h of layer l's QK circuit W_Q W_Kᵀ [d_model, d_model] */
export function qkCircuit(model: LoadedModel, read: WeightReader, l: number, h: number): Tensor {
  checkHead(model, l, h);
  const f = factorsOf(model, read, l)[h];
  return outer(f.Q, f.K, model.info.d_model, model.info.d_head);
}

/** head h of layer l's OV circuit W_V W_O [d_model, d_model] */
export function ovCircuit(model: LoadedModel, read: WeightReader, l: number, h: number): Tensor {
  checkHead(model, l, h);
  const f = factorsOf(model, read, l)[h];
  return outer(f.V, f.Ot, model.info.d_model, model.info.d_head);
}

export interface CompositionResult {
  /** per mode: [L, H, L, H] row-major (from layer, from head, to layer, to head); 0 unless from layer < to layer */
  scores: Partial<Record<CompositionMode, Float64Array>>;
  /** ‖QK‖_F and ‖OV‖_F per head [L, H] */
  qkNorm: Float64Array;
  ovNorm: Float64Array;
}

/** multiply-adds of a composition_scores call */
export function compositionCost(info: LoadedModel['info'], modes: number): number {
  const { n_layers: L, n_heads: H, d_model: D, d_head: Dh } = info;
  const pairs = ((L * (L - 1)) / 2) * H * H;
  return pairs * modes * (Dh * Dh * D + 2 * Dh ** 3) + L * H * 6 * D * Dh * Dh;
}

export async function compositionScores(
  model: LoadedModel,
  read: WeightReader,
  modes: readonly CompositionMode[],
  opts: { signal?: AbortSignal; onProgress?: (done: number, total: number) => void } = {},
): Promise<CompositionResult> {
  const { n_layers: L, n_heads: H, d_model: D, d_head: Dh } = model.info;
  const cost = compositionCost(model.info, modes.length);
  if (cost > COMPOSITION_MAX_FLOPS)
    throw new LoupeError(
      'TOO_LARGE',
      `Composition scores for every pair of heads of ${model.info.id} take about ${cost.toExponential(1)} multiply-adds ` +
        `(the limit is ${COMPOSITION_MAX_FLOPS.toExponential(0)}).`,
      'Ask for fewer modes, or compute the pairs you need with the library (qkCircuit, ovCircuit).',
    );
  const f = Array.from({ length: L }, (_, l) => factorsOf(model, read, l));
  const N = L * H;
  const at = (l: number, h: number) => f[l][h];
  // Gram matrices of every factor, and the circuits' norms
  const G = (x: Float64Array) => gram(x, x, D, Dh);
  const grams = f.map((heads) => heads.map((x) => ({ Q: G(x.Q), K: G(x.K), V: G(x.V), Ot: G(x.Ot) })));
  const qkNorm = new Float64Array(N);
  const ovNorm = new Float64Array(N);
  for (let l = 0; l < L; l++)
    for (let h = 0; h < H; h++) {
      const g = grams[l][h];
      qkNorm[l * H + h] = Math.sqrt(Math.max(0, dot(g.Q, g.K)));
      ovNorm[l * H + h] = Math.sqrt(Math.max(0, dot(g.V, g.Ot)));
    }
  const scores: CompositionResult['scores'] = {};
  for (const m of modes) scores[m] = new Float64Array(N * N);
  for (let la = 0; la < L - 1; la++) {
    if (opts.signal?.aborted) throw new LoupeError('ABORTED', 'Composition scores were cancelled.');
    opts.onProgress?.(la, L - 1);
    await new Promise((r) => setTimeout(r, 0)); // let a cancel through between layers
    for (let ha = 0; ha < H; ha++) {
      const A = at(la, ha);
      const gV = grams[la][ha].V;
      for (let lb = la + 1; lb < L; lb++)
        for (let hb = 0; hb < H; hb++) {
          const B = at(lb, hb);
          const gb = grams[lb][hb];
          for (const m of modes) {
            // right = A2 B2ᵀ: Q: W_Q W_Kᵀ, K: W_K W_Qᵀ, V: W_V W_O
            const [A2, gA2, gB2] = m === 'q' ? [B.Q, gb.Q, gb.K] : m === 'k' ? [B.K, gb.K, gb.Q] : [B.V, gb.V, gb.Ot];
            const M = gram(A.Ot, A2, D, Dh); // W_O^A · A2
            const num = dot(mm(gV, M, Dh), mm(M, gB2, Dh));
            const den = ovNorm[la * H + ha] * Math.sqrt(Math.max(0, dot(gA2, gB2)));
            scores[m]![((la * H + ha) * L + lb) * H + hb] = den > 0 ? Math.sqrt(Math.max(0, num)) / den : 0;
          }
        }
    }
  }
  opts.onProgress?.(L - 1, L - 1);
  return { scores, qkNorm, ovNorm };
}
