/**
 * A model in a local folder (Node only): config.json, tokenizer.json, model.safetensors, ...
 *
 *   const src = new FolderSource('/path/to/model');
 *   src.localPath('model.safetensors')  // absolute path, for ORT external data and header-only reads
 *
 * A missing folder is MODEL_NOT_FOUND; a missing file FILE_NOT_FOUND (details.modelExists = true,
 * so loadModelFiles reports a missing config.json as MISSING_CONFIG); anything there but a regular
 * file (a FIFO, a device) is NOT_A_FILE (file-range.ts).
 */
import { statSync } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import * as path from 'node:path';
import { fileTooLarge } from '../engine/caps';
import { LoupeError } from '../engine/errors';
import type { FetchOptions, ModelRef, ModelSource, RangeRead } from '../engine/source/types';
import { checkLocalPath, type LocalAccess } from './local-access';
import { openRegular, readAt, readRegular } from './file-range';

export class FolderSource implements ModelSource {
  readonly ref: ModelRef;
  readonly dir: string;

  /**
   * @param access which folders the caller may read ('any' for the CLI's own user); checked here,
   *   before the folder is touched, and again for every file (a symlink inside may point out)
   * @param spec the caller's words for the folder, for the refusal message
   */
  constructor(
    dir: string,
    private access: LocalAccess = 'any',
    spec = dir,
  ) {
    this.dir = path.resolve(dir.startsWith('~') ? path.join(process.env.HOME ?? '', dir.slice(1)) : dir);
    this.ref = { kind: 'folder', id: this.dir, revision: '' };
    checkLocalPath(this.dir, access, spec);
  }

  /** absolute path of a file inside the folder (no escaping it with ..) */
  localPath(file: string): string {
    const p = path.resolve(this.dir, file);
    if (p !== this.dir && !p.startsWith(this.dir + path.sep)) {
      throw new LoupeError('BAD_INPUT', `File name ${JSON.stringify(file)} leaves the model folder.`);
    }
    checkLocalPath(p, this.access, p);
    return p;
  }

  /** throws MODEL_NOT_FOUND unless the folder exists */
  checkFolder(): void {
    let ok = false;
    try {
      ok = statSync(this.dir).isDirectory();
    } catch {
      ok = false;
    }
    if (!ok) {
      throw new LoupeError(
        'MODEL_NOT_FOUND',
        `No model folder at ${this.dir}.`,
        'Give the path of a folder holding config.json, tokenizer.json and the safetensors weights, or a Hub id like owner/name.',
        { path: this.dir },
      );
    }
  }

  async fetchFile(file: string, opts: FetchOptions = {}): Promise<Uint8Array | null> {
    if (opts.signal?.aborted) throw new LoupeError('ABORTED', 'The operation was cancelled.');
    this.checkFolder();
    const p = this.localPath(file);
    let out: Uint8Array;
    try {
      const tooLarge = (size: number) => fileTooLarge(file, size, opts.maxBytes!, true);
      out = await readRegular(p, { maxBytes: opts.maxBytes, tooLarge, signal: opts.signal });
    } catch (e) {
      if (e instanceof LoupeError) throw e;
      const code = (e as NodeJS.ErrnoException).code;
      if ((e as Error).name === 'AbortError') throw new LoupeError('ABORTED', 'The operation was cancelled.');
      if (code === 'ENOENT' && opts.optional) return null;
      throw this.readError(file, p, e);
    }
    opts.onProgress?.({ file, loaded: out.byteLength, total: out.byteLength, done: true });
    return out;
  }

  /** FILE_NOT_FOUND for a file of this folder that is missing or cannot be read */
  private readError(file: string, p: string, e: unknown): LoupeError {
    const missing = (e as NodeJS.ErrnoException).code === 'ENOENT';
    return new LoupeError(
      'FILE_NOT_FOUND',
      missing ? `${file} not found in ${this.dir}.` : `Cannot read ${p} (${(e as Error).message}).`,
      undefined,
      { file, path: p, modelExists: true },
    );
  }

  /** A positioned read: the rest of the file is never touched (headers of multi-GB shards). */
  async readRange(file: string, offset: number, length: number, opts: FetchOptions = {}): Promise<RangeRead | null> {
    if (opts.signal?.aborted) throw new LoupeError('ABORTED', 'The operation was cancelled.');
    this.checkFolder();
    const p = this.localPath(file);
    let fh: FileHandle;
    let size: number;
    try {
      ({ fh, size } = await openRegular(p));
    } catch (e) {
      if (e instanceof LoupeError) throw e;
      if ((e as NodeJS.ErrnoException).code === 'ENOENT' && opts.optional) return null;
      throw this.readError(file, p, e);
    }
    try {
      return { bytes: await readAt(fh, offset, length, size), size, cached: true };
    } finally {
      await fh.close();
    }
  }
}
