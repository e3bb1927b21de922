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
import { pieceData, pieceGraph, type Piece } from './pieces';
import { LoupeError } from '../errors';
import { readBack, resetReaders } from './read-back';
import type { ReadableWeightSet } from '../safetensors';
import type { GpuCaps } from '../env';
import { OnnxGraph } from '../graph/onnx-builder';

export interface OrtTensorLike {
  dims: readonly number[];
  data: unknown;
  /** 'cpu' (or absent), or where the runtime keeps it ('gpu-buffer') */
  location?: string;
  type?: string;
  dispose?: () => void;
}

/** The parts of an onnxruntime module (web, node, or web-in-node) the engine uses. */
export interface OrtModule {
  InferenceSession: { create(model: any, options?: any): Promise<any> };
  Tensor: new (type: any, data: any, dims: readonly number[]) => OrtTensorLike;
  env?: any;
}

/** where the provider placed a session's nodes (onnxruntime's profiler of its first run) */
export interface Placement {
  /** nodes that ran on another provider than the session's own (the CPU, beside WebGPU) */
  offDevice: number;
  /** their op types and first input's dtype ('Concat:int64'), with counts */
  ops: Record<string, number>;
  /** the provider's own nodes */
  onDevice: number;
}

export interface RunKeep {
  /** fetched outputs to leave on the device, where the session keeps outputs there (returned as 'gpu-buffer' tensors) */
  keep?: string[];
  /** fetched outputs to read back only at `positions` along the axis given, where the session keeps outputs on the device */
  gather?: { positions: number[]; axes: Record<string, number> };
}

/** `run` may replace feeds in the object it is given by what it fed instead (a value already on the device). */
export interface EngineSession {
  /** onnxruntime-web: how the weight pieces were read, tensor by tensor as they were copied or whole first (see webSessionFactory) */
  pieces?: 'lazy' | 'whole';
  run(feeds: Record<string, OrtTensorLike>, fetches: string[], opts?: RunKeep): Promise<Record<string, OrtTensorLike>>;
  release(): Promise<void>;
  /** where the provider placed the session's nodes, once known (runtime/transfers.ts) */
  placement?: () => Placement | undefined;
  /** whether `keep` leaves outputs on the device (and `gather` is done there) */
  keepsOnDevice?: boolean;
}

export interface SessionFactory {
  backend: Backend;
  ort: OrtModule;
  /** WebGPU: what the adapter offers (shader-f16, buffer limit); decides precision and the vocabulary split */
  gpu?: GpuCaps;
  /** the provider runs an If's branches on the device: DLA's readout can go in the forward graph (readout/choose.ts) */
  readoutInForward?: boolean;
  /** the provider pre-packs constant Gemm weights and lets go of a packed initializer's bytes (GraphPlan.unembedApart) */
  unembedApart?: boolean;
  create(graph: BuiltGraph, weights: WeightSet): Promise<EngineSession>;
  /**
   * a session for a small weightless graph (a reduction, runtime/reduce.ts), its outputs in JS
   * memory: on the device when `onDevice` (fed values a session kept there), else on the host;
   * with `keep` on a device its outputs can stay there (`RunKeep.keep`, `keepsOnDevice`)
   */
  helper?(bytes: Uint8Array, onDevice: boolean, keep?: boolean): Promise<EngineSession>;
  /**
   * Where values can stay on a device (WebGPU): a float32 tensor copied there once, to be fed to
   * many runs with nothing written again; its owner disposes it. Absent: feeds are written per run.
   */
  upload?(t: OrtTensorLike): Promise<OrtTensorLike>;
  /** Where values stay on a device: a run of differenceGraph there (differenceFeeds), its output kept. */
  difference?(feeds: Record<string, OrtTensorLike>): Promise<OrtTensorLike>;
  /** WebGPU in the browser: whether the runtime's GPUDevice is lost (its `lost` promise resolved) */
  deviceLost?(): boolean;
  /**
   * After a device loss, once every session the caller holds is released: drop every value and
   * helper session this factory keeps on the device, so that the next session gets a new device
   * (runtime/device-lost.ts). A runtime that keeps its device for the process (JSEP) still has it lost.
   */
  reset?(): Promise<void>;
}

/** inputs a, b (float) and at (int64 [1]): y = Gather(a − b, at, axis 0), one row of a difference */
export function differenceGraph(): Uint8Array {
  const g = new OnnxGraph(() => '');
  const d = g.o('Sub', [g.input('a', 'float'), g.input('b', 'float')]);
  g.rename(g.o('Gather', [d, g.input('at', 'int64', [1])], { axis: 0 }), 'y');
  g.output('y');
  return g.encode();
}

/** the feeds of a differenceGraph run */
export function differenceFeeds(
  ort: OrtModule,
  a: OrtTensorLike,
  b: OrtTensorLike,
  row: number,
): Record<string, OrtTensorLike> {
  return { a, b, at: new ort.Tensor('int64', BigInt64Array.from([BigInt(row)]), [1]) };
}

/**
 * onnxruntime options for a graph: its precision's (precision.ts) and its own config entries
 * (BuiltGraph.sessionConfig), under the caller's `extraOptions` (the bench measures options).
 */
export function graphSessionOptions(graph: BuiltGraph, extraOptions: Record<string, any> = {}): Record<string, any> {
  const o: Record<string, any> = { ...precisionSessionOptions(graph.precision), ...extraOptions };
  if (graph.sessionConfig) o.extra = { ...o.extra, session: { ...graph.sessionConfig, ...o.extra?.session } };
  return o;
}

function wrap(session: any): EngineSession {
  return {
    run: (feeds, fetches) => session.run(feeds, fetches),
    release: async () => {
      await session.release?.();
    },
  };
}

/**
 * onnxruntime-web 1.30 (JSEP): releasing a WASM session while a WebGPU session of the same runtime
 * is alive drops that WebGPU session's GPU data ("[Gather] … no GPU data for input"; reproduced
 * in Chromium: load on WASM, load on WebGPU, release the WASM one, run). So WASM releases wait
 * until no WebGPU session is alive. Per runtime module, since each module has its own state.
 */
const liveGpu = new WeakMap<object, { count: number; deferred: (() => Promise<void>)[] }>();

function trackedWeb(
  ort: OrtModule,
  backend: 'webgpu' | 'wasm',
  session: any,
  pieces: EngineSession['pieces'],
): EngineSession {
  let state = liveGpu.get(ort);
  if (!state) liveGpu.set(ort, (state = { count: 0, deferred: [] }));
  const st = state;
  if (backend === 'webgpu') st.count++;
  let released = false;
  return {
    pieces,
    // WebGPU: the KV cache and the identity feeds on the GPU (webDeviceRun)
    ...(backend === 'webgpu'
      ? { run: webDeviceRun(ort, session), keepsOnDevice: true }
      : { run: (feeds: Record<string, OrtTensorLike>, fetches: string[]) => session.run(feeds, fetches) }),
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

/*
 * onnxruntime-web's WebGPU sessions (the page) with what can stay on the GPU kept there: every
 * output comes back as a 'gpu-buffer' tensor (session option `preferredOutputLocation`;
 * onnxruntime-web binds outputs per run, so a run fetches only what it asks for): the KV cache's
 * `present.*` kept for `returnCache: 'device'` and fed back as `past.*`, the edge variant's
 * `edge::out` kept for outputs 'device'; hooks asked for at some positions (`hookPositions`)
 * gathered there on the GPU and only those read back (runtime/read-back.ts);
 * the rest read back whole with `getData`. One-element float feeds (the identity interventions'
 * mul = 1 and add = 0) are GPU buffers written once per value on onnxruntime's own device.
 */

const scalars = new WeakMap<object, Map<number, Promise<OrtTensorLike>>>();

/** a one-element float32 tensor in a GPU buffer of onnxruntime's device, made once per value */
function gpuScalar(ort: OrtModule, v: number): Promise<OrtTensorLike> {
  let byValue = scalars.get(ort);
  if (!byValue) scalars.set(ort, (byValue = new Map()));
  let t = byValue.get(v);
  if (!t) {
    t = (async () => {
      const device = await ort.env.webgpu.device;
      const usage = (globalThis as any).GPUBufferUsage;
      // 16 bytes: onnxruntime-web rounds storage bindings up to 16
      const buffer = device.createBuffer({ size: 16, usage: usage.STORAGE | usage.COPY_SRC | usage.COPY_DST });
      device.queue.writeBuffer(buffer, 0, new Float32Array([v, 0, 0, 0]));
      return (ort.Tensor as any).fromGpuBuffer(buffer, { dataType: 'float32', dims: [1] }) as OrtTensorLike;
    })();
    t.catch(() => byValue!.delete(v));
    byValue.set(v, t);
  }
  return t;
}

/** a float32 tensor copied into a GPU buffer of onnxruntime's device; disposing the tensor destroys the buffer */
async function gpuUpload(ort: OrtModule, t: OrtTensorLike): Promise<OrtTensorLike> {
  const device = await ort.env.webgpu.device;
  const usage = (globalThis as any).GPUBufferUsage;
  const data = t.data as Float32Array;
  // onnxruntime-web rounds storage bindings up to 16 bytes
  const buffer = device.createBuffer({
    size: Math.max(16, Math.ceil(data.byteLength / 16) * 16),
    usage: usage.STORAGE | usage.COPY_SRC | usage.COPY_DST,
  });
  device.queue.writeBuffer(buffer, 0, data);
  return (ort.Tensor as any).fromGpuBuffer(buffer, {
    dataType: 'float32',
    dims: t.dims,
    dispose: () => buffer.destroy(),
  }) as OrtTensorLike;
}

const differences = new WeakMap<object, Promise<any>>();

/** the runtime's GPUDevice as last seen, and the devices whose `lost` promise resolved, per runtime module */
const devices = new WeakMap<object, { current?: any; lost: WeakSet<object> }>();

/** note the runtime's device (set anew by the first session on a new one): its loss is watched */
async function watchDevice(ort: OrtModule): Promise<void> {
  let w = devices.get(ort);
  if (!w) devices.set(ort, (w = { lost: new WeakSet() }));
  const d = await ort.env?.webgpu?.device;
  if (!d || d === w.current) return;
  w.current = d;
  const lost = w.lost;
  void d.lost?.then(() => lost.add(d));
}

const deviceLost = (ort: OrtModule): boolean => {
  const w = devices.get(ort);
  return !!w?.current && w.lost.has(w.current);
};

/** after a device loss: what this module keeps on the device dropped (its sessions released), for a new device */
async function resetWeb(ort: OrtModule): Promise<void> {
  for (const t of scalars.get(ort)?.values() ?? []) (await t.catch(() => undefined))?.dispose?.();
  scalars.delete(ort);
  const d = differences.get(ort);
  differences.delete(ort);
  await (await d?.catch(() => undefined))?.release?.().catch(() => undefined);
  await resetReaders(ort);
}

/** differenceGraph on onnxruntime-web's WebGPU device, its output left there */
async function gpuDifference(ort: OrtModule, feeds: Record<string, OrtTensorLike>): Promise<OrtTensorLike> {
  let s = differences.get(ort);
  if (!s) {
    s = ort.InferenceSession.create(differenceGraph(), {
      executionProviders: ['webgpu'],
      preferredOutputLocation: 'gpu-buffer',
    });
    s.catch(() => differences.delete(ort));
    differences.set(ort, s);
  }
  return (await (await s).run(feeds, ['y'])).y;
}

/** The run of a WebGPU session whose outputs are 'gpu-buffer' (see above). */
function webDeviceRun(ort: OrtModule, session: any): EngineSession['run'] {
  return async (feeds, fetches, opts = {}) => {
    for (const [k, t] of Object.entries(feeds)) {
      if (t.location && t.location !== 'cpu') continue; // on the GPU already (a KV cache): its data is not readable
      const d = t.data;
      if (d instanceof Float32Array && d.length === 1 && t.dims.length <= 1) feeds[k] = await gpuScalar(ort, d[0]);
    }
    const out: Record<string, OrtTensorLike> = await session.run(feeds, fetches);
    const keep = new Set(opts.keep ?? []);
    const onGpu = (n: string) => out[n].location === 'gpu-buffer' && !keep.has(n);
    const gather = opts.gather;
    const gathered = gather ? fetches.filter((n) => gather.axes[n] !== undefined && onGpu(n)) : [];
    if (gathered.length) {
      const specs = gathered.map((n) => ({ type: out[n].type ?? 'float32', axis: gather!.axes[n] }));
      const values = await readBack(
        ort,
        gathered.map((n) => out[n]),
        specs,
        gather!.positions,
      );
      gathered.forEach((n, i) => {
        out[n].dispose?.();
        out[n] = values[i];
      });
    }
    for (const n of fetches) {
      const t = out[n] as any;
      if (onGpu(n)) out[n] = new ort.Tensor(t.type, await t.getData(true), t.dims);
    }
    return out;
  };
}

/**
 * One piece's bytes: a view of a file in memory, else read by range (IndexedDB chunks, a file on
 * disk); a widen piece's widened to float32 (pieces.ts pieceData).
 */
async function pieceBytes(weights: ReadableWeightSet, p: Piece): Promise<Uint8Array> {
  const bytes = weights.files.get(p.file);
  if (bytes) return pieceData(p, bytes.subarray(p.start, p.end));
  const ranged = weights.ranged?.get(p.file);
  const data = ranged
    ? await ranged.readAsync(p.start, p.end - p.start)
    : weights.readRange?.(p.file, p.start, p.end - p.start);
  return pieceData(p, checked(p, p.start, p.end - p.start, data));
}

function checked(p: Piece, start: number, length: number, data: Uint8Array | undefined): Uint8Array {
  if (!data || data.byteLength !== length)
    throw new LoupeError(
      'SAFETENSORS_TRUNCATED',
      `${p.file}: could not read bytes ${start}–${start + length}.`,
      'The file is damaged or incomplete: clear the cache and load the model again.',
      { file: p.file },
    );
  return data;
}

/** reads `length` bytes at `offset` into `into` (that length) where given, else into a buffer of its own */
type SyncRead = (offset: number, length: number, into?: Uint8Array) => Uint8Array;

/**
 * A synchronous range reader of a file not held in memory, where there is one: IndexedDB chunks
 * in a worker (read into the session's scratch), a file on disk (a buffer per tensor: Node frees
 * each at once, and a scratch left live there raised the load's peak).
 */
function syncReader(
  weights: ReadableWeightSet,
  file: string,
  widen = false,
): { read: SyncRead; scratch: boolean } | undefined {
  const bytes = weights.files.get(file);
  // in memory: the piece is a view, nothing to save, unless it is widened (then tensor by tensor too)
  if (bytes) return widen ? { read: (o, n) => bytes.subarray(o, o + n), scratch: true } : undefined;
  const ranged = weights.ranged?.get(file);
  if (ranged) return { read: (o, n, into) => ranged.read(o, n, into), scratch: true };
  const read = weights.readRange;
  if (read && weights.paths.has(file)) return { read: (o, n) => read(file, o, n), scratch: false };
  return undefined;
}

interface LazyPiece {
  bytes: Uint8Array;
  /** bytes handed out so far */
  served: number;
  /** the first read that failed (onnxruntime-web swallows it into a generic session error) */
  error?: unknown;
}

/** the buffer every lazy piece of one session reads its tensors into: as big as the biggest such tensor read so far */
interface Scratch {
  buf: Uint8Array;
}
/**
 * A tensor above this is read into a buffer of its own, garbage once copied: kept as scratch, a
 * table such as GPT-2's 154 MB embedding would stay live for the whole session creation.
 */
const SCRATCH_MAX_BYTES = 64 << 20;

/**
 * A piece whose bytes are read only as onnxruntime-web copies each tensor out of it. onnxruntime-web
 * keeps every external data buffer until the session exists, and (1.30) copies an initializer out
 * of its buffer as `buffer.subarray(offset, offset + length)` into its heap (HEAPU8.set) or a GPU
 * buffer (queue.writeBuffer, which copies at the call), after checking the range against
 * `byteLength`. A piece read whole costs the weights' bytes a second time in JS memory while the
 * session is created, and until garbage collection after it (bench/memory.ts shows those buffers
 * beside the heap). This piece is an empty Uint8Array (so onnxruntime-web takes it as bytes) whose
 * byteLength is the range's and whose subarray reads that range from where the file is kept, one
 * tensor at a time, into `scratch` where the reader takes one: the copy is made before the next
 * tensor is asked for, so one buffer serves them all (but those above SCRATCH_MAX_BYTES) and the
 * load leaves no tensor-sized garbage waiting for collection (in Chromium it piled up).
 */
function lazyPiece(p: Piece, read: SyncRead, scratch: Scratch | null): LazyPiece {
  const lazy: LazyPiece = { bytes: new Uint8Array(0), served: 0 };
  // a widen piece is handed over as float32: twice its range, each tensor read as BF16 and widened
  const k = p.widen ? 2 : 1;
  const size = (p.end - p.start) * k;
  Object.defineProperties(lazy.bytes, {
    byteLength: { value: size },
    subarray: {
      value: (begin = 0, end = size) => {
        try {
          const n = end - begin;
          const fits = scratch && n <= SCRATCH_MAX_BYTES;
          if (fits && scratch.buf.byteLength < n) scratch.buf = new Uint8Array(n);
          const into = fits ? scratch.buf.subarray(0, n) : undefined;
          const at = p.start + begin / k;
          const data = p.widen
            ? pieceData(p, checked(p, at, n / k, read(at, n / k)), into)
            : checked(p, at, n, read(at, n, into));
          lazy.served += data.byteLength;
          return data;
        } catch (e) {
          lazy.error ??= e;
          throw e;
        }
      },
    },
  });
  return lazy;
}

/**
 * onnxruntime-web (browser worker, or WASM in Node): weights go in as external data buffers in
 * pieces under 2 GiB (pieces.ts). A piece of a file on disk or in IndexedDB is read tensor by
 * tensor while onnxruntime-web copies it (lazyPiece); one that cannot be read synchronously, or
 * whose tensors onnxruntime-web did not take through `subarray` (another version might not), is
 * read whole first, by range (never a whole file at once); a file in memory is passed as views.
 * Once `create` returns no reference to a piece is left.
 */
export function webSessionFactory(
  ort: OrtModule,
  backend: 'webgpu' | 'wasm',
  gpu?: GpuCaps,
  extraOptions: Record<string, any> = {},
  inForward = true,
): SessionFactory {
  return {
    backend,
    ort,
    ...(backend === 'webgpu' && gpu ? { gpu } : {}),
    // the provider runs If on the GPU: DLA's readout and the logit lens in the forward graph, on its weights
    // (`inForward` false: JSEP, whose Gemm fails inside that If with "invalid shape specified")
    ...(backend === 'webgpu' && inForward ? { readoutInForward: true } : {}),
    async helper(bytes, onDevice, keep) {
      const ep = onDevice && backend === 'webgpu' ? 'webgpu' : 'wasm';
      const out = keep && ep === 'webgpu' ? { preferredOutputLocation: 'gpu-buffer' } : {};
      const s = await ort.InferenceSession.create(bytes, { executionProviders: [ep], ...out });
      return trackedWeb(ort, ep, s, undefined);
    },
    ...(backend === 'webgpu'
      ? {
          upload: (t: OrtTensorLike) => gpuUpload(ort, t),
          difference: (feeds: Record<string, OrtTensorLike>) => gpuDifference(ort, feeds),
          deviceLost: () => deviceLost(ort),
          // the native provider makes a new device once no session holds the old one; JSEP never
          // does (model.ts recoverDevice finds its device still lost: the page restarts the worker)
          reset: () => resetWeb(ort),
        }
      : {}),
    async create(graph, weights) {
      const { graphBytes, pieces } = pieceGraph(graph.bytes);
      const options = {
        executionProviders: [backend],
        graphOptimizationLevel: 'all',
        // WebGPU: every output on the GPU until read (webDeviceRun)
        ...(backend === 'webgpu' ? { preferredOutputLocation: 'gpu-buffer' } : {}),
        ...graphSessionOptions(graph, extraOptions),
      };
      const scratch: Scratch = { buf: new Uint8Array(0) };
      const lazy = pieces.map((p) => {
        const r = syncReader(weights, p.file, p.widen);
        return r && lazyPiece(p, r.read, r.scratch ? scratch : null);
      });
      if (lazy.some(Boolean)) {
        const made = await ort.InferenceSession.create(graphBytes, {
          ...options,
          externalData: await Promise.all(
            pieces.map(async (p, i) => ({ path: p.path, data: lazy[i]?.bytes ?? (await pieceBytes(weights, p)) })),
          ),
        }).catch((e) => {
          if (!lazy.some((l) => l?.error)) throw e; // not a read of ours: the session's own error
          return null; // a read failed (e.g. Blobs outside a worker): read the pieces whole below
        });
        if (made && pieces.every((p, i) => !lazy[i] || lazy[i]!.served >= p.used)) {
          if (backend === 'webgpu') await watchDevice(ort);
          return trackedWeb(ort, backend, made, 'lazy');
        }
        await made?.release();
      }
      const externalData: { path: string; data: Uint8Array }[] = [];
      for (const p of pieces) externalData.push({ path: p.path, data: await pieceBytes(weights, p) });
      const session = await ort.InferenceSession.create(graphBytes, { ...options, externalData });
      externalData.length = 0; // should the runtime keep the options object, it keeps no piece
      if (backend === 'webgpu') await watchDevice(ort);
      return trackedWeb(ort, backend, session, 'whole');
    },
  };
}

export { wrap as wrapOrtSession };
