/**
 * The graph variants a loaded model runs, as one descriptor type. Each variant is a session of its
 * own, built on first use and kept by its `variantKey` (EngineModel):
 *
 *   hooked    every hook an output, every site an input, KV cache in/out (build-model.ts)
 *     withResult   … and per-head hook_result
 *     sae          … with an attached SAE spliced in at its hook
 *     lean         … with only these sites and outputs (batched scans, gradient runs)
 *     grad         … with the backward graph of these hooks (backward.ts)
 *   lens      final norm + unembedding of given residual vectors, top-k reduced (build-model.ts); in
 *             the forward graph instead where the readout is (addForwardLens: the forward's weights)
 *   readout   DLA's W_O and W_out products (readout/graph.ts)
 *   edge      the edge-patching forward, or with `grad` its ∂M/∂w (edge-graph.ts)
 *   replacement  the frozen local replacement model of a transcoder set: its backward (attribution rows)
 *                or with `forward` its forward (interventions with errors held fixed) (replacement.ts)
 *
 * To add a variant: a member here, its key in variantKey, its build in buildVariant.
 */
import type { ModelSpec } from '../spec';
import type { TensorEntry } from '../safetensors-types';
import type { SaeGraphSpec } from '../sae';
import type { WeightPrecision } from '../budget';
import { addForwardLens, buildLensGraph, buildModelGraph, type BuiltGraph, type GraphPlan } from './build-model';
import { buildEdgeGraph } from './edge-graph';
import { addForwardReadout, buildReadoutGraph } from '../readout/graph';
import { buildReplacementForward, buildReplacementGraph } from './replacement';
import type { TranscoderSpec } from '../transcoder';

/** a lean variant's plan: only these hooks take interventions and only these are outputs */
export interface LeanPlan {
  sites: string[];
  outputs: string[];
}

export type GraphVariant =
  | { kind: 'hooked'; withResult: boolean; sae?: string; lean?: LeanPlan; grad?: string[] }
  | { kind: 'lens' }
  | { kind: 'readout' }
  | { kind: 'edge'; grad: boolean }
  | { kind: 'replacement'; transcoders: string; forward?: boolean };

/** the hooked variant without extras: what a load builds first */
export const BASE_VARIANT: GraphVariant = { kind: 'hooked', withResult: false };

/**
 * The variants that hold the weights again for one particular plan (lean and gradient variants):
 * a model keeps at most two of each family, dropping the oldest. Their keys start with `family:`.
 */
export function variantFamily(v: GraphVariant): 'grad' | 'lean' | undefined {
  if (v.kind !== 'hooked') return undefined;
  return v.grad ? 'grad' : v.lean ? 'lean' : undefined;
}

/** The key a variant's session is kept by: equal keys, the same graph. */
export function variantKey(v: GraphVariant): string {
  switch (v.kind) {
    case 'hooked': {
      const base = v.withResult ? 'result' : 'base';
      if (v.grad) return `grad:${v.sae ?? ''}:${base}:${JSON.stringify(v.lean ?? null)}:${v.grad.join(',')}`;
      if (v.lean) return `lean:${JSON.stringify(v.lean)}`;
      return v.sae ? `${base}|sae:${v.sae}` : base;
    }
    case 'edge':
      return v.grad ? 'edgeGrad' : 'edge';
    case 'replacement':
      return `replacement:${v.forward ? 'forward' : 'backward'}:${v.transcoders}`;
    default:
      return v.kind;
  }
}

/** what every variant's build takes besides its descriptor */
export interface VariantContext {
  spec: ModelSpec;
  tensors: Map<string, TensorEntry>;
  precision: WeightPrecision;
  /** rows per vocabulary chunk where the tables are split (precision.ts chooseVocabSplit) */
  vocabRows?: number;
  fused?: GraphPlan['fused'];
  /** the attached SAE's graph spec, for a hooked variant with `sae` */
  sae?: SaeGraphSpec;
  /** the attached transcoder set, for the replacement variant */
  transcoders?: TranscoderSpec;
  /** GraphPlan.unembedApart, for the hooked variants */
  unembedApart?: boolean;
  /** the base hooked variant also computes the DLA readout products and the logit lens (readout 'forward', choose.ts) */
  readoutInForward?: boolean;
}

/** The graph of a variant. */
export function buildVariant(v: GraphVariant, c: VariantContext): BuiltGraph {
  switch (v.kind) {
    case 'lens':
      return buildLensGraph(c.spec, c.tensors, undefined, c.precision, c.vocabRows);
    case 'edge':
      return buildEdgeGraph(c.spec, c.tensors, {
        grad: v.grad,
        weights: c.precision,
        vocabRows: c.vocabRows,
        fused: c.fused,
      });
    case 'readout':
      return buildReadoutGraph(c.spec, c.tensors, undefined, c.precision);
    case 'replacement':
      if (!c.transcoders) throw new Error(`no transcoder set attached as ${v.transcoders}`);
      return (v.forward ? buildReplacementForward : buildReplacementGraph)(
        c.spec,
        c.tensors,
        c.transcoders,
        c.precision,
      );
    case 'hooked':
      return buildModelGraph(c.spec, c.tensors, {
        hooks: true,
        withResult: v.withResult,
        sae: c.sae,
        lean: v.lean,
        grad: v.grad && { hooks: v.grad },
        weights: c.precision,
        vocabRows: c.vocabRows,
        fused: c.fused,
        unembedApart: c.unembedApart,
        ...(c.readoutInForward && variantKey(v) === variantKey(BASE_VARIANT)
          ? {
              extra: (g) => {
                addForwardReadout(g, c.spec, c.tensors, c.vocabRows);
                addForwardLens(g, c.spec, c.tensors, c.vocabRows);
              },
            }
          : {}),
      });
  }
}
