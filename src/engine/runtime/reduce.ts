/**
 * Reductions of a run's outputs, each defined once as a small weightless ONNX graph and run in a
 * helper session beside the model's (SessionFactory.helper): on the device, fed the outputs the
 * session kept there, where it keeps them (WebGPU in Node), so only the reduced numbers are read
 * back; else on the host provider, fed the outputs already in JS memory. One definition for every
 * backend, so the numbers do not depend on where the reduction ran.
 *
 * logit rows (RunOptions.reduceLogits): each row of the logits [B, P, V] → its logits at K token
 * ids, its log-normaliser, its argmax and largest logit, and, given a reference row of
 * log-probabilities, KL(reference ‖ row). A scan of many variants that reads a metric (a logit
 * difference, the answer's log-prob, KL from the clean run) reads 4·(K + 3) bytes a row instead of 4·V.
 */
import type { LogitReduce, LogitRow } from '../api';
import { OnnxGraph } from '../graph/onnx-builder';
import type { OrtModule, OrtTensorLike } from './ort-session';

/** the helper graph's outputs, in this order */
const LOGIT_OUTPUTS = ['at', 'logsumexp', 'top', 'top_logit'];

/** which helper a logit reduction needs (one graph each) */
export const logitReduceKey = (r: LogitReduce): string => (r.ref ? 'logit-rows+kl' : 'logit-rows');

/**
 *   at        [N, K]  logits[n, ids[k]]  (N = B·P rows)
 *   logsumexp [N]     log Σ_v exp(logit_v), max-shifted
 *   top       [N]     argmax (int64, first on ties), top_logit [N] its logit
 *   kl        [N]     Σ_v exp(ref_v)·(ref_v − (logit_v − logsumexp)), with input ref [V] (log-probs)
 */
export function logitReduceGraph(withRef: boolean): Uint8Array {
  const g = new OnnxGraph(() => '');
  const x = g.o('Flatten', [g.input('logits', 'float', ['B', 'P', 'V'])], { axis: 2 }); // [N, V]
  g.rename(g.o('Gather', [x, g.input('ids', 'int64', ['K'])], { axis: 1 }), 'at');
  g.output('at');
  const max = g.o('ReduceMax', [x], { axes: [1], keepdims: 1 }); // [N, 1]
  const sum = g.o('ReduceSum', [g.o('Exp', [g.o('Sub', [x, max])]), g.constI([1])], { keepdims: 1 });
  const lse = g.o('Add', [max, g.o('Log', [sum])]); // [N, 1]
  g.rename(g.o('Squeeze', [lse, g.constI([1])]), 'logsumexp');
  g.output('logsumexp');
  g.rename(g.o('ArgMax', [x], { axis: 1, keepdims: 0 }), 'top');
  g.output('top', 'int64');
  g.rename(g.o('Squeeze', [max, g.constI([1])]), 'top_logit');
  g.output('top_logit');
  if (withRef) {
    const ref = g.input('ref', 'float', ['V']);
    const diff = g.o('Sub', [ref, g.o('Sub', [x, lse])]); // ref − log-probs of the row
    g.rename(g.o('ReduceSum', [g.o('Mul', [g.o('Exp', [ref]), diff]), g.constI([1])], { keepdims: 0 }), 'kl');
    g.output('kl');
  }
  return g.encode();
}

/** the helper's feeds besides the logits */
export function logitReduceFeeds(ort: OrtModule, r: LogitReduce): Record<string, OrtTensorLike> {
  const feeds: Record<string, OrtTensorLike> = {
    ids: new ort.Tensor('int64', BigInt64Array.from(r.ids, BigInt), [r.ids.length]),
  };
  if (r.ref) feeds.ref = new ort.Tensor('float32', r.ref, [r.ref.length]);
  return feeds;
}

export const logitReduceFetches = (r: LogitReduce): string[] => (r.ref ? [...LOGIT_OUTPUTS, 'kl'] : LOGIT_OUTPUTS);

/** the helper's outputs as one LogitRow per logits row */
export function logitRows(out: Record<string, OrtTensorLike>, K: number): LogitRow[] {
  const at = out.at.data as Float32Array;
  const lse = out.logsumexp.data as Float32Array;
  const top = out.top.data as BigInt64Array;
  const topLogit = out.top_logit.data as Float32Array;
  const kl = out.kl?.data as Float32Array | undefined;
  return Array.from(lse, (l, n) => ({
    at: at.slice(n * K, (n + 1) * K),
    logsumexp: l,
    top: Number(top[n]),
    topLogit: topLogit[n],
    ...(kl ? { kl: kl[n] } : {}),
  }));
}
