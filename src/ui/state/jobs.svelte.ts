/**
 * The worker's one job at a time, as the page shows it (the job bar: stage, progress, Cancel).
 * Every job the page starts — an operation from the form, a share link's re-run, the Doctor's
 * agreement check and q8 cost — goes through `track`, so the bookkeeping is written once.
 */
import * as Comlink from 'comlink';
import type { Remote } from 'comlink';
import type { Progress } from '../../ops/types';
import type { EngineClient, Job } from '../engine/client';
import type { EngineWorkerApi } from '../../../workers/protocol';

export interface JobState {
  id: string;
  kind: 'operation' | 'agreement' | 'q8-cost';
  /** what the job bar names it */
  op: string;
  stage: string;
  done: number;
  total: number;
  startedAt: number;
  /** when the current stage began, and when its step count last moved (the bar paces itself from them) */
  stageAt: number;
  stepAt: number;
}

export type Start<T> = (
  id: string,
  api: Remote<EngineWorkerApi>,
  onProgress: ((p: Progress) => void) & Comlink.ProxyMarked,
) => Promise<T>;

export class JobStore {
  job = $state<JobState | null>(null);
  private current: Job<unknown> | null = null;
  private lock: Promise<void> = Promise.resolve();

  constructor(private readonly client: EngineClient) {}

  get busy(): boolean {
    return this.job !== null;
  }

  /** One job at a time in the worker (the page's own runs, share re-runs, loads and agent calls queue up). */
  async exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const prev = this.lock;
    let release!: () => void;
    this.lock = new Promise<void>((r) => (release = r));
    try {
      await prev;
      return await fn();
    } finally {
      release();
    }
  }

  /**
   * Start a worker job and show it in the job bar until it settles. `signal` (an agent's
   * cancellation) cancels it like the Cancel button. Call inside `exclusive`.
   */
  async track<T>(
    kind: JobState['kind'],
    label: string,
    start: Start<T>,
    opts: { signal?: AbortSignal; onProgress?: (p: Progress) => void } = {},
  ): Promise<T> {
    const onProgress = (p: Progress) => {
      const j = this.job;
      if (j && j.id === job.id) {
        const now = Date.now();
        if (p.stage !== j.stage) j.stageAt = now;
        if (p.stage !== j.stage || p.done !== j.done) j.stepAt = now;
        j.stage = p.stage;
        j.done = p.done;
        j.total = p.total;
      }
      opts.onProgress?.(p);
    };
    const job = this.client.job(kind === 'operation' ? 'op' : 'agree', (id, api) =>
      start(id, api, Comlink.proxy(onProgress)),
    );
    const onAbort = () => job.cancel();
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    this.current = job as Job<unknown>;
    const now = Date.now();
    this.job = {
      id: job.id,
      kind,
      op: label,
      stage: 'starting',
      done: 0,
      total: 0,
      startedAt: now,
      stageAt: now,
      stepAt: now,
    };
    try {
      return await job.promise;
    } finally {
      opts.signal?.removeEventListener('abort', onAbort);
      if (this.current === (job as Job<unknown>)) this.reset();
    }
  }

  cancel(): void {
    this.current?.cancel();
  }

  /** forget the job (its worker is gone) */
  reset(): void {
    this.current = null;
    this.job = null;
  }
}
