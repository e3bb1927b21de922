/**
 * Activation collection shared by `capture` and contrastive directions (ops/lib/directions.ts):
 * run prompts (equal lengths batched together) and reduce each hook to one vector per prompt.
 */
import { z } from 'zod';
import type { LoadedModel } from '../../engine/api';
import { LoupeError, throwIfAborted } from '../../engine/errors';
import { CAPS } from '../../engine/caps';
import { promptIds } from './tokens';

/** most prompts one capture may hold */
export const MAX_CAPTURE_PROMPTS = 1024;
/** most hooks one capture may read */
export const MAX_CAPTURE_HOOKS = 16;
/** bytes one capture may keep, whatever the store allows */
export const MAX_CAPTURE_BYTES = 128 * 1024 * 1024;

export type CapturePosition = 'last' | 'mean' | number;

export const labelSchema = z.union([z.number(), z.string(), z.boolean()]);
export type Label = z.infer<typeof labelSchema>;

/** what the store keeps under kind 'capture' */
export interface CaptureHandleValue {
  model_id: string;
  hooks: string[];
  position: CapturePosition;
  prepend_bos: boolean;
  prompts: string[];
  labels: (Label | null)[];
  /** values per prompt for each hook */
  dims: Record<string, number>;
  /** [n_prompts × dims[hook]] row-major */
  data: Record<string, Float32Array>;
}

export interface CollectOptions {
  position: CapturePosition;
  prependBos: boolean;
  signal?: AbortSignal;
  onProgress?: (done: number, total: number) => void;
}

export interface Collected {
  dims: Record<string, number>;
  data: Record<string, Float32Array>;
  nTokens: number[];
  ids: number[][];
}

/** Check hooks exist and have a position axis; returns whether the 'result' graph variant is needed. */
export function checkCaptureHooks(
  model: LoadedModel,
  hooks: string[],
): { withResult: boolean; dims: Record<string, number> } {
  const plain = new Set(model.hookNames());
  const withRes = new Set(model.hookNames({ withResult: true }));
  let withResult = false;
  const dims: Record<string, number> = {};
  for (const h of hooks) {
    if (!withRes.has(h))
      throw new LoupeError(
        'UNKNOWN_HOOK',
        `No hook named ${JSON.stringify(h)} in this model.`,
        'Use TransformerLens names such as blocks.2.hook_resid_pre; `loupe activations` lists them.',
      );
    if (/hook_(pattern|attn_scores)$/.test(h))
      throw new LoupeError(
        'BAD_INPUT',
        `${h} has no single position axis to capture.`,
        'Capture hook_z, hook_resid_*, hook_*_out or mlp hooks instead.',
      );
    if (!plain.has(h)) withResult = true;
    const shape = model.hookShape(h, 1, 2);
    dims[h] = shape.slice(2).reduce((a, b) => a * b, 1);
  }
  return { withResult, dims };
}

/** Run prompts and reduce each hook to one vector per prompt. */
export async function collectActivations(
  model: LoadedModel,
  prompts: string[],
  hooks: string[],
  opts: CollectOptions,
): Promise<Collected> {
  const { withResult, dims } = checkCaptureHooks(model, hooks);
  const ids = prompts.map((p) => promptIds(model, p, { prependBos: opts.prependBos }));
  // resolve positions before any run, so a bad index fails at once
  const pos = ids.map((t, i) => {
    if (typeof opts.position !== 'number') return -1;
    const p = opts.position < 0 ? t.length + opts.position : opts.position;
    if (p < 0 || p >= t.length)
      throw new LoupeError(
        'BAD_INPUT',
        `position ${opts.position} is outside prompt ${i} (${t.length} tokens).`,
        'Use a position inside every prompt, or "last".',
      );
    return p;
  });
  const data: Record<string, Float32Array> = {};
  for (const h of hooks) data[h] = new Float32Array(prompts.length * dims[h]);
  // group by length: rows of one engine run must have equal length
  const groups = new Map<number, number[]>();
  ids.forEach((t, i) => {
    const g = groups.get(t.length) ?? [];
    g.push(i);
    groups.set(t.length, g);
  });
  const chunks: number[][] = [];
  for (const g of groups.values())
    for (let s = 0; s < g.length; s += CAPS.maxBatch) chunks.push(g.slice(s, s + CAPS.maxBatch));
  let done = 0;
  for (const chunk of chunks) {
    throwIfAborted(opts.signal);
    const T = ids[chunk[0]].length;
    const res = await model.run(chunk.length === 1 ? ids[chunk[0]] : chunk.map((i) => ids[i]), {
      hooks,
      withResult,
      signal: opts.signal,
    });
    for (const h of hooks) {
      const n = dims[h];
      const src = res.hooks[h].data;
      const dst = data[h];
      chunk.forEach((pi, r) => {
        const base = r * T * n;
        const out = pi * n;
        if (opts.position === 'mean') {
          // BOS carries no information about the prompt and often a huge norm: leave it out
          const skipBos = opts.prependBos && T > 1 && model.bosTokenId !== undefined && ids[pi][0] === model.bosTokenId;
          const t0 = skipBos ? 1 : 0;
          for (let t = t0; t < T; t++) for (let j = 0; j < n; j++) dst[out + j] += src[base + t * n + j] / (T - t0);
        } else {
          const t = opts.position === 'last' ? T - 1 : pos[pi];
          for (let j = 0; j < n; j++) dst[out + j] = src[base + t * n + j];
        }
      });
    }
    done += chunk.length;
    opts.onProgress?.(done, prompts.length);
  }
  return { dims, data, nTokens: ids.map((t) => t.length), ids };
}
