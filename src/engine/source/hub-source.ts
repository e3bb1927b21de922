/**
 * A model on the Hugging Face Hub (or any server with its layout):
 *   {endpoint}/{id}/resolve/{revision}/{file}
 *
 *   new HubSource('owner/name', { revision: 'main', endpoint: 'https://huggingface.co', token })
 *
 * The access token is sent as `Authorization: Bearer` only to requests whose origin is the
 * endpoint's origin; redirects to other origins (the Hub's CDN) lose it, as fetch strips
 * Authorization on cross-origin redirects. The Hub's `X-Error-Code` header tells a missing
 * repository (MODEL_NOT_FOUND) from a missing file (FILE_NOT_FOUND) and a gated one.
 */
import { CAPS } from '../caps';
import { LoupeError } from '../errors';
import { HttpSource, type HttpSourceOptions } from './http-source';
import type { ByteCache, CacheKey, ModelRef } from './types';

/** where a cache keeps the commit a revision resolved to, beside the model's files */
export const COMMIT_FILE = '.loupe/commit';
const COMMIT_RE = /^[0-9a-f]{40}$/;

export const DEFAULT_HUB_ENDPOINT = 'https://huggingface.co';

export interface HubSourceOptions extends HttpSourceOptions {
  revision?: string;
  endpoint?: string;
  /** Hugging Face access token (gated or private models) */
  token?: string;
  /** the catalog name the id was asked for by (ModelRef.requested) */
  requested?: string;
}

/** One part of a Hub id (the Hub's own rule: letters, digits, '-', '_', '.', not starting or ending with '.' or '-'). */
const HUB_PART = '[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?';
/** `name` or `owner/name`, at most 96 characters a part, no '..' */
export const HUB_ID_PATTERN = `${HUB_PART}(?:/${HUB_PART})?`;
const HUB_ID_RE = new RegExp(`^${HUB_ID_PATTERN}$`);

export function isValidHubId(id: string): boolean {
  return HUB_ID_RE.test(id) && !id.includes('..') && id.split('/').every((p) => p.length <= 96);
}

/** BAD_INPUT (a usage error, before any request) for an id the Hub could never have. */
export function checkHubId(id: string): void {
  if (!isValidHubId(id)) {
    throw new LoupeError(
      'BAD_INPUT',
      `"${id}" is not a valid Hub model id.`,
      "A Hub id is 'owner/name' (or 'name'): letters, digits, '-', '_' and '.', e.g. 'openai-community/gpt2'. Add '@revision' for a branch, tag or commit.",
      { id },
    );
  }
}

/** Percent-encode each path segment of a file name (files may live in sub-folders). */
export function encodePath(file: string): string {
  return file.split('/').map(encodeURIComponent).join('/');
}

export class HubSource extends HttpSource {
  readonly ref: ModelRef;
  private readonly endpoint: string;
  private readonly origin: string;
  private readonly token?: string;
  private resolved?: string;

  constructor(id: string, opts: HubSourceOptions = {}) {
    super(opts);
    const endpoint = (opts.endpoint ?? DEFAULT_HUB_ENDPOINT).replace(/\/+$/, '');
    let origin: string;
    try {
      origin = new URL(endpoint).origin;
    } catch {
      throw new LoupeError('BAD_INPUT', `Hub endpoint "${endpoint}" is not a URL.`, 'Use e.g. https://huggingface.co');
    }
    checkHubId(id);
    // '.' and '..' would move the request's path (…/resolve/../config.json); a revision longer than
    // maxNameChars could name no cache folder
    const rev = opts.revision;
    if (
      rev !== undefined &&
      (rev === '' || /[\s]/.test(rev) || rev === '.' || rev === '..' || rev.length > CAPS.maxNameChars)
    ) {
      throw new LoupeError(
        'BAD_INPUT',
        `"${rev.length > 80 ? `${rev.slice(0, 80)}…` : rev}" is not a valid revision.`,
        `Give a branch, tag or commit hash (default main), at most ${CAPS.maxNameChars} characters.`,
        { revision: rev.slice(0, 200) },
      );
    }
    this.endpoint = endpoint;
    this.origin = origin;
    this.token = opts.token || undefined;
    this.ref = {
      kind: 'hub',
      id,
      revision: opts.revision || 'main',
      endpoint,
      ...(opts.requested ? { requested: opts.requested } : {}),
    };
  }

  /**
   * The commit the revision resolved to (the Hub's X-Repo-Commit), once a response said so or
   * the cache remembered it. From then on every file is fetched at that commit, so one load
   * never mixes files of two commits even if the branch moves meanwhile.
   */
  get commit(): string | undefined {
    return this.resolved ?? (COMMIT_RE.test(this.ref.revision) ? this.ref.revision : undefined);
  }

  protected override noteCommit(commit: string, from: string): void {
    // only the Hub's own answers count (a CDN behind a redirect speaks for nothing)
    let origin = '';
    try {
      origin = new URL(from).origin;
    } catch {
      /* keep '' */
    }
    if (origin === this.origin) this.resolved ??= commit;
  }

  /**
   * Keep the commit beside the cached files (after a download) or take it from there (a load
   * that made no request), so documents name the commit of the bytes they ran on.
   */
  async syncCommit(cache?: ByteCache): Promise<void> {
    if (!cache || COMMIT_RE.test(this.ref.revision)) return;
    const key = this.cacheKey(COMMIT_FILE);
    try {
      if (this.resolved) {
        const have = await cache.get(key);
        if (!have || new TextDecoder().decode(have) !== this.resolved)
          await cache.put(key, new TextEncoder().encode(this.resolved));
      } else {
        const have = await cache.get(key);
        const c = have ? new TextDecoder().decode(have) : '';
        if (COMMIT_RE.test(c)) this.resolved = c;
      }
    } catch {
      /* the cache is best effort */
    }
  }

  url(file: string): string {
    const rev = this.resolved ?? this.ref.revision;
    return `${this.endpoint}/${encodePath(this.ref.id)}/resolve/${encodeURIComponent(rev)}/${encodePath(file)}`;
  }

  cacheKey(file: string): CacheKey {
    return { endpoint: this.endpoint, id: this.ref.id, revision: this.ref.revision, file };
  }

  protected override headersFor(url: string): Record<string, string> {
    if (!this.token) return {};
    let origin: string;
    try {
      origin = new URL(url).origin;
    } catch {
      return {};
    }
    return origin === this.origin ? { Authorization: `Bearer ${this.token}` } : {};
  }

  protected override authHint(_file: string, res: Response): string {
    const code = res.headers.get('x-error-code');
    if (code === 'GatedRepo') {
      return (
        `${this.ref.id} is gated: accept its license on the model page, then give Loupe ` +
        'a Hugging Face access token with read access (CLI and MCP companion: HF_TOKEN; ' +
        `page: the Access token field)${this.token ? ' — the token given was refused' : ''}.`
      );
    }
    return this.token
      ? 'The Hugging Face access token was refused: check that it is valid and has read access ' +
          'to this model (gated models also need their license accepted on the model page).'
      : 'This model may be private or gated: give Loupe a Hugging Face access token ' +
          'with read access (CLI and MCP companion: the HF_TOKEN environment variable; ' +
          'page: the Access token field), and accept the license on the model page.';
  }

  protected override notFound(file: string, url: string, res: Response): LoupeError {
    const code = res.headers.get('x-error-code');
    if (code === 'RepositoryNotFound') {
      return new LoupeError(
        'MODEL_NOT_FOUND',
        `No model "${this.ref.id}" at ${this.endpoint}.`,
        this.token
          ? 'Check the id (owner/name); if the model is private, check that the token can read it.'
          : 'Check the id (owner/name); if the model is private or gated, give Loupe an access token.',
        { id: this.ref.id, file, url, status: res.status },
      );
    }
    if (code === 'RevisionNotFound') {
      return new LoupeError(
        'MODEL_NOT_FOUND',
        `Model "${this.ref.id}" has no revision "${this.ref.revision}".`,
        'Check the revision after @ (a branch, tag or commit).',
        { id: this.ref.id, revision: this.ref.revision, file, url, status: res.status },
      );
    }
    return new LoupeError(
      'FILE_NOT_FOUND',
      `${file} not found in ${this.ref.id}@${this.ref.revision} (HTTP ${res.status}).`,
      undefined,
      { file, url, status: res.status, ...(code === 'EntryNotFound' ? { entryNotFound: true } : {}) },
    );
  }
}
