/**
 * Opening and reading the files of a model folder or of the caches: only regular files. A FIFO,
 * a device or a socket in their place would block an open or a read forever (a FIFO's open waits
 * for a writer), so every open is non-blocking and checked with fstat before a byte is read, and
 * anything but a regular file is NOT_A_FILE. `within`: the folder a file must resolve into (a
 * cache's root), so a symlink may point inside the cache, never out of it. Reads of a whole file
 * stop at a deadline (CAPS.idleTimeoutS: a disk that gives nothing that long is stalled).
 */
import { closeSync, constants, fstatSync, openSync, promises as fsp, realpathSync, type Stats } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import * as path from 'node:path';
import { CAPS } from '../engine/caps';
import { LoupeError } from '../engine/errors';

/** read-only and non-blocking: a FIFO opens at once (and is then refused) instead of waiting */
const FLAGS = constants.O_RDONLY | (constants.O_NONBLOCK ?? 0);

function kindOf(s: Stats): string {
  return s.isFIFO()
    ? 'a named pipe'
    : s.isSocket()
      ? 'a socket'
      : s.isCharacterDevice() || s.isBlockDevice()
        ? 'a device'
        : s.isDirectory()
          ? 'a folder'
          : 'not a regular file';
}

function notAFile(p: string, what: string): LoupeError {
  return new LoupeError(
    'NOT_A_FILE',
    `${p} is ${what}, not a regular file; Loupe reads only regular files from a model folder or its cache.`,
    'Delete it (a cache entry deleted is downloaded again at the next load), or put the real file there.',
    { path: p },
  );
}

/** NOT_A_FILE unless `p` resolves inside `within` (a cache's root) */
function checkWithin(p: string, within: string | undefined): void {
  if (within === undefined) return;
  let real: string;
  let root: string;
  try {
    [real, root] = [realpathSync(p), realpathSync(within)];
  } catch {
    return; // missing: the open that follows says so
  }
  if (real !== root && !real.startsWith(root.endsWith(path.sep) ? root : root + path.sep))
    throw notAFile(p, `a link to ${real}, outside the cache ${within}`);
}

/** fstat of an open file; NOT_A_FILE (closing it) unless it is a regular file */
function regular(p: string, s: Stats, close: () => void): Stats {
  if (s.isFile()) return s;
  close();
  throw notAFile(p, kindOf(s));
}

/** open `p` for reading, synchronously; throws the fs error (ENOENT…) or NOT_A_FILE */
export function openRegularSync(p: string, within?: string): { fd: number; size: number } {
  checkWithin(p, within);
  const fd = openSync(p, FLAGS);
  return { fd, size: regular(p, fstatSync(fd), () => closeSync(fd)).size };
}

/** open `p` for reading; throws the fs error (ENOENT…) or NOT_A_FILE */
export async function openRegular(p: string, within?: string): Promise<{ fh: FileHandle; size: number }> {
  checkWithin(p, within);
  const fh = await fsp.open(p, FLAGS);
  return { fh, size: regular(p, await fh.stat(), () => void fh.close()).size };
}

/** whether `p` is a regular file (after links); NOT_A_FILE when it exists as anything else */
export function isRegularFile(p: string, within?: string): boolean {
  let fd: number;
  try {
    ({ fd } = openRegularSync(p, within));
  } catch (e) {
    if (e instanceof LoupeError) throw e;
    return false;
  }
  closeSync(fd);
  return true;
}

/**
 * The whole of a regular file, read by its open handle before the deadline; `maxBytes`: past it
 * `tooLarge(size)` is thrown before anything is read.
 */
export async function readRegular(
  p: string,
  opts: { within?: string; maxBytes?: number; tooLarge?: (size: number) => Error; signal?: AbortSignal } = {},
): Promise<Uint8Array> {
  const { fh, size } = await openRegular(p, opts.within);
  try {
    if (opts.maxBytes != null && size > opts.maxBytes)
      throw opts.tooLarge?.(size) ?? new LoupeError('TOO_LARGE', `${p} has ${size} bytes, over ${opts.maxBytes}.`);
    const deadline = AbortSignal.timeout(CAPS.idleTimeoutS * 1000);
    const signal = opts.signal ? AbortSignal.any([opts.signal, deadline]) : deadline;
    try {
      const b = await fh.readFile({ signal });
      return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
    } catch (e) {
      if (deadline.aborted && !opts.signal?.aborted)
        throw new LoupeError(
          'DEADLINE_EXCEEDED',
          `Reading ${p} took more than ${CAPS.idleTimeoutS} s (idleTimeoutS); the disk under it may be stalled.`,
          undefined,
          { path: p },
        );
      throw e;
    }
  } finally {
    await fh.close();
  }
}

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
