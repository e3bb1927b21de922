/**
 * Jobs: long operations an agent starts with `as_job: true` so that no client-side request
 * timeout (often ~60 s) can cut them. Each job has an opaque random id (128 bits) and a stated
 * lifetime: a running job is stopped at its deadline; a finished one is kept `ttlMs`, then
 * forgotten. Jobs belong to one companion (one MCP connection), so clients never see each
 * other's jobs.
 */
import { LoupeError, toLoupeError } from '../engine/errors';
import type { Progress } from '../ops/types';
import { randomHex } from '../ops/lib/handles';
import type { JobHandle } from './tools';

export type JobState = 'running' | 'succeeded' | 'failed' | 'cancelled';

export interface JobRun {
  signal: AbortSignal;
  deadline: number;
  onProgress(p: Progress): void;
}

interface Job<R> {
  id: string;
  tool: string;
  state: JobState;
  progress: Progress | null;
  created: number;
  finished: number | null;
  deadline: number;
  result?: R;
  error?: LoupeError;
  ctl: AbortController;
  settled: Promise<void>;
}

export interface JobOptions {
  /** how long a finished job's result is kept */
  ttlMs?: number;
  /** hard limit on a running job */
  deadlineMs?: number;
  /** most jobs kept at once (running + finished) */
  maxJobs?: number;
}

export class JobManager<R = unknown> {
  private jobs = new Map<string, Job<R>>();
  readonly ttlMs: number;
  readonly deadlineMs: number;
  private maxJobs: number;

  constructor(o: JobOptions = {}) {
    this.ttlMs = o.ttlMs ?? 30 * 60_000;
    this.deadlineMs = o.deadlineMs ?? 60 * 60_000;
    this.maxJobs = o.maxJobs ?? 32;
  }

  start(tool: string, run: (r: JobRun) => Promise<R>): JobHandle {
    this.sweep();
    if (this.jobs.size >= this.maxJobs) {
      throw new LoupeError(
        'TOO_LARGE',
        `Too many jobs (${this.maxJobs}) are running or waiting to be collected.`,
        'Collect finished jobs with job_result, cancel some with job_cancel, or wait for them to expire.',
      );
    }
    const id = 'job_' + randomHex(16);
    const ctl = new AbortController();
    const job: Job<R> = {
      id,
      tool,
      state: 'running',
      progress: null,
      created: Date.now(),
      finished: null,
      deadline: Date.now() + this.deadlineMs,
      ctl,
      settled: Promise.resolve(),
    };
    job.settled = run({ signal: ctl.signal, deadline: job.deadline, onProgress: (p) => (job.progress = p) }).then(
      (r) => this.finish(job, 'succeeded', r),
      (e) => {
        const err = toLoupeError(e);
        this.finish(
          job,
          ctl.signal.aborted || err.code === 'CANCELLED' || err.code === 'ABORTED' ? 'cancelled' : 'failed',
          undefined,
          err,
        );
      },
    );
    this.jobs.set(id, job);
    return this.handle(job);
  }

  status(id: string): JobHandle {
    return this.handle(this.get(id));
  }

  /** The finished job's value; for a running job (after waiting up to waitMs) undefined. */
  async result(
    id: string,
    waitMs = 0,
    signal?: AbortSignal,
  ): Promise<{ done: true; value: R } | { done: false; status: JobHandle }> {
    const job = this.get(id);
    if (job.state === 'running' && waitMs > 0) {
      let t: ReturnType<typeof setTimeout> | undefined;
      let onAbort: (() => void) | undefined;
      await Promise.race([
        job.settled,
        new Promise<void>((r) => (t = setTimeout(r, waitMs))),
        new Promise<void>((r) => signal?.addEventListener('abort', (onAbort = () => r()), { once: true })),
      ]);
      clearTimeout(t);
      if (onAbort) signal?.removeEventListener('abort', onAbort);
    }
    if (job.state === 'running') return { done: false, status: this.handle(job) };
    if (job.state === 'succeeded') return { done: true, value: job.result as R };
    throw job.error ?? new LoupeError('CANCELLED', `Job ${id} was cancelled.`);
  }

  cancel(id: string): JobHandle {
    const job = this.get(id);
    if (job.state === 'running') job.ctl.abort();
    return this.handle(job);
  }

  /** Wait until a cancelled job has actually settled (tests, shutdown). */
  settled(id: string): Promise<void> {
    return this.get(id).settled;
  }

  get runningCount(): number {
    return [...this.jobs.values()].filter((j) => j.state === 'running').length;
  }

  list(): JobHandle[] {
    this.sweep();
    return [...this.jobs.values()].map((j) => this.handle(j));
  }

  closeAll(): void {
    for (const j of this.jobs.values()) if (j.state === 'running') j.ctl.abort();
    this.jobs.clear();
  }

  private get(id: string): Job<R> {
    this.sweep();
    const job = typeof id === 'string' ? this.jobs.get(id) : undefined;
    if (!job)
      throw new LoupeError(
        'HANDLE_EXPIRED',
        `No job ${JSON.stringify(id)}: it never existed in this session or it expired.`,
        `Finished jobs are kept ${Math.round(this.ttlMs / 60000)} minutes. Start the operation again.`,
      );
    return job;
  }

  private finish(job: Job<R>, state: JobState, result?: R, error?: LoupeError): void {
    if (job.state !== 'running') return;
    job.state = state;
    job.result = result;
    job.error = error;
    job.finished = Date.now();
  }

  private sweep(): void {
    const now = Date.now();
    for (const [id, j] of this.jobs) {
      if (j.state === 'running' && now > j.deadline) {
        j.ctl.abort();
        this.finish(
          j,
          'failed',
          undefined,
          new LoupeError(
            'DEADLINE_EXCEEDED',
            `Job ${id} ran past its ${Math.round(this.deadlineMs / 60000)}-minute limit and was stopped.`,
          ),
        );
      }
      if (j.finished !== null && now - j.finished > this.ttlMs) this.jobs.delete(id);
    }
  }

  private handle(j: Job<R>): JobHandle {
    const expires = j.finished === null ? j.deadline : j.finished + this.ttlMs;
    const hint =
      j.state === 'running'
        ? 'Poll job_status every few seconds; call job_result when status is succeeded (or job_result with wait_s to wait).'
        : j.state === 'succeeded'
          ? `Call job_result to get the document (kept until ${new Date(expires).toISOString()}).`
          : 'The job did not produce a document; see error.';
    return {
      job_id: j.id,
      tool: j.tool,
      status: j.state,
      progress: j.progress ? { stage: j.progress.stage, done: j.progress.done, total: j.progress.total } : null,
      created_at: new Date(j.created).toISOString(),
      finished_at: j.finished === null ? null : new Date(j.finished).toISOString(),
      expires_at: new Date(expires).toISOString(),
      error: j.error
        ? { code: j.error.code, message: j.error.message, ...(j.error.hint ? { hint: j.error.hint } : {}) }
        : null,
      hint,
    };
  }
}
