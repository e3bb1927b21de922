/**
 * The engine worker's Blob reader thread (workers/blob-reader.ts). The engine worker asks for one
 * range of a cached Blob at a time and blocks on `ctl` until this worker has copied the bytes into
 * the shared window `win`; the stream's own buffer is reused between reads, so reading a model's
 * weights leaves no garbage here either.
 *
 *   ← { ctl: SharedArrayBuffer, win: SharedArrayBuffer }   → 'ready'
 *   ← { blob, start, end }  (end − start ≤ win's size)     → ctl = [DONE | FAILED, bytes], notified
 */
const DONE = 1,
  FAILED = 2;
const STREAM_BYTES = 4 << 20;

let ctl: Int32Array | undefined;
let win: Uint8Array | undefined;
let spare = new ArrayBuffer(STREAM_BYTES);

/** `blob`'s bytes into win, through a BYOB reader over `spare` where Blob streams are byte streams */
async function readInto(blob: Blob, win: Uint8Array): Promise<number> {
  let reader: ReadableStreamBYOBReader;
  try {
    reader = blob.stream().getReader({ mode: 'byob' });
  } catch {
    const bytes = new Uint8Array(await blob.arrayBuffer()); // not a byte stream here: one buffer per read
    win.set(bytes);
    return bytes.byteLength;
  }
  let at = 0;
  for (;;) {
    const { value, done } = await reader.read(
      new Uint8Array(spare, 0, Math.max(1, Math.min(STREAM_BYTES, win.byteLength - at))),
    );
    if (value) {
      spare = value.buffer as ArrayBuffer;
      if (at + value.byteLength > win.byteLength) throw new Error('the Blob is longer than asked');
      win.set(value, at);
      at += value.byteLength;
    }
    if (done) return at;
  }
}

self.onmessage = async (e: MessageEvent) => {
  const m = e.data as { ctl?: SharedArrayBuffer; win?: SharedArrayBuffer; blob?: Blob; start?: number; end?: number };
  if (m.ctl && m.win) {
    ctl = new Int32Array(m.ctl);
    win = new Uint8Array(m.win);
    self.postMessage('ready');
    return;
  }
  if (!ctl || !win || !(m.blob instanceof Blob)) return;
  let state = FAILED,
    n = 0;
  try {
    n = await readInto(m.blob.slice(m.start, m.end), win);
    state = DONE;
  } catch {
    /* FAILED: the engine worker reads the range another way */
  }
  Atomics.store(ctl, 1, n);
  Atomics.store(ctl, 0, state);
  Atomics.notify(ctl, 0);
};
