/**
 * The calls a bridge link has sent and not yet heard back about: the hub's PageConnection (calls to
 * a page) and the companion's ForwardClient (calls through another companion's hub) keep theirs
 * here. A call settles exactly once, by its result, an error, its deadline or its caller's
 * cancel; settling stops its timer and its abort listener.
 */
import { LoupeError } from '../engine/errors';
import type { Progress } from '../ops/types';
import type { ErrorMsg, ProgressMsg, ResultMsg } from './protocol';

export interface OpenCall {
  /** milliseconds until the call fails with `onDeadline()` */
  timeoutMs: number;
  signal?: AbortSignal;
  onProgress?: (p: Progress) => void;
  /** the deadline passed: tell the other side if it should stop, and say why the call failed */
  onDeadline(): LoupeError;
  /** the caller aborted: tell the other side, and say why the call failed */
  onCancel(): LoupeError;
}

interface Pending<R> {
  resolve(r: R): void;
  reject(e: LoupeError): void;
  onProgress?: (p: Progress) => void;
  cleanup(): void;
}

/** open calls whose results are R (ExecResult for both links) */
export class PendingCalls<R> {
  private calls = new Map<string, Pending<R>>();

  get size(): number {
    return this.calls.size;
  }

  /** Register call `id` (send it after this returns); the promise settles with the call. */
  open(id: string, o: OpenCall): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      const timer = setTimeout(() => this.settle(id, undefined, o.onDeadline()), o.timeoutMs);
      const onAbort = () => this.settle(id, undefined, o.onCancel());
      o.signal?.addEventListener('abort', onAbort, { once: true });
      this.calls.set(id, {
        resolve,
        reject,
        onProgress: o.onProgress,
        cleanup: () => {
          clearTimeout(timer);
          o.signal?.removeEventListener('abort', onAbort);
        },
      });
    });
  }

  /** a `progress` message for a call; a consumer's failure must not fail the call */
  progress(m: { id: string } & Progress): void {
    try {
      this.calls.get(m.id)?.onProgress?.({ done: m.done, total: m.total, stage: m.stage });
    } catch {
      /* ignored: see above */
    }
  }

  settle(id: string, result: R | undefined, error?: LoupeError): void {
    const p = this.calls.get(id);
    if (!p) return;
    this.calls.delete(id);
    p.cleanup();
    if (error) p.reject(error);
    else p.resolve(result!);
  }

  /** an `error` message for a call: it fails with that error */
  fail(m: { id: string; error: { code: string; message: string; hint?: string } }): void {
    this.settle(m.id, undefined, new LoupeError(m.error.code as LoupeError['code'], m.error.message, m.error.hint));
  }

  /** a reply to a call: its progress, its result (made R by `result`) or its error */
  reply(m: ProgressMsg | ResultMsg | ErrorMsg, result: (m: ResultMsg) => R): void {
    if (m.type === 'progress') this.progress(m);
    else if (m.type === 'result') this.settle(m.id, result(m));
    else this.fail(m);
  }

  /** fail every open call with `error` (the link is gone) */
  failAll(error: LoupeError): void {
    for (const id of [...this.calls.keys()]) this.settle(id, undefined, error);
  }
}
