/**
 * A resolved model reference -> a ModelSource, in the browser (or any fetch-capable runtime).
 *
 *   createSource(resolveModelRef('owner/name@main'), { token, endpoint })
 *   createSource({ kind: 'bundled', ... }, { baseUrl: location.href })   // the bundled stories260K
 *
 * The one "reference → source" switch, for the browser and Node alike: Node passes `local`, its
 * way to read the bundled model and folders from disk (src/node/load-files-node.ts
 * `sourceFromSpec`); without it a folder is refused and the bundled model is fetched by URL.
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
  /** the runtime's local files (Node): the bundled model's folder, and folders by path */
  local?: LocalSources;
}

export interface LocalSources {
  bundled(): ModelSource;
  folder(ref: { id: string }): ModelSource;
}

export function createSource(ref: ResolvedModelRef, opts: CreateSourceOptions = {}): ModelSource {
  switch (ref.kind) {
    case 'bundled': {
      if (opts.local) return opts.local.bundled();
      const base = opts.baseUrl ?? (globalThis as { location?: { href: string } }).location?.href;
      if (!base)
        throw new LoupeError(
          'BAD_INPUT',
          'No base URL to find the bundled model from.',
          'Pass baseUrl (the page URL) or, in Node, use loadModelFilesNode.',
        );
      return new UrlSource(new URL(BUNDLED_MODEL_PATH, base).href, opts);
    }
    case 'hub':
      return new HubSource(ref.id, {
        ...opts,
        revision: ref.revision,
        endpoint: opts.endpoint ?? ref.endpoint,
        requested: ref.requested,
      });
    case 'url':
      return new UrlSource(ref.id, opts);
    case 'folder':
      if (opts.local) return opts.local.folder(ref);
      throw new LoupeError(
        'BAD_INPUT',
        `A local folder (${ref.id}) can only be loaded by the CLI.`,
        'In the page, load a Hub id or URL, or pick the folder with the file picker.',
      );
  }
}
