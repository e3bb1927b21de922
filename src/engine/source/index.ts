/** Model sources, caches and file loading: the public surface of src/engine/source (browser-safe). */
export * from './types';
export { HttpSource, type HttpSourceOptions } from './http-source';
export { HubSource, DEFAULT_HUB_ENDPOINT, type HubSourceOptions } from './hub-source';
export { UrlSource } from './url-source';
export { MemorySource, type MemoryFile } from './memory-source';
export { IdbCache, type IdbCacheOptions } from './idb-cache';
export {
  resolveModelRef,
  BUNDLED_MODEL_ID,
  BUNDLED_MODEL_PATH,
  type ResolvedModelRef,
  type ResolveOptions,
} from './ref';
export { createSource, type CreateSourceOptions } from './create-source';
export {
  loadModelFiles,
  loadModelFilesWith,
  validateIndex,
  type LoadFilesOptions,
  type ModelFiles,
  type WeightReader,
  type WeightFileResult,
} from './files';
