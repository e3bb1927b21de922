/**
 * Handles (capture ids, result/trace ids, …) name things held in one executor's memory: the
 * page's worker, or the headless process. A handle is only meaningful to the instance that
 * minted it, so it carries that instance's id:
 *
 *     lh_<kind>_<instance id: 12 hex>_<random: 16 hex>
 *
 * The hub sees the current page's instance id in its `hello`; any handle in a call's arguments
 * with another instance id was minted by a page that has since reloaded or closed, and is
 * rejected as HANDLE_EXPIRED before the call reaches the page (also inside strings, e.g. steer's
 * "probe:<handle>"). `instanceHandleStore` is what the page's worker and the headless executor
 * pass to operations as `ctx.store`.
 *
 * Browser-safe: uses only globalThis.crypto.
 */
import { LoupeError } from '../../engine/errors';
import type { HandleStore } from '../types';
import { MemoryHandleStore } from './handle-store';

const HANDLE_RE = /^lh_([a-z][a-z0-9]{0,23})_([0-9a-f]{12})_([0-9a-f]{16})$/;
/** handles inside longer strings, e.g. steer's direction "probe:<handle>" */
const HANDLE_IN_TEXT = /(?<![A-Za-z0-9_])lh_[a-z][a-z0-9]{0,23}_([0-9a-f]{12})_[0-9a-f]{16}(?![A-Za-z0-9_])/g;

export function randomHex(bytes: number): string {
  const b = new Uint8Array(bytes);
  globalThis.crypto.getRandomValues(b);
  let s = '';
  for (const x of b) s += x.toString(16).padStart(2, '0');
  return s;
}

/** A fresh instance id (one per page load, or per headless process). */
export function newInstanceId(): string {
  return randomHex(6);
}

export function isHandle(s: string): boolean {
  return HANDLE_RE.test(s);
}

export function parseHandle(s: string): { kind: string; instance: string } | undefined {
  const m = HANDLE_RE.exec(s);
  return m ? { kind: m[1], instance: m[2] } : undefined;
}

export function mintHandle(kind: string, instanceId: string): string {
  let k = kind.toLowerCase().replace(/[^a-z0-9]/g, '');
  if (!/^[a-z]/.test(k)) k = 'h' + k;
  return `lh_${k.slice(0, 24)}_${instanceId}_${randomHex(8)}`;
}

function expired(handle: string): LoupeError {
  return new LoupeError(
    'HANDLE_EXPIRED',
    `Handle ${handle} is expired: it was made by a page (or process) that has since reloaded, closed, or dropped it.`,
    'Handles live only in the memory of the page instance that made them. Re-run the operation that produced it (e.g. capture) and use the new handle.',
  );
}

/**
 * Throw HANDLE_EXPIRED when any string anywhere in `args` is a handle minted by an instance
 * other than `instanceId`. Walks nested objects and arrays (bounded depth: arguments are small).
 */
export function assertHandlesCurrent(args: unknown, instanceId: string | undefined, depth = 0): void {
  if (depth > 16 || args == null) return;
  if (typeof args === 'string') {
    if (!args.includes('lh_')) return;
    for (const m of args.matchAll(HANDLE_IN_TEXT)) if (m[1] !== instanceId) throw expired(m[0]);
    return;
  }
  if (Array.isArray(args)) {
    for (const v of args) assertHandlesCurrent(v, instanceId, depth + 1);
    return;
  }
  if (typeof args === 'object')
    for (const v of Object.values(args as object)) assertHandlesCurrent(v, instanceId, depth + 1);
}

/**
 * The HandleStore to give operations (`ctx.store`) in an executor: the operations' own
 * MemoryHandleStore (byte budget, time-to-live) under ids that name this instance. Unknown,
 * evicted or expired ids answer HANDLE_EXPIRED.
 */
export function instanceHandleStore(
  instanceId: string,
  inner: MemoryHandleStore = new MemoryHandleStore(),
): HandleStore & { readonly maxBytes: number } {
  const ids = new Map<string, string>(); // our id → the inner store's id
  return {
    get maxBytes() {
      return inner.maxBytes; // read by the ops (storeLimit) to refuse a capture before running it
    },
    put(kind, value) {
      const innerId = inner.put(kind, value);
      const id = mintHandle(kind, instanceId);
      ids.set(id, innerId);
      return id;
    },
    get<T>(kind: string, id: string): T {
      const innerId = ids.get(id);
      if (innerId === undefined) throw expired(id);
      try {
        return inner.get<T>(kind, innerId);
      } catch (e) {
        ids.delete(id); // evicted or expired inside: forget the mapping too
        throw e;
      }
    },
  };
}
