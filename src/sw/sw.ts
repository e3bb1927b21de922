/**
 * The page's service worker (built into dist/sw.js by vite.config.ts, with the build's shell inlined), so a copy on
 * any static host is cross-origin isolated and works offline:
 *
 * - every same-origin response gets COOP/COEP/CORP (shell.ts: ISOLATION); cross-origin requests (the Hub, its CDN)
 *   are left to the browser, under the page's embedder policy;
 * - install caches the whole shell (HTML, JS, CSS, onnxruntime's WASM, the bundled model) under a name carrying the
 *   build's version; activate deletes every other version's cache, so a page is served by one build, never a mix;
 *   a new build's worker waits until the page asks it to take over (its "new version ready — reload" notice);
 * - a cache that cannot be written (storage full) leaves a worker that still isolates, answering from the network,
 *   and says so when the page asks.
 */
import { cacheName, CACHE_PREFIX, rangeFromCache, shellFile, withIsolation, type Shell, type SwMessage } from './shell';

declare const __LOUPE_SHELL__: Shell;

const sw = self as unknown as ServiceWorkerGlobalScope;
const SHELL: Shell = __LOUPE_SHELL__;
const CACHE = cacheName(SHELL.version);
const FILES = new Set(SHELL.files);
const scope = () => sw.registration.scope;
let cacheError: string | undefined;

/** Hashed files under assets/ can come from the HTTP cache; the others (index.html, ort/, models/) revalidate. */
async function cacheShell(): Promise<void> {
  const cache = await caches.open(CACHE);
  try {
    for (const f of SHELL.files) {
      const url = new URL(f, scope()).href;
      const res = await fetch(url, { cache: f.startsWith('assets/') ? 'default' : 'no-cache' });
      if (!res.ok) throw new Error(`${f}: HTTP ${res.status}`);
      await cache.put(url, res);
    }
  } catch (e) {
    cacheError =
      e instanceof Error ? `${e.name === 'QuotaExceededError' ? 'storage is full: ' : ''}${e.message}` : String(e);
    await caches.delete(CACHE);
  }
}

sw.addEventListener('install', (e) => e.waitUntil(cacheShell()));

sw.addEventListener('activate', (e) =>
  e.waitUntil(
    (async () => {
      for (const k of await caches.keys()) if (k.startsWith(CACHE_PREFIX) && k !== CACHE) await caches.delete(k);
      await sw.clients.claim();
    })(),
  ),
);

sw.addEventListener('message', (e) => {
  const m = e.data as SwMessage;
  if (m?.type === 'skip-waiting') void sw.skipWaiting();
  if (m?.type === 'status')
    e.waitUntil(
      caches.has(CACHE).then((cached) => {
        const reply: SwMessage = { type: 'status-reply', version: SHELL.version, cached, error: cacheError };
        (e.source as Client | null)?.postMessage(reply);
      }),
    );
});

async function answer(req: Request): Promise<Response> {
  const file = shellFile(req.url, scope(), FILES, req.mode === 'navigate');
  if (file) {
    // caches.match, not caches.open(CACHE).match: open would make an empty cache of that name where none was written
    const hit = await caches.match(new URL(file, scope()).href, { cacheName: CACHE }).catch(() => undefined);
    if (hit) return withIsolation(await rangeFromCache(hit, req.headers.get('range')));
  }
  return withIsolation(await fetch(req));
}

sw.addEventListener('fetch', (e) => {
  const req = e.request;
  if (req.method !== 'GET' || new URL(req.url).origin !== sw.location.origin) return;
  e.respondWith(answer(req));
});
