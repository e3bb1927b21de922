/** The CLI's model loading (shared by the operation commands and `loupe doctor`) and its output streams. */
import type { LoadedModel } from '../engine/api';
import type { ModelSource } from '../engine/source/types';
import { LoupeError } from '../engine/errors';
import { WEIGHTS_MODES, type WeightsMode } from '../engine/precision';
import { UsageError } from './args';
import { isNodeBackend, NODE_BACKENDS, type NodeBackend } from '../node/backends';

export interface Io {
  stdout: (s: string) => void;
  stderr: (s: string) => void;
}

export async function loadModelForCli(
  spec: string,
  backend: string | undefined,
  onProgress?: (s: string) => void,
  weights?: string,
): Promise<LoadedModel> {
  if (backend !== undefined && !isNodeBackend(backend)) {
    throw new UsageError(`--backend must be ${NODE_BACKENDS.join(', ')} (got '${backend}').`);
  }
  if (weights !== undefined && !(WEIGHTS_MODES as readonly string[]).includes(weights)) {
    throw new UsageError(`--weights must be ${WEIGHTS_MODES.join(', ')} (got '${weights}').`);
  }
  const { loadModelNode } = await import('../node/load');
  const { sourceFromSpec } = await import('../node/load-files-node');
  // A model id that could never exist is a usage error, found before any request.
  let source: ModelSource;
  try {
    source = sourceFromSpec(spec, { names: true });
  } catch (e) {
    if (e instanceof LoupeError && (e.code === 'BAD_INPUT' || e.code === 'MODEL_NOT_FOUND'))
      throw new UsageError(e.message, e.hint);
    throw e;
  }
  let lastPct = -1;
  return loadModelNode(spec, {
    source,
    backend: backend as NodeBackend | undefined,
    weights: weights as WeightsMode | undefined,
    onProgress: (p: any) => {
      const o = p?.overall;
      if (!o || !o.total) return;
      const pct = Math.floor((100 * o.loaded) / o.total);
      if (pct !== lastPct && (pct % 10 === 0 || pct === 100)) {
        lastPct = pct;
        onProgress?.(`loading ${spec}: ${pct}%`);
      }
    },
  } as any);
}
