/** Shared bits of the ablation-style views (ablate, circuit, layer_ablation). */
import { fmt, fmtPct, showToken } from '../charts/format';

export type EffectKey = 'logprob_delta' | 'logit_delta' | 'prob_delta' | 'kl';

export const EFFECT_TITLES: Record<EffectKey, string> = {
  logprob_delta: 'Δ log-prob of the answer (nats)',
  logit_delta: 'Δ logit of the answer',
  prob_delta: 'Δ probability of the answer',
  kl: 'KL(clean ‖ ablated), nats',
};

export interface Effect {
  logit_delta: number;
  logprob_delta: number;
  prob_delta: number;
  kl: number;
  new_predicted_token: string;
  new_predicted_prob: number;
}

export function effectLines(e: Effect): string[] {
  return [
    `Δ logit ${fmt(e.logit_delta, 5)} · Δ log-prob ${fmt(e.logprob_delta, 5)}`,
    `Δ prob ${fmt(e.prob_delta, 5)} · KL ${fmt(e.kl, 5)}`,
    `new top token ${showToken(e.new_predicted_token)} (${fmtPct(e.new_predicted_prob, 1)})`,
  ];
}

/** rank by the size of the chosen effect (KL is non-negative; deltas by magnitude) */
export function rankBy<T extends Effect>(xs: T[], key: EffectKey): T[] {
  return [...xs].sort((a, b) => Math.abs(b[key]) - Math.abs(a[key]));
}
