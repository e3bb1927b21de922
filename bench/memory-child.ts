/**
 * One measurement of bench/memory.ts in its own process: load a model with onnxruntime session
 * options over the defaults, then one `trace`; prints the process's RSS and peak RSS (VmHWM)
 * after the load and after the trace, the WASM heap, the engine's memory report and where the
 * load's time went (files + headers, graph build, session creation).
 *
 *   tsx bench/memory-child.ts DIR node|wasm stored|f32 '{"extra":{"session":{"disable_prepacking":"1"}}}'
 */
import { readFileSync } from 'node:fs';
import { totalmem } from 'node:os';
import { createModel, modelPartsFrom } from '../src/engine/model';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { nodeFactory } from '../src/node/load';
import { getOperation } from '../src/ops/index';
import { toLoupeError } from '../src/engine/errors';
import { wasmHeapBytes } from '../src/engine/runtime/wasm-heap';

const [dir, backend, weights, optsJson] = process.argv.slice(2);
const status = (k: string) => Number(new RegExp(`${k}:\\s+(\\d+)`).exec(readFileSync('/proc/self/status', 'utf8'))![1]) * 1024;

async function main() {
  let stage = 'load';
  const out: Record<string, unknown> = {};
  try {
    const t0 = performance.now();
    const files = await loadModelFilesNode(dir);
    out.files_ms = Math.round(performance.now() - t0);
    const factory = await nodeFactory(backend as 'node' | 'wasm', undefined, optsJson ? JSON.parse(optsJson) : undefined);
    const create = factory.create.bind(factory);
    let prepMs = 0, sessionMs = 0, last = performance.now();
    factory.create = async (g, w) => {
      const t = performance.now();
      prepMs += t - last; // describe, tokenizer and graph build happen before create is called
      const s = await create(g, w);
      sessionMs += performance.now() - t;
      return s;
    };
    last = performance.now();
    const model = await createModel(modelPartsFrom(files, { bundled: false, memory: { hostBytes: totalmem() }, weightsMode: weights as 'stored' | 'f32' }), factory);
    out.ready_ms = Math.round(performance.now() - t0);
    out.prep_ms = Math.round(prepMs);
    out.session_ms = Math.round(sessionMs);
    out.rss_ready = status('VmRSS');
    out.hwm_ready = status('VmHWM');
    stage = 'trace';
    const t1 = performance.now();
    await getOperation('trace')!.run(model, { prompt: 'The quick brown fox jumps over the lazy' } as any);
    out.trace_ms = Math.round(performance.now() - t1);
    out.rss_trace = status('VmRSS');
    out.hwm_trace = status('VmHWM');
    out.wasm_heap = wasmHeapBytes();
    Object.assign(out, model.memory());
    console.log(JSON.stringify(out));
    await model.dispose();
  } catch (e) {
    const err = toLoupeError(e);
    console.log(JSON.stringify({ ...out, error: `${err.code} at ${stage}: ${err.message.slice(0, 160)}`, hwm: status('VmHWM') }));
  }
}
void main();
