/**
 * `capture`: run a labelled set of prompts, keep one activation vector per prompt per hook (final
 * position, a chosen position, or the mean over positions) in the handle store, and return the
 * handle. `probe` trains on it; `steer` can use a probe trained on it.
 *
 * Prompts of equal token length run together through the engine's batch dimension.
 */
import { z } from 'zod';
import type { LoadedModel } from '../engine/api';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { documentBase, documentHead } from '../schema/common';
import type { Operation, OpContext } from './types';
import { CAPS, parseInput } from './lib/caps';
import { promptIds } from './lib/tokens';
import { storeLimit, storeOf } from './lib/handle-store';

/** most prompts one capture may hold */
export const MAX_CAPTURE_PROMPTS = 1024;
/** most hooks one capture may read */
export const MAX_CAPTURE_HOOKS = 16;
/** bytes one capture may keep, whatever the store allows */
export const MAX_CAPTURE_BYTES = 128 * 1024 * 1024;

export type CapturePosition = 'last' | 'mean' | number;

const labelSchema = z.union([z.number(), z.string(), z.boolean()]);
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
export function checkCaptureHooks(model: LoadedModel, hooks: string[]): { withResult: boolean; dims: Record<string, number> } {
  const plain = new Set(model.hookNames());
  const withRes = new Set(model.hookNames({ withResult: true }));
  let withResult = false;
  const dims: Record<string, number> = {};
  for (const h of hooks) {
    if (!withRes.has(h)) throw new LoupeError('UNKNOWN_HOOK', `No hook named ${JSON.stringify(h)} in this model.`, 'Use TransformerLens names such as blocks.2.hook_resid_pre; `loupe activations` lists them.');
    if (/hook_(pattern|attn_scores)$/.test(h)) throw new LoupeError('BAD_INPUT', `${h} has no single position axis to capture.`, 'Capture hook_z, hook_resid_*, hook_*_out or mlp hooks instead.');
    if (!plain.has(h)) withResult = true;
    const shape = model.hookShape(h, 1, 2);
    dims[h] = shape.slice(2).reduce((a, b) => a * b, 1);
  }
  return { withResult, dims };
}

/** Run prompts and reduce each hook to one vector per prompt. */
export async function collectActivations(model: LoadedModel, prompts: string[], hooks: string[], opts: CollectOptions): Promise<Collected> {
  const { withResult, dims } = checkCaptureHooks(model, hooks);
  const ids = prompts.map((p) => promptIds(model, p, { prependBos: opts.prependBos }));
  // resolve positions before any run, so a bad index fails at once
  const pos = ids.map((t, i) => {
    if (typeof opts.position !== 'number') return -1;
    const p = opts.position < 0 ? t.length + opts.position : opts.position;
    if (p < 0 || p >= t.length) throw new LoupeError('BAD_INPUT', `position ${opts.position} is outside prompt ${i} (${t.length} tokens).`, 'Use a position inside every prompt, or "last".');
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
  for (const g of groups.values()) for (let s = 0; s < g.length; s += CAPS.maxBatch) chunks.push(g.slice(s, s + CAPS.maxBatch));
  let done = 0;
  for (const chunk of chunks) {
    throwIfAborted(opts.signal);
    const T = ids[chunk[0]].length;
    const res = await model.run(chunk.length === 1 ? ids[chunk[0]] : chunk.map((i) => ids[i]), { hooks, withResult, signal: opts.signal });
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

const promptItem = z.union([
  z.string(),
  z.object({ text: z.string(), label: labelSchema.optional() }),
]);

const input = z.object({
  prompts: z.array(promptItem).min(1).describe('prompts, each a string or {text, label}; labels (0/1, booleans or two strings) are what `probe` learns'),
  hooks: z.array(z.string()).min(1).optional().describe('hooks to capture (default: the middle layer\'s blocks.{L}.hook_resid_pre)'),
  position: z.union([z.enum(['last', 'mean']), z.number().int()]).default('last')
    .describe('which position to keep: "last", "mean" (over positions, BOS excluded) or an index (negative counts from the end)'),
  prepend_bos: z.boolean().default(true),
});
export type CaptureInput = z.input<typeof input>;

const output = documentBase('capture').extend({
  handle: z.string().describe('capture handle for `probe` (kept in memory; expires)'),
  hooks: z.array(z.object({ hook: z.string(), dim: z.number().int(), mean_norm: z.number() })),
  position: z.union([z.enum(['last', 'mean']), z.number().int()]),
  n_prompts: z.number().int(),
  label_counts: z.array(z.object({ label: labelSchema.nullable(), count: z.number().int() })),
  prompts: z.array(z.object({ index: z.number().int(), text: z.string(), label: labelSchema.nullable(), n_tokens: z.number().int() })),
  bytes: z.number().int().describe('bytes kept in the handle store'),
  note: z.string(),
});
export type CaptureDocument = z.infer<typeof output>;

async function run(model: LoadedModel, raw: CaptureInput, ctx: OpContext): Promise<CaptureDocument> {
  const inp = parseInput(input, raw);
  const store = storeOf(ctx);
  const items = inp.prompts.map((p) => (typeof p === 'string' ? { text: p, label: undefined } : p));
  if (items.length > MAX_CAPTURE_PROMPTS) {
    throw new LoupeError('TOO_LARGE', `${items.length} prompts exceed the capture cap of ${MAX_CAPTURE_PROMPTS}.`, 'Split the set, or capture fewer prompts.');
  }
  const hooks = inp.hooks ?? [`blocks.${Math.floor(model.info.n_layers / 2)}.hook_resid_pre`];
  if (hooks.length > MAX_CAPTURE_HOOKS) throw new LoupeError('TOO_LARGE', `${hooks.length} hooks exceed the cap of ${MAX_CAPTURE_HOOKS}.`, 'Capture fewer hooks per call.');
  if (new Set(hooks).size !== hooks.length) throw new LoupeError('BAD_INPUT', 'hooks lists a hook twice.');
  const { dims } = checkCaptureHooks(model, hooks);
  // memory check before any run: one float32 vector per prompt per hook
  const bytes = items.length * Object.values(dims).reduce((a, b) => a + b, 0) * 4;
  const limit = Math.min(MAX_CAPTURE_BYTES, storeLimit(store) ?? Infinity);
  if (bytes > limit) {
    throw new LoupeError('TOO_LARGE', `This capture needs ${(bytes / 1048576).toFixed(1)} MiB; the limit is ${(limit / 1048576).toFixed(1)} MiB.`, 'Capture fewer prompts or hooks, or a narrower hook (resid instead of mlp.hook_post).');
  }
  const texts = items.map((p) => p.text);
  const firstIds = promptIds(model, texts[0], { prependBos: inp.prepend_bos });
  const col = await collectActivations(model, texts, hooks, {
    position: inp.position, prependBos: inp.prepend_bos, signal: ctx.signal,
    onProgress: (done, total) => ctx.onProgress?.({ stage: 'capturing activations', done, total }),
  });
  const labels = items.map((p) => (p.label === undefined ? null : p.label));
  const value: CaptureHandleValue = { model_id: model.info.id, hooks, position: inp.position, prepend_bos: inp.prepend_bos, prompts: texts, labels, dims: col.dims, data: col.data };
  const handle = store.put('capture', value);

  const counts = new Map<string, { label: Label | null; count: number }>();
  for (const l of labels) {
    const k = JSON.stringify(l);
    const e = counts.get(k) ?? { label: l, count: 0 };
    e.count++;
    counts.set(k, e);
  }
  return output.parse({
    ...documentHead('capture', model, texts[0], firstIds),
    handle,
    hooks: hooks.map((h) => {
      const n = col.dims[h];
      let s = 0;
      for (let i = 0; i < texts.length; i++) {
        let q = 0;
        for (let j = 0; j < n; j++) q += col.data[h][i * n + j] ** 2;
        s += Math.sqrt(q);
      }
      return { hook: h, dim: n, mean_norm: s / texts.length };
    }),
    position: inp.position,
    n_prompts: texts.length,
    label_counts: [...counts.values()],
    prompts: texts.map((t, i) => ({ index: i, text: t, label: labels[i], n_tokens: col.nTokens[i] })),
    bytes,
    note: '`prompt` and `tokens` show the first prompt. One vector per prompt per hook is kept under `handle` in this session\'s memory; it expires after a period of disuse or when memory is needed.',
  });
}

export const capture: Operation<CaptureInput, CaptureDocument> = {
  name: 'capture',
  description:
    'Capture activations for a labelled set of prompts: one vector per prompt per hook (final position by default, a chosen position, or the mean over non-BOS positions), kept in memory under a handle that `probe` trains on. Returns the handle, per-hook dimension and mean norm, and label counts. Prompts of equal length are batched. Caps: ' +
    `${MAX_CAPTURE_PROMPTS} prompts, ${MAX_CAPTURE_HOOKS} hooks, ${MAX_CAPTURE_BYTES / 1048576} MiB.`,
  input: input as unknown as z.ZodType<CaptureInput>,
  output,
  long: true,
  run,
};

/** the registry's name for this module's operation */
export const operation = capture;
