/**
 * SAE (and transcoder) loading in Node, for the CLI and the headless bridge to inject into operations:
 *
 *   const sae = createNodeSaeLoaders();            // DirCache at $LOUPE_CACHE_DIR or ~/.cache/loupe
 *   op.run(model, input, { ...ctx, loadSae: sae.loadSae, loadSaeFile: sae.loadSaeFile });
 *
 * Sources are resolved as for models (`sourceFromSpec`): a local folder is read directly (no
 * cache); a Hub repo or URL goes through the directory cache, so a second load — by a new
 * process or for a new model — makes no requests. Progress is per file (FileProgress).
 */
import type { ByteCache } from '../engine/source/types';
import { makeSaeLoaders, type SaeLoaders } from '../engine/source/sae-loader';
import { LoupeError } from '../engine/errors';
import { BUNDLED_MODEL_ID } from '../engine/source/ref';
import { DirCache } from './dir-cache';
import { FolderSource } from './folder-source';
import { diskWeightReader, sourceFromSpec } from './load-files-node';
import type { LocalAccess } from './local-access';
import type { NetAccess } from './net-access';

export interface NodeSaeLoaderOptions {
  /** byte cache for Hub/URL SAEs (default: a DirCache at the default location); false = none */
  cache?: ByteCache | false;
  /** Hub endpoint (default $HF_ENDPOINT or https://huggingface.co) */
  endpoint?: string;
  /** Hugging Face token (default $HF_TOKEN) */
  token?: string;
  /** refuse SAEs whose weights exceed this many bytes (default 2 GiB, checked from cfg.json before the weights are fetched) */
  maxBytes?: number;
  /** local folders the caller may read (default 'any': the CLI's user; MCP callers get only --allow-local folders) */
  local?: LocalAccess;
  /** hosts the caller may make this process fetch from (default 'any'; loupe serve: --allow-host) */
  net?: NetAccess;
}

export function createNodeSaeLoaders(opts: NodeSaeLoaderOptions = {}): SaeLoaders {
  let cache: ByteCache | undefined;
  // created on first remote load, so folder-only use never touches the cache directory
  const cacheFor = () => (opts.cache === false ? undefined : (cache ??= opts.cache || new DirCache()));
  return makeSaeLoaders((spec) => {
    if (spec === 'default' || spec === BUNDLED_MODEL_ID) {
      throw new LoupeError(
        'BAD_INPUT',
        `${JSON.stringify(spec)} names the bundled model, not an SAE.`,
        "Give the SAE's Hub repository, URL or folder as sae_source.",
      );
    }
    const source = sourceFromSpec(spec, {
      endpoint: opts.endpoint,
      token: opts.token,
      local: opts.local,
      net: opts.net,
    });
    // transcoder weight files stay on disk (the folder, or the directory cache), read by range
    return { source, cache: source instanceof FolderSource ? undefined : cacheFor(), reader: diskWeightReader };
  }, opts.maxBytes);
}
