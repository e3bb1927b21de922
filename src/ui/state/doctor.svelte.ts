/** The Doctor: what this browser offers (isolation, threads, WebGPU), the WebGPU-vs-WASM agreement check and what q8 weights cost. */
import type { EngineClient } from '../engine/client';
import type { JobState, JobStore, Start } from './jobs.svelte';
import { errInfo, type ErrorInfo } from './errors';
import type { AgreementResult, DoctorInfo, Q8CostResult } from '../../../workers/protocol';

/** A Doctor check's last result, or the error it ended with (both null before it first runs and while it runs). */
export class CheckResult<T> {
  result = $state.raw<T | null>(null);
  error = $state<ErrorInfo | null>(null);
}

export class DoctorStore {
  info = $state.raw<DoctorInfo | null>(null);
  readonly agreement = new CheckResult<AgreementResult>();
  readonly q8Cost = new CheckResult<Q8CostResult>();

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

  /** a warning before any run when the backend in use is slow (WebGPU on a software adapter), else null */
  slowBackend(backend: string | undefined): string | null {
    if (backend !== 'webgpu' || !this.info?.gpu.isFallbackAdapter) return null;
    return (
      'WebGPU here is a software adapter (no GPU): operations run far slower than on WASM (patch took 55 s ' +
      'against 1.05 s in one measurement). Choose WASM unless you are testing WebGPU itself.'
    );
  }

  /** why the agreement check cannot run now (null: it can) */
  agreementBlocked(hasModel: boolean): string | null {
    return this.blocked(hasModel, this.webgpuLacking());
  }

  /** what the agreement check lacks in this browser (null: nothing) */
  private webgpuLacking(): string | null {
    const gpu = this.info?.gpu;
    if (!gpu) return 'Checking what this browser offers…';
    return gpu.available
      ? null
      : `It needs WebGPU, which this browser does not offer (${gpu.reason?.replace(/\.$/, '')}).`;
  }

  runAgreement(prompt: string): Promise<void> {
    return this.check(this.agreement, 'agreement', 'agreement check', (id, api, p) => api.agreement(id, prompt, p));
  }

  /** why the q8 cost cannot be measured now (null: it can) */
  q8CostBlocked(hasModel: boolean): string | null {
    return this.blocked(hasModel, null);
  }

  runQ8Cost(prompt: string): Promise<void> {
    return this.check(this.q8Cost, 'q8-cost', 'q8 cost', (id, api, p) => api.q8Cost(id, prompt, p));
  }

  /** why a check cannot run now, in this order: no model, what the check itself lacks (`lacking`), a running job */
  private blocked(hasModel: boolean, lacking: string | null): string | null {
    if (!hasModel) return 'Load a model first.';
    if (lacking) return lacking;
    if (this.jobs.busy) return 'Wait for the running job.';
    return null;
  }

  /** One Doctor check as a job: its result (or error) cleared at the start and set at the end. */
  private async check<T>(into: CheckResult<T>, kind: JobState['kind'], label: string, start: Start<T>): Promise<void> {
    if (this.jobs.busy) return;
    await this.jobs.exclusive(async () => {
      into.result = null;
      into.error = null;
      try {
        into.result = await this.jobs.track(kind, label, start);
      } catch (e) {
        into.error = errInfo(e);
      }
    });
  }
}
