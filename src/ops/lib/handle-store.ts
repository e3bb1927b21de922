/**
 * A small in-memory HandleStore (captures, probes) used when a surface provides none.
 *
 * Why: captured activations can be large and a page or an agent may forget them, so the store has
 * a byte budget (oldest entries are evicted to make room) and a time-to-live (stale handles answer
 * HANDLE_EXPIRED instead of leaking memory for ever). Handle ids are random and opaque so that
 * one client cannot guess another's handle.
 */
import { LoupeError } from '../../engine/errors';
import type { HandleStore } from '../types';

export interface MemoryHandleStoreOptions {
  /** total bytes kept (default 256 MiB) */
  maxBytes?: number;
  /** lifetime of a handle since its last use, in ms (default 30 minutes) */
  ttlMs?: number;
  /** clock, for tests */
  now?: () => number;
}

interface Entry {
  kind: string;
  value: unknown;
  bytes: number;
  lastUsed: number;
}

/** Rough size of a value in bytes: typed arrays exactly, everything else estimated. */
export function bytesOf(value: unknown, seen = new Set<unknown>()): number {
  if (value === null || value === undefined) return 0;
  if (typeof value === 'number' || typeof value === 'boolean') return 8;
  if (typeof value === 'string') return 2 * value.length;
  if (ArrayBuffer.isView(value)) return value.byteLength;
  if (value instanceof ArrayBuffer) return value.byteLength;
  if (typeof value !== 'object') return 8;
  if (seen.has(value)) return 0;
  seen.add(value);
  let n = 0;
  if (Array.isArray(value)) for (const v of value) n += bytesOf(v, seen);
  else for (const [k, v] of Object.entries(value as Record<string, unknown>)) n += 2 * k.length + bytesOf(v, seen);
  return n;
}

function randomId(kind: string): string {
  const b = new Uint8Array(12);
  globalThis.crypto.getRandomValues(b);
  return `${kind}_${Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('')}`;
}

export class MemoryHandleStore implements HandleStore {
  readonly maxBytes: number;
  readonly ttlMs: number;
  private readonly now: () => number;
  private readonly entries = new Map<string, Entry>();
  private used = 0;

  constructor(opts: MemoryHandleStoreOptions = {}) {
    this.maxBytes = opts.maxBytes ?? 256 * 1024 * 1024;
    this.ttlMs = opts.ttlMs ?? 30 * 60 * 1000;
    this.now = opts.now ?? (() => Date.now());
  }

  /** bytes currently held */
  get bytesUsed(): number {
    this.expire();
    return this.used;
  }

  /** Throws TOO_LARGE when `bytes` could never fit, so callers can check before doing the work. */
  assertFits(bytes: number, what = 'value'): void {
    if (bytes > this.maxBytes) {
      throw new LoupeError(
        'TOO_LARGE',
        `The ${what} needs about ${fmtBytes(bytes)}, more than the handle store's limit of ${fmtBytes(this.maxBytes)}.`,
        'Capture fewer prompts, fewer hooks or fewer positions.',
      );
    }
  }

  put(kind: string, value: unknown): string {
    const bytes = bytesOf(value);
    this.assertFits(bytes, kind);
    this.expire();
    // evict least recently used entries until the new one fits (Map keeps insertion order; get() re-inserts)
    for (const [id, e] of this.entries) {
      if (this.used + bytes <= this.maxBytes) break;
      this.entries.delete(id);
      this.used -= e.bytes;
    }
    const id = randomId(kind);
    this.entries.set(id, { kind, value, bytes, lastUsed: this.now() });
    this.used += bytes;
    return id;
  }

  get<T>(kind: string, id: string): T {
    this.expire();
    const e = this.entries.get(id);
    if (!e || e.kind !== kind) {
      throw new LoupeError(
        'HANDLE_EXPIRED',
        `No ${kind} handle '${id}' is held (it expired, was evicted, or never existed).`,
        `Run the operation that creates a ${kind} handle again and use the new id; ` +
          `handles live ${Math.round(this.ttlMs / 60000)} minutes after their last use.`,
      );
    }
    e.lastUsed = this.now();
    this.entries.delete(id);
    this.entries.set(id, e);
    return e.value as T;
  }

  delete(id: string): boolean {
    const e = this.entries.get(id);
    if (!e) return false;
    this.entries.delete(id);
    this.used -= e.bytes;
    return true;
  }

  private expire(): void {
    const t = this.now();
    for (const [id, e] of this.entries) {
      if (t - e.lastUsed > this.ttlMs) {
        this.entries.delete(id);
        this.used -= e.bytes;
      }
    }
  }
}

function fmtBytes(n: number): string {
  return n >= 1024 * 1024 ? `${(n / 1024 / 1024).toFixed(1)} MiB` : `${Math.ceil(n / 1024)} KiB`;
}

/** The store used when an operation's ctx has none (one per JS realm: worker, CLI process, bridge). */
export const defaultHandleStore = new MemoryHandleStore();

export function storeOf(ctx: { store?: HandleStore }): HandleStore {
  return ctx.store ?? defaultHandleStore;
}

/** The store's byte limit when it declares one (ours do; a surface's own store may not). */
export function storeLimit(store: HandleStore): number | undefined {
  const m = (store as { maxBytes?: unknown }).maxBytes;
  return typeof m === 'number' ? m : undefined;
}
