/**
 * What a weight precision costs in numbers: the same prompt through the same model at two
 * precisions (a baseline, e.g. stored, and a candidate, e.g. q8), compared on the logits of
 * every position and on the trace operation's direct logit attribution. `loupe doctor`, the
 * page's Doctor (workers/q8-cost.ts) and `npm run bench` report it, so q8 is never silent about how far it moves a result.
 *
 * DLA is compared on one target for both: the baseline's predicted token at the last position
 * (the candidate may predict another), over every per-head attribution and every term of trace's
 * decomposition (transformer_lens convention), computed by the same ops/lib/dla.ts trace uses. It
 * lives in ops/lib so that the CLI and the page's worker, two surfaces that may not import each
 * other, share it.
 */
import type { LoadedModel } from '../../engine/api';
import { decomposeLogit, dlaHookNames, type DlaResult } from './dla';

export interface PrecisionCost {
  baseline: string;
  candidate: string;
  tokens: number;
  /** max |Δ| over all logits [T, V] */
  max_abs_logit_diff: number;
  /** max |logit| of the baseline, for scale */
  max_abs_logit: number;
  /** max |Δ| over head_attribution and the decomposition terms of trace */
  max_abs_dla_diff: number;
  /** max |value| of those baseline DLA numbers, for scale */
  max_abs_dla: number;
  /** whether both predict the same token at the last position */
  same_prediction: boolean;
}

export async function precisionCost(
  baseline: LoadedModel,
  candidate: LoadedModel,
  prompt: string,
): Promise<PrecisionCost> {
  const ids = baseline.tokenize(prompt);
  const hooks = dlaHookNames(baseline);
  const [a, b] = [await baseline.run(ids, { hooks }), await candidate.run(ids, { hooks })];
  let dl = 0,
    ml = 0;
  for (let i = 0; i < a.logits.data.length; i++) {
    dl = Math.max(dl, Math.abs(a.logits.data[i] - b.logits.data[i]));
    ml = Math.max(ml, Math.abs(a.logits.data[i]));
  }
  const T = ids.length;
  const V = a.logits.dims[2];
  const argmaxLast = (x: Float32Array) => {
    let best = 0;
    for (let v = 1; v < V; v++) if (x[(T - 1) * V + v] > x[(T - 1) * V + best]) best = v;
    return best;
  };
  const predicted = argmaxLast(a.logits.data);
  const target = { tokenId: predicted };
  const opts = { convention: 'transformer_lens' as const, position: T - 1 };
  const flat = (d: DlaResult) => [...d.heads.flat(), ...d.terms.map((x) => x.value)];
  const [fa, fb] = [
    flat(await decomposeLogit(baseline, a, target, opts)),
    flat(await decomposeLogit(candidate, b, target, opts)),
  ];
  let dd = 0,
    md = 0;
  for (let i = 0; i < fa.length; i++) {
    dd = Math.max(dd, Math.abs(fa[i] - fb[i]));
    md = Math.max(md, Math.abs(fa[i]));
  }
  return {
    baseline: baseline.info.weights,
    candidate: candidate.info.weights,
    tokens: ids.length,
    max_abs_logit_diff: dl,
    max_abs_logit: ml,
    max_abs_dla_diff: dd,
    max_abs_dla: md,
    same_prediction: predicted === argmaxLast(b.logits.data),
  };
}
