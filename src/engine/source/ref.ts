/**
 * What a user typed as a model -> where to load it from. Pure: no fs, no network.
 *
 *   resolveModelRef('default')                 -> { kind: 'bundled', id: 'stories260K' }
 *   resolveModelRef('owner/name@rev')          -> { kind: 'hub', id: 'owner/name', revision: 'rev', endpoint }
 *   resolveModelRef('https://huggingface.co/owner/name/tree/rev') -> the same Hub model
 *   resolveModelRef('https://host/dir/')       -> { kind: 'url', id: 'https://host/dir/' }
 *   resolveModelRef('./models/x')              -> { kind: 'folder', id: './models/x' }
 *
 * A bare 'name' or 'owner/name' could also be a relative folder: Node passes `isFolder` (an fs
 * check) and a folder that exists wins; the browser passes nothing and gets the Hub.
 *
 * With `names` (a model, not an SAE), a name of the catalog (engine/catalog.ts: TransformerLens's
 * names and aliases, any case) is its Hub id, the name asked for kept as `requested`:
 *   resolveModelRef('gemma-3-270m', { names: true }) -> { kind: 'hub', id: 'google/gemma-3-270m', requested: 'gemma-3-270m', … }
 * and a one-part name it lacks is MODEL_NOT_FOUND naming the nearest ones, before any request.
 */
import { LoupeError } from '../errors';
import { DEFAULT_HUB_ENDPOINT, HUB_ID_PATTERN, isValidHubId } from './hub-source';
import type { ModelRef } from './types';
import { lookupModelName, nearestModelNames } from '../catalog';

export const BUNDLED_MODEL_ID = 'stories260K';
/** where the bundled model lives, relative to the page's base URL (and to the project's public/) */
export const BUNDLED_MODEL_PATH = 'models/stories260K/';

export type ResolvedModelRef = ModelRef | { kind: 'bundled'; id: string; revision: '' };

export interface ResolveOptions {
  /** Hub endpoint for Hub ids (default https://huggingface.co) */
  endpoint?: string;
  /** Node: does this path name an existing directory? */
  isFolder?: (path: string) => boolean;
  /** a model's name: read the catalog's names and aliases (SAE sources pass nothing) */
  names?: boolean;
}

const HUB_ID = new RegExp(`^(${HUB_ID_PATTERN})(?:@([^\\s@]+))?$`);

/** 'default', '' or the bundled model's id: the model that ships with Loupe */
export function isBundledSpec(spec: string): boolean {
  const s = spec.trim();
  return s === '' || s === 'default' || s === BUNDLED_MODEL_ID;
}

export function resolveModelRef(spec: string, opts: ResolveOptions = {}): ResolvedModelRef {
  const s = spec.trim();
  const endpoint = (opts.endpoint ?? DEFAULT_HUB_ENDPOINT).replace(/\/+$/, '');
  if (isBundledSpec(s)) return { kind: 'bundled', id: BUNDLED_MODEL_ID, revision: '' };

  if (/^https?:\/\//i.test(s)) {
    // A model page URL on the Hub itself is taken as the Hub id it names.
    const hub = new URL(endpoint);
    let u: URL;
    try {
      u = new URL(s);
    } catch {
      throw badSpec(spec);
    }
    if (u.origin === hub.origin) {
      const m = /^\/([^/]+\/[^/]+)(?:\/(?:tree|resolve|blob)\/([^/]+))?\/?$/.exec(u.pathname);
      if (m && HUB_ID.test(m[1]))
        return { kind: 'hub', id: m[1], revision: m[2] ? decodeURIComponent(m[2]) : 'main', endpoint };
    }
    return { kind: 'url', id: s.endsWith('/') ? s : `${s}/`, revision: '' };
  }
  if (/^file:\/\//i.test(s)) return { kind: 'folder', id: decodeURIComponent(new URL(s).pathname), revision: '' };
  if (/^(\/|\.\.?([/\\]|$)|~([/\\]|$)|[A-Za-z]:[/\\])/.test(s) || s.includes('\\'))
    return { kind: 'folder', id: s, revision: '' };
  if (opts.isFolder?.(s)) return { kind: 'folder', id: s, revision: '' };

  const m = HUB_ID.exec(s);
  if (m && isValidHubId(m[1])) {
    const revision = m[2] ?? 'main';
    if (!opts.names) return { kind: 'hub', id: m[1], revision, endpoint };
    const named = lookupModelName(m[1]);
    if (named)
      return {
        kind: 'hub',
        id: named.entry.id,
        revision,
        endpoint,
        ...(named.name !== named.entry.id ? { requested: named.name } : {}),
      };
    if (!m[1].includes('/')) throw unknownName(m[1]);
    return { kind: 'hub', id: m[1], revision, endpoint };
  }
  throw badSpec(spec);
}

/** a one-part name the catalog lacks (a Hub id is owner/name) */
function unknownName(name: string): LoupeError {
  const near = nearestModelNames(name);
  return new LoupeError(
    'MODEL_NOT_FOUND',
    `"${name.slice(0, 200)}" is not a model name Loupe knows.`,
    `Did you mean ${near.map((n) => `'${n}'`).join(', ')}? 'loupe models' lists the names (TransformerLens's and a few of ` +
      "Loupe's); any other model is its Hub id, owner/name.",
    { name: name.slice(0, 200), nearest: near },
  );
}

function badSpec(spec: string): LoupeError {
  return new LoupeError(
    'BAD_INPUT',
    `"${spec}" is not a model Loupe can load.`,
    "Use 'default' (the bundled stories260K), a Hub id like 'owner/name' or 'owner/name@revision', " +
      'an http(s) URL of a folder holding config.json, or (CLI) a local folder path.',
  );
}
