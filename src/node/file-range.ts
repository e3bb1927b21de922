/** Reading a byte range of an open file, for the folder source and the disk cache. */
import type { FileHandle } from 'node:fs/promises';

/** bytes [offset, offset + length) of a file `size` bytes long, cut short where the file ends first */
export async function readAt(fh: FileHandle, offset: number, length: number, size: number): Promise<Uint8Array> {
  const out = new Uint8Array(Math.max(0, Math.min(length, size - offset)));
  let got = 0;
  while (got < out.byteLength) {
    const { bytesRead } = await fh.read(out, got, out.byteLength - got, offset + got);
    if (bytesRead === 0) break;
    got += bytesRead;
  }
  return out.subarray(0, got);
}
