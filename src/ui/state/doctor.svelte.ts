/** The Doctor: what this browser offers (isolation, threads, WebGPU) and the WebGPU-vs-WASM agreement check. */
import type { EngineClient } from '../engine/client';
import type { JobStore } from './jobs.svelte';
import { errInfo, type ErrorInfo } from './errors';
import type { AgreementResult, DoctorInfo } from '../../../workers/protocol';

export class DoctorStore {
  info = $state.raw<DoctorInfo | null>(null);
  agreement = $state.raw<AgreementResult | null>(null);
  agreementError = $state<ErrorInfo | null>(null);

  constructor(private readonly client: EngineClient, private readonly jobs: JobStore, private readonly notify: (kind: 'error', text: string) => void) {}

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
    if (!this.info.gpu.available) return `It needs WebGPU, which this browser does not offer (${this.info.gpu.reason}).`;
    if (this.jobs.busy) return 'Wait for the running job.';
    return null;
  }

  async runAgreement(prompt: string): Promise<void> {
    if (this.jobs.busy) return;
    await this.jobs.exclusive(async () => {
      this.agreementError = null;
      this.agreement = null;
      try {
        this.agreement = await this.jobs.track('agreement', 'agreement check', (id, api, onProgress) => api.agreement(id, prompt, onProgress));
      } catch (e) {
        this.agreementError = errInfo(e);
      }
    });
  }
}
