/**
 * Loading SAEs (SAELens layout) through the same sources and byte caches as models, for a
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
import { LoupeError } from '../errors';
import { loadSaeFiles, type SaeFiles } from '../sae';
import { createSource } from './create-source';
import { resolveModelRef, type ResolvedModelRef } from './ref';
import type { ByteCache, FileProgress, ModelSource } from './types';

/** Structurally the ops' SaeRef (the engine does not import from ops). */
export interface SaeSourceRef {
  source: string;
  path: string;
}

export interface SaeLoadOptions {
  signal?: AbortSignal;
  onProgress?: (p: FileProgress) => void;
}

export interface SaeLoaders {
  /** cfg.json + sae_weights.safetensors of the SAE at ref */
  loadSae(ref: SaeSourceRef, opts?: SaeLoadOptions): Promise<SaeFiles>;
  /** one more file of the SAE's folder (e.g. explanations.json); null when `optional` and absent */
  loadSaeFile(ref: SaeSourceRef, file: string, opts?: SaeLoadOptions & { optional?: boolean }): Promise<Uint8Array | null>;
}

/** where an SAE source's bytes come from, and the cache they go through (none for local folders) */
export interface SaePlan {
  source: ModelSource;
  cache?: ByteCache;
}

const SOURCE_HINT = "sae_source is a Hub repository ('owner/name' or 'owner/name@revision'), an http(s) URL of a folder, or (CLI) a local folder; sae_path is the SAE's folder inside it, e.g. 'blocks.8.hook_resid_pre'.";

function joinPath(dir: string, file: string): string {
  const d = dir.replace(/^\/+|\/+$/g, '');
  return d ? `${d}/${file}` : file;
}

/** Loaders over any source factory: the browser's (below) and Node's share all the logic. */
export function makeSaeLoaders(plan: (source: string) => SaePlan): SaeLoaders {
  const planFor = (ref: SaeSourceRef): SaePlan => {
    if (typeof ref?.source !== 'string' || ref.source.trim() === '') {
      throw new LoupeError('BAD_INPUT', 'No SAE source was given.', SOURCE_HINT);
    }
    if (typeof ref.path !== 'string') throw new LoupeError('BAD_INPUT', 'The SAE path must be a string.', SOURCE_HINT);
    if (ref.path.split('/').includes('..')) throw new LoupeError('BAD_INPUT', `The SAE path ${JSON.stringify(ref.path)} leaves its repository.`, SOURCE_HINT);
    return plan(ref.source.trim());
  };
  // A folder that does not exist reads as a missing *model*; say SAE instead.
  const reword = (ref: SaeSourceRef, e: unknown): never => {
    if (e instanceof LoupeError && e.code === 'MODEL_NOT_FOUND') {
      throw new LoupeError('MODEL_NOT_FOUND', `No SAE source ${JSON.stringify(ref.source)}: ${e.message}`, SOURCE_HINT, e.details);
    }
    throw e;
  };
  const missing = new Set<string>();
  return {
    async loadSae(ref, opts = {}) {
      const { source, cache } = planFor(ref);
      try {
        return await loadSaeFiles(source, ref.path, { signal: opts.signal, onProgress: opts.onProgress, cache });
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
        const bytes = await source.fetchFile(joinPath(ref.path, file), { signal: opts.signal, onProgress: opts.onProgress, cache, optional: opts.optional });
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
      throw new LoupeError('BAD_INPUT', `The page cannot read the local folder ${ref.id}.`, 'In the page, give the SAE as a Hub repository or an http(s) URL; the CLI reads folders.');
    }
    return { source: createSource(ref, { endpoint: opts.endpoint, token: opts.token, fetch: opts.fetch }), cache: opts.cache };
  });
}
