/**
 * What the page's service worker does to a response, apart from the worker's events (so tests can call it): the
 * isolation headers, the versioned cache's name, which cached file answers a request, and a byte range cut from a
 * cached file.
 */
import { byteRange } from '../engine/source/byte-range';

/** the build's app shell: its version (a hash of every file in dist/) and the files, relative to the page */
export interface Shell {
  version: string;
  files: string[];
}

export const CACHE_PREFIX = 'loupe-shell-';
export const cacheName = (version: string): string => `${CACHE_PREFIX}${version}`;

/**
 * Added to every same-origin response: threaded WASM needs SharedArrayBuffer, which only a cross-origin isolated
 * page gets. require-corp rather than credentialless (which Safari lacks): the engine's downloads are CORS-mode
 * fetches, which require-corp admits, through the Hub's cross-origin redirects to its CDN too.
 */
export const ISOLATION: Readonly<Record<string, string>> = {
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Embedder-Policy': 'require-corp',
  'Cross-Origin-Resource-Policy': 'same-origin',
};

const NULL_BODY = new Set([101, 103, 204, 205, 304]);

/** The response with the isolation headers added; opaque ones (status 0) pass as they are. */
export function withIsolation(res: Response): Response {
  if (res.status === 0 || res.type === 'opaqueredirect') return res;
  const headers = new Headers(res.headers);
  for (const [k, v] of Object.entries(ISOLATION)) headers.set(k, v);
  return new Response(NULL_BODY.has(res.status) ? null : res.body, {
    status: res.status,
    statusText: res.statusText,
    headers,
  });
}

/**
 * The shell file that answers `url` (relative to the worker's scope), or undefined: a navigation to the scope itself,
 * with any query, is index.html.
 */
export function shellFile(
  url: string,
  scope: string,
  files: ReadonlySet<string>,
  navigate: boolean,
): string | undefined {
  if (!url.startsWith(scope)) return undefined;
  const rel = decodeURIComponent(url.slice(scope.length).split('#')[0].split('?')[0]);
  if (navigate && (rel === '' || rel === 'index.html')) return files.has('index.html') ? 'index.html' : undefined;
  return files.has(rel) ? rel : undefined;
}

/** A cached whole file answering `range` (a Range header): 206 with its part, 416 outside it, else the file. */
export async function rangeFromCache(res: Response, range: string | null): Promise<Response> {
  if (!range) return res;
  const blob = await res.blob();
  const r = byteRange(range, blob.size);
  const headers = new Headers(res.headers);
  if (r === undefined) return new Response(blob, { status: res.status, headers });
  if (r === null) {
    headers.set('Content-Range', `bytes */${blob.size}`);
    headers.set('Content-Length', '0');
    return new Response(null, { status: 416, headers });
  }
  const [start, end] = r;
  headers.set('Content-Range', `bytes ${start}-${end}/${blob.size}`);
  headers.set('Content-Length', String(end - start + 1));
  return new Response(blob.slice(start, end + 1), { status: 206, headers });
}

/** messages between the page and its service worker */
export type SwMessage =
  | { type: 'status' }
  | { type: 'skip-waiting' }
  | { type: 'status-reply'; version: string; cached: boolean; error?: string };
