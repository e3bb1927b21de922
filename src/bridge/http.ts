/**
 * `loupe mcp --http`: MCP over Streamable HTTP at `http://127.0.0.1:<port>/mcp`, for clients that
 * connect by URL. The transport only: it checks each request, picks the protocol era, and hands
 * the request to an MCP server built by `serverFor` (mcp-server.ts) over the client's scope; what
 * runs the tools (page or engine) is the executor's business, not this file's.
 *
 * Every request passes, in this order, before the SDK sees a byte of it:
 *  - its peer is on loopback (the listener binds 127.0.0.1 only; this is the second wall);
 *  - Host is 127.0.0.1:<port> or localhost:<port> (guard.ts checkHost, as the WebSocket gate:
 *    a DNS-rebinding page names its own host) — else 403;
 *  - an Origin, when present, is exactly http://<that Host> and not "null" (a browser page of
 *    another origin can never reach us; CLI clients send none) — else 403;
 *  - `Authorization: Bearer <token>` equals the token (token.ts httpToken: 256 bits, 0600),
 *    compared in constant time after a shape check — else 401;
 *  - POST, GET or DELETE; a body of at most MAX_BODY_BYTES.
 *
 * Eras: a 2025-era client (`initialize`, then `Mcp-Session-Id`) gets a session: its own
 * transport, server and scope (jobs, results), closed after SESSION_IDLE_MS without a request or
 * on DELETE; at most MAX_SESSIONS live, the longest idle one closed for a new one. A 2026-07-28
 * request (its `_meta` envelope) is served per request by the SDK's createMcpHandler; that
 * revision has no sessions, so those requests share one scope whose results and jobs are not
 * listed to anyone: their URIs and job ids (128 random bits) are the capability.
 */
import { randomUUID } from 'node:crypto';
import type http from 'node:http';
import type { Socket } from 'node:net';
import {
  createMcpHandler,
  isInitializeRequest,
  isLegacyRequest,
  WebStandardStreamableHTTPServerTransport,
  type Server,
} from '@modelcontextprotocol/server';
import { LOOPBACK, checkHost } from './guard';
import type { ClientScope } from './mcp-server';
import { tokensEqual } from './token';

export const MCP_PATH = '/mcp';
/** a request body (one JSON-RPC message; a prompt list can be long), as stdin's line limit */
export const MAX_BODY_BYTES = 64 * 1024 * 1024;
export const MAX_SESSIONS = 32;
export const SESSION_IDLE_MS = 30 * 60_000;

export interface HttpMcpOptions {
  /** the port the listener has (Host and Origin must name it) */
  port: () => number;
  token: string;
  /** an MCP server over a scope (called per session, and per 2026-07-28 request) */
  serverFor(scope: ClientScope): Server;
  /** a fresh scope; `listed` false for the shared 2026-07-28 one */
  newScope(listed: boolean): ClientScope;
  log?: (msg: string) => void;
  maxSessions?: number;
  sessionIdleMs?: number;
  maxBodyBytes?: number;
}

interface Session {
  transport: WebStandardStreamableHTTPServerTransport;
  server: Server;
  scope: ClientScope;
  lastSeen: number;
  inFlight: number;
}

/** how long a refused body may keep arriving after the refusal is written */
const LINGER_MS = 1000;
const JSON_HEADERS = { 'Content-Type': 'application/json', 'Cache-Control': 'no-store' };

/** A plain HTTP refusal (JSON-RPC shaped, so MCP clients show the message). */
function refuse(res: http.ServerResponse, status: number, message: string, extra: Record<string, string> = {}): void {
  if (res.headersSent) return void res.destroy();
  res.writeHead(status, { ...JSON_HEADERS, ...extra, Connection: 'close' });
  res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: status === 404 ? -32001 : -32000, message } }));
}

/**
 * Node closes a `Connection: close` response's socket as soon as the answer is written. With the
 * peer's body still arriving, that close is a reset, and a reset can discard the answer before the
 * peer reads it. So end our side, keep reading theirs (discarded), and close a moment later.
 */
function lingerOnClose(socket: Socket): void {
  socket.destroySoon = () => {
    socket.end();
    setTimeout(() => socket.destroy(), LINGER_MS).unref();
  };
}

const one = (h: string | string[] | undefined): string | undefined =>
  Array.isArray(h) ? (h.length === 1 ? h[0] : undefined) : h;

/** The request checks above, as a pure function of the request (tests call it). */
export function checkRequest(
  req: Pick<http.IncomingMessage, 'headers' | 'method'> & { socket: { remoteAddress?: string } },
  o: { port: number; token: string },
): { ok: true } | { ok: false; status: number; reason: string } {
  if (!LOOPBACK.has(req.socket.remoteAddress ?? '')) return { ok: false, status: 403, reason: 'not from loopback' };
  const host = checkHost(req.headers, o.port);
  if (!host.ok) return { ok: false, status: 403, reason: host.reason };
  const origin = req.headers.origin;
  if (origin !== undefined) {
    const o1 = one(origin);
    if (o1 === undefined || o1 === 'null' || o1.toLowerCase() !== `http://${host.host}`)
      return { ok: false, status: 403, reason: `foreign Origin ${JSON.stringify(String(origin).slice(0, 100))}` };
  }
  const auth = one(req.headers.authorization);
  const m = auth === undefined ? null : /^Bearer ([^\s]+)$/i.exec(auth.trim());
  if (!m || !tokensEqual(m[1], o.token))
    return { ok: false, status: 401, reason: auth === undefined ? 'missing bearer token' : 'wrong bearer token' };
  if (req.method !== 'POST' && req.method !== 'GET' && req.method !== 'DELETE')
    return { ok: false, status: 405, reason: `method ${String(req.method).slice(0, 20)} not allowed` };
  return { ok: true };
}

export class HttpMcp {
  private sessions = new Map<string, Session>();
  private modernScope: ClientScope;
  private modern: ReturnType<typeof createMcpHandler>;
  private closed = false;
  private readonly maxBody: number;
  private readonly log: (msg: string) => void;

  constructor(private o: HttpMcpOptions) {
    this.maxBody = o.maxBodyBytes ?? MAX_BODY_BYTES;
    this.log = o.log ?? (() => {});
    this.modernScope = o.newScope(false);
    this.modern = createMcpHandler(() => o.serverFor(this.modernScope), {
      legacy: 'reject',
      maxRequestBodySize: this.maxBody,
      onerror: (e) => this.log(`MCP over HTTP: ${e.message}`),
    });
  }

  get sessionCount(): number {
    return this.sessions.size;
  }

  /** Serve one request to MCP_PATH. Never throws; whatever goes wrong answers this request only. */
  handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    this.serve(req, res).catch((e) => {
      this.log(`an MCP HTTP request failed: ${(e as Error)?.message ?? String(e)}`);
      refuse(res, 500, 'Internal error');
    });
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const id of [...this.sessions.keys()]) await this.drop(id);
    await this.modern.close().catch(() => undefined);
    this.modernScope.close();
  }

  // ---------------------------------------------------------------------------------------

  private async serve(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    if (this.closed) return refuse(res, 503, 'The Loupe companion is stopping.');
    const v = checkRequest(req, { port: this.o.port(), token: this.o.token });
    if (!v.ok) {
      this.log(`refused an MCP HTTP request: ${v.reason}`);
      req.resume();
      return refuse(res, v.status, v.status === 401 ? 'Unauthorized' : 'Forbidden', {
        ...(v.status === 401 ? { 'WWW-Authenticate': 'Bearer realm="loupe"' } : {}),
        ...(v.status === 405 ? { Allow: 'POST, GET, DELETE' } : {}),
      });
    }
    const body = req.method === 'POST' ? await this.readBody(req, res) : undefined;
    if (body === null) return; // refused (too large) or the peer went away
    // a closed connection aborts the request: the SDK cancels the call (2026-07-28: closing the
    // response stream is the cancellation) and a 2025 session's stream ends
    const ctl = new AbortController();
    res.once('close', () => ctl.abort());
    const headers = new Headers();
    for (const [k, val] of Object.entries(req.headers))
      if (typeof val === 'string') headers.set(k, val);
      else if (Array.isArray(val)) for (const x of val) headers.append(k, x);
    const request = new Request(`http://${headers.get('host')}${MCP_PATH}`, {
      method: req.method,
      headers,
      body: body && body.length ? new Uint8Array(body) : undefined,
      signal: ctl.signal,
    });
    let parsed: unknown;
    if (body) {
      try {
        parsed = JSON.parse(body.toString('utf8'));
      } catch {
        return void res
          .writeHead(400, JSON_HEADERS)
          .end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32700, message: 'Parse error' } }));
      }
    }
    this.sweep();
    const sid = one(req.headers['mcp-session-id']);
    if (req.headers['mcp-session-id'] !== undefined) {
      const s = sid === undefined ? undefined : this.sessions.get(sid);
      if (!s) return refuse(res, 404, 'Session not found: start a new session with initialize.');
      return this.viaSession(s, request, parsed, res);
    }
    if (req.method === 'POST' && (await isLegacyRequest(request, parsed))) {
      if (!isInitializeRequest(parsed))
        return refuse(res, 400, 'Bad Request: a 2025-era request needs the Mcp-Session-Id its initialize returned.');
      const s = await this.newSession();
      if (!s) return refuse(res, 503, `Too many MCP sessions (${this.o.maxSessions ?? MAX_SESSIONS}) are active.`);
      return this.viaSession(s, request, parsed, res);
    }
    await this.send(await this.modern.fetch(request, { parsedBody: parsed }), res);
  }

  private async viaSession(s: Session, request: Request, parsed: unknown, res: http.ServerResponse): Promise<void> {
    s.inFlight++;
    s.lastSeen = Date.now();
    try {
      const response = await s.transport.handleRequest(request, { parsedBody: parsed });
      await this.send(response, res);
    } finally {
      s.inFlight--;
      s.lastSeen = Date.now();
    }
  }

  private async newSession(): Promise<Session | undefined> {
    const max = this.o.maxSessions ?? MAX_SESSIONS;
    if (this.sessions.size >= max) {
      // room for a new client: close the longest-idle session that has nothing running
      const idle = [...this.sessions.entries()].filter(([, x]) => x.inFlight === 0 && x.scope.jobs.runningCount === 0);
      idle.sort((a, b) => a[1].lastSeen - b[1].lastSeen);
      if (!idle.length) return undefined;
      this.log(`closing MCP session ${idle[0][0].slice(0, 8)}… (idle longest) for a new client`);
      await this.drop(idle[0][0]);
    }
    const scope = this.o.newScope(true);
    const server = this.o.serverFor(scope);
    const s: Session = { transport: undefined as never, server, scope, lastSeen: Date.now(), inFlight: 0 };
    s.transport = new WebStandardStreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => void this.sessions.set(id, s),
      onsessionclosed: (id) => void this.drop(id),
      maxRequestBodySize: this.maxBody,
    });
    await server.connect(s.transport);
    return s;
  }

  private async drop(id: string): Promise<void> {
    const s = this.sessions.get(id);
    if (!s) return;
    this.sessions.delete(id);
    s.scope.close();
    await s.server.close().catch(() => undefined);
  }

  /** Close sessions idle longer than the limit. */
  private sweep(): void {
    const limit = this.o.sessionIdleMs ?? SESSION_IDLE_MS;
    const now = Date.now();
    for (const [id, s] of this.sessions)
      if (s.inFlight === 0 && s.scope.jobs.runningCount === 0 && now - s.lastSeen > limit) void this.drop(id);
  }

  /** The body, or null after answering 413 (or when the peer went away). */
  private readBody(req: http.IncomingMessage, res: http.ServerResponse): Promise<Buffer | null> {
    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared) && declared > this.maxBody) {
      req.resume();
      refuse(res, 413, `Request body larger than ${this.maxBody} bytes.`);
      return Promise.resolve(null);
    }
    return new Promise((resolve) => {
      const parts: Buffer[] = [];
      let size = 0;
      let done = false;
      const finish = (v: Buffer | null) => {
        if (!done) ((done = true), resolve(v));
      };
      req.on('data', (c: Buffer) => {
        if (done) return;
        size += c.length;
        if (size > this.maxBody) {
          lingerOnClose(req.socket);
          refuse(res, 413, `Request body larger than ${this.maxBody} bytes.`);
          return finish(null);
        }
        parts.push(c);
      });
      req.on('end', () => finish(Buffer.concat(parts)));
      req.on('error', () => finish(null));
      req.on('close', () => finish(null)); // before 'end': the peer went away
    });
  }

  /** Write a web Response to Node's response, streaming (SSE) bodies as they come. */
  private async send(response: Response, res: http.ServerResponse): Promise<void> {
    if (res.destroyed) {
      await response.body?.cancel().catch(() => undefined);
      return;
    }
    const headers: Record<string, string> = {};
    response.headers.forEach((v, k) => (headers[k] = v));
    res.writeHead(response.status, headers);
    if (!response.body) return void res.end();
    const reader = response.body.getReader();
    res.once('close', () => void reader.cancel().catch(() => undefined));
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        if (!res.write(value)) await new Promise<void>((r) => res.once('drain', r).once('close', r));
      }
    } catch {
      /* the client went away, or the stream was cancelled */
    } finally {
      res.end();
    }
  }
}
