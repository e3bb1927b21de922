/**
 * Running an operation: from the form (validated, its carried values handed on), from a share
 * link or the agent bridge; the result lands in the result store, an error under the form.
 */
import { LoupeError } from '../../engine/errors';
import { DEVICE_LOST_NOTICE, deviceLostError } from '../../engine/runtime/device-lost';
import type { Progress } from '../../ops/types';
import { errInfo, type ErrorInfo } from './errors';
import type { FormStore } from './forms.svelte';
import type { JobStore } from './jobs.svelte';
import type { ModelStore } from './models.svelte';
import type { ResultStore } from './results.svelte';
import type { HistoryEntry } from './history.svelte';

export class RunStore {
  /** the last page run's error (form validation included), shown under the form */
  error = $state<ErrorInfo | null>(null);
  /** GPU device losses this page's runs recovered from (the status bar says so) */
  deviceRecoveries = $state(0);

  constructor(
    private readonly forms: FormStore,
    private readonly jobs: JobStore,
    private readonly models: ModelStore,
    private readonly results: ResultStore,
    private readonly notify?: (kind: 'info' | 'warn' | 'error', text: string, ms?: number) => void,
  ) {
    // an error about inputs that have since been edited is stale (a running job's error is not yet shown)
    forms.onEdit = () => {
      if (!this.jobs.busy) this.error = null;
    };
  }

  async runCurrent(): Promise<void> {
    const op = this.forms.op;
    const { input, errors } = this.forms.inputFor(op);
    this.forms.errors = errors;
    if (Object.keys(errors).length) {
      this.error = {
        code: 'BAD_INPUT',
        message: `Check the parameters: ${Object.entries(errors)
          .map(([k, v]) => `${k} ${v}`)
          .join('; ')}.`,
      };
      return;
    }
    // the run's layer and direction (however they were set) are the next method's too
    this.forms.carry(op, this.forms.params[op] ?? {});
    this.forms.save();
    await this.runOperation(op, input);
  }

  /** Run from the page: errors land in `error`, the result in the result store; returns the document or null. */
  async runOperation(op: string, input: Record<string, unknown>, opts: { scroll?: boolean } = {}): Promise<any> {
    this.error = null;
    try {
      const { doc, ms } = await this.execute(op, input, { who: 'page' });
      this.results.set({ op, input, doc, model: this.models.ref, ms, fromLink: false });
      if (op === this.forms.op && opts.scroll !== false) this.results.seq++;
      // an SAE download lands in the same IndexedDB cache as the models: list it there
      if (typeof input.sae_source === 'string') void this.models.refreshCache();
      if (doc && typeof doc === 'object') this.forms.fillFrom(op, doc);
      return doc;
    } catch (e) {
      const err = errInfo(e);
      this.error =
        err.code === 'CANCELLED' ? { code: 'CANCELLED', message: `${this.forms.title(op)} was cancelled.` } : err;
      return null;
    }
  }

  /**
   * Run an operation in the worker, shown in the job bar (with Cancel). Throws LoupeErrors. A GPU
   * device lost is recovered in the worker where its runtime makes a new device (ops/types.ts);
   * where it cannot (DEVICE_LOST with `restart`: JSEP), the worker is started again, the model
   * loaded there from the cache, and the operation run once more. A document's notices are shown.
   */
  async execute(
    op: string,
    input: Record<string, unknown>,
    opts: { who: 'page' | 'agent'; signal?: AbortSignal; onProgress?: (p: Progress) => void },
  ): Promise<{ doc: any; ms: number }> {
    let r: { doc: any; ms: number };
    try {
      r = await this.executeOnce(op, input, opts);
    } catch (e) {
      if (!(e instanceof LoupeError) || e.code !== 'DEVICE_LOST' || !(e.details as any)?.restart) throw e;
      const reason = 'the GPU device was lost and this onnxruntime-web build keeps it for the model worker';
      if (!(await this.models.restartWorker(reason))) throw e;
      try {
        r = await this.executeOnce(op, input, opts);
      } catch (e2) {
        if (e2 instanceof LoupeError && e2.code === 'DEVICE_LOST') throw deviceLostError(e2.message, true);
        throw e2;
      }
      if (r.doc && typeof r.doc === 'object') r.doc.notices = [...(r.doc.notices ?? []), DEVICE_LOST_NOTICE];
    }
    for (const n of r.doc?.notices ?? []) this.notify?.('warn', n, 12000);
    if (r.doc?.notices?.includes(DEVICE_LOST_NOTICE)) this.deviceRecoveries++;
    return r;
  }

  private async executeOnce(
    op: string,
    input: Record<string, unknown>,
    opts: { who: 'page' | 'agent'; signal?: AbortSignal; onProgress?: (p: Progress) => void },
  ): Promise<{ doc: any; ms: number }> {
    return this.jobs.exclusive(async () => {
      if (!this.models.model)
        throw new LoupeError(
          'NO_MODEL',
          'No model is loaded yet.',
          'Wait for the model to load, or pick one in the Model panel.',
        );
      if (opts.signal?.aborted) throw new LoupeError('CANCELLED', 'Cancelled.');
      const t0 = performance.now();
      // inputs may come from reactive state (a share link, the form): send plain data to the worker
      const plain = $state.snapshot(input) as Record<string, unknown>;
      const label = opts.who === 'agent' ? `${op} (agent)` : op;
      const doc = await this.jobs.track(
        'operation',
        label,
        (id, api, onProgress) => api.runOperation(id, op, plain, onProgress),
        opts,
      );
      void this.models.refreshMemory();
      return { doc, ms: performance.now() - t0 };
    });
  }

  /** show a session entry as the current result of its operation, with its inputs in the form */
  showEntry(e: HistoryEntry): void {
    this.results.set(e, { restored: true });
    this.forms.select(e.op);
    this.forms.fillFromInput(e.op, e.input);
    if (typeof e.input.prompt === 'string') this.forms.prompt = e.input.prompt;
  }
}
