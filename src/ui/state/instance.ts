/** The page's single AppState, with the model worker it owns. */
import { AppState } from './app.svelte';
import { ServiceWorkerState } from './service-worker.svelte';

// `?wasm_threads=N` (for measuring 1 thread against all) and `?tensor_bytes=N` (a lower limit on
// one tensor, so the split vocabulary path runs on any adapter and model: tests) reach the worker
// in its name, which it reads before onnxruntime-web starts its thread pool; so does the page's own base URL (the
// folder index.html is served from, at / or under any sub-path), which the worker's own URL under assets/ is not
const query = new URLSearchParams(location.search);
const knobs = ['wasm_threads', 'tensor_bytes']
  .map((k) => [k, query.get(k)] as const)
  .filter(([, v]) => v && /^\d+$/.test(v))
  .map(([k, v]) => ` ${k}=${v}`)
  .join('');
// `?ort=jsep` or `?ort=native`: that onnxruntime-web build only (workers/ort-runtime.ts), for comparing them
const ort = /^(jsep|native)$/.exec(query.get('ort') ?? '')?.[1];
const base = ` base=${encodeURIComponent(new URL(import.meta.env.BASE_URL, document.baseURI).href)}`;
export const app = new AppState(
  () =>
    new Worker(new URL('../../../workers/engine.worker.ts', import.meta.url), {
      type: 'module',
      name: `loupe-engine${knobs}${ort ? ` ort=${ort}` : ''}${base}`,
    }),
);

/** the page's service worker: isolation on any host, the offline shell, new-version notices */
export const serviceWorker = new ServiceWorkerState((kind, text, ms) => app.notify(kind, text, ms));
