// Test-side helpers for the ablation / circuit / patch / layer_ablation tests: the same edits done
// on the float64 reference forward (tests/reference/forward64.ts), never with the engine.
import { referenceForward, lastLogits, logSoftmax64, type RefModel, type HookValue } from './reference/forward64';
import { mulberry32 } from './reference/random-models';
import type { LoadedModel } from '../src/engine/api';
import { SHARED } from './helpers/shared';

/** one edited site of the reference: zero (no source) or copy from `source` (full [1,T,...] values) */
export interface RefEdit {
  hook: string;
  head?: number;
  neuron?: number;
  positions?: 'all' | number[];
  source?: Float64Array;
}

/** reference forward with edits; returns the last position's logits and the hooks asked for */
export function refRun(
  ref: RefModel,
  tokens: number[],
  edits: RefEdit[] = [],
  keep: string[] = [],
): { last: Float64Array; hooks: Record<string, HookValue> } {
  const keepSet = new Set(keep);
  const res = referenceForward(ref, tokens, {
    record: (n) => keepSet.has(n),
    hook: (name, value, dims) => {
      const mine = edits.filter((e) => e.hook === name);
      if (!mine.length) return;
      const out = value.slice();
      const T = dims[1];
      const inner = value.length / T;
      for (const e of mine) {
        const ps = !e.positions || e.positions === 'all' ? [...Array(T).keys()] : e.positions;
        for (const p of ps) {
          let lo = p * inner;
          let n = inner;
          if (e.head !== undefined) {
            const Dh = dims[3];
            lo += e.head * Dh;
            n = Dh;
          } else if (e.neuron !== undefined) {
            lo += e.neuron;
            n = 1;
          }
          for (let i = lo; i < lo + n; i++) out[i] = e.source ? e.source[i] : 0;
        }
      }
      return out;
    },
  });
  return { last: lastLogits(res), hooks: res.hooks };
}

/** mean over every position of the given hook values (each [1,T_i,...]), broadcast to [1,T,...] */
export function meanSource(values: HookValue[], T: number): Float64Array {
  const inner = values[0].data.length / values[0].dims[1];
  const sum = new Float64Array(inner);
  let n = 0;
  for (const v of values) {
    const Tv = v.dims[1];
    for (let p = 0; p < Tv; p++) for (let i = 0; i < inner; i++) sum[i] += v.data[p * inner + i];
    n += Tv;
  }
  const out = new Float64Array(T * inner);
  for (let p = 0; p < T; p++) for (let i = 0; i < inner; i++) out[p * inner + i] = sum[i] / n;
  return out;
}

export function argmax64(l: ArrayLike<number>): number {
  let b = 0;
  for (let i = 1; i < l.length; i++) if (l[i] > l[b]) b = i;
  return b;
}

/** what the reference says an edit does to token t: Δlogit, Δlogprob, KL(clean ‖ edited) */
export function refEffect(
  clean: Float64Array,
  edited: Float64Array,
  t: number,
): { logit_delta: number; logprob_delta: number; kl: number } {
  const a = logSoftmax64(clean);
  const b = logSoftmax64(edited);
  let kl = 0;
  for (let i = 0; i < a.length; i++) kl += Math.exp(a[i]) * (a[i] - b[i]);
  return { logit_delta: edited[t] - clean[t], logprob_delta: b[t] - a[t], kl };
}

/** the sites an ablation target edits, in TL hook names (written here, independently of src/ops/lib/ablation.ts) */
export function refSites(t: {
  layer: number;
  head?: number;
  neuron?: number;
  component?: string;
}): { hook: string; head?: number; neuron?: number }[] {
  const b = `blocks.${t.layer}`;
  if (t.head !== undefined) return [{ hook: `${b}.attn.hook_z`, head: t.head }];
  if (t.neuron !== undefined) return [{ hook: `${b}.mlp.hook_post`, neuron: t.neuron }];
  switch (t.component ?? 'layer') {
    case 'layer':
      return [{ hook: `${b}.hook_attn_out` }, { hook: `${b}.hook_mlp_out` }];
    case 'mlp_post':
      return [{ hook: `${b}.mlp.hook_post` }];
    default:
      return [{ hook: `${b}.hook_${t.component}` }];
  }
}

/** a model whose run() calls are counted (to prove caps are enforced before any work) */
export function countingModel(model: LoadedModel): { model: LoadedModel; runs: () => number } {
  let n = 0;
  const proxy = new Proxy(model, {
    get(target, prop) {
      if (prop === 'run')
        return (...args: Parameters<LoadedModel['run']>) => {
          n++;
          return target.run(...args);
        };
      const v = Reflect.get(target, prop, target);
      return typeof v === 'function' ? v.bind(target) : v;
    },
  });
  return { model: proxy, runs: () => n };
}

/** seeded uniform generator for random byte strings (the reference's mulberry32) */
export const byteRng = mulberry32;

/** n DISTINCT random bytes: a repeated byte inside R would make "the token after its earlier occurrence" ambiguous */
export function distinctBytes(u: () => number, n: number): number[] {
  const R: number[] = [];
  while (R.length < n) {
    const b = Math.floor(u() * 256);
    if (!R.includes(b)) R.push(b);
  }
  return R;
}

export function randomBytes(u: () => number, n: number): number[] {
  return Array.from({ length: n }, () => Math.floor(u() * 256));
}

export const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
export const meanOf = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

// the shared models sit beside the checkout (../shared/models), as DESIGN.md says
export const INDUCTION_DIR = SHARED + '/models/induction-gpt2';
export const STORIES_DIR = SHARED + '/models/stories260K';
