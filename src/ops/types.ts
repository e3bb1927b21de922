/**
 * One operation = one module exporting an `Operation`: an input schema, an output schema and a
 * function (model, input, ctx) → document. The CLI, the worker (page), the MCP bridge and the
 * headless server all call `operation.run` and return its document unchanged.
 */
import type { z } from 'zod';
import type { LoadedModel } from '../engine/api';
import type { SaeFiles } from '../engine/sae';
import type { FileProgress } from '../engine/source/types';

/** Where an SAE lives: a Hub repo (or URL / folder, as for models) and its folder inside it. */
export interface SaeRef {
  /** 'owner/name[@revision]', an http(s) URL, or (Node) a folder */
  source: string;
  /** the SAE's folder inside the source ('' = its root), e.g. 'blocks.8.hook_resid_pre' */
  path: string;
}

export interface Progress {
  /** what is being done, e.g. 'ablating heads' */
  stage: string;
  done: number;
  total: number;
}

export interface OpContext {
  onProgress?: (p: Progress) => void;
  signal?: AbortSignal;
  /** in-memory store for handles (captures, probes) that outlive one call */
  store?: HandleStore;
  /**
   * fetch an SAE's files through this surface's source and cache (Node: folder/Hub + directory
   * cache; page: Hub/URL + IndexedDB), with download progress
   */
  loadSae?: (ref: SaeRef, opts: { signal?: AbortSignal; onProgress?: (p: FileProgress) => void }) => Promise<SaeFiles>;
  /** fetch one more file beside an SAE (e.g. explanations.json); null when optional and absent */
  loadSaeFile?: (ref: SaeRef, file: string, opts: { signal?: AbortSignal; optional?: boolean }) => Promise<Uint8Array | null>;
}

export interface HandleStore {
  put(kind: string, value: unknown): string;
  get<T>(kind: string, id: string): T;
}

export interface Operation<I = any, O = any> {
  name: string;
  /** written for a model (agent) reading it: what it computes, units, conventions, cost */
  description: string;
  input: z.ZodType<I>;
  output: z.ZodType<O>;
  /** long operations (sweeps, scans) that surfaces may run as jobs */
  long?: boolean;
  run(model: LoadedModel, input: I, ctx: OpContext): Promise<O>;
}
