/**
 * One bench measurement in a fresh process (forked by engine.bench.ts with the same tsx loader):
 *   child.ts speed     {dir, backend, threads, Ts, warmup, reps}
 *   child.ts memory    {dir, backend, threads, T, graph: 'hooked' | 'plain'}
 *   child.ts extension {dir, name, threads, weightBytes}
 * The result goes back to the parent over the IPC channel ({ok, result} or {ok: false, error}).
 */
import { loadModelNode } from '../src/node/load';
import { buildModelGraph } from '../src/engine/graph/build-model';
import { extensions, SkipExtension, type ExtContext } from './extensions';
import { now, packageVersion, plainSession, ALL_FUSED, readMem, timeInterleaved, type Timed } from './lib';
import { randomIds } from './model-gen';

export interface SpeedArgs {
  dir: string;
  backend: 'node' | 'wasm';
  threads: number;
  Ts: number[];
  warmup: number;
  /** timed runs per T */
  reps: Record<string, number>;
}

export interface SpeedResult {
  backend: 'node' | 'wasm';
  threads: number;
  ort_version: string;
  session: {
    /** loading the bundled tiny model first: runtime initialisation (WASM compile, native binding) */
    runtime_init_ms: number;
    /** buildModelGraph({hooks: false}) + session creation */
    plain_ms: number;
    plain_graph_build_ms: number;
    plain_graph_kb: number;
    /** loadModelNode: headers, tokenizer, buildModelGraph({hooks: true}) and session creation */
    hooked_load_ms: number;
    hooked_graph_build_ms: number;
    hooked_graph_kb: number;
  };
  n_hook_outputs: number;
  n_intervention_inputs: number;
  /**
   * per T: plain graph (fused activation and norm kernels, the default), the plain graph with
   * SkipLayerNormalization and MultiHeadAttention too (ALL_FUSED), the plain graph decomposed
   * (fused: false), hooked graph
   * fetching no hooks, hooked graph fetching every hook, and the observe-only variant (a lean
   * variant with every hook an output and no intervention inputs: `hooks: 'all', lean: true`)
   */
  runs: Record<
    string,
    {
      plain: Timed;
      plain_all?: Timed;
      plain_unfused?: Timed;
      hooked_none: Timed;
      hooked_all: Timed;
      hooked_observe?: Timed;
    }
  >;
  /** max |Δ| between the plain graph's logits and the hooked graph's (same tokens), per T */
  logits_max_abs_diff: Record<string, number>;
}

async function speed(a: SpeedArgs): Promise<SpeedResult> {
  // initialise the runtime first (native binding / WASM compile) with the bundled tiny model, so
  // that neither timed session creation below pays for it
  const t00 = now();
  const tiny = await loadModelNode('default', { backend: a.backend, threads: a.threads });
  const runtimeInitMs = now() - t00;
  await tiny.dispose();
  const plain = await plainSession(a.dir, a.backend, a.threads);
  const plainAll = await plainSession(a.dir, a.backend, a.threads, ALL_FUSED);
  const plainUnfused = await plainSession(a.dir, a.backend, a.threads, false);
  const t0 = now();
  const model = await loadModelNode(a.dir, { backend: a.backend, threads: a.threads });
  const hookedLoadMs = now() - t0;
  const t1 = now();
  const hookedGraph = buildModelGraph(model.spec, plain.tensors, { hooks: true, withResult: false });
  const hookedBuildMs = now() - t1;
  const hookNames = model.hookNames();
  const V = model.info.d_vocab;
  const runs: SpeedResult['runs'] = {};
  const diffs: Record<string, number> = {};
  for (const T of a.Ts) {
    const ids = randomIds(T, V, 1000 + T);
    // correctness guard: the three configurations compute the same logits
    const p = (await plain.run(ids)).logits.data as Float32Array;
    const h = (await model.run(ids, { hooks: 'all' })).logits.data;
    let d = 0;
    for (let i = 0; i < p.length; i++) d = Math.max(d, Math.abs(p[i] - h[i]));
    diffs[String(T)] = d;
    const r = await timeInterleaved(
      [
        { name: 'plain', fn: () => plain.run(ids) },
        { name: 'plain_all', fn: () => plainAll.run(ids) },
        { name: 'plain_unfused', fn: () => plainUnfused.run(ids) },
        { name: 'hooked_none', fn: () => model.run(ids, { hooks: [] }) },
        { name: 'hooked_all', fn: () => model.run(ids, { hooks: 'all' }) },
        { name: 'hooked_observe', fn: () => model.run(ids, { hooks: 'all', lean: true }) },
      ],
      a.warmup,
      a.reps[String(T)] ?? 5,
      { settle: a.backend === 'node' },
    );
    runs[String(T)] = {
      plain: r.plain,
      plain_all: r.plain_all,
      plain_unfused: r.plain_unfused,
      hooked_none: r.hooked_none,
      hooked_all: r.hooked_all,
      hooked_observe: r.hooked_observe,
    };
    const f = (x: { median_ms: number; cpu_median_ms: number }) =>
      `${x.median_ms.toFixed(1)} ms (cpu ${x.cpu_median_ms.toFixed(1)})`;
    process.stderr.write(
      `  [${a.backend}] T=${T}: plain ${f(r.plain)}, plain + Skip/MHA ${f(r.plain_all)}, plain unfused ${f(r.plain_unfused)}, hooked/none ${f(r.hooked_none)}, hooked/all ${f(r.hooked_all)}, observe-only/all ${f(r.hooked_observe)}\n`,
    );
  }
  const res: SpeedResult = {
    backend: a.backend,
    threads: a.threads,
    ort_version: packageVersion(a.backend === 'node' ? 'onnxruntime-node' : 'onnxruntime-web'),
    session: {
      runtime_init_ms: runtimeInitMs,
      plain_ms: plain.createMs,
      plain_graph_build_ms: plain.buildMs,
      plain_graph_kb: plain.graph.bytes.byteLength / 1024,
      hooked_load_ms: hookedLoadMs,
      hooked_graph_build_ms: hookedBuildMs,
      hooked_graph_kb: hookedGraph.bytes.byteLength / 1024,
    },
    n_hook_outputs: hookNames.length,
    n_intervention_inputs: hookedGraph.sites.length * 2,
    runs,
    logits_max_abs_diff: diffs,
  };
  await plain.release();
  await plainAll.release();
  await plainUnfused.release();
  await model.dispose();
  return res;
}

export interface MemoryArgs {
  dir: string;
  backend: 'node' | 'wasm';
  threads: number;
  T: number;
  graph: 'hooked' | 'plain';
}

export interface MemoryResult {
  backend: 'node' | 'wasm';
  graph: 'hooked' | 'plain';
  T: number;
  /** before anything is loaded (node + tsx + the engine's modules) */
  baseline: ReturnType<typeof readMem>;
  after_load: ReturnType<typeof readMem>;
  after_run: ReturnType<typeof readMem>;
  /** peak resident set size of the process over its whole life, bytes */
  peak_rss: number;
  /** bytes of the outputs the run returned (every hook + logits, or logits only) */
  output_bytes: number;
}

async function memory(a: MemoryArgs): Promise<MemoryResult> {
  await import('../src/engine/graph/build-model'); // count the engine's own code in the baseline
  const baseline = readMem();
  const ids = randomIds(a.T, 50257, 7);
  let afterLoad: ReturnType<typeof readMem>;
  let outputBytes = 0;
  if (a.graph === 'hooked') {
    const model = await loadModelNode(a.dir, { backend: a.backend, threads: a.threads });
    afterLoad = readMem();
    const r = await model.run(ids, { hooks: 'all' });
    if (Object.keys(r.hooks).length === 0) throw new Error('no hooks came back');
    outputBytes = r.logits.data.byteLength + Object.values(r.hooks).reduce((n, t) => n + t.data.byteLength, 0);
  } else {
    const s = await plainSession(a.dir, a.backend, a.threads);
    afterLoad = readMem();
    const r = await s.run(ids);
    outputBytes = (r.logits.data as Float32Array).byteLength;
  }
  const afterRun = readMem();
  return {
    backend: a.backend,
    graph: a.graph,
    T: a.T,
    baseline,
    after_load: afterLoad,
    after_run: afterRun,
    peak_rss: Math.max(afterRun.max_rss, afterRun.vm_hwm ?? 0),
    output_bytes: outputBytes,
  };
}

export interface ExtensionArgs {
  dir: string;
  name: string;
  threads: number;
  weightBytes: number;
}

async function extension(a: ExtensionArgs) {
  const ext = extensions.find((e) => e.name === a.name);
  if (!ext) throw new Error(`no bench extension '${a.name}'`);
  const ctx: ExtContext = {
    modelDir: a.dir,
    threads: a.threads,
    weightBytes: a.weightBytes,
    log: (m) => process.stderr.write(`  [${a.name}] ${m}\n`),
    loadModel: () => loadModelNode(a.dir, { backend: 'node', threads: a.threads }),
  };
  try {
    return await ext.run(ctx);
  } catch (e) {
    if (e instanceof SkipExtension) return { skipped: e.message };
    throw e;
  }
}

const TASKS: Record<string, (args: any) => Promise<unknown>> = { speed, memory, extension };

async function main() {
  const [task, json] = process.argv.slice(2);
  const fn = TASKS[task];
  try {
    if (!fn) throw new Error(`unknown task ${task}`);
    const result = await fn(JSON.parse(json ?? '{}'));
    if (process.send) process.send({ ok: true, result });
    else console.log(JSON.stringify(result, null, 2));
  } catch (e) {
    const err = e as Error;
    if (process.send) process.send({ ok: false, error: `${err.message}\n${err.stack ?? ''}` });
    else console.error(err);
    process.exitCode = 1;
  }
  // ORT-web keeps no handles open, but do not wait on anything left behind
  setTimeout(() => process.exit(process.exitCode ?? 0), 50).unref();
}

void main();
