/**
 * The seam between the engine and an onnxruntime build. The engine hands a built graph to a
 * SessionFactory and gets back a session that runs feeds → outputs. The browser factory uses
 * onnxruntime-web with the weights as `externalData` buffers; the Node factory (src/node/) loads
 * the graph from a file next to the weight files so ORT reads them from disk.
 */
import type { Backend } from '../api';
import type { BuiltGraph } from '../graph/build-model';
import type { WeightSet } from '../safetensors-types';
import { precisionSessionOptions } from '../precision';
import { pieceGraph, type Piece } from './pieces';
import { LoupeError } from '../errors';
import type { ReadableWeightSet } from '../safetensors';
import type { GpuCaps } from '../env';

export interface OrtTensorLike {
  dims: readonly number[];
  data: unknown;
  dispose?: () => void;
}

/** The parts of an onnxruntime module (web, node, or web-in-node) the engine uses. */
export interface OrtModule {
  InferenceSession: { create(model: any, options?: any): Promise<any> };
  Tensor: new (type: any, data: any, dims: readonly number[]) => OrtTensorLike;
  env?: any;
}

export interface EngineSession {
  run(feeds: Record<string, OrtTensorLike>, fetches: string[]): Promise<Record<string, OrtTensorLike>>;
  release(): Promise<void>;
}

export interface SessionFactory {
  backend: Backend;
  ort: OrtModule;
  /** WebGPU: what the adapter offers (shader-f16, buffer limit); decides precision and the vocabulary split */
  gpu?: GpuCaps;
  create(graph: BuiltGraph, weights: WeightSet): Promise<EngineSession>;
}

function wrap(session: any): EngineSession {
  return {
    run: (feeds, fetches) => session.run(feeds, fetches),
    release: async () => { await session.release?.(); },
  };
}

/**
 * onnxruntime-web 1.30 (JSEP): releasing a WASM session while a WebGPU session of the same runtime
 * is alive drops that WebGPU session's GPU data ("[Gather] … no GPU data for input"; reproduced
 * in Chromium: load on WASM, load on WebGPU, release the WASM one, run). So WASM releases wait
 * until no WebGPU session is alive. Per runtime module, since each module has its own state.
 */
const liveGpu = new WeakMap<object, { count: number; deferred: (() => Promise<void>)[] }>();

function trackedWeb(ort: OrtModule, backend: 'webgpu' | 'wasm', session: any): EngineSession {
  let state = liveGpu.get(ort);
  if (!state) liveGpu.set(ort, (state = { count: 0, deferred: [] }));
  const st = state;
  if (backend === 'webgpu') st.count++;
  let released = false;
  return {
    run: (feeds, fetches) => session.run(feeds, fetches),
    release: async () => {
      if (released) return;
      released = true;
      if (backend === 'wasm' && st.count > 0) {
        st.deferred.push(() => session.release());
        return;
      }
      await session.release();
      if (backend === 'webgpu' && --st.count === 0) {
        const pending = st.deferred.splice(0);
        for (const r of pending) await r().catch(() => undefined);
      }
    },
  };
}

/** One piece's bytes: a view of a file in memory, else read by range (IndexedDB chunks, a file on disk). */
async function pieceBytes(weights: ReadableWeightSet, p: Piece): Promise<Uint8Array> {
  const bytes = weights.files.get(p.file);
  if (bytes) return bytes.subarray(p.start, p.end);
  const ranged = weights.ranged?.get(p.file);
  const data = ranged ? await ranged.readAsync(p.start, p.end - p.start) : weights.readRange?.(p.file, p.start, p.end - p.start);
  if (!data || data.byteLength !== p.end - p.start) throw new LoupeError('SAFETENSORS_TRUNCATED', `${p.file}: could not read bytes ${p.start}–${p.end}.`, 'The file is damaged or incomplete: clear the cache and load the model again.', { file: p.file });
  return data;
}

/**
 * onnxruntime-web (browser worker, or WASM in Node): weights go in as external data buffers in
 * pieces under 2 GiB (pieces.ts), views of the files in memory or read by range from where they
 * are kept (IndexedDB chunks, a file on disk) — never a whole file at once. onnxruntime-web holds
 * every piece until the session exists and copies them into its heap; once `create` returns no
 * reference to a piece is left, so the read bytes are garbage.
 */
export function webSessionFactory(ort: OrtModule, backend: 'webgpu' | 'wasm', gpu?: GpuCaps, extraOptions: Record<string, unknown> = {}): SessionFactory {
  return {
    backend,
    ort,
    ...(backend === 'webgpu' && gpu ? { gpu } : {}),
    async create(graph, weights) {
      const { graphBytes, pieces } = pieceGraph(graph.bytes);
      const externalData: { path: string; data: Uint8Array }[] = [];
      for (const p of pieces) externalData.push({ path: p.path, data: await pieceBytes(weights, p) });
      const session = await ort.InferenceSession.create(graphBytes, {
        executionProviders: [backend],
        externalData,
        graphOptimizationLevel: 'all',
        ...precisionSessionOptions(graph.precision),
        ...extraOptions,
      });
      externalData.length = 0; // should the runtime keep the options object, it keeps no piece
      return trackedWeb(ort, backend, session);
    },
  };
}

export { wrap as wrapOrtSession };
