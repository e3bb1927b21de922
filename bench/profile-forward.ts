/**
 * Where a forward's time goes: onnxruntime's own profiler (enableProfiling) on the bench model's
 * plain and hooked graphs at T=128, onnxruntime-node (threads = cores) — the per-op-type share of
 * the kernel time, the share of Transpose nodes (and whether any reads a weight), and how many
 * intra-op threads the profiler saw working.
 *
 *   tsx bench/profile-forward.ts [--T=128] [--runs=3]    → a markdown summary on stdout
 */
import { readFileSync, readdirSync, rmSync, mkdtempSync } from 'node:fs';
import { tmpdir, availableParallelism } from 'node:os';
import * as path from 'node:path';
import { createRequire } from 'node:module';
import { describeModel } from '../src/engine/arch';
import { buildModelGraph } from '../src/engine/graph/build-model';
import { loadModelFilesNode } from '../src/node/load-files-node';
import type { WeightSet } from '../src/engine/safetensors-types';
import { attentionMask } from '../src/engine/runtime/masks';
import { writeFileSync, linkSync } from 'node:fs';
import { ensureBenchModel, GPT2_SMALL, randomIds } from './model-gen';

const args = process.argv.slice(2);
const T = Number(args.find((a) => a.startsWith('--T='))?.slice(4) ?? 128);
const runs = Number(args.find((a) => a.startsWith('--runs='))?.slice(7) ?? 3);

interface Event { cat: string; name: string; dur: number; args?: { op_name?: string; thread_scheduling_stats?: { main_thread?: unknown; sub_threads?: Record<string, unknown> } } }

async function profile(kind: 'plain' | 'hooked') {
  const model = ensureBenchModel(GPT2_SMALL);
  const files = await loadModelFilesNode(model.dir);
  const weights = files.weights as WeightSet;
  const spec = describeModel({ config: files.config as Record<string, any>, tensors: weights.tensors });
  const graph = buildModelGraph(spec, weights.tensors, { hooks: kind === 'hooked', withResult: false });
  const dir = mkdtempSync(path.join(tmpdir(), 'loupe-prof-'));
  const [weightFile, weightPath] = [...weights.paths][0];
  linkSync(weightPath, path.join(dir, weightFile)); // ORT refuses external data outside the graph's folder, symlinks included
  writeFileSync(path.join(dir, 'g.onnx'), graph.bytes);
  const ort = createRequire(import.meta.url)('onnxruntime-node');
  const threads = availableParallelism();
  const session = await ort.InferenceSession.create(path.join(dir, 'g.onnx'), {
    graphOptimizationLevel: 'all', intraOpNumThreads: threads, enableProfiling: true, profileFilePrefix: path.join(dir, 'prof'),
  });
  const ids = randomIds(T, spec.dVocab, 5);
  const feeds: Record<string, unknown> = {
    input_ids: new ort.Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, T]),
    attn_mask: new ort.Tensor('float32', attentionMask(T, 0, null), [T, T]),
    logit_positions: new ort.Tensor('int64', BigInt64Array.from(ids.map((_, t) => BigInt(t))), [T]),
  };
  if (graph.inputNames.includes('position_ids')) feeds.position_ids = new ort.Tensor('int64', BigInt64Array.from(ids.map((_, t) => BigInt(t))), [T]);
  for (let l = 0; l < spec.nLayers; l++) for (const k of ['key', 'value']) feeds[`past.${l}.${k}`] = new ort.Tensor('float32', new Float32Array(0), [1, spec.nKvHeads, 0, spec.dHead]);
  for (const s of graph.sites) { feeds[`${s}::mul`] = new ort.Tensor('float32', new Float32Array([1]), [1]); feeds[`${s}::add`] = new ort.Tensor('float32', new Float32Array([0]), [1]); }
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
  const out = [`#### ${kind} graph, T=${T}, onnxruntime-node ${threads} threads, ${runs + 1} runs profiled\n`, '| op type | share of kernel time |', '|---|---|'];
  for (const [op, d] of rows) out.push(`| ${op} | ${((100 * d) / total).toFixed(1)} % |`);
  out.push('', `Kernel time per run: ${(total / 1000 / (runs + 1)).toFixed(1)} ms. Transpose nodes reading a weight: ${transposeOnWeights}. Intra-op pool threads seen working: ${subThreads.size}.`, '');
  return out.join('\n');
}

const text = [await profile('plain'), await profile('hooked')].join('\n');
process.stdout.write(text + '\n');
