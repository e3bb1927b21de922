/**
 * Loading SAEs (SAELens's layout or Gemma Scope 2's) through the same sources and byte caches as models, for a
 * surface to inject into operations as `ctx.loadSae` (and `ctx.loadSaeFile` for optional files
 * next to the SAE, such as explanations.json).
 *
 *   // page / worker: Hub or URL sources, IndexedDB cache
 *   const loaders = createSaeLoaders({ cache: new IdbCache() });
 *   op.run(model, input, { ...ctx, loadSae: loaders.loadSae, loadSaeFile: loaders.loadSaeFile });
 *
 * Node builds its loaders with the same `makeSaeLoaders` and its own source factory (folders,
 * DirCache): src/node/load-sae.ts. A ref is {source, path}: `source` is what a model spec would
 * be ('owner/name[@revision]', an http(s) URL of a folder, or a local folder in Node) and `path`
 * is the SAE's folder inside it ('' = the root).
 */
import { CAPS } from '../caps';
import { LoupeError } from '../errors';
import { loadSaeFiles, type SaeFiles } from '../sae';
import { GEMMA_SCOPE_2_CONFIG, GEMMA_SCOPE_2_PARAMS } from '../gemma-scope';
import { createSource } from './create-source';
import { fetchJson, readWeightHeader } from './preflight';
import { resolveModelRef, type ResolvedModelRef } from './ref';
import type { ByteCache, FetchOptions, FileHead, FileProgress, ModelSource } from './types';
import {
  loadTranscoderFiles,
  type TranscoderFiles,
  type TranscoderLoadOptions,
  type TranscoderPlan,
  type TranscoderSourceRef,
} from './transcoder-loader';

/** Structurally the ops' SaeRef (the engine does not import from ops). */
export interface SaeSourceRef {
  source: string;
  path: string;
}

export interface SaeLoadOptions {
  signal?: AbortSignal;
  onProgress?: (p: FileProgress) => void;
  /** SAELens's cfg.json, judged (throw to refuse) before the weights are fetched */
  judge?: (cfg: Record<string, any>) => void;
}

export interface SaeLoaders {
  /** cfg.json + sae_weights.safetensors (SAELens), or config.json + params.safetensors (Gemma Scope 2), of the SAE at ref */
  loadSae(ref: SaeSourceRef, opts?: SaeLoadOptions): Promise<SaeFiles>;
  /** one more file of the SAE's folder (e.g. explanations.json); null when `optional` and absent */
  loadSaeFile(
    ref: SaeSourceRef,
    file: string,
    opts?: SaeLoadOptions & { optional?: boolean },
  ): Promise<Uint8Array | null>;
  /** a transcoder set (transcoder-loader.ts): judged from its headers, then its files through the same sources and caches */
  loadTranscoders(ref: TranscoderSourceRef, opts: TranscoderLoadOptions): Promise<TranscoderFiles>;
}

/** where an SAE source's bytes come from: the same plan as a transcoder set's */
export type SaePlan = TranscoderPlan;

const SOURCE_HINT =
  "sae_source is a Hub repository ('owner/name' or 'owner/name@revision'), an http(s) URL of a folder, " +
  "or (CLI) a local folder; sae_path is the SAE's folder inside it, e.g. 'blocks.8.hook_resid_pre'.";

const TRANSCODER_HINT =
  "transcoder_source is a Hub repository ('owner/name' or 'owner/name@revision'), an http(s) " +
  "URL of a folder, or (CLI) a local folder; transcoder_path is the set's folder inside " +
  "it (circuit-tracer's config.yaml there), or SAELens folders as a pattern with {layer}.";

/** SAEs above this many weight bytes are refused before their weights are fetched (32-bit WASM heaps, memory) */
export const DEFAULT_MAX_SAE_BYTES = CAPS.maxSaeBytes;

const DTYPE_BYTES: Record<string, number> = { float32: 4, float16: 2, bfloat16: 2, float64: 8 };

/** TOO_LARGE when cfg.json's sizes put the weights above maxBytes; malformed cfgs are left to the validation after loading */
function checkSaeSize(cfg: Record<string, unknown>, maxBytes: number): void {
  const dIn = cfg.d_in,
    dSae = cfg.d_sae;
  if (typeof dIn !== 'number' || typeof dSae !== 'number') return;
  const per = DTYPE_BYTES[String(cfg.dtype ?? 'float32').replace(/^torch\./, '')] ?? 4;
  const bytes = (2 * dIn * dSae + 2 * dSae + dIn) * per;
  if (bytes > maxBytes) {
    const gib = (b: number) => `${(b / 1024 ** 3).toFixed(2)} GiB`;
    throw new LoupeError(
      'TOO_LARGE',
      `The SAE's weights take about ${gib(bytes)} (d_in ${dIn} × d_sae ${dSae}), more than the limit of ${gib(maxBytes)}.`,
      "Pick an SAE with fewer features (the limit protects this surface's memory; a surface may raise it with maxBytes).",
    );
  }
}

/**
 * The most bytes sae_weights.safetensors may have: from its header when the source reads ranges
 * (TOO_LARGE over maxBytes, SAE_MISMATCH when W_enc is not cfg.json's [d_in, d_sae], both before
 * a weight byte), else maxBytes itself. The download is then held to it, and resumes after the
 * header bytes read here (`head`).
 */
async function weightsBound(
  source: ModelSource,
  file: string,
  cfg: Record<string, unknown> | null,
  maxBytes: number,
  opts: FetchOptions,
): Promise<{ bound: number; head?: FileHead }> {
  if (!source.readRange) return { bound: maxBytes };
  const r = await readWeightHeader(source as ModelSource & Required<Pick<ModelSource, 'readRange'>>, file, {
    ...opts,
    optional: true,
  });
  if (!r) return { bound: maxBytes }; // absent: loadSaeFiles says FILE_NOT_FOUND
  if (r.bound > maxBytes) {
    const gib = (b: number) => `${(b / 1024 ** 3).toFixed(2)} GiB`;
    throw new LoupeError(
      'TOO_LARGE',
      `The SAE's weights file holds ${gib(r.bound)} of tensors, more than the limit of ${gib(maxBytes)}.`,
      "Pick an SAE with fewer features (the limit protects this surface's memory; a surface may raise it with maxBytes).",
      { file, bytes: r.bound, maxBytes },
    );
  }
  const enc = r.header.tensors.find((t) => t.name === 'W_enc');
  if (enc && cfg && typeof cfg.d_in === 'number' && typeof cfg.d_sae === 'number') {
    if (enc.shape.length !== 2 || enc.shape[0] !== cfg.d_in || enc.shape[1] !== cfg.d_sae)
      throw new LoupeError(
        'SAE_MISMATCH',
        `The SAE's cfg.json says d_in ${cfg.d_in} × d_sae ${cfg.d_sae}, but its W_enc is [${enc.shape.join(', ')}].`,
        'cfg.json and sae_weights.safetensors disagree: the SAE folder is damaged.',
        { file },
      );
  }
  return { bound: r.bound, ...(r.head ? { head: r.head } : {}) };
}

function joinPath(dir: string, file: string): string {
  const d = dir.replace(/^\/+|\/+$/g, '');
  return d ? `${d}/${file}` : file;
}

/** Loaders over any source factory: the browser's (below) and Node's share all the logic. */
export function makeSaeLoaders(plan: (source: string) => SaePlan, maxBytes = DEFAULT_MAX_SAE_BYTES): SaeLoaders {
  const planFor = (ref: SaeSourceRef, what = 'SAE', hint = SOURCE_HINT): SaePlan => {
    if (typeof ref?.source !== 'string' || ref.source.trim() === '') {
      throw new LoupeError('BAD_INPUT', `No ${what} source was given.`, hint);
    }
    if (typeof ref.path !== 'string') throw new LoupeError('BAD_INPUT', `The ${what} path must be a string.`, hint);
    if (ref.path.split('/').includes('..'))
      throw new LoupeError('BAD_INPUT', `The ${what} path ${JSON.stringify(ref.path)} leaves its repository.`, hint);
    return plan(ref.source.trim());
  };
  // A folder that does not exist reads as a missing *model*; say SAE (or transcoder set) instead.
  const reword = (ref: SaeSourceRef, e: unknown, what = 'SAE', hint = SOURCE_HINT): never => {
    if (e instanceof LoupeError && e.code === 'MODEL_NOT_FOUND') {
      throw new LoupeError(
        'MODEL_NOT_FOUND',
        `No ${what} source ${JSON.stringify(ref.source)}: ${e.message}`,
        hint,
        e.details,
      );
    }
    throw e;
  };
  const missing = new Set<string>();
  return {
    async loadTranscoders(ref, opts) {
      planFor(ref, 'transcoder', TRANSCODER_HINT); // the same checks of source and path
      try {
        return await loadTranscoderFiles(ref, (source) => plan(source), opts);
      } catch (e) {
        return reword(ref, e, 'transcoder', TRANSCODER_HINT);
      }
    },
    async loadSae(ref, opts = {}) {
      const { source, cache } = planFor(ref);
      const fetchOpts = { signal: opts.signal, onProgress: opts.onProgress, cache };
      try {
        // the config first, to refuse an SAE too large for this surface before downloading it:
        // SAELens's cfg.json states d_in and d_sae; Gemma Scope 2's config.json does not, so its
        // params.safetensors header is read (two Range requests) where the source can
        const seen = new Map<string, Uint8Array | null>();
        /** an optional JSON file of the SAE's folder, kept (or its absence) so the load does not fetch it again */
        const config = async (name: string) => {
          const file = joinPath(ref.path, name);
          const json = await fetchJson(
            source,
            file,
            { ...fetchOpts, optional: true },
            'maxSaeConfigBytes',
            'BAD_CONFIG',
          );
          seen.set(file, json ? new TextEncoder().encode(JSON.stringify(json)) : null);
          return json;
        };
        const cfg = await config('cfg.json');
        if (cfg) checkSaeSize(cfg, maxBytes);
        if (cfg) opts.judge?.(cfg);
        let weightsFile = joinPath(ref.path, 'sae_weights.safetensors');
        if (!cfg) {
          const gs = await config(GEMMA_SCOPE_2_CONFIG);
          if (gs) weightsFile = joinPath(ref.path, GEMMA_SCOPE_2_PARAMS);
        }
        // then the weights' header, which says how large the file really is (cfg.json may not; config.json never does)
        const { bound, head } = await weightsBound(source, weightsFile, cfg, maxBytes, fetchOpts);
        const once: ModelSource = {
          ref: source.ref,
          fetchFile: (f, o) => (seen.has(f) ? Promise.resolve(seen.get(f)!) : source.fetchFile(f, o)),
        };
        // the download resumes after the header bytes already read
        return await loadSaeFiles(once, ref.path, { ...fetchOpts, maxBytes: bound, ...(head ? { head } : {}) });
      } catch (e) {
        return reword(ref, e);
      }
    },
    async loadSaeFile(ref, file, opts = {}) {
      const { source, cache } = planFor(ref);
      const key = `${ref.source}\u0000${joinPath(ref.path, file)}`;
      // caches keep files, not their absence: remember an optional file found missing, so that
      // loading the same SAE for another model in this session asks the server nothing
      if (opts.optional && missing.has(key)) return null;
      try {
        const bytes = await source.fetchFile(joinPath(ref.path, file), {
          signal: opts.signal,
          onProgress: opts.onProgress,
          cache,
          optional: opts.optional,
          maxBytes: CAPS.maxDescriptionsBytes,
        });
        if (!bytes && opts.optional) missing.add(key);
        return bytes;
      } catch (e) {
        return reword(ref, e);
      }
    },
  };
}

export interface BrowserSaeLoaderOptions {
  /** byte cache for Hub/URL files (the worker passes its IdbCache) */
  cache?: ByteCache;
  /** refuse SAEs whose weights exceed this (default 2 GiB) */
  maxBytes?: number;
  /** Hub endpoint (default https://huggingface.co) */
  endpoint?: string;
  token?: string;
  fetch?: typeof fetch;
}

/** Browser (worker) loaders: Hub ids and URLs, through `cache`. Folders cannot be read here. */
export function createSaeLoaders(opts: BrowserSaeLoaderOptions = {}): SaeLoaders {
  return makeSaeLoaders((spec) => {
    const ref: ResolvedModelRef = resolveModelRef(spec, { endpoint: opts.endpoint });
    if (ref.kind === 'bundled') {
      throw new LoupeError('BAD_INPUT', `${JSON.stringify(spec)} names the bundled model, not an SAE.`, SOURCE_HINT);
    }
    if (ref.kind === 'folder') {
      throw new LoupeError(
        'BAD_INPUT',
        `The page cannot read the local folder ${ref.id}.`,
        'In the page, give the SAE as a Hub repository or an http(s) URL; the CLI reads folders.',
      );
    }
    return {
      source: createSource(ref, { endpoint: opts.endpoint, token: opts.token, fetch: opts.fetch }),
      cache: opts.cache,
    };
  }, opts.maxBytes);
}
