/**
 * The MCP server: one instance per client connection (a shared instance leaked data between
 * clients in GHSA-345p-7cg4-v4c7), built on the SDK's low-level `Server` because Loupe publishes
 * JSON Schemas it derives from the operations' zod schemas itself (incl. the document-or-job
 * output of long operations), which McpServer's registerTool cannot express.
 *
 * Conventions: agent-fixable failures are `isError` results carrying {error:{code,message,hint}};
 * an unknown tool is a JSON-RPC error; progress notifications go out when the request carries a
 * progress token; the client's cancellation aborts the call in the page (or process).
 */
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import {
  CallToolRequestSchema,
  ErrorCode,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListToolsRequestSchema,
  McpError,
  ReadResourceRequestSchema,
  type CallToolResult,
} from '@modelcontextprotocol/sdk/types.js';
import { LoupeError, toLoupeError } from '../engine/errors';
import type { Operation, Progress } from '../ops/types';
import type { Executor } from './executor';
import { JobManager } from './jobs';
import type { ExecResult } from './page-connection';
import { resultLink, shareModelOf } from './link';
import { progressMapper } from './progress';
import { errorResult, okResult, TraceResources, TRACE_URI_PREFIX, TRACE_URI_TEMPLATE } from './results';
import { parseInput, parseOperationInput } from '../ops/types';
import { jobIdInput, jobResultInput, listModelsOutput, listTools, loadModelInput, loadModelOutput } from './tools';

export interface McpServerOptions {
  executor: Executor;
  operations: Record<string, Operation>;
  version: string;
  /** hard deadline of a direct (non-job) call */
  callDeadlineMs?: number;
  jobs?: JobManager<ExecResult>;
  /** the workbench URL share links open (http://127.0.0.1:<port>/) */
  pageUrl: () => string;
  log?: (msg: string) => void;
}

const INSTRUCTIONS = `Loupe is a mechanistic-interpretability workbench. Its tools run TransformerLens-style analyses (direct logit attribution, attention patterns, logit lens, ablation, activation patching, steering, probes) on a language model that runs in the user's own browser tab (or in this process with --headless), and return versioned JSON documents.
Start with loupe_status: it says whether a page is paired, which model is loaded, and gives the pairing URL to hand to the user when no page is connected. Hook names follow TransformerLens (blocks.{l}.hook_resid_pre, blocks.{l}.attn.hook_z, …); layers, heads and positions are 0-based and position 0 is the BOS token. Long operations accept as_job: true and are then driven with job_status / job_result / job_cancel.`;

export function createMcpServer(o: McpServerOptions): {
  server: Server;
  jobs: JobManager<ExecResult>;
  close(): Promise<void>;
} {
  const { executor } = o;
  const callDeadlineMs = o.callDeadlineMs ?? 10 * 60_000;
  const jobs = o.jobs ?? new JobManager<ExecResult>();
  const traces = new TraceResources();

  // eslint-disable-next-line @typescript-eslint/no-deprecated -- see the header: low-level on purpose
  const server = new Server(
    { name: 'loupe', title: 'Loupe', version: o.version },
    { capabilities: { tools: { listChanged: false }, resources: { listChanged: false } }, instructions: INSTRUCTIONS },
  );
  server.oninitialized = () => {
    const c = server.getClientVersion();
    if (c) executor.setAgent({ name: c.title ?? c.name, version: c.version });
  };

  const tools = listTools(executor.mode, o.operations);
  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools }));

  /** Run on the executor, then check the document against its schema and keep traces. */
  async function runTool(
    name: string,
    args: Record<string, unknown>,
    ctl: { signal: AbortSignal; deadline: number; onProgress?: (p: Progress) => void },
  ): Promise<{ r: ExecResult; uri?: string }> {
    const r = await executor.execute(name, args, ctl);
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
    const uri = name === 'trace' && r.instance_id ? traces.add(r.document, r.instance_id) : undefined;
    if (op && !r.link) r.link = resultLink(o.pageUrl(), shareModelOf(r.model), name, args, r.document);
    return { r, uri };
  }

  server.setRequestHandler(CallToolRequestSchema, async (req, extra): Promise<CallToolResult> => {
    const name = req.params.name;
    const args = (req.params.arguments ?? {}) as Record<string, unknown>;
    const token = req.params._meta?.progressToken;
    const onProgress =
      token === undefined
        ? undefined
        : progressMapper((p) => {
            extra
              .sendNotification({ method: 'notifications/progress', params: { progressToken: token, ...p } })
              .catch(() => undefined);
          });
    const isOp = Object.prototype.hasOwnProperty.call(o.operations, name);
    if (!isOp && !tools.some((t) => t.name === name))
      throw new McpError(ErrorCode.InvalidParams, `Unknown tool: ${name}`);
    try {
      switch (name) {
        case 'loupe_status':
          return okResult({
            mode: executor.mode,
            version: o.version,
            ...(await executor.status()),
            jobs: jobs.list().filter((j) => j.status === 'running'),
          });
        case 'job_status':
          return okResult(jobs.status(parseInput(jobIdInput, args, 'arguments').job_id));
        case 'job_cancel':
          return okResult(jobs.cancel(parseInput(jobIdInput, args, 'arguments').job_id));
        case 'job_result': {
          const a = parseInput(jobResultInput, args, 'arguments');
          const res = await jobs.result(a.job_id, (a.wait_s ?? 0) * 1000, extra.signal);
          if (!res.done) return okResult(res.status);
          return okResult(res.value.document, {
            link: res.value.link,
            resourceUri: (res.value as { uri?: string }).uri,
          });
        }
        case 'load_model':
        case 'list_models': {
          if (name === 'load_model') parseInput(loadModelInput, args, 'arguments');
          const { r } = await runTool(name, args, {
            signal: extra.signal,
            deadline: Date.now() + callDeadlineMs,
            onProgress,
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
        const handle = jobs.start(name, async (j) => {
          const { r, uri } = await runTool(name, opArgs, {
            signal: j.signal,
            deadline: j.deadline,
            onProgress: j.onProgress,
          });
          return Object.assign(r, uri ? { uri } : {});
        });
        return okResult(handle);
      }
      const { r, uri } = await runTool(name, opArgs, {
        signal: extra.signal,
        deadline: Date.now() + callDeadlineMs,
        onProgress,
      });
      return okResult(r.document, { link: r.link, resourceUri: uri });
    } catch (e) {
      const err = toLoupeError(e);
      o.log?.(`${name} failed: ${err.code}: ${err.message}`);
      return errorResult(err);
    }
  });

  server.setRequestHandler(ListResourceTemplatesRequestSchema, async () => ({
    resourceTemplates: [
      {
        uriTemplate: TRACE_URI_TEMPLATE,
        name: 'trace',
        title: 'Loupe trace document',
        description:
          'A trace document made by the trace tool in this session; readable while the page that made it stays open (a reload expires it).',
        mimeType: 'application/json',
      },
    ],
  }));
  server.setRequestHandler(ListResourcesRequestSchema, async () => ({
    resources: traces.list(await currentInstance()),
  }));
  server.setRequestHandler(ReadResourceRequestSchema, async (req) => {
    const uri = req.params.uri;
    if (!uri.startsWith(TRACE_URI_PREFIX)) throw new McpError(ErrorCode.InvalidParams, `Unknown resource ${uri}`);
    try {
      const doc = traces.read(uri, await currentInstance());
      return { contents: [{ uri, mimeType: 'application/json', text: JSON.stringify(doc) }] };
    } catch (e) {
      const err = toLoupeError(e);
      throw new McpError(ErrorCode.InvalidParams, `${err.code}: ${err.message}`, err.toJSON().error);
    }
  });

  async function currentInstance(): Promise<string | undefined> {
    try {
      return await executor.currentInstance();
    } catch {
      return undefined;
    }
  }

  return {
    server,
    jobs,
    close: async () => {
      jobs.closeAll();
      await server.close().catch(() => undefined);
    },
  };
}
