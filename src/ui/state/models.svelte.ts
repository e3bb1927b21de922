/**
 * The model in the worker: what is loaded, what is loading (per-file progress), what this browser
 * has cached, recently used models and the worker's memory. Loads queue behind running jobs: the
 * worker must not swap a model under one.
 */
import * as Comlink from 'comlink';
import type { WeightsMode } from '../../engine/precision';
import type { FileProgress } from '../../engine/source/types';
import type { ShareModel } from '../../share/codec';
import type { EngineClient, Job } from '../engine/client';
import { prefs, DEFAULT_ENDPOINT, type RecentModel } from './prefs';
import type { ModelChoice } from './model-choice';
import { errInfo, type ErrorInfo } from './errors';
import type {
  BackendChoice,
  CachedModel,
  LoadPreview,
  LoadedModelSummary,
  MemoryInfo,
  ModelRequest,
  StorageInfo,
} from '../../../workers/protocol';

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

interface Deps {
  client: EngineClient;
  exclusive: <T>(fn: () => Promise<T>) => Promise<T>;
  backend: () => BackendChoice;
  weights: () => WeightsMode;
  notify: (kind: 'info' | 'warn' | 'error', text: string, ms?: number) => void;
  /** after a load; `previous` is the model that was loaded before it (null at start) */
  onLoaded: (summary: LoadedModelSummary, previous: LoadedModelSummary | null) => void;
}

export class ModelStore {
  model = $state.raw<LoadedModelSummary | null>(null);
  status = $state<'idle' | 'loading' | 'ready' | 'error'>('idle');
  error = $state<ErrorInfo | null>(null);
  loading = $state.raw<ModelChoice | null>(null);
  /** 'files' while bytes arrive, 'starting' once they are all here and the runtime builds its session */
  phase = $state<'files' | 'starting' | null>(null);
  files = $state<FileRow[]>([]);
  recent = $state.raw<RecentModel[]>(prefs.recent());
  cache = $state.raw<CachedModel[]>([]);
  storage = $state.raw<StorageInfo | null>(null);
  memory = $state.raw<MemoryInfo | null>(null);
  /** the judged plan of the load in progress (before any weight byte); `waiting` while it asks for a click */
  preview = $state.raw<(LoadPreview & { waiting: boolean }) | null>(null);
  private answer: ((ok: boolean) => void) | null = null;
  private loadJob: Job<LoadedModelSummary> | null = null;
  private current: ModelChoice | null = null;

  constructor(private readonly d: Deps) {}

  get ref(): ShareModel | null {
    return this.model ? { ...this.model.ref } : null;
  }

  /** Load a model in the worker (after any running job). Resolves false if it failed or was replaced. */
  async load(choice: ModelChoice, opts: { quiet?: boolean } = {}): Promise<boolean> {
    this.loadJob?.cancel();
    this.loading = choice;
    this.status = 'loading';
    return (this.lastLoad = this.d.exclusive(() => this.doLoad(choice, opts)));
  }

  private lastLoad: Promise<boolean> | null = null;
  /** a new worker, the model loaded there again from the cache (onWorkerRestart): for a lost GPU device JSEP keeps */
  async restartWorker(reason: string): Promise<boolean> {
    this.d.client.restart(reason);
    return (await this.lastLoad) ?? false;
  }

  /** load the current model again (after a backend change or a worker restart); false: it failed or there was none */
  reload(opts: { quiet?: boolean } = {}): Promise<boolean> {
    return this.current ? this.load(this.current, opts) : Promise.resolve(false);
  }

  private async doLoad(choice: ModelChoice, opts: { quiet?: boolean; retried?: boolean }): Promise<boolean> {
    const restarts = this.d.client.restarts;
    this.loading = choice;
    this.status = 'loading';
    this.error = null;
    this.files = [];
    this.phase = 'files';
    this.preview = null;
    const onProgress = (p: FileProgress) => this.onFileProgress(p);
    // A big download waits for a click (answerPreview); anything smaller goes on at once.
    const onPreview = (p: LoadPreview) =>
      new Promise<boolean>((resolve) => {
        this.preview = { ...p, waiting: p.confirm };
        if (!p.confirm) return resolve(true);
        this.answer = (ok) => {
          this.answer = null;
          if (this.preview) this.preview = { ...this.preview, waiting: false };
          resolve(ok);
        };
      });
    const req = { model: this.requestOf(choice), backend: this.d.backend(), weights: this.d.weights() };
    const job = this.d.client.job('load', (id, api) =>
      api.loadModel(id, req, Comlink.proxy(onProgress), Comlink.proxy(onPreview)),
    );
    this.loadJob = job;
    try {
      const summary = await job.promise;
      if (this.loadJob !== job) return false;
      const previous = this.model;
      this.model = summary;
      this.current = choice;
      this.status = 'ready';
      // the recent list reopens the branch a person chose (and its cache), not the commit it resolved to
      const { commit: _commit, ...recentRef } = summary.ref;
      // a folder's Files live as long as the page: nothing to reopen it by later
      if (choice.kind !== 'folder') this.recent = prefs.addRecent(recentRef);
      if (!opts.quiet)
        this.d.notify(
          'info',
          `Loaded ${summary.info.id} on ${summary.info.backend} in ${(summary.loadMs / 1000).toFixed(1)} ` +
            `s${summary.downloadedBytes === 0 && summary.cachedFiles.length ? " (from this browser's cache)" : ''}.`,
          4000,
        );
      void this.refreshMemory();
      void this.refreshCache();
      this.d.onLoaded(summary, previous);
      return true;
    } catch (e) {
      if (this.loadJob !== job) return false;
      const err = errInfo(e);
      // the worker was replaced under this load (a cancelled load that would not stop is killed
      // that way): the load itself did nothing wrong, so it runs once more on the fresh worker
      if (err.code !== 'CANCELLED' && this.d.client.restarts !== restarts && !opts.retried)
        return this.doLoad(choice, { ...opts, retried: true });
      // a failed or cancelled load leaves the previous model in place (the worker only swaps on success)
      this.error = err.code === 'CANCELLED' ? null : err;
      this.status = this.model ? 'ready' : err.code === 'CANCELLED' ? 'idle' : 'error';
      return false;
    } finally {
      if (this.loadJob === job) {
        this.loadJob = null;
        this.loading = null;
        this.phase = null;
      }
    }
  }

  private requestOf(c: ModelChoice): ModelRequest {
    if (c.kind !== 'hub') return c;
    const token = prefs.token(c.endpoint);
    return { ...c, ...(token ? { token } : {}) };
  }

  cancelLoad(): void {
    this.answer?.(false);
    this.loadJob?.cancel();
  }

  /** the person's answer to a preview that waits for a click: download, or stop the load */
  answerPreview(ok: boolean): void {
    this.answer?.(ok);
  }

  private onFileProgress(p: FileProgress): void {
    const now = performance.now();
    const row = this.files.find((r) => r.file === p.file);
    if (!row) {
      this.files.push({
        file: p.file,
        loaded: p.loaded,
        total: p.total,
        cached: !!p.cached,
        done: !!p.done,
        t0: now,
        speed: 0,
      });
    } else {
      row.loaded = p.loaded;
      row.total = p.total;
      row.cached = !!p.cached;
      row.done = !!p.done;
      const dt = (now - row.t0) / 1000;
      row.speed = dt > 0.05 ? p.loaded / dt : 0;
    }
    if (this.files.length && this.files.every((f) => f.done)) this.phase = 'starting';
  }

  async refreshCache(): Promise<void> {
    try {
      const [cache, storage] = await Promise.all([
        this.d.client.call((api) => api.listCache()),
        this.d.client.call((api) => api.storage()),
      ]);
      this.cache = cache;
      this.storage = storage;
    } catch (e) {
      this.d.notify('warn', `Could not read the model cache: ${errInfo(e).message}`);
    }
  }

  async deleteCached(m: CachedModel): Promise<void> {
    try {
      await this.d.client.call((api) => api.deleteCache({ endpoint: m.endpoint, id: m.id, revision: m.revision }));
      this.d.notify('info', `Deleted ${m.id} from this browser's cache.`, 4000);
    } catch (e) {
      this.d.notify('error', errInfo(e).message);
    }
    await this.refreshCache();
  }

  async refreshMemory(): Promise<void> {
    try {
      this.memory = await this.d.client.call((api) => api.memory());
    } catch {
      /* status only */
    }
  }

  /**
   * What a page load opens: the last model loaded in this browser when it is complete in the cache
   * (a reload goes on where it was), else the bundled one.
   */
  startChoice(): ModelChoice {
    const last = this.recent[0];
    if (!last || last.kind !== 'hub') return { kind: 'bundled' };
    const c: ModelChoice = {
      kind: 'hub',
      id: last.id,
      revision: last.revision,
      endpoint: last.endpoint ?? DEFAULT_ENDPOINT,
    };
    return this.isCached(c) ? c : { kind: 'bundled' };
  }

  /** is this model complete in this browser's cache? */
  isCached(c: ModelChoice): boolean {
    return (
      c.kind === 'hub' &&
      this.cache.some((m) => m.id === c.id && m.revision === c.revision && m.endpoint === c.endpoint && m.complete)
    );
  }
}
