/**
 * `loupe mcp --engine URL`: the MCP tools run on a served engine (`loupe serve`, e.g. a GPU box
 * through ssh -L) over the engine's worker protocol, as the page attached to it runs them. The
 * model is loaded there on first use (--model, else the bundled one), and cached there.
 *
 * A call past its deadline, or cancelled by the client, is answered at once and cancelled on the
 * engine. A connection that ends fails every pending call with ENGINE_GONE; the next call
 * connects again (and loads the model again if the engine lost it).
 */
import * as Comlink from 'comlink';
import { LoupeError, toLoupeError } from '../engine/errors';
import { parseInput } from '../ops/types';
import type { Progress } from '../ops/types';
import { assertHandlesCurrent, newInstanceId } from '../ops/lib/handles';
import type { CallOptions, ExecResult, Executor } from '../bridge/executor';
import { callCancelled, deadlineExceeded } from '../bridge/call-errors';
import { loadModelInput } from '../bridge/tools';
import type { AgentInfo } from '../bridge/protocol';
import type { BackendChoice, LoadedModelSummary } from '../../workers/protocol';
import { connectEngine, type EngineConnection } from './client';

export interface RemoteExecutorOptions {
  url: string;
  token: string;
  /** loaded on first use when the engine has no model (default 'default') */
  model?: string;
  log?: (msg: string) => void;
}

let seq = 0;
const jobId = () => `mcp-${Date.now().toString(36)}-${(++seq).toString(36)}`;

export class RemoteExecutor implements Executor {
  readonly mode = 'headless' as const;
  private readonly instance = newInstanceId();
  private conn?: Promise<EngineConnection>;
  private loaded: LoadedModelSummary | null = null;
  /** the id of a model the engine held when this connected (the page's, loaded there): used as it is */
  private engineModel: string | null = null;
  private gone = new Set<(e: LoupeError) => void>();

  constructor(private o: RemoteExecutorOptions) {}

  setAgent(_agent: AgentInfo): void {}

  async currentInstance(): Promise<string | undefined> {
    return this.instance;
  }

  async status(): Promise<Record<string, unknown>> {
    return {
      instance_id: this.instance,
      engine: this.o.url,
      backend: this.loaded?.info.backend ?? null,
      model: this.loaded ? { ...this.loaded.info } : this.engineModel,
      ...(this.loaded || this.engineModel ? {} : { model_on_first_use: this.o.model ?? 'default' }),
    };
  }

  async close(): Promise<void> {
    const c = this.conn;
    this.conn = undefined;
    (await c?.catch(() => undefined))?.close();
  }

  async execute(tool: string, args: Record<string, unknown>, o: CallOptions): Promise<ExecResult> {
    assertHandlesCurrent(args, this.instance);
    const { api } = await this.connection();
    if (tool === 'load_model') {
      const input = parseInput(loadModelInput, args, 'arguments');
      const backend = (input.backend === 'node' ? 'auto' : (input.backend ?? 'auto')) as BackendChoice;
      const spec = input.revision ? `${input.model}@${input.revision}` : input.model;
      const s = await this.call('load_model', o, (id, onProgress) =>
        api.loadModel(
          id,
          { model: spec, backend, ...(input.weights ? { weights: input.weights } : {}) },
          Comlink.proxy((p) => onProgress({ stage: `loading ${p.file}`, done: p.loaded, total: p.total ?? p.loaded })),
        ),
      );
      this.loaded = s;
      return {
        document: { loaded: true, model: { ...s.info }, load_ms: Math.round(s.loadMs) },
        instance_id: this.instance,
      };
    }
    if (tool === 'list_models') {
      const cached = await api.listCache();
      const loaded = this.loaded ? { ...this.loaded.info } : null;
      const models: Record<string, unknown>[] = [
        { id: 'default', source: 'bundled', loaded: loaded?.source === 'bundled' },
      ];
      for (const c of cached)
        models.push({ id: c.id, revision: c.revision, source: 'cached', size_bytes: c.bytes, complete: c.complete });
      return { document: { loaded, models }, instance_id: this.instance };
    }
    if (!this.loaded && !this.engineModel) await this.execute('load_model', { model: this.o.model ?? 'default' }, o);
    const document = await this.call(tool, o, (id, onProgress) =>
      api.runOperation(id, tool, args, Comlink.proxy(onProgress)),
    );
    return { document, instance_id: this.instance, ...(this.loaded ? { model: { ...this.loaded.info } } : {}) };
  }

  // ---------------------------------------------------------------------------------------

  private connection(): Promise<EngineConnection> {
    this.conn ??= connectEngine(this.o.url, this.o.token).then(async (c) => {
      await c.api.configure({ instanceId: this.instance });
      this.engineModel = (await c.api.doctor()).model;
      c.endpoint.addEventListener('error', (ev) => {
        const why = (ev as Event & { message?: string }).message ?? 'the connection ended';
        this.o.log?.(`engine connection lost: ${why}`);
        this.conn = undefined;
        this.loaded = null;
        this.engineModel = null;
        const err = new LoupeError(
          'ENGINE_GONE',
          `${why[0].toUpperCase()}${why.slice(1)}.`,
          'Is loupe serve still running? The next call connects again.',
        );
        for (const fail of [...this.gone]) fail(err);
      });
      this.o.log?.(`tools run on the Loupe engine at ${this.o.url}`);
      return c;
    });
    this.conn.catch(() => (this.conn = undefined));
    return this.conn;
  }

  /** one engine job: answered at its end, its deadline, its cancellation or the connection's end */
  private call<T>(
    tool: string,
    o: CallOptions,
    run: (id: string, onProgress: (p: Progress) => void) => Promise<T>,
  ): Promise<T> {
    const id = jobId();
    return new Promise<T>((resolve, reject) => {
      let settled = false;
      const finish = (fn: () => void) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        o.signal?.removeEventListener('abort', onAbort);
        this.gone.delete(onGone);
        fn();
      };
      const stop = (e: LoupeError) =>
        finish(() => {
          void this.conn?.then((c) => c.api.cancel(id)).catch(() => undefined);
          reject(e);
        });
      const onAbort = () => stop(callCancelled());
      const onGone = (e: LoupeError) => finish(() => reject(e));
      const timer = setTimeout(() => stop(deadlineExceeded(tool)), Math.max(0, o.deadline - Date.now()));
      this.gone.add(onGone);
      o.signal?.addEventListener('abort', onAbort, { once: true });
      if (o.signal?.aborted) return onAbort();
      run(id, (p) => {
        if (!settled) o.onProgress?.(p);
      }).then(
        (v) => finish(() => resolve(v)),
        (e) => finish(() => reject(toLoupeError(e))),
      );
    });
  }
}
