/**
 * weightProducts' unembedDots (readout/unembed.ts): x_s · W_U for every token,
 * read a chunk of vocabulary rows at a time, judged against the float64 product with the table this
 * test reads from the safetensors file itself (tests/reference's own reader), on F32, F16 and BF16
 * files, and on q8 weights against the q8 scheme written out from its definition
 * (tests/helpers/q8-reference.ts). The vocabulary is split into chunks of a few rows (the tail chunk
 * shorter) as well as read in the default chunk; a cancel is heard between chunks; through the
 * model it needs no session.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { describeModel } from '../src/engine/arch';
import { unembedProducts } from '../src/engine/readout/unembed';
import { q8WeightSet } from '../src/engine/q8';
import type { ReadableWeightSet } from '../src/engine/safetensors';
import {
  ALL_FAMILY_CASES,
  makeCaseModel,
  loadModelDir,
  mulberry32,
  type RandomModel,
  type RefModel,
} from './reference';
import { q8Reference } from './helpers/q8-reference';

/** the stored [V, D] unembedding (lm_head when untied, else the embedding) */
function table(ref: Pick<RefModel, 'tensors'>): { dims: number[]; data: ArrayLike<number> } {
  const names = [
    'lm_head.weight',
    'embed_out.weight',
    'model.embed_tokens.weight',
    'transformer.wte.weight',
    'gpt_neox.embed_in.weight',
  ];
  return ref.tensors[names.find((n) => ref.tensors[n])!];
}

/** x [S, D] · Wᵀ in float64, W [V, D] */
function dots64(x: Float64Array, S: number, W: { dims: number[]; data: ArrayLike<number> }): Float64Array {
  const [V, D] = W.dims;
  const out = new Float64Array(S * V);
  for (let s = 0; s < S; s++)
    for (let v = 0; v < V; v++) {
      let a = 0;
      for (let d = 0; d < D; d++) a += x[s * D + d] * W.data[v * D + d];
      out[s * V + v] = a;
    }
  return out;
}

function maxRelErr(got: ArrayLike<number>, want: ArrayLike<number>): number {
  expect(got.length).toBe(want.length);
  let scale = 1e-12,
    err = 0;
  for (let i = 0; i < want.length; i++) {
    scale = Math.max(scale, Math.abs(want[i]));
    err = Math.max(err, Math.abs(got[i] - want[i]));
  }
  return err / scale;
}

const CASES = [
  { name: 'gpt2-tied', dtype: 'F32' as const },
  { name: 'llama3-rope-untied-bias', dtype: 'BF16' as const },
  { name: 'gemma2-softcap-window', dtype: 'F16' as const },
  { name: 'gpt2-tied', dtype: 'F16' as const, q8: true },
  { name: 'llama-gqa-tied', dtype: 'BF16' as const, q8: true },
];

describe.each(CASES)(
  'unembedDots equals the float64 product with the stored table: $name $dtype q8=$q8',
  ({ name, dtype, q8 }) => {
    let rm: RandomModel;
    beforeAll(() => {
      rm = makeCaseModel(
        ALL_FAMILY_CASES.find((c) => c.name === name)!,
        { dtype },
      );
    });
    afterAll(() => rm?.cleanup());

    it('in one chunk and in chunks of 7 rows (the last one shorter), float32 and float64 inputs', async () => {
      const files = await loadModelFilesNode(rm.dir);
      const spec = describeModel({ config: files.config as Record<string, any>, tensors: files.weights.tensors });
      const weights = q8
        ? await q8WeightSet(files.weights as ReadableWeightSet, spec)
        : (files.weights as ReadableWeightSet);
      const W = q8 ? table(q8Reference(rm)) : table(loadModelDir(rm.dir));
      const { dModel: D, dVocab: V } = spec;
      expect(W.dims).toEqual([V, D]);
      if (q8) expect(weights.tensors.get(spec.unembed.w)!.q8).toBeTruthy();
      expect(V % 7).not.toBe(0);
      const u = mulberry32(3);
      const S = 3;
      const x = Float64Array.from({ length: S * D }, () => u() * 2 - 1);
      const want = dots64(x, S, W);
      for (const chunkBytes of [undefined, 7 * 4 * D]) {
        const got = (await unembedProducts(spec, weights, { unembedDots: { dims: [S, D], data: x } }, { chunkBytes }))
          .unembedDots;
        expect(got.dims).toEqual([S, V]);
        expect(maxRelErr(got.data, want)).toBeLessThan(1e-12);
      }
      // float32 vectors: the same product of their (exact) values
      const x32 = Float32Array.from(x);
      const got32 = (
        await unembedProducts(spec, weights, { unembedDots: { dims: [S, D], data: x32 } }, { chunkBytes: 5 * 4 * D })
      ).unembedDots;
      expect(maxRelErr(got32.data, dots64(Float64Array.from(x32), S, W))).toBeLessThan(1e-12);
    });
  },
);

describe('unembedDots through the model, and cancelled', () => {
  let rm: RandomModel;
  beforeAll(() => {
    rm = makeCaseModel(
      ALL_FAMILY_CASES.find((c) => c.name === 'llama-gqa-tied')!,
      { dtype: 'F16' },
    );
  });
  afterAll(() => rm?.cleanup());

  it('needs no session and keeps no copy of W_U; a wrong shape is BAD_INPUT; absent gives [0, V]', async () => {
    const model = await loadModelNode(rm.dir);
    try {
      const { d_model: D, d_vocab: V } = model.info;
      const x = Float64Array.from({ length: D }, (_, d) => Math.sin(d + 1));
      const sessions = model.memory().sessions;
      const p = await model.weightProducts({ unembedDots: { dims: [1, D], data: x } });
      expect(model.memory().sessions).toBe(sessions);
      expect(model.memory().param_bytes).toBe(0);
      expect(maxRelErr(p.unembedDots.data, dots64(x, 1, table(loadModelDir(rm.dir))))).toBeLessThan(1e-12);
      expect((await model.weightProducts({ unembedIds: [1] })).unembedDots.dims).toEqual([0, V]);
      await expect(
        model.weightProducts({ unembedDots: { dims: [1, D + 1], data: new Float64Array(D + 1) } }),
      ).rejects.toMatchObject({ code: 'BAD_INPUT' });
      await expect(
        model.weightProducts({ unembedDots: { dims: [2, D], data: new Float64Array(D) } }),
      ).rejects.toMatchObject({ code: 'BAD_INPUT' });
    } finally {
      await model.dispose();
    }
  });

  it('a cancel during the pass stops it with ABORTED after that chunk (the dots and the sum)', async () => {
    const files = await loadModelFilesNode(rm.dir);
    const spec = describeModel({ config: files.config as Record<string, any>, tensors: files.weights.tensors });
    const weights = files.weights as ReadableWeightSet;
    const D = spec.dModel;
    for (const input of [{ unembedDots: { dims: [1, D], data: new Float64Array(D).fill(1) } }, { unembedSum: true }]) {
      const ctl = new AbortController();
      let turns = 0;
      const yieldTurn = async () => {
        if (++turns === 3) ctl.abort();
      };
      await expect(
        unembedProducts(spec, weights, input, { signal: ctl.signal, yieldTurn, chunkBytes: 4 * 4 * D }),
      ).rejects.toMatchObject({ code: 'ABORTED' });
      expect(turns).toBe(3);
    }
  });
});
