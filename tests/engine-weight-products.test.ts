/**
 * model.weightProducts (DLA's products with W_O and W_out, streamed from the weight bytes in
 * JavaScript or run in the readout session, and the unembedding's rows and sum read in
 * JavaScript): every product equals the same product computed in float64 from the Hugging Face
 * tensors (Conv1D [in, out] on GPT-2, Linear [out, in] elsewhere), on onnxruntime-node and WASM,
 * both readouts, F32 / F16 / BF16 weights and q8 (against the q8 scheme written out in
 * tests/helpers/q8-reference.ts), with any mix of given and absent (zero-length) inputs.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { nodeFactory } from '../src/node/load';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { createModel, modelPartsFrom } from '../src/engine/model';
import { describeModel } from '../src/engine/arch';
import { q8WeightSet } from '../src/engine/q8';
import { matrixRows } from '../src/engine/readout/stream';
import type { WeightsMode } from '../src/engine/precision';
import { HEAP_ROOM, type ReadoutMode } from '../src/engine/readout';
import { estimateMemory, weightStats, type BudgetLimits } from '../src/engine/budget';
import type { LoadedModel } from '../src/engine/api';
import {
  ALL_FAMILY_CASES,
  loadModelDir,
  makeCaseModel,
  makeRandomModel,
  mulberry32,
  type Family,
  type RandomModel,
  type RefModel,
} from './reference';
import { q8Reference } from './helpers/q8-reference';
import { SHARED } from './helpers/shared';

/** a model loaded as loadModelNode does, with its readout forced */
async function load(
  dir: string,
  backend: 'node' | 'wasm',
  readout: ReadoutMode | undefined,
  weightsMode: WeightsMode = 'auto',
  memory?: BudgetLimits,
): Promise<LoadedModel> {
  const files = await loadModelFilesNode(dir);
  return createModel(
    { ...modelPartsFrom(files, { bundled: false, id: dir, weightsMode, memory }), ...(readout ? { readout } : {}) },
    await nodeFactory(backend),
  );
}

interface Maps {
  WO: (l: number, i: number, d: number) => number;
  Wout: (l: number, n: number, d: number) => number;
  WU: (v: number, d: number) => number;
}

function gpt2Maps(ref: RefModel, D: number): Maps {
  const t = ref.tensors;
  return {
    WO: (l, i, d) => t[`transformer.h.${l}.attn.c_proj.weight`].data[i * D + d],
    Wout: (l, n, d) => t[`transformer.h.${l}.mlp.c_proj.weight`].data[n * D + d],
    WU: (v, d) => (t['lm_head.weight'] ?? t['transformer.wte.weight']).data[v * D + d],
  };
}

/** Linear [out, in] families: Llama-like (llama, qwen, gemma) and GPT-NeoX names */
function linearMaps(ref: RefModel, HD: number, M: number, D: number, family: Family = 'llama'): Maps {
  const t = ref.tensors;
  const neox = family === 'gpt_neox';
  const o = (l: number) =>
    neox ? `gpt_neox.layers.${l}.attention.dense.weight` : `model.layers.${l}.self_attn.o_proj.weight`;
  const down = (l: number) =>
    neox ? `gpt_neox.layers.${l}.mlp.dense_4h_to_h.weight` : `model.layers.${l}.mlp.down_proj.weight`;
  const U = neox
    ? (t['embed_out.weight'] ?? t['gpt_neox.embed_in.weight'])
    : (t['lm_head.weight'] ?? t['model.embed_tokens.weight']);
  return {
    WO: (l, i, d) => t[o(l)].data[d * HD + i],
    Wout: (l, n, d) => t[down(l)].data[d * M + n],
    WU: (v, d) => U.data[v * D + d],
  };
}

function mapsOf(ref: RefModel, family: Family, model: LoadedModel): Maps {
  const { n_heads: H, d_head: Dh, d_mlp: M, d_model: D } = model.info;
  return family === 'gpt2' ? gpt2Maps(ref, D) : linearMaps(ref, H * Dh, M, D, family);
}

function rand(n: number, seed: number): Float32Array {
  const u = mulberry32(seed);
  return Float32Array.from({ length: n }, () => u() * 2 - 1);
}

function maxRelErr(got: ArrayLike<number>, want: ArrayLike<number>): number {
  let scale = 1e-6,
    err = 0;
  for (let i = 0; i < want.length; i++) scale = Math.max(scale, Math.abs(want[i]));
  expect(got.length).toBe(want.length);
  for (let i = 0; i < want.length; i++) err = Math.max(err, Math.abs(got[i] - want[i]));
  return err / scale;
}

/** `exact`: the unembedding's rows are the stored values (0 error); at q8 too (every q · s is exact in float32) */
async function check(model: LoadedModel, m: Maps) {
  const { n_layers: L, n_heads: H, d_head: Dh, d_model: D, d_mlp: M, d_vocab: V } = model.info;
  const HD = H * Dh;
  const z = rand(L * HD, 1),
    post = rand(L * M, 2),
    dirs = rand(L * 2 * D, 3);
  const ids = [3, Math.min(5, V - 1)];
  const wantX = new Float64Array(L * D),
    wantXm = new Float64Array(L * D),
    wantA = new Float64Array(L * 2 * HD),
    wantM = new Float64Array(L * 2 * M);
  for (let l = 0; l < L; l++) {
    for (let d = 0; d < D; d++) {
      for (let i = 0; i < HD; i++) wantX[l * D + d] += z[l * HD + i] * m.WO(l, i, d);
      for (let n = 0; n < M; n++) wantXm[l * D + d] += post[l * M + n] * m.Wout(l, n, d);
    }
    for (let k = 0; k < 2; k++) {
      const e = dirs.subarray((l * 2 + k) * D, (l * 2 + k + 1) * D);
      for (let i = 0; i < HD; i++) {
        let s = 0;
        for (let d = 0; d < D; d++) s += m.WO(l, i, d) * e[d];
        wantA[(l * 2 + k) * HD + i] = s;
      }
      for (let n = 0; n < M; n++) {
        let s = 0;
        for (let d = 0; d < D; d++) s += m.Wout(l, n, d) * e[d];
        wantM[(l * 2 + k) * M + n] = s;
      }
    }
  }
  const wantRows = Float64Array.from({ length: 2 * D }, (_, j) => m.WU(ids[Math.floor(j / D)], j % D));
  const wantSum = Float64Array.from({ length: D }, (_, d) => {
    let s = 0;
    for (let v = 0; v < V; v++) s += m.WU(v, d);
    return s;
  });

  // the unembedding's products are read in JavaScript: no readout session (no second copy of W_U) for them
  const sessions = model.memory().sessions;
  const unembedOnly = await model.weightProducts({ unembedIds: ids, unembedSum: true });
  expect(model.memory().sessions).toBe(sessions);
  expect(maxRelErr(unembedOnly.unembedRows.data, wantRows)).toBe(0);
  expect(maxRelErr(unembedOnly.unembedSum.data, wantSum)).toBeLessThan(1e-6);
  expect(unembedOnly.attnX.dims).toEqual([L, 0, D]);

  const all = await model.weightProducts({
    z: { dims: [L, 1, HD], data: z },
    post: { dims: [L, 1, M], data: post },
    attnDirs: { dims: [L, 2, D], data: dirs },
    mlpDirs: { dims: [L, 2, D], data: dirs },
    unembedIds: ids,
    unembedSum: true,
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
  // streamed: no session besides the forward's, whatever was asked for
  if (model.info.readout === 'stream') expect(model.memory().sessions).toBe(sessions);

  // mixes of given and absent inputs, in both orders (the session reuses buffers between runs)
  const onlyZ = await model.weightProducts({ z: { dims: [L, 1, HD], data: z }, unembedIds: ids });
  expect(onlyZ.attnDir.dims).toEqual([L, 0, HD]);
  expect(onlyZ.unembedSum.data.every((x) => x === 0)).toBe(true);
  expect(maxRelErr(onlyZ.attnX.data, wantX)).toBeLessThan(1e-5);
  const onlyDirs = await model.weightProducts({
    attnDirs: { dims: [L, 2, D], data: dirs },
    mlpDirs: { dims: [L, 2, D], data: dirs },
  });
  expect(onlyDirs.attnX.dims).toEqual([L, 0, D]);
  expect(onlyDirs.unembedRows.dims).toEqual([0, D]);
  expect(maxRelErr(onlyDirs.mlpDir.data, wantM)).toBeLessThan(1e-5);
  await expect(
    model.weightProducts({ z: { dims: [L, 1, HD + 1], data: new Float32Array(L * (HD + 1)) } }),
  ).rejects.toMatchObject({ code: 'BAD_INPUT' });
  await expect(model.weightProducts({ unembedIds: [V] })).rejects.toMatchObject({ code: 'BAD_TOKEN_ID' });
}

describe('weightProducts equals float64 products of the stored weights', () => {
  let rm: RandomModel;
  beforeAll(() => {
    rm = makeRandomModel('llama', { seed: 5, dModel: 32, nLayers: 2, nHeads: 4, nKvHeads: 2, dMlp: 48, vocabSize: 80 });
  });
  afterAll(() => rm?.cleanup());
  for (const backend of ['node', 'wasm'] as const)
    for (const readout of ['stream', 'session'] as const) {
      it(`GPT-2 (Conv1D [in, out]) on ${backend}, readout ${readout}`, async () => {
        const dir = SHARED + '/models/induction-gpt2';
        const model = await load(dir, backend, readout);
        expect(model.info.readout).toBe(readout);
        try {
          await check(model, gpt2Maps(loadModelDir(dir), model.info.d_model));
        } finally {
          await model.dispose();
        }
      });
      it(`Llama (Linear [out, in], GQA) on ${backend}, readout ${readout}`, async () => {
        const model = await load(rm.dir, backend, readout);
        try {
          await check(model, mapsOf(loadModelDir(rm.dir), 'llama', model));
        } finally {
          await model.dispose();
        }
      });
    }
});

// the streamed readout in each stored layout and precision: F16 Conv1D (GPT-2), BF16 and F32
// Linear, Gemma 2's post-norm layout; q8 blocked along the rows of a Linear and along the
// columns of a Conv1D (GPT-2's c_proj [96, 32]: three blocks of 32 rows), against the q8 scheme
const STREAM_CASES: { name: string; dtype: 'F32' | 'F16' | 'BF16'; weights: WeightsMode; backend: 'node' | 'wasm' }[] =
  [
    { name: 'gpt2-untied-erf-f16', dtype: 'F16', weights: 'stored', backend: 'node' },
    { name: 'llama-gqa-tied', dtype: 'BF16', weights: 'stored', backend: 'wasm' },
    { name: 'neox-parallel-rot25', dtype: 'F32', weights: 'f32', backend: 'node' },
    { name: 'gemma2-softcap-window', dtype: 'F16', weights: 'f32', backend: 'node' },
    { name: 'gpt2-untied-erf-f16', dtype: 'F16', weights: 'q8', backend: 'node' },
    { name: 'llama-gqa-tied', dtype: 'BF16', weights: 'q8', backend: 'wasm' },
    { name: 'gemma2-softcap-window', dtype: 'F16', weights: 'q8', backend: 'node' },
  ];

describe.each(STREAM_CASES)(
  'streamed readout vs float64: $name $dtype weights=$weights on $backend',
  ({ name, dtype, weights, backend }) => {
    it('every product', async () => {
      const c = ALL_FAMILY_CASES.find((x) => x.name === name)!;
      const rm = makeCaseModel(c, { dtype });
      const model = await load(rm.dir, backend, 'stream', weights);
      try {
        expect(model.info.weights).toBe(weights);
        await check(model, mapsOf(weights === 'q8' ? q8Reference(rm) : loadModelDir(rm.dir), c.family, model));
      } finally {
        await model.dispose();
        rm.cleanup();
      }
    });
  },
);

describe('matrixRows', () => {
  it('reads any row range of a q8 matrix blocked along its columns (Conv1D) as the q8 scheme gives it', async () => {
    const c = ALL_FAMILY_CASES.find((x) => x.name === 'gpt2-untied-erf-f16')!;
    const rm = makeCaseModel(c);
    try {
      const files = await loadModelFilesNode(rm.dir);
      const ws = await q8WeightSet(
        files.weights,
        describeModel({ config: files.config as Record<string, any>, tensors: files.weights.tensors }),
      );
      const name = 'transformer.h.1.mlp.c_proj.weight';
      const e = ws.tensors.get(name)!;
      expect(e.q8).toMatchObject({ axis: 0, block: 32 });
      const want = q8Reference(rm).tensors[name];
      const C = e.shape[1];
      // ranges starting inside a block and crossing into the next ones, and the last row
      for (const [start, n] of [
        [5, 40],
        [31, 2],
        [0, 96],
        [95, 1],
      ]) {
        const got = matrixRows(ws, e, start, n);
        // + 0: the scheme's q of a tiny negative weight is −0 (the same value)
        expect(Array.from(got, (v) => v + 0)).toEqual(
          Array.from({ length: n * C }, (_, i) => want.data[start * C + i] + 0),
        );
      }
    } finally {
      rm.cleanup();
    }
  });
});

describe('which readout runs (readout/choose.ts)', () => {
  it('streams where a readout session would hold a second copy of W_O and W_out, and says why', async () => {
    const c = ALL_FAMILY_CASES.find((x) => x.name === 'gpt2-untied-erf-f16')!;
    const rm = makeCaseModel(c);
    // the widened weights' size, and a host just big enough for them but not for the second copy
    const files = await loadModelFilesNode(rm.dir);
    const used = [...files.weights.tensors.values()];
    const spec = describeModel({ config: files.config as Record<string, any>, tensors: files.weights.tensors });
    const readout = spec.layers.flatMap((l) => [l.attn!.o.w, l.mlp!.down.w]).map((n) => files.weights.tensors.get(n)!);
    const peak = (es: typeof used) => estimateMemory(weightStats(es), 'node', 'f32').poolBytes;
    const tight = { hostBytes: Math.round((peak(used) + peak([...used, ...readout])) / 2) };
    const poolWasm = (es: typeof used) => estimateMemory(weightStats(es), 'wasm', 'stored').poolBytes;
    expect(estimateMemory(weightStats(used), 'node', 'f32', tight).fits).toBe(true);
    const cases: [string, 'node' | 'wasm', WeightsMode, ReadoutMode, RegExp, BudgetLimits?][] = [
      [SHARED + '/models/induction-gpt2', 'node', 'f32', 'session', /maps the same weight file pages/], // float32 files, mapped as stored
      [rm.dir, 'node', 'stored', 'session', /maps the same weight file pages/],
      // widened at load: the session's own float32 copies where host memory holds them, else streamed
      [
        rm.dir,
        'node',
        'f32',
        'session',
        /own float32 copies of W_O and W_out: with them .* fits host memory/,
        { hostBytes: 64 * 1024 ** 3 },
      ],
      [
        rm.dir,
        'node',
        'f32',
        'stream',
        /own float32 copies of W_O and W_out, and with them .* more than host memory/,
        tight,
      ],
      [rm.dir, 'node', 'f32', 'stream', /own float32 copies .*host memory unknown/],
      [rm.dir, 'node', 'q8', 'stream', /held in memory/], // quantised in memory (no q8 cache here)
      // WASM: the session while the heap holds the second copy within HEAP_ROOM, else streamed
      [rm.dir, 'wasm', 'stored', 'session', /within 80 % of the 4 GiB WebAssembly heap/],
      [
        rm.dir,
        'wasm',
        'stored',
        'stream',
        /hold W_O and W_out again in the WASM heap, which with it would need about/,
        { wasmHeapBytes: Math.floor(poolWasm([...used, ...readout]) / HEAP_ROOM) - 1 },
      ],
    ];
    try {
      for (const [dir, backend, weights, want, why, memory] of cases) {
        const model = await load(dir, backend, undefined, weights, memory);
        try {
          expect([backend, weights, model.info.readout]).toEqual([backend, weights, want]);
          expect(model.info.readout_reason).toMatch(why);
        } finally {
          await model.dispose();
        }
      }
    } finally {
      rm.cleanup();
    }
  });
});
