/**
 * Maps the bridge's tools onto the workbench page: operations run in the page's model worker
 * (the same modules as everywhere), load_model goes through the page's own model loading (so the
 * model panel, the cache and the status bar follow), list_models reads the page's cache list.
 * Results of agent calls land in the page's result views, as if the user had run them.
 *
 * `BridgeApp` is the slice of the page's AppState (src/ui/state/app.svelte.ts) this needs,
 * written structurally so the bridge does not depend on the page's internals beyond it.
 */
import type { ModelInfo } from '../engine/api';
import { LoupeError } from '../engine/errors';
import { resolveModelRef } from '../engine/source/ref';
import type { Progress } from '../ops/types';
import type { ShareModel } from '../share/codec';
import type { ExecuteContext } from './page-client';
import type { WireModel } from './protocol';

export interface BridgeAppModel {
  info: ModelInfo;
  ref: ShareModel;
  loadMs?: number;
}

export interface BridgeApp {
  readonly instanceId: string;
  model: BridgeAppModel | null;
  modelStatus: 'idle' | 'loading' | 'ready' | 'error';
  modelError: { code: string; message: string; hint?: string } | null;
  loadFiles: { file: string; loaded: number; total: number | null }[];
  backend: string;
  weights?: string;
  cache: { id: string; revision: string; bytes: number; complete: boolean }[];
  results: Record<string, unknown>;
  readonly modelRef: ShareModel | null;
  client: {
    call<T>(fn: (api: any) => Promise<T>): Promise<T>;
  };
  /** run an operation in the page's worker through its job store (AppState.execute) */
  execute(
    op: string,
    input: Record<string, unknown>,
    opts: { who: 'agent'; signal?: AbortSignal; onProgress?: (p: Progress) => void },
  ): Promise<{ doc: unknown; ms: number }>;
  choiceOf(m: ShareModel): unknown;
  loadModel(choice: any, opts?: { quiet?: boolean }): Promise<boolean>;
  cancelLoad(): void;
  refreshCache(): Promise<void>;
}

/** What the page reports to the hub about its model: ModelInfo plus the share ref. */
export function wireModel(app: BridgeApp): WireModel {
  return app.model ? { ...app.model.info, ref: { ...app.model.ref } } : null;
}

/** the model a load names, and the catalog name it was asked for by (engine/catalog.ts) */
function shareModelFor(spec: string, revision: string | undefined): { model: ShareModel; requested?: string } {
  // the same reading of a model reference as the CLI and headless mode (engine/source/ref.ts);
  // the page has no file system, so a folder is refused with the page's own hint
  const ref = resolveModelRef(spec, { names: true });
  if (ref.kind === 'bundled') return { model: { kind: 'bundled', id: ref.id, revision: '' } };
  if (ref.kind === 'url') return { model: { kind: 'url', id: ref.id, revision: '' } };
  if (ref.kind === 'hub')
    return {
      model: { kind: 'hub', id: ref.id, revision: revision ?? ref.revision ?? 'main' },
      ...(ref.requested ? { requested: ref.requested } : {}),
    };
  throw new LoupeError(
    'BAD_INPUT',
    `The page cannot load ${JSON.stringify(spec)}.`,
    "Give 'default', a Hub id like 'owner/name' (optionally @revision), or an http(s) URL of a model folder. " +
      'Local folders work only headless, inside a folder the companion was started with (--allow-local DIR).',
  );
}

/**
 * While the page is loading a model — just after a reload, after its worker was restarted (the
 * new worker has no model yet), or on a user's load — wait for it rather than fail the call.
 */
async function modelReady(app: BridgeApp, ctx: ExecuteContext): Promise<void> {
  while (app.modelStatus === 'loading' && !ctx.signal.aborted && Date.now() < ctx.deadline) {
    await new Promise((r) => setTimeout(r, 100));
  }
}

/**
 * Wait until the worker answers. A cancelled job may still hold it (a WASM run does not yield, so
 * the worker reads its cancel message only between runs, or the page restarts it after its hard
 * stop); a call sent meanwhile would queue behind it or die with the restarted worker.
 */
async function workerFree(app: BridgeApp): Promise<void> {
  await app.client.call((api) => api.ping()).catch(() => undefined); // rejected when the worker was restarted
}

async function runOperation(
  app: BridgeApp,
  tool: string,
  args: Record<string, unknown>,
  ctx: ExecuteContext,
): Promise<unknown> {
  await workerFree(app);
  await modelReady(app, ctx);
  if (!app.model)
    throw new LoupeError(
      'NO_MODEL',
      'No model is loaded in the page yet.',
      'Call load_model (e.g. model: "default"), or wait for the page to finish loading its model.',
    );
  // the page's own job bookkeeping (JobStore.track): queued behind the page's jobs, shown in the
  // job bar as "tool (agent)" with progress and Cancel, cancelled by the agent's signal
  const { doc, ms } = await app.execute(tool, args, {
    who: 'agent',
    signal: ctx.signal,
    onProgress: (p) => ctx.onProgress(p),
  });
  // show it in the page's views as if the user had run it
  app.results = { ...app.results, [tool]: { op: tool, input: args, doc, model: app.modelRef, ms, fromLink: false } };
  return doc;
}

async function loadModel(app: BridgeApp, args: Record<string, unknown>, ctx: ExecuteContext): Promise<unknown> {
  const spec = String(args.model ?? '');
  const backend = args.backend as string | undefined;
  if (backend === 'node')
    throw new LoupeError(
      'BACKEND_UNAVAILABLE',
      "The page has no 'node' backend.",
      "Use 'auto', 'webgpu' or 'wasm' in the page, or run the companion with --headless.",
    );
  const named = shareModelFor(spec, args.revision as string | undefined);
  const choice = app.choiceOf(named.model) as { kind?: string; requested?: string };
  if (named.requested && choice?.kind === 'hub') choice.requested = named.requested;
  if (backend && backend !== app.backend) app.backend = backend;
  const weights = args.weights as string | undefined;
  if (weights && weights !== app.weights) app.weights = weights;
  // the page's loader reports per-file progress into loadFiles; relay its sum
  const timer = setInterval(() => {
    const files = app.loadFiles;
    if (!files.length) return;
    const loaded = files.reduce((a, f) => a + f.loaded, 0);
    const total = files.reduce((a, f) => a + (f.total ?? f.loaded), 0);
    ctx.onProgress({ stage: `loading ${spec}`, done: loaded, total: Math.max(total, loaded) });
  }, 250);
  const cancel = () => app.cancelLoad();
  ctx.signal.addEventListener('abort', cancel, { once: true });
  try {
    const ok = await app.loadModel(choice, { quiet: false });
    if (!ok || !app.model) {
      const e = app.modelError;
      if (ctx.signal.aborted) throw new LoupeError('CANCELLED', 'Loading was cancelled.');
      throw e
        ? new LoupeError(e.code as LoupeError['code'], e.message, e.hint)
        : new LoupeError('INTERNAL', 'The model did not load (another load may have replaced it).');
    }
    return { loaded: true, model: wireModel(app), load_ms: app.model.loadMs };
  } finally {
    clearInterval(timer);
    ctx.signal.removeEventListener('abort', cancel);
  }
}

async function listModels(app: BridgeApp): Promise<unknown> {
  await app.refreshCache();
  const ref = app.model?.ref;
  const models: Record<string, unknown>[] = [{ id: 'default', source: 'bundled', loaded: ref?.kind === 'bundled' }];
  for (const c of app.cache) {
    models.push({
      id: c.id,
      revision: c.revision,
      source: 'cached',
      size_bytes: c.bytes,
      complete: c.complete,
      loaded: ref?.kind === 'hub' && ref.id === c.id && ref.revision === c.revision,
    });
  }
  return { loaded: wireModel(app), models };
}

/** The `execute` for connectBridge: every tool the companion may send, run in this page. */
export function pageExecutor(
  app: BridgeApp,
): (tool: string, args: Record<string, unknown>, ctx: ExecuteContext) => Promise<unknown> {
  return (tool, args, ctx) => {
    if (tool === 'load_model') return loadModel(app, args, ctx);
    if (tool === 'list_models') return listModels(app);
    return runOperation(app, tool, args, ctx);
  };
}
