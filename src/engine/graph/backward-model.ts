/**
 * The backward pass of the model graph (build-model.ts) and of its edge variant (edge-graph.ts):
 * which seed, which sizes the shape evaluations use, and which tensors get gradients. The
 * transform itself is backward.ts.
 */
import type { OnnxGraph } from './onnx-builder';
import type { ModelSpec } from '../spec';
import { addBackward } from './backward';

/** The seed input: ∂M/∂logits, shaped like the logits [B, P', V]. */
export const GRAD_SEED = 'logits::grad';

export interface ModelBackwardOptions {
  /** tensors the backward pass treats as constants (backward.ts BackwardSpec.stop) */
  stop?: string[];
  /** dims of a variant's own inputs in shape evaluation `ev`, from that evaluation's sizes (B, T, …) */
  inputDims?: (name: string, ev: number, sizes: Record<string, number>) => number[] | undefined;
}

export function addModelBackward(
  g: OnnxGraph,
  spec: ModelSpec,
  wrt: string[],
  opts: ModelBackwardOptions = {},
): string[] {
  g.input(GRAD_SEED, 'float', ['B', 'P', spec.dVocab]);
  // two evaluations with different sizes tell static dims from dynamic ones; gradient runs have no KV cache
  const symbols: [Record<string, number>, Record<string, number>] = [
    { B: 2, T: 3, Tk: 3, P: 1 },
    { B: 3, T: 5, Tk: 5, P: 2 },
  ];
  return addBackward(g, {
    output: 'logits',
    seed: GRAD_SEED,
    wrt,
    symbols,
    stop: opts.stop,
    inputDims: (name, declared, ev) => {
      const own = opts.inputDims?.(name, ev, symbols[ev]);
      if (own) return own;
      const past = /^past\.(\d+)\./.exec(name);
      // an empty KV cache; a linear-attention layer's conv and recurrent states keep their declared size
      if (past && spec.layers[Number(past[1])]?.linearAttn)
        return declared.map((d) => (typeof d === 'number' ? d : symbols[ev].B));
      if (past) return [symbols[ev].B, declared[1] as number, 0, declared[3] as number];
      if (name.endsWith('::mul') || name.endsWith('::add')) return [1]; // interventions broadcast into the hook's shape
      return undefined;
    },
  });
}
