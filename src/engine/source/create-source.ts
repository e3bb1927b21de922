/**
 * A resolved model reference -> a ModelSource, in the browser (or any fetch-capable runtime).
 *
 *   createSource(resolveModelRef('owner/name@main'), { token, endpoint })
 *   createSource({ kind: 'bundled', ... }, { baseUrl: location.href })   // the bundled stories260K
 *
 * Folders are Node-only: src/node/load-files-node.ts `sourceFromSpec` handles them.
 */
import { LoupeError } from '../errors';
import type { HttpSourceOptions } from './http-source';
import { HubSource } from './hub-source';
import { BUNDLED_MODEL_PATH, type ResolvedModelRef } from './ref';
import type { ModelSource } from './types';
import { UrlSource } from './url-source';

export interface CreateSourceOptions extends HttpSourceOptions {
  /** base URL the bundled model's path is relative to (the page's URL; default globalThis.location) */
  baseUrl?: string;
  /** Hub endpoint, overriding the ref's */
  endpoint?: string;
  token?: string;
}

export function createSource(ref: ResolvedModelRef, opts: CreateSourceOptions = {}): ModelSource {
  switch (ref.kind) {
    case 'bundled': {
      const base = opts.baseUrl ?? (globalThis as { location?: { href: string } }).location?.href;
      if (!base) throw new LoupeError('BAD_INPUT', 'No base URL to find the bundled model from.', 'Pass baseUrl (the page URL) or, in Node, use loadModelFilesNode.');
      return new UrlSource(new URL(BUNDLED_MODEL_PATH, base).href, opts);
    }
    case 'hub': return new HubSource(ref.id, { ...opts, revision: ref.revision, endpoint: opts.endpoint ?? ref.endpoint });
    case 'url': return new UrlSource(ref.id, opts);
    case 'folder':
      throw new LoupeError('BAD_INPUT', `A local folder (${ref.id}) can only be loaded by the CLI.`, 'In the page, load a Hub id or URL, or pick the folder with the file picker.');
  }
}
