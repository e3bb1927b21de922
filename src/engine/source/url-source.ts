/**
 * A model served at any base URL with the files side by side: {base}/{file}.
 *
 *   new UrlSource('https://example.org/models/tiny/')   // also the bundled model in the page
 *
 * Cache key: endpoint = 'url', id = the base URL, revision = ''.
 */
import { LoupeError } from '../errors';
import { HttpSource, type HttpSourceOptions } from './http-source';
import { encodePath } from './hub-source';
import type { CacheKey, ModelRef } from './types';

export class UrlSource extends HttpSource {
  readonly ref: ModelRef;
  private readonly base: string;

  constructor(base: string, opts: HttpSourceOptions = {}) {
    super(opts);
    const b = base.endsWith('/') ? base : `${base}/`;
    try {
      new URL(b);
    } catch {
      throw new LoupeError(
        'BAD_INPUT',
        `"${base}" is not an absolute URL.`,
        'Give a base URL such as https://example.org/models/tiny/',
      );
    }
    this.base = b;
    this.ref = { kind: 'url', id: b, revision: '' };
  }

  url(file: string): string {
    return new URL(encodePath(file), this.base).href;
  }

  cacheKey(file: string): CacheKey {
    return { endpoint: 'url', id: this.base, revision: '', file };
  }
}
