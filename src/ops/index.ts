/**
 * The registry of operations: every surface (CLI, worker, MCP bridge, headless server) looks
 * operations up here by name. Each engineer adds their operations below the marker.
 */
import type { Operation } from './types';
import * as ablate from './ablate';
import * as circuit from './circuit';
import * as patch from './patch';
import * as layer_ablation from './layer_ablation';
import * as trace from './trace';
import * as activations from './activations';
import * as attention from './attention';
import * as logit_lens from './logit_lens';
import * as generate from './generate';

export const operations: Record<string, Operation> = {
  // --- operations (one line each: name: module.operation) ---
  ablate: ablate.operation,
  circuit: circuit.operation,
  patch: patch.operation,
  layer_ablation: layer_ablation.operation,
  trace: trace.operation,
  activations: activations.operation,
  attention: attention.operation,
  logit_lens: logit_lens.operation,
  generate: generate.operation,
};

export function getOperation(name: string): Operation | undefined {
  return Object.prototype.hasOwnProperty.call(operations, name) ? operations[name] : undefined;
}
