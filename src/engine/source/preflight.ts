/**
 * Judge a model before downloading its weights.
 *
 *   const plan = await planModel(source, { cache, signal, judge: async (p) => { await judgeModel(p, 'wasm', 'auto'); } });
 *   plan.architecture, plan.stats (params per dtype), plan.weightBytes, plan.downloadBytes
 *
 * Reads, in order: config.json (MODEL_NOT_FOUND / MISSING_CONFIG / BAD_CONFIG; then
 * UNSUPPORTED_ARCHITECTURE from its model_type and UNSUPPORTED_CONFIG from its other fields
 * alone), tokenizer.json (MISSING_TOKENIZER), tokenizer_config.json and generation_config.json
 * (optional), the weight layout (model.safetensors, else model.safetensors.index.json; a
 * multimodal checkpoint's shards without text-model tensors are left out), and every weight file's safetensors
 * header with two Range requests (its 8-byte length, then the JSON) — never a tensor byte. From
 * the headers the architecture adapter checks every tensor it needs (MISSING_TENSOR,
 * BAD_TENSOR_SHAPE) and the parameter count per dtype is known; `judge` (the caller's budget
 * check, or a person's confirmation) runs last, still before the first weight byte.
 *
 * Complete cache entries answer without a request, and remembered misses (an optional file's
 * 404) are not asked again, so a fully cached plan makes no request at all.
 *
 * Limits (caps.ts): each small file is read with its cap and validated before it is cached
 * (fetchJson); the index names at most maxShards files, and the headers are at most
 * maxHeaderBytes each and maxHeaderBytesTotal together, counted before each header is read. The
 * size judged for each weight file (plan.sizes) then bounds its download.
 */
import { checkConfig, describeModel, textTensorFilter } from '../arch/index';
import {
  estimateMemory,
  weightStats,
  type BudgetLimits,
  type MemoryBackend,
  type MemoryEstimate,
  type WeightPrecision,
  type WeightStats,
} from '../budget';
import { CAPS, checkCap, type CapName } from '../caps';
import { LoupeError } from '../errors';
import { checkTokenizerPatterns } from '../tokenizer';
import { addHeader, parseSafetensorsHeader, safetensorsHeaderLength, type SafetensorsHeader } from '../safetensors';
import type { TensorEntry, WeightSet } from '../safetensors-types';
import type { PrecisionChoice, WeightsMode } from '../precision';
import type { GpuCaps } from '../env';
import { decideLoad, type LoadDecision } from '../plan';
import type {
  ByteCache,
  CacheKey,
  FetchOptions,
  FileHead,
  FileProgress,
  ModelRef,
  ModelSource,
  OverallProgress,
  RangeRead,
} from './types';

export const SINGLE_WEIGHTS = 'model.safetensors';
export const WEIGHTS_INDEX = 'model.safetensors.index.json';

export interface PlanOptions {
  cache?: ByteCache;
  signal?: AbortSignal;
  onProgress?: (p: FileProgress) => void;
  /** how many weight headers / shards are fetched at once (default 2) */
  concurrency?: number;
  /** retries per file after a network failure (default: the source's, 2) */
  retries?: number;
  /** Decide on the plan before any weight byte is fetched: throw (TOO_LARGE, ABORTED) to stop. */
  judge?: (plan: ModelPlan) => void | Promise<void>;
}

export interface ModelPlan {
  ref: ModelRef;
  /** the commit the Hub resolved the revision to (X-Repo-Commit), when known */
  commit?: string;
  config: Record<string, unknown>;
  tokenizerJson: Record<string, unknown>;
  tokenizerConfig: Record<string, unknown> | null;
  generationConfig: Record<string, unknown> | null;
  /** config.json model_type */
  architecture: string;
  /** weight files in load order ('model.safetensors' or the shards, sorted) */
  weightFiles: string[];
  index: { weight_map: Record<string, string>; metadata?: Record<string, unknown> } | null;
  /** each weight file's validated header (empty when the source cannot read byte ranges) */
  headers: Map<string, SafetensorsHeader>;
  /** the header bytes fetched over the network, per weight file, so the download does not fetch them again */
  heads: Map<string, FileHead>;
  /** every tensor of the weight files, from their headers; null when the headers could not be read first */
  tensors: Map<string, TensorEntry> | null;
  /** parameters of all those tensors by stored dtype (judgeModel counts only those the model uses) */
  stats: WeightStats | null;
  /** each weight file's size as judged: where its header's last tensor ends (or the declared size if smaller); its download may be no larger */
  sizes: Map<string, number>;
  /** size of all weight files */
  weightBytes: number;
  /** weight bytes not yet complete in the cache: what the load will download */
  downloadBytes: number;
  /** weight bytes that were already in the cache before this plan (complete or partial entries) */
  cachedBytes: number;
}

function describe(ref: ModelRef): string {
  return ref.kind === 'hub' ? `${ref.id}@${ref.revision}` : ref.id;
}

export function parseJson(
  bytes: Uint8Array,
  file: string,
  code: 'BAD_CONFIG' | 'MISSING_TOKENIZER' | 'BAD_INDEX',
): Record<string, unknown> {
  let v: unknown;
  try {
    v = JSON.parse(new TextDecoder().decode(bytes));
  } catch (e) {
    throw new LoupeError(
      code,
      `${file} is not valid JSON (${e instanceof Error ? e.message : String(e)}).`,
      'The file is damaged; clear the cache and download it again.',
      { file },
    );
  }
  if (!v || typeof v !== 'object' || Array.isArray(v))
    throw new LoupeError(code, `${file} is not a JSON object.`, undefined, { file });
  return v as Record<string, unknown>;
}

/**
 * A small JSON file read with its cap (caps.ts) and parsed as the check that runs before it is
 * cached: a file over the cap, or one that does not parse (or fails `check`), is not kept.
 * Null for an optional file that is missing.
 */
export async function fetchJson(
  source: ModelSource,
  file: string,
  opts: FetchOptions,
  cap: CapName,
  code: 'BAD_CONFIG' | 'MISSING_TOKENIZER' | 'BAD_INDEX',
  check?: (json: Record<string, unknown>) => void,
): Promise<Record<string, unknown> | null> {
  let parsed: Record<string, unknown> | undefined;
  const validate = (bytes: Uint8Array) => {
    parsed = undefined;
    const json = parseJson(bytes, file, code);
    check?.(json);
    parsed = json;
  };
  const bytes = await source.fetchFile(file, { ...opts, maxBytes: CAPS[cap], validate });
  if (!bytes) return null;
  if (!parsed) validate(bytes); // a source that does not run validate (a folder, memory)
  return parsed!;
}

/** Check the index: a weight_map of tensor -> shard file name, shards safe relative names. */
export function validateIndex(json: Record<string, unknown>): {
  weight_map: Record<string, string>;
  metadata?: Record<string, unknown>;
  shards: string[];
} {
  const wm = json.weight_map;
  if (!wm || typeof wm !== 'object' || Array.isArray(wm)) {
    throw new LoupeError(
      'BAD_INDEX',
      `${WEIGHTS_INDEX} has no "weight_map" object.`,
      'The index is damaged; download it again.',
      { file: WEIGHTS_INDEX },
    );
  }
  const shards: string[] = [];
  const seen = new Set<string>();
  for (const [tensor, shard] of Object.entries(wm as Record<string, unknown>)) {
    if (
      typeof shard !== 'string' ||
      shard.length > CAPS.maxNameChars ||
      !shard.endsWith('.safetensors') ||
      shard.startsWith('/') ||
      shard.split('/').some((p) => p === '..' || p === '' || p === '.')
    ) {
      throw new LoupeError(
        'BAD_INDEX',
        `${WEIGHTS_INDEX}: tensor "${tensor}" points to ${JSON.stringify(shard)}, not a .safetensors file of the model.`,
        undefined,
        { file: WEIGHTS_INDEX, tensor },
      );
    }
    if (!seen.has(shard)) {
      seen.add(shard);
      shards.push(shard);
      checkCap('maxShards', shards.length, `${WEIGHTS_INDEX}: the number of shards`, {
        hint: 'No published model has this many weight files; the index is damaged or hostile.',
      });
    }
  }
  if (shards.length === 0)
    throw new LoupeError('BAD_INDEX', `${WEIGHTS_INDEX} lists no tensors.`, undefined, { file: WEIGHTS_INDEX });
  const metadata =
    json.metadata && typeof json.metadata === 'object' ? (json.metadata as Record<string, unknown>) : undefined;
  return { weight_map: wm as Record<string, string>, ...(metadata ? { metadata } : {}), shards: shards.sort() };
}

/** A missing shard the index names: BAD_INDEX naming one tensor it should hold. */
export function missingShard(weightMap: Record<string, string>, shard: string): LoupeError {
  const tensor = Object.entries(weightMap).find(([, s]) => s === shard)![0];
  return new LoupeError(
    'BAD_INDEX',
    `${WEIGHTS_INDEX} lists tensor "${tensor}" in shard ${shard}, which does not exist.`,
    'The index and the shards disagree; check the model repository.',
    { file: shard, tensor },
  );
}

/** Every tensor the index names must be in the shard it names. */
export function checkIndexAgainst(weightMap: Record<string, string>, tensors: Map<string, TensorEntry>): void {
  for (const [tensor, shard] of Object.entries(weightMap)) {
    const t = tensors.get(tensor);
    if (!t || t.file !== shard) {
      throw new LoupeError(
        'BAD_INDEX',
        `${WEIGHTS_INDEX} lists tensor "${tensor}" in ${shard}, but ${t ? `it is in ${t.file}` : 'that shard does not hold it'}.`,
        'The index and the shards disagree; check the model repository.',
        { file: shard, tensor },
      );
    }
  }
}

/**
 * Run a validation; when it rejects a file that sits in the cache, delete the cache entry so the
 * next load downloads it again instead of failing on the same bytes forever.
 */
export async function forgetIfCorrupt<T>(
  source: ModelSource,
  cache: ByteCache | undefined,
  file: string,
  validate: () => T | Promise<T>,
): Promise<T> {
  try {
    return await validate();
  } catch (e) {
    if (cache && e instanceof LoupeError && e.code.startsWith('SAFETENSORS_') && 'cacheKey' in source) {
      await cache.delete((source as unknown as { cacheKey(f: string): CacheKey }).cacheKey(file)).catch(() => {});
    }
    throw e;
  }
}

export interface HeaderRead {
  header: SafetensorsHeader;
  size: number;
  /** the most bytes the file may have: where its last tensor ends, or the declared size if smaller */
  bound: number;
  /** both reads came from the cache */
  cached: boolean;
  /** bytes of the file already in the cache (the download fetches size - stored) */
  stored: number;
  /** the bytes read (8 + N), to seed the download */
  head?: FileHead;
}

/**
 * A weight file's header from its first 8 + N bytes (two range reads), or null when the file
 * does not exist (optional). `cached` when both came from the cache.
 */
export async function readWeightHeader(
  source: ModelSource & Required<Pick<ModelSource, 'readRange'>>,
  file: string,
  opts: FetchOptions,
  budget?: HeaderBudget,
): Promise<HeaderRead | null> {
  const first = await source.readRange(file, 0, 8, opts);
  if (!first) return null;
  // Without a size (no Content-Range / Content-Length) offsets cannot be checked yet: the full
  // download validates them.
  const size = first.size ?? Number.MAX_SAFE_INTEGER;
  return forgetIfCorrupt(source, opts.cache, file, async () => {
    const n = safetensorsHeaderLength(first.bytes, file, size);
    budget?.take(n, file);
    const rest =
      n > 0 ? await source.readRange(file, 8, n, { ...opts, optional: false }) : { ...first, bytes: new Uint8Array(0) };
    const head_ = new Uint8Array(8 + rest!.bytes.byteLength);
    head_.set(first.bytes.subarray(0, 8));
    head_.set(rest!.bytes, 8);
    const header = parseSafetensorsHeader(head_, file, size);
    const tensorsEnd = header.tensors.reduce((m, t) => Math.max(m, t.fileOffset + t.byteLength), header.dataStart);
    const end = first.size ?? tensorsEnd;
    const cached = !!first.cached && !!rest!.cached;
    const stored = cached ? Math.min(first.stored ?? end, (rest as RangeRead).stored ?? end) : 0;
    // Bytes fetched for the header seed the download, when both reads saw the same version.
    const sameVersion = first.size != null && (n === 0 || first.etag === (rest as RangeRead).etag);
    const head = !cached && sameVersion ? { bytes: head_, etag: first.etag, total: first.size! } : undefined;
    // Kept as a partial entry too, so a load stopped before this file's download resumes after the header.
    if (head && opts.cache && 'cacheKey' in source) {
      const key = (source as unknown as { cacheKey(f: string): CacheKey }).cacheKey(file);
      await opts.cache
        .putPartial(key, head.bytes, { ...(head.etag ? { etag: head.etag } : {}), total: head.total })
        .catch(() => {});
    }
    return { header, size: end, bound: Math.min(end, tensorsEnd), cached, stored, ...(head ? { head } : {}) };
  });
}

/** The header bytes one model may read in all (maxHeaderBytesTotal), taken before each header is read. */
export class HeaderBudget {
  used = 0;
  take(n: number, file: string): void {
    this.used += n;
    checkCap('maxHeaderBytesTotal', this.used, `the safetensors headers up to ${file}`, {
      unit: 'bytes',
      hint: 'Real models have a few MB of headers in all; these weight files are damaged or hostile.',
    });
  }
}

/** Run async jobs with at most `limit` in flight; the first failure aborts `stop` and is rethrown once all settled. */
export async function pool<T>(
  items: T[],
  limit: number,
  stop: AbortController,
  job: (item: T) => Promise<void>,
): Promise<void> {
  let next = 0;
  let failed: unknown;
  const worker = async () => {
    while (next < items.length && failed === undefined) {
      const item = items[next++];
      try {
        await job(item);
      } catch (e) {
        if (failed === undefined) {
          failed = e;
          stop.abort();
        }
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(limit, items.length)) }, worker));
  if (failed !== undefined) throw failed;
}

/** A controller aborted with `signal` (so a pool can stop its siblings without aborting the caller). */
export function childAbort(signal?: AbortSignal): { ctl: AbortController; release: () => void } {
  const ctl = new AbortController();
  const onAbort = () => ctl.abort();
  signal?.addEventListener('abort', onAbort, { once: true });
  if (signal?.aborted) ctl.abort();
  return { ctl, release: () => signal?.removeEventListener('abort', onAbort) };
}

/** Tracks per-file progress and adds the aggregate to every event. */
export class ProgressTracker {
  private readonly files = new Map<string, { loaded: number; total: number | null; done: boolean }>();
  constructor(private readonly sink?: (p: FileProgress) => void) {}
  handler = (p: FileProgress): void => {
    this.files.set(p.file, { loaded: p.loaded, total: p.total, done: !!p.done });
    this.sink?.({ ...p, overall: this.overall() });
  };
  overall(): OverallProgress {
    let loaded = 0,
      total = 0,
      filesDone = 0;
    for (const f of this.files.values()) {
      loaded += f.loaded;
      total += f.total ?? f.loaded;
      if (f.done) filesDone++;
    }
    return { loaded, total, files: this.files.size, filesDone };
  }
}

export async function planModel(
  source: ModelSource,
  opts: PlanOptions = {},
  tracker = new ProgressTracker(opts.onProgress),
): Promise<ModelPlan> {
  const base: FetchOptions = {
    cache: opts.cache,
    signal: opts.signal,
    onProgress: tracker.handler,
    ...(opts.retries != null ? { retries: opts.retries } : {}),
  };
  const ref = source.ref;

  // config.json: its absence usually means the model itself is not there.
  let config: Record<string, unknown>;
  try {
    config = (await fetchJson(source, 'config.json', base, 'maxConfigBytes', 'BAD_CONFIG', (c) => checkConfig(c)))!;
  } catch (e) {
    if (e instanceof LoupeError && e.code === 'FILE_NOT_FOUND') {
      const d = (e.details ?? {}) as { entryNotFound?: boolean; modelExists?: boolean };
      if (d.entryNotFound || d.modelExists) {
        throw new LoupeError(
          'MISSING_CONFIG',
          `${describe(ref)} has no config.json.`,
          'Loupe needs a Hugging Face transformers model folder: config.json, tokenizer.json and safetensors weights.',
          e.details,
        );
      }
      throw new LoupeError(
        'MODEL_NOT_FOUND',
        `No model at ${describe(ref)}: config.json not found.`,
        ref.kind === 'hub'
          ? 'Check the id (owner/name) and the revision; private or gated models need an access token.'
          : 'Check the location: it must hold config.json, tokenizer.json and the safetensors weights.',
        e.details,
      );
    }
    throw e;
  }
  // the commit this revision resolved to: from config.json's answer, or remembered by the cache
  await (source as { syncCommit?: (c?: ByteCache) => Promise<void> }).syncCommit?.(opts.cache);

  const tokenizerJson = await fetchJson(
    source,
    'tokenizer.json',
    { ...base, optional: true },
    'maxTokenizerBytes',
    'MISSING_TOKENIZER',
    (t) => checkTokenizerPatterns(t),
  );
  if (!tokenizerJson) {
    throw new LoupeError(
      'MISSING_TOKENIZER',
      `${describe(ref)} has no tokenizer.json.`,
      'Loupe reads the fast tokenizer file tokenizer.json. If the model only has ' +
        'a slow tokenizer (vocab.json + merges.txt, or tokenizer.model), ' +
        'save one with transformers: AutoTokenizer.from_pretrained(id).save_pretrained(dir).',
      { file: 'tokenizer.json' },
    );
  }
  const optional = { ...base, optional: true };
  const tokenizerConfig = await fetchJson(
    source,
    'tokenizer_config.json',
    optional,
    'maxTokenizerConfigBytes',
    'BAD_CONFIG',
  );
  const generationConfig = await fetchJson(source, 'generation_config.json', optional, 'maxConfigBytes', 'BAD_CONFIG');

  const headers = new Map<string, SafetensorsHeader>();
  const heads = new Map<string, FileHead>();
  const sizes = new Map<string, number>();
  const budget = new HeaderBudget();
  let weightBytes = 0,
    downloadBytes = 0,
    cachedBytes = 0;
  const note = (file: string, r: HeaderRead) => {
    headers.set(file, r.header);
    sizes.set(file, r.bound);
    if (r.head) heads.set(file, r.head);
    weightBytes += r.size;
    downloadBytes += r.size - (r.cached ? r.stored : (r.head?.bytes.byteLength ?? 0));
    if (r.cached) cachedBytes += r.stored;
  };
  const ranged = source.readRange ? (source as ModelSource & Required<Pick<ModelSource, 'readRange'>>) : null;

  // The layout: a cached one first (no request), then the network: single file, else the index.
  let single: Awaited<ReturnType<typeof readWeightHeader>> | boolean = null;
  let indexJson: ReturnType<typeof validateIndex> | null = null;
  const readIndex = async (o: FetchOptions) => {
    let idx: ReturnType<typeof validateIndex> | undefined;
    const json = await fetchJson(source, WEIGHTS_INDEX, o, 'maxIndexBytes', 'BAD_INDEX', (j) => {
      idx = validateIndex(j);
    });
    return json ? (idx ?? validateIndex(json)) : null;
  };
  if (ranged) {
    single = await readWeightHeader(ranged, SINGLE_WEIGHTS, { ...optional, cacheOnly: true }, budget);
    if (!single) indexJson = await readIndex({ ...optional, cacheOnly: true });
    if (!single && !indexJson) {
      single = await readWeightHeader(ranged, SINGLE_WEIGHTS, optional, budget);
      if (!single) indexJson = await readIndex(optional);
    }
  } else {
    // No byte ranges (a custom source): only the index can be read first; a single file is judged after its download.
    indexJson = await readIndex(optional);
    single = !indexJson;
  }

  let weightFiles: string[];
  let index: ModelPlan['index'] = null;
  if (single) {
    weightFiles = [SINGLE_WEIGHTS];
    if (typeof single === 'object') note(SINGLE_WEIGHTS, single);
  } else if (indexJson) {
    const idx = indexJson;
    // a multimodal checkpoint's shards that hold none of its text model's tensors (the vision tower's) are never fetched
    const text = textTensorFilter(config);
    if (text) {
      idx.shards = idx.shards.filter((f) => Object.entries(idx.weight_map).some(([t, s]) => s === f && text(t)));
      idx.weight_map = Object.fromEntries(Object.entries(idx.weight_map).filter(([, s]) => idx.shards.includes(s)));
    }
    index = { weight_map: idx.weight_map, ...(idx.metadata ? { metadata: idx.metadata } : {}) };
    weightFiles = idx.shards;
    if (ranged) {
      const results = new Map<string, HeaderRead>();
      const { ctl, release } = childAbort(opts.signal);
      try {
        await pool(idx.shards, opts.concurrency ?? 2, ctl, async (shard) => {
          let r: Awaited<ReturnType<typeof readWeightHeader>>;
          try {
            r = await readWeightHeader(ranged, shard, { ...base, signal: ctl.signal, optional: true }, budget);
          } catch (e) {
            if (e instanceof LoupeError && e.code === 'FILE_NOT_FOUND') r = null;
            else throw e;
          }
          if (!r) throw missingShard(idx.weight_map, shard);
          results.set(shard, r);
        });
      } finally {
        release();
      }
      for (const shard of idx.shards) note(shard, results.get(shard)!);
    }
  } else {
    throw new LoupeError(
      'FILE_NOT_FOUND',
      `${describe(ref)} has neither ${SINGLE_WEIGHTS} nor ${WEIGHTS_INDEX}.`,
      'Loupe reads safetensors weights only; convert pytorch_model.bin with transformers (save_pretrained(dir, safe_serialization=True)).',
      { file: SINGLE_WEIGHTS },
    );
  }

  let stats: WeightStats | null = null;
  let tensors: Map<string, TensorEntry> | null = null;
  if (headers.size === weightFiles.length) {
    const ws: WeightSet = { files: new Map(), paths: new Map(), tensors: new Map(), metadata: {} };
    for (const f of weightFiles) addHeader(ws, headers.get(f)!);
    if (index) checkIndexAgainst(index.weight_map, ws.tensors);
    tensors = ws.tensors;
    stats = weightStats(ws.tensors.values());
  }
  const commit = (source as { commit?: string }).commit;
  const plan: ModelPlan = {
    ref,
    ...(commit ? { commit } : {}),
    config,
    tokenizerJson,
    tokenizerConfig,
    generationConfig,
    architecture: String(config.model_type),
    weightFiles,
    index,
    headers,
    heads,
    tensors,
    stats,
    sizes,
    weightBytes,
    downloadBytes,
    cachedBytes,
  };
  if (opts.signal?.aborted) throw new LoupeError('ABORTED', 'The operation was cancelled.');
  await opts.judge?.(plan);
  return plan;
}

export interface ModelJudgement {
  /** parameters the model uses (what createModel reports as n_params), by stored dtype */
  stats: WeightStats;
  /** the precision judged, and why */
  choice: PrecisionChoice;
  /** the estimate for the backend and precision judged */
  estimate: MemoryEstimate;
  /** estimates for the other backends at the same precision, for display */
  estimates: MemoryEstimate[];
  /** the whole load decision (plan.ts): what createModel then runs at (ModelParts.decision) */
  decision: LoadDecision;
}

/**
 * The engine's judgement of a plan: the architecture adapter checks every tensor it needs
 * (MISSING_TENSOR, BAD_TENSOR_SHAPE, BAD_CONFIG), and the load is decided from the parameters the
 * model uses (plan.ts decideLoad: precision from `mode`, the backend's memory budget and, on
 * WebGPU, the adapter's largest buffer checked at it: TOO_LARGE) — all from headers, before a
 * weight byte. Null when the plan has no headers (a source without byte ranges): createModel
 * decides after the download instead.
 */
export async function judgeModel(
  plan: ModelPlan,
  backend: MemoryBackend,
  mode: WeightsMode | WeightPrecision = 'auto',
  limits: BudgetLimits = {},
  offer: { precisions?: WeightPrecision[]; backends?: MemoryBackend[] } = {},
  gpu?: GpuCaps,
): Promise<ModelJudgement | null> {
  if (!plan.tensors) return null;
  const spec = describeModel({ config: plan.config, tensors: plan.tensors });
  const decision = await decideLoad({ spec, tensors: plan.tensors, backend, mode, gpu, memory: limits, offer });
  const others = (offer.backends ?? ['node', 'wasm', 'webgpu']).filter((b) => b !== backend);
  const estimates = [
    decision.estimate,
    ...others.map((b) => estimateMemory(decision.stats, b, decision.precision, limits)),
  ];
  return {
    stats: decision.stats,
    choice: { precision: decision.precision, reason: decision.reason },
    estimate: decision.estimate,
    estimates,
    decision,
  };
}
