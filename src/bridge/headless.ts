/**
 * Headless mode: the same tools, run by the engine in this process (onnxruntime-node) with the
 * same operation modules the page's worker runs — so the documents are the same.
 *
 * Runs are serialised (one engine run at a time, as in the page's worker). A cancelled or
 * timed-out call is answered at once; its run stops at the next engine run boundary and only
 * then lets the next queued call start.
 */
import { LoupeError, toLoupeError } from '../engine/errors';
import type { LoadedModel } from '../engine/api';
import { getOperation, parseOperationInput, unknownOperation } from '../ops/index';
import { parseInput } from '../ops/types';
import type { Operation, Progress } from '../ops/types';
import type { SaeLoaders } from '../engine/source/sae-loader';
import type { WeightsMode } from '../engine/precision';
import { isNodeBackend, NODE_BACKENDS, type NodeBackend } from '../node/backends';
import type { Executor } from './executor';
import { callCancelled, deadlineExceeded } from './call-errors';
import { assertHandlesCurrent, instanceHandleStore, newInstanceId } from '../ops/lib/handles';
import type { CallOptions, ExecResult } from './page-connection';
import type { AgentInfo } from './protocol';
import { loadModelInput } from './tools';
import { NO_LOCAL, type LocalAccess } from '../node/local-access';

export interface HeadlessOptions {
  backend?: NodeBackend;
  /** model to load on first use (default 'default', the bundled stories260K) */
  model?: string;
  log?: (msg: string) => void;
  /** operation lookup (defaults to the registry) */
  lookup?: (name: string) => Operation | undefined;
  /** local folders tool calls may read (load_model, sae_source, descriptions): none unless the
   * user started the companion with --allow-local DIR. `model` above is the user's own and may be any. */
  local?: LocalAccess;
  /** the instance id handles are minted with (default: a new one) */
  instanceId?: string;
}

type LoadFn = (
  spec: string,
  opts: {
    backend?: NodeBackend;
    weights?: WeightsMode;
    local?: LocalAccess;
    onProgress?: (p: { file: string; loaded: number; total: number | null }) => void;
    signal?: AbortSignal;
  },
) => Promise<LoadedModel>;

export class HeadlessExecutor implements Executor {
  readonly mode = 'headless' as const;
  readonly instanceId: string;
  private store: ReturnType<typeof instanceHandleStore>;
  private model?: LoadedModel;
  private queue: Promise<unknown> = Promise.resolve();
  private lookup: (name: string) => Operation | undefined;
  /** one set of SAE loaders per executor (its directory cache, and its memory of absent optional files) */
  private sae?: Promise<SaeLoaders>;

  constructor(private o: HeadlessOptions = {}) {
    this.instanceId = o.instanceId ?? newInstanceId();
    this.store = instanceHandleStore(this.instanceId);
    this.lookup = o.lookup ?? getOperation;
  }

  setAgent(_agent: AgentInfo): void {
    /* no page log to show it in */
  }

  async status(): Promise<Record<string, unknown>> {
    return {
      instance_id: this.instanceId,
      backend: this.o.backend ?? 'node',
      model: this.model ? { ...this.model.info } : null,
      model_on_first_use: this.model ? undefined : (this.o.model ?? 'default'),
    };
  }

  async currentInstance(): Promise<string | undefined> {
    return this.instanceId;
  }

  execute(tool: string, args: Record<string, unknown>, o: CallOptions): Promise<ExecResult> {
    try {
      assertHandlesCurrent(args, this.instanceId);
    } catch (e) {
      return Promise.reject(e);
    }
    const ctl = new AbortController();
    const run = this.queue.then(() => {
      if (ctl.signal.aborted) throw new LoupeError('CANCELLED', 'The call was cancelled before it started.');
      return this.runTool(tool, args, { signal: ctl.signal, onProgress: o.onProgress });
    });
    this.queue = run.catch(() => undefined); // the next call waits for this run to really stop
    // Say when a cancelled run has really stopped: "cancelled" is only true once the engine is free.
    let abortedAt = 0;
    ctl.signal.addEventListener('abort', () => (abortedAt = Date.now()), { once: true });
    run.then(
      () => abortedAt && this.o.log?.(`${tool}: finished before the cancellation took effect`),
      () => abortedAt && this.o.log?.(`${tool}: stopped ${Date.now() - abortedAt} ms after cancellation`),
    );
    return new Promise<ExecResult>((resolve, reject) => {
      const timer = setTimeout(
        () => {
          ctl.abort();
          reject(deadlineExceeded(tool));
        },
        Math.max(0, o.deadline - Date.now()),
      );
      const onAbort = () => {
        ctl.abort();
        reject(callCancelled());
      };
      if (o.signal?.aborted) onAbort();
      o.signal?.addEventListener('abort', onAbort, { once: true });
      run
        .then(resolve, (e) => reject(toLoupeError(e)))
        .finally(() => {
          clearTimeout(timer);
          o.signal?.removeEventListener('abort', onAbort);
        });
    });
  }

  async close(): Promise<void> {
    const m = this.model;
    this.model = undefined;
    await m?.dispose().catch(() => undefined);
  }

  // ---------------------------------------------------------------------------------------

  private async runTool(
    tool: string,
    args: Record<string, unknown>,
    ctx: { signal: AbortSignal; onProgress?: (p: Progress) => void },
  ): Promise<ExecResult> {
    if (tool === 'load_model') {
      const input = parseInput(loadModelInput, args, 'arguments');
      if (input.backend && !isNodeBackend(input.backend) && input.backend !== 'auto') {
        throw new LoupeError(
          'BACKEND_UNAVAILABLE',
          `Backend ${input.backend} is not available headless.`,
          `Use ${NODE_BACKENDS.map((b) => `'${b}'`).join(', ')} (default 'node').`,
        );
      }
      if (input.revision) {
        throw new LoupeError(
          'BAD_INPUT',
          'Headless load_model takes the revision in the model spec, not as a separate field.',
          'Pass model: "owner/name@revision" or omit revision.',
        );
      }
      const t0 = Date.now();
      await this.loadModel(
        input.model,
        isNodeBackend(input.backend) ? input.backend : this.o.backend, // 'auto' or none: the companion's --backend
        ctx,
        this.local,
        input.weights,
      );
      return {
        document: { loaded: true, model: { ...this.model!.info }, load_ms: Date.now() - t0 },
        instance_id: this.instanceId,
      };
    }
    if (tool === 'list_models') {
      const loaded = this.model ? { ...this.model.info } : null;
      const models = [{ id: 'default', source: 'bundled', loaded: loaded?.source === 'bundled' }];
      if (loaded && loaded.source !== 'bundled')
        models.push({ id: loaded.id, source: String(loaded.source), loaded: true });
      return { document: { loaded, models }, instance_id: this.instanceId };
    }
    const op = this.lookup(tool);
    if (!op) throw unknownOperation(tool);
    const input = parseOperationInput(op, args);
    const model = await this.ensureModel(ctx);
    const sae = await this.saeLoaders();
    const documents = (await import('../node/document-cache')).nodeDocumentCache();
    const document = await op.run(model, input, {
      onProgress: ctx.onProgress,
      signal: ctx.signal,
      store: this.store,
      loadSae: sae.loadSae,
      loadSaeFile: sae.loadSaeFile,
      loadTranscoders: sae.loadTranscoders,
      documents,
    });
    return { document, instance_id: this.instanceId, model: { ...model.info } };
  }

  /** Imported on first use, like the model loader: tools/list must not pull in the Node loaders. */
  private saeLoaders(): Promise<SaeLoaders> {
    this.sae ??= import('../node/load-sae').then((m) => m.createNodeSaeLoaders({ local: this.local }));
    return this.sae;
  }

  private async ensureModel(ctx: { signal: AbortSignal; onProgress?: (p: Progress) => void }): Promise<LoadedModel> {
    if (!this.model) await this.loadModel(this.o.model ?? 'default', this.o.backend, ctx, 'any');
    return this.model!;
  }

  private get local(): LocalAccess {
    return this.o.local ?? NO_LOCAL;
  }

  private async loadModel(
    spec: string,
    backend: NodeBackend | undefined,
    ctx: { signal: AbortSignal; onProgress?: (p: Progress) => void },
    local: LocalAccess,
    weights?: WeightsMode,
  ): Promise<void> {
    // Imported on first use: tools/list and loupe_status must answer without loading onnxruntime.
    const { loadModelNode } = (await import('../node/load')) as { loadModelNode: LoadFn };
    this.o.log?.(`loading model ${spec} (${backend ?? 'node'})`);
    const next = await loadModelNode(spec, {
      backend,
      local,
      weights,
      signal: ctx.signal,
      onProgress: (p) => ctx.onProgress?.({ stage: `loading ${p.file}`, done: p.loaded, total: p.total ?? p.loaded }),
    });
    const old = this.model;
    this.model = next;
    await old?.dispose().catch(() => undefined);
  }
}
