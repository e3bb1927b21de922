/**
 * One measurement of bench/scale.ts in its own process: load, first trace, peak RSS (VmHWM), and
 * session_ms: the time onnxruntime took to create the load's session(s) (InferenceSession.create,
 * the weights handed over as they are: in memory, or files on disk), the rest of ready_ms being
 * Loupe's own work (headers, tokenizer, graph, q8 quantisation or its cache).
 */
import { readFileSync } from 'node:fs';
import { loadModelNode } from '../src/node/load';
import { getOperation } from '../src/ops/index';
import { toLoupeError } from '../src/engine/errors';
import { wasmHeapBytes } from '../src/engine/runtime/wasm-heap';
import type { WeightsMode } from '../src/engine/precision';
import { requireOrtNode } from '../src/node/ort-node';

/** `load-only` as a 4th argument: no trace (bench/q8-start.ts repeats loads) */
const [dir, backend, weights, mode] = process.argv.slice(2);
const hwm = () => Number(/VmHWM:\s+(\d+)/.exec(readFileSync('/proc/self/status', 'utf8'))![1]) * 1024;

/** add the time of every InferenceSession.create to `sessionMs` */
let sessionMs = 0;
async function timeSessions(): Promise<void> {
  const ort: any = backend === 'node' ? requireOrtNode() : await import('onnxruntime-web');
  const create = ort.InferenceSession.create.bind(ort.InferenceSession);
  ort.InferenceSession.create = async (...args: unknown[]) => {
    const t = performance.now();
    try {
      return await create(...args);
    } finally {
      sessionMs += performance.now() - t;
    }
  };
}

async function main() {
  let stage = 'load';
  try {
    await timeSessions();
    const t0 = performance.now();
    const model = await loadModelNode(dir, { backend: backend as 'node' | 'wasm', weights: weights as WeightsMode });
    const ready = performance.now() - t0;
    const session = sessionMs;
    stage = 'trace';
    const t1 = performance.now();
    if (mode !== 'load-only')
      await getOperation('trace')!.run(model, { prompt: 'The quick brown fox jumps over the lazy' } as any);
    const trace = performance.now() - t1;
    console.log(
      JSON.stringify({
        ready_ms: Math.round(ready),
        session_ms: Math.round(session),
        weights_reason: model.info.weights_reason,
        trace_ms: Math.round(trace),
        peak_bytes: hwm(),
        weight_bytes: model.info.weight_bytes,
        heap_bytes: wasmHeapBytes() ?? undefined,
      }),
    );
    await model.dispose();
  } catch (e) {
    const err = toLoupeError(e);
    console.log(
      JSON.stringify({
        error: `${err.code} at ${stage}: ${err.message.slice(0, 160)}`,
        peak_bytes: hwm(),
        heap_bytes: wasmHeapBytes() ?? undefined,
      }),
    );
  }
}
void main();
