/**
 * The hub: one HTTP server on 127.0.0.1:<port> that serves the built workbench and two
 * WebSocket endpoints — `/ws/page` for the paired page (the executor) and `/ws/agent` for other
 * `loupe mcp` processes that share this hub. Every upgrade passes guard.ts before it happens.
 *
 * Calls go to the most recently paired page. A page that reloads (same tab, new instance)
 * replaces its old session at once, failing the old session's pending calls.
 */
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { WebSocketServer, type WebSocket } from 'ws';
import { LoupeError, toLoupeError } from '../engine/errors';
import { createStaticHandler, ISOLATION_HEADERS, listenLoopback } from '../node/static-server';
import { checkHost, checkUpgrade } from './guard';
import { startHeartbeat } from './heartbeat';
import { assertHandlesCurrent } from '../ops/lib/handles';
import { agentProof, hubProof, proofsEqual } from './token';
import { MAX_LINE_BYTES } from './stdio-lines';
import { callCancelled } from './call-errors';
import { PageConnection, type CallOptions, type ExecResult } from './page-connection';
import { CLOSE_POLICY, HUB_PROBE_PATH, HUB_STATUS_TOOL, PROTOCOL_VERSION, SUBPROTOCOL, parseMessage } from './protocol';
import type { AgentInfo, HubToAgent, WireModel } from './protocol';

/** challenge peers that may wait for their proof at one time (each holds at most one frame in memory) */
const MAX_UNAUTHENTICATED = 4;

export interface HubOptions {
  /** 0 = any free port (tests) */
  port: number;
  token: string;
  /** the built page; a placeholder explains how to build it when missing */
  distDir: string;
  version: string;
  heartbeatMs?: number;
  missedBeats?: number;
  /** how long a call waits for a page to pair before failing with NO_PAGE */
  noPageWaitMs?: number;
  /** a page must say hello this soon after connecting */
  helloTimeoutMs?: number;
  /** more HTTP endpoints on this origin by path (`/mcp`: loupe mcp --http), after the Host check */
  routes?: Record<string, (req: http.IncomingMessage, res: http.ServerResponse) => void>;
  log?: (msg: string) => void;
}

export interface HubStatus {
  mode: 'page';
  hub_url: string;
  pairing_url: string;
  protocol_version: number;
  page: null | {
    tab_id: string;
    instance_id: string;
    connected_since: string;
    model: WireModel;
    pending_calls: number;
  };
  other_pages: number;
  agents: AgentInfo[];
}

const NOT_BUILT =
  '<!doctype html><meta charset="utf-8"><title>Loupe</title>\n' +
  '<p>The Loupe workbench has not been built. Run <code>npm run build</code> in the Loupe folder, then ' +
  'reload this page (keep the <code>#pair=…</code> part of the address).</p>';

/**
 * Run a peer's message handler so that nothing it throws can escape into the event loop (an
 * uncaught exception would end the companion and every agent's session with it): log, then let
 * `drop` disconnect the peer that sent it.
 */
export function runPeerHandler(log: (msg: string) => void, what: string, fn: () => void, drop?: () => void): void {
  try {
    fn();
  } catch (e) {
    log(`dropped a peer after ${what} failed: ${(e as Error)?.message ?? String(e)}`);
    try {
      drop?.();
    } catch {
      /* already gone */
    }
  }
}

const pathOf = (url: string | undefined) => (url ?? '').split('?')[0];

export class Hub {
  readonly server: http.Server;
  readonly port: number;
  readonly token: string;
  private pages: PageConnection[] = [];
  private agents = new Map<WebSocket, AgentInfo>();
  private localAgent: AgentInfo | undefined;
  private waiters = new Set<() => void>();
  private wss: WebSocketServer;
  /**
   * Peers that offered a challenge are upgraded before they have shown the token, so they get a
   * smaller frame limit (a forwarded call's arguments come from one MCP line, at most 64 MiB:
   * stdio-lines.ts) and only a few may wait unauthenticated at a time.
   */
  private challengeWss = new WebSocketServer({
    noServer: true,
    maxPayload: MAX_LINE_BYTES,
    handleProtocols: (offered) => (offered.has(SUBPROTOCOL) ? SUBPROTOCOL : false),
  });
  private unauthenticated = 0;
  private log: (msg: string) => void;

  private constructor(
    server: http.Server,
    wss: WebSocketServer,
    private opts: Required<Omit<HubOptions, 'log'>> & Pick<HubOptions, 'log'>,
  ) {
    this.server = server;
    this.wss = wss;
    this.port = (server.address() as AddressInfo).port;
    this.token = opts.token;
    this.log = opts.log ?? (() => {});
  }

  /** Listen on 127.0.0.1 only. Rejects with the listen error (EADDRINUSE when taken). */
  static async start(o: HubOptions): Promise<Hub> {
    const opts = {
      heartbeatMs: 5000,
      missedBeats: 3,
      noPageWaitMs: 5000,
      helloTimeoutMs: 5000,
      routes: {},
      ...o,
    };
    const server = http.createServer();
    await listenLoopback(server, opts.port);
    const wss = new WebSocketServer({
      noServer: true,
      maxPayload: 256 * 1024 * 1024, // documents (activations of a long prompt) can be tens of MB
      handleProtocols: (offered) => (offered.has(SUBPROTOCOL) ? SUBPROTOCOL : false),
    });
    const hub = new Hub(server, wss, opts);
    hub.mount();
    return hub;
  }

  get origin(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  get pairingUrl(): string {
    return `${this.origin}/#pair=${this.token}`;
  }

  /** The page calls go to: the most recently paired live one. */
  get activePage(): PageConnection | undefined {
    return this.pages[this.pages.length - 1];
  }

  setLocalAgent(a: AgentInfo | undefined): void {
    this.localAgent = a;
    this.broadcastAgents();
  }

  status(): HubStatus {
    const p = this.activePage;
    return {
      mode: 'page',
      hub_url: this.origin + '/',
      pairing_url: this.pairingUrl,
      protocol_version: PROTOCOL_VERSION,
      page: p
        ? {
            tab_id: p.tabId,
            instance_id: p.instanceId,
            connected_since: new Date(p.connectedAt).toISOString(),
            model: p.model,
            pending_calls: p.pendingCount,
          }
        : null,
      other_pages: Math.max(0, this.pages.length - 1),
      agents: this.agentList(),
    };
  }

  /** Wait up to ms for a paired page; undefined when none came. */
  async waitForPage(ms: number, signal?: AbortSignal): Promise<PageConnection | undefined> {
    if (this.activePage) return this.activePage;
    if (ms <= 0) return undefined;
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(t);
        this.waiters.delete(done);
        signal?.removeEventListener('abort', done);
        resolve(this.activePage);
      };
      const t = setTimeout(done, ms);
      this.waiters.add(done);
      signal?.addEventListener('abort', done, { once: true });
    });
  }

  /**
   * Run a tool on the active page. Fails with NO_PAGE (after noPageWaitMs), HANDLE_EXPIRED
   * (a handle from another page instance in args), or whatever PageConnection.call fails with.
   */
  async execute(tool: string, args: Record<string, unknown>, o: CallOptions): Promise<ExecResult> {
    const page = await this.waitForPage(this.opts.noPageWaitMs, o.signal);
    if (o.signal?.aborted) throw callCancelled();
    if (!page) {
      throw new LoupeError(
        'NO_PAGE',
        `No Loupe page is connected to the hub. Open ${this.pairingUrl} in a browser (Chrome or Edge) to pair it, then call again.`,
        `Ask the user to open ${this.pairingUrl} — or, if a Loupe tab is already open, ` +
          'to press Connect in its Agent panel. Tip: start the companion with --headless to run without a browser.',
      );
    }
    assertHandlesCurrent(args, page.instanceId);
    return page.call(tool, args, { ...o, agent: o.agent ?? this.localAgent });
  }

  async close(): Promise<void> {
    for (const p of [...this.pages]) p.close('the Loupe companion stopped');
    for (const ws of this.agents.keys()) ws.close(CLOSE_POLICY, 'hub stopping');
    for (const w of [...this.waiters]) w();
    this.wss.close();
    this.challengeWss.close();
    await new Promise<void>((resolve) => {
      this.server.closeAllConnections?.();
      this.server.close(() => resolve());
    });
  }

  // ---------------------------------------------------------------------------------------

  private mount(): void {
    const serveStatic = createStaticHandler({
      root: this.opts.distDir,
      allowedHosts: [`127.0.0.1:${this.port}`, `localhost:${this.port}`],
      notBuiltHtml: NOT_BUILT,
    });
    this.server.on('request', (req, res) =>
      runPeerHandler(
        this.log,
        'an HTTP request',
        () => {
          const host = checkHost(req.headers, this.port);
          if (!host.ok) {
            res.writeHead(403, { ...ISOLATION_HEADERS, 'Content-Type': 'text/plain' });
            return void res.end('Forbidden: unexpected Host header.\n');
          }
          const route = Object.prototype.hasOwnProperty.call(this.opts.routes, pathOf(req.url))
            ? this.opts.routes[pathOf(req.url)]
            : undefined;
          if (route) return route(req, res);
          if ((req.url ?? '').split('?')[0] === HUB_PROBE_PATH) {
            // Tells a second companion that this port is a Loupe hub. Carries no secret.
            res.writeHead(200, {
              ...ISOLATION_HEADERS,
              'Content-Type': 'application/json',
              'Cache-Control': 'no-store',
            });
            return void res.end(
              JSON.stringify({
                service: 'loupe-hub',
                protocol: PROTOCOL_VERSION,
                version: this.opts.version,
                pid: process.pid,
              }),
            );
          }
          serveStatic(req, res).catch(() => res.destroy());
        },
        () => res.destroy(),
      ),
    );
    this.server.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
      // A refused or reset client must not raise an unhandled 'error' on the raw socket.
      socket.on('error', () => socket.destroy());
      try {
        const v = checkUpgrade(req.url, req.headers, { port: this.port, token: this.token });
        if (!v.ok) {
          this.log(`refused a WebSocket upgrade from ${(socket as Socket).remoteAddress ?? '?'}: ${v.reason}`);
          const text = http.STATUS_CODES[v.status] ?? 'Forbidden';
          const body = Buffer.from(`${v.reason}\n`, 'utf8');
          socket.end(
            `HTTP/1.1 ${v.status} ${text}\r\nConnection: close\r\nContent-Type: text/plain; ` +
              `charset=utf-8\r\nContent-Length: ${body.length}\r\n\r\n${body.toString('utf8')}`,
          );
          return;
        }
        if (v.challenge) {
          if (this.unauthenticated >= MAX_UNAUTHENTICATED) {
            socket.end('HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
            return;
          }
          this.unauthenticated += 1;
          let counted = true;
          const release = () => {
            if (counted) this.unauthenticated -= 1;
            counted = false;
          };
          socket.once('close', release);
          this.challengeWss.handleUpgrade(req, socket, head, (ws) =>
            runPeerHandler(this.log, 'accepting a peer', () => this.acceptAgent(ws, v.challenge, release)),
          );
          return;
        }
        this.wss.handleUpgrade(req, socket, head, (ws) =>
          runPeerHandler(this.log, 'accepting a peer', () =>
            v.kind === 'page' ? this.acceptPage(ws) : this.acceptAgent(ws),
          ),
        );
      } catch (e) {
        // Catch-all: no request, however malformed, may end the companion.
        this.log(`dropped a WebSocket upgrade that failed: ${(e as Error).message}`);
        socket.destroy();
      }
    });
    this.server.on('clientError', (_e, socket) => socket.destroy());
  }

  private acceptPage(ws: WebSocket): void {
    // Before the PageConnection takes over: a bad frame (ws reports it as 'error') only drops this peer.
    ws.on('error', () => ws.terminate());
    const helloTimer = setTimeout(() => ws.close(CLOSE_POLICY, 'no hello'), this.opts.helloTimeoutMs);
    ws.once('close', () => clearTimeout(helloTimer));
    ws.once('message', (data, isBinary) =>
      runPeerHandler(
        this.log,
        'a page hello',
        () => {
          clearTimeout(helloTimer);
          const m = isBinary ? undefined : parseMessage(data.toString());
          if (!m || m.type !== 'hello') return ws.close(CLOSE_POLICY, 'expected hello');
          if (m.protocol !== PROTOCOL_VERSION) {
            ws.send(
              JSON.stringify({
                type: 'bye',
                reason: `protocol ${m.protocol} is not supported; this companion speaks ${PROTOCOL_VERSION}. Update Loupe or reload the page.`,
              }),
            );
            return ws.close(CLOSE_POLICY, 'protocol mismatch');
          }
          // A reload of the same tab: the old page instance is gone now, even if its socket has not
          // closed yet. Failing its calls here is what makes "reload mid-call" fail within a second.
          for (const old of this.pages.filter((p) => p.tabId === m.tab_id)) old.close('the page was reloaded');
          const session = new PageConnection(ws, m, {
            heartbeatMs: this.opts.heartbeatMs,
            missedBeats: this.opts.missedBeats,
            log: this.log,
            onGone: (s) => {
              this.pages = this.pages.filter((p) => p !== s);
              this.log(`page ${s.tabId}/${s.instanceId} disconnected`);
            },
          });
          this.pages.push(session);
          this.log(`page ${m.tab_id}/${m.instance_id} paired`);
          session.send({
            type: 'welcome',
            protocol: PROTOCOL_VERSION,
            hub: { version: this.opts.version, port: this.port },
            agents: this.agentList(),
          });
          for (const w of [...this.waiters]) w();
        },
        () => ws.terminate(),
      ),
    );
  }

  /**
   * @param challenge the nonce of a companion that did not send the token: prove the token over
   *   it, and accept nothing from the peer until its `attach` proves the token over ours
   */
  private acceptAgent(ws: WebSocket, challenge?: string, authenticated?: () => void): void {
    const calls = new Map<string, AbortController>();
    const send = (m: HubToAgent) => ws.readyState === ws.OPEN && ws.send(JSON.stringify(m));
    let ourNonce: string | undefined;
    if (challenge) {
      ourNonce = randomBytes(32).toString('hex');
      send({ type: 'challenge', proof: hubProof(this.token, challenge), nonce: ourNonce });
      const authTimer = setTimeout(() => ourNonce && ws.close(CLOSE_POLICY, 'no proof'), this.opts.helloTimeoutMs);
      ws.once('close', () => clearTimeout(authTimer));
    }
    const beat = startHeartbeat({
      intervalMs: this.opts.heartbeatMs,
      silenceMs: this.opts.heartbeatMs * this.opts.missedBeats,
      ping: () => send({ type: 'ping', t: Date.now() }),
      onSilent: () => ws.terminate(),
    });
    ws.on('error', () => ws.terminate());
    ws.on('close', () => {
      beat.stop();
      for (const c of calls.values()) c.abort();
      this.agents.delete(ws);
      this.broadcastAgents();
    });
    ws.on('message', (data, isBinary) =>
      runPeerHandler(
        this.log,
        'an agent message',
        () => {
          beat.heard();
          const m = isBinary ? undefined : parseMessage(data.toString());
          if (ourNonce) {
            // Unauthenticated: the first message must be an attach that proves the token.
            if (m?.type !== 'attach' || !proofsEqual(m.proof, agentProof(this.token, ourNonce)))
              return ws.close(CLOSE_POLICY, 'authentication failed');
            ourNonce = undefined;
            authenticated?.();
          }
          if (!m) return;
          if (m.type === 'ping') return send({ type: 'pong', t: m.t });
          if (m.type === 'attach') {
            if (m.protocol !== PROTOCOL_VERSION) {
              send({
                type: 'bye',
                reason: `protocol ${m.protocol} is not supported; the hub speaks ${PROTOCOL_VERSION}`,
              });
              return ws.close(CLOSE_POLICY, 'protocol mismatch');
            }
            this.agents.set(ws, {
              name: String(m.agent.name).slice(0, 100),
              ...(m.agent.version ? { version: String(m.agent.version).slice(0, 50) } : {}),
            });
            send({
              type: 'welcome',
              protocol: PROTOCOL_VERSION,
              hub: { version: this.opts.version, port: this.port },
              agents: this.agentList(),
            });
            return this.broadcastAgents();
          }
          if (!this.agents.has(ws)) return ws.close(CLOSE_POLICY, 'expected attach');
          if (m.type === 'cancel') return calls.get(m.id)?.abort();
          if (m.type !== 'call' || calls.has(m.id)) return;
          if (m.tool === HUB_STATUS_TOOL) return send({ type: 'result', id: m.id, document: this.status() });
          const ctl = new AbortController();
          calls.set(m.id, ctl);
          this.execute(m.tool, m.args, {
            deadline: m.deadline,
            agent: this.agents.get(ws),
            signal: ctl.signal,
            onProgress: (p) => send({ type: 'progress', id: m.id, ...p }),
          })
            .then(
              (r) =>
                send({
                  type: 'result',
                  id: m.id,
                  document: r.document,
                  ...(r.link ? { link: r.link } : {}),
                  ...(r.instance_id ? { instance_id: r.instance_id } : {}),
                  ...(r.model ? { model: r.model } : {}),
                }),
              (e) => {
                const err = toLoupeError(e);
                send({
                  type: 'error',
                  id: m.id,
                  error: { code: err.code, message: err.message, ...(err.hint ? { hint: err.hint } : {}) },
                });
              },
            )
            .finally(() => calls.delete(m.id));
        },
        () => ws.terminate(),
      ),
    );
  }

  private agentList(): AgentInfo[] {
    return [...(this.localAgent ? [this.localAgent] : []), ...this.agents.values()];
  }

  private broadcastAgents(): void {
    const agents = this.agentList();
    for (const p of this.pages) p.send({ type: 'agents', agents });
  }
}
