/**
 * onnxruntime's fused kernels against what they replace, one GPT-2-small-sized layer's worth at a
 * time (d_model 768, 12 heads of 64), random inputs, interleaved rounds, median ms per run (wall
 * and process CPU time):
 *   addln  Add + LayerNormalization         vs  skip  SkipLayerNormalization (with its sum output)
 *   attn   the decomposed attention (MatMul, scale, mask, Softmax, MatMul, transposes)
 *          vs  mha  MultiHeadAttention (query BSNH, keys/values BNSH, mask expanded to [B, H, T, T], as build-model.ts writes it)
 *          and mhab (node only) the same with the mask broadcast as [1, 1, T, T]
 * at B×T = 1×16, 1×128 and 64×16 (circuit's batches). It prints |Δz| between attn and mha too.
 *
 *   tsx bench/fused-kernels.ts [node|wasm] [threads (node; default 2)]
 */
import { createRequire } from 'node:module';
import { OnnxGraph } from '../src/engine/graph/onnx-builder';

const backend = process.argv[2] ?? 'node';
const threads = Number(process.argv[3] ?? 2);
const ort =
  backend === 'node'
    ? createRequire(import.meta.url)('onnxruntime-node')
    : await import('onnxruntime-web').then((m: any) => m.default ?? m);
if (backend !== 'node') ort.env.wasm.numThreads = 1;
const D = 768,
  H = 12,
  Dh = 64;

function graph(kind: string): Uint8Array {
  const g = new OnnxGraph((f) => f);
  if (kind === 'addln' || kind === 'skip') {
    const a = g.input('a', 'float', ['B', 'T', D]);
    const b = g.input('b', 'float', ['B', 'T', D]);
    const w = g.constF(
      Array.from({ length: D }, () => 1),
      [D],
    );
    const bb = g.constF(
      Array.from({ length: D }, () => 0),
      [D],
    );
    let sum: string, out: string;
    if (kind === 'addln') {
      sum = g.o('Add', [a, b]);
      out = g.o('LayerNormalization', [sum, w, bb], { axis: -1, epsilon: { float: 1e-5 } });
    } else {
      [out, , , sum] = g.msOp('SkipLayerNormalization', [a, b, w, bb], { epsilon: { float: 1e-5 } }, 4, [1, 2]);
    }
    g.rename(sum, 'sum');
    g.output('sum');
    g.rename(out, 'out');
    g.output('out');
    return g.encode();
  }
  const q = g.input('q', 'float', ['B', 'T', H, Dh]);
  const k = g.input('k', 'float', ['B', H, 'T', Dh]);
  const v = g.input('v', 'float', ['B', H, 'T', Dh]);
  const m = g.input('m', 'float', ['T', 'T']);
  let z: string;
  if (kind === 'attn') {
    const sc = g.o('Mul', [
      g.o('MatMul', [g.o('Transpose', [q], { perm: [0, 2, 1, 3] }), g.o('Transpose', [k], { perm: [0, 1, 3, 2] })]),
      g.constF([0.125], []),
    ]);
    const p = g.o('Softmax', [g.o('Add', [sc, m])], { axis: -1 });
    z = g.o('Transpose', [g.o('MatMul', [p, v])], { perm: [0, 2, 1, 3] });
  } else {
    const shape = g.o(
      'Concat',
      [g.o('Slice', [g.o('Shape', [q]), g.constI([0]), g.constI([1])]), g.constI([H]), g.o('Shape', [m])],
      { axis: 0 },
    );
    const m4 = g.o('Unsqueeze', [m, g.constI([0, 1])]);
    const bias = kind === 'mha' ? g.o('Expand', [m4, shape]) : m4;
    z = g.o('Reshape', [
      g.msOp('MultiHeadAttention', [g.o('Reshape', [q, g.constI([0, 0, H * Dh])]), k, v, '', '', bias], {
        num_heads: H,
        scale: { float: 0.125 },
      })[0],
      g.constI([0, 0, H, Dh]),
    ]);
  }
  g.rename(z, 'z');
  g.output('z');
  return g.encode();
}

const rnd = (n: number) => Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37));
const cpu = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};
const med = (a: number[]) => [...a].sort((x, y) => x - y)[a.length >> 1];
const kinds = backend === 'node' ? ['addln', 'skip', 'attn', 'mha', 'mhab'] : ['addln', 'skip', 'attn', 'mha'];
const opts =
  backend === 'node'
    ? { graphOptimizationLevel: 'all', intraOpNumThreads: threads }
    : { graphOptimizationLevel: 'all', executionProviders: ['wasm'] };
for (const [B, T] of [
  [1, 16],
  [1, 128],
  [64, 16],
]) {
  const mask = new Float32Array(T * T);
  for (let t = 0; t < T; t++) for (let s = t + 1; s < T; s++) mask[t * T + s] = -Infinity;
  const sessions: Record<string, any> = {};
  const feeds: Record<string, any> = {};
  for (const k of kinds) {
    sessions[k] = await ort.InferenceSession.create(graph(k), opts);
    feeds[k] =
      k === 'addln' || k === 'skip'
        ? {
            a: new ort.Tensor('float32', rnd(B * T * D), [B, T, D]),
            b: new ort.Tensor('float32', rnd(B * T * D).reverse(), [B, T, D]),
          }
        : {
            q: new ort.Tensor('float32', rnd(B * T * D), [B, T, H, Dh]),
            k: new ort.Tensor('float32', rnd(B * T * D).reverse(), [B, H, T, Dh]),
            v: new ort.Tensor('float32', rnd(B * T * D), [B, H, T, Dh]),
            m: new ort.Tensor('float32', mask, [T, T]),
          };
  }
  const z1 = (await sessions.attn.run(feeds.attn)).z.data as Float32Array;
  const z2 = (await sessions.mha.run(feeds.mha)).z.data as Float32Array;
  let dz = 0;
  for (let i = 0; i < z1.length; i++) dz = Math.max(dz, Math.abs(z1[i] - z2[i]));
  const res: Record<string, { wall: number[]; cpu: number[] }> = {};
  const N = B * T >= 1024 ? 20 : 200;
  for (let round = 0; round < 5; round++) {
    for (const k of kinds) {
      const t0 = performance.now(),
        c0 = cpu();
      for (let i = 0; i < N; i++) await sessions[k].run(feeds[k]);
      (res[k] ??= { wall: [], cpu: [] }).wall.push((performance.now() - t0) / N);
      res[k].cpu.push((cpu() - c0) / N);
    }
  }
  for (const s of Object.values(sessions)) await s.release();
  console.log(
    `${backend}${backend === 'node' ? ` ${threads} threads` : ' 1 thread'} B=${B} T=${T} (|Δz| attn vs mha ${dz.toExponential(1)}), ms per run wall / CPU: ` +
      kinds.map((k) => `${k} ${med(res[k].wall).toFixed(3)} / ${med(res[k].cpu).toFixed(3)}`).join(', '),
  );
}
