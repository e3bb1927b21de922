// The library's browser build as a user's page bundles it (e2e/library.spec.ts builds this with Vite):
// onnxruntime-web configured here, its runtime files served from /ort/, one thread.
import * as ort from 'onnxruntime-web';
import * as loupe from '../../src/library/browser';
import type { OrtModule } from '../../src/engine/runtime/ort-session';

ort.env.wasm.wasmPaths = '/ort/';
ort.env.wasm.numThreads = 1;
(window as unknown as { loupe: unknown }).loupe = {
  ...loupe,
  loadModel: (spec: string, opts: object = {}) =>
    loupe.loadModel(spec, { backend: 'wasm', ...opts, ort: ort as unknown as OrtModule }),
};
