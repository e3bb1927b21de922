/**
 * The page's state and actions, in one place so every panel reads the same truth. It survives a
 * worker crash: inputs and results live here, not in the worker.
 */
import * as Comlink from 'comlink';
import { LoupeError, toLoupeError, type ErrorDocument } from '../../engine/errors';
import type { FileProgress } from '../../engine/source/types';
import type { Progress } from '../../ops/types';
import { EngineClient, type Job } from '../engine/client';
import { prefs, DEFAULT_ENDPOINT, type Theme, type RecentModel } from './prefs';
import { fieldsOf, buildInput, rawFromInput, type Field } from '../forms/schema-form';
import { decodeShare, parseFragment, shareUrl, type ShareState, type ShareModel } from '../../share/codec';
import { compareDocuments, type CompareResult } from '../../share/compare';
import { newInstanceId } from '../../bridge/handles';
import type {
  AgreementResult, BackendChoice, CachedModel, DoctorInfo, LoadedModelSummary, MemoryInfo, ModelRequest,
  OperationInfo, StorageInfo,
} from '../../../workers/protocol';

export type ErrorInfo = ErrorDocument['error'];

/** what the page can ask to load (a token is added from prefs for Hub models, never stored here) */
export type ModelChoice = { kind: 'bundled' } | { kind: 'hub'; id: string; revision: string; endpoint: string } | { kind: 'url'; id: string };

export interface FileRow {
  file: string;
  loaded: number;
  total: number | null;
  cached: boolean;
  done: boolean;
  t0: number;
  /** bytes per second over this file's transfer so far */
  speed: number;
}

export interface JobState {
  id: string;
  kind: 'operation' | 'agreement';
  op: string;
  stage: string;
  done: number;
  total: number;
  startedAt: number;
}

export interface ResultEntry {
  op: string;
  input: Record<string, unknown>;
  doc: any;
  model: ShareModel | null;
  ms: number | null;
  /** shown from a share link, not (yet) computed here */
  fromLink: boolean;
}

export interface SharedLink {
  state: ShareState;
  status: 'waiting-model' | 'waiting-sae' | 'running' | 'matched' | 'differs' | 'rerun' | 'failed';
  compare?: CompareResult;
  error?: ErrorInfo;
}

export const OP_ORDER = ['trace', 'activations', 'attention', 'logit_lens', 'ablate', 'circuit', 'layer_ablation', 'patch', 'steer', 'sweep', 'causality', 'capture', 'probe', 'generate', 'sae_features', 'feature', 'sae_steer'];

export const OP_TITLES: Record<string, string> = {
  trace: 'Trace', activations: 'Activations', attention: 'Attention', logit_lens: 'Logit lens', ablate: 'Ablate',
  circuit: 'Circuit', layer_ablation: 'Layer ablation', patch: 'Patch', steer: 'Steer', sweep: 'α-sweep',
  causality: 'Causality', capture: 'Capture', probe: 'Probe', generate: 'Generate',
  sae_features: 'SAE features', feature: 'Feature card', sae_steer: 'SAE steer',
};

/** a tab title for any operation, including ones added after this page was written */
export function opTitle(op: string): string {
  return OP_TITLES[op] ?? op.replace(/_/g, ' ').replace(/^\w/, (c) => c.toUpperCase());
}

export function sameModel(a: ShareModel | null | undefined, b: ShareModel | null | undefined): boolean {
  if (!a || !b) return false;
  return a.kind === b.kind && a.id === b.id && (a.kind === 'bundled' || a.revision === b.revision) && (a.endpoint ?? '') === (b.endpoint ?? '');
}

function errInfo(e: unknown): ErrorInfo {
  return toLoupeError(e).toJSON().error;
}

export class AppState {
  theme = $state<Theme>(prefs.theme());
  backend = $state<BackendChoice>(prefs.backend());
  prompt = $state('Once upon a time, there was a little');
  op = $state('trace');
  params = $state<Record<string, Record<string, unknown>>>({});
  formErrors = $state<Record<string, string>>({});
  ops = $state.raw<OperationInfo[]>([]);
  opsError = $state<ErrorInfo | null>(null);

  model = $state.raw<LoadedModelSummary | null>(null);
  modelStatus = $state<'idle' | 'loading' | 'ready' | 'error'>('idle');
  modelError = $state<ErrorInfo | null>(null);
  loading = $state.raw<ModelChoice | null>(null);
  loadFiles = $state<FileRow[]>([]);
  private loadJob: Job<LoadedModelSummary> | null = null;
  private currentChoice: ModelChoice | null = null;

  job = $state<JobState | null>(null);
  private opJob: Job<unknown> | null = null;
  jobError = $state<ErrorInfo | null>(null);
  results = $state.raw<Record<string, ResultEntry>>({});
  /** bumped when a run from this page produces a result (the result panel scrolls to it) */
  resultSeq = $state(0);

  shared = $state<SharedLink | null>(null);
  lastLink = $state<{ url: string; embedded: boolean; op: string } | null>(null);

  recent = $state.raw<RecentModel[]>(prefs.recent());
  cache = $state.raw<CachedModel[]>([]);
  storage = $state.raw<StorageInfo | null>(null);
  memory = $state.raw<MemoryInfo | null>(null);
  doctor = $state.raw<DoctorInfo | null>(null);
  agreement = $state.raw<AgreementResult | null>(null);
  agreementError = $state<ErrorInfo | null>(null);

  notices = $state<{ id: number; kind: 'info' | 'warn' | 'error'; text: string }[]>([]);
  workerRestarts = $state(0);
  /** this page load's id: handles minted in the worker carry it (the agent bridge checks them) */
  readonly instanceId = newInstanceId();
  client: EngineClient;

  constructor(workerFactory: () => Worker) {
    const last = prefs.lastInputs();
    if (last.prompt) this.prompt = last.prompt;
    if (last.op) this.op = last.op;
    if (last.params) this.params = last.params;
    this.client = new EngineClient(workerFactory, {
      onStart: (api) => void api.configure({ instanceId: this.instanceId }).catch(() => {}),
      onRestart: (reason) => this.onWorkerRestart(reason),
    });
  }

  // ---------- derived helpers ----------

  get opInfo(): OperationInfo | undefined {
    return this.ops.find((o) => o.name === this.op);
  }

  fieldsFor(op: string): Field[] {
    const info = this.ops.find((o) => o.name === op);
    return info ? fieldsOf(info.inputSchema) : [];
  }

  get modelRef(): ShareModel | null {
    return this.model ? { ...this.model.ref } : null;
  }

  get busy(): boolean {
    return this.job !== null;
  }

  notify(kind: 'info' | 'warn' | 'error', text: string, ms = 8000): void {
    const id = Date.now() + Math.random();
    this.notices.push({ id, kind, text });
    if (ms > 0) setTimeout(() => { this.notices = this.notices.filter((n) => n.id !== id); }, ms);
  }

  saveInputs(): void {
    prefs.setLastInputs({ prompt: this.prompt, op: this.op, params: $state.snapshot(this.params) });
  }

  setTheme(t: Theme): void {
    this.theme = t;
    prefs.setTheme(t);
  }

  // ---------- start-up ----------

  async init(): Promise<void> {
    const frag = parseFragment(location.hash);
    const s = frag.get('s');
    let linkModel: ModelChoice | null = null;
    if (s) {
      try {
        const state = decodeShare(s);
        this.applyShare(state);
        linkModel = this.choiceOf(state.model);
      } catch (e) {
        this.notify('error', errInfo(e).message, 0);
      }
    }
    void this.loadOps();
    void this.refreshCache();
    if (linkModel && linkModel.kind !== 'bundled') {
      // a link's model loads by itself only if it is already in this browser's cache;
      // downloading a model because a link said so waits for a click
      await this.refreshCache();
      const cached = this.cache.some((c) => linkModel.kind === 'hub' && c.id === linkModel.id && c.revision === linkModel.revision && c.endpoint === linkModel.endpoint && c.complete);
      if (!cached) {
        if (this.shared) this.shared.status = 'waiting-model';
        await this.loadModel({ kind: 'bundled' }, { quiet: true });
        return;
      }
    }
    await this.loadModel(linkModel ?? { kind: 'bundled' });
  }

  async loadOps(): Promise<void> {
    try {
      const ops = await this.client.call((api) => api.listOperations());
      this.ops = [...ops].sort((a, b) => (OP_ORDER.indexOf(a.name) + 1 || 99) - (OP_ORDER.indexOf(b.name) + 1 || 99));
      if (!this.ops.some((o) => o.name === this.op) && this.ops.length) this.op = this.ops[0].name;
      this.opsError = null;
      if (this.shared) this.fillFormFromShare(this.shared.state);
    } catch (e) {
      this.opsError = errInfo(e);
    }
  }

  // ---------- models ----------

  choiceOf(m: ShareModel): ModelChoice {
    if (m.kind === 'bundled') return { kind: 'bundled' };
    if (m.kind === 'url') return { kind: 'url', id: m.id };
    return { kind: 'hub', id: m.id, revision: m.revision || 'main', endpoint: m.endpoint ?? DEFAULT_ENDPOINT };
  }

  private requestOf(c: ModelChoice): ModelRequest {
    if (c.kind !== 'hub') return c;
    const token = prefs.token(c.endpoint);
    return { ...c, ...(token ? { token } : {}) };
  }

  /** Load a model in the worker (after any running job: the worker must not swap a model under it). */
  async loadModel(choice: ModelChoice, opts: { quiet?: boolean } = {}): Promise<boolean> {
    this.loadJob?.cancel();
    this.loading = choice;
    this.modelStatus = 'loading';
    return this.exclusive(() => this.doLoad(choice, opts));
  }

  private async doLoad(choice: ModelChoice, opts: { quiet?: boolean }): Promise<boolean> {
    this.loading = choice;
    this.modelStatus = 'loading';
    this.modelError = null;
    this.loadFiles = [];
    const onProgress = (p: FileProgress) => this.onFileProgress(p);
    const req = { model: this.requestOf(choice), backend: this.backend };
    const job = this.client.job('load', (id, api) => api.loadModel(id, req, Comlink.proxy(onProgress)));
    this.loadJob = job;
    try {
      const summary = await job.promise;
      if (this.loadJob !== job) return false;
      this.model = summary;
      this.currentChoice = choice;
      this.modelStatus = 'ready';
      this.recent = prefs.addRecent(summary.ref);
      if (!opts.quiet) this.notify('info', `Loaded ${summary.info.id} on ${summary.info.backend} in ${(summary.loadMs / 1000).toFixed(1)} s${summary.downloadedBytes === 0 && summary.cachedFiles.length ? ' (from this browser\'s cache)' : ''}.`, 4000);
      void this.refreshMemory();
      void this.refreshCache();
      this.afterModelLoaded();
      return true;
    } catch (e) {
      if (this.loadJob !== job) return false;
      const err = errInfo(e);
      // a failed or cancelled load leaves the previous model in place (the worker only swaps on success)
      this.modelError = err.code === 'CANCELLED' ? null : err;
      this.modelStatus = this.model ? 'ready' : err.code === 'CANCELLED' ? 'idle' : 'error';
      return false;
    } finally {
      if (this.loadJob === job) {
        this.loadJob = null;
        this.loading = null;
      }
    }
  }

  cancelLoad(): void {
    this.loadJob?.cancel();
  }

  private onFileProgress(p: FileProgress): void {
    const now = performance.now();
    const row = this.loadFiles.find((r) => r.file === p.file);
    if (!row) {
      this.loadFiles.push({ file: p.file, loaded: p.loaded, total: p.total, cached: !!p.cached, done: !!p.done, t0: now, speed: 0 });
      return;
    }
    row.loaded = p.loaded;
    row.total = p.total;
    row.cached = !!p.cached;
    row.done = !!p.done;
    const dt = (now - row.t0) / 1000;
    row.speed = dt > 0.05 ? p.loaded / dt : 0;
  }

  setBackend(b: BackendChoice): void {
    this.backend = b;
    prefs.setBackend(b);
    if (this.currentChoice) void this.loadModel(this.currentChoice);
  }

  async refreshCache(): Promise<void> {
    try {
      const [cache, storage] = await Promise.all([
        this.client.call((api) => api.listCache()),
        this.client.call((api) => api.storage()),
      ]);
      this.cache = cache;
      this.storage = storage;
    } catch (e) {
      this.notify('warn', `Could not read the model cache: ${errInfo(e).message}`);
    }
  }

  async deleteCached(m: CachedModel): Promise<void> {
    try {
      await this.client.call((api) => api.deleteCache({ endpoint: m.endpoint, id: m.id, revision: m.revision }));
      this.notify('info', `Deleted ${m.id} from this browser's cache.`, 4000);
    } catch (e) {
      this.notify('error', errInfo(e).message);
    }
    await this.refreshCache();
  }

  async refreshMemory(): Promise<void> {
    try {
      this.memory = await this.client.call((api) => api.memory());
    } catch { /* status only */ }
  }

  private onWorkerRestart(reason: string): void {
    this.workerRestarts++;
    this.job = null;
    this.opJob = null;
    this.notify('warn', `${reason[0].toUpperCase()}${reason.slice(1)}. Restarted it; your inputs and results are kept.`, 12000);
    void this.loadOps();
    const choice = this.currentChoice;
    if (choice) void this.loadModel(choice, { quiet: true });
  }

  // ---------- operations ----------

  /** Build the input for an operation from its form and the prompt box. */
  inputFor(op: string): { input: Record<string, unknown>; errors: Record<string, string> } {
    return buildInput(this.fieldsFor(op), $state.snapshot(this.params[op] ?? {}), this.prompt);
  }

  setParam(op: string, name: string, value: unknown): void {
    this.params[op] ??= {};
    this.params[op][name] = value;
    this.saveInputs();
  }

  async runCurrent(): Promise<void> {
    const { input, errors } = this.inputFor(this.op);
    this.formErrors = errors;
    if (Object.keys(errors).length) {
      this.jobError = { code: 'BAD_INPUT', message: `Check the parameters: ${Object.entries(errors).map(([k, v]) => `${k} ${v}`).join('; ')}.` };
      return;
    }
    this.saveInputs();
    await this.runOperation(this.op, input);
  }

  /** Run from the page: errors land in jobError, the result in `results`; returns the document or null. */
  async runOperation(op: string, input: Record<string, unknown>, opts: { scroll?: boolean } = {}): Promise<any> {
    this.jobError = null;
    try {
      const { doc, ms } = await this.execute(op, input, { who: 'page' });
      this.results = { ...this.results, [op]: { op, input, doc, model: this.modelRef, ms, fromLink: false } };
      if (op === this.op && opts.scroll !== false) this.resultSeq++;
      // an SAE download lands in the same IndexedDB cache as the models: list it there
      if (typeof input.sae_source === 'string') void this.refreshCache();
      // a capture's handle is what the probe needs next
      if (op === 'capture' && typeof (doc as { handle?: unknown }).handle === 'string') {
        this.params.probe = { ...(this.params.probe ?? {}), capture: (doc as { handle: string }).handle };
      }
      return doc;
    } catch (e) {
      const err = errInfo(e);
      this.jobError = err.code === 'CANCELLED' ? { code: 'CANCELLED', message: `${OP_TITLES[op] ?? op} was cancelled.` } : err;
      return null;
    }
  }

  private lock: Promise<void> = Promise.resolve();

  /** One job at a time in the worker (the page's own runs, share re-runs and agent calls queue up). */
  private async exclusive<T>(fn: () => Promise<T>): Promise<T> {
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
   * Run an operation in the worker, showing it in the job bar (with Cancel). Throws LoupeErrors.
   * `signal` (an agent's cancellation) cancels it like the Cancel button.
   */
  async execute(op: string, input: Record<string, unknown>, opts: { who: 'page' | 'agent'; signal?: AbortSignal; onProgress?: (p: Progress) => void }): Promise<{ doc: any; ms: number }> {
    return this.exclusive(async () => {
      if (!this.model) throw new LoupeError('NO_MODEL', 'No model is loaded yet.', 'Wait for the model to load, or pick one in the Model panel.');
      if (opts.signal?.aborted) throw new LoupeError('CANCELLED', 'Cancelled.');
      const onProgress = (p: Progress) => {
        if (this.job && this.job.id === job.id) { this.job.stage = p.stage; this.job.done = p.done; this.job.total = p.total; }
        opts.onProgress?.(p);
      };
      const t0 = performance.now();
      // inputs may come from reactive state (a share link, the form): send plain data to the worker
      const plain = $state.snapshot(input) as Record<string, unknown>;
      const job = this.client.job(op, (id, api) => api.runOperation(id, op, plain, Comlink.proxy(onProgress)));
      const onAbort = () => job.cancel();
      opts.signal?.addEventListener('abort', onAbort, { once: true });
      this.opJob = job;
      this.job = { id: job.id, kind: 'operation', op: opts.who === 'agent' ? `${op} (agent)` : op, stage: 'starting', done: 0, total: 0, startedAt: Date.now() };
      try {
        const doc = await job.promise;
        void this.refreshMemory();
        return { doc, ms: performance.now() - t0 };
      } finally {
        opts.signal?.removeEventListener('abort', onAbort);
        if (this.opJob === job) { this.opJob = null; this.job = null; }
      }
    });
  }

  cancelJob(): void {
    this.opJob?.cancel();
  }

  // ---------- share links ----------

  makeLink(op: string): { url: string; embedded: boolean } | null {
    const r = this.results[op];
    if (!r || !r.model) return null;
    const link = shareUrl(location.href, { v: 1, model: r.model, op, input: r.input, result: r.doc });
    this.lastLink = { ...link, op };
    return link;
  }

  async copyLink(op: string): Promise<void> {
    const link = this.makeLink(op);
    if (!link) return;
    try {
      await navigator.clipboard.writeText(link.url);
      this.notify('info', `Link copied${link.embedded ? ' (with the result embedded)' : ' (the result is too large to embed; the link re-runs it)'}.`, 4000);
    } catch {
      this.notify('info', 'The clipboard is not available here: copy the link from the box below the result.', 6000);
    }
  }

  private applyShare(state: ShareState): void {
    this.shared = { state, status: 'running' };
    this.op = state.op;
    if (typeof state.input.prompt === 'string') this.prompt = state.input.prompt;
    if (state.result !== undefined) {
      this.results = { ...this.results, [state.op]: { op: state.op, input: state.input, doc: state.result, model: state.model, ms: null, fromLink: true } };
    }
  }

  private fillFormFromShare(state: ShareState): void {
    const fields = this.fieldsFor(state.op);
    if (fields.length) this.params[state.op] = rawFromInput(fields, state.input);
  }

  /** Load the link's model (after a click when it was not cached) and re-run. */
  async loadSharedModel(): Promise<void> {
    if (!this.shared) return;
    this.shared.status = 'running';
    const ok = await this.loadModel(this.choiceOf(this.shared.state.model));
    if (!ok && this.shared) {
      this.shared.status = 'failed';
      this.shared.error = this.modelError ?? { code: 'CANCELLED', message: 'The model did not load.' };
    }
  }

  private afterModelLoaded(): void {
    const sh = this.shared;
    if (!sh || !['running', 'waiting-model'].includes(sh.status)) return;
    if (!sameModel(this.modelRef, sh.state.model)) return;
    void this.rerunShared();
  }

  /** the SAE a shared operation reads, if any */
  sharedSae(): { source: string; path: string } | null {
    const inp = this.shared?.state.input;
    return inp && typeof inp.sae_source === 'string' ? { source: inp.sae_source, path: typeof inp.sae_path === 'string' ? inp.sae_path : '' } : null;
  }

  /** After a click: download the link's SAE and re-run. */
  async confirmSharedSae(): Promise<void> {
    await this.rerunShared({ saeConfirmed: true });
  }

  private async rerunShared(opts: { saeConfirmed?: boolean } = {}): Promise<void> {
    const sh = this.shared;
    if (!sh) return;
    // as with models, a link downloads an SAE only after a click, unless this browser has it already
    const sae = this.sharedSae();
    if (sae && !opts.saeConfirmed) {
      let needs = true;
      try { needs = await this.client.call((api) => api.saeNeedsDownload(sae)); } catch { /* ask */ }
      if (!this.shared) return;
      if (needs) { this.shared.status = 'waiting-sae'; return; }
    }
    sh.status = 'running';
    const embedded = sh.state.result;
    // no scrolling: the banner saying whether the re-run matched stays in view
    const doc = await this.runOperation(sh.state.op, sh.state.input, { scroll: false });
    if (!this.shared) return;
    if (doc === null) {
      this.shared.status = 'failed';
      this.shared.error = this.jobError ?? undefined;
      return;
    }
    if (embedded === undefined) {
      this.shared.status = 'rerun';
      return;
    }
    const cmp = compareDocuments(embedded, doc, 1e-4);
    this.shared.compare = cmp;
    this.shared.status = cmp.match ? 'matched' : 'differs';
  }

  dismissShared(): void {
    this.shared = null;
    history.replaceState(null, '', location.pathname + location.search);
  }

  // ---------- doctor ----------

  async runDoctor(): Promise<void> {
    try {
      this.doctor = await this.client.call((api) => api.doctor());
    } catch (e) {
      this.notify('error', errInfo(e).message);
    }
  }

  async runAgreement(): Promise<void> {
    if (this.job || !this.model) return;
    await this.exclusive(() => this.doAgreement());
  }

  private async doAgreement(): Promise<void> {
    if (!this.model) return;
    this.agreementError = null;
    this.agreement = null;
    const onProgress = (p: Progress) => { if (this.job) { this.job.stage = p.stage; this.job.done = p.done; this.job.total = p.total; } };
    const prompt = this.prompt;
    const job = this.client.job('agree', (id, api) => api.agreement(id, prompt, Comlink.proxy(onProgress)));
    this.opJob = job as Job<unknown>;
    this.job = { id: job.id, kind: 'agreement', op: 'agreement check', stage: 'starting', done: 0, total: 3, startedAt: Date.now() };
    try {
      this.agreement = await job.promise;
    } catch (e) {
      this.agreementError = errInfo(e);
    } finally {
      if (this.opJob === (job as Job<unknown>)) { this.opJob = null; this.job = null; }
    }
  }
}
