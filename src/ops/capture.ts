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
import { defineOperation } from './types';
import { CAPS } from '../engine/caps';
import { promptIds } from './lib/tokens';
import {
  checkCaptureHooks,
  collectActivations,
  labelSchema,
  MAX_CAPTURE_BYTES,
  MAX_CAPTURE_HOOKS,
  MAX_CAPTURE_PROMPTS,
  type CaptureHandleValue,
  type Label,
} from './lib/collect';
import { storeLimit, storeOf } from './lib/handle-store';

const promptItem = z.union([z.string(), z.object({ text: z.string(), label: labelSchema.optional() })]);

const input = z.object({
  prompts: z
    .array(promptItem)
    .min(1)
    .describe('prompts, each a string or {text, label}; labels (0/1, booleans or two strings) are what `probe` learns'),
  hooks: z
    .array(z.string())
    .min(1)
    .optional()
    .describe("hooks to capture (default: the middle layer's blocks.{L}.hook_resid_pre)"),
  position: z
    .union([z.enum(['last', 'mean']), z.number().int()])
    .default('last')
    .describe(
      'which position to keep: "last", "mean" (over positions, BOS excluded) or an index (negative counts from the end)',
    ),
  prepend_bos: z.boolean().default(true),
});
export type CaptureInput = z.input<typeof input>;

const output = documentBase('capture').extend({
  handle: z.string().describe('capture handle for `probe` (kept in memory; expires)'),
  hooks: z.array(z.object({ hook: z.string(), dim: z.number().int(), mean_norm: z.number() })),
  position: z.union([z.enum(['last', 'mean']), z.number().int()]),
  n_prompts: z.number().int(),
  label_counts: z.array(z.object({ label: labelSchema.nullable(), count: z.number().int() })),
  prompts: z.array(
    z.object({ index: z.number().int(), text: z.string(), label: labelSchema.nullable(), n_tokens: z.number().int() }),
  ),
  bytes: z.number().int().describe('bytes kept in the handle store'),
  note: z.string(),
});

export const operation = defineOperation({
  name: 'capture',
  title: 'Capture',
  // a capture's handle is what the probe needs next
  feeds: { probe: { capture: 'handle' } },
  description:
    'Capture activations for a labelled set of prompts: one vector per prompt per hook ' +
    '(final position by default, a chosen position, or the mean over non-BOS positions), ' +
    'kept in memory under a handle that `probe` trains on. Returns the handle, ' +
    'per-hook dimension and mean norm, and label counts. Prompts of equal length are batched. Caps: ' +
    `${MAX_CAPTURE_PROMPTS} prompts, ${MAX_CAPTURE_HOOKS} hooks, ${MAX_CAPTURE_BYTES / 1048576} MiB.`,
  input,
  output,
  long: true,
}).implement(async (model, inp, ctx) => {
  const store = storeOf(ctx);
  const items = inp.prompts.map((p) => (typeof p === 'string' ? { text: p, label: undefined } : p));
  if (items.length > MAX_CAPTURE_PROMPTS) {
    throw new LoupeError(
      'TOO_LARGE',
      `${items.length} prompts exceed the capture cap of ${MAX_CAPTURE_PROMPTS}.`,
      'Split the set, or capture fewer prompts.',
    );
  }
  const hooks = inp.hooks ?? [`blocks.${Math.floor(model.info.n_layers / 2)}.hook_resid_pre`];
  if (hooks.length > MAX_CAPTURE_HOOKS)
    throw new LoupeError(
      'TOO_LARGE',
      `${hooks.length} hooks exceed the cap of ${MAX_CAPTURE_HOOKS}.`,
      'Capture fewer hooks per call.',
    );
  if (new Set(hooks).size !== hooks.length) throw new LoupeError('BAD_INPUT', 'hooks lists a hook twice.');
  const { dims } = checkCaptureHooks(model, hooks);
  // memory check before any run: one float32 vector per prompt per hook
  const bytes = items.length * Object.values(dims).reduce((a, b) => a + b, 0) * 4;
  const limit = Math.min(MAX_CAPTURE_BYTES, storeLimit(store) ?? Infinity);
  if (bytes > limit) {
    throw new LoupeError(
      'TOO_LARGE',
      `This capture needs ${(bytes / 1048576).toFixed(1)} MiB; the limit is ${(limit / 1048576).toFixed(1)} MiB.`,
      'Capture fewer prompts or hooks, or a narrower hook (resid instead of mlp.hook_post).',
    );
  }
  const texts = items.map((p) => p.text);
  const firstIds = promptIds(model, texts[0], { prependBos: inp.prepend_bos });
  const col = await collectActivations(model, texts, hooks, {
    position: inp.position,
    prependBos: inp.prepend_bos,
    signal: ctx.signal,
    onProgress: (done, total) => ctx.onProgress?.({ stage: 'capturing activations', done, total }),
  });
  const labels = items.map((p) => (p.label === undefined ? null : p.label));
  const value: CaptureHandleValue = {
    model_id: model.info.id,
    hooks,
    position: inp.position,
    prepend_bos: inp.prepend_bos,
    prompts: texts,
    labels,
    dims: col.dims,
    data: col.data,
  };
  const handle = store.put('capture', value);

  const counts = new Map<string, { label: Label | null; count: number }>();
  for (const l of labels) {
    const k = JSON.stringify(l);
    const e = counts.get(k) ?? { label: l, count: 0 };
    e.count++;
    counts.set(k, e);
  }
  return {
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
    note:
      '`prompt` and `tokens` show the first prompt. One vector per prompt per hook is kept under ' +
      "`handle` in this session's memory; it expires after a period of disuse or when memory is needed.",
  };
});
