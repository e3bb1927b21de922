/**
 * `loupe serve`'s listener: one engine (workers/engine-api.ts over a host) offered over a
 * WebSocket at ws://127.0.0.1:<port>/engine, to the page ("Attach to a Loupe engine") and to
 * `loupe mcp --engine`. Every upgrade passes gate.ts first; a refused one gets a plain HTTP
 * status and is never upgraded. Plain requests get the built page (`dist`, when given and built),
 * Host-checked, so one tunnelled port gives a laptop both the page and the engine.
 *
 * Connections share the one engine (one model, loaded once, for whoever attaches next). A
 * connection that loaded a model another has since replaced is told at once (a 'model_replaced'
 * notice) and its runs on the engine's model are refused (MODEL_REPLACED, naming the model now
 * loaded) until it loads again: a page never runs on a model its panel does not name. On each,
 * only comlink calls of the protocol's methods are taken (no property reads or writes: a peer
 * cannot walk the API object), frames are bounded in size (the bridge's page-socket cap) and in
 * rate, and the jobs a connection started are its own: their ids are kept apart from other
 * connections' (another connection's cancel is NOT_FOUND) and they are cancelled when it closes.
 * A peer that stops answering pings is closed; when all MAX_CONNECTIONS are open, the one idle
 * longest (no frame for IDLE_EVICT_MS, nothing running) is closed to make room.
 */
import http from 'node:http';
import { existsSync } from 'node:fs';
import path from 'node:path';
import type { Duplex } from 'node:stream';
import * as Comlink from 'comlink';
import { WebSocketServer, type WebSocket } from 'ws';
import { LoupeError } from '../engine/errors';
import { newToken } from '../bridge/token';
import { MAX_LINE_BYTES } from '../bridge/stdio-lines';
import { SocketEndpoint, ENGINE_PATH } from '../share/wire';
import type { EngineWorkerApi, LoadedModelSummary } from '../../workers/protocol';
import { checkEngineUpgrade } from './gate';
import { allowedHosts, checkHost } from '../bridge/guard';
import { createStaticHandler } from '../node/static-server';

/** frames a connection may send per second, and in a burst (calls and callback answers: a few a second) */
export const FRAME_RATE = 200;
export const FRAME_BURST = 400;
export const MAX_CONNECTIONS = 8;
/** a connection with no frame for this long and no job running is closed when a new one needs its place */
export const IDLE_EVICT_MS = 60_000;
/** how often the server pings; a peer that has not answered the last ping by the next is closed */
export const PING_MS = 30_000;

/** the protocol's methods that take a job id first: cancelled when their connection closes */
const JOB_METHODS = new Set(['loadModel', 'runOperation', 'agreement', 'q8Cost']);
/** the ones that run on the loaded model */
const MODEL_METHODS = new Set(['runOperation', 'agreement', 'q8Cost']);

interface Conn {
  lastFrame: number;
  running: Set<string>;
  /** the load this connection made last (loaded.generation then), null before any */
  generation: number | null;
  ep?: SocketEndpoint;
}

export interface EngineServerOptions {
  api: EngineWorkerApi;
  /** 0: any free port */
  port?: number;
  token?: string;
  /** page origins allowed besides the server's own */
  origins?: readonly string[];
  log?: (msg: string) => void;
  maxPayload?: number;
  frameRate?: number;
  frameBurst?: number;
  /** a built page folder served at / (cross-origin isolated), so a tunnel's one port gives page and engine */
  dist?: string;
  maxConnections?: number;
  idleEvictMs?: number;
  pingMs?: number;
}

export interface EngineServer {
  port: number;
  token: string;
  /** ws://127.0.0.1:<port>/engine */
  url: string;
  connections(): number;
  close(): Promise<void>;
}

/**
 * The methods a peer may call. SocketEndpoint has already checked the message's shape
 * (src/share/comlink-messages.ts: APPLY or RELEASE, at most one name, well-formed arguments); this
 * refuses a name that is not one of the API's own methods.
 */
function allowedCall(api: EngineWorkerApi, data: unknown): string | null {
  const m = data as { type: string; path?: string[] };
  if (m.type !== 'APPLY') return null;
  const name = m.path?.[0];
  if (name === undefined) return 'a call of the object itself';
  if (!Object.prototype.hasOwnProperty.call(api, name) || typeof (api as any)[name] !== 'function')
    return `no method ${JSON.stringify(name.slice(0, 40))}`;
  return null;
}

export function startEngineServer(o: EngineServerOptions): Promise<EngineServer> {
  const token = o.token ?? newToken();
  const log = o.log ?? (() => {});
  const origins = o.origins ?? [];
  const wss = new WebSocketServer({ noServer: true, maxPayload: o.maxPayload ?? MAX_LINE_BYTES });
  /** open connections: when each last sent a frame, and how many jobs it runs */
  const live = new Map<WebSocket, Conn>();
  /** the engine's model: which load it was (counted) and its id; each connection notes the load it made */
  const loaded = { generation: 0, model: '' };
  const maxConnections = o.maxConnections ?? MAX_CONNECTIONS;
  const idleEvictMs = o.idleEvictMs ?? IDLE_EVICT_MS;
  let connections = 0;
  let port = 0;
  let page: ReturnType<typeof createStaticHandler> | undefined;
  const server = http.createServer((req, res) => {
    if (page && checkHost(req.headers, port).ok) return void page(req, res).catch(() => res.destroy());
    res.writeHead(page ? 403 : 426, { 'Content-Type': 'text/plain', 'Cache-Control': 'no-store' });
    res.end(`A Loupe engine: attach to it from the page's model panel (WebSocket ${ENGINE_PATH}).\n`);
  });

  server.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    const v = checkEngineUpgrade(req, { port, token, origins });
    const refuse = (status: number, reason: string) => {
      log(`refused a connection: ${reason}`);
      socket.end(`HTTP/1.1 ${status} ${http.STATUS_CODES[status]}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`);
    };
    if (!v.ok) return refuse(v.status, v.reason);
    if (live.size >= maxConnections && !evictIdle())
      return refuse(503, `${maxConnections} connections already, none idle`);
    wss.handleUpgrade(req, socket, head, (ws) => connect(ws));
  });

  /** close the connection idle longest, if one has sent nothing for idleEvictMs and runs nothing */
  function evictIdle(): boolean {
    let oldest: [WebSocket, number] | null = null;
    for (const [ws, c] of live)
      if (!c.running.size && Date.now() - c.lastFrame >= idleEvictMs && (!oldest || c.lastFrame < oldest[1]))
        oldest = [ws, c.lastFrame];
    if (!oldest) return false;
    log(`closed a connection idle ${Math.round((Date.now() - oldest[1]) / 1000)} s to make room`);
    oldest[0].close(1001, 'idle, closed to make room for another connection');
    live.delete(oldest[0]);
    return true;
  }

  // a peer that has not answered the last ping is gone (a dropped tunnel leaves no close)
  const awaiting = new WeakSet<WebSocket>();
  const pinger = setInterval(() => {
    for (const ws of live.keys()) {
      if (awaiting.has(ws)) {
        log('closed a connection that stopped answering pings');
        ws.terminate();
        continue;
      }
      awaiting.add(ws);
      ws.ping();
    }
  }, o.pingMs ?? PING_MS);
  pinger.unref();

  /** a connection whose model another's load replaced runs nothing on the one now loaded */
  function checkModel(conn: Conn): void {
    if (conn.generation === null || conn.generation === loaded.generation) return;
    throw new LoupeError(
      'MODEL_REPLACED',
      `Another connection loaded ${loaded.model} on this engine, replacing the model this one loaded.`,
      'Load your model again to run on it (the engine holds one model for all its connections).',
      { model: loaded.model },
    ).toJSON();
  }

  /** a load finished on `conn`: it holds the engine's model now; the others that had loaded one are told */
  function noteLoad(conn: Conn, summary: LoadedModelSummary): void {
    loaded.generation++;
    loaded.model = summary?.info?.id ?? '';
    conn.generation = loaded.generation;
    for (const c of live.values())
      if (c !== conn && c.generation !== null)
        c.ep?.notify({
          type: 'model_replaced',
          model: loaded.model,
          message: `Another connection loaded ${loaded.model} on this engine, replacing the model this page loaded.`,
        });
  }

  function connect(ws: WebSocket): void {
    const running = new Set<string>();
    const conn: Conn = { lastFrame: Date.now(), running, generation: null };
    live.set(ws, conn);
    ws.on('pong', () => awaiting.delete(ws));
    // this connection's job ids in the engine's one job table: another connection's never meet them
    const tag = `c${++connections}:`;
    const ep = new SocketEndpoint(
      { send: (t) => ws.send(t), close: (code, reason) => ws.close(code, reason) },
      {
        side: 'engine',
        accept: (data) => allowedCall(o.api, data),
        log,
      },
    );
    // the same engine, with this connection's jobs noted so that its end cancels them
    const mine: Record<string, unknown> = Object.fromEntries(
      Object.entries(o.api).map(([name, fn]) => [
        name,
        JOB_METHODS.has(name)
          ? async (jobId: string, ...rest: unknown[]) => {
              if (typeof jobId !== 'string' || running.has(jobId))
                throw new LoupeError('BAD_INPUT', 'A job id must be a string not already running.').toJSON();
              if (MODEL_METHODS.has(name)) checkModel(conn);
              running.add(jobId);
              try {
                const out = await (fn as (...a: unknown[]) => Promise<unknown>)(tag + jobId, ...rest);
                if (name === 'loadModel') noteLoad(conn, out as LoadedModelSummary);
                return out;
              } finally {
                running.delete(jobId);
                const at = cancelledAt.get(jobId);
                // "cancelled" is only true once the engine is free: say when that was
                if (at !== undefined) log(`${name} ${jobId}: stopped ${Date.now() - at} ms after its cancellation`);
                cancelledAt.delete(jobId);
              }
            }
          : fn,
      ]),
    );
    const cancelledAt = new Map<string, number>();
    mine.cancel = async (jobId: string) => {
      if (typeof jobId !== 'string' || !running.has(jobId))
        throw new LoupeError(
          'NOT_FOUND',
          `No job ${JSON.stringify(String(jobId).slice(0, 80))} is running on this connection.`,
          'A connection cancels only the jobs it started.',
        ).toJSON();
      cancelledAt.set(jobId, Date.now());
      return o.api.cancel(tag + jobId);
    };
    conn.ep = ep;
    Comlink.expose(mine, ep as unknown as Comlink.Endpoint);
    let tokens = o.frameBurst ?? FRAME_BURST;
    let last = Date.now();
    const rate = o.frameRate ?? FRAME_RATE;
    ws.on('message', (data, isBinary) => {
      const now = Date.now();
      conn.lastFrame = now;
      tokens = Math.min(o.frameBurst ?? FRAME_BURST, tokens + ((now - last) / 1000) * rate);
      last = now;
      if (--tokens < 0) {
        log('closed a connection that sent frames faster than the limit');
        return ws.close(1008, 'too many messages');
      }
      if (isBinary) return ws.close(1003, 'text frames only');
      ep.receive(String(data));
    });
    ws.on('close', () => {
      live.delete(ws);
      ep.closed('the connection closed', false);
      for (const id of running) {
        cancelledAt.set(id, Date.now());
        void o.api.cancel(tag + id).catch(() => {});
      }
      if (running.size) log(`a connection closed with ${running.size} job(s) running: cancelled`);
    });
    ws.on('error', (e) => log(`a connection failed: ${e.message}`));
  }

  return new Promise<EngineServer>((resolve, reject) => {
    server.once('error', (e: NodeJS.ErrnoException) =>
      reject(
        e.code === 'EADDRINUSE'
          ? new LoupeError('BAD_INPUT', `Port ${o.port} is in use.`, 'Pass another --port, or 0 for any free one.')
          : e,
      ),
    );
    server.listen(o.port ?? 0, '127.0.0.1', () => {
      port = (server.address() as { port: number }).port;
      if (o.dist && existsSync(path.join(o.dist, 'index.html')))
        page = createStaticHandler({ root: o.dist, allowedHosts: allowedHosts(port), spaFallback: true });
      resolve({
        port,
        token,
        url: `ws://127.0.0.1:${port}${ENGINE_PATH}`,
        connections: () => live.size,
        close: () =>
          new Promise<void>((done) => {
            clearInterval(pinger);
            for (const ws of live.keys()) ws.terminate();
            wss.close();
            server.close(() => done());
          }),
      });
    });
  });
}
