/**
 * onnxruntime-node's WebGPU sessions with their values on the GPU (backend 'webgpu' in Node).
 *
 * What onnxruntime-node 1.30's binding offers (read in its source and tried here on SwiftShader):
 *  - `preferredOutputLocation: 'gpu-buffer'` makes a session run through one IoBinding that the
 *    binding keeps for the session's life: outputs bound in one run stay bound in the next (a run
 *    fetching fewer fails "Output count mismatch"), and a per-output location is looked up by the
 *    fetch's index, not the output's. So such a session fetches every output on every run, all
 *    'gpu-buffer'.
 *  - A 'gpu-buffer' output comes back as a Tensor whose `getData()` is not implemented (its native
 *    downloader throws a C string, which ends the process): it is never called. Such a tensor can
 *    be fed to any session on the same device (the provider's default context), with no copy.
 * So each run here keeps every output on the GPU; the fetched ones are read back together in one
 * run of a small session whose outputs are in CPU memory (runtime/read-back.ts: Identity per
 * tensor, or Gather at the positions asked for: RunOptions.hookPositions), those the
 * caller asks to keep stay on the GPU, and the rest are released.
 * One-element float feeds (the identity interventions' mul = 1 and add = 0, the edge variant's
 * flag) are fed from GPU tensors made once per value, so an identity intervention uploads nothing.
 * The first run of each session is profiled (onnxruntime's profiler names each node's provider):
 * the nodes left to the CPU are the session's placement (runtime/transfers.ts).
 */
import { readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { OnnxGraph } from '../engine/graph/onnx-builder';
import {
  differenceGraph,
  type EngineSession,
  type OrtModule,
  type OrtTensorLike,
  type Placement,
} from '../engine/runtime/ort-session';
import { readBack, resetReaders } from '../engine/runtime/read-back';

const PROVIDER = 'WebGpuExecutionProvider';

/** session options that keep a session's outputs on the GPU and profile its first run */
export function deviceSessionOptions(): { options: Record<string, unknown>; profilePrefix: string } {
  const profilePrefix = path.join(tmpdir(), `loupe-placement-${process.pid}-${++profiled}`);
  return {
    options: { preferredOutputLocation: 'gpu-buffer', enableProfiling: true, profileFilePrefix: profilePrefix },
    profilePrefix,
  };
}
let profiled = 0;

interface DeviceHelpers {
  /** one-element float32 GPU tensors, by value */
  scalars: Map<number, Promise<OrtTensorLike>>;
  /** the session that makes them */
  maker?: Promise<any>;
  /** the session that copies a float32 tensor of any shape to the GPU (deviceUpload) */
  uploader?: Promise<any>;
  /** the differenceGraph session (deviceDifference) */
  difference?: Promise<any>;
}
const helpersOf = new WeakMap<object, DeviceHelpers>();

function helpers(ort: OrtModule): DeviceHelpers {
  let h = helpersOf.get(ort);
  if (!h) helpersOf.set(ort, (h = { scalars: new Map() }));
  return h;
}

/**
 * After a device loss: the values and helper sessions kept here disposed and released, so that
 * none holds the provider's context (its device) and the next session makes a new one.
 */
export async function resetDevice(ort: OrtModule): Promise<void> {
  const h = helpersOf.get(ort);
  helpersOf.delete(ort);
  if (h) {
    for (const t of h.scalars.values()) (await t.catch(() => undefined))?.dispose?.();
    for (const s of [h.maker, h.uploader, h.difference])
      await (await s?.catch(() => undefined))?.release?.().catch(() => undefined);
  }
  await resetReaders(ort);
}

/** A one-element float32 tensor on the GPU, made once per value and kept until a device loss (resetDevice). */
function deviceScalar(ort: OrtModule, v: number): Promise<OrtTensorLike> {
  const h = helpers(ort);
  let t = h.scalars.get(v);
  if (!t) {
    if (!h.maker) {
      const g = new OnnxGraph(() => '');
      g.identity(g.input('x', 'float', [1]), 'y');
      g.output('y');
      h.maker = ort.InferenceSession.create(g.encode(), {
        executionProviders: ['webgpu'],
        preferredOutputLocation: 'gpu-buffer',
        logSeverityLevel: 3,
      });
    }
    const maker = h.maker;
    t = (async () =>
      (await (await maker).run({ x: new ort.Tensor('float32', new Float32Array([v]), [1]) }, ['y'])).y)();
    t.catch(() => h.scalars.delete(v));
    h.scalars.set(v, t);
  }
  return t;
}

/**
 * A float32 tensor copied to the GPU once (one run of an Identity session whose output stays
 * there), to be fed to many runs with nothing written again; the caller disposes it.
 */
export async function deviceUpload(ort: OrtModule, t: OrtTensorLike): Promise<OrtTensorLike> {
  const h = helpers(ort);
  if (!h.uploader) {
    const g = new OnnxGraph(() => '');
    g.identity(g.input('x', 'float'), 'y');
    g.output('y');
    h.uploader = ort.InferenceSession.create(g.encode(), {
      executionProviders: ['webgpu'],
      preferredOutputLocation: 'gpu-buffer',
      logSeverityLevel: 3,
    });
    h.uploader.catch(() => (h.uploader = undefined));
  }
  return (await (await h.uploader).run({ x: t }, ['y'])).y;
}

/** A run of differenceGraph on tensors on the GPU (differenceFeeds), its output left there; the caller disposes it. */
export async function deviceDifference(ort: OrtModule, feeds: Record<string, OrtTensorLike>): Promise<OrtTensorLike> {
  const h = helpers(ort);
  if (!h.difference) {
    h.difference = ort.InferenceSession.create(differenceGraph(), {
      executionProviders: ['webgpu'],
      preferredOutputLocation: 'gpu-buffer',
      logSeverityLevel: 3,
    });
    h.difference.catch(() => (h.difference = undefined));
  }
  return (await (await h.difference).run(feeds, ['y'])).y;
}

/** the one float of a one-element float32 tensor in JS memory, else undefined */
function scalarOf(t: OrtTensorLike): number | undefined {
  if (t.location && t.location !== 'cpu') return undefined;
  const d = t.data;
  return d instanceof Float32Array && d.length === 1 && t.dims.length <= 1 ? d[0] : undefined;
}

/** Nodes by provider from onnxruntime's profile of the session's first run. */
function readPlacement(prefix: string): Placement | undefined {
  const dir = path.dirname(prefix);
  const base = path.basename(prefix);
  let placement: Placement | undefined;
  for (const f of readdirSync(dir).filter((n) => n.startsWith(base + '_') && n.endsWith('.json'))) {
    const file = path.join(dir, f);
    try {
      const events = JSON.parse(readFileSync(file, 'utf8')) as { cat?: string; args?: Record<string, any> }[];
      placement = { offDevice: 0, onDevice: 0, ops: {} };
      for (const e of events) {
        if (e.cat !== 'Node' || !e.args?.provider) continue;
        if (e.args.provider === PROVIDER) placement.onDevice++;
        else {
          placement.offDevice++;
          // with its first input's dtype: int64 shape arithmetic is the provider's design, float work is not
          const first = Object.keys(e.args.input_type_shape?.[0] ?? {})[0];
          const op = `${e.args.op_name}${first ? `:${first}` : ''}`;
          placement.ops[op] = (placement.ops[op] ?? 0) + 1;
        }
      }
    } catch {
      /* an unreadable profile: no placement */
    } finally {
      rmSync(file, { force: true });
    }
  }
  return placement;
}

/** The session's outputs kept on the GPU; what is fetched read back in one run, the rest released. */
export function deviceSession(ort: OrtModule, session: any, profilePrefix: string): EngineSession {
  const outputs: string[] = session.outputNames;
  let placement: Placement | undefined;
  let profiling = true;
  const endProfiling = () => {
    if (!profiling) return;
    profiling = false;
    try {
      session.endProfiling();
      placement = readPlacement(profilePrefix);
    } catch {
      /* no profile: the placement stays unknown */
    }
  };
  return {
    keepsOnDevice: true,
    placement: () => placement,
    async run(feeds, fetches, opts = {}) {
      // the feeds are replaced in place, so that a counter sees what was fed (runtime/transfers.ts)
      for (const [k, t] of Object.entries(feeds)) {
        const v = scalarOf(t);
        if (v !== undefined) feeds[k] = await deviceScalar(ort, v);
      }
      const all: Record<string, OrtTensorLike> = await session.run(feeds, outputs);
      endProfiling();
      const keep = new Set(opts.keep ?? []);
      const wanted = new Set(fetches);
      const read = fetches.filter((n) => !keep.has(n));
      const result: Record<string, OrtTensorLike> = {};
      try {
        const gather = opts.gather;
        const specs = read.map((n) => ({ type: all[n].type ?? 'float32', axis: gather?.axes[n] }));
        const values = await readBack(
          ort,
          read.map((n) => all[n]),
          specs,
          gather?.positions,
        );
        read.forEach((n, i) => (result[n] = values[i]));
        for (const n of fetches) if (keep.has(n)) result[n] = all[n];
      } finally {
        for (const n of outputs) if (!wanted.has(n) || !keep.has(n)) all[n]?.dispose?.();
      }
      return result;
    },
    async release() {
      endProfiling();
      await session.release?.();
    },
  };
}
