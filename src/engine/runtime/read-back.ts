/**
 * Reading values kept on the GPU back into JS memory, on WebGPU in Node (src/node/device-session.ts)
 * and in the page (runtime/ort-session.ts): the tensors are fed to a small session on the same
 * device whose outputs are in CPU memory, each copied (Identity) or gathered at some positions along
 * one axis (Gather: RunOptions.hookPositions), all in one run. One session per signature, kept per
 * onnxruntime module.
 */
import { OnnxGraph } from '../graph/onnx-builder';

/** what of an onnxruntime module and its tensors this needs (ort-session.ts OrtModule, OrtTensorLike; it imports this file) */
interface Ort {
  InferenceSession: { create(model: any, options?: any): Promise<any> };
  Tensor: new (type: any, data: any, dims: readonly number[]) => Tensor;
}
interface Tensor {
  dims: readonly number[];
  data: unknown;
  type?: string;
}

const ELEM: Record<string, 'float' | 'int64'> = { float32: 'float', int64: 'int64' };

/** one tensor to read back: its dtype, and the axis it is taken at `positions` along (none: whole) */
export interface ReadSpec {
  type: string;
  axis?: number;
}

/** inputs i0…, each copied (or gathered at the positions `at` along its axis) to output o0… */
function readerGraph(specs: ReadSpec[]): Uint8Array {
  const g = new OnnxGraph(() => '');
  const at = specs.some((r) => r.axis !== undefined) ? g.input('at', 'int64', ['P']) : '';
  specs.forEach((r, i) => {
    const elem = ELEM[r.type];
    if (!elem) throw new Error(`no read-back for a ${r.type} tensor`);
    const x = g.input(`i${i}`, elem);
    if (r.axis === undefined) g.identity(x, `o${i}`);
    else g.rename(g.o('Gather', [x, at], { axis: r.axis }), `o${i}`);
    g.output(`o${i}`, elem);
  });
  return g.encode();
}

const readers = new WeakMap<object, Map<string, Promise<any>>>();

/** After a device loss: the reading sessions released, to be made again on the next device (runtime/device-lost.ts). */
export async function resetReaders(ort: Ort): Promise<void> {
  const byKey = readers.get(ort);
  readers.delete(ort);
  for (const s of byKey?.values() ?? []) await (await s.catch(() => undefined))?.release?.().catch(() => undefined);
}

/** Device tensors read back in one run: their values (at `positions` where a spec has an axis) in JS memory, in order. */
export async function readBack<T extends Tensor>(
  ort: Ort,
  tensors: T[],
  specs: ReadSpec[],
  positions?: number[],
): Promise<T[]> {
  if (tensors.length === 0) return [];
  const key = specs.map((r) => `${r.type}@${r.axis ?? ''}`).join(',');
  let byKey = readers.get(ort);
  if (!byKey) readers.set(ort, (byKey = new Map()));
  const cache = byKey;
  let s = cache.get(key);
  if (!s) {
    s = ort.InferenceSession.create(readerGraph(specs), { executionProviders: ['webgpu'], logSeverityLevel: 3 });
    s.catch(() => cache.delete(key));
    cache.set(key, s);
  }
  const session = await s;
  const feeds: Record<string, Tensor> = {};
  tensors.forEach((t, i) => (feeds[`i${i}`] = t));
  if (specs.some((r) => r.axis !== undefined))
    feeds.at = new ort.Tensor('int64', BigInt64Array.from(positions!, BigInt), [positions!.length]);
  const out = await session.run(
    feeds,
    tensors.map((_, i) => `o${i}`),
  );
  return tensors.map((_, i) => out[`o${i}`]);
}
