/**
 * The engine worker's synchronous Blob reader, for weight files cached in IndexedDB as Blob chunks
 * (source/chunked-file.ts). onnxruntime-web takes a session's weights one tensor at a time through
 * a synchronous call (runtime/ort-session.ts lazyPiece), so the read must be synchronous, and
 * FileReaderSync, the one synchronous reader a worker has, returns every read as a new ArrayBuffer:
 * a model's worth of them waits for garbage collection while the session is made. Here a helper
 * worker (blob-read.worker.ts) streams the range into a shared window while this worker waits on
 * Atomics, and the window is copied straight into the caller's buffer: nothing is allocated per read.
 *
 * Without cross-origin isolation (no SharedArrayBuffer), before the helper has started, or after it
 * failed or took over READ_TIMEOUT_MS, reads go through FileReaderSync.
 */
import { canReadBlobsSync, fileReaderSync, type BlobReaderSync } from '../src/engine/source/chunked-file';
import type { BlobReadCounts } from './protocol';

const WINDOW_BYTES = 16 << 20;
/** a read the helper has not answered by then is taken as lost (FileReaderSync from then on): never a hung worker */
const READ_TIMEOUT_MS = 30_000;
const DONE = 1;

/** how the cached Blob ranges read since the worker started were read (the memory report's blobReads) */
const counts: BlobReadCounts = { shared: 0, fileReaderSync: 0 };
export const blobReadCounts = (): BlobReadCounts => ({ ...counts });

/** FileReaderSync, counted */
const viaFileReader: BlobReaderSync = (blob, start, into) => {
  counts.fileReaderSync++;
  return fileReaderSync(blob, start, into);
};

export function workerBlobReader(): BlobReaderSync {
  const g = globalThis as { crossOriginIsolated?: boolean; Worker?: typeof Worker };
  if (!g.crossOriginIsolated || !g.Worker || !canReadBlobsSync() || typeof Atomics.wait !== 'function')
    return viaFileReader;
  let helper: Worker;
  try {
    helper = new Worker(new URL('./blob-read.worker.ts', import.meta.url), { type: 'module' });
  } catch {
    return viaFileReader;
  }
  const ctl = new Int32Array(new SharedArrayBuffer(8));
  const win = new Uint8Array(new SharedArrayBuffer(WINDOW_BYTES));
  let ready = false,
    lost = false;
  const lose = () => {
    lost = true;
    helper.terminate();
  };
  helper.onmessage = (e) => {
    if (e.data === 'ready') ready = true;
  };
  helper.onerror = lose;
  helper.postMessage({ ctl: ctl.buffer, win: win.buffer });

  return (blob, start, into) => {
    if (!ready || lost) return viaFileReader(blob, start, into);
    for (let at = 0; at < into.byteLength;) {
      const n = Math.min(WINDOW_BYTES, into.byteLength - at);
      Atomics.store(ctl, 0, 0);
      helper.postMessage({ blob, start: start + at, end: start + at + n });
      Atomics.wait(ctl, 0, 0, READ_TIMEOUT_MS);
      if (Atomics.load(ctl, 0) !== DONE || Atomics.load(ctl, 1) !== n) {
        lose();
        return viaFileReader(blob, start, into);
      }
      into.set(win.subarray(0, n), at);
      at += n;
    }
    counts.shared++;
    return into.byteLength;
  };
}
