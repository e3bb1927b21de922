/** One measurement of bench/scale.ts in its own process: load, first trace, peak RSS (VmHWM). */
import { readFileSync } from 'node:fs';
import { loadModelNode } from '../src/node/load';
import { getOperation } from '../src/ops/index';
import { toLoupeError } from '../src/engine/errors';
import { wasmHeapBytes } from '../src/engine/runtime/wasm-heap';
import type { WeightsMode } from '../src/engine/precision';

const [dir, backend, weights] = process.argv.slice(2);
const hwm = () => Number(/VmHWM:\s+(\d+)/.exec(readFileSync('/proc/self/status', 'utf8'))![1]) * 1024;

async function main() {
  let stage = 'load';
  try {
    const t0 = performance.now();
    const model = await loadModelNode(dir, { backend: backend as 'node' | 'wasm', weights: weights as WeightsMode });
    const ready = performance.now() - t0;
    stage = 'trace';
    const t1 = performance.now();
    await getOperation('trace')!.run(model, { prompt: 'The quick brown fox jumps over the lazy' } as any);
    const trace = performance.now() - t1;
    console.log(JSON.stringify({ ready_ms: Math.round(ready), trace_ms: Math.round(trace), peak_bytes: hwm(), weight_bytes: model.info.weight_bytes, heap_bytes: wasmHeapBytes() ?? undefined }));
    await model.dispose();
  } catch (e) {
    const err = toLoupeError(e);
    console.log(JSON.stringify({ error: `${err.code} at ${stage}: ${err.message.slice(0, 160)}`, peak_bytes: hwm(), heap_bytes: wasmHeapBytes() ?? undefined }));
  }
}
void main();
