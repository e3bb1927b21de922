/**
 * `npm run bench:gpu -- [--shapes gpt2-small,llama-3.2-1b,llama-3.1-8b|tiny] [--backends webgpu,node] [--Ts 16,128]
 *  [--reps N] [--gen N] [--ops trace,logit_lens,attribution_patching,patch,edge_attribution,generate,attribution_graph]
 *  [--threads N] [--no-torch | --torch-json FILE] [--out FILE]`
 *
 * Loupe on a GPU against Loupe on the CPU and PyTorch on the same GPU, after ../shared/gpu-bench (the
 * reference run on an H200 at 34df48b, 2026-12-04). Per shape (random weights, bench:scale's F16
 * checkpoints; gpt2-small: the engine bench's F32 one), in one process per backend in turn: load; the forward
 * (the bench's plain graph where it runs, the hooked graph fetching nothing, every hook fetched) at each T;
 * trace, attribution_patching, generate (tokens/s) and an attribution graph (a random per-layer transcoder
 * set, bench/transcoder-gen.ts), the logit lens, activation patching (resid_pre) and edge attribution (eap); the final
 * logits' max |Δ| between the backends. Beside each time, what crossed between JS and the device in one call
 * (memory().transfers: session runs, bytes read back and written, nodes placed off the device), so a GPU run says
 * where its time goes without a profiler. `tiny` (a few-MB random Llama) runs every piece in seconds, even on
 * SwiftShader: tests/bench-gpu-smoke.test.ts runs it, bench/gpu-session.sh is the payload for a lent GPU. PyTorch eager
 * (bench/torch_gpu.py: plain, TransformerLens-style hooked with the cache on the device) runs where
 * python3 has torch with CUDA, and is skipped with the reason otherwise. Ratios printed: webgpu / node,
 * webgpu / PyTorch.
 *
 * A shape runs only where this machine can hold it: its checkpoint on disk and the backends' estimated
 * peak (budget.ts PEAK_FACTOR at the precision each runs at) in memory; the rest are skipped with the
 * reason. On a machine without a GPU the webgpu backend is SwiftShader (Vulkan on the CPU): its times
 * say nothing of a GPU's, only that the bench works.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, statfsSync, writeFileSync } from 'node:fs';
import { cpus, freemem, tmpdir, totalmem } from 'node:os';
import * as path from 'node:path';
import { loadModelNode } from '../src/node/load';
import { getOperation } from '../src/ops/index';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import { nodeDocumentCache } from '../src/node/document-cache';
import { PEAK_FACTOR } from '../src/engine/budget';
import type { LoadedModel, TransferCounts } from '../src/engine/api';
import { ensureBenchModel, GPT2_SMALL, randomIds } from './model-gen';
import { now, plainSession, timeInterleaved, ROOT, type Timed } from './lib';
import { SHAPES, generate, type Shape } from './scale';
import { generateTranscoders } from './transcoder-gen';
import { webGpuRoute } from '../src/node/webgpu-node';
import { requireOrtNode } from '../src/node/ort-node';
import type { OrtModule } from '../src/engine/runtime/ort-session';
import { mdTable, startResults, type ResultTable } from './results';

const LLAMA_8B: Shape = {
  name: 'llama-3.1-8b',
  family: 'llama',
  D: 4096,
  L: 32,
  H: 32,
  Hkv: 8,
  Dh: 128,
  M: 14336,
  V: 128256,
  tied: false,
};
/** a few-MB random Llama (untied unembedding, GQA, rotary): every piece of the bench in seconds, on SwiftShader too */
export const TINY: Shape = {
  name: 'tiny',
  family: 'llama',
  D: 64,
  L: 2,
  H: 4,
  Hkv: 2,
  Dh: 16,
  M: 128,
  V: 512,
  tied: false,
};
const ALL = [...SHAPES.filter((s) => s.name === 'gpt2-small' || s.name === 'llama-3.2-1b'), LLAMA_8B, TINY];
export const ALL_OPS = [
  'trace',
  'logit_lens',
  'attribution_patching',
  'patch',
  'edge_attribution',
  'generate',
  'attribution_graph',
];

export interface GpuBenchOptions {
  Ts: number[];
  reps: number;
  /** tokens `generate` makes */
  genN: number;
  threads: number;
  ops: string[];
  log: (m: string) => void;
  /** called with the shape's results so far after each forward and operation (a run cut short keeps them) */
  progress?: (partial: ShapeRun) => void;
  /** where the shapes and transcoders are written ($TMPDIR/loupe-bench-gpu) */
  root?: string;
}

const PROMPT = 'Once upon a time, there was a little girl who liked to play in the park with her friends';
/** an attribution graph's transcoders: features per layer, active per position, tokens */
const graphOf = (s: Shape) =>
  s === TINY ? { features: 64, l0: 4, tokens: 8 } : { features: 2048, l0: 15, tokens: 16 };

const params = (s: Shape) => {
  const layer = 2 * s.D + s.D * s.H * s.Dh * 2 + 2 * s.D * s.Hkv * s.Dh + (s.family === 'gpt2' ? 2 : 3) * s.D * s.M;
  return s.L * layer + s.V * s.D * (s.tied ? 1 : 2);
};

/** why this machine cannot run `s`, or null: its F16 checkpoint on disk, each backend's peak in memory */
function cannotHold(s: Shape, backends: string[]): string | null {
  const n = params(s);
  const disk = statfsSync(tmpdir());
  const free = disk.bavail * disk.bsize;
  if (!existsSync(shapeDir(s)) && n * 2 * 1.1 > free)
    return `its ${(n * 2e-9).toFixed(1)} GB checkpoint does not fit the ${(free / 1e9).toFixed(0)} GB free in ${tmpdir()}`;
  // node widens to float32 when that fits (precision.ts auto); webgpu keeps F16 with shader-f16, else float32
  const peak = Math.max(...backends.map((b) => n * 4 * PEAK_FACTOR[b as 'node']));
  if (peak > totalmem())
    return `its estimated peak (${(peak / 1e9).toFixed(0)} GB at float32) exceeds this machine's ${(totalmem() / 1e9).toFixed(0)} GB`;
  return null;
}

const ROOT_DIR = path.join(tmpdir(), 'loupe-bench-gpu');
const shapeDir = (s: Shape, root = ROOT_DIR) => path.join(root, s.name);

export function ensureShape(s: Shape, log: (m: string) => void, root = ROOT_DIR): string {
  if (s.name === 'gpt2-small') return ensureBenchModel(GPT2_SMALL, log).dir;
  const dir = shapeDir(s, root);
  if (!existsSync(path.join(dir, 'model.safetensors'))) {
    log(`${s.name}: writing a random F16 checkpoint (${(params(s) * 2e-9).toFixed(1)} GB) in ${dir}`);
    mkdirSync(dir, { recursive: true });
    generate(s, dir);
  }
  return dir;
}

function ensureTranscoders(s: Shape, root = ROOT_DIR): string {
  const g = graphOf(s);
  const dir = path.join(root, `${s.name}-plt-${g.features}`);
  if (!existsSync(path.join(dir, 'config.yaml')))
    generateTranscoders({ nLayers: s.L, dModel: s.D, features: g.features, l0: g.l0 }, dir);
  return dir;
}

/** what crossed between JS and the device in one call (memory().transfers' difference); off-device nodes: after it */
export interface OpTransfers {
  runs: number;
  read_bytes: number;
  written_bytes: number;
  device_feeds: number;
  device_outputs: number;
  off_device_nodes?: number;
}

function diff(a: TransferCounts | undefined, b: TransferCounts | undefined): OpTransfers | undefined {
  if (!a || !b) return undefined;
  return {
    runs: b.runs - a.runs,
    read_bytes: b.read_bytes - a.read_bytes,
    written_bytes: b.written_bytes - a.written_bytes,
    device_feeds: b.device_feeds - a.device_feeds,
    device_outputs: b.device_outputs - a.device_outputs,
    ...(b.off_device_nodes !== undefined ? { off_device_nodes: b.off_device_nodes } : {}),
  };
}

/** one call's transfers, then its median time over n more (the first call warms what it builds) */
async function timeMedian(
  model: LoadedModel,
  fn: () => Promise<unknown>,
  n: number,
): Promise<{ ms: number; transfers?: OpTransfers; out: unknown }> {
  const before = model.memory().transfers;
  const out = await fn();
  const transfers = diff(before, model.memory().transfers);
  const xs: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = now();
    await fn();
    xs.push(now() - t);
  }
  return { ms: xs.sort((a, b) => a - b)[Math.floor(n / 2)], transfers, out };
}

/** '3 runs · 1.2 MB read · 40 kB written · 2 off-device nodes' */
export function transfersLine(t?: OpTransfers): string {
  if (!t) return '–';
  const b = (x: number) =>
    x >= 1e6 ? `${(x / 1e6).toFixed(1)} MB` : x >= 1e3 ? `${(x / 1e3).toFixed(1)} kB` : `${x} B`;
  return (
    `${t.runs} runs · ${b(t.read_bytes)} read · ${b(t.written_bytes)} written` +
    (t.off_device_nodes !== undefined ? ` · ${t.off_device_nodes} off-device nodes in the live sessions` : '')
  );
}

export interface BackendRun {
  load_ms?: number;
  weights?: string;
  plain_error?: string;
  forward: Record<number, Record<string, Timed>>;
  /** one forward's transfers: nothing fetched, every hook */
  forward_transfers: Record<number, Record<string, OpTransfers | undefined>>;
  ops: Record<string, number | string>;
  op_transfers: Record<string, OpTransfers | undefined>;
  gen_tok_s?: number;
  error?: string;
}

export async function runBackend(
  s: Shape,
  dir: string,
  backend: 'webgpu' | 'node',
  logits: Map<string, Float32Array>,
  o: GpuBenchOptions,
  r: BackendRun = { forward: {}, forward_transfers: {}, ops: {}, op_transfers: {} },
  progress: () => void = () => undefined,
): Promise<BackendRun> {
  const { log } = o;
  let model: LoadedModel | undefined;
  try {
    const t0 = now();
    model = await loadModelNode(dir, { backend, threads: backend === 'node' ? o.threads : undefined });
    r.load_ms = Math.round(now() - t0);
    r.weights = model.info.weights;
    log(`${s.name} ${backend}: loaded in ${r.load_ms} ms at ${r.weights}`);
    let plain: Awaited<ReturnType<typeof plainSession>> | undefined = await plainSession(
      dir,
      backend as 'node',
      backend === 'node' ? o.threads : undefined,
    );
    try {
      await plain.run(randomIds(4, 100, 1));
    } catch (e) {
      r.plain_error = (e as Error).message.split('\n')[0];
      await plain.release();
      plain = undefined;
    }
    const V = model.info.d_vocab;
    const m = model;
    for (const T of o.Ts) {
      const ids = randomIds(T, Math.min(V, 500), 1000 + T);
      const lg = (await m.run(ids, { hooks: 'all' })).logits.data as Float32Array;
      logits.set(`${backend}:${T}`, lg.slice(lg.length - V));
      const p = plain;
      const one = async (fn: () => Promise<unknown>) => {
        const before = m.memory().transfers;
        await fn();
        return diff(before, m.memory().transfers);
      };
      r.forward_transfers[T] = {
        hooked_none: await one(() => m.run(ids, { hooks: [] })),
        hooked_all: await one(() => m.run(ids, { hooks: 'all' })),
      };
      r.forward[T] = await timeInterleaved(
        [
          ...(p ? [{ name: 'plain', fn: () => p.run(ids) }] : []),
          { name: 'hooked_none', fn: () => m.run(ids, { hooks: [] }) },
          { name: 'hooked_all', fn: () => m.run(ids, { hooks: 'all' }) },
        ],
        1,
        T > 64 ? Math.max(3, Math.ceil(o.reps / 2)) : o.reps,
      );
      const f = r.forward[T],
        ft = r.forward_transfers[T];
      log(
        `${s.name} ${backend} T=${T}: plain ${f.plain?.median_ms ?? '–'} · nothing fetched ${f.hooked_none.median_ms} ` +
          `(${transfersLine(ft.hooked_none)}) · every hook ${f.hooked_all.median_ms} ms (${transfersLine(ft.hooked_all)})`,
      );
      progress();
    }
    await plain?.release();
    const sae = createNodeSaeLoaders();
    const ctx = {
      documents: nodeDocumentCache(),
      loadSae: sae.loadSae,
      loadSaeFile: sae.loadSaeFile,
      loadTranscoders: sae.loadTranscoders,
    };
    const g = graphOf(s);
    const pair = (T: number, seed: number) => ({
      prompt: '',
      token_ids: randomIds(T, 400, seed),
      corrupted_token_ids: randomIds(T, 400, seed + 1),
      answer: '#5',
      counterfactual: '#7',
    });
    const inputs: Record<string, () => Record<string, unknown>> = {
      trace: () => ({ prompt: PROMPT }),
      logit_lens: () => ({ prompt: PROMPT }),
      attribution_patching: () => ({ ...pair(24, 5), validate_scope: 'top', validate: 0 }),
      // one forward per layer and position: a short prompt, the residual stream only
      patch: () => ({ ...pair(8, 11), scans: ['resid_pre'] }),
      edge_attribution: () => ({
        dataset: [0, 1].map((i) => ({
          clean_token_ids: randomIds(12, 400, 20 + 2 * i),
          corrupted_token_ids: randomIds(12, 400, 21 + 2 * i),
          answer: '#5',
          counterfactual: '#7',
        })),
        method: 'eap',
      }),
      generate: () => ({ prompt: PROMPT, max_new_tokens: o.genN }),
      attribution_graph: () => ({
        prompt: '',
        token_ids: randomIds(g.tokens, 400, 9),
        transcoder_source: ensureTranscoders(s, o.root),
      }),
    };
    for (const name of o.ops) {
      try {
        const op = getOperation(name);
        if (!op || !inputs[name]) throw new Error(`unknown operation '${name}' (${ALL_OPS.join(', ')})`);
        const t = await timeMedian(m, () => op.run(m, inputs[name]() as any, ctx as any), 1);
        r.ops[name] = Math.round(t.ms);
        r.op_transfers[name] = t.transfers;
        if (name === 'generate') r.gen_tok_s = o.genN / (t.ms / 1000);
        log(`${s.name} ${backend} ${name}: ${r.ops[name]} ms (${transfersLine(t.transfers)})`);
      } catch (e) {
        r.ops[name] = `error: ${(e as Error).message.split('\n')[0].slice(0, 160)}`;
        log(`${s.name} ${backend} ${name}: ${r.ops[name]}`);
      }
      progress();
    }
  } catch (e) {
    r.error = (e as Error).message.split('\n')[0];
    log(`${s.name} ${backend}: ${r.error}`);
  } finally {
    await model?.dispose();
  }
  return r;
}

/** one shape on each backend in turn, and the final logits' max |Δ| between webgpu and node per T */
export interface ShapeRun {
  backends: Record<string, BackendRun>;
  agreement_final_logits_maxabs: Record<number, number>;
  free_memory_after?: number;
}

export async function runShape(s: Shape, backends: ('webgpu' | 'node')[], o: GpuBenchOptions): Promise<ShapeRun> {
  const dir = ensureShape(s, o.log, o.root);
  const logits = new Map<string, Float32Array>();
  const run: ShapeRun = { backends: {}, agreement_final_logits_maxabs: {} };
  const agree = () => {
    for (const T of o.Ts) {
      const a = logits.get(`webgpu:${T}`),
        b = logits.get(`node:${T}`);
      if (a && b) run.agreement_final_logits_maxabs[T] = a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i])), 0);
    }
    o.progress?.(run);
  };
  for (const b of backends) {
    const r: BackendRun = { forward: {}, forward_transfers: {}, ops: {}, op_transfers: {} };
    run.backends[b] = r;
    await runBackend(s, dir, b, logits, o, r, agree);
  }
  agree();
  run.free_memory_after = freemem();
  return run;
}
/** PyTorch eager on this machine's GPU (bench/torch_gpu.py), or why not */
function torchRuns(
  names: string[],
  Ts: number[],
  argv: string[],
): { runs?: Record<string, any>; gpu?: string; skipped?: string } {
  names = names.filter((n) => n !== TINY.name);
  if (!names.length) return { skipped: 'no shape PyTorch has (bench/torch_gpu.py)' };
  if (argv.includes('--no-torch')) return { skipped: 'asked not to (--no-torch)' };
  // --torch-json FILE: bench/torch_gpu.py's output from an earlier step (bench/gpu-session.sh runs it first, bounded)
  const j = argv.indexOf('--torch-json');
  if (j >= 0) {
    try {
      const t = JSON.parse(readFileSync(argv[j + 1], 'utf8'));
      return { runs: t.runs, gpu: t.gpu };
    } catch (e) {
      return { skipped: `--torch-json ${argv[j + 1]}: ${(e as Error).message.split('\n')[0]}` };
    }
  }
  const probe = spawnSync('python3', ['-c', 'import torch,sys; print(torch.__version__, torch.cuda.is_available())'], {
    encoding: 'utf8',
  });
  if (probe.status !== 0)
    return {
      skipped: `python3 has no torch (${(probe.stderr || probe.error?.message || '').trim().split('\n').pop()})`,
    };
  const [version, cuda] = probe.stdout.trim().split(' ');
  if (cuda !== 'True') return { skipped: `torch ${version} sees no CUDA device` };
  const r = spawnSync(
    'python3',
    [path.join(ROOT, 'bench', 'torch_gpu.py'), '--device', 'cuda', '--shapes', names.join(','), '--T', Ts.join(',')],
    { encoding: 'utf8', maxBuffer: 64 << 20, stdio: ['ignore', 'pipe', 'inherit'] },
  );
  if (r.status !== 0) return { skipped: `bench/torch_gpu.py failed (exit ${r.status})` };
  const out = JSON.parse(r.stdout);
  return { runs: out.runs, gpu: out.gpu };
}

/** the one run on a real GPU so far: ../shared/gpu-bench/README.md (2026-12-04, main at 34df48b), its tables as recorded there */
const REFERENCE_H200 = [
  'The latest table from a real GPU is the reference run of ../shared/gpu-bench (2026-12-04, main at 34df48b, an NVIDIA ' +
    'H200 with driver 580, Vulkan through Dawn; 16 CPU threads; ms, medians, batch 1, random weights), as its README ' +
    'records it:',
  mdTable({
    head: [
      'forward, every hook fetched (ms)',
      'gpt2-small T16',
      'T128',
      'llama-3.2-1b T16',
      'T128',
      'llama-3.1-8b T16',
      'T128',
    ],
    rows: [
      ['Loupe webgpu (Dawn, Vulkan, H200)', '171', '415', '454', '627', '1,323', '2,046'],
      ['Loupe node (16 CPU threads, same machine)', '23.8', '119', '121', '564', '–', '–'],
      ['PyTorch 2.11 eager CUDA, hooks kept on device (fp32; 8B fp16)', '6.5', '5.0', '7.8', '10.1', '14.8', '15.1'],
      ['PyTorch 2.11 eager CUDA, hooks copied to host (naive)', '10.2', '79', '34', '217', '70', '332'],
    ],
  }),
  mdTable({
    head: ['', 'gpt2-small', 'llama-3.2-1b', 'llama-3.1-8b'],
    rows: [
      ['webgpu: plain / hooked, nothing fetched (T16, ms)', '10–23 / 70–105', '– / 212', '– / 1,051'],
      ['webgpu: trace (ms)', '279', '1,894', '10,266'],
      ['node (16 threads): trace (ms)', '55', '212', '–'],
      ['webgpu: generate (tokens/s)', '6.5', '5.1', '1.0'],
      ['node (16 threads): generate (tokens/s)', '63', '13', '–'],
    ],
  }),
  'The 8B shape then ran with LOUPE_WEBGPU_BUFFER_BYTES set (its buffers were judged against 128 MiB; the load ' +
    'decision now probes the adapter instead: src/engine/plan.ts). No newer GPU table: no GPU was lent to the session ' +
    'that wrote this bench (issue 38), so its own runs so far are on SwiftShader (Vulkan on the CPU) and the CPU, which ' +
    'show that it works and nothing of GPU speed.',
];

const f1 = (x: number | undefined) =>
  x === undefined || !Number.isFinite(x) ? '–' : x < 1 ? x.toPrecision(2) : x.toFixed(1);
const ratio = (a: number | undefined, b: number | undefined) =>
  a === undefined || b === undefined || !Number.isFinite(a / b) ? '–' : `${(a / b).toFixed(2)}×`;

async function main() {
  const argv = process.argv.slice(2);
  const opt = (k: string, d: string) => {
    const i = argv.indexOf(`--${k}`);
    return i >= 0 ? argv[i + 1] : d;
  };
  const log = (m: string) => process.stderr.write(`[bench:gpu ${new Date().toISOString().slice(11, 19)}] ${m}\n`);
  const shapes = opt(
    'shapes',
    ALL.filter((s) => s !== TINY)
      .map((s) => s.name)
      .join(','),
  ).split(',');
  const backends = opt('backends', 'webgpu,node').split(',') as ('webgpu' | 'node')[];
  const o: GpuBenchOptions = {
    Ts: opt('Ts', '16,128').split(',').map(Number),
    reps: Number(opt('reps', '9')),
    genN: Number(opt('gen', '32')),
    threads: Number(opt('threads', String(cpus().length))),
    ops: opt('ops', ALL_OPS.join(',')).split(','),
    log,
  };
  const { Ts, ops } = o;
  const results: Record<string, any> = {};
  // --out: the raw results so far, rewritten after each forward and operation (not part of the results' name)
  const out = opt('out', '');
  if (out) process.argv.splice(process.argv.indexOf('--out'), 2);
  const dump = (torch?: unknown) =>
    out && writeFileSync(out, JSON.stringify({ date: new Date().toISOString(), argv, results, torch }, null, 1));
  const record = startResults('gpu', 'Loupe on a GPU: webgpu vs node vs PyTorch (`npm run bench:gpu`)');
  const notes: string[] = [];
  const run: Shape[] = [];
  for (const name of shapes) {
    const s = ALL.find((x) => x.name === name);
    if (!s) throw new Error(`unknown shape '${name}' (${ALL.map((x) => x.name).join(', ')})`);
    const why = cannotHold(s, backends);
    if (why) {
      notes.push(`${name} skipped: ${why}.`);
      log(`${name}: skipped: ${why}`);
    } else run.push(s);
  }
  for (const s of run)
    results[s.name] = await runShape(s, backends, {
      ...o,
      progress: (partial) => {
        results[s.name] = partial;
        dump();
      },
    });
  const torch = run.length
    ? torchRuns(
        run.map((s) => s.name),
        Ts,
        argv,
      )
    : { skipped: 'no shape ran' };
  if (torch.skipped) {
    notes.push(`PyTorch skipped: ${torch.skipped}.`);
    log(`PyTorch skipped: ${torch.skipped}`);
  }
  const tdt = (name: string) => (name === 'llama-3.1-8b' ? 'float16' : 'float32');
  const forward: ResultTable = {
    head: [
      'shape',
      'T',
      'webgpu plain / nothing / every hook (ms)',
      'node plain / nothing / every hook (ms)',
      'PyTorch plain / hooked (ms)',
      'webgpu ÷ node, every hook',
      'webgpu ÷ PyTorch, hooked',
      'webgpu ÷ PyTorch, plain',
      '|Δ| logits',
    ],
    rows: [],
  };
  for (const s of run) {
    const per = results[s.name].backends as Record<string, BackendRun>;
    for (const T of Ts) {
      const w = per.webgpu?.forward[T],
        n = per.node?.forward[T];
      const t = torch.runs?.[`${s.name}/${tdt(s.name)}`]?.[String(T)];
      const trio = (f?: Record<string, Timed>) =>
        f ? `${f1(f.plain?.median_ms)} / ${f1(f.hooked_none?.median_ms)} / ${f1(f.hooked_all?.median_ms)}` : '–';
      forward.rows.push([
        s.name,
        String(T),
        trio(w),
        trio(n),
        t ? `${f1(t.plain.median_ms)} / ${f1(t.hooked.median_ms)}` : '–',
        ratio(w?.hooked_all.median_ms, n?.hooked_all.median_ms),
        ratio(w?.hooked_all.median_ms, t?.hooked.median_ms),
        ratio(w?.plain?.median_ms, t?.plain.median_ms),
        results[s.name].agreement_final_logits_maxabs[T]?.toExponential(1) ?? '–',
      ]);
    }
  }
  const opsTable: ResultTable = {
    head: [
      'shape',
      'backend',
      'weights',
      'load (ms)',
      ...ops.map((o) => (o === 'generate' ? 'generate (tok/s)' : `${o} (ms)`)),
    ],
    rows: [],
  };
  for (const s of run)
    for (const b of backends) {
      const r = (results[s.name].backends as Record<string, BackendRun>)[b];
      opsTable.rows.push([
        s.name,
        b,
        r.weights ?? r.error ?? '–',
        String(r.load_ms ?? '–'),
        ...ops.map((o) => (o === 'generate' ? f1(r.gen_tok_s) : String(r.ops[o] ?? '–'))),
      ]);
    }
  const transfersTable: ResultTable = {
    head: [
      'shape',
      'backend',
      'what',
      'ms',
      'in one call: session runs · bytes read back · written · off-device nodes',
    ],
    rows: [],
  };
  for (const s of run)
    for (const b of backends) {
      const r = (results[s.name].backends as Record<string, BackendRun>)[b];
      for (const T of Ts)
        for (const k of ['hooked_none', 'hooked_all'])
          if (r.forward[T]?.[k])
            transfersTable.rows.push([
              s.name,
              b,
              `forward T=${T}, ${k === 'hooked_none' ? 'nothing fetched' : 'every hook'}`,
              f1(r.forward[T][k].median_ms),
              transfersLine(r.forward_transfers[T]?.[k]),
            ]);
      for (const op of ops)
        transfersTable.rows.push([s.name, b, op, String(r.ops[op] ?? '–'), transfersLine(r.op_transfers[op])]);
    }
  // a run with no GPU (SwiftShader or no webgpu, and no CUDA for PyTorch) carries the latest GPU table and why there is no newer
  const route = backends.includes('webgpu') ? await webGpuRoute(requireOrtNode<OrtModule>()) : undefined;
  if (route?.vulkan.drivers === 'swiftshader')
    notes.push("webgpu ran on SwiftShader (Vulkan on the CPU): its times say nothing of a GPU's.");
  if (!torch.runs && (!route || route.vulkan.drivers === 'swiftshader')) notes.push(...REFERENCE_H200);
  process.stdout.write(mdTable(forward) + '\n' + mdTable(opsTable) + '\n' + mdTable(transfersTable));
  for (const n of notes) process.stdout.write(`${n}\n`);
  dump(torch);
  // a run of the tiny shape alone measures nothing worth keeping: it is not recorded in bench/results or the docs
  if (run.some((s) => s !== TINY)) record.save([forward, opsTable, transfersTable], notes, { results, torch });
  setTimeout(() => process.exit(0), 100).unref();
}

// run as a script (npm run bench:gpu), not when a test imports runShape
if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(new URL(import.meta.url).pathname)) void main();
