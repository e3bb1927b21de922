/**
 * What a weight precision costs in numbers: the same prompt through the same model at two
 * precisions (a baseline, e.g. stored, and a candidate, e.g. q8), compared on the logits of
 * every position and on the trace operation's direct logit attribution. `loupe doctor`, the
 * page's Doctor (workers/q8-cost.ts) and `npm run bench` report it, so q8 is never silent about how far it moves a result.
 *
 * DLA is compared on one target for both: the baseline's predicted token at the last position
 * (the candidate may predict another), over every per-head attribution and every term of the
 * decomposition. It runs the trace operation, so it lives with the surfaces that report it, not
 * in ops/lib (no operation machinery imports an operation).
 */
import type { LoadedModel } from '../engine/api';
import { operation as trace } from '../ops/trace';

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

export async function precisionCost(baseline: LoadedModel, candidate: LoadedModel, prompt: string): Promise<PrecisionCost> {
  const ids = baseline.tokenize(prompt);
  const [a, b] = [await baseline.run(ids), await candidate.run(ids)];
  let dl = 0, ml = 0;
  for (let i = 0; i < a.logits.data.length; i++) {
    dl = Math.max(dl, Math.abs(a.logits.data[i] - b.logits.data[i]));
    ml = Math.max(ml, Math.abs(a.logits.data[i]));
  }
  const ta = await trace.run(baseline, { prompt, top_k: 1 });
  const tb = await trace.run(candidate, { prompt, top_k: 1, answer: `#${ta.target.token_id}` });
  const flat = (t: typeof ta) => [...t.head_attribution.flat(), ...t.decomposition.terms.map((x) => x.value)];
  const [fa, fb] = [flat(ta), flat(tb)];
  let dd = 0, md = 0;
  for (let i = 0; i < fa.length; i++) {
    dd = Math.max(dd, Math.abs(fa[i] - fb[i]));
    md = Math.max(md, Math.abs(fa[i]));
  }
  return {
    baseline: baseline.info.weights, candidate: candidate.info.weights, tokens: ids.length,
    max_abs_logit_diff: dl, max_abs_logit: ml, max_abs_dla_diff: dd, max_abs_dla: md,
    same_prediction: ta.predicted_token_id === tb.predicted_token_id,
  };
}
