/**
 * The page's state, split by concern into stores (forms, models, jobs, results, history, share,
 * links, doctor, prefs, notices) and joined here: this class wires them together and holds the few actions that
 * span several (running an operation, start-up, a worker restart). It survives a worker crash:
 * inputs and results live here, not in the worker. The flat getters are the slice the agent
 * bridge (src/bridge/page-adapter.ts) and the e2e suite read.
 */
import { LoupeError } from '../../engine/errors';
import type { Progress } from '../../ops/types';
import { EngineClient, type EngineEndpoint } from '../engine/client';
import { connectEngineSocket, engineSocket } from '../engine/remote';
import { engineTarget } from '../../share/wire';
import type { WeightsMode } from '../../engine/precision';
import { newInstanceId } from '../../ops/lib/handles';
import { errInfo, type ErrorInfo } from './errors';
import { NoticeStore } from './notices.svelte';
import { PrefStore } from './prefs-store.svelte';
import { FormStore } from './forms.svelte';
import { JobStore } from './jobs.svelte';
import { ResultStore, type ResultEntry } from './results.svelte';
import { ModelStore, choiceOf, sameModel, type ModelChoice } from './models.svelte';
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
  /** the last page run's error (form validation included), shown under the form */
  jobError = $state<ErrorInfo | null>(null);
  workerRestarts = $state(0);
  /** the served engine (`loupe serve`) the page is attached to, or null: the in-page worker */
  engine = $state<string | null>(null);
  /** an attach under way, and why the last one failed */
  attaching = $state(false);
  attachError = $state<ErrorInfo | null>(null);

  constructor(workerFactory: () => EngineEndpoint) {
    this.client = new EngineClient(workerFactory, {
      onStart: (api) => void api.configure({ instanceId: this.instanceId }).catch(() => {}),
      onRestart: (reason, from, standby) => this.onWorkerRestart(reason, from, standby),
      onEngine: (url) => (this.engine = url),
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
        // whether the WebGPU adapter is a software one (slowBackend) is in the Doctor's probe
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
        const doc = await this.runOperation(op, input, { scroll: false });
        return doc === null ? { error: this.jobError ?? { code: 'INTERNAL', message: 'The run failed.' } } : { doc };
      },
    });
    this.doctor = new DoctorStore(this.client, this.jobs, notify);
    this.links = new LinkStore(this.forms, notify, () => this.resultStore.byOp[this.forms.op]?.model ?? null);
    this.resultStore.onNew = (e) => void this.history.record(e);
    this.history.schemaCheck = (items) => this.client.call((api) => api.checkDocuments(items));
    // an error about inputs that have since been edited is stale (a running job's error is not yet shown)
    this.forms.onEdit = () => {
      if (!this.jobs.busy) this.jobError = null;
    };
  }

  // ---------- the slice the agent bridge and the e2e suite read ----------

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

  // ---------- start-up ----------

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

  /** a warning before any run when the backend in use is slow (WebGPU on a software adapter), else null */
  get slowBackend(): string | null {
    if (this.models.model?.info.backend !== 'webgpu' || !this.doctor.info?.gpu.isFallbackAdapter) return null;
    return (
      'WebGPU here is a software adapter (no GPU): operations run far slower than on WASM (patch took 55 s ' +
      'against 1.05 s in one measurement). Choose WASM unless you are testing WebGPU itself.'
    );
  }

  setWeights(w: WeightsMode): void {
    this.prefs.setWeights(w);
    void this.models.reload();
  }

  /**
   * Attach to a served engine (`loupe serve`): `pasted` is its pairing line (URL#token=…) or URL,
   * `token` the token when the line has none. The model loaded now loads there (cached there);
   * inputs and results stay. False (and attachError) when no engine answered.
   */
  async attachEngine(pasted: string, token = ''): Promise<boolean> {
    this.attachError = null;
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
      if (!this.client.attached) this.beforeAttach = this.models.model;
      await this.jobs.exclusive(async () => {
        this.client.switchTo({ endpoint, attached: { url: t.url, reconnect } }, { standby });
      });
      this.notices.notify('info', `Attached to the Loupe engine at ${t.url}.`, 5000);
      await this.onEngineSwitched();
      return true;
    } catch (e) {
      this.attachError = errInfo(e);
      return false;
    } finally {
      this.attaching = false;
    }
  }

  /** another connection's load replaced this page's model on the served engine: the panel stops naming it */
  private heedNotices<E extends EventTarget>(ep: E): E {
    ep.addEventListener('notice', (ev) => {
      const n = (ev as Event & { detail: { type: string; model?: string } }).detail;
      if (n.type !== 'model_replaced' || !this.models.model) return;
      const mine = this.models.model.info.id;
      this.models.model = null;
      this.models.status = 'idle';
      this.notices.notify(
        'warn',
        `Another page loaded ${n.model} on the engine at ${this.client.attached}, replacing ${mine}. Load a model again to run.`,
        0,
      );
    });
    return ep;
  }

  /** Back to the in-page engine, without a reload: the model loads here again. */
  async detachEngine(): Promise<void> {
    if (!this.client.attached) return;
    const url = this.client.attached;
    await this.jobs.exclusive(async () => this.client.switchTo(null));
    this.notices.notify('info', `Detached from ${url}: back on the in-page engine.`, 5000);
    await this.onEngineSwitched();
  }

  private async onEngineSwitched(): Promise<void> {
    this.jobs.reset();
    // the new engine holds no model yet: the page must not claim the old engine's until it loads there
    this.models.model = null;
    void this.loadOps();
    void this.refreshCache();
    if (!(await this.models.reload({ quiet: true })) && !this.models.model)
      await this.models.load(this.models.startChoice(), { quiet: true });
    if (this.doctor.info) void this.doctor.run();
  }

  /** the in-page model when the page attached (its standby worker still holds it) */
  private beforeAttach: LoadedModelSummary | null = null;

  private onWorkerRestart(reason: string, from?: string, standby = false): void {
    this.workerRestarts++;
    this.jobs.reset();
    this.notices.notify(
      'warn',
      from
        ? `${reason[0].toUpperCase()}${reason.slice(1)}. The page is back on its own engine; your inputs and results are kept.`
        : `${reason[0].toUpperCase()}${reason.slice(1)}. Restarted it; your inputs and results are kept.`,
      12000,
    );
    if (from) {
      // the served engine's model went with it; a standby worker still holds the page's own
      this.models.model = standby ? this.beforeAttach : null;
      if (this.models.model) this.models.status = 'ready';
      if (this.doctor.info) void this.doctor.run();
    }
    void this.loadOps();
    // a load under way when the worker went retries by itself (ModelStore.load)
    if (!this.models.loading && !(standby && this.models.model)) void this.models.reload({ quiet: true });
  }

  // ---------- operations ----------

  async runCurrent(): Promise<void> {
    const op = this.forms.op;
    const { input, errors } = this.forms.inputFor(op);
    this.forms.errors = errors;
    if (Object.keys(errors).length) {
      this.jobError = {
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

  /** Run from the page: errors land in jobError, the result in `results`; returns the document or null. */
  async runOperation(op: string, input: Record<string, unknown>, opts: { scroll?: boolean } = {}): Promise<any> {
    this.jobError = null;
    try {
      const { doc, ms } = await this.execute(op, input, { who: 'page' });
      this.resultStore.set({ op, input, doc, model: this.models.ref, ms, fromLink: false });
      if (op === this.forms.op && opts.scroll !== false) this.resultStore.seq++;
      // an SAE download lands in the same IndexedDB cache as the models: list it there
      if (typeof input.sae_source === 'string') void this.models.refreshCache();
      if (doc && typeof doc === 'object') this.forms.fillFrom(op, doc);
      return doc;
    } catch (e) {
      const err = errInfo(e);
      this.jobError =
        err.code === 'CANCELLED' ? { code: 'CANCELLED', message: `${this.forms.title(op)} was cancelled.` } : err;
      return null;
    }
  }

  /** Run an operation in the worker, shown in the job bar (with Cancel). Throws LoupeErrors. */
  async execute(
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
    this.resultStore.set(e, { restored: true });
    this.forms.select(e.op);
    this.forms.fillFromInput(e.op, e.input);
    if (typeof e.input.prompt === 'string') this.forms.prompt = e.input.prompt;
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
