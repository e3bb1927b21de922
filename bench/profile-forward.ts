/**
 * Where a forward's time goes: onnxruntime's own profiler (enableProfiling) on the bench model's
 * plain and hooked graphs at T=128, onnxruntime-node (threads = cores) — the per-op-type share of
 * the kernel time, the share of Transpose nodes (and whether any reads a weight), and how many
 * intra-op threads the profiler saw working.
 *
 * With --backend=wasm: onnxruntime-web's WASM build in Node (1 thread, as the engine's Node
 * factory makes it), the plain graph and the engine's hooked graph through `model.run` fetching
 * every hook; ORT-web's profiler prints its events on stdout on endProfiling, so they are
 * profiled in a child process whose output is read here.
 *
 *   tsx bench/profile-forward.ts [--T=128] [--runs=3] [--backend=node|wasm] [--fused=all] [--threads=N (node)]  → a markdown summary on stdout
 *
 * --fused=all: the plain graph with SkipLayerNormalization and MultiHeadAttention too (lib.ts
 * ALL_FUSED), to set beside the default (activation and norm kernels) in another run.
 */
import { readFileSync, readdirSync, rmSync, mkdtempSync } from 'node:fs';
import { tmpdir, availableParallelism } from 'node:os';
import * as path from 'node:path';
import { createRequire } from 'node:module';
import { describeModel } from '../src/engine/arch';
import { buildModelGraph, type GraphPlan } from '../src/engine/graph/build-model';
import { ALL_FUSED } from './lib';
import { loadModelFilesNode } from '../src/node/load-files-node';
import type { WeightSet } from '../src/engine/safetensors-types';
import { attentionMask } from '../src/engine/runtime/masks';
import { writeFileSync, linkSync } from 'node:fs';
import { ensureBenchModel, GPT2_SMALL, randomIds } from './model-gen';

const args = process.argv.slice(2);
const T = Number(args.find((a) => a.startsWith('--T='))?.slice(4) ?? 128);
const runs = Number(args.find((a) => a.startsWith('--runs='))?.slice(7) ?? 3);
const all = args.includes('--fused=all');
const plainFused: GraphPlan['fused'] = all ? ALL_FUSED : true;
const plainTitle = all ? 'plain graph (+ SkipLayerNormalization, MultiHeadAttention)' : 'plain graph (fused kernels)';

interface Event {
  cat: string;
  name: string;
  dur: number;
  args?: {
    op_name?: string;
    thread_scheduling_stats?: { main_thread?: unknown; sub_threads?: Record<string, unknown> };
  };
}

async function profile(kind: 'plain' | 'hooked') {
  const model = ensureBenchModel(GPT2_SMALL);
  const files = await loadModelFilesNode(model.dir);
  const weights = files.weights as WeightSet;
  const spec = describeModel({ config: files.config as Record<string, any>, tensors: weights.tensors });
  const graph = buildModelGraph(spec, weights.tensors, {
    hooks: kind === 'hooked',
    withResult: false,
    ...(kind === 'plain' ? { fused: plainFused } : {}),
  });
  const dir = mkdtempSync(path.join(tmpdir(), 'loupe-prof-'));
  const [weightFile, weightPath] = [...weights.paths][0];
  linkSync(weightPath, path.join(dir, weightFile)); // ORT refuses external data outside the graph's folder, symlinks included
  writeFileSync(path.join(dir, 'g.onnx'), graph.bytes);
  const ort = createRequire(import.meta.url)('onnxruntime-node');
  const threads = Number(args.find((a) => a.startsWith('--threads='))?.slice(10) ?? availableParallelism());
  const session = await ort.InferenceSession.create(path.join(dir, 'g.onnx'), {
    graphOptimizationLevel: 'all',
    intraOpNumThreads: threads,
    enableProfiling: true,
    profileFilePrefix: path.join(dir, 'prof'),
  });
  const ids = randomIds(T, spec.dVocab, 5);
  const feeds: Record<string, unknown> = {
    input_ids: new ort.Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, T]),
    attn_mask: new ort.Tensor('float32', attentionMask(T, 0, null), [T, T]),
    logit_positions: new ort.Tensor('int64', BigInt64Array.from(ids.map((_, t) => BigInt(t))), [T]),
  };
  if (graph.inputNames.includes('position_ids'))
    feeds.position_ids = new ort.Tensor('int64', BigInt64Array.from(ids.map((_, t) => BigInt(t))), [T]);
  for (let l = 0; l < spec.nLayers; l++)
    for (const k of ['key', 'value'])
      feeds[`past.${l}.${k}`] = new ort.Tensor('float32', new Float32Array(0), [1, spec.nKvHeads, 0, spec.dHead]);
  for (const s of graph.sites) {
    feeds[`${s}::mul`] = new ort.Tensor('float32', new Float32Array([1]), [1]);
    feeds[`${s}::add`] = new ort.Tensor('float32', new Float32Array([0]), [1]);
  }
  const fetches = graph.outputNames.filter((n) => !n.startsWith('present.'));
  await session.run(feeds, fetches);
  for (let i = 0; i < runs; i++) await session.run(feeds, fetches);
  session.endProfiling();
  await session.release();
  const file = readdirSync(dir).find((f) => f.startsWith('prof') && f.endsWith('.json'));
  if (!file) throw new Error('onnxruntime wrote no profile');
  const events = JSON.parse(readFileSync(path.join(dir, file), 'utf8')) as Event[];
  rmSync(dir, { recursive: true, force: true });
  const byType = new Map<string, number>();
  let total = 0;
  let transposeOnWeights = 0;
  const subThreads = new Set<string>();
  for (const e of events) {
    if (e.cat !== 'Node' || !e.name.endsWith('_kernel_time')) continue;
    const op = e.args?.op_name ?? '?';
    byType.set(op, (byType.get(op) ?? 0) + e.dur);
    total += e.dur;
    if (op === 'Transpose' && /w:/.test(e.name)) transposeOnWeights++;
    for (const k of Object.keys(e.args?.thread_scheduling_stats?.sub_threads ?? {})) subThreads.add(k);
  }
  const rows = [...byType.entries()].sort((a, b) => b[1] - a[1]).slice(0, 12);
  const out = [
    `#### ${kind === 'plain' ? plainTitle : 'hooked graph'}, T=${T}, onnxruntime-node ${threads} threads, ${runs + 1} runs profiled\n`,
    '| op type | share of kernel time |',
    '|---|---|',
  ];
  for (const [op, d] of rows) out.push(`| ${op} | ${((100 * d) / total).toFixed(1)} % |`);
  out.push(
    '',
    `Kernel time per run: ${(total / 1000 / (runs + 1)).toFixed(1)} ms. Transpose nodes reading a weight: ${transposeOnWeights}. Intra-op pool threads seen working: ${subThreads.size}.`,
    '',
  );
  return out.join('\n');
}

/** the kernel-time table of a list of profiler events (both runtimes write the same Chrome-trace events) */
function summarizeEvents(events: Event[], head: string, nRuns: number): string {
  const byType = new Map<string, number>();
  let total = 0;
  for (const e of events) {
    if (e.cat !== 'Node' || !e.name.endsWith('_kernel_time')) continue;
    const op = e.args?.op_name ?? '?';
    byType.set(op, (byType.get(op) ?? 0) + e.dur);
    total += e.dur;
  }
  const rows = [...byType.entries()].sort((a, b) => b[1] - a[1]).slice(0, 12);
  const out = [head, '| op type | share of kernel time |', '|---|---|'];
  for (const [op, d] of rows) out.push(`| ${op} | ${((100 * d) / total).toFixed(1)} % |`);
  out.push('', `Kernel time per run: ${(total / 1000 / nRuns).toFixed(1)} ms.`, '');
  return out.join('\n');
}

/**
 * WASM in Node, in a child process (this file with --child): every session the engine's factory
 * creates gets enableProfiling, and on endProfiling ORT-web prints the events (one JSON object a
 * line) on the process's stdout, which the parent reads, block by block after a marker line.
 */
async function profileWasmChild(): Promise<void> {
  const ortNs = await import('onnxruntime-web');
  const ort: any = (ortNs as any).default ?? ortNs;
  const create = ort.InferenceSession.create.bind(ort.InferenceSession);
  const sessions: any[] = [];
  ort.InferenceSession.create = async (m: unknown, o: Record<string, unknown>) => {
    const s = await create(m, { ...o, enableProfiling: true });
    sessions.push(s);
    return s;
  };
  const bench = ensureBenchModel(GPT2_SMALL);
  const { plainSession } = await import('./lib');
  const { loadModelNode } = await import('../src/node/load');
  const ids = randomIds(T, GPT2_SMALL.vocab, 5);
  const plain = await plainSession(bench.dir, 'wasm', 1, plainFused);
  for (let i = 0; i <= runs; i++) await plain.run(ids);
  process.stdout.write(`${MARK}${plainTitle}\n`);
  await sessions[sessions.length - 1].endProfiling();
  await plain.release();
  const before = sessions.length;
  const model = await loadModelNode(bench.dir, { backend: 'wasm', threads: 1 });
  for (let i = 0; i <= runs; i++) await model.run(ids, { hooks: 'all' });
  process.stdout.write(`${MARK}hooked graph, every hook fetched\n`);
  await sessions[before].endProfiling();
  await model.dispose();
}

const MARK = '### loupe-profile: ';

async function profileWasm(): Promise<string> {
  const { spawnSync } = await import('node:child_process');
  const { fileURLToPath } = await import('node:url');
  const r = spawnSync(process.execPath, [...process.execArgv, fileURLToPath(import.meta.url), ...args, '--child'], {
    encoding: 'utf8',
    maxBuffer: 1 << 30,
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  if (r.status !== 0) throw new Error(`profile child exited with ${r.status ?? r.signal}`);
  const out: string[] = [];
  for (const block of r.stdout.split(MARK).slice(1)) {
    const [title, ...lines] = block.split('\n');
    const events = lines
      .map((l) => l.trim().replace(/,$/, ''))
      .filter((l) => l.startsWith('{"cat"'))
      .map((l) => JSON.parse(l) as Event);
    out.push(
      summarizeEvents(
        events,
        `#### ${title}, T=${T}, onnxruntime-web WASM in Node, 1 thread, ${runs + 1} runs profiled\n`,
        runs + 1,
      ),
    );
  }
  return out.join('\n');
}

const backend = args.find((a) => a.startsWith('--backend='))?.slice(10) ?? 'node';
if (args.includes('--child')) await profileWasmChild();
else {
  const text = backend === 'wasm' ? await profileWasm() : [await profile('plain'), await profile('hooked')].join('\n');
  process.stdout.write(text + '\n');
}
