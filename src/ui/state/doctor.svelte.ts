/** The Doctor: what this browser offers (isolation, threads, WebGPU), the WebGPU-vs-WASM agreement check and what q8 weights cost. */
import type { EngineClient } from '../engine/client';
import type { JobState, JobStore, Start } from './jobs.svelte';
import { errInfo, type ErrorInfo } from './errors';
import type { AgreementResult, DoctorInfo, Q8CostResult } from '../../../workers/protocol';

export class DoctorStore {
  info = $state.raw<DoctorInfo | null>(null);
  agreement = $state.raw<AgreementResult | null>(null);
  agreementError = $state<ErrorInfo | null>(null);
  q8Cost = $state.raw<Q8CostResult | null>(null);
  q8CostError = $state<ErrorInfo | null>(null);

  constructor(
    private readonly client: EngineClient,
    private readonly jobs: JobStore,
    private readonly notify: (kind: 'error', text: string) => void,
  ) {}

  async run(): Promise<void> {
    try {
      this.info = await this.client.call((api) => api.doctor());
    } catch (e) {
      this.notify('error', errInfo(e).message);
    }
  }

  /** why the agreement check cannot run now (null: it can) */
  agreementBlocked(hasModel: boolean): string | null {
    if (!hasModel) return 'Load a model first.';
    if (!this.info) return 'Checking what this browser offers…';
    if (!this.info.gpu.available)
      return `It needs WebGPU, which this browser does not offer (${this.info.gpu.reason?.replace(/\.$/, '')}).`;
    if (this.jobs.busy) return 'Wait for the running job.';
    return null;
  }

  runAgreement(prompt: string): Promise<void> {
    return this.check(
      'agreement',
      'agreement check',
      (id, api, p) => api.agreement(id, prompt, p),
      (r, e) => {
        this.agreement = r;
        this.agreementError = e;
      },
    );
  }

  /** why the q8 cost cannot be measured now (null: it can) */
  q8CostBlocked(hasModel: boolean): string | null {
    if (!hasModel) return 'Load a model first.';
    if (this.jobs.busy) return 'Wait for the running job.';
    return null;
  }

  runQ8Cost(prompt: string): Promise<void> {
    return this.check(
      'q8-cost',
      'q8 cost',
      (id, api, p) => api.q8Cost(id, prompt, p),
      (r, e) => {
        this.q8Cost = r;
        this.q8CostError = e;
      },
    );
  }

  /** One Doctor check as a job: its result (or error) cleared at the start and set at the end. */
  private async check<T>(
    kind: JobState['kind'],
    label: string,
    start: Start<T>,
    set: (r: T | null, e: ErrorInfo | null) => void,
  ): Promise<void> {
    if (this.jobs.busy) return;
    await this.jobs.exclusive(async () => {
      set(null, null);
      try {
        set(await this.jobs.track(kind, label, start), null);
      } catch (e) {
        set(null, errInfo(e));
      }
    });
  }
}
