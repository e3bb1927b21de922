/**
 * Helpers the bench's child processes share: timing, memory readings, and a session over the
 * plain (logits-only) graph — the engine's API only exposes the hooked graph, so the bench builds
 * the plain one itself with the engine's own graph builder and session factory.
 */
import { readdirSync, readFileSync } from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describeModel } from '../src/engine/arch';
import { buildModelGraph, type BuiltGraph, type GraphPlan } from '../src/engine/graph/build-model';
import type { EngineSession, OrtTensorLike, SessionFactory } from '../src/engine/runtime/ort-session';
import { attentionMask } from '../src/engine/runtime/masks';
import { ropeTables } from '../src/engine/runtime/rope';
import type { ModelSpec } from '../src/engine/spec';
import type { WeightSet } from '../src/engine/safetensors-types';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { nodeFactory } from '../src/node/load';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

// ------------------------------------------------------------------ timing

export function now(): number {
  return performance.now();
}

export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  if (n === 0) return NaN;
  return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

export interface Timed {
  median_ms: number;
  min_ms: number;
  max_ms: number;
  samples_ms: number[];
  /**
   * median process CPU time (user + system, every thread) per run. Secondary: less sensitive than
   * wall time to other processes on a shared machine, but it also counts ORT's pool threads spinning.
   */
  cpu_median_ms: number;
  cpu_samples_ms: number[];
}

const r2 = (x: number) => Math.round(x * 100) / 100;

export function summarize(samples: number[], cpu: number[] = []): Timed {
  return {
    median_ms: r2(median(samples)),
    min_ms: r2(Math.min(...samples)),
    max_ms: r2(Math.max(...samples)),
    samples_ms: samples.map(r2),
    cpu_median_ms: r2(median(cpu)),
    cpu_samples_ms: cpu.map(r2),
  };
}

/** process CPU time so far, ms */
export function cpuNow(): number {
  const c = process.cpuUsage();
  return (c.user + c.system) / 1000;
}

/**
 * Time several configurations interleaved (warm-up rounds, then timed rounds; each round runs
 * every configuration once, starting one further along the list each round), so that load from other processes on a shared machine falls on all
 * configurations alike instead of on whichever ran during the busy spell.
 * `settle` runs each configuration once, untimed, right before each of its timed runs.
 */
export async function timeInterleaved(
  configs: { name: string; fn: () => Promise<unknown> }[],
  warmup: number,
  reps: number,
  opts: { settle?: boolean } = {},
): Promise<Record<string, Timed>> {
  for (let w = 0; w < warmup; w++) for (const c of configs) await c.fn();
  const wall: Record<string, number[]> = Object.fromEntries(configs.map((c) => [c.name, []]));
  const cpu: Record<string, number[]> = Object.fromEntries(configs.map((c) => [c.name, []]));
  for (let r = 0; r < reps; r++) {
    // rotate the order each round so that no configuration always runs right after the same other one
    for (let k = 0; k < configs.length; k++) {
      const c = configs[(k + r) % configs.length];
      // settle: one untimed run of the same configuration first, so the timed run does not pay for
      // the switch from the previous one (ORT-node gives each session its own intra-op thread pool,
      // and the previous session's threads may still be spinning on the shared cores)
      if (opts.settle) await c.fn();
      const c0 = cpuNow();
      const t0 = now();
      await c.fn();
      wall[c.name].push(now() - t0);
      cpu[c.name].push(cpuNow() - c0);
    }
  }
  return Object.fromEntries(configs.map((c) => [c.name, summarize(wall[c.name], cpu[c.name])]));
}

// ------------------------------------------------------------------ memory

export interface MemReading {
  /** process.resourceUsage().maxRSS, bytes */
  max_rss: number;
  /** /proc/self/status VmHWM (peak resident), bytes; null off Linux */
  vm_hwm: number | null;
  /** current VmRSS and its anonymous / file-backed parts, bytes */
  vm_rss: number | null;
  rss_anon: number | null;
  rss_file: number | null;
}

export function readMem(): MemReading {
  const kb = (k: string, text: string) => {
    const m = new RegExp(`^${k}:\\s+(\\d+) kB`, 'm').exec(text);
    return m ? Number(m[1]) * 1024 : null;
  };
  let status = '';
  try {
    status = readFileSync('/proc/self/status', 'utf8');
  } catch {
    /* not Linux */
  }
  return {
    max_rss: process.resourceUsage().maxRSS * 1024,
    vm_hwm: kb('VmHWM', status),
    vm_rss: kb('VmRSS', status),
    rss_anon: kb('RssAnon', status),
    rss_file: kb('RssFile', status),
  };
}

/**
 * The largest peak RSS (VmHWM) among the Chromium processes of one `--type` (renderer: the page
 * and its worker; gpu-process) that descend from this process: the browser this bench launched,
 * never another program's Chromium on a shared machine.
 */
export function chromiumPeak(type = 'renderer', root = process.pid): number {
  const parent = new Map<number, number>();
  const cmds = new Map<number, string>();
  for (const d of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      parent.set(Number(d), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
      cmds.set(Number(d), readFileSync(`/proc/${d}/cmdline`, 'utf8'));
    } catch {
      /* gone */
    }
  }
  const descends = (pid: number) => {
    for (let p = parent.get(pid), n = 0; p !== undefined && p > 1 && n < 64; p = parent.get(p), n++)
      if (p === root) return true;
    return false;
  };
  let max = 0;
  for (const [pid, cmd] of cmds) {
    if (!cmd.includes(`--type=${type}`) || !cmd.includes('chromium') || !descends(pid)) continue;
    try {
      max = Math.max(max, Number(/VmHWM:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]) * 1024);
    } catch {
      /* gone */
    }
  }
  return max;
}

/**
 * chromiumPeak read every `ms` until stop(): VmHWM is not a true peak for Chromium, whose
 * allocators return memory with madvise (the kernel's high-water mark is not updated then, so a
 * later reading can be lower than an earlier one); the running maximum of the readings is.
 */
export function chromiumPeakSampler(type = 'renderer', ms = 250) {
  let max = 0;
  const read = () => (max = Math.max(max, chromiumPeak(type)));
  read();
  const timer = setInterval(read, ms);
  timer.unref();
  return { peak: read, stop: () => clearInterval(timer) };
}

// ------------------------------------------------------------------ versions

export function packageVersion(name: string): string {
  try {
    return JSON.parse(readFileSync(path.join(ROOT, 'node_modules', name, 'package.json'), 'utf8')).version;
  } catch {
    return 'unknown';
  }
}

// ------------------------------------------------------------------ the plain graph

export interface PlainSession {
  spec: ModelSpec;
  tensors: WeightSet['tensors'];
  graph: BuiltGraph;
  session: EngineSession;
  factory: SessionFactory;
  buildMs: number;
  createMs: number;
  /** one forward of these token ids (batch 1), fetching only the logits */
  run(ids: number[]): Promise<Record<string, OrtTensorLike>>;
  release(): Promise<void>;
}

/** GraphPlan.fused with every fused kernel the builder has: SkipLayerNormalization and MultiHeadAttention too (off by default; the bench measures them) */
export const ALL_FUSED: GraphPlan['fused'] = { skipNorm: true, attention: true };

/**
 * A session over the plain graph (`hooks: false`: no hook outputs, no intervention inputs; with
 * onnxruntime's fused kernels unless `fused` is false), created
 * through the same factory `loadModelNode` uses for this backend, from the same weight set: for WASM
 * each tensor is read from the file as onnxruntime-web copies it (runtime/ort-session.ts lazyPiece),
 * as the engine's load does (reading the whole file first left 475 MiB of JS buffers beside the heap).
 */
export async function plainSession(
  dir: string,
  backend: 'node' | 'wasm',
  threads?: number,
  fused: GraphPlan['fused'] = true,
): Promise<PlainSession> {
  const files = await loadModelFilesNode(dir);
  const weights = files.weights as WeightSet;
  const spec = describeModel({ config: files.config as Record<string, any>, tensors: weights.tensors });
  const factory = await nodeFactory(backend, threads);
  const t0 = now();
  // as the engine builds it for this backend (GraphPlan.unembedApart)
  const graph = buildModelGraph(spec, weights.tensors, {
    hooks: false,
    withResult: false,
    fused,
    unembedApart: factory.unembedApart,
  });
  const buildMs = now() - t0;
  const t1 = now();
  const session = await factory.create(graph, weights);
  const createMs = now() - t1 + buildMs;
  const ort = factory.ort;
  const { nLayers, nKvHeads, dHead } = spec;
  const emptyKv = new Float32Array(0);
  return {
    spec,
    tensors: weights.tensors,
    graph,
    session,
    factory,
    buildMs,
    createMs,
    async run(ids) {
      const T = ids.length;
      const feeds: Record<string, OrtTensorLike> = {};
      feeds.input_ids = new ort.Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, T]);
      if (graph.inputNames.includes('position_ids'))
        feeds.position_ids = new ort.Tensor('int64', BigInt64Array.from(ids.map((_, t) => BigInt(t))), [T]);
      feeds.attn_mask = new ort.Tensor('float32', attentionMask(T, 0, null), [T, T]);
      // rotary models: the tables as the engine feeds them (runtime/feeds.ts), the plain graph's only other inputs
      const positions = ids.map((_, t) => t);
      for (const [r, sfx] of [
        [spec.rotary, ''],
        [spec.rotaryLocal, '_local'],
      ] as const)
        if (r) {
          const { cos, sin } = ropeTables(r, positions);
          feeds[`rope_cos${sfx}`] = new ort.Tensor('float32', cos, [T, r.dim]);
          feeds[`rope_sin${sfx}`] = new ort.Tensor('float32', sin, [T, r.dim]);
        }
      // every position's logits, as model.run returns by default
      feeds.logit_positions = new ort.Tensor('int64', BigInt64Array.from(ids.map((_, t) => BigInt(t))), [T]);
      for (let l = 0; l < nLayers; l++) {
        feeds[`past.${l}.key`] = new ort.Tensor('float32', emptyKv, [1, nKvHeads, 0, dHead]);
        feeds[`past.${l}.value`] = new ort.Tensor('float32', emptyKv, [1, nKvHeads, 0, dHead]);
      }
      for (const name of graph.inputNames)
        if (!(name in feeds)) throw new Error(`plain graph: no feed for input ${name}`);
      return session.run(feeds, ['logits']);
    },
    release: () => session.release(),
  };
}
