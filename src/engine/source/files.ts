/**
 * Load every file a model needs from a ModelSource, validated.
 *
 *   const files = await loadModelFiles(source, { cache, signal, onProgress });
 *   files.config / files.tokenizerJson / files.tokenizerConfig / files.generationConfig  (parsed JSON)
 *   files.weights   WeightSet: every tensor validated; bytes in weights.files
 *
 * Order: config.json (required: MODEL_NOT_FOUND when the model itself is missing, MISSING_CONFIG
 * when the model exists without it, BAD_CONFIG when it is not JSON), tokenizer.json (required:
 * MISSING_TOKENIZER), tokenizer_config.json and generation_config.json (optional), then
 * model.safetensors, or model.safetensors.index.json + every shard it lists (BAD_INDEX when the
 * index is malformed, a shard is missing, or a listed tensor is not in its shard). Cached files
 * are used first, so a fully cached load makes no request.
 *
 * Progress: every event is a FileProgress whose `overall` aggregates all files met so far.
 *
 * The Node variant (src/node/load-files-node.ts) reuses `loadModelFilesWith` with a weight
 * reader that parses only headers from disk and fills `weights.paths`.
 */
import { LoupeError } from '../errors';
import { addHeader, parseSafetensors, type SafetensorsHeader } from '../safetensors';
import type { WeightSet } from '../safetensors-types';
import type { ByteCache, CacheKey, FetchOptions, FileProgress, ModelRef, ModelSource, OverallProgress } from './types';

export interface LoadFilesOptions {
  cache?: ByteCache;
  signal?: AbortSignal;
  onProgress?: (p: FileProgress) => void;
  /** how many weight shards download at once (default 2) */
  concurrency?: number;
  /** retries per file after a network failure (default: the source's, 2) */
  retries?: number;
}

export interface ModelFiles {
  ref: ModelRef;
  config: Record<string, unknown>;
  tokenizerJson: Record<string, unknown>;
  tokenizerConfig: Record<string, unknown> | null;
  generationConfig: Record<string, unknown> | null;
  weights: WeightSet;
  /** weight files in load order ('model.safetensors' or the shards) */
  weightFiles: string[];
  /** the parsed model.safetensors.index.json when the model is sharded */
  index: { weight_map: Record<string, string>; metadata?: Record<string, unknown> } | null;
}

export const SINGLE_WEIGHTS = 'model.safetensors';
export const WEIGHTS_INDEX = 'model.safetensors.index.json';

/** One weight file read and validated: its header, plus its bytes or local path, and its size. */
export interface WeightFileResult {
  header: SafetensorsHeader;
  bytes?: Uint8Array;
  path?: string;
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
      const bytes = await source.fetchFile(file, opts);
      if (!bytes) return null;
      return { header: await forgetIfCorrupt(source, opts.cache, file, () => parseSafetensors(bytes, file)), bytes };
    },
  };
}

/**
 * Run a validation; when it rejects a file that sits in the cache, delete the cache entry so the
 * next load downloads it again instead of failing on the same bytes forever.
 */
export async function forgetIfCorrupt<T>(source: ModelSource, cache: ByteCache | undefined, file: string, validate: () => T): Promise<T> {
  try {
    return validate();
  } catch (e) {
    if (cache && e instanceof LoupeError && e.code.startsWith('SAFETENSORS_') && 'cacheKey' in source) {
      await cache.delete((source as unknown as { cacheKey(f: string): CacheKey }).cacheKey(file)).catch(() => {});
    }
    throw e;
  }
}

export async function loadModelFiles(source: ModelSource, opts: LoadFilesOptions = {}): Promise<ModelFiles> {
  return loadModelFilesWith(source, memoryWeightReader(source), opts);
}

/** Tracks per-file progress and adds the aggregate to every event. */
class ProgressTracker {
  private readonly files = new Map<string, { loaded: number; total: number | null; done: boolean }>();
  constructor(private readonly sink?: (p: FileProgress) => void) {}
  handler = (p: FileProgress): void => {
    this.files.set(p.file, { loaded: p.loaded, total: p.total, done: !!p.done });
    this.sink?.({ ...p, overall: this.overall() });
  };
  overall(): OverallProgress {
    let loaded = 0, total = 0, filesDone = 0;
    for (const f of this.files.values()) {
      loaded += f.loaded;
      total += f.total ?? f.loaded;
      if (f.done) filesDone++;
    }
    return { loaded, total, files: this.files.size, filesDone };
  }
}

function parseJson(bytes: Uint8Array, file: string, code: 'BAD_CONFIG' | 'MISSING_TOKENIZER' | 'BAD_INDEX'): Record<string, unknown> {
  let v: unknown;
  try { v = JSON.parse(new TextDecoder().decode(bytes)); } catch (e) {
    throw new LoupeError(code, `${file} is not valid JSON (${e instanceof Error ? e.message : String(e)}).`, 'The file is damaged; clear the cache and download it again.', { file });
  }
  if (!v || typeof v !== 'object' || Array.isArray(v)) throw new LoupeError(code, `${file} is not a JSON object.`, undefined, { file });
  return v as Record<string, unknown>;
}

function describe(ref: ModelRef): string {
  return ref.kind === 'hub' ? `${ref.id}@${ref.revision}` : ref.id;
}

/** Check the index: a weight_map of tensor -> shard file name, shards safe relative names. */
export function validateIndex(json: Record<string, unknown>): { weight_map: Record<string, string>; metadata?: Record<string, unknown>; shards: string[] } {
  const wm = json.weight_map;
  if (!wm || typeof wm !== 'object' || Array.isArray(wm)) {
    throw new LoupeError('BAD_INDEX', `${WEIGHTS_INDEX} has no "weight_map" object.`, 'The index is damaged; download it again.', { file: WEIGHTS_INDEX });
  }
  const shards: string[] = [];
  const seen = new Set<string>();
  for (const [tensor, shard] of Object.entries(wm as Record<string, unknown>)) {
    if (typeof shard !== 'string' || !shard.endsWith('.safetensors') || shard.startsWith('/') || shard.split('/').some((p) => p === '..' || p === '' || p === '.')) {
      throw new LoupeError('BAD_INDEX', `${WEIGHTS_INDEX}: tensor "${tensor}" points to ${JSON.stringify(shard)}, not a .safetensors file of the model.`, undefined, { file: WEIGHTS_INDEX, tensor });
    }
    if (!seen.has(shard)) { seen.add(shard); shards.push(shard); }
  }
  if (shards.length === 0) throw new LoupeError('BAD_INDEX', `${WEIGHTS_INDEX} lists no tensors.`, undefined, { file: WEIGHTS_INDEX });
  const metadata = json.metadata && typeof json.metadata === 'object' ? (json.metadata as Record<string, unknown>) : undefined;
  return { weight_map: wm as Record<string, string>, ...(metadata ? { metadata } : {}), shards: shards.sort() };
}

/**
 * Run async jobs with at most `limit` in flight. The first failure aborts `stop` (so the other
 * downloads end promptly, keeping their partial bytes) and is rethrown once all jobs settled:
 * nothing keeps running after the load has failed.
 */
async function pool<T>(items: T[], limit: number, stop: AbortController, job: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  let failed: unknown;
  const worker = async () => {
    while (next < items.length && failed === undefined) {
      const item = items[next++];
      try { await job(item); } catch (e) {
        if (failed === undefined) { failed = e; stop.abort(); }
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(limit, items.length)) }, worker));
  if (failed !== undefined) throw failed;
}

export async function loadModelFilesWith(source: ModelSource, reader: WeightReader, opts: LoadFilesOptions = {}): Promise<ModelFiles> {
  const tracker = new ProgressTracker(opts.onProgress);
  const base: FetchOptions = { cache: opts.cache, signal: opts.signal, onProgress: tracker.handler, ...(opts.retries != null ? { retries: opts.retries } : {}) };
  const ref = source.ref;

  // config.json: its absence usually means the model itself is not there.
  let configBytes: Uint8Array | null;
  try {
    configBytes = await source.fetchFile('config.json', base);
  } catch (e) {
    if (e instanceof LoupeError && e.code === 'FILE_NOT_FOUND') {
      const d = (e.details ?? {}) as { entryNotFound?: boolean; modelExists?: boolean };
      if (d.entryNotFound || d.modelExists) {
        throw new LoupeError('MISSING_CONFIG', `${describe(ref)} has no config.json.`, 'Loupe needs a Hugging Face transformers model folder: config.json, tokenizer.json and safetensors weights.', e.details);
      }
      throw new LoupeError('MODEL_NOT_FOUND', `No model at ${describe(ref)}: config.json not found.`, ref.kind === 'hub'
        ? 'Check the id (owner/name) and the revision; private or gated models need an access token.'
        : 'Check the location: it must hold config.json, tokenizer.json and the safetensors weights.', e.details);
    }
    throw e;
  }
  const config = parseJson(configBytes!, 'config.json', 'BAD_CONFIG');

  const tokBytes = await source.fetchFile('tokenizer.json', { ...base, optional: true });
  if (!tokBytes) {
    throw new LoupeError('MISSING_TOKENIZER', `${describe(ref)} has no tokenizer.json.`, 'Loupe reads the fast tokenizer file tokenizer.json. If the model only has a slow tokenizer (vocab.json + merges.txt, or tokenizer.model), save one with transformers: AutoTokenizer.from_pretrained(id).save_pretrained(dir).', { file: 'tokenizer.json' });
  }
  const tokenizerJson = parseJson(tokBytes, 'tokenizer.json', 'MISSING_TOKENIZER');
  const tcBytes = await source.fetchFile('tokenizer_config.json', { ...base, optional: true });
  const tokenizerConfig = tcBytes ? parseJson(tcBytes, 'tokenizer_config.json', 'BAD_CONFIG') : null;
  const gcBytes = await source.fetchFile('generation_config.json', { ...base, optional: true });
  const generationConfig = gcBytes ? parseJson(gcBytes, 'generation_config.json', 'BAD_CONFIG') : null;

  const weights = reader.createWeightSet?.() ?? { files: new Map(), paths: new Map(), tensors: new Map(), metadata: {} };
  const put = (file: string, r: WeightFileResult) => {
    if (r.bytes) weights.files.set(file, r.bytes);
    if (r.path) weights.paths.set(file, r.path);
    addHeader(weights, r.header);
  };

  // A cached layout first (no request), then the network: single file, else the index.
  let single = await reader.read(SINGLE_WEIGHTS, { ...base, optional: true, cacheOnly: true });
  let indexBytes = single ? null : await source.fetchFile(WEIGHTS_INDEX, { ...base, optional: true, cacheOnly: true });
  if (!single && !indexBytes) {
    single = await reader.read(SINGLE_WEIGHTS, { ...base, optional: true });
    if (!single) indexBytes = await source.fetchFile(WEIGHTS_INDEX, { ...base, optional: true });
  }
  if (single) {
    put(SINGLE_WEIGHTS, single);
    return { ref, config, tokenizerJson, tokenizerConfig, generationConfig, weights, weightFiles: [SINGLE_WEIGHTS], index: null };
  }
  if (!indexBytes) {
    throw new LoupeError('FILE_NOT_FOUND', `${describe(ref)} has neither ${SINGLE_WEIGHTS} nor ${WEIGHTS_INDEX}.`, 'Loupe reads safetensors weights only; convert pytorch_model.bin with transformers (save_pretrained(dir, safe_serialization=True)).', { file: SINGLE_WEIGHTS });
  }

  const index = validateIndex(parseJson(indexBytes, WEIGHTS_INDEX, 'BAD_INDEX'));
  const results = await readShards(index, reader, base, opts);
  for (const shard of index.shards) put(shard, results.get(shard)!);
  for (const [tensor, shard] of Object.entries(index.weight_map)) {
    const t = weights.tensors.get(tensor);
    if (!t || t.file !== shard) {
      throw new LoupeError('BAD_INDEX', `${WEIGHTS_INDEX} lists tensor "${tensor}" in ${shard}, but ${t ? `it is in ${t.file}` : 'that shard does not hold it'}.`, 'The index and the shards disagree; check the model repository.', { file: shard, tensor });
    }
  }
  return {
    ref, config, tokenizerJson, tokenizerConfig, generationConfig, weights, weightFiles: index.shards,
    index: { weight_map: index.weight_map, ...(index.metadata ? { metadata: index.metadata } : {}) },
  };
}

/** Read every shard (a few at once); a missing shard is a BAD_INDEX naming a tensor it should hold. */
async function readShards(
  index: { weight_map: Record<string, string>; shards: string[] }, reader: WeightReader, base: FetchOptions, opts: LoadFilesOptions,
): Promise<Map<string, WeightFileResult>> {
  const results = new Map<string, WeightFileResult>();
  const stop = new AbortController();
  const onAbort = () => stop.abort();
  opts.signal?.addEventListener('abort', onAbort, { once: true });
  if (opts.signal?.aborted) stop.abort();
  try {
    await pool(index.shards, opts.concurrency ?? 2, stop, async (shard) => {
      let r: WeightFileResult | null;
      try {
        r = await reader.read(shard, { ...base, signal: stop.signal, optional: true });
      } catch (e) {
        if (e instanceof LoupeError && e.code === 'FILE_NOT_FOUND') r = null; else throw e;
      }
      if (!r) {
        const tensor = Object.entries(index.weight_map).find(([, s]) => s === shard)![0];
        throw new LoupeError('BAD_INDEX', `${WEIGHTS_INDEX} lists tensor "${tensor}" in shard ${shard}, which does not exist.`, 'The index and the shards disagree; check the model repository.', { file: shard, tensor });
      }
      results.set(shard, r);
    });
  } finally {
    opts.signal?.removeEventListener('abort', onAbort);
  }
  return results;
}
