/**
 * Weights under TransformerLens names: `W_E`, `W_U`, `W_Q[l]`, `b_in[l]`, … as views over a reader
 * of TL state-dict names, unprocessed (as `model.param` reads them) or processed as TL's
 * from_pretrained does (ops/lib/tl-weights.ts).
 */
import { LoupeError } from '../engine/errors';
import type { Tensor } from '../engine/tensor';

/** the layer-indexed names (`W_Q[l]` = `blocks.{l}.attn.W_Q`) */
export const LAYER_WEIGHTS = {
  W_Q: 'attn.W_Q',
  W_K: 'attn.W_K',
  W_V: 'attn.W_V',
  W_O: 'attn.W_O',
  b_Q: 'attn.b_Q',
  b_K: 'attn.b_K',
  b_V: 'attn.b_V',
  b_O: 'attn.b_O',
  W_in: 'mlp.W_in',
  W_gate: 'mlp.W_gate',
  W_out: 'mlp.W_out',
  b_in: 'mlp.b_in',
  b_out: 'mlp.b_out',
} as const;

/** the model-wide names */
export const MODEL_WEIGHTS = {
  W_E: 'embed.W_E',
  W_pos: 'pos_embed.W_pos',
  W_U: 'unembed.W_U',
  b_U: 'unembed.b_U',
} as const;

export type LayerWeightName = keyof typeof LAYER_WEIGHTS;
export type ModelWeightName = keyof typeof MODEL_WEIGHTS;

/** `W_Q[l]`: the layer's tensor, read on first use; `length` = n_layers */
export type Layered = readonly Tensor[];

export type Weights = { readonly [K in ModelWeightName]: Tensor } & { readonly [K in LayerWeightName]: Layered };

/** read(name) under the TL state-dict name → the `Weights` view (`W_E`, `W_Q[l]`, …), each read on first use */
export function weightsView(nLayers: number, read: (name: string) => Tensor): Weights {
  const out: Record<string, unknown> = {};
  for (const [k, name] of Object.entries(MODEL_WEIGHTS))
    Object.defineProperty(out, k, { enumerable: true, get: () => read(name) });
  for (const [k, leaf] of Object.entries(LAYER_WEIGHTS))
    Object.defineProperty(out, k, {
      enumerable: true,
      get: () => layered(nLayers, (l) => read(`blocks.${l}.${leaf}`)),
    });
  return out as Weights;
}

function layered(n: number, get: (l: number) => Tensor): Layered {
  return new Proxy([] as Tensor[], {
    get(target, key, recv) {
      if (key === 'length') return n;
      if (typeof key === 'string' && /^\d+$/.test(key)) {
        const l = Number(key);
        if (l >= n) throw new LoupeError('BAD_INPUT', `layer ${l} is out of range (0..${n - 1}).`);
        return get(l);
      }
      if (key === Symbol.iterator)
        return function* () {
          for (let l = 0; l < n; l++) yield get(l);
        };
      return Reflect.get(target, key, recv);
    },
  });
}
