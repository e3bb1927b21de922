// The library's browser build as a user's page bundles it (e2e/library.spec.ts builds this with Vite):
// onnxruntime-web configured here, its runtime files served from /ort/, one thread. On a page it is
// `window.loupe`; loaded as a module Worker it runs the code each message sends, with `loupe` and a
// `console` whose lines it posts back (test-only: nothing ships this file).
import * as ort from 'onnxruntime-web';
import * as loupe from '../../src/library/browser';
import type { OrtModule } from '../../src/engine/runtime/ort-session';

ort.env.wasm.wasmPaths = '/ort/';
ort.env.wasm.numThreads = 1;
const api = {
  ...loupe,
  loadModel: (spec: string, opts: object = {}) =>
    loupe.loadModel(spec, { backend: 'wasm', ...opts, ort: ort as unknown as OrtModule }),
};
(globalThis as unknown as { loupe: unknown }).loupe = api;
if (typeof window === 'undefined') {
  const AsyncFunction = Object.getPrototypeOf(async () => {}).constructor;
  self.onmessage = async (e: MessageEvent<string>) => {
    const logs: string[] = [];
    try {
      await new AsyncFunction('loupe', 'console', e.data)(api, { log: (...a: unknown[]) => logs.push(a.join(' ')) });
      self.postMessage({ logs, inWorker: typeof window === 'undefined' });
    } catch (err) {
      self.postMessage({ error: String(err) });
    }
  };
}
