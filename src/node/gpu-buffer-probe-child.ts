/**
 * The child of gpu-buffer-probe.ts: one tensor of argv[2] bytes made on onnxruntime-node's WebGPU
 * provider (Expand of one float32 to n, no CPU fallback) and its last element read back; prints
 * { ok, ms } or { ok: false, error }. Its own process, so its device and memory go when it exits
 * and a driver that aborts takes only it down.
 */
import { prepareVulkan } from './vulkan';
import { requireOrtNode } from './ort-node';
import { OnnxGraph } from '../engine/graph/onnx-builder';
import type { OrtModule } from '../engine/runtime/ort-session';

const VALUE = 0.8125; // exact in float32: a buffer that was not written reads back something else

async function probe(bytes: number): Promise<Record<string, unknown>> {
  const n = Math.floor(bytes / 4);
  prepareVulkan();
  const ort = requireOrtNode<OrtModule>();
  const g = new OnnxGraph(() => '');
  const big = g.o('Expand', [g.input('x', 'float', [1]), g.input('n', 'int64', [1])]);
  g.rename(g.o('Slice', [big, g.input('s', 'int64', [1]), g.input('e', 'int64', [1])]), 'y');
  g.output('y');
  const t0 = performance.now();
  const s = await ort.InferenceSession.create(g.encode(), {
    executionProviders: ['webgpu'],
    logSeverityLevel: 4,
    extra: { session: { 'session.disable_cpu_ep_fallback': '1' } },
  });
  const i64 = (v: number) => new ort.Tensor('int64', BigInt64Array.from([BigInt(v)]), [1]);
  const out = await s.run({
    x: new ort.Tensor('float32', Float32Array.from([VALUE]), [1]),
    n: i64(n),
    s: i64(n - 1),
    e: i64(n),
  });
  const y = (out.y.data as Float32Array)[0];
  await s.release?.();
  return y === VALUE
    ? { ok: true, ms: Math.round(performance.now() - t0) }
    : { ok: false, error: `its last element read back as ${y}, not ${VALUE}` };
}

probe(Number(process.argv[2])).then(
  (r) => process.stdout.write(JSON.stringify(r) + '\n'),
  (e) => process.stdout.write(JSON.stringify({ ok: false, error: String((e as Error).message).split('\n')[0] }) + '\n'),
);
