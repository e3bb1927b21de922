/**
 * Loupe as a library in the browser: the same `Model` (./model.ts) as in Node, its engine on
 * onnxruntime-web (WebGPU when the browser has an adapter, else WASM). The caller passes the
 * onnxruntime-web module it configured (`ort.env.wasm.wasmPaths`, threads), as the page's worker does.
 */
import { loadModelBrowser, type BrowserLoadOptions } from '../engine/index';
import { Model, makeOps } from './model';

export { Model, makeOps } from './model';
export type { Config, HookFn, HookSpec, HookContext, Input, CacheOptions, HooksOptions, Ops } from './model';
export type { Weights, Layered } from './weights';
export { getActName } from './names';
export * as tensor from './tensor';
export type { Tensor } from './tensor';
export { LoupeError } from '../engine/errors';

/** a model by Hub id, catalog name or URL of a folder with config.json (BrowserLoadOptions: ort, backend, weights, …) */
export async function loadModel(spec: string, opts: BrowserLoadOptions): Promise<Model> {
  return new Model(await loadModelBrowser(spec, opts));
}

/** every operation as a function (SAE operations need the page's loaders in their context) */
export const ops = makeOps();
