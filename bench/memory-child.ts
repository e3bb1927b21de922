/**
 * One measurement of bench/memory.ts in its own process: load a model with onnxruntime session
 * options over the defaults, then one `trace`; prints the process's RSS and peak RSS (VmHWM)
 * after the load and after the trace, the WASM heap, the engine's memory report and where the
 * load's time went (files + headers, graph build, session creation). `phases`: the peak RSS of each
 * step on its own (VmHWM is reset before each through /proc/self/clear_refs), named by the graph
 * (its first output) and the step: where the peak comes from. Then the time of a second trace and
 * of a plain forward of the same prompt; `wp_ms` / `wp2_ms`: the time in model.weightProducts
 * during the first / second trace (DLA's readout, session or streamed: `readout`, the optional
 * 5th argument, forces one; readout/choose.ts).
 *
 *   tsx bench/memory-child.ts DIR node|wasm stored|f32 '{"extra":{"session":{"disable_prepacking":"1"}}}' [session|stream]
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { totalmem } from 'node:os';
import { createModel, modelPartsFrom } from '../src/engine/model';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { nodeFactory } from '../src/node/load';
import { getOperation } from '../src/ops/index';
import { toLoupeError } from '../src/engine/errors';
import { wasmHeapBytes } from '../src/engine/runtime/wasm-heap';
import type { ReadoutMode } from '../src/engine/readout';

const [dir, backend, weights, optsJson, readout] = process.argv.slice(2);
const status = (k: string) =>
  Number(new RegExp(`${k}:\\s+(\\d+)`).exec(readFileSync('/proc/self/status', 'utf8'))![1]) * 1024;
/** peak RSS per step: [step, peak during it, what is held after it] */
const phases: [string, number, string][] = [];
/** after a step: RSS split into anonymous memory and mapped files, the WASM heap, JavaScript's heap and buffers */
function held(): string {
  const roll = readFileSync('/proc/self/smaps_rollup', 'utf8');
  const kb = (k: string) => Number(new RegExp(`${k}:\\s+(\\d+)`).exec(roll)?.[1] ?? 0) * 1024;
  const gb = (b: number) => (b / 1e9).toFixed(2);
  const heap = wasmHeapBytes();
  return `RSS ${gb(status('VmRSS'))} (anon ${gb(kb('Anonymous'))}, files ${gb(kb('Rss') - kb('Anonymous'))}${heap ? `, WASM heap ${gb(heap)}` : ''}, JS heap ${gb(process.memoryUsage().heapTotal)}, JS buffers ${gb(process.memoryUsage().arrayBuffers)})`;
}
/** the process's peak so far, across the resets */
let peakSeen = 0;
const peak = () => Math.max(peakSeen, status('VmHWM'));
function resetPeak() {
  peakSeen = peak();
  try {
    writeFileSync('/proc/self/clear_refs', '5');
  } catch {
    /* not Linux: the peaks add up */
  }
}
async function phase<T>(name: string, f: () => Promise<T>): Promise<T> {
  resetPeak();
  const r = await f();
  phases.push([name, status('VmHWM'), held()]);
  return r;
}

async function main() {
  let stage = 'load';
  const out: Record<string, unknown> = {};
  try {
    const t0 = performance.now();
    const files = await phase('read files', () => loadModelFilesNode(dir));
    out.files_ms = Math.round(performance.now() - t0);
    const factory = await nodeFactory(
      backend as 'node' | 'wasm',
      undefined,
      optsJson ? JSON.parse(optsJson) : undefined,
    );
    const create = factory.create.bind(factory);
    let prepMs = 0,
      sessionMs = 0,
      last = performance.now();
    factory.create = async (g, w) => {
      const t = performance.now();
      prepMs += t - last; // describe, tokenizer and graph build happen before create is called
      const kind = g.outputNames.includes('attn_x')
        ? 'readout'
        : g.outputNames.includes('top_ids')
          ? 'lens'
          : 'forward';
      const s = await phase(`create ${kind}`, () => create(g, w));
      sessionMs += performance.now() - t;
      const run = s.run.bind(s);
      s.run = (feeds, fetches) => phase(`run ${kind}`, () => run(feeds, fetches));
      return s;
    };
    last = performance.now();
    const parts = modelPartsFrom(files, {
      bundled: false,
      memory: { hostBytes: totalmem() },
      weightsMode: weights as 'stored' | 'f32' | 'q8',
    });
    const model = await createModel({ ...parts, ...(readout ? { readout: readout as ReadoutMode } : {}) }, factory);
    out.readout = model.info.readout;
    // time inside weightProducts (DLA's readout products), per trace
    let wpMs = 0;
    const products = model.weightProducts.bind(model);
    model.weightProducts = async (input, signal) => {
      const t = performance.now();
      try {
        return await products(input, signal);
      } finally {
        wpMs += performance.now() - t;
      }
    };
    out.ready_ms = Math.round(performance.now() - t0);
    out.prep_ms = Math.round(prepMs);
    out.session_ms = Math.round(sessionMs);
    out.rss_ready = status('VmRSS');
    out.hwm_ready = peak();
    stage = 'trace';
    const t1 = performance.now();
    const prompt = 'The quick brown fox jumps over the lazy';
    await getOperation('trace')!.run(model, { prompt } as any);
    out.trace_ms = Math.round(performance.now() - t1);
    out.wp_ms = Math.round(wpMs);
    out.rss_trace = status('VmRSS');
    out.hwm_trace = peak();
    console.log(JSON.stringify({ mark: 'trace' })); // the parent's PSS peak to here (bench/memory.ts)
    stage = 'second trace';
    wpMs = 0;
    const t2 = performance.now();
    await getOperation('trace')!.run(model, { prompt } as any);
    out.trace2_ms = Math.round(performance.now() - t2);
    out.wp2_ms = Math.round(wpMs);
    stage = 'forward';
    const tokens = model.tokenize(prompt);
    const t3 = performance.now();
    await model.run(tokens);
    out.forward_ms = Math.round(performance.now() - t3);
    out.wasm_heap = wasmHeapBytes();
    out.phases = phases.map(([n, top, after]) => `${n}: peak ${(top / 1e9).toFixed(2)} GB; after: ${after}`);
    Object.assign(out, model.memory());
    console.log(JSON.stringify(out));
    await model.dispose();
  } catch (e) {
    const err = toLoupeError(e);
    console.log(
      JSON.stringify({ ...out, error: `${err.code} at ${stage}: ${err.message.slice(0, 160)}`, hwm: peak() }),
    );
  }
}
void main();
