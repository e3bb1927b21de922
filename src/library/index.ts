/**
 * Loupe as a library, in Node (`import { loadModel } from 'loupe'`; package.json's exports point
 * here through library/node.mjs): load a model on onnxruntime-node (or WASM, or WebGPU), then
 * script it as a TransformerLens HookedTransformer (./model.ts) and run every operation as a
 * function (`ops.trace(model, input)` returns the CLI's document). docs/LIBRARY.md is its guide.
 */
import { loadModelNode, type NodeModelOptions } from '../node/load';
import { Model, makeOps } from './model';

export { Model, makeOps } from './model';
export type { Config, HookFn, HookSpec, HookContext, Input, CacheOptions, HooksOptions, Ops } from './model';
export type { Weights, Layered } from './weights';
export { getActName } from './names';
export * as tensor from './tensor';
export type { Tensor } from './tensor';
export { LoupeError } from '../engine/errors';
export type { Intervention, LoadedModel } from '../engine/api';

export interface LoadModelOptions extends Pick<NodeModelOptions, 'signal' | 'onProgress' | 'threads' | 'memory'> {
  /** node (onnxruntime-node on the CPU, default), wasm or webgpu */
  backend?: NodeModelOptions['backend'];
  /** weight precision: auto (default), f32, stored, q8 or q4 */
  weights?: NodeModelOptions['weights'];
}

/** a model by Hub id, catalog name ('gpt2'), folder or URL; 'default' is the bundled stories260K */
export async function loadModel(spec: string, opts: LoadModelOptions = {}): Promise<Model> {
  return new Model(await loadModelNode(spec, opts));
}

/** every operation as a function, with Node's SAE and transcoder loaders */
export const ops = makeOps(async () => {
  const sae = (await import('../node/load-sae')).createNodeSaeLoaders();
  return { loadSae: sae.loadSae, loadSaeFile: sae.loadSaeFile, loadTranscoders: sae.loadTranscoders };
});
