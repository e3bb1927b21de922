/**
 * Share links: making one from a result, and opening one — show the link's result at once, load
 * its model (only after a click unless this browser has it), re-run and compare.
 */
import { decodeShare, parseFragment, shareUrl, type ShareState, type ShareView } from '../../share/codec';
import { compareDocuments, type CompareResult } from '../../share/compare';
import type { ModelStore } from './models.svelte';
import { choiceOf, sameModel, type ModelChoice } from './model-choice';
import type { ResultEntry, ResultStore } from './results.svelte';
import type { FormStore } from './forms.svelte';
import type { EngineClient } from '../engine/client';
import { errInfo, type ErrorInfo } from './errors';
import { checkDocument } from '../../share/document-check';

export interface SharedLink {
  state: ShareState;
  status: 'waiting-model' | 'waiting-sae' | 'running' | 'matched' | 'differs' | 'rerun' | 'failed';
  compare?: CompareResult;
  error?: ErrorInfo;
}

interface Deps {
  client: EngineClient;
  models: ModelStore;
  results: ResultStore;
  forms: FormStore;
  notify: (kind: 'info' | 'warn' | 'error', text: string, ms?: number) => void;
  /** run an operation as the page does; resolves the document, or null with the error */
  run: (op: string, input: Record<string, unknown>) => Promise<{ doc: any } | { error: ErrorInfo }>;
}

export class ShareStore {
  shared = $state<SharedLink | null>(null);
  /** the last link made, with the result it was made from: a card shows it only for that result */
  lastLink = $state.raw<{ url: string; embedded: boolean; of: ResultEntry } | null>(null);

  /** what a view marked on a result (pins, supernodes), by its document: it goes into that result's link */
  private views = new WeakMap<object, ShareView>();

  constructor(private readonly d: Deps) {}

  setView(doc: object, view: ShareView): void {
    this.views.set(doc, view);
  }

  /** the marks to start a result's view with: its own, else those of the link it came from */
  viewFor(op: string, doc: object): ShareView | undefined {
    return this.views.get(doc) ?? (this.shared?.state.op === op ? this.shared.state.view : undefined);
  }

  /** Read a link in the page's URL: show its result, fill its form; returns the model it needs (null: none). */
  open(): ModelChoice | null {
    const s = parseFragment(location.hash).get('s');
    if (!s) return null;
    try {
      const state = decodeShare(s);
      // the embedded result is checked before anything sees it: Loupe's limits here, its schema in the worker
      const result = state.result;
      delete state.result;
      this.shared = { state, status: 'running' };
      this.d.forms.op = state.op;
      if (typeof state.input.prompt === 'string') this.d.forms.prompt = state.input.prompt;
      if (result !== undefined) void this.showResult(state.op, result);
      return choiceOf(state.model);
    } catch (e) {
      this.d.notify('error', errInfo(e).message, 0);
      return null;
    }
  }

  /** show a link's embedded result once it passed every check; a refused one is never shown (the link re-runs) */
  private async showResult(op: string, doc: unknown): Promise<void> {
    const what = "The link's result";
    let err: ErrorInfo | null = null;
    try {
      checkDocument(op, doc, what);
      [err] = await this.d.client.call((api) => api.checkDocuments([{ op, doc, what }]));
    } catch (e) {
      err = errInfo(e);
    }
    const sh = this.shared;
    if (!sh || sh.state.op !== op) return;
    if (err) {
      sh.state.result_omitted = true;
      this.d.notify('error', `${err.message} It is not shown; the link's inputs can still be re-run.`, 0);
      return;
    }
    sh.state.result = doc;
    this.d.results.set({ op, input: sh.state.input, doc, model: sh.state.model, ms: null, fromLink: true });
  }

  /** the operations are known: put the link's input in its form */
  fillForm(): void {
    if (this.shared) this.d.forms.fillFromInput(this.shared.state.op, this.shared.state.input);
  }

  make(op: string): { url: string; embedded: boolean } | null {
    const r = this.d.results.byOp[op];
    if (!r || !r.model) return null;
    const view = r.doc && typeof r.doc === 'object' ? this.views.get(r.doc) : undefined;
    const link = shareUrl(location.href, {
      v: 1,
      model: r.model,
      op,
      input: r.input,
      result: r.doc,
      ...(view ? { view } : {}),
    });
    this.lastLink = { ...link, of: r };
    return link;
  }

  async copy(op: string): Promise<void> {
    const link = this.make(op);
    if (!link) return;
    try {
      await navigator.clipboard.writeText(link.url);
      this.d.notify(
        'info',
        `Link copied${link.embedded ? ' (with the result embedded)' : ' (the result is too large to embed; the link re-runs it)'}.`,
        4000,
      );
    } catch {
      this.d.notify('info', 'The clipboard is not available here: copy the link from the box below the result.', 6000);
    }
  }

  /** Load the link's model (after a click when it was not cached) and re-run; also the retry after a failure. */
  async loadModel(): Promise<void> {
    const sh = this.shared;
    if (!sh) return;
    if (sameModel(this.d.models.ref, sh.state.model)) {
      await this.rerun();
      return;
    }
    sh.status = 'running';
    sh.error = undefined;
    const ok = await this.d.models.load(choiceOf(sh.state.model));
    if (!ok && this.shared && this.shared.status === 'running') {
      this.shared.status = 'failed';
      this.shared.error = this.d.models.error ?? { code: 'CANCELLED', message: 'The model did not load.' };
    }
  }

  /** a model finished loading: if it is the link's, re-run */
  modelLoaded(): void {
    const sh = this.shared;
    if (!sh || !['running', 'waiting-model'].includes(sh.status)) return;
    if (!sameModel(this.d.models.ref, sh.state.model)) return;
    void this.rerun();
  }

  /** the SAE a shared operation reads, if any */
  sae(): { source: string; path: string } | null {
    const inp = this.shared?.state.input;
    return inp && typeof inp.sae_source === 'string'
      ? { source: inp.sae_source, path: typeof inp.sae_path === 'string' ? inp.sae_path : '' }
      : null;
  }

  /** After a click: download the link's SAE and re-run. */
  async confirmSae(): Promise<void> {
    await this.rerun({ saeConfirmed: true });
  }

  private async rerun(opts: { saeConfirmed?: boolean } = {}): Promise<void> {
    const sh = this.shared;
    if (!sh) return;
    // as with models, a link downloads an SAE only after a click, unless this browser has it already
    const sae = this.sae();
    if (sae && !opts.saeConfirmed) {
      let needs = true;
      try {
        needs = await this.d.client.call((api) => api.saeNeedsDownload(sae));
      } catch {
        /* ask */
      }
      if (!this.shared) return;
      if (needs) {
        this.shared.status = 'waiting-sae';
        return;
      }
    }
    sh.status = 'running';
    sh.error = undefined;
    const embedded = sh.state.result;
    const r = await this.d.run(sh.state.op, sh.state.input);
    if (!this.shared) return;
    if ('error' in r) {
      this.shared.status = 'failed';
      this.shared.error = r.error;
      return;
    }
    if (embedded === undefined) {
      this.shared.status = 'rerun';
      return;
    }
    const cmp = compareDocuments(embedded, r.doc, 1e-4);
    this.shared.compare = cmp;
    this.shared.status = cmp.match ? 'matched' : 'differs';
  }

  dismiss(): void {
    this.shared = null;
    history.replaceState(null, '', location.pathname + location.search);
  }
}
