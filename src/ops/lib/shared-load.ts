/**
 * One load per model and id (an SAE, a transcoder set), shared by concurrent callers: a caller
 * waits for the load already running or done; a failed load is forgotten so the next call starts
 * again, and one cancelled by another caller's signal is started again for this caller (unless
 * this caller's signal is aborted too).
 */
import type { LoadedModel } from '../../engine/api';
import { LoupeError } from '../../engine/errors';

/**
 * The surface's loader of `things` (an operation-context field such as loadSae): INTERNAL when the
 * surface provides none, a bug, since every surface should provide `aLoader`.
 */
export function assertLoader<F>(
  loader: F | undefined,
  field: string,
  things: string,
  aLoader: string,
): asserts loader is F {
  if (!loader)
    throw new LoupeError(
      'INTERNAL',
      `This surface cannot load ${things} (no ${field} in the operation context).`,
      `This is a bug in Loupe: every surface should provide ${aLoader}; please report it.`,
    );
}

export class SharedLoads<T> {
  private readonly byModel = new WeakMap<LoadedModel, Map<string, Promise<T>>>();

  async get(model: LoadedModel, id: string, signal: AbortSignal | undefined, start: () => Promise<T>): Promise<T> {
    let byId = this.byModel.get(model);
    if (!byId) this.byModel.set(model, (byId = new Map()));
    const existing = byId.get(id);
    if (existing) {
      try {
        return await existing;
      } catch (e) {
        // another call's cancellation is not ours: load again
        if (!(e instanceof LoupeError && e.code === 'ABORTED') || signal?.aborted) throw e;
      }
    }
    const p = start();
    byId.set(id, p);
    p.catch(() => {
      if (byId.get(id) === p) byId.delete(id);
    });
    return p;
  }
}
