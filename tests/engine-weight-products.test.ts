/**
 * model.weightProducts (the readout graph DLA uses, and the unembedding's rows and sum read in
 * JavaScript): every product equals the same product computed in float64 from the Hugging Face
 * tensors (Conv1D [in, out] on GPT-2, Linear [out, in] on Llama), on onnxruntime-node and WASM,
 * with any mix of given and absent (zero-length) inputs.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { loadModelDir, makeRandomModel, mulberry32, type RandomModel, type RefModel } from './reference';
import { SHARED } from './helpers/shared';

interface Maps { WO: (l: number, i: number, d: number) => number; Wout: (l: number, n: number, d: number) => number; WU: (v: number, d: number) => number }

function gpt2Maps(ref: RefModel, D: number): Maps {
  const t = ref.tensors;
  return {
    WO: (l, i, d) => t[`transformer.h.${l}.attn.c_proj.weight`].data[i * D + d],
    Wout: (l, n, d) => t[`transformer.h.${l}.mlp.c_proj.weight`].data[n * D + d],
    WU: (v, d) => (t['lm_head.weight'] ?? t['transformer.wte.weight']).data[v * D + d],
  };
}

function llamaMaps(ref: RefModel, HD: number, M: number, D: number): Maps {
  const t = ref.tensors;
  return {
    WO: (l, i, d) => t[`model.layers.${l}.self_attn.o_proj.weight`].data[d * HD + i],
    Wout: (l, n, d) => t[`model.layers.${l}.mlp.down_proj.weight`].data[d * M + n],
    WU: (v, d) => (t['lm_head.weight'] ?? t['model.embed_tokens.weight']).data[v * D + d],
  };
}

function rand(n: number, seed: number): Float32Array {
  const u = mulberry32(seed);
  return Float32Array.from({ length: n }, () => u() * 2 - 1);
}

function maxRelErr(got: ArrayLike<number>, want: ArrayLike<number>): number {
  let scale = 1e-6, err = 0;
  for (let i = 0; i < want.length; i++) scale = Math.max(scale, Math.abs(want[i]));
  expect(got.length).toBe(want.length);
  for (let i = 0; i < want.length; i++) err = Math.max(err, Math.abs(got[i] - want[i]));
  return err / scale;
}

async function check(model: LoadedModel, m: Maps) {
  const { n_layers: L, n_heads: H, d_head: Dh, d_model: D, d_mlp: M, d_vocab: V } = model.info;
  const HD = H * Dh;
  const z = rand(L * HD, 1), post = rand(L * M, 2), dirs = rand(L * 2 * D, 3);
  const ids = [3, Math.min(5, V - 1)];
  const wantX = new Float64Array(L * D), wantXm = new Float64Array(L * D), wantA = new Float64Array(L * 2 * HD), wantM = new Float64Array(L * 2 * M);
  for (let l = 0; l < L; l++) {
    for (let d = 0; d < D; d++) {
      for (let i = 0; i < HD; i++) wantX[l * D + d] += z[l * HD + i] * m.WO(l, i, d);
      for (let n = 0; n < M; n++) wantXm[l * D + d] += post[l * M + n] * m.Wout(l, n, d);
    }
    for (let k = 0; k < 2; k++) {
      const e = dirs.subarray((l * 2 + k) * D, (l * 2 + k + 1) * D);
      for (let i = 0; i < HD; i++) { let s = 0; for (let d = 0; d < D; d++) s += m.WO(l, i, d) * e[d]; wantA[(l * 2 + k) * HD + i] = s; }
      for (let n = 0; n < M; n++) { let s = 0; for (let d = 0; d < D; d++) s += m.Wout(l, n, d) * e[d]; wantM[(l * 2 + k) * M + n] = s; }
    }
  }
  const wantRows = Float64Array.from({ length: 2 * D }, (_, j) => m.WU(ids[Math.floor(j / D)], j % D));
  const wantSum = Float64Array.from({ length: D }, (_, d) => { let s = 0; for (let v = 0; v < V; v++) s += m.WU(v, d); return s; });

  // the unembedding's products are read in JavaScript: no readout session (no second copy of W_U) for them
  const sessions = model.memory().sessions;
  const unembedOnly = await model.weightProducts({ unembedIds: ids, unembedSum: true });
  expect(model.memory().sessions).toBe(sessions);
  expect(maxRelErr(unembedOnly.unembedRows.data, wantRows)).toBe(0);
  expect(maxRelErr(unembedOnly.unembedSum.data, wantSum)).toBeLessThan(1e-6);
  expect(unembedOnly.attnX.dims).toEqual([L, 0, D]);

  const all = await model.weightProducts({
    z: { dims: [L, 1, HD], data: z }, post: { dims: [L, 1, M], data: post },
    attnDirs: { dims: [L, 2, D], data: dirs }, mlpDirs: { dims: [L, 2, D], data: dirs }, unembedIds: ids, unembedSum: true,
  });
  expect(all.attnX.dims).toEqual([L, 1, D]);
  expect(all.attnDir.dims).toEqual([L, 2, HD]);
  expect(all.mlpDir.dims).toEqual([L, 2, M]);
  expect(maxRelErr(all.attnX.data, wantX)).toBeLessThan(1e-5);
  expect(maxRelErr(all.mlpX.data, wantXm)).toBeLessThan(1e-5);
  expect(maxRelErr(all.attnDir.data, wantA)).toBeLessThan(1e-5);
  expect(maxRelErr(all.mlpDir.data, wantM)).toBeLessThan(1e-5);
  expect(maxRelErr(all.unembedRows.data, wantRows)).toBe(0);
  expect(maxRelErr(all.unembedSum.data, wantSum)).toBeLessThan(1e-5);

  // mixes of given and absent inputs, in both orders (the session reuses buffers between runs)
  const onlyZ = await model.weightProducts({ z: { dims: [L, 1, HD], data: z }, unembedIds: ids });
  expect(onlyZ.attnDir.dims).toEqual([L, 0, HD]);
  expect(onlyZ.unembedSum.data.every((x) => x === 0)).toBe(true);
  expect(maxRelErr(onlyZ.attnX.data, wantX)).toBeLessThan(1e-5);
  const onlyDirs = await model.weightProducts({ attnDirs: { dims: [L, 2, D], data: dirs }, mlpDirs: { dims: [L, 2, D], data: dirs } });
  expect(onlyDirs.attnX.dims).toEqual([L, 0, D]);
  expect(onlyDirs.unembedRows.dims).toEqual([0, D]);
  expect(maxRelErr(onlyDirs.mlpDir.data, wantM)).toBeLessThan(1e-5);
  await expect(model.weightProducts({ z: { dims: [L, 1, HD + 1], data: new Float32Array(L * (HD + 1)) } })).rejects.toMatchObject({ code: 'BAD_INPUT' });
  await expect(model.weightProducts({ unembedIds: [V] })).rejects.toMatchObject({ code: 'BAD_TOKEN_ID' });
}

describe('weightProducts equals float64 products of the stored weights', () => {
  let rm: RandomModel;
  beforeAll(() => { rm = makeRandomModel('llama', { seed: 5, dModel: 32, nLayers: 2, nHeads: 4, nKvHeads: 2, dMlp: 48, vocabSize: 80 }); });
  afterAll(() => rm?.cleanup());
  for (const backend of ['node', 'wasm'] as const) {
    it(`GPT-2 (Conv1D [in, out]) on ${backend}`, async () => {
      const dir = SHARED + '/models/induction-gpt2';
      const model = await loadModelNode(dir, { backend });
      try { await check(model, gpt2Maps(loadModelDir(dir), model.info.d_model)); } finally { await model.dispose(); }
    });
    it(`Llama (Linear [out, in], GQA) on ${backend}`, async () => {
      const model = await loadModelNode(rm.dir, { backend });
      const { n_heads: H, d_head: Dh, d_mlp: M, d_model: D } = model.info;
      try { await check(model, llamaMaps(loadModelDir(rm.dir), H * Dh, M, D)); } finally { await model.dispose(); }
    });
  }
});
