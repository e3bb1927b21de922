/**
 * `loupe mcp [--headless] [--port N] [--http] …`: the companion an MCP client launches over
 * stdio, or, with --http, a server on 127.0.0.1 that clients connect to by URL (http.ts).
 *
 * stdout carries MCP messages and nothing else, so before anything can print, console.log /
 * info / debug are pointed at stderr (the engine, the ops or a dependency might log).
 */
import { readFileSync, existsSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { serveStdio, StdioServerTransport } from '@modelcontextprotocol/server/stdio';
import { operations } from '../ops/index';
import { packageRoot, packageVersion } from '../node/package';
import type { Executor } from './executor';
import { ThreadExecutor } from './headless-engine';
import { JobManager } from './jobs';
import { AppViews } from './apps';
import { createMcpServer, newScope, type ClientScope, type JobValue } from './mcp-server';
import { PageExecutor } from './page-executor';
import { allowLocal, type LocalAccess } from '../node/local-access';
import { isNodeBackend, NODE_BACKENDS, type NodeBackend } from '../node/backends';
import { guardStdin, TRANSPORT_BUFFER_BYTES } from './stdio-lines';
import { HttpMcp, MCP_PATH } from './http';
import { httpToken } from './token';
import { checkHost } from './guard';
import { createStaticHandler, ISOLATION_HEADERS, listenLoopback } from '../node/static-server';

export const DEFAULT_PORT = 5178;

/**
 * Headless --http: 127.0.0.1:port serves /mcp and, so that share links open, the built page
 * (no hub: the page here runs its own model). Host is checked first, as the hub does.
 */
async function listenHeadless(
  port: number,
  distDir: string,
  mcp: (req: http.IncomingMessage, res: http.ServerResponse) => void,
): Promise<http.Server> {
  const server = http.createServer();
  const real = await listenLoopback(server, port);
  const serveStatic = createStaticHandler({ root: distDir, allowedHosts: [`127.0.0.1:${real}`, `localhost:${real}`] });
  server.on('request', (req, res) => {
    try {
      if (!checkHost(req.headers, real).ok) {
        res.writeHead(403, { ...ISOLATION_HEADERS, 'Content-Type': 'text/plain' });
        return void res.end('Forbidden: unexpected Host header.\n');
      }
      if ((req.url ?? '').split('?')[0] === MCP_PATH) return mcp(req, res);
      serveStatic(req, res).catch(() => res.destroy());
    } catch {
      res.destroy(); // no request may end the companion
    }
  });
  server.on('clientError', (_e, socket) => socket.destroy());
  return server;
}

export const USAGE = `Usage: loupe mcp [options]

Runs the Loupe MCP server on stdio (an MCP client such as Claude Code, Claude Desktop or
Cursor launches it), or with --http at http://127.0.0.1:PORT/mcp for clients that take a URL.
Tools run in the Loupe page paired over a local WebSocket, or in this process with --headless.

Options:
  --headless          run tools in this process (onnxruntime-node); no browser, no port
  --engine URL        run tools on a Loupe engine (loupe serve, e.g. a GPU box through ssh -L):
                      its pairing line URL#token=…, or the URL with $LOUPE_ENGINE_TOKEN (or,
                      on the same machine, the token file loupe serve wrote)
  --port N            hub port on 127.0.0.1 (default ${DEFAULT_PORT}, or $LOUPE_PORT); a second
                      companion on the same port shares the first one's hub
  --http              serve MCP over Streamable HTTP at http://127.0.0.1:PORT/mcp instead of
                      stdio (the page too, from the same origin); clients send the bearer
                      token kept in <config>/mcp-http.json (printed when it is made)
  --new-token         with --http: replace that token with a new one
  --model SPEC        headless: model to load on first use (default: the bundled stories260K)
  --backend node|wasm|webgpu headless: runtime (default node)
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
  /** a served engine's URL (loupe serve) */
  engine?: string;
  http: boolean;
  newToken: boolean;
  port: number;
  model?: string;
  backend?: NodeBackend;
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
    http: false,
    newToken: false,
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
    /** the flag's value, which must not be empty (`what` says what it is) */
    const given = (what: string): string => {
      const v = value();
      if (!v) throw new UsageError(`${flag} needs ${what}`);
      return v;
    };
    switch (flag) {
      case '--headless':
        a.headless = true;
        break;
      case '--engine':
        a.engine = given('a URL');
        break;
      case '--http':
        a.http = true;
        break;
      case '--new-token':
        a.newToken = true;
        break;
      case '--port':
        a.port = Math.trunc(num(flag, value(), 0, 65535));
        break;
      case '--model':
        a.model = given('a value');
        break;
      case '--backend': {
        const b = value();
        if (!isNodeBackend(b)) throw new UsageError(`--backend is ${NODE_BACKENDS.join(', ')}`);
        a.backend = b;
        break;
      }
      case '--dist':
        a.dist = given('a folder');
        break;
      case '--allow-local':
        a.allowLocal.push(given('a folder'));
        break;
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
  if (a.newToken && !a.http) throw new UsageError('--new-token applies to --http only');
  if (a.engine && (a.headless || a.backend || a.allowLocal.length))
    throw new UsageError('--engine runs tools on the served engine: not with --headless, --backend or --allow-local');
  if (a.allowLocal.length && !a.headless)
    throw new UsageError('--allow-local applies to --headless only (the page reads no local files)');
  return a;
}

function envPort(): number {
  const p = Number(process.env.LOUPE_PORT);
  return Number.isInteger(p) && p >= 0 && p <= 65535 && process.env.LOUPE_PORT ? p : DEFAULT_PORT;
}

/** The folders headless tool calls may read (--allow-local), logged; undefined (after saying why) when one is refused. */
function headlessAccess(a: McpArgs, log: (msg: string) => void): LocalAccess | undefined {
  try {
    const local = allowLocal(a.allowLocal);
    if (a.allowLocal.length)
      log(`tool calls may read local folders inside: ${(local as { roots: string[] }).roots.join(', ')}`);
    return local;
  } catch (e) {
    process.stderr.write(`loupe mcp: --allow-local: ${(e as Error).message}\n`);
    return undefined;
  }
}

/**
 * Run the companion until the client closes stdin (or SIGINT/SIGTERM). Resolves with the exit
 * code (also set as process.exitCode): 0, 1 when the hub cannot start, 2 on a usage error (the
 * usage goes to stderr). Accepts argv with or without the leading 'mcp'.
 */
export async function runMcp(
  argv: string[],
  o: { engineExecutor?: (url: string, opts: { model?: string; log: (msg: string) => void }) => Promise<Executor> } = {},
): Promise<number> {
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
  const distDir = a.dist ? path.resolve(a.dist) : path.join(root, 'dist');
  let executor: Executor;
  // with --http the MCP endpoint is served from the companion's own port (the hub's, in page mode)
  let httpMcp: HttpMcp | undefined;
  const mcpRoute = (req: http.IncomingMessage, res: http.ServerResponse) =>
    httpMcp ? httpMcp.handle(req, res) : void res.writeHead(503).end();
  let token: { token: string; file: string; created: boolean } | undefined;
  if (a.http) {
    try {
      token = await httpToken({ rotate: a.newToken });
    } catch (e) {
      log(`cannot start: ${(e as Error).message}`);
      return (process.exitCode = 1);
    }
  }
  let listener: http.Server | undefined;
  if (a.engine || a.headless) {
    if (a.engine) {
      try {
        if (!o.engineExecutor) throw new Error('this build has no served-engine client');
        executor = await o.engineExecutor(a.engine, { model: a.model, log });
      } catch (e) {
        process.stderr.write(`loupe mcp: --engine: ${(e as Error).message}\n`);
        return (process.exitCode = 2);
      }
    } else {
      const local = headlessAccess(a, log);
      if (!local) return (process.exitCode = 2);
      executor = new ThreadExecutor({ backend: a.backend, model: a.model, log, local });
      log(`headless: tools run in this process's engine thread (${a.backend ?? 'node'} backend)`);
    }
    if (a.http) {
      try {
        listener = await listenHeadless(a.port, distDir, mcpRoute);
      } catch (e) {
        log(`cannot listen on 127.0.0.1:${a.port}: ${(e as Error).message}`);
        return (process.exitCode = 1);
      }
    }
  } else {
    const pe = new PageExecutor({
      port: a.port,
      distDir,
      version,
      heartbeatMs: a.heartbeatS * 1000,
      noPageWaitMs: a.pageWaitS * 1000,
      log,
      ...(a.http ? { routes: { [MCP_PATH]: mcpRoute }, ownPort: true } : {}),
    });
    try {
      await pe.started();
    } catch (e) {
      log(`cannot start: ${(e as Error).message}`);
      return (process.exitCode = 1);
    }
    executor = pe;
  }

  const portNow = () =>
    executor instanceof PageExecutor ? executor.port : ((listener?.address() as AddressInfo | null)?.port ?? a.port);
  const pageUrl = () => `http://127.0.0.1:${portNow()}/`;
  const apps = new AppViews(path.join(distDir, 'apps'));
  if (!apps.size) log('no MCP Apps views built (npm run build): tools list without ui:// views');
  const serverFor = (scope: ClientScope) =>
    createMcpServer({ executor, operations, version, callDeadlineMs: a.deadlineS * 1000, scope, apps, pageUrl, log })
      .server;
  const newClientScope = (listed = true) =>
    newScope({
      jobs: new JobManager<JobValue>({ ttlMs: a.jobTtlS * 1000, deadlineMs: a.jobDeadlineS * 1000 }),
      listed,
    });

  let done = false;
  let stopTransport: () => Promise<void> = async () => undefined;
  const stopped = new Promise<void>((resolve) => {
    const shutdown = async (why: string) => {
      if (done) return;
      done = true;
      log(`stopping (${why})`);
      await stopTransport().catch(() => undefined);
      listener?.closeAllConnections();
      await new Promise<void>((r) => (listener ? listener.close(() => r()) : r()));
      await executor.close().catch(() => undefined);
      // Backstop: if a dependency keeps the event loop alive (a native thread pool, a socket),
      // still exit. unref'd, so it never delays a process that would exit anyway.
      setTimeout(() => process.exit(process.exitCode ?? 0), 3000).unref();
      resolve();
    };
    process.once('SIGINT', () => void shutdown('SIGINT'));
    process.once('SIGTERM', () => void shutdown('SIGTERM'));
    if (!a.http) {
      // the client closing stdin is our cue (the transport closes itself on its end too)
      process.stdin.once('end', () => void shutdown('stdin closed'));
      process.stdin.once('close', () => void shutdown('stdin closed'));
    }
  });

  if (a.http) {
    httpMcp = new HttpMcp({ port: portNow, token: token!.token, serverFor, newScope: newClientScope, log });
    stopTransport = () => httpMcp!.close();
    const url = `http://127.0.0.1:${portNow()}${MCP_PATH}`;
    log(`MCP over HTTP on ${url} (Streamable HTTP; 127.0.0.1 only); clients send "Authorization: Bearer <token>"`);
    if (token!.created) log(`a new bearer token (shown once; kept in ${token!.file}, mode 0600):\n  ${token!.token}`);
    else log(`the bearer token is in ${token!.file} (mode 0600); --new-token replaces it`);
  } else {
    // stdio: one client, one scope. serveStdio picks the era from the opening message —
    // `initialize` (2025-06-18, 2025-11-25) or a 2026-07-28 request with its envelope — and may
    // build a second instance after a probe, so each call of the factory makes a fresh server
    // over the same scope.
    const scope = newClientScope();
    // The SDK's transport reads the guarded stream: no line a client writes can stop it (stdio-lines.ts).
    const transport = new StdioServerTransport(guardStdin(process.stdin, process.stdout, { log }), process.stdout, {
      maxBufferSize: TRANSPORT_BUFFER_BYTES,
    });
    const handle = serveStdio(() => serverFor(scope), {
      transport,
      onerror: (e) => log(`MCP transport: ${e.message}`),
    });
    stopTransport = async () => {
      scope.close();
      await handle.close();
    };
  }
  await stopped;
  return Number(process.exitCode ?? 0);
}
