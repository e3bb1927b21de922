/**
 * A GPU device lost mid-run (a driver reset, the browser's GPU watchdog, `GPUDevice.destroy()`).
 * What each runtime does then, read in onnxruntime 1.30's source:
 *  - onnxruntime-node's WebGPU provider (Dawn) only logs the loss; work on a lost device is a
 *    no-op, and the first read back fails ("Failed to download data from buffer. wgpu::MapAsyncStatus
 *    value: …", Dawn's "… is lost."). Its default context (one device) is reference-counted by the
 *    sessions on it and dropped with the last one: sessions made after every old one is released
 *    get a new device.
 *  - onnxruntime-web's native WebGPU provider works the same way in the worker's WASM module (its
 *    `env.webgpu.device` is set again to the new device by the first session on it); JSEP makes its
 *    device once per module and never again, so it recovers only in a new worker.
 *  - The browser's GPUDevice says so itself: its `lost` promise resolves (SessionFactory.deviceLost).
 * So every session a factory makes is guarded here: a run failing on a lost device throws
 * DEVICE_LOST, which the model answers by releasing every session and value on the device and
 * making them again (model.ts recoverDevice), and an operation by running once more (ops/types.ts).
 */
import { LoupeError } from '../errors';
import type { EngineSession, SessionFactory } from './ort-session';

/** what Dawn, onnxruntime and the browser's WebGPU say once the device is gone */
const LOST = /device (is |was |has been )?lost|\bis lost\b|Failed to download data from buffer|DeviceLost/i;

/** whether a failure is the device's loss (its message), or `lost` says the device is gone */
export function isDeviceLost(e: unknown, lost = false): boolean {
  if (lost) return true;
  if (e instanceof LoupeError) return e.code === 'DEVICE_LOST';
  const msg = e instanceof Error ? e.message : String(e);
  return LOST.test(msg);
}

/** what a document and the page say after a recovered loss */
export const DEVICE_LOST_NOTICE =
  'The GPU device was lost during this run; Loupe recreated its onnxruntime sessions and ran it again.';

const HINT =
  'The GPU driver or the browser reset the device (a driver update, another program, a run too long for ' +
  "the GPU's watchdog). Run again; if it keeps happening, use another backend: --backend node " +
  "(or wasm in the page's model panel).";

/** DEVICE_LOST: `again` after a recovery in the same job, which is then not tried a second time */
export function deviceLostError(cause: string, again = false): LoupeError {
  return new LoupeError(
    'DEVICE_LOST',
    again
      ? `The GPU device was lost again after Loupe recreated its sessions (${cause}).`
      : `The GPU device was lost during the run (${cause}).`,
    HINT,
    { again },
  );
}

function guarded(session: EngineSession, factory: SessionFactory): EngineSession {
  const lost = () => factory.deviceLost?.() ?? false;
  return {
    ...session,
    async run(feeds, fetches, opts) {
      // a device already lost runs nothing (a lost device's work is a no-op): no run, no values
      if (lost()) throw deviceLostError('the device was lost before this run');
      try {
        return await session.run(feeds, fetches, opts);
      } catch (e) {
        // a GPUDevice's `lost` resolves a task or two after the failure it caused
        if (!isDeviceLost(e) && factory.deviceLost) await new Promise((r) => setTimeout(r, 50));
        if (isDeviceLost(e, lost())) throw deviceLostError((e as Error)?.message ?? String(e));
        throw e;
      }
    },
    release: () => session.release(),
  };
}

/** The factory with every session it makes guarded (a run on a lost device throws DEVICE_LOST). */
export function guardDevice(factory: SessionFactory): SessionFactory {
  const { create, helper, upload, difference } = factory;
  const lost = () => factory.deviceLost?.() ?? false;
  /** a value put on the device outside a session run (an upload, a difference) */
  const onDevice =
    <A, R>(f: (a: A) => Promise<R>) =>
    async (a: A): Promise<R> => {
      try {
        return await f.call(factory, a);
      } catch (e) {
        if (isDeviceLost(e, lost())) throw deviceLostError((e as Error)?.message ?? String(e));
        throw e;
      }
    };
  return {
    ...factory,
    create: async (graph, weights) => guarded(await create.call(factory, graph, weights), factory),
    ...(helper
      ? {
          helper: async (b: Uint8Array, d: boolean, keep?: boolean) =>
            guarded(await helper.call(factory, b, d, keep), factory),
        }
      : {}),
    ...(upload ? { upload: onDevice(upload) } : {}),
    ...(difference ? { difference: onDevice(difference) } : {}),
  };
}
