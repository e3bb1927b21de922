/**
 * Headless mode's executor on the companion's thread: the engine runs in a worker thread
 * (engine-thread.ts) with a heap limit, so no model — a backtracking tokenizer regex, a template,
 * a heap-hungry file — can block or exhaust the thread that answers MCP. Here run the deadline
 * timers, cancellation and loupe_status (from the status the thread sent after its last call).
 *
 * A call past its deadline (or cancelled) is answered at once; the thread is asked to stop it and,
 * if it has not within STOP_GRACE_MS, is ended and a fresh one started for the next call (the model
 * then loads again on first use; handles of the old instance expire). A thread that dies (out of
 * its heap limit, a crash) fails its calls with a structured error and is replaced the same way.
 */
import { Worker } from 'node:worker_threads';
import { CAPS } from '../engine/caps';
import { LoupeError, toLoupeError } from '../engine/errors';
import { newInstanceId } from '../ops/lib/handles';
import type { Progress } from '../ops/types';
import type { CallOptions, ExecResult, Executor } from './executor';
import { callCancelled, deadlineExceeded } from './call-errors';
import type { AgentInfo } from './protocol';
import type { EngineThreadData, FromThread, ToThread } from './engine-thread';
import { NO_LOCAL, type LocalAccess } from '../node/local-access';
import { disableOrtTelemetry } from '../node/ort-node';
import { prepareVulkan } from '../node/vulkan';
import type { NodeBackend } from '../node/backends';

/** how long a call past its deadline may take to stop before its thread is ended */
export const STOP_GRACE_MS = 3000;

export interface ThreadExecutorOptions {
  backend?: NodeBackend;
  model?: string;
  local?: LocalAccess;
  log?: (msg: string) => void;
  /** MiB of JS heap the engine thread may use (weights live outside it); default CAPS.engineHeapMiB */
  heapMiB?: number;
}

interface Pending {
  resolve: (r: ExecResult) => void;
  reject: (e: LoupeError) => void;
  onProgress?: (p: Progress) => void;
  /** answered already (deadline or cancel); the thread still owes its end */
  settled: boolean;
  stopTimer?: NodeJS.Timeout;
}

export class ThreadExecutor implements Executor {
  readonly mode = 'headless' as const;
  private worker?: Worker;
  private id = 0;
  private instance = newInstanceId();
  private pending = new Map<number, Pending>();
  private lastStatus: Record<string, unknown> | null = null;
  private restarts = 0;
  private closing = false;

  constructor(private o: ThreadExecutorOptions = {}) {}

  setAgent(_agent: AgentInfo): void {
    /* no page log to show it in */
  }

  async status(): Promise<Record<string, unknown>> {
    const base = this.lastStatus ?? {
      instance_id: this.instance,
      backend: this.o.backend ?? 'node',
      model: null,
      model_on_first_use: this.o.model ?? 'default',
    };
    return {
      ...base,
      instance_id: this.instance,
      engine_thread: { busy: this.pending.size > 0, restarts: this.restarts },
    };
  }

  async currentInstance(): Promise<string | undefined> {
    return this.instance;
  }

  /** calls answered already whose runs have not yet stopped: the next call waits for them (or for their thread's end) */
  private stopping = new Map<number, { done: Promise<void>; resolve: () => void }>();
  private stopped(id: number): void {
    this.stopping.get(id)?.resolve();
    this.stopping.delete(id);
  }

  async execute(tool: string, args: Record<string, unknown>, o: CallOptions): Promise<ExecResult> {
    while (this.stopping.size) await Promise.race([...this.stopping.values()].map((s) => s.done));
    return this.send(tool, args, o);
  }

  private send(tool: string, args: Record<string, unknown>, o: CallOptions): Promise<ExecResult> {
    const w = this.thread();
    const id = ++this.id;
    return new Promise<ExecResult>((resolve, reject) => {
      const p: Pending = { resolve, reject, onProgress: o.onProgress, settled: false };
      this.pending.set(id, p);
      const stop = (e: LoupeError) => {
        if (p.settled) return;
        p.settled = true;
        clearTimeout(timer);
        o.signal?.removeEventListener('abort', onAbort);
        reject(e);
        let resolve = () => {};
        const done = new Promise<void>((r) => (resolve = r));
        this.stopping.set(id, { done, resolve });
        w.postMessage({ t: 'cancel', id } satisfies ToThread);
        // a run that does not hear the cancel (a regex, a template, a native call) loses its thread
        p.stopTimer = setTimeout(() => {
          if (this.pending.has(id) && this.worker === w) {
            this.o.log?.(
              `${tool} did not stop within ${STOP_GRACE_MS} ms of its cancellation: restarting the engine thread`,
            );
            this.replace(w, null);
          }
        }, STOP_GRACE_MS);
      };
      const timer = setTimeout(() => stop(deadlineExceeded(tool)), Math.max(0, o.deadline - Date.now()));
      const onAbort = () => stop(callCancelled());
      if (o.signal?.aborted) onAbort();
      o.signal?.addEventListener('abort', onAbort, { once: true });
      const settle = p.resolve;
      p.resolve = (r) => {
        clearTimeout(timer);
        o.signal?.removeEventListener('abort', onAbort);
        settle(r);
      };
      const fail = p.reject;
      p.reject = (e) => {
        clearTimeout(timer);
        o.signal?.removeEventListener('abort', onAbort);
        fail(e);
      };
      w.postMessage({ t: 'exec', id, tool, args, deadline: o.deadline } satisfies ToThread);
    });
  }

  async close(): Promise<void> {
    this.closing = true;
    const w = this.worker;
    this.worker = undefined;
    if (!w) return;
    await new Promise<void>((resolve) => {
      const t = setTimeout(() => void w.terminate().finally(resolve), 5000);
      w.on('message', (m: FromThread) => {
        if (m.t === 'closed') {
          clearTimeout(t);
          void w.terminate().finally(resolve);
        }
      });
      w.once('exit', () => {
        clearTimeout(t);
        resolve();
      });
      w.postMessage({ t: 'close' } satisfies ToThread);
    });
  }

  // ---------------------------------------------------------------------------------------

  private thread(): Worker {
    if (this.worker) return this.worker;
    const data: EngineThreadData = {
      instanceId: this.instance,
      backend: this.o.backend,
      model: this.o.model,
      local: this.o.local ?? NO_LOCAL,
    };
    // a worker thread's process.env is its own copy: onnxruntime's native getenv sees only what this thread sets
    disableOrtTelemetry();
    prepareVulkan();
    const heap = this.o.heapMiB ?? CAPS.engineHeapMiB;
    const w = new Worker(new URL('./engine-thread-entry.mjs', import.meta.url), {
      workerData: data,
      resourceLimits: { maxOldGenerationSizeMb: heap },
      stdout: false,
      stderr: false,
    });
    w.on('message', (m: FromThread) => this.onMessage(w, m));
    w.on('error', (e) => {
      const oom = (e as { code?: string }).code === 'ERR_WORKER_OUT_OF_MEMORY';
      this.o.log?.(`engine thread failed: ${e.message}`);
      this.replace(
        w,
        oom
          ? new LoupeError(
              'TOO_LARGE',
              `The engine ran out of its ${heap} MiB heap limit (engineHeapMiB) and was restarted.`,
              'The input or model needs more memory than Loupe lets one run take; try a smaller one.',
            )
          : new LoupeError('RUNTIME_ERROR', `The engine thread stopped: ${e.message}. It was restarted.`),
      );
    });
    w.on('exit', (code) => {
      if (this.worker === w && !this.closing)
        this.replace(w, new LoupeError('RUNTIME_ERROR', `The engine thread exited (${code}). It was restarted.`));
    });
    this.worker = w;
    return w;
  }

  /** end thread `w` (if still current) and fail its calls; the next call starts a fresh one with a new instance */
  private replace(w: Worker, error: LoupeError | null): void {
    if (this.worker !== w) return;
    this.worker = undefined;
    this.restarts++;
    this.instance = newInstanceId();
    this.lastStatus = null;
    void w.terminate();
    for (const [id, p] of this.pending) {
      clearTimeout(p.stopTimer);
      this.stopped(id);
      if (!p.settled)
        p.reject(error ?? new LoupeError('RUNTIME_ERROR', 'The engine thread was restarted during the call.'));
      this.pending.delete(id);
    }
  }

  private onMessage(w: Worker, m: FromThread): void {
    if (this.worker !== w) return;
    if (m.t === 'log') this.o.log?.(m.msg);
    else if (m.t === 'status') this.lastStatus = m.status;
    else if (m.t === 'progress') {
      const p = this.pending.get(m.id);
      if (p && !p.settled) p.onProgress?.(m.p as Progress);
    } else if (m.t === 'done' || m.t === 'fail') {
      const p = this.pending.get(m.id);
      if (!p) return;
      this.pending.delete(m.id);
      clearTimeout(p.stopTimer);
      this.stopped(m.id);
      if (p.settled) return;
      p.settled = true;
      if (m.t === 'done') p.resolve(m.result as ExecResult);
      else p.reject(toLoupeError(m.error));
    }
  }
}
