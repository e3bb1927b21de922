/** One AbortController per running job, so `cancel(jobId)` reaches the engine's signal. */
export class JobTable {
  private jobs = new Map<string, AbortController>();

  start(jobId: string): AbortSignal {
    this.jobs.get(jobId)?.abort();
    const ac = new AbortController();
    this.jobs.set(jobId, ac);
    return ac.signal;
  }

  end(jobId: string): void {
    this.jobs.delete(jobId);
  }

  cancel(jobId: string): boolean {
    const ac = this.jobs.get(jobId);
    if (!ac) return false;
    ac.abort();
    return true;
  }

  get running(): number {
    return this.jobs.size;
  }
}

/**
 * Forward progress through a comlink proxy at most every `ms` (each call is a postMessage), but
 * always forward the events `isFinal` picks (a file finished, done === total) so bars reach 100%.
 */
export function throttle<T>(fn: (p: T) => unknown, ms: number, isFinal: (p: T) => boolean): (p: T) => void {
  let last = 0;
  let pending: T | null = null;
  let timer: ReturnType<typeof setTimeout> | null = null;
  const send = (p: T) => {
    last = Date.now();
    pending = null;
    try {
      void Promise.resolve(fn(p)).catch(() => {});
    } catch {
      /* the page went away; progress is best effort */
    }
  };
  return (p: T) => {
    if (isFinal(p) || Date.now() - last >= ms) {
      if (timer) {
        clearTimeout(timer);
        timer = null;
      }
      send(p);
      return;
    }
    pending = p;
    timer ??= setTimeout(() => {
      timer = null;
      if (pending) send(pending);
    }, ms);
  };
}

export const fileDone = (p: { done?: boolean; cached?: boolean }) => !!p.done || !!p.cached;
export const stepDone = (p: { done: number; total: number }) => p.done === 0 || p.done >= p.total;
