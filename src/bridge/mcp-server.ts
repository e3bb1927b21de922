/**
 * The MCP server: one instance per client connection (a shared instance leaked data between
 * clients in GHSA-345p-7cg4-v4c7), built on the SDK's low-level `Server` because Loupe publishes
 * JSON Schemas it derives from the operations' zod schemas itself (incl. the document-or-job
 * output of long operations), which McpServer's registerTool cannot express. The same instance
 * serves both protocol eras (2025-06-18 / 2025-11-25 after `initialize`, and 2026-07-28 with its
 * per-request envelope); the transports that pick the era are in main.ts (stdio) and http.ts.
 *
 * What a client made — its jobs and its results — lives in its `ClientScope`, which outlives the
 * Server instance where a transport builds one per request (2026-07-28 over HTTP).
 *
 * Conventions: agent-fixable failures are `isError` results carrying {error:{code,message,hint}};
 * an unknown tool is a JSON-RPC error; progress notifications go out when the request carries a
 * progress token; the client's cancellation aborts the call in the page (or process).
 */
import { ProtocolError, ProtocolErrorCode, Server, type CallToolResult } from '@modelcontextprotocol/server';
import { LoupeError, toLoupeError } from '../engine/errors';
import { checkNesting } from '../share/document-check';
import type { Operation, Progress } from '../ops/types';
import { parseInput, parseOperationInput } from '../ops/types';
import { AppViews, UI_EXTENSION } from './apps';
import type { Executor } from './executor';
import { JobManager } from './jobs';
import { resultLink, shareModelOf } from './link';
import type { ExecResult } from './page-connection';
import { progressMapper } from './progress';
import type { AgentInfo } from './protocol';
import { compareResults } from './compare';
import { errorResult, okResult, RESULT_URI_TEMPLATE, ResultStore, type StoredResult } from './results';
import {
  compareInput,
  compareOutput,
  jobIdInput,
  jobResultInput,
  listModelsOutput,
  listTools,
  loadModelInput,
  loadModelOutput,
} from './tools';

/** A job's value: the run's result and the stored document it became. */
export type JobValue = ExecResult & { stored?: StoredResult };

/** What one client made: its jobs and results. Never shared between clients. */
export interface ClientScope {
  jobs: JobManager<JobValue>;
  results: ResultStore;
  /** whether resources/list lists the results (false where the transport cannot tell clients apart) */
  listed: boolean;
  close(): void;
}

export function newScope(o: { jobs?: JobManager<JobValue>; listed?: boolean } = {}): ClientScope {
  const jobs = o.jobs ?? new JobManager<JobValue>();
  const results = new ResultStore();
  return {
    jobs,
    results,
    listed: o.listed ?? true,
    close: () => {
      jobs.closeAll();
      results.clear();
    },
  };
}

export interface McpServerOptions {
  executor: Executor;
  operations: Record<string, Operation>;
  version: string;
  /** hard deadline of a direct (non-job) call */
  callDeadlineMs?: number;
  /** jobs of a scope made here (ignored when `scope` is given) */
  jobs?: JobManager<JobValue>;
  /** the client's jobs and results; one made here (and closed with the server) when absent */
  scope?: ClientScope;
  /** the built MCP Apps views (dist/apps); none when absent */
  apps?: AppViews;
  /** the workbench URL share links open (http://127.0.0.1:<port>/) */
  pageUrl: () => string;
  log?: (msg: string) => void;
}

const INSTRUCTIONS =
  'Loupe is a mechanistic-interpretability workbench. Its tools run TransformerLens-style analyses (direct ' +
  'logit attribution, attention patterns, logit lens, ablation, activation patching, steering, probes) on a ' +
  "language model that runs in the user's own browser tab (or in this process with --headless), and return " +
  'versioned JSON documents.\n' +
  'Start with loupe_status: it says whether a page is paired, which model is loaded, and gives the pairing ' +
  'URL to hand to the user when no page is connected. Hook names follow TransformerLens ' +
  '(blocks.{l}.hook_resid_pre, blocks.{l}.attn.hook_z, …); layers, heads and positions are 0-based and ' +
  'position 0 is the BOS token. Long operations accept as_job: true and are then driven with job_status / ' +
  "job_result / job_cancel. Every document is kept as a resource loupe://results/{id} (in the result's " +
  'resource_link): read it back, or give two to compare, instead of resending numbers.';

export function createMcpServer(o: McpServerOptions): {
  server: Server;
  jobs: JobManager<JobValue>;
  scope: ClientScope;
  close(): Promise<void>;
} {
  const { executor } = o;
  const callDeadlineMs = o.callDeadlineMs ?? 10 * 60_000;
  const ownScope = !o.scope;
  const scope = o.scope ?? newScope({ jobs: o.jobs });
  const { jobs, results } = scope;
  const apps = o.apps ?? new AppViews(undefined);

  const server = new Server(
    { name: 'loupe', title: 'Loupe', version: o.version },
    {
      capabilities: {
        tools: { listChanged: false },
        resources: { listChanged: false },
        extensions: { [UI_EXTENSION]: {} },
      },
      instructions: INSTRUCTIONS,
    },
  );
  // The client's name: from `initialize` (2025 era), or from each request's envelope (2026-07-28).
  let agent: AgentInfo | undefined;
  server.oninitialized = () => {
    const c = server.getClientVersion();
    if (c) executor.setAgent((agent = { name: c.title ?? c.name, version: c.version }));
  };
  const agentOf = (envelope: { clientInfo?: { name?: unknown; title?: unknown; version?: unknown } } | undefined) => {
    const c = envelope?.clientInfo;
    if (!agent && c && typeof c.name === 'string')
      executor.setAgent(
        (agent = {
          name: String(c.title ?? c.name).slice(0, 100),
          ...(typeof c.version === 'string' ? { version: c.version.slice(0, 50) } : {}),
        }),
      );
    return agent;
  };

  const titles = Object.fromEntries(Object.values(o.operations).map((op) => [op.name, op.title]));
  const tools = listTools(executor.mode, o.operations, (op) => apps.has(op));
  server.setRequestHandler('tools/list', async () => ({ tools: tools as never }));

  /** Run on the executor, then check the document against its schema and keep it as a result. */
  async function runTool(
    name: string,
    args: Record<string, unknown>,
    ctl: { signal: AbortSignal; deadline: number; onProgress?: (p: Progress) => void; agent?: AgentInfo },
  ): Promise<JobValue> {
    const r: JobValue = await executor.execute(name, args, ctl);
    const op = o.operations[name];
    const outSchema =
      op?.output ?? (name === 'load_model' ? loadModelOutput : name === 'list_models' ? listModelsOutput : undefined);
    if (outSchema) {
      const v = outSchema.safeParse(r.document);
      if (!v.success) {
        throw new LoupeError(
          'INTERNAL',
          `The ${name} document from the ${executor.mode === 'page' ? 'page' : 'engine'} does not match its schema: ${v.error.issues
            .slice(0, 3)
            .map((i) => `${i.path.join('.')}: ${i.message}`)
            .join('; ')}.`,
          'The page and this companion may be different Loupe versions: reload the page (or update both), then call again.',
        );
      }
    }
    if (op) {
      if (!r.link) r.link = resultLink(o.pageUrl(), shareModelOf(r.model), name, args, r.document);
      r.stored = results.add(name, r.document, r.link);
    }
    return r;
  }

  server.setRequestHandler('tools/call', async (req, ctx): Promise<CallToolResult> => {
    const name = req.params.name;
    const args = (req.params.arguments ?? {}) as Record<string, unknown>;
    const token = req.params._meta?.progressToken;
    const who = agentOf(ctx.mcpReq.envelope as never);
    const onProgress =
      token === undefined
        ? undefined
        : progressMapper((p) => {
            ctx.mcpReq
              .notify({ method: 'notifications/progress', params: { progressToken: token, ...p } })
              .catch(() => undefined);
          });
    const isOp = Object.prototype.hasOwnProperty.call(o.operations, name);
    if (!isOp && !tools.some((t) => t.name === name))
      throw new ProtocolError(ProtocolErrorCode.InvalidParams, `Unknown tool: ${name}`);
    const signal = ctx.mcpReq.signal;
    try {
      checkNesting(args, 'The arguments');
      switch (name) {
        case 'loupe_status':
          return okResult({
            mode: executor.mode,
            version: o.version,
            ...(await executor.status()),
            // a scope whose clients cannot be told apart shows nobody's jobs (their ids are the capability)
            jobs: scope.listed ? jobs.list().filter((j) => j.status === 'running') : [],
          });
        case 'job_status':
          return okResult(jobs.status(parseInput(jobIdInput, args, 'arguments').job_id));
        case 'job_cancel':
          return okResult(jobs.cancel(parseInput(jobIdInput, args, 'arguments').job_id));
        case 'job_result': {
          const a = parseInput(jobResultInput, args, 'arguments');
          const res = await jobs.result(a.job_id, (a.wait_s ?? 0) * 1000, signal);
          if (!res.done) return okResult(res.status);
          return okResult(res.value.document, { link: res.value.link, result: res.value.stored });
        }
        case 'compare': {
          const a = parseInput(compareInput, args, 'arguments');
          const doc = compareResults(results.get(a.a), results.get(a.b));
          compareOutput.parse(doc);
          return okResult(doc);
        }
        case 'load_model':
        case 'list_models': {
          if (name === 'load_model') parseInput(loadModelInput, args, 'arguments');
          const r = await runTool(name, args, {
            signal,
            deadline: Date.now() + callDeadlineMs,
            onProgress,
            agent: who,
          });
          return okResult(r.document, { link: r.link });
        }
      }
      const op = o.operations[name];
      const { as_job: asJob, ...opArgs } = args;
      if (asJob !== undefined && asJob !== false && !(op.long && asJob === true)) {
        throw new LoupeError(
          'BAD_INPUT',
          op.long ? 'as_job must be true or false.' : `${name} is quick and does not run as a job.`,
          op.long ? undefined : 'Call it without as_job.',
        );
      }
      parseOperationInput(op, opArgs); // agent-fixable input errors before anything reaches the page
      if (asJob === true) {
        const handle = jobs.start(name, (j) =>
          runTool(name, opArgs, { signal: j.signal, deadline: j.deadline, onProgress: j.onProgress, agent: who }),
        );
        return okResult(handle);
      }
      const r = await runTool(name, opArgs, {
        signal,
        deadline: Date.now() + callDeadlineMs,
        onProgress,
        agent: who,
      });
      return okResult(r.document, { link: r.link, result: r.stored });
    } catch (e) {
      const err = toLoupeError(e);
      o.log?.(`${name} failed: ${err.code}: ${err.message}`);
      return errorResult(err);
    }
  });

  server.setRequestHandler('resources/templates/list', async () => ({
    resourceTemplates: [
      {
        uriTemplate: RESULT_URI_TEMPLATE,
        name: 'result',
        title: 'Loupe result document',
        description:
          "A document an operation tool made in this session (its result's resource_link names it): " +
          "the same JSON as the tool's structuredContent. Kept until the session ends or evicts it (oldest first).",
        mimeType: 'application/json',
      },
    ],
  }));
  server.setRequestHandler('resources/list', async () => ({
    resources: [...(scope.listed ? results.list().map(ResultStore.entry) : []), ...apps.list(titles)] as never,
  }));
  server.setRequestHandler('resources/read', async (req) => {
    const uri = req.params.uri;
    const view = apps.read(uri);
    if (view) return view as never;
    try {
      const r = results.get(uri);
      return {
        contents: [
          { uri, mimeType: 'application/json', text: r.json, ...(r.link ? { _meta: { 'loupe/link': r.link } } : {}) },
        ],
      };
    } catch (e) {
      const err = toLoupeError(e);
      throw new ProtocolError(ProtocolErrorCode.InvalidParams, `${err.code}: ${err.message}`, err.toJSON().error);
    }
  });

  return {
    server,
    jobs,
    scope,
    close: async () => {
      if (ownScope) scope.close();
      await server.close().catch(() => undefined);
    },
  };
}
