/**
 * The page's state, split by concern into stores (forms, models, jobs, runs, results, attach,
 * history, share, links, doctor, prefs, notices) and joined here: this class wires them together
 * and holds the few actions that span several (start-up, a model or backend switch). It survives a worker crash:
 * inputs and results live here, not in the worker. The flat getters are the slice the agent
 * bridge (src/bridge/page-adapter.ts) and the e2e suite read.
 */
import type { Progress } from '../../ops/types';
import { EngineClient, type EngineEndpoint } from '../engine/client';
import type { WeightsMode } from '../../engine/precision';
import { newInstanceId } from '../../ops/lib/handles';
import { errInfo, type ErrorInfo } from './errors';
import { NoticeStore } from './notices.svelte';
import { PrefStore } from './prefs-store.svelte';
import { FormStore } from './forms.svelte';
import { JobStore } from './jobs.svelte';
import { ResultStore, type ResultEntry } from './results.svelte';
import { ModelStore } from './models.svelte';
import { choiceOf, sameModel, type ModelChoice } from './model-choice';
import { RunStore } from './runs.svelte';
import { AttachStore } from './attach.svelte';
import type { LoadedModelSummary } from '../../../workers/protocol';
import { ShareStore } from './share.svelte';
import { DoctorStore } from './doctor.svelte';
import { LinkStore } from './links.svelte';
import { ResultHistory, type HistoryEntry } from './history.svelte';
import type { BackendChoice } from '../../../workers/protocol';

export type { ErrorInfo, ResultEntry, ModelChoice };

export class AppState {
  /** this page load's id: handles minted in the worker carry it (the agent bridge checks them) */
  readonly instanceId = newInstanceId();
  readonly client: EngineClient;
  readonly notices = new NoticeStore();
  readonly prefs = new PrefStore();
  readonly forms = new FormStore();
  readonly resultStore = new ResultStore();
  readonly jobs: JobStore;
  readonly models: ModelStore;
  readonly share: ShareStore;
  readonly doctor: DoctorStore;
  readonly links: LinkStore;
  readonly history = new ResultHistory();
  readonly runs: RunStore;
  readonly attach: AttachStore;

  constructor(workerFactory: () => EngineEndpoint) {
    this.client = new EngineClient(workerFactory, {
      onStart: (api) => void api.configure({ instanceId: this.instanceId }).catch(() => {}),
      onRestart: (reason, from, standby) => this.attach.onWorkerRestart(reason, from, standby),
      onEngine: (url) => (this.attach.engine = url),
    });
    const notify = this.notices.notify.bind(this.notices);
    this.jobs = new JobStore(this.client);
    this.models = new ModelStore({
      client: this.client,
      notify,
      exclusive: (fn) => this.jobs.exclusive(fn),
      backend: () => this.prefs.backend,
      weights: () => this.prefs.weights,
      onLoaded: (m, previous) => {
        if (previous && !sameModel(previous.ref, m.ref)) this.modelChanged(m);
        // whether the WebGPU adapter is a software one (DoctorStore.slowBackend) is in the Doctor's probe
        if (m.info.backend === 'webgpu' && !this.doctor.info) void this.doctor.run();
        this.share.modelLoaded();
      },
    });
    this.share = new ShareStore({
      client: this.client,
      models: this.models,
      results: this.resultStore,
      forms: this.forms,
      notify,
      run: async (op, input) => {
        // no scrolling: the banner saying whether the re-run matched stays in view
        const doc = await this.runs.runOperation(op, input, { scroll: false });
        return doc === null ? { error: this.jobError ?? { code: 'INTERNAL', message: 'The run failed.' } } : { doc };
      },
    });
    this.doctor = new DoctorStore(this.client, this.jobs, notify);
    this.links = new LinkStore(this.forms, notify, () => this.resultStore.byOp[this.forms.op]?.model ?? null);
    this.runs = new RunStore(this.forms, this.jobs, this.models, this.resultStore, notify);
    const { client, jobs, models, doctor } = this;
    this.attach = new AttachStore({ client, jobs, models, doctor, notify, loadOps: () => this.loadOps() });
    this.resultStore.onNew = (e) => void this.history.record(e);
    this.history.schemaCheck = (items) => this.client.call((api) => api.checkDocuments(items));
  }

  get model() {
    return this.models.model;
  }
  get modelStatus() {
    return this.models.status;
  }
  get modelError() {
    return this.models.error;
  }
  get modelRef() {
    return this.models.ref;
  }
  get loadFiles() {
    return this.models.files;
  }
  get cache() {
    return this.models.cache;
  }
  get backend(): BackendChoice {
    return this.prefs.backend;
  }
  /** the bridge sets the backend for its next load (no reload here: it loads next) */
  set backend(b: BackendChoice) {
    this.prefs.setBackend(b);
  }
  get weights(): WeightsMode {
    return this.prefs.weights;
  }
  /** the bridge sets the weight precision for its next load, like the backend */
  set weights(w: WeightsMode) {
    this.prefs.setWeights(w);
  }
  get results(): Record<string, ResultEntry> {
    return this.resultStore.byOp;
  }
  set results(v: Record<string, ResultEntry>) {
    this.resultStore.replace(v);
  }
  get ops() {
    return this.forms.ops;
  }
  get op() {
    return this.forms.op;
  }
  get busy() {
    return this.jobs.busy;
  }
  get job() {
    return this.jobs.job;
  }
  get jobError(): ErrorInfo | null {
    return this.runs.error;
  }
  set jobError(e: ErrorInfo | null) {
    this.runs.error = e;
  }
  get workerRestarts(): number {
    return this.attach.workerRestarts;
  }
  runOperation(op: string, input: Record<string, unknown>, opts: { scroll?: boolean } = {}): Promise<any> {
    return this.runs.runOperation(op, input, opts);
  }
  execute(
    op: string,
    input: Record<string, unknown>,
    opts: { who: 'page' | 'agent'; signal?: AbortSignal; onProgress?: (p: Progress) => void },
  ): Promise<{ doc: any; ms: number }> {
    return this.runs.execute(op, input, opts);
  }
  choiceOf = choiceOf;
  loadModel(choice: ModelChoice, opts?: { quiet?: boolean }): Promise<boolean> {
    return this.models.load(choice, opts);
  }
  cancelLoad(): void {
    this.models.cancelLoad();
  }
  refreshCache(): Promise<void> {
    return this.models.refreshCache();
  }
  notify(kind: 'info' | 'warn' | 'error', text: string, ms?: number): void {
    this.notices.notify(kind, text, ms);
  }

  async init(): Promise<void> {
    const linkModel = this.share.open();
    void this.loadOps();
    // a reload loses nothing: the newest result of each operation comes back from the session
    await this.history.load();
    for (const [op, e] of Object.entries(this.history.latestByOp()))
      if (!this.resultStore.byOp[op]) this.resultStore.set(e, { restored: true });
    await this.models.refreshCache();
    // a link's model loads by itself only if it is already in this browser's cache; downloading a
    // model because a link said so waits for a click, and meanwhile no other model is loaded (the
    // link does not need one, and a load under way would only be cancelled by that click)
    if (linkModel && linkModel.kind !== 'bundled' && !this.models.isCached(linkModel)) {
      if (this.share.shared) this.share.shared.status = 'waiting-model';
      return;
    }
    await this.models.load(linkModel ?? this.models.startChoice());
  }

  async loadOps(): Promise<void> {
    try {
      this.forms.setOps(await this.client.call((api) => api.listOperations()));
      this.share.fillForm();
    } catch (e) {
      this.forms.opsError = errInfo(e);
    }
  }

  /**
   * Another model is loaded: the head in focus belongs to the old one (its panel closes), and form
   * values naming a layer or head the new model lacks go back to their defaults (they gave
   * BAD_INPUT). Results stay, marked with the model they came from (ResultPanel).
   */
  private modelChanged(m: LoadedModelSummary): void {
    this.links.head = null;
    const cleared = this.forms.fitModel({ layers: m.info.n_layers, heads: m.info.n_heads });
    if (cleared.length)
      this.notices.notify(
        'info',
        `${m.info.id} has ${m.info.n_layers} layers and ${m.info.n_heads} heads: cleared ${cleared.join(', ')}.`,
        8000,
      );
  }

  /**
   * Switch the backend: the model loads again on it. A switch that fails leaves the model where it
   * was (the worker only swaps on success), so the choice goes back too: the dropdown and the
   * backend in use agree, and a notice says why.
   */
  setBackend(b: BackendChoice): void {
    const prev = this.prefs.backend;
    this.prefs.setBackend(b);
    void this.models.reload().then((ok) => {
      const err = this.models.error;
      if (ok || !err || !this.models.model || this.prefs.backend !== b) return;
      this.prefs.setBackend(prev);
      this.notices.notify(
        'warn',
        `Could not switch to ${b}: ${err.message} Still on ${this.models.model.info.backend}.`,
        10000,
      );
    });
  }

  setWeights(w: WeightsMode): void {
    this.prefs.setWeights(w);
    void this.models.reload();
  }

  runAgreement(): Promise<void> {
    if (!this.models.model) return Promise.resolve();
    return this.doctor.runAgreement(this.forms.prompt);
  }

  runQ8Cost(): Promise<void> {
    if (!this.models.model) return Promise.resolve();
    return this.doctor.runQ8Cost(this.forms.prompt);
  }
}
