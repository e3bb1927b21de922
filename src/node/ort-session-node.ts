/**
 * onnxruntime-node sessions loaded from a file: the graph is written next to the weight files, so
 * ORT reads the weights from disk (faster session creation and less RSS than passing buffers). onnxruntime-node has no `externalData` option and refuses
 * external data outside the model's directory (symlinks included), so each weight file is
 * hard-linked into a temporary directory (copied when it lives on another filesystem).
 * float32 weights widened from 16-bit files come from onnxruntime's optimized model kept in the
 * cache after the first start (optimized-cache.ts): the widening is not redone at every start.
 * With `gpu` the sessions run on onnxruntime-node's WebGPU provider (webgpu-node.ts) as backend
 * 'webgpu', their values kept on the GPU (device-session.ts); the optimized-model cache serves the
 * CPU provider only.
 */
import {
  closeSync,
  copyFileSync,
  linkSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  rmSync,
  statSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import {
  graphSessionOptions,
  wrapOrtSession,
  type OrtModule,
  type OrtTensorLike,
  type SessionFactory,
} from '../engine/runtime/ort-session';
import type { RangedFile, WeightSet } from '../engine/safetensors-types';
import { defaultCacheDir } from './dir-cache';
import type { BuiltGraph } from '../engine/graph/build-model';
import type { GpuCaps } from '../engine/env';
import { cachedModelPath, dropEntry, optimizedKey, saveTarget, worthCaching } from './optimized-cache';
import { deviceDifference, deviceSession, deviceSessionOptions, deviceUpload, resetDevice } from './device-session';

/**
 * Where to assemble the graph: on the same filesystem as the weights, so they can be hard-linked.
 * The system temp dir first, then Loupe's cache dir (Hub downloads live there; /tmp is often a
 * tmpfs, where a copy would also cost RAM). A copy is the last resort.
 */
function graphDir(weights: WeightSet): string {
  const first = [...weights.paths.values()][0];
  const device = (p: string) => {
    try {
      return statSync(p).dev;
    } catch {
      return undefined;
    }
  };
  const want = first ? device(first) : undefined;
  const candidates = [tmpdir(), path.join(defaultCacheDir(), 'graphs')];
  for (const base of candidates) {
    try {
      mkdirSync(base, { recursive: true });
      if (want === undefined || device(base) === want) return mkdtempSync(path.join(base, 'loupe-graph-'));
    } catch {
      /* not writable: try the next */
    }
  }
  return mkdtempSync(path.join(tmpdir(), 'loupe-graph-'));
}

/**
 * No spinning (unless the caller's options say otherwise): onnxruntime's intra-op threads
 * otherwise busy-wait for work between and after parallel sections. Each session has its own pool
 * and an operation runs two or three sessions (the forward, the DLA readout) with JavaScript
 * between them, so threads spinning for one can hold the cores the next one (or the thread they
 * wait for) needs, most of all on a busy machine (`npm run bench` compares the two).
 */
function withoutSpinning(o: Record<string, any>): Record<string, any> {
  return { ...o, extra: { ...o.extra, session: { 'intra_op.allow_spinning': '0', ...o.extra?.session } } };
}

/**
 * `extraOptions`: onnxruntime session options over the defaults (the bench measures them);
 * `gpu`: the WebGPU provider's caps (webgpu-node.ts webGpuCaps), else the CPU provider
 */
export function nodeSessionFactory(
  ort: OrtModule,
  threads?: number,
  extraOptions: Record<string, unknown> = {},
  gpu?: GpuCaps,
): SessionFactory {
  const base = (graph: BuiltGraph): Record<string, any> => ({
    executionProviders: [gpu ? 'webgpu' : 'cpu'],
    // WebGPU: not the provider's warning that shape ops run on the CPU (its design), at every session
    ...(gpu ? { logSeverityLevel: 3 } : {}),
    graphOptimizationLevel: 'all',
    ...(threads ? { intraOpNumThreads: threads } : {}),
    ...graphSessionOptions(graph, withoutSpinning(extraOptions)),
  });
  /** session config entries added to the caller's */
  const withSession = (o: Record<string, any>, entries: Record<string, string>) => ({
    ...o,
    extra: { ...o.extra, session: { ...o.extra?.session, ...entries } },
  });

  async function fresh(graph: BuiltGraph, weights: WeightSet, options: Record<string, any>) {
    const dir = graphDir(weights);
    try {
      const files = new Set<string>();
      for (const e of weights.tensors.values()) {
        files.add(e.file);
        if (e.q8) files.add(e.q8.scale.file);
      }
      for (const f of files) {
        const p = weights.paths.get(f);
        const bytes = weights.files.get(f);
        const ranged = weights.ranged?.get(f);
        if (p) linkOrCopy(path.resolve(p), path.join(dir, f));
        else if (bytes) writeFileSync(path.join(dir, f), bytes);
        // a file made as it is read (the WebGPU q8 form's float32 widening, q8.ts q8ForWebGpu): written range by range
        else if (ranged) writeRanged(ranged, path.join(dir, f));
        else throw new Error(`weight file ${f} has neither a path nor bytes`);
      }
      const modelPath = path.join(dir, 'model.onnx');
      writeFileSync(modelPath, graph.bytes);
      return await ort.InferenceSession.create(modelPath, options);
    } finally {
      // ORT has read (or mapped) everything it needs once the session exists.
      rmSync(dir, { recursive: true, force: true });
    }
  }

  return {
    backend: gpu ? 'webgpu' : 'node',
    ort,
    ...(gpu
      ? {
          gpu,
          readoutInForward: true,
          upload: (t: OrtTensorLike) => deviceUpload(ort, t),
          difference: (feeds: Record<string, OrtTensorLike>) => deviceDifference(ort, feeds),
          // a lost device: the provider's context goes with the last session on it (runtime/device-lost.ts)
          reset: () => resetDevice(ort),
        }
      : { unembedApart: true }),
    async helper(bytes, onDevice, keep) {
      const ep = onDevice && gpu ? 'webgpu' : 'cpu';
      if (keep && gpu) {
        const device = deviceSessionOptions();
        const s = await ort.InferenceSession.create(bytes, { executionProviders: [ep], ...device.options });
        return deviceSession(ort, s, device.profilePrefix);
      }
      return wrapOrtSession(
        await ort.InferenceSession.create(bytes, { executionProviders: [ep], logSeverityLevel: 3 }),
      );
    },
    async create(graph, weights) {
      const options = base(graph);
      if (gpu) {
        // values stay on the GPU; what is fetched is read back (device-session.ts)
        const device = deviceSessionOptions();
        return deviceSession(ort, await fresh(graph, weights, { ...options, ...device.options }), device.profilePrefix);
      }
      if (!worthCaching(graph, weights)) return wrapOrtSession(await fresh(graph, weights, options));
      // float32 widened from 16-bit files: onnxruntime's optimized model is kept (optimized-cache.ts)
      const key = optimizedKey(graph, weights, options, (ort.env as any)?.versions ?? null);
      const cached = cachedModelPath(key);
      if (cached) {
        try {
          return wrapOrtSession(
            await ort.InferenceSession.create(cached, { ...options, graphOptimizationLevel: 'disabled' }),
          );
        } catch {
          dropEntry(key); // a broken entry: build afresh (and save again)
        }
      }
      let target: ReturnType<typeof saveTarget> | undefined;
      try {
        target = saveTarget(key, [...weights.paths.values()]);
        const session = await fresh(graph, weights, withSession({ ...options, ...target.options }, target.session));
        target.commit();
        return wrapOrtSession(session);
      } catch {
        target?.abort(); // e.g. a full disk or an unwritable cache: no entry, a plain session
        return wrapOrtSession(await fresh(graph, weights, options));
      }
    },
  };
}

const WRITE_CHUNK = 16 * 1024 ** 2;

function writeRanged(file: RangedFile, to: string): void {
  const fd = openSync(to, 'w');
  try {
    for (let at = 0; at < file.size; at += WRITE_CHUNK)
      writeSync(fd, file.read(at, Math.min(WRITE_CHUNK, file.size - at)));
  } finally {
    closeSync(fd);
  }
}

function linkOrCopy(from: string, to: string): void {
  try {
    linkSync(from, to);
  } catch {
    copyFileSync(from, to);
  }
}
