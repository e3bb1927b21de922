/**
 * `loupe mcp [--headless] [--port N] …`: the companion an MCP client launches over stdio.
 *
 * stdout carries MCP messages and nothing else, so before anything can print, console.log /
 * info / debug are pointed at stderr (the engine, the ops or a dependency might log).
 */
import { readFileSync, existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { operations } from '../ops/index';
import { packageRoot, packageVersion } from '../node/package';
import type { Executor } from './executor';
import { HeadlessExecutor } from './headless';
import { JobManager } from './jobs';
import { createMcpServer } from './mcp-server';
import { PageExecutor } from './page-executor';
import type { ExecResult } from './page-connection';
import { allowLocal, type LocalAccess } from '../node/local-access';
import { guardStdin, TRANSPORT_BUFFER_BYTES } from './stdio-lines';

export const DEFAULT_PORT = 5178;

export const USAGE = `Usage: loupe mcp [options]

Runs the Loupe MCP server on stdio (an MCP client such as Claude Code, Claude Desktop or
Cursor launches it). Tools run in the Loupe page paired over a local WebSocket, or in this
process with --headless.

Options:
  --headless          run tools in this process (onnxruntime-node); no browser, no port
  --port N            hub port on 127.0.0.1 (default ${DEFAULT_PORT}, or $LOUPE_PORT); a second
                      companion on the same port shares the first one's hub
  --model SPEC        headless: model to load on first use (default: the bundled stories260K)
  --backend node|wasm headless: runtime (default node)
  --allow-local DIR   headless: let tool calls read local folders inside DIR (models,
                      sae_source, descriptions); repeatable. Without it MCP clients can
                      name no local path at all
  --dist DIR          folder of the built workbench to serve (default: <loupe>/dist)
  --page-wait S       seconds a call waits for a page to pair before failing (default 5)
  --deadline S        hard limit of one call in seconds (default 600)
  --job-deadline S    hard limit of one job in seconds (default 3600)
  --job-ttl S         seconds a finished job's result is kept (default 1800)
  --heartbeat S       page heartbeat interval in seconds; 3 missed = dropped (default 5)
  -h, --help          this text
`;

export interface McpArgs {
  headless: boolean;
  port: number;
  model?: string;
  backend?: 'node' | 'wasm';
  dist?: string;
  allowLocal: string[];
  pageWaitS: number;
  deadlineS: number;
  jobDeadlineS: number;
  jobTtlS: number;
  heartbeatS: number;
  help: boolean;
}

export class UsageError extends Error {}

export function parseMcpArgs(argv: string[]): McpArgs {
  const a: McpArgs = {
    headless: false,
    port: envPort(),
    allowLocal: [],
    pageWaitS: 5,
    deadlineS: 600,
    jobDeadlineS: 3600,
    jobTtlS: 1800,
    heartbeatS: 5,
    help: false,
  };
  const args = argv[0] === 'mcp' ? argv.slice(1) : argv;
  const num = (flag: string, v: string | undefined, min: number, max: number): number => {
    const n = Number(v);
    if (v === undefined || !Number.isFinite(n) || n < min || n > max)
      throw new UsageError(`${flag} needs a number from ${min} to ${max}`);
    return n;
  };
  for (let i = 0; i < args.length; i++) {
    const [flag, inline] =
      args[i].startsWith('--') && args[i].includes('=')
        ? [args[i].slice(0, args[i].indexOf('=')), args[i].slice(args[i].indexOf('=') + 1)]
        : [args[i], undefined];
    const value = () => inline ?? args[++i];
    switch (flag) {
      case '--headless':
        a.headless = true;
        break;
      case '--port':
        a.port = Math.trunc(num(flag, value(), 0, 65535));
        break;
      case '--model':
        a.model = value();
        if (!a.model) throw new UsageError('--model needs a value');
        break;
      case '--backend': {
        const b = value();
        if (b !== 'node' && b !== 'wasm') throw new UsageError('--backend is node or wasm');
        a.backend = b;
        break;
      }
      case '--dist':
        a.dist = value();
        if (!a.dist) throw new UsageError('--dist needs a folder');
        break;
      case '--allow-local': {
        const d = value();
        if (!d) throw new UsageError('--allow-local needs a folder');
        a.allowLocal.push(d);
        break;
      }
      case '--page-wait':
        a.pageWaitS = num(flag, value(), 0, 600);
        break;
      case '--deadline':
        a.deadlineS = num(flag, value(), 1, 86400);
        break;
      case '--job-deadline':
        a.jobDeadlineS = num(flag, value(), 1, 7 * 86400);
        break;
      case '--job-ttl':
        a.jobTtlS = num(flag, value(), 1, 7 * 86400);
        break;
      case '--heartbeat':
        a.heartbeatS = num(flag, value(), 0.05, 600);
        break;
      case '-h':
      case '--help':
        a.help = true;
        break;
      default:
        throw new UsageError(`unknown option ${args[i]}`);
    }
  }
  if (a.allowLocal.length && !a.headless)
    throw new UsageError('--allow-local applies to --headless only (the page reads no local files)');
  return a;
}

function envPort(): number {
  const p = Number(process.env.LOUPE_PORT);
  return Number.isInteger(p) && p >= 0 && p <= 65535 && process.env.LOUPE_PORT ? p : DEFAULT_PORT;
}

/**
 * Run the companion until the client closes stdin (or SIGINT/SIGTERM). Resolves with the exit
 * code (also set as process.exitCode): 0, 1 when the hub cannot start, 2 on a usage error (the
 * usage goes to stderr). Accepts argv with or without the leading 'mcp'.
 */
export async function runMcp(argv: string[]): Promise<number> {
  // Keep stdout for MCP only.
  const toErr = (...xs: unknown[]) => console.error(...xs);
  console.log = toErr;
  console.info = toErr;
  console.debug = toErr;
  const log = (msg: string) => process.stderr.write(`[loupe mcp] ${msg}\n`);

  let a: McpArgs;
  try {
    a = parseMcpArgs(argv);
  } catch (e) {
    if (!(e instanceof UsageError)) throw e;
    process.stderr.write(`loupe mcp: ${e.message}\n\n${USAGE}`);
    return (process.exitCode = 2);
  }
  if (a.help) {
    process.stderr.write(USAGE);
    return 0;
  }

  const root = packageRoot();
  const version = packageVersion(root);
  let executor: Executor;
  if (a.headless) {
    let local: LocalAccess;
    try {
      local = allowLocal(a.allowLocal);
    } catch (e) {
      process.stderr.write(`loupe mcp: --allow-local: ${(e as Error).message}\n`);
      return (process.exitCode = 2);
    }
    executor = new HeadlessExecutor({ backend: a.backend, model: a.model, log, local });
    if (a.allowLocal.length)
      log(`tool calls may read local folders inside: ${(local as { roots: string[] }).roots.join(', ')}`);
    log(`headless: tools run in this process (${a.backend ?? 'node'} backend)`);
  } else {
    const pe = new PageExecutor({
      port: a.port,
      distDir: a.dist ? path.resolve(a.dist) : path.join(root, 'dist'),
      version,
      heartbeatMs: a.heartbeatS * 1000,
      noPageWaitMs: a.pageWaitS * 1000,
      log,
    });
    try {
      await pe.started();
    } catch (e) {
      log(`cannot start: ${(e as Error).message}`);
      return (process.exitCode = 1);
    }
    executor = pe;
  }

  const jobs = new JobManager<ExecResult>({ ttlMs: a.jobTtlS * 1000, deadlineMs: a.jobDeadlineS * 1000 });
  const port = executor instanceof PageExecutor ? executor.port : a.port;
  const pageUrl = () => `http://127.0.0.1:${port}/`;
  const mcp = createMcpServer({
    executor,
    operations,
    version,
    callDeadlineMs: a.deadlineS * 1000,
    jobs,
    pageUrl,
    log,
  });
  // The SDK's transport reads the guarded stream: no line a client writes can stop it (stdio-lines.ts).
  const transport = new StdioServerTransport(guardStdin(process.stdin, process.stdout, { log }), process.stdout, {
    maxBufferSize: TRANSPORT_BUFFER_BYTES,
  });

  await new Promise<void>((resolve) => {
    let done = false;
    const shutdown = async (why: string) => {
      if (done) return;
      done = true;
      log(`stopping (${why})`);
      await mcp.close().catch(() => undefined);
      await executor.close().catch(() => undefined);
      // Backstop: if a dependency keeps the event loop alive (a native thread pool, a socket),
      // still exit. unref'd, so it never delays a process that would exit anyway.
      setTimeout(() => process.exit(process.exitCode ?? 0), 3000).unref();
      resolve();
    };
    // The SDK's stdio transport does not notice stdin ending; the client closing it is our cue.
    process.stdin.once('end', () => void shutdown('stdin closed'));
    process.stdin.once('close', () => void shutdown('stdin closed'));
    transport.onclose = () => void shutdown('transport closed');
    process.once('SIGINT', () => void shutdown('SIGINT'));
    process.once('SIGTERM', () => void shutdown('SIGTERM'));
    mcp.server.connect(transport).catch((e) => {
      log(`MCP transport failed: ${(e as Error).message}`);
      void shutdown('transport error');
    });
  });
  return Number(process.exitCode ?? 0);
}
