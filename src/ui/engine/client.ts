/**
 * The page's handle on the model worker. It owns the Worker, wraps it with comlink, and makes the
 * worker's failures the page's business:
 *  - a job can be cancelled at once: the page settles it as CANCELLED immediately and asks the
 *    worker to abort; if the worker is stuck in a long engine run and has not stopped within
 *    `hardStopMs`, the worker is terminated and restarted (the UI never waits on it);
 *  - a crash (an uncaught error in the worker, a failed start) rejects every pending call with a
 *    clear error and starts a fresh worker; `onRestart` lets the page reload its model there.
 *
 * The engine may also be a served one (`loupe serve`, attach()): a socket endpoint (ui/engine/
 * remote.ts) speaks the same protocol. A hard stop reconnects to it; its end — the engine killed,
 * the tunnel gone — falls back to the in-page worker, through the same restart.
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

/** what the client talks to: the in-page Worker, or a socket to a served engine */
export type EngineEndpoint = Comlink.Endpoint & { terminate(): void };

/** a served engine the client is attached to */
export interface Attached {
  url: string;
  /** a fresh connection (after a hard stop) */
  reconnect: () => EngineEndpoint;
}

export interface ClientEvents {
  /** a worker (the first, or a restarted one) was started: configure it here */
  onStart?: (api: Comlink.Remote<EngineWorkerApi>) => void;
  /** the worker died (crash or hard stop) and a new one was started; `from`: the served engine that ended */
  onRestart?: (reason: string, from?: string, standby?: boolean) => void;
  /** the engine changed: attached to a served one (its URL), or back on the in-page worker (null) */
  onEngine?: (url: string | null) => void;
}

let seq = 0;
export function newJobId(prefix = 'job'): string {
  return `${prefix}-${Date.now().toString(36)}-${(++seq).toString(36)}`;
}

export class EngineClient {
  private worker!: EngineEndpoint;
  private attachedTo: Attached | null = null;
  /**
   * The in-page worker kept while attached (switchTo's `standby`), its runtime and model loaded:
   * where the page goes back to when the engine that also served the page dies, taking the page's
   * origin (its ort/ runtime and model files) with it.
   */
  private standby: EngineEndpoint | null = null;
  private api!: Comlink.Remote<EngineWorkerApi>;
  private pending = new Set<Pending>();
  private generation = 0;
  restarts = 0;
  hardStopMs = 3000;

  constructor(
    private readonly factory: () => EngineEndpoint,
    private readonly events: ClientEvents = {},
  ) {
    this.start();
  }

  /** the served engine in use, or null for the in-page worker */
  get attached(): string | null {
    return this.attachedTo?.url ?? null;
  }

  private start(endpoint?: EngineEndpoint): void {
    const gen = ++this.generation;
    this.worker = endpoint ?? (this.attachedTo ? this.attachedTo.reconnect() : this.factory());
    this.worker.addEventListener('error', (ev) => {
      (ev as Event).preventDefault?.();
      const msg = (ev as Event & { message?: string }).message;
      if (gen !== this.generation) return;
      if (this.attachedTo) this.fallBack(msg || 'the Loupe engine went away');
      else this.restart(`the model worker crashed: ${msg || 'unknown error'}`);
    });
    this.worker.addEventListener('messageerror', () => {
      if (gen !== this.generation) return;
      if (this.attachedTo) this.fallBack('the Loupe engine sent a message the page could not read');
      else this.restart('the model worker sent a message the page could not read');
    });
    this.api = Comlink.wrap<EngineWorkerApi>(this.worker);
    this.events.onStart?.(this.api);
  }

  /** Kill the worker, fail everything pending, start a fresh one. */
  restart(reason: string): void {
    this.replace(reason, 'INTERNAL', 'The worker was restarted; the page kept your inputs and results. Run again.');
  }

  /** the served engine ended: fail what is pending and go on with the in-page worker */
  private fallBack(reason: string): void {
    const url = this.attachedTo?.url;
    this.attachedTo = null;
    this.replace(
      reason,
      'ENGINE_GONE',
      'The page is back on its own engine and kept your inputs and results; attach again once it runs.',
      url,
    );
  }

  private replace(reason: string, code: 'INTERNAL' | 'ENGINE_GONE', hint: string, from?: string): void {
    this.failPending(new LoupeError(code, `${cap(reason)}.`, hint));
    this.restarts++;
    const standby = from ? this.takeStandby() : undefined;
    this.start(standby);
    if (from) this.events.onEngine?.(null);
    this.events.onRestart?.(reason, from, !!standby);
  }

  /**
   * Use a served engine (`endpoint` already open), or the in-page worker again (null). What is
   * pending fails as CANCELLED; the page loads its model on the new engine itself.
   */
  switchTo(target: { endpoint: EngineEndpoint; attached: Attached } | null, opts: { standby?: boolean } = {}): void {
    const keep = target && opts.standby && !this.attachedTo ? this.worker : null;
    this.failPending(new LoupeError('CANCELLED', 'Cancelled: the page switched engines.'), !!keep);
    if (keep) {
      this.standby?.terminate();
      this.standby = keep;
    }
    this.attachedTo = target?.attached ?? null;
    this.start(target?.endpoint ?? this.takeStandby());
    this.events.onEngine?.(this.attached);
  }

  private takeStandby(): EngineEndpoint | undefined {
    const s = this.standby ?? undefined;
    this.standby = null;
    return s;
  }

  private failPending(err: LoupeError, keepWorker = false): void {
    this.generation++;
    if (!keepWorker) this.worker.terminate();
    for (const p of [...this.pending]) p.reject(err);
    this.pending.clear();
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
    this.attachedTo = null;
    this.standby?.terminate();
    this.standby = null;
    this.generation++;
    this.worker.terminate();
  }
}

const cap = (s: string) => `${s[0].toUpperCase()}${s.slice(1)}`;
