/**
 * composition_scores and the library's QK / OV circuits on induction-gpt2 against a float64
 * implementation of Elhage et al.'s formula written here from the Hugging Face tensors (Conv1D
 * c_attn / c_proj), with TransformerLens's processing (ln1 folded into W_Q/W_K/W_V and centred over
 * d_model, W_O centred): the d_model × d_model circuits formed densely, ‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F).
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import * as path from 'node:path';
import { loadModel, ops, type Model } from '../src/library';
import { loadModelDir, type RefModel } from './reference';
import { SHARED } from './helpers/shared';

const DIR = path.join(SHARED, 'models/induction-gpt2');
const L = 2,
  H = 4,
  D = 64,
  Dh = 16;

type Mat = Float64Array; // row-major
const mm = (a: Mat, b: Mat, n: number, k: number, m: number): Mat => {
  const o = new Float64Array(n * m);
  for (let i = 0; i < n; i++)
    for (let p = 0; p < k; p++) for (let j = 0; j < m; j++) o[i * m + j] += a[i * k + p] * b[p * m + j];
  return o;
};
const tr = (a: Mat, n: number, m: number): Mat => {
  const o = new Float64Array(n * m);
  for (let i = 0; i < n; i++) for (let j = 0; j < m; j++) o[j * n + i] = a[i * m + j];
  return o;
};
const fro = (a: Mat) => Math.sqrt(a.reduce((s, x) => s + x * x, 0));

/** per layer, per head: QK = W_Q W_Kᵀ and OV = W_V W_O, [D, D] float64 */
function circuits64(ref: RefModel, processed: boolean): { QK: Mat[][]; OV: Mat[][] } {
  const QK: Mat[][] = [];
  const OV: Mat[][] = [];
  for (let l = 0; l < L; l++) {
    const t = (n: string) => ref.tensors[`transformer.h.${l}.${n}`].data;
    const cAttn = t('attn.c_attn.weight'); // [D, 3D], Conv1D: x · W
    const cProj = t('attn.c_proj.weight'); // [D(in = H·Dh), D]
    const w = t('ln_1.weight');
    const part = (which: number, h: number): Mat => {
      const m = new Float64Array(D * Dh);
      for (let d = 0; d < D; d++)
        for (let e = 0; e < Dh; e++) m[d * Dh + e] = (processed ? w[d] : 1) * cAttn[d * 3 * D + which * D + h * Dh + e];
      if (processed)
        for (let e = 0; e < Dh; e++) {
          let s = 0;
          for (let d = 0; d < D; d++) s += m[d * Dh + e];
          for (let d = 0; d < D; d++) m[d * Dh + e] -= s / D;
        }
      return m;
    };
    QK.push([]);
    OV.push([]);
    for (let h = 0; h < H; h++) {
      const O = new Float64Array(Dh * D);
      for (let e = 0; e < Dh; e++) {
        let s = 0;
        for (let d = 0; d < D; d++) s += O[e * D + d] = cProj[(h * Dh + e) * D + d];
        if (processed) for (let d = 0; d < D; d++) O[e * D + d] -= s / D;
      }
      QK[l].push(mm(part(0, h), tr(part(1, h), D, Dh), D, Dh, D));
      OV[l].push(mm(part(2, h), O, D, Dh, D));
    }
  }
  return { QK, OV };
}

function composition64(c: { QK: Mat[][]; OV: Mat[][] }, mode: 'q' | 'k' | 'v'): number[][] {
  const N = L * H;
  const g = Array.from({ length: N }, () => new Array<number>(N).fill(0));
  for (let la = 0; la < L; la++)
    for (let ha = 0; ha < H; ha++)
      for (let lb = la + 1; lb < L; lb++)
        for (let hb = 0; hb < H; hb++) {
          const A = c.OV[la][ha];
          const B = mode === 'q' ? c.QK[lb][hb] : mode === 'k' ? tr(c.QK[lb][hb], D, D) : c.OV[lb][hb];
          g[la * H + ha][lb * H + hb] = fro(mm(A, B, D, D, D)) / (fro(A) * fro(B));
        }
  return g;
}

describe('composition_scores on induction-gpt2', () => {
  let model: Model;
  let ref: RefModel;
  beforeAll(async () => {
    model = await loadModel(DIR);
    ref = loadModelDir(DIR);
  });
  afterAll(async () => {
    await model?.dispose();
  });

  for (const weights of ['processed', 'unprocessed'] as const)
    it(`equals the float64 formula on the ${weights} weights (every pair, q, k and v)`, async () => {
      const c = circuits64(ref, weights === 'processed');
      const doc = await ops.composition_scores(model, { weights });
      expect(doc.heads).toEqual(['L0H0', 'L0H1', 'L0H2', 'L0H3', 'L1H0', 'L1H1', 'L1H2', 'L1H3']);
      for (const m of doc.modes) {
        const want = composition64(c, m.mode);
        let err = 0;
        want.forEach((row, a) => row.forEach((v, b) => (err = Math.max(err, Math.abs(v - m.grid![a][b])))));
        expect(err, m.mode).toBeLessThan(1e-5);
      }
      for (const h of doc.circuits) {
        expect(h.qk_norm).toBeCloseTo(fro(c.QK[h.layer][h.head]), 4);
        expect(h.ov_norm).toBeCloseTo(fro(c.OV[h.layer][h.head]), 4);
      }
    });

  it('shows the previous-token heads (L0H0, L0H1) K-composing with the induction heads', async () => {
    const doc = await ops.composition_scores(model, { modes: ['k', 'q', 'v'], top_k: 8 });
    const k = doc.modes.find((m) => m.mode === 'k')!;
    // the README's previous-token heads are L0H0 and L0H1; every layer-1 head is an induction head
    const fromPrev = (a: number) => k.grid![a].slice(H);
    const mean = (xs: number[]) => xs.reduce((s, x) => s + x, 0) / xs.length;
    const prev = mean([...fromPrev(0), ...fromPrev(1)]);
    const other = mean([...fromPrev(2), ...fromPrev(3)]);
    expect(prev).toBeGreaterThan(other);
    expect(k.top.slice(0, 4).every((p) => p.from.layer === 0 && p.from.head <= 1)).toBe(true);
  });

  it('the library gives the same: allCompositionScores, QK and OV', async () => {
    const c = circuits64(ref, true);
    const K = await model.allCompositionScores('K');
    expect(K.dims).toEqual([L, H, L, H]);
    const want = composition64(c, 'k');
    for (let a = 0; a < L * H; a++)
      for (let b = 0; b < L * H; b++) expect(K.data[a * L * H + b]).toBeCloseTo(want[a][b], 5);
    const qk = model.QK(1, 2);
    const ov = model.OV(0, 1, { processed: false });
    const ovRaw = circuits64(ref, false).OV[0][1];
    let e1 = 0,
      e2 = 0;
    for (let i = 0; i < D * D; i++) {
      e1 = Math.max(e1, Math.abs(qk.data[i] - c.QK[1][2][i]));
      e2 = Math.max(e2, Math.abs(ov.data[i] - ovRaw[i]));
    }
    expect(e1).toBeLessThan(1e-4);
    expect(e2).toBeLessThan(1e-4);
    await expect(model.allCompositionScores('X' as 'Q')).rejects.toMatchObject({ code: 'BAD_INPUT' });
  });
});
