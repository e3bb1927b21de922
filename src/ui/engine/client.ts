/**
 * The page's handle on the model worker. It owns the Worker, wraps it with comlink, and makes the
 * worker's failures the page's business:
 *  - a job can be cancelled at once: the page settles it as CANCELLED immediately and asks the
 *    worker to abort; if the worker is stuck in a long engine run and has not stopped within
 *    `hardStopMs`, the worker is terminated and restarted (the UI never waits on it);
 *  - a crash (an uncaught error in the worker, a failed start) rejects every pending call with a
 *    clear error and starts a fresh worker; `onRestart` lets the page reload its model there.
 */
import * as Comlink from 'comlink';
import { LoupeError, toLoupeError } from '../../engine/errors';
import type { EngineWorkerApi } from '../../../workers/protocol';

export interface Job<T> {
  id: string;
  promise: Promise<T>;
  cancel(): void;
}

type Pending = { reject: (e: LoupeError) => void };

export interface ClientEvents {
  /** a worker (the first, or a restarted one) was started: configure it here */
  onStart?: (api: Comlink.Remote<EngineWorkerApi>) => void;
  /** the worker died (crash or hard stop) and a new one was started */
  onRestart?: (reason: string) => void;
}

let seq = 0;
export function newJobId(prefix = 'job'): string {
  return `${prefix}-${Date.now().toString(36)}-${(++seq).toString(36)}`;
}

export class EngineClient {
  private worker!: Worker;
  private api!: Comlink.Remote<EngineWorkerApi>;
  private pending = new Set<Pending>();
  private generation = 0;
  restarts = 0;
  hardStopMs = 3000;

  constructor(
    private readonly factory: () => Worker,
    private readonly events: ClientEvents = {},
  ) {
    this.start();
  }

  private start(): void {
    const gen = ++this.generation;
    this.worker = this.factory();
    this.worker.addEventListener('error', (ev) => {
      ev.preventDefault?.();
      if (gen === this.generation) this.restart(`the model worker crashed: ${ev.message || 'unknown error'}`);
    });
    this.worker.addEventListener('messageerror', () => {
      if (gen === this.generation) this.restart('the model worker sent a message the page could not read');
    });
    this.api = Comlink.wrap<EngineWorkerApi>(this.worker);
    this.events.onStart?.(this.api);
  }

  /** Kill the worker, fail everything pending, start a fresh one. */
  restart(reason: string): void {
    this.worker.terminate();
    const err = new LoupeError(
      'INTERNAL',
      `${reason[0].toUpperCase()}${reason.slice(1)}.`,
      'The worker was restarted; the page kept your inputs and results. Run again.',
    );
    for (const p of [...this.pending]) p.reject(err);
    this.pending.clear();
    this.restarts++;
    this.start();
    this.events.onRestart?.(reason);
  }

  /** Call the worker; the promise also settles if the worker dies. Errors are LoupeErrors. */
  call<T>(fn: (api: Comlink.Remote<EngineWorkerApi>) => Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const p: Pending = { reject };
      this.pending.add(p);
      fn(this.api).then(
        (v) => {
          if (this.pending.delete(p)) resolve(v);
        },
        (e) => {
          if (this.pending.delete(p)) reject(toLoupeError(e));
        },
      );
    });
  }

  /**
   * Start a cancellable job. `run` receives the job id and the remote api.
   * cancel(): settles the job as CANCELLED now; the worker is asked to abort, and restarted
   * if it has not finished the job within hardStopMs.
   */
  job<T>(prefix: string, run: (id: string, api: Comlink.Remote<EngineWorkerApi>) => Promise<T>): Job<T> {
    const id = newJobId(prefix);
    let settled = false;
    let rejectNow: (e: LoupeError) => void = () => {};
    const gen = this.generation;
    const inner = this.call((api) => run(id, api));
    const promise = new Promise<T>((resolve, reject) => {
      rejectNow = reject;
      inner.then(
        (v) => {
          settled = true;
          resolve(v);
        },
        (e) => {
          settled = true;
          reject(e);
        },
      );
    });
    const cancel = () => {
      if (settled) return;
      rejectNow(new LoupeError('CANCELLED', 'Cancelled.'));
      void this.api.cancel(id).catch(() => {});
      setTimeout(() => {
        if (!settled && gen === this.generation)
          this.restart('a cancelled job did not stop in time, so the model worker was stopped');
      }, this.hardStopMs);
    };
    return { id, promise, cancel };
  }

  get remote(): Comlink.Remote<EngineWorkerApi> {
    return this.api;
  }

  dispose(): void {
    this.generation++;
    this.worker.terminate();
  }
}
