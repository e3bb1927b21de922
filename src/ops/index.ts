/**
 * The registry of operations: every surface (CLI, worker, MCP bridge, headless server) looks
 * operations up here by name. Adding an operation is one line below (see CONTRIBUTING.md).
 * Beside it, the concerns every surface shares: `requireOperation` (one UNKNOWN_OPERATION),
 * `parseOperationInput` (./types: one BAD_INPUT) and `operationSchemas` (./schemas: one zod →
 * JSON Schema path).
 */
import { LoupeError } from '../engine/errors';
import type { AnyOperation, DocumentOf } from './types';
import * as ablate from './ablate';
import * as circuit from './circuit';
import * as patch from './patch';
import * as layer_ablation from './layer_ablation';
import * as trace from './trace';
import * as activations from './activations';
import * as attention from './attention';
import * as logit_lens from './logit_lens';
import * as generate from './generate';
import * as steer from './steer';
import * as sweep from './sweep';
import * as causality from './causality';
import * as capture from './capture';
import * as probe from './probe';
import * as sae_features from './sae_features';
import * as sae_steer from './sae_steer';
import * as feature from './feature';
import * as attribution_patching from './attribution_patching';
import * as integrated_gradients from './integrated_gradients';
import * as head_scores from './head_scores';
import * as composition_scores from './composition_scores';
import * as dashboard from './dashboard';
import * as edge_attribution from './edge_attribution';
import * as attribution_graph from './attribution_graph';
import * as feature_intervention from './feature_intervention';

const registry = {
  // one line per operation (name: module.operation), in the order the page's tabs, `loupe --help`
  // and the MCP tool list show them
  trace: trace.operation,
  activations: activations.operation,
  attention: attention.operation,
  logit_lens: logit_lens.operation,
  head_scores: head_scores.operation,
  composition_scores: composition_scores.operation,
  ablate: ablate.operation,
  circuit: circuit.operation,
  layer_ablation: layer_ablation.operation,
  patch: patch.operation,
  attribution_patching: attribution_patching.operation,
  integrated_gradients: integrated_gradients.operation,
  edge_attribution: edge_attribution.operation,
  attribution_graph: attribution_graph.operation,
  feature_intervention: feature_intervention.operation,
  steer: steer.operation,
  sweep: sweep.operation,
  causality: causality.operation,
  capture: capture.operation,
  probe: probe.operation,
  generate: generate.operation,
  sae_features: sae_features.operation,
  feature: feature.operation,
  sae_steer: sae_steer.operation,
  dashboard: dashboard.operation,
} satisfies Record<string, AnyOperation>;

/** the registry's type: each operation's own input and document types (the library's `ops`) */
export type OperationRegistry = typeof registry;

/** the operations by name, for surfaces that look one up from a string */
export const operations: Record<string, AnyOperation> = registry;

/** a registered operation's document type, derived from its output schema: OperationDocument<'trace'> */
export type OperationDocument<K extends keyof typeof registry> = DocumentOf<(typeof registry)[K]>;

export function getOperation(name: string): AnyOperation | undefined {
  return Object.prototype.hasOwnProperty.call(operations, name) ? operations[name] : undefined;
}

/** the operation named `name`, or UNKNOWN_OPERATION listing the ones there are */
export function requireOperation(name: string): AnyOperation {
  const op = getOperation(name);
  if (!op) throw unknownOperation(name);
  return op;
}

/** the one UNKNOWN_OPERATION error (`known`: the names a surface offers, the registry's by default) */
export function unknownOperation(name: string, known: string[] = Object.keys(operations)): LoupeError {
  return new LoupeError(
    'UNKNOWN_OPERATION',
    `No operation named ${JSON.stringify(name)}.`,
    `Operations: ${known.join(', ')}.`,
  );
}

export { parseOperationInput } from './types';
