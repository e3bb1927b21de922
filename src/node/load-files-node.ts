/**
 * Node model loading that keeps weights on disk.
 *
 *   const files = await loadModelFilesNode('default' | 'owner/name@rev' | 'https://…/' | './folder' | aModelSource,
 *                                          { cache?, endpoint?, token?, signal?, onProgress? });
 *   files.weights.paths   file -> absolute path (folder, or the DirCache for Hub/URL models)
 *   files.weights.files   empty for those files: only the headers (8 + N bytes) were read
 *   readTensorF32(files.weights, name)   reads just that tensor's byte range from disk
 *
 * Folder sources and complete DirCache entries are never read whole. Hub/URL weight files are
 * streamed into the cache (default: a DirCache at $LOUPE_CACHE_DIR or ~/.cache/loupe) and used
 * from there, so they never sit in memory either; an interrupted download resumes from its
 * `.partial` file. `cache: false` keeps everything in memory.
 */
import { closeSync, existsSync, readSync, statSync } from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { LoupeError } from '../engine/errors';
import { env } from '../engine/env';
import {
  parseSafetensors,
  parseSafetensorsHeader,
  safetensorsHeaderLength,
  type ReadableWeightSet,
  type SafetensorsHeader,
} from '../engine/safetensors';
import {
  forgetIfCorrupt,
  loadModelFilesWith,
  type LoadFilesOptions,
  type ModelFiles,
  type WeightReader,
} from '../engine/source/files';
import { HttpSource } from '../engine/source/http-source';
import { BUNDLED_MODEL_ID, BUNDLED_MODEL_PATH, resolveModelRef, type ResolvedModelRef } from '../engine/source/ref';
import type { ByteCache, ModelSource } from '../engine/source/types';
import { createSource } from '../engine/source/create-source';
import { DirCache } from './dir-cache';
import { openRegularSync } from './file-range';
import { FolderSource } from './folder-source';
import type { LocalAccess } from './local-access';
import { DEFAULT_HUB_ENDPOINT } from '../engine/source/hub-source';
import { checkUrlHost, guardedFetch, type NetAccess } from './net-access';
import type { RangedFile } from '../engine/safetensors-types';

export interface NodeLoadOptions extends Omit<LoadFilesOptions, 'cache'> {
  /** byte cache for Hub/URL models (default: a DirCache); false: none, weights stay in memory */
  cache?: ByteCache | false;
  /** Hub endpoint (default $HF_ENDPOINT or https://huggingface.co) */
  endpoint?: string;
  /** Hub access token (default $HF_TOKEN) */
  token?: string;
}

/** Read and validate only the header of a safetensors file on disk. */
export function readSafetensorsHeaderFromDisk(filePath: string, fileName: string): SafetensorsHeader {
  const { fd, size } = openRegularSync(filePath);
  try {
    const first = Buffer.alloc(8);
    const got = readSync(fd, first, 0, Math.min(8, size), 0);
    const n = safetensorsHeaderLength(first.subarray(0, got), fileName, size);
    const head = Buffer.alloc(8 + n);
    let off = 0;
    while (off < head.byteLength) {
      const r = readSync(fd, head, off, head.byteLength - off, off);
      if (r === 0) break;
      off += r;
    }
    return parseSafetensorsHeader(new Uint8Array(head.buffer, head.byteOffset, off), fileName, size);
  } finally {
    closeSync(fd);
  }
}

/** Read `length` bytes at `offset` of a file (a tensor's data); into `into` when it is big enough (a reused scratch, RangeReader). */
export function readFileRange(filePath: string, offset: number, length: number, into?: Uint8Array): Uint8Array {
  const { fd } = openRegularSync(filePath);
  try {
    const out = into && into.byteLength >= length ? into.subarray(0, length) : new Uint8Array(length);
    let done = 0;
    while (done < length) {
      const r = readSync(fd, out, done, length - done, offset + done);
      if (r === 0) break;
      done += r;
    }
    return done === length ? out : out.subarray(0, done);
  } finally {
    closeSync(fd);
  }
}

/** A file on disk as a RangedFile: the same shape as IndexedDB's chunk list in the browser. */
export function diskFile(filePath: string): RangedFile {
  const size = statSync(filePath).size;
  return {
    size,
    read: (offset, length, into) => readFileRange(filePath, offset, Math.max(0, Math.min(length, size - offset)), into),
    readAsync: async (offset, length) => readFileRange(filePath, offset, Math.max(0, Math.min(length, size - offset))),
  };
}

/** The bundled stories260K folder: $LOUPE_BUNDLED_MODEL, else public/models/stories260K near this file or the cwd. */
export function bundledModelDir(): string {
  const here = path.dirname(fileURLToPath(import.meta.url));
  const candidates = [
    process.env.LOUPE_BUNDLED_MODEL,
    path.resolve(here, '../../public', BUNDLED_MODEL_PATH),
    path.resolve(here, '../public', BUNDLED_MODEL_PATH),
    path.resolve(here, 'public', BUNDLED_MODEL_PATH),
    path.resolve(process.cwd(), 'public', BUNDLED_MODEL_PATH),
  ].filter((p): p is string => !!p);
  for (const c of candidates) if (existsSync(path.join(c, 'config.json'))) return c;
  throw new LoupeError(
    'MODEL_NOT_FOUND',
    `The bundled model ${BUNDLED_MODEL_ID} was not found (looked in ${candidates.join(', ')}).`,
    'Set LOUPE_BUNDLED_MODEL to its folder.',
  );
}

function isDir(p: string): boolean {
  try {
    return statSync(p).isDirectory();
  } catch {
    return false;
  }
}

/** A model spec string (or an already resolved ref) -> a ModelSource, in Node; `names`: a model's catalog names too (source/ref.ts). */
export function sourceFromSpec(
  spec: string | ResolvedModelRef,
  opts: { endpoint?: string; token?: string; local?: LocalAccess; net?: NetAccess; names?: boolean } = {},
): ModelSource {
  const endpoint = opts.endpoint ?? env.endpoint;
  const local = opts.local ?? 'any';
  // Only a caller allowed any folder may have a bare 'owner/name' probed on disk: for the others
  // that probe alone would tell them whether the folder exists.
  const ref =
    typeof spec === 'string'
      ? resolveModelRef(spec, { endpoint, isFolder: local === 'any' ? isDir : undefined, names: opts.names })
      : spec;
  const net = opts.net ?? 'any';
  // the ref's own endpoint (a Hub page URL's) first, then the caller's or $HF_ENDPOINT
  const hubEndpoint = ref.kind === 'hub' ? (ref.endpoint ?? endpoint) : endpoint;
  if (ref.kind === 'hub' || ref.kind === 'url')
    checkUrlHost(ref.kind === 'hub' ? (hubEndpoint ?? DEFAULT_HUB_ENDPOINT) : ref.id, net);
  return createSource(ref, {
    endpoint: hubEndpoint,
    token: opts.token ?? env.token,
    ...(net === 'any' ? {} : { fetch: guardedFetch(net) }),
    local: {
      bundled: () => new FolderSource(bundledModelDir()),
      folder: (r) => new FolderSource(r.id, local, typeof spec === 'string' ? spec : r.id),
    },
  });
}

/**
 * Weight reader that keeps files on disk: folder files and complete DirCache entries are
 * validated from their header alone; anything else is downloaded (through the cache) first.
 */
export function diskWeightReader(source: ModelSource, cache: ByteCache | undefined): WeightReader {
  const localOf = (file: string): string | undefined => {
    if (source instanceof FolderSource) {
      const p = source.localPath(file);
      return existsSync(p) ? p : undefined;
    }
    if (source instanceof HttpSource && cache?.localPath) return cache.localPath(source.cacheKey(file));
    return source.localPath?.(file);
  };
  return {
    createWeightSet() {
      const ws: ReadableWeightSet = { files: new Map(), paths: new Map(), tensors: new Map(), metadata: {} };
      ws.readRange = (file, offset, length, into) => {
        const p = ws.paths.get(file);
        if (!p) throw new LoupeError('INTERNAL', `No local path for ${file}.`);
        return readFileRange(p, offset, length, into);
      };
      return ws;
    },
    async read(file, opts) {
      if (opts.signal?.aborted) throw new LoupeError('ABORTED', 'The operation was cancelled.');
      if (source instanceof FolderSource) source.checkFolder();
      let p = localOf(file);
      if (!p) {
        if (source instanceof FolderSource) {
          if (opts.optional) return null;
          throw new LoupeError('FILE_NOT_FOUND', `${file} not found in ${source.dir}.`, undefined, {
            file,
            modelExists: true,
          });
        }
        const c = opts.cache ?? cache;
        if (source instanceof HttpSource && c?.openSink) {
          // Stream into the cache on disk; the weights never sit in memory.
          if (!(await source.downloadToCache(file, { ...opts, cache: c }))) return null;
          p = localOf(file);
          if (!p) throw new LoupeError('INTERNAL', `${file} was downloaded but is not in the cache.`);
          const path_ = p;
          return {
            header: await forgetIfCorrupt(source, c, file, () => readSafetensorsHeaderFromDisk(path_, file)),
            path: p,
            file: diskFile(p),
          };
        }
        const bytes = await source.fetchFile(file, { ...opts, cache: c });
        if (!bytes) return null;
        p = localOf(file);
        // Validate from memory; keep only the path when the cache now holds the file.
        const header = await forgetIfCorrupt(source, c, file, () => parseSafetensors(bytes, file));
        return p ? { header, path: p, file: diskFile(p) } : { header, bytes };
      }
      const cached = p;
      const header = await forgetIfCorrupt(source, source instanceof FolderSource ? undefined : cache, file, () =>
        readSafetensorsHeaderFromDisk(cached, file),
      );
      const size = statSync(p).size;
      opts.onProgress?.({ file, loaded: size, total: size, cached: true, done: true });
      return { header, path: p, file: diskFile(p) };
    },
  };
}

/** Load a model's files in Node; weights stay on disk where they can. */
export async function loadModelFilesNode(
  spec: string | ResolvedModelRef | ModelSource,
  opts: NodeLoadOptions = {},
): Promise<ModelFiles> {
  const source =
    typeof spec === 'object' && 'fetchFile' in spec ? spec : sourceFromSpec(spec, { ...opts, names: true });
  const cache =
    source instanceof FolderSource ? undefined : opts.cache === false ? undefined : (opts.cache ?? new DirCache());
  return loadModelFilesWith(source, diskWeightReader(source, cache), { ...opts, cache });
}
