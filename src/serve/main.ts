/**
 * `loupe serve [--port N] [--backend B] [--origin URL]... [--allow-local DIR]... [--allow-host HOST]...`:
 * the engine for a page on another machine (or an agent through `loupe mcp --engine`), on
 * ws://127.0.0.1:<port>/engine behind a pairing token (server.ts, gate.ts). It prints the URL
 * and the token, and writes them 0600 to the config folder (engine-<port>.json) for local
 * clients. From a laptop: `ssh -L <port>:127.0.0.1:<port> gpu-box`, then attach to the same URL.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { NODE_BACKENDS, isNodeBackend, type NodeBackend } from '../node/backends';
import { allowLocal, type LocalAccess } from '../node/local-access';
import { allowHosts, type NetAccess } from '../node/net-access';
import { env } from '../engine/env';
import { DEFAULT_HUB_ENDPOINT } from '../engine/source/hub-source';
import { engineRecordPath, removeHubRecordSync, writeEngineRecord, configDir } from '../bridge/token';
import { LoupeError, toLoupeError } from '../engine/errors';
import { createEngineApi } from '../../workers/engine-api';
import { nodeEngineHost } from './node-host';
import { startEngineServer } from './server';
import { normalOrigin } from './gate';
import { DIST } from '../node/serve';

export const DEFAULT_ENGINE_PORT = 5179;

export interface Io {
  stdout: (s: string) => void;
  stderr: (s: string) => void;
}

const usage = (message: string) => new LoupeError('BAD_INPUT', message, "Run 'loupe serve --help'.");

export const SERVE_HELP = `usage: loupe serve [options]

The engine on this machine, for the page's "Attach to a Loupe engine" and for loupe mcp --engine.
Listens on 127.0.0.1 only; reach it from another machine with ssh -L PORT:127.0.0.1:PORT.

  --port N          port (default ${DEFAULT_ENGINE_PORT}; 0: any free one). Use the same port on both ends of ssh -L.
  --backend B       what the page's 'auto' runs on: ${NODE_BACKENDS.join(', ')} (default node; cpu = node)
  --origin URL      also accept a page from this origin (e.g. http://127.0.0.1:5178); repeatable
  --allow-local DIR let requests load model folders inside DIR; repeatable (default: none)
  --allow-host HOST let requests fetch from HOST (host or host:port; '*': any); repeatable
                    (default: the Hub endpoint's host, \$HF_ENDPOINT or huggingface.co; its redirects are followed)`;

export interface ServeArgs {
  port: number;
  backend: NodeBackend;
  origins: string[];
  allowLocal: string[];
  allowHost: string[];
  help: boolean;
}

export function parseServeArgs(argv: string[]): ServeArgs {
  const a: ServeArgs = {
    port: DEFAULT_ENGINE_PORT,
    backend: 'node',
    origins: [],
    allowLocal: [],
    allowHost: [],
    help: false,
  };
  for (let i = 0; i < argv.length; i++) {
    const [flag, inline] = argv[i].startsWith('--') && argv[i].includes('=') ? argv[i].split(/=(.*)/s) : [argv[i]];
    const value = () => {
      const v = inline ?? argv[++i];
      if (v === undefined || v === '') throw usage(`${flag} needs a value`);
      return v;
    };
    switch (flag) {
      case '--port': {
        const v = value();
        const n = Number(v);
        if (!/^\d+$/.test(v) || n > 65535) throw usage(`--port must be 0 to 65535 (got '${v}')`);
        a.port = n;
        break;
      }
      case '--backend': {
        const v = value();
        const b = v === 'cpu' ? 'node' : v;
        if (!isNodeBackend(b)) throw usage(`--backend must be ${NODE_BACKENDS.join(', ')} or cpu (got '${v}')`);
        a.backend = b;
        break;
      }
      case '--origin': {
        const v = value();
        const o = normalOrigin(v);
        if (!o) throw usage(`--origin must be an http(s) origin such as http://127.0.0.1:5178 (got '${v}')`);
        a.origins.push(o);
        break;
      }
      case '--allow-local':
        a.allowLocal.push(value());
        break;
      case '--allow-host':
        a.allowHost.push(value());
        break;
      default:
        if (flag !== '-h' && flag !== '--help') throw usage(`unknown option ${argv[i]}`);
        a.help = true;
    }
  }
  return a;
}

/** Runs until SIGINT or SIGTERM; returns the exit code. */
export async function serveCommand(argv: string[], io: Io): Promise<number> {
  let a: ServeArgs;
  let local: LocalAccess;
  let net: NetAccess;
  try {
    a = parseServeArgs(argv);
    local = allowLocal(a.allowLocal);
    net = allowHosts(a.allowHost.length ? a.allowHost : [new URL(env.endpoint ?? DEFAULT_HUB_ENDPOINT).host]);
  } catch (e) {
    const le = toLoupeError(e);
    io.stderr(`loupe serve: ${le.message}\n${le.hint ?? ''}\n`);
    return 2;
  }
  if (a.help) {
    io.stdout(SERVE_HELP + '\n');
    return 0;
  }
  const log = (msg: string) => io.stderr(`loupe serve: ${msg}\n`);
  const api = createEngineApi(nodeEngineHost({ backend: a.backend, local, net }));
  let server;
  try {
    server = await startEngineServer({ api, port: a.port, origins: a.origins, log, dist: DIST });
  } catch (e) {
    const le = toLoupeError(e);
    io.stderr(`loupe serve: error ${le.code}: ${le.message}\n${le.hint ? `hint: ${le.hint}\n` : ''}`);
    return 1;
  }
  const { port, token } = server;
  let record = '';
  try {
    record = await writeEngineRecord({ port, pid: process.pid, token, started_at: new Date().toISOString() });
  } catch (e) {
    log(`could not write the token file: ${(e as Error).message}`);
  }
  const onExit = () => removeHubRecordSync(port, token, configDir(), engineRecordPath(port));
  process.once('exit', onExit);
  io.stdout(
    [
      `Loupe engine (${a.backend}) on ${server.url}`,
      `pairing: ${server.url}#token=${token}`,
      `Paste the pairing line into the page's model panel, "Attach to a Loupe engine".`,
      `Pages allowed: http://127.0.0.1:${port}${a.origins.map((o) => `, ${o}`).join('')} (more with --origin URL).`,
      `Fetches from: ${net === 'any' ? 'any host' : net.hosts.join(', ')} (more with --allow-host HOST).`,
      ...(existsSync(path.join(DIST, 'index.html'))
        ? [`The page itself is served at http://127.0.0.1:${port}/ too.`]
        : []),
      ...(record ? [`The token is also in ${record} (mode 0600).`] : []),
      `From another machine: ssh -L ${port}:127.0.0.1:${port} <this host>, then attach to the same URL.`,
      '',
    ].join('\n'),
  );
  await new Promise<void>((resolve) => {
    process.once('SIGINT', resolve);
    process.once('SIGTERM', resolve);
  });
  await server.close();
  onExit();
  return 0;
}
