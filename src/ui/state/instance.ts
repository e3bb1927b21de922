/** The page's single AppState, with the model worker it owns. */
import { AppState } from './app.svelte';

// `?wasm_threads=N` (for measuring 1 thread against all) reaches the worker in its name, which it
// reads before onnxruntime-web starts its thread pool
const threads = new URLSearchParams(location.search).get('wasm_threads');
export const app = new AppState(
  () => new Worker(new URL('../../../workers/engine.worker.ts', import.meta.url), { type: 'module', name: `loupe-engine${threads && /^\d+$/.test(threads) ? ` wasm_threads=${threads}` : ''}` }),
);
