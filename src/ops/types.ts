/**
 * One operation = one module exporting an `Operation`: an input schema, an output schema and a
 * function (model, input, ctx) → document. The CLI, the worker (page), the MCP bridge and the
 * headless server all call `operation.run` and return its document unchanged.
 */
import type { z } from 'zod';
import type { LoadedModel } from '../engine/api';

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
