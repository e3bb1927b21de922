/**
 * A weight file as the list of chunks a ByteCache stored it in (IndexedDB: CHUNK_BYTES each), read
 * by byte range without ever assembling the file in one ArrayBuffer. The same RangedFile shape as
 * a file on disk in Node (src/node/load-files-node.ts diskFile).
 *
 * A chunk is a Blob or bytes. In Chromium a Blob read back from IndexedDB is a handle to bytes the
 * browser keeps on disk, so a file of Blob chunks costs no JS memory: `read` copies just the range
 * asked for, into the caller's buffer where it gives one, through a synchronous Blob reader (the
 * engine worker's own, workers/blob-reader.ts, else FileReaderSync: only workers can read Blobs
 * synchronously, and the engine runs in one), `readAsync` the same without blocking. Byte chunks
 * (entries written where Blobs are not stored: Node's fake IndexedDB, or an older Loupe) are read
 * from memory.
 *
 *   const f = chunkedFile(chunks, 32 << 20, size);   f.read(offset, length)   await f.readAsync(offset, length)
 */
import { LoupeError } from '../errors';
import type { RangedFile } from '../safetensors-types';

export type Chunk = Blob | Uint8Array;

/** Reads a Blob's bytes from `start` into all of `into`, synchronously; returns how many it read. */
export type BlobReaderSync = (blob: Blob, start: number, into: Uint8Array) => number;

/** FileReaderSync (workers only): every read is a fresh ArrayBuffer, then copied into `into` */
export const fileReaderSync: BlobReaderSync = (blob, start, into) => {
  const FRS = (globalThis as { FileReaderSync?: new () => { readAsArrayBuffer(b: Blob): ArrayBuffer } }).FileReaderSync;
  if (!FRS)
    throw new LoupeError(
      'INTERNAL',
      'A weight file stored as Blobs can only be read synchronously in a worker (FileReaderSync).',
      'Load the model in the engine worker.',
    );
  const bytes = new Uint8Array(new FRS().readAsArrayBuffer(blob.slice(start, start + into.byteLength)));
  into.set(bytes.subarray(0, into.byteLength));
  return bytes.byteLength;
};

/** whether Blob chunks can be read synchronously here (a worker) */
export const canReadBlobsSync = (): boolean =>
  typeof (globalThis as { FileReaderSync?: unknown }).FileReaderSync === 'function';

export function chunkedFile(
  chunks: readonly Chunk[],
  chunkBytes: number,
  size: number,
  readBlob: BlobReaderSync = fileReaderSync,
): RangedFile {
  const len = (c: Chunk) => (c instanceof Uint8Array ? c.byteLength : c.size);
  let total = 0;
  chunks.forEach((c, i) => {
    if (i < chunks.length - 1 && len(c) !== chunkBytes)
      throw new LoupeError(
        'INTERNAL',
        `Chunk ${i} holds ${len(c)} bytes, not ${chunkBytes}.`,
        'Clear the cache and load the model again.',
      );
    total += len(c);
  });
  if (total !== size)
    throw new LoupeError(
      'INTERNAL',
      `The cached chunks hold ${total} bytes, not the file's ${size}.`,
      'Clear the cache and load the model again.',
    );

  /** the pieces of chunks that cover [offset, offset + length), clamped to the file */
  const parts = (offset: number, length: number) => {
    const end = Math.min(offset + length, size);
    const out: { chunk: Chunk; from: number; to: number; at: number }[] = [];
    if (!(offset >= 0) || end <= offset) return { out, n: 0 };
    for (let i = Math.floor(offset / chunkBytes); i < chunks.length && i * chunkBytes < end; i++) {
      const base = i * chunkBytes;
      const from = Math.max(offset, base) - base,
        to = Math.min(end, base + len(chunks[i])) - base;
      out.push({ chunk: chunks[i], from, to, at: base + from - offset });
    }
    return { out, n: end - offset };
  };

  return {
    size,
    read(offset, length, into) {
      const { out, n } = parts(offset, length);
      const bytes = into && into.byteLength >= n ? into.subarray(0, n) : new Uint8Array(n);
      for (const p of out) {
        const dest = bytes.subarray(p.at, p.at + p.to - p.from);
        if (p.chunk instanceof Uint8Array) dest.set(p.chunk.subarray(p.from, p.to));
        else {
          const got = readBlob(p.chunk, p.from, dest);
          if (got !== dest.byteLength)
            throw new LoupeError(
              'SAFETENSORS_TRUNCATED',
              `Read ${got} of ${dest.byteLength} bytes of a cached chunk.`,
              'Clear the cache and load the model again.',
            );
        }
      }
      return bytes;
    },
    async readAsync(offset, length) {
      const { out, n } = parts(offset, length);
      if (out.every((p) => p.chunk instanceof Uint8Array)) return this.read(offset, length);
      // One Blob of slices is read into one buffer: no per-chunk copies
      const blob = new Blob(
        out.map((p) =>
          p.chunk instanceof Uint8Array ? p.chunk.subarray(p.from, p.to) : p.chunk.slice(p.from, p.to),
        ) as BlobPart[],
      );
      const bytes = new Uint8Array(await blob.arrayBuffer());
      if (bytes.byteLength !== n)
        throw new LoupeError(
          'INTERNAL',
          `Read ${bytes.byteLength} of ${n} bytes from the cache.`,
          'Clear the cache and load the model again.',
        );
      return bytes;
    },
  };
}
