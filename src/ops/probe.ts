/**
 * `probe`: a logistic-regression probe on a capture handle, with a seeded stratified held-out
 * split; held-out AUROC and accuracy, the same numbers for a shuffled-label control fitted the
 * same way (what "chance" looks like for this sample size), per-sample scores, and the probe's
 * direction in the residual basis — stored under a probe handle that `steer` accepts
 * (direction "probe:<handle>").
 */
import { z } from 'zod';
import type { LoadedModel } from '../engine/api';
import { LoupeError, throwIfAborted } from '../engine/errors';
import { documentBase, documentHead } from '../schema/common';
import { defineOperation } from './types';
import { promptIds } from './lib/tokens';
import { storeOf } from './lib/handle-store';
import { accuracy, auroc, featureStats, fitLogistic, shuffled, stratifiedSplit } from './lib/probe-math';
import type { CaptureHandleValue, Label } from './lib/collect';
import type { ProbeHandleValue } from './lib/directions';

const labelSchema = z.union([z.number(), z.string(), z.boolean()]);

const input = z.object({
  capture: z.string().describe('capture handle (from `capture`)'),
  hook: z.string().optional().describe('which captured hook to train on (default: the first)'),
  positive_label: labelSchema
    .optional()
    .describe('the label scored as 1 (default: 1, true, or the second of two labels in sorted order)'),
  test_fraction: z.number().gt(0).lt(1).default(0.25).describe('share of each class held out for evaluation'),
  seed: z.number().int().default(0).describe('seed of the split and of the shuffled-label control'),
  l2: z
    .number()
    .positive()
    .default(1e-2)
    .describe('L2 strength on the standardised weights (objective: mean log-loss + l2/2 ‖w‖²)'),
  shuffle_labels: z
    .boolean()
    .default(false)
    .describe('train and evaluate on permuted labels (a negative control; expect AUROC ≈ 0.5)'),
});
export type ProbeInput = z.input<typeof input>;

const split = z.object({ auroc: z.number().nullable(), accuracy: z.number().nullable(), n: z.number().int() });

const output = documentBase('probe').extend({
  handle: z.string().describe('probe handle: steer with direction "probe:<handle>"'),
  capture: z.string(),
  hook: z.string(),
  layer: z.number().int().nullable(),
  position: z.union([z.enum(['last', 'mean']), z.number().int()]),
  positive_label: labelSchema,
  negative_label: labelSchema,
  shuffled_labels: z.boolean(),
  n_train: z.number().int(),
  n_test: z.number().int(),
  auroc: z.number().nullable().describe('held-out AUROC'),
  accuracy: z.number().nullable().describe('held-out accuracy at P = 0.5'),
  train: split,
  test: split,
  shuffled_control: z.object({
    auroc: z.number().nullable(),
    accuracy: z.number().nullable(),
    note: z.string(),
  }),
  samples: z.array(
    z.object({
      index: z.number().int(),
      text: z.string(),
      label: labelSchema,
      y: z.number().int(),
      split: z.enum(['train', 'test']),
      score: z.number().describe('P(positive)'),
      logit: z.number(),
    }),
  ),
  direction: z.object({
    hook: z.string(),
    values: z.array(z.number()).describe('w in the basis of the raw activations: logit = x·w + bias'),
    norm: z.number(),
  }),
  bias: z.number(),
  fit: z.object({
    objective: z.string(),
    l2: z.number(),
    iterations: z.number().int(),
    converged: z.boolean(),
    loss: z.number(),
    standardized: z.boolean(),
  }),
  method: z.string(),
});

/** map the capture's labels to 0/1 */
function binaryLabels(labels: (Label | null)[], positive?: Label): { y: number[]; pos: Label; neg: Label } {
  if (labels.some((l) => l === null))
    throw new LoupeError('BAD_INPUT', 'Some captured prompts have no label.', 'Capture prompts as {text, label}.');
  const distinct = [...new Map(labels.map((l) => [JSON.stringify(l), l as Label])).values()];
  if (distinct.length !== 2) {
    throw new LoupeError(
      'BAD_INPUT',
      `A probe needs exactly two labels; the capture has ${distinct.length} (${distinct.map((d) => JSON.stringify(d)).join(', ')}).`,
      'Label every prompt with one of two values.',
    );
  }
  let pos: Label;
  if (positive !== undefined) {
    const hit = distinct.find((d) => JSON.stringify(d) === JSON.stringify(positive));
    if (hit === undefined)
      throw new LoupeError(
        'BAD_INPUT',
        `positive_label ${JSON.stringify(positive)} is not one of the labels ${distinct.map((d) => JSON.stringify(d)).join(', ')}.`,
      );
    pos = hit;
  } else {
    const byDefault = distinct.find((d) => d === 1 || d === true);
    pos = byDefault ?? [...distinct].sort((a, b) => (String(a) < String(b) ? -1 : String(a) > String(b) ? 1 : 0))[1];
  }
  const neg = distinct.find((d) => d !== pos)!;
  return { y: labels.map((l) => (JSON.stringify(l) === JSON.stringify(pos) ? 1 : 0)), pos, neg };
}

interface Trained {
  w: Float64Array;
  b: number;
  iterations: number;
  converged: boolean;
  loss: number;
  logits: Float64Array;
}

/** standardise on the training rows, fit, and map the weights back to the raw basis */
function train(X: Float32Array, d: number, y: number[], rows: number[], l2: number): Trained {
  const { mean, sd } = featureStats(X, d, rows);
  const n = rows.length;
  const Z = new Float64Array(n * d);
  rows.forEach((i, r) => {
    for (let j = 0; j < d; j++) Z[r * d + j] = (X[i * d + j] - mean[j]) / sd[j];
  });
  const fit = fitLogistic(
    Z,
    rows.map((i) => y[i]),
    n,
    d,
    { l2 },
  );
  const w = new Float64Array(d);
  let b = fit.b;
  for (let j = 0; j < d; j++) {
    w[j] = fit.w[j] / sd[j];
    b -= w[j] * mean[j];
  }
  const N = y.length;
  const logits = new Float64Array(N);
  for (let i = 0; i < N; i++) {
    let z = b;
    for (let j = 0; j < d; j++) z += X[i * d + j] * w[j];
    logits[i] = z;
  }
  return { w, b, iterations: fit.iterations, converged: fit.converged, loss: fit.loss, logits };
}

const sig = (z: number) => 1 / (1 + Math.exp(-z));
const orNull = (x: number) => (Number.isFinite(x) ? x : null);

export const operation = defineOperation({
  name: 'probe',
  title: 'Probe',
  description:
    'Train a logistic-regression probe (L2, deterministic Newton fit, standardised features) ' +
    'on a `capture` handle with a seeded stratified held-out split; report held-out AUROC and accuracy, ' +
    'a shuffled-label control fitted the same way, per-sample scores (P(positive)), and the probe direction in ' +
    'the raw activation basis. Returns a probe handle: `steer` accepts direction "probe:<handle>". No engine runs.',
  input,
  output,
}).implement(async (model, inp, ctx) => {
  const store = storeOf(ctx);
  const cap = store.get<CaptureHandleValue>('capture', inp.capture);
  if (cap.model_id !== model.info.id) {
    throw new LoupeError(
      'BAD_INPUT',
      `Capture ${inp.capture} was made with model ${cap.model_id}, not ${model.info.id}.`,
      'Capture again with the loaded model.',
    );
  }
  const hook = inp.hook ?? cap.hooks[0];
  if (!cap.hooks.includes(hook))
    throw new LoupeError('BAD_INPUT', `Capture ${inp.capture} holds ${cap.hooks.join(', ')}, not ${hook}.`);
  const { y: yTrue, pos, neg } = binaryLabels(cap.labels, inp.positive_label);
  let split: { train: number[]; test: number[] };
  try {
    split = stratifiedSplit(yTrue, inp.test_fraction, inp.seed);
  } catch (e) {
    throw new LoupeError(
      'BAD_INPUT',
      `Too few samples for a held-out split: ${(e as Error).message}.`,
      'Capture at least 2 prompts of each label (10+ each for meaningful numbers).',
    );
  }
  const d = cap.dims[hook];
  const X = cap.data[hook];
  // the shuffled-label control permutes labels with a seed derived from `seed`
  const permuted = shuffled(yTrue, inp.seed * 7919 + 17);
  const y = inp.shuffle_labels ? permuted : yTrue;
  ctx.onProgress?.({ stage: 'fitting probe', done: 0, total: 2 });
  const main = train(X, d, y, split.train, inp.l2);
  throwIfAborted(ctx.signal);
  ctx.onProgress?.({ stage: 'fitting shuffled-label control', done: 1, total: 2 });
  const controlLabels = inp.shuffle_labels ? shuffled(yTrue, inp.seed * 7919 + 29) : permuted;
  const ctrl = train(X, d, controlLabels, split.train, inp.l2);
  ctx.onProgress?.({ stage: 'done', done: 2, total: 2 });

  const evalOn = (t: Trained, labels: number[], rows: number[]) => {
    const p = rows.map((i) => sig(t.logits[i]));
    const l = rows.map((i) => labels[i]);
    return { auroc: orNull(auroc(p, l)), accuracy: orNull(accuracy(p, l)), n: rows.length };
  };
  const trainEval = evalOn(main, y, split.train);
  const testEval = evalOn(main, y, split.test);
  const ctrlEval = evalOn(ctrl, controlLabels, split.test);

  const value: ProbeHandleValue = { hook, weights: main.w, bias: main.b, model_id: model.info.id };
  const handle = store.put('probe', value);
  const testSet = new Set(split.test);
  const firstIds = promptIds(model, cap.prompts[0], { prependBos: cap.prepend_bos });
  const m = /^blocks\.(\d+)\./.exec(hook);
  let norm = 0;
  for (let j = 0; j < d; j++) norm += main.w[j] ** 2;

  return {
    ...documentHead('probe', model, cap.prompts[0], firstIds),
    handle,
    capture: inp.capture,
    hook,
    layer: m ? Number(m[1]) : null,
    position: cap.position,
    positive_label: pos,
    negative_label: neg,
    shuffled_labels: inp.shuffle_labels,
    n_train: split.train.length,
    n_test: split.test.length,
    auroc: testEval.auroc,
    accuracy: testEval.accuracy,
    train: trainEval,
    test: testEval,
    shuffled_control: {
      auroc: ctrlEval.auroc,
      accuracy: ctrlEval.accuracy,
      note:
        'a probe fitted identically (same split, l2, features) to permuted labels and ' +
        'scored on its own held-out labels: what chance looks like at this sample size',
    },
    samples: cap.prompts.map((text, i) => ({
      index: i,
      text,
      label: cap.labels[i] as Label,
      y: y[i],
      split: testSet.has(i) ? 'test' : 'train',
      score: sig(main.logits[i]),
      logit: main.logits[i],
    })),
    direction: { hook, values: Array.from(main.w), norm: Math.sqrt(norm) },
    bias: main.b,
    fit: {
      objective: 'mean log-loss + l2/2 ‖w‖² on standardised features; intercept unpenalised',
      l2: inp.l2,
      iterations: main.iterations,
      converged: main.converged,
      loss: main.loss,
      standardized: true,
    },
    method:
      `Logistic regression fitted by Newton's method with backtracking (deterministic) on the ${split.train.length} training samples, ` +
      'features standardised with the training mean and s.d.; a stratified split holds out ' +
      `${split.test.length} samples (test_fraction ${inp.test_fraction}, seed ${inp.seed}). ` +
      'AUROC and accuracy are on the held-out samples. Weights are mapped back to ' +
      `the raw activation basis, so the direction can be added to ${hook}'s stream.` +
      (inp.shuffle_labels ? ' Labels were permuted before training (negative control).' : ''),
  };
});
