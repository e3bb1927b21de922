/**
 * Which engine the page runs on: its own worker, or a served one (`loupe serve`) it attached to.
 * Attaching, detaching, another page replacing this page's model on a served engine, and a
 * worker (or served engine) that died: each leaves the inputs and results where they are.
 */
import { LoupeError } from '../../engine/errors';
import type { EngineClient } from '../engine/client';
import { connectEngineSocket, engineSocket } from '../engine/remote';
import { engineTarget } from '../../share/wire';
import type { LoadedModelSummary } from '../../../workers/protocol';
import { errInfo, type ErrorInfo } from './errors';
import type { JobStore } from './jobs.svelte';
import type { ModelStore } from './models.svelte';
import type { DoctorStore } from './doctor.svelte';

interface Deps {
  client: EngineClient;
  jobs: JobStore;
  models: ModelStore;
  doctor: DoctorStore;
  notify: (kind: 'info' | 'warn' | 'error', text: string, ms?: number) => void;
  /** the new engine's operations (the form's tabs) */
  loadOps: () => Promise<void>;
}

export class AttachStore {
  /** the served engine (`loupe serve`) the page is attached to, or null: the in-page worker */
  engine = $state<string | null>(null);
  /** an attach under way, and why the last one failed */
  attaching = $state(false);
  error = $state<ErrorInfo | null>(null);
  workerRestarts = $state(0);
  /** the in-page model when the page attached (its standby worker still holds it) */
  private beforeAttach: LoadedModelSummary | null = null;

  constructor(private readonly d: Deps) {}

  /**
   * Attach to a served engine (`loupe serve`): `pasted` is its pairing line (URL#token=…) or URL,
   * `token` the token when the line has none. The model loaded now loads there (cached there);
   * inputs and results stay. False (and `error`) when no engine answered.
   */
  async attach(pasted: string, token = ''): Promise<boolean> {
    this.error = null;
    this.attaching = true;
    try {
      const t = engineTarget(pasted);
      const tok = t.token ?? token.trim();
      if (!/^[0-9a-f]{64}$/.test(tok))
        throw new LoupeError(
          'BAD_INPUT',
          'The token must be the 64 hex digits loupe serve printed.',
          'Paste the whole pairing line (URL#token=…), or the token in its own box.',
        );
      const endpoint = this.heedNotices(await connectEngineSocket(t.url, tok));
      const reconnect = () => this.heedNotices(engineSocket(t.url, tok));
      // an engine that also serves this page takes its files with it when it dies: keep the in-page
      // worker (runtime and model loaded) to go back to
      const standby = new URL(t.url).host === location.host;
      const client = this.d.client;
      if (!client.attached) this.beforeAttach = this.d.models.model;
      await this.d.jobs.exclusive(async () => {
        client.switchTo({ endpoint, attached: { url: t.url, reconnect } }, { standby });
      });
      this.d.notify('info', `Attached to the Loupe engine at ${t.url}.`, 5000);
      await this.switched();
      return true;
    } catch (e) {
      this.error = errInfo(e);
      return false;
    } finally {
      this.attaching = false;
    }
  }

  /** another connection's load replaced this page's model on the served engine: the panel stops naming it */
  private heedNotices<E extends EventTarget>(ep: E): E {
    ep.addEventListener('notice', (ev) => {
      const n = (ev as Event & { detail: { type: string; model?: string } }).detail;
      const models = this.d.models;
      if (n.type !== 'model_replaced' || !models.model) return;
      const mine = models.model.info.id;
      models.model = null;
      models.status = 'idle';
      this.d.notify(
        'warn',
        `Another page loaded ${n.model} on the engine at ${this.d.client.attached}, replacing ${mine}. Load a model again to run.`,
        0,
      );
    });
    return ep;
  }

  /** Back to the in-page engine, without a reload: the model loads here again. */
  async detach(): Promise<void> {
    const client = this.d.client;
    if (!client.attached) return;
    const url = client.attached;
    await this.d.jobs.exclusive(async () => client.switchTo(null));
    this.d.notify('info', `Detached from ${url}: back on the in-page engine.`, 5000);
    await this.switched();
  }

  private async switched(): Promise<void> {
    const models = this.d.models;
    this.d.jobs.reset();
    // the new engine holds no model yet: the page must not claim the old engine's until it loads there
    models.model = null;
    void this.d.loadOps();
    void models.refreshCache();
    if (!(await models.reload({ quiet: true })) && !models.model)
      await models.load(models.startChoice(), { quiet: true });
    if (this.d.doctor.info) void this.d.doctor.run();
  }

  /** the worker (or the served engine) went: `from` names a served engine, `standby` an in-page worker kept */
  onWorkerRestart(reason: string, from?: string, standby = false): void {
    const models = this.d.models;
    this.workerRestarts++;
    this.d.jobs.reset();
    this.d.notify(
      'warn',
      from
        ? `${reason[0].toUpperCase()}${reason.slice(1)}. The page is back on its own engine; your inputs and results are kept.`
        : `${reason[0].toUpperCase()}${reason.slice(1)}. Restarted it; your inputs and results are kept.`,
      12000,
    );
    if (from) {
      // the served engine's model went with it; a standby worker still holds the page's own
      models.model = standby ? this.beforeAttach : null;
      if (models.model) models.status = 'ready';
      if (this.d.doctor.info) void this.d.doctor.run();
    }
    void this.d.loadOps();
    // a load under way when the worker went retries by itself (ModelStore.load)
    if (!models.loading && !(standby && models.model)) void models.reload({ quiet: true });
  }
}
