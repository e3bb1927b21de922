/**
 * `npm run bench`: the engine on a GPT-2-small-shaped model with random weights.
 *
 *  1. speed: plain graph (logits only) vs hooked graph fetching no hooks vs fetching every hook,
 *     T = 16 and 128, batch 1, onnxruntime-node vs onnxruntime-web WASM in Node; session creation.
 *  2. memory: peak RSS of load + one all-hooks run at T = 128, per backend, vs the weight bytes.
 *  2b. torch: bench/torch_anchor.py (when python3 has torch), the same shape in PyTorch with every
 *     hook kept, torch × OpenBLAS threads 1×2, 2×1, 1×1, OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset in
 *     its process only; the report prints Loupe / PyTorch beside the forward table.
 *  2c. page: onnxruntime-web WASM in Chromium (bench/page-wasm.ts), all hooks, 1 thread vs every core.
 *  3. operations: the measurements listed in bench/extensions.ts (per-operation cost, circuit, generation, …).
 *
 * Every measurement runs in its own fresh child process (bench/child.ts), so configurations do
 * not pollute each other's memory or JIT state. Prints markdown tables and writes the same numbers
 * to bench/results/latest.json, then docs/BENCHMARKS.md and the README's current table from it.
 *
 * Options (for working on the bench itself; the full run is the default):
 *   --quick           1 warm-up + 2 timed runs, no extensions (numbers NOT comparable to targets)
 *   --only=speed,torch,page,memory,extensions
 *   --ext=ops,circuit  only these extensions (names as in bench/extensions.ts)
 *   --backends=node   speed: only these backends (default node,wasm)
 *   --out=FILE        write the JSON there instead of bench/results/latest.json
 */
import { fork, spawnSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { MemoryArgs, MemoryResult, SpeedArgs, SpeedResult, ExtensionArgs } from './child';
import { extensions, type ExtResult } from './extensions';
import { median, packageVersion } from './lib';
import { ensureBenchModel, GPT2_SMALL } from './model-gen';
import { render, summarizeTargets, type BenchResults } from './report';
import { writeBenchmarksDoc } from './benchmarks-doc';
import { useScratchCacheDir } from '../tests/helpers/scratch-cache';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const CHILD = path.join(HERE, 'child.ts');
const CHILD_TIMEOUT_MS = 300_000;

const args = process.argv.slice(2);
const quick = args.includes('--quick');
const outArg = args.find((a) => a.startsWith('--out='))?.slice(6);
const extOnly = args
  .find((a) => a.startsWith('--ext='))
  ?.slice(6)
  .split(',');
const speedBackends = (args.find((a) => a.startsWith('--backends='))?.slice(11) ?? 'node,wasm').split(',');
const only = new Set(
  (args.find((a) => a.startsWith('--only='))?.slice(7) ?? 'speed,torch,page,memory,extensions').split(','),
);

const log = (m: string) => process.stderr.write(`${m}\n`);

/** run one task in a fresh child process (same tsx loader as this one) and return its result */
function inChild<T>(task: string, taskArgs: unknown, timeoutMs = CHILD_TIMEOUT_MS): Promise<T> {
  return new Promise((resolve, reject) => {
    const child = fork(CHILD, [task, JSON.stringify(taskArgs)], {
      execArgv: process.execArgv,
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    let settled = false;
    const timer = setTimeout(() => {
      if (settled) return;
      settled = true;
      child.kill('SIGKILL');
      reject(new Error(`${task} did not finish within ${timeoutMs / 1000} s`));
    }, timeoutMs);
    child.on('message', (m: any) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (m.ok) resolve(m.result as T);
      else reject(new Error(m.error));
    });
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      if (settled) return;
      settled = true;
      reject(new Error(`${task} exited with ${code ?? signal} before reporting`));
    });
  });
}

async function main() {
  // the bench's generated models are temporary, so is what Loupe caches for them (optimized
  // sessions, documents): a scratch LOUPE_CACHE_DIR, shared by its child processes, removed at exit
  if (!process.env.LOUPE_CACHE_DIR) process.on('exit', useScratchCacheDir());
  const t0 = performance.now();
  const cores = os.availableParallelism();
  const nodeThreads = cores;
  const load0 = os.loadavg();
  log(
    `Loupe engine bench${quick ? ' (--quick: NOT for comparison with the targets)' : ''} — ${cores} cores, load average ${load0.map((x) => x.toFixed(2)).join(' ')}`,
  );
  const model = ensureBenchModel(GPT2_SMALL, log);
  log(
    `model: ${model.dir} (${(model.nParams / 1e6).toFixed(1)}M params, ${(model.weightBytes / 2 ** 20).toFixed(1)} MiB of F32 weights${model.generated ? `, generated in ${(model.generateMs / 1000).toFixed(1)} s` : ', cached'})`,
  );

  const warmup = quick ? 1 : 3;
  // at least 5 timed runs; more at T=16 where a run is short and the spread on a shared machine large
  const reps: Record<string, number> = quick ? { 16: 2, 128: 2 } : { 16: 9, 128: 5 };
  const Ts = [16, 128];
  const results: BenchResults = {
    schema: 'loupe-bench/1',
    date: new Date().toISOString(),
    quick,
    machine: {
      cores,
      cpu: os.cpus()[0]?.model ?? 'unknown',
      total_memory_bytes: os.totalmem(),
      platform: `${os.platform()} ${os.release()} ${os.arch()}`,
      node: process.version,
      onnxruntime_node: packageVersion('onnxruntime-node'),
      onnxruntime_web: packageVersion('onnxruntime-web'),
      load_average_start: load0,
      load_average_end: [],
    },
    model: {
      dir: model.dir,
      shape: model.shape,
      n_params: model.nParams,
      weight_bytes: model.weightBytes,
      dtype: 'F32',
    },
    method: {
      warmup_runs: warmup,
      timed_runs: reps,
      statistic:
        'median wall-clock ms (min and median process CPU ms kept too); plain / hooked-none / hooked-all interleaved run by run, order rotated each round; node: an untimed settle run of the same configuration before each timed run',
      node_threads: nodeThreads,
      wasm_threads: 1,
    },
    speed: {},
    memory: [],
    extensions: {},
    total_s: 0,
  };

  if (only.has('speed')) {
    for (const backend of (['node', 'wasm'] as const).filter((b) => speedBackends.includes(b))) {
      log(`speed: ${backend} …`);
      const a: SpeedArgs = { dir: model.dir, backend, threads: backend === 'node' ? nodeThreads : 1, Ts, warmup, reps };
      try {
        // WASM at T=128 on a loaded 2-core machine takes seconds a run: allow the whole configuration 20 minutes
        results.speed[backend] = await inChild<SpeedResult>('speed', a, 1_200_000);
      } catch (e) {
        results.speed[backend] = { error: (e as Error).message };
        log(`  failed: ${(e as Error).message}`);
      }
    }
  }

  // PyTorch and the page alternate, round by round, so that each page / PyTorch ratio is taken side
  // by side at one load; the last round's full results fill the PyTorch and page tables
  const sideRounds = only.has('torch') && only.has('page') && !quick ? SIDE_ROUNDS : 1;
  for (let round = 0; round < sideRounds; round++) {
    if (only.has('torch')) {
      log(`torch anchor (bench/torch_anchor.py)${sideRounds > 1 ? `, round ${round + 1}/${sideRounds}` : ''} …`);
      results.torch = torchAnchor(quick);
      if ('skipped' in results.torch) log(`  skipped: ${results.torch.skipped}`);
    }
    if (only.has('page')) {
      log('page: onnxruntime-web WASM in Chromium, 1 thread vs all (bench/page-wasm.ts) …');
      try {
        const { pageWasm } = await import('./page-wasm');
        results.page = await pageWasm(model.dir, quick ? 2 : sideRounds > 1 ? 3 : 5);
      } catch (e) {
        results.page = { error: (e as Error).message };
        log(`  failed: ${(e as Error).message}`);
      }
    }
    const side = pageOverTorch(results);
    if (side) {
      (results.page_vs_torch ??= { rounds: [], median: {} }).rounds.push(side);
      log(
        `  page (all threads) / PyTorch best, this round: ${Object.entries(side)
          .map(([T, x]) => `T=${T} ${x.ratio.toFixed(2)}`)
          .join(', ')}`,
      );
    }
  }
  if (results.page_vs_torch) {
    const Tset = Object.keys(results.page_vs_torch.rounds[0]);
    results.page_vs_torch.median = Object.fromEntries(
      Tset.map((T) => [T, median(results.page_vs_torch!.rounds.map((r) => r[T]?.ratio ?? NaN))]),
    );
  }

  if (only.has('memory')) {
    const configs: { backend: 'node' | 'wasm'; graph: 'hooked' | 'plain' }[] = [
      { backend: 'node', graph: 'hooked' },
      { backend: 'wasm', graph: 'hooked' },
      { backend: 'node', graph: 'plain' },
      { backend: 'wasm', graph: 'plain' },
    ];
    for (const c of configs) {
      log(`memory: ${c.backend}, ${c.graph} graph …`);
      const a: MemoryArgs = {
        dir: model.dir,
        backend: c.backend,
        threads: c.backend === 'node' ? nodeThreads : 1,
        T: 128,
        graph: c.graph,
      };
      try {
        results.memory.push(await inChild<MemoryResult>('memory', a));
      } catch (e) {
        results.memory.push({ backend: c.backend, graph: c.graph, T: 128, error: (e as Error).message });
        log(`  failed: ${(e as Error).message}`);
      }
    }
  }

  if (only.has('extensions') && !quick) {
    for (const ext of extensions.filter((e) => !extOnly || extOnly.includes(e.name))) {
      log(`operations: ${ext.name} …`);
      const a: ExtensionArgs = { dir: model.dir, name: ext.name, threads: nodeThreads, weightBytes: model.weightBytes };
      try {
        const r = await inChild<ExtResult | { skipped: string }>('extension', a, ext.timeoutMs);
        results.extensions[ext.name] = { title: ext.title, ...r };
        if ('skipped' in r) log(`  skipped: ${r.skipped}`);
      } catch (e) {
        results.extensions[ext.name] = { title: ext.title, error: (e as Error).message };
        log(`  failed: ${(e as Error).message}`);
      }
    }
  }

  results.machine.load_average_end = os.loadavg();
  results.total_s = Math.round((performance.now() - t0) / 100) / 10;
  results.summary = summarizeTargets(results);
  const text = render(results);
  process.stdout.write(text);
  const outFile = outArg ? path.resolve(outArg) : path.join(HERE, 'results', 'latest.json');
  mkdirSync(path.dirname(outFile), { recursive: true });
  writeFileSync(outFile, JSON.stringify(results, null, 2) + '\n');
  log(`wrote ${path.relative(process.cwd(), outFile)} (${results.total_s} s in all)`);
  if (!outArg) writeBenchmarksDoc();
}

const SIDE_ROUNDS = 3;

/** this round's page (every thread) / PyTorch (best thread count) per T, when both ran */
function pageOverTorch(
  r: BenchResults,
): Record<string, { page_ms: number; torch_ms: number; ratio: number }> | undefined {
  const t = r.torch,
    p = r.page;
  if (!t || !p || 'error' in t || 'skipped' in t || 'error' in p) return undefined;
  const all = p.runs[String(p.hardware_concurrency)] ?? p.runs['1'];
  const out: Record<string, { page_ms: number; torch_ms: number; ratio: number }> = {};
  for (const [T, x] of Object.entries(all ?? {})) {
    const torchMs = Math.min(...Object.values(t.runs).map((byT) => byT[T]?.median_ms ?? Infinity));
    if (Number.isFinite(torchMs)) out[T] = { page_ms: x.median_ms, torch_ms: torchMs, ratio: x.median_ms / torchMs };
  }
  return Object.keys(out).length ? out : undefined;
}

/**
 * the anchor's environment: this one without the OpenBLAS overrides some machines set for old builds
 * (OPENBLAS_CORETYPE pins an older kernel, OPENBLAS_L2_SIZE a smaller cache), so OpenBLAS picks its own
 */
function torchEnv(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const k of ['OPENBLAS_CORETYPE', 'OPENBLAS_L2_SIZE', 'OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS']) delete env[k];
  return env;
}

/** bench/torch_anchor.py under the first python3 that has torch (Debian's python3-torch lives in /usr/bin/python3) */
function torchAnchor(quickRun: boolean): NonNullable<BenchResults['torch']> {
  const script = path.join(HERE, 'torch_anchor.py');
  const tried: string[] = [];
  for (const py of ['/usr/bin/python3', 'python3']) {
    const r = spawnSync(py, [script, ...(quickRun ? ['--reps', '2', '--warmup', '1'] : [])], {
      encoding: 'utf8',
      env: torchEnv(),
      stdio: ['ignore', 'pipe', 'inherit'],
      timeout: 900_000,
    });
    if (r.status === 0) {
      try {
        return { python: py, ...JSON.parse(r.stdout) };
      } catch (e) {
        return { error: `${py}: unreadable output: ${(e as Error).message}` };
      }
    }
    if (r.status === 4)
      return { skipped: `${py}: torch runs on a BLAS other than OpenBLAS; apt-get install libopenblas0-pthread` };
    tried.push(`${py}: ${r.error ? r.error.message : r.status === 3 ? 'no torch' : `exit ${r.status ?? r.signal}`}`);
  }
  return { skipped: `no python3 with torch (${tried.join('; ')}); apt-get install python3-torch libopenblas0-pthread` };
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
