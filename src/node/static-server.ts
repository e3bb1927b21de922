/**
 * A small static file server for the built workbench (`dist/`).
 *
 * Every response carries the cross-origin isolation headers (COOP same-origin + COEP
 * require-corp) because threaded WASM needs SharedArrayBuffer, which browsers only grant to
 * isolated pages. It listens on 127.0.0.1 only. The bridge hub mounts `createStaticHandler`
 * next to its WebSocket endpoint; `npm start` can use `startStaticServer` directly. `npm run preview`
 * (src/node/preview.ts) serves the same folder as a free static host would: under a sub-path, without the isolation
 * headers, so the page's service worker has to make it isolated.
 */
import { createReadStream, promises as fs } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { byteRange } from '../engine/source/byte-range';

export const ISOLATION_HEADERS: Readonly<Record<string, string>> = {
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Embedder-Policy': 'require-corp',
  'Cross-Origin-Resource-Policy': 'same-origin',
  'X-Content-Type-Options': 'nosniff',
  'Referrer-Policy': 'no-referrer',
};
/** what a plain static host sends: none of the isolation headers */
const PLAIN_HEADERS: Readonly<Record<string, string>> = { 'X-Content-Type-Options': 'nosniff' };

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json; charset=utf-8',
  '.map': 'application/json; charset=utf-8',
  '.wasm': 'application/wasm',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.txt': 'text/plain; charset=utf-8',
  '.webmanifest': 'application/manifest+json',
  '.woff2': 'font/woff2',
  '.model': 'application/octet-stream',
  '.safetensors': 'application/octet-stream',
  '.onnx': 'application/octet-stream',
  '.bin': 'application/octet-stream',
};

export interface StaticOptions {
  /** folder to serve (the built page) */
  root: string;
  /** serve index.html for extension-less paths the folder lacks (a single-page app's routes) */
  spaFallback?: boolean;
  /** when given, a request whose Host header is not in this list gets 403 (DNS-rebinding defence) */
  allowedHosts?: string[];
  /** body served with 503 when root has no index.html (e.g. the page was never built) */
  notBuiltHtml?: string;
  /** send COOP/COEP/CORP (default true); false serves as a plain static host does */
  isolation?: boolean;
  /** serve root under this path ('/loupe/'): other paths get 404, the path without its last slash a redirect */
  basePath?: string;
}

export type Handler = (req: http.IncomingMessage, res: http.ServerResponse) => Promise<void>;

function sendWith(
  res: http.ServerResponse,
  status: number,
  body: string,
  type = 'text/plain; charset=utf-8',
  headers: Readonly<Record<string, string>> = ISOLATION_HEADERS,
): void {
  res.writeHead(status, { ...headers, 'Content-Type': type, 'Cache-Control': 'no-store' });
  res.end(body);
}

/** '/loupe', 'loupe/' → '/loupe/'; '' and '/' → '/' */
export function normalizeBasePath(p: string): string {
  const segs = p.split('/').filter(Boolean);
  if (segs.some((s) => s === '..' || s === '.')) throw new Error(`bad base path ${JSON.stringify(p)}`);
  return segs.length ? `/${segs.join('/')}/` : '/';
}

/**
 * Map a URL path to a file strictly inside root, or undefined. Decoding happens once, and both
 * `..` segments and NUL bytes are refused before any filesystem call.
 */
export function resolveInside(root: string, urlPath: string): string | undefined {
  let p: string;
  try {
    p = decodeURIComponent(urlPath.split('?')[0].split('#')[0]);
  } catch {
    return undefined;
  }
  if (p.includes('\0') || p.includes('\\')) return undefined;
  if (p.split('/').some((seg) => seg === '..')) return undefined;
  const abs = path.resolve(root, '.' + path.posix.normalize('/' + p));
  const rootAbs = path.resolve(root);
  return abs === rootAbs || abs.startsWith(rootAbs + path.sep) ? abs : undefined;
}

/**
 * The file to serve for `p`, or undefined. `p` is already lexically inside root; the file's real
 * path (every symlink resolved) must be inside root's real path too, so a link in the folder
 * (`dist/leak.txt -> /etc/passwd`) is refused rather than followed.
 */
async function fileAt(p: string, realRoot: string): Promise<{ path: string; size: number } | undefined> {
  try {
    const real = await fs.realpath(p);
    if (real !== realRoot && !real.startsWith(realRoot + path.sep)) return undefined;
    const st = await fs.stat(real);
    if (st.isFile()) return { path: real, size: st.size };
    if (st.isDirectory()) return fileAt(path.join(real, 'index.html'), realRoot);
  } catch {
    /* not there */
  }
  return undefined;
}

export function createStaticHandler(opts: StaticOptions): Handler {
  const root = path.resolve(opts.root);
  const allowed = opts.allowedHosts?.map((h) => h.toLowerCase());
  const headers = opts.isolation === false ? PLAIN_HEADERS : ISOLATION_HEADERS;
  const basePath = normalizeBasePath(opts.basePath ?? '/');
  const send = (res: http.ServerResponse, status: number, body: string, type?: string) =>
    sendWith(res, status, body, type, headers);
  return async (req, res) => {
    if (allowed && !allowed.includes((req.headers.host ?? '').toLowerCase()))
      return send(res, 403, 'Forbidden: unexpected Host header.\n');
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.setHeader('Allow', 'GET, HEAD');
      return send(res, 405, 'Method not allowed.\n');
    }
    let url = req.url ?? '/';
    if (basePath !== '/') {
      const [pathPart, query] = [url.split('?')[0], url.includes('?') ? url.slice(url.indexOf('?')) : ''];
      if (pathPart === basePath.slice(0, -1)) {
        res.writeHead(301, { ...headers, Location: basePath + query, 'Cache-Control': 'no-store' });
        return void res.end();
      }
      if (!pathPart.startsWith(basePath)) return send(res, 404, 'Not found.\n');
      url = url.slice(basePath.length - 1);
    }
    const target = resolveInside(root, url);
    if (!target) return send(res, 400, 'Bad path.\n');
    // Resolved per request: the folder may be built (or rebuilt) after the server started.
    const realRoot = await fs.realpath(root).catch(() => root);
    let file = await fileAt(target, realRoot);
    if (!file && opts.spaFallback !== false && path.extname(target) === '')
      file = await fileAt(path.join(root, 'index.html'), realRoot);
    if (!file) {
      if (opts.notBuiltHtml && !(await fileAt(path.join(root, 'index.html'), realRoot)))
        return send(res, 503, opts.notBuiltHtml, TYPES['.html']);
      return send(res, 404, 'Not found.\n');
    }
    const ext = path.extname(file.path).toLowerCase();
    // Vite puts content-hashed files under assets/: cache them for good; everything else revalidates.
    const immutable = file.path.includes(`${path.sep}assets${path.sep}`);
    const common = {
      ...headers,
      'Content-Type': TYPES[ext] ?? 'application/octet-stream',
      'Cache-Control': immutable ? 'public, max-age=31536000, immutable' : 'no-cache',
      'Accept-Ranges': 'bytes',
    };
    // one byte range, as static hosts answer it (no ETag is sent, so an If-Range never matches: whole file)
    const range = req.headers['if-range'] ? undefined : byteRange(req.headers.range, file.size);
    if (range === null) {
      res.writeHead(416, { ...common, 'Content-Range': `bytes */${file.size}`, 'Content-Length': '0' });
      return void res.end();
    }
    const [start, end] = range ?? [0, file.size - 1];
    res.writeHead(range ? 206 : 200, {
      ...common,
      'Content-Length': String(Math.max(0, end - start + 1)),
      ...(range ? { 'Content-Range': `bytes ${start}-${end}/${file.size}` } : {}),
    });
    if (req.method === 'HEAD' || file.size === 0) return void res.end();
    await new Promise<void>((resolve) => {
      const s = createReadStream(file!.path, { start, end });
      s.on('error', () => {
        res.destroy();
        resolve();
      });
      s.on('end', resolve);
      s.pipe(res);
    });
  };
}

export interface StaticServer {
  server: http.Server;
  port: number;
  url: string;
  close(): Promise<void>;
}

/** Listen on 127.0.0.1:port (0 = any free port), never another interface; resolves with the port bound. */
export async function listenLoopback(server: http.Server, port: number): Promise<number> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });
  return (server.address() as AddressInfo).port;
}

/** Serve `root` on 127.0.0.1:port (0 = any free port). Never binds another interface. */
export async function startStaticServer(opts: StaticOptions & { port?: number }): Promise<StaticServer> {
  const port = opts.port ?? 0;
  let handler: Handler | undefined;
  const server = http.createServer((req, res) => {
    handler!(req, res).catch(() => res.destroy());
  });
  const bound = await listenLoopback(server, port);
  handler = createStaticHandler({ allowedHosts: [`127.0.0.1:${bound}`, `localhost:${bound}`], ...opts });
  return {
    server,
    port: bound,
    url: `http://127.0.0.1:${bound}${normalizeBasePath(opts.basePath ?? '/')}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections?.();
        server.close(() => resolve());
      }),
  };
}
