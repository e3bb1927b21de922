/**
 * Load every file a model needs from a ModelSource, validated.
 *
 *   const files = await loadModelFiles(source, { cache, signal, onProgress });
 *   files.config / files.tokenizerJson / files.tokenizerConfig / files.generationConfig  (parsed JSON)
 *   files.weights   WeightSet: every tensor validated; bytes in weights.files
 *
 * First the plan (preflight.ts): config, tokenizer, the weight layout and every safetensors
 * header, judged by `opts.judge` before any weight byte. Then the weight files (a few at once),
 * each validated whole. Cached files and remembered misses are used first, so a fully cached
 * load makes no request.
 *
 * Progress: every event is a FileProgress whose `overall` aggregates all files met so far.
 *
 * The Node variant (src/node/load-files-node.ts) reuses `loadModelFilesWith` with a weight
 * reader that parses only headers from disk and fills `weights.paths`.
 */
import { LoupeError } from '../errors';
import {
  addHeader,
  parseSafetensors,
  parseSafetensorsHeader,
  safetensorsHeaderLength,
  type SafetensorsHeader,
} from '../safetensors';
import type { RangedFile, WeightSet } from '../safetensors-types';
import type { WeightStats } from '../budget';
import {
  childAbort,
  checkIndexAgainst,
  forgetIfCorrupt,
  missingShard,
  planModel,
  pool,
  ProgressTracker,
  type ModelPlan,
  type PlanOptions,
} from './preflight';
import { HttpSource } from './http-source';
import type { FetchOptions, ModelRef, ModelSource } from './types';

export { forgetIfCorrupt, validateIndex, SINGLE_WEIGHTS, WEIGHTS_INDEX } from './preflight';

export type LoadFilesOptions = PlanOptions;

/** what of the plan a loaded model's files carry on */
const CARRIED = [
  'ref',
  'commit',
  'config',
  'tokenizerJson',
  'tokenizerConfig',
  'generationConfig',
  'weightFiles',
  'index',
  'stats',
  'downloadBytes',
] as const;

/** A loaded model's files: what the plan learned before the download, plus the weights. */
export type ModelFiles = Pick<ModelPlan, (typeof CARRIED)[number]> & { weights: WeightSet };

/** One weight file read and validated: its header, plus its bytes, local path or range reader. */
export interface WeightFileResult {
  header: SafetensorsHeader;
  bytes?: Uint8Array;
  path?: string;
  /** read by range where it is kept (IndexedDB chunks, a file on disk); the bytes are never held whole */
  file?: RangedFile;
}

/** Validate a safetensors file from its first bytes, read by range. */
export function headerOfRanged(file: RangedFile, name: string): SafetensorsHeader {
  const n = safetensorsHeaderLength(file.read(0, 8), name, file.size);
  return parseSafetensorsHeader(file.read(0, 8 + n), name, file.size);
}

/**
 * How weight files are read. `read` returns null when the file does not exist (only asked with
 * optional: true). The default fetches whole files into memory.
 */
export interface WeightReader {
  read(file: string, opts: FetchOptions): Promise<WeightFileResult | null>;
  /** the WeightSet to fill (lets Node attach its range reader) */
  createWeightSet?(): WeightSet;
}

export function memoryWeightReader(source: ModelSource): WeightReader {
  return {
    async read(file, opts) {
      // A cache that streams (IndexedDB, a directory) takes the download chunk by chunk, so it is
      // never held twice (download buffer + cache copy). IndexedDB then gives the file back as its
      // chunks, read by range (sessions read their pieces, param() its tensor): the file is never
      // one ArrayBuffer. A cache without openFile gives the bytes back once, whole.
      if (opts.cache?.openSink && source instanceof HttpSource) {
        const cache = opts.cache;
        const key = source.cacheKey(file);
        const wasCached = !!(await cache.hasComplete?.(key));
        if (!(await source.downloadToCache(file, { ...opts, cache }))) return null;
        const ranged = await cache.openFile?.(key);
        if (ranged) {
          if (wasCached) opts.onProgress?.({ file, loaded: ranged.size, total: ranged.size, cached: true, done: true });
          return {
            header: await forgetIfCorrupt(source, cache, file, () => headerOfRanged(ranged, file)),
            file: ranged,
          };
        }
        const bytes = await cache.get(key);
        if (!bytes)
          throw new LoupeError('INTERNAL', `${file} was downloaded but is not in the cache.`, 'Load the model again.', {
            file,
          });
        if (wasCached)
          opts.onProgress?.({ file, loaded: bytes.byteLength, total: bytes.byteLength, cached: true, done: true });
        return { header: await forgetIfCorrupt(source, cache, file, () => parseSafetensors(bytes, file)), bytes };
      }
      const bytes = await source.fetchFile(file, opts);
      if (!bytes) return null;
      return { header: await forgetIfCorrupt(source, opts.cache, file, () => parseSafetensors(bytes, file)), bytes };
    },
  };
}

export async function loadModelFiles(source: ModelSource, opts: LoadFilesOptions = {}): Promise<ModelFiles> {
  return loadModelFilesWith(source, memoryWeightReader(source), opts);
}

export async function loadModelFilesWith(
  source: ModelSource,
  reader: WeightReader,
  opts: LoadFilesOptions = {},
): Promise<ModelFiles> {
  const tracker = new ProgressTracker(opts.onProgress);
  const plan = await planModel(source, opts, tracker);
  const base: FetchOptions = {
    cache: opts.cache,
    signal: opts.signal,
    onProgress: tracker.handler,
    ...(opts.retries != null ? { retries: opts.retries } : {}),
  };
  const weights: WeightSet = reader.createWeightSet?.() ?? {
    files: new Map(),
    paths: new Map(),
    tensors: new Map(),
    metadata: {},
  };
  const results = await readWeights(plan, reader, base, opts);
  for (const file of plan.weightFiles) {
    const r = results.get(file)!;
    if (r.bytes) weights.files.set(file, r.bytes);
    if (r.path) weights.paths.set(file, r.path);
    if (r.file) (weights.ranged ??= new Map()).set(file, r.file);
    addHeader(weights, r.header);
  }
  if (plan.index) checkIndexAgainst(plan.index.weight_map, weights.tensors);
  return filesOf(plan, weights);
}

/** the plan's CARRIED fields (a commit only where known) with the weights */
function filesOf(plan: ModelPlan, weights: WeightSet): ModelFiles {
  const carried = Object.fromEntries(CARRIED.filter((k) => k !== 'commit' || plan.commit).map((k) => [k, plan[k]]));
  return { ...(carried as Omit<ModelFiles, 'weights'>), weights };
}

/** Read every weight file (a few at once); a missing shard is a BAD_INDEX naming a tensor it should hold. */
async function readWeights(
  plan: ModelPlan,
  reader: WeightReader,
  base: FetchOptions,
  opts: LoadFilesOptions,
): Promise<Map<string, WeightFileResult>> {
  const results = new Map<string, WeightFileResult>();
  const { ctl, release } = childAbort(opts.signal);
  try {
    await pool(plan.weightFiles, opts.concurrency ?? 2, ctl, async (file) => {
      let r: WeightFileResult | null;
      try {
        r = await reader.read(file, {
          ...base,
          signal: ctl.signal,
          optional: true,
          head: plan.heads.get(file),
          // the size judged from the header bounds the download (a gzip or chunked body included)
          ...(plan.sizes.has(file) ? { maxBytes: plan.sizes.get(file) } : {}),
        });
      } catch (e) {
        if (e instanceof LoupeError && e.code === 'FILE_NOT_FOUND') r = null;
        else throw e;
      }
      if (!r) {
        if (plan.index) throw missingShard(plan.index.weight_map, file);
        throw new LoupeError('FILE_NOT_FOUND', `${file} disappeared during the load.`, 'Load the model again.', {
          file,
        });
      }
      results.set(file, r);
    });
  } finally {
    release();
  }
  return results;
}
