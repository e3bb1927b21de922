/**
 * A forwarding client: how a second `loupe mcp` uses a hub that another companion already runs
 * on the port. It authenticates by challenge–response over the token (never sending it), with
 * the hub's own Origin and a loopback Host, and sends the same `call` messages a hub sends a page; the hub runs them on
 * its paired page and streams progress and the result back.
 */
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import WebSocket from 'ws';
import { LoupeError } from '../engine/errors';
import { randomHex } from '../ops/lib/handles';
import { startHeartbeat, type Heartbeat } from './heartbeat';
import { PendingCalls } from './pending-calls';
import { callCancelled } from './call-errors';
import { execResult, type CallOptions, type ExecResult } from './page-connection';
import {
  AGENT_PATH,
  CHALLENGE_PROTOCOL_PREFIX,
  HUB_PROBE_PATH,
  HUB_STATUS_TOOL,
  PROTOCOL_VERSION,
  SUBPROTOCOL,
  parseMessage,
  type AgentInfo,
  type HubToAgent,
} from './protocol';
import { agentProof, hubProof, proofsEqual } from './token';

/** Is a Loupe hub listening on this port? (An unauthenticated GET that carries no secret.) */
export function probeHub(
  port: number,
  timeoutMs = 1500,
): Promise<{ pid: number; protocol: number; version: string } | undefined> {
  return new Promise((resolve) => {
    const req = http.get(
      { host: '127.0.0.1', port, path: HUB_PROBE_PATH, headers: { Host: `127.0.0.1:${port}` }, timeout: timeoutMs },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (c) => (body += c.length + body.length < 4096 ? c : ''));
        res.on('end', () => {
          try {
            const j = JSON.parse(body);
            resolve(res.statusCode === 200 && j?.service === 'loupe-hub' ? j : undefined);
          } catch {
            resolve(undefined);
          }
        });
      },
    );
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(undefined));
  });
}

export class ForwardClient {
  private pending = new PendingCalls<ExecResult>();
  private closed = false;
  private beat: Heartbeat;
  onClose?: () => void;

  private constructor(
    private ws: WebSocket,
    readonly port: number,
    heartbeatMs: number,
  ) {
    ws.on('message', (d, isBinary) => {
      try {
        this.onMessage(isBinary ? '' : d.toString());
      } catch {
        // Catch-all: a hub message that breaks its handler ends this link (calls fail PAGE_GONE), not the process.
        ws.terminate();
        this.shutdown();
      }
    });
    ws.on('close', () => this.shutdown());
    ws.on('error', () => this.shutdown());
    this.beat = startHeartbeat({
      intervalMs: heartbeatMs,
      silenceMs: heartbeatMs * 3,
      ping: () => this.send({ type: 'ping', t: Date.now() }),
      onSilent: () => ws.terminate(),
    });
  }

  /**
   * Attach to the hub on `port` whose token (from its file) is `token`. The token is never sent:
   * the hub must first prove it holds it (challenge–response, protocol.ts), so a program that
   * took the port after the hub died gets nothing from a stale token file.
   */
  static connect(
    port: number,
    token: string,
    agent: AgentInfo,
    opts: { heartbeatMs?: number; timeoutMs?: number } = {},
  ): Promise<ForwardClient> {
    return new Promise((resolve, reject) => {
      const nonce = randomBytes(32).toString('hex');
      const ws = new WebSocket(
        `ws://127.0.0.1:${port}${AGENT_PATH}`,
        [SUBPROTOCOL, CHALLENGE_PROTOCOL_PREFIX + nonce],
        {
          origin: `http://127.0.0.1:${port}`,
          maxPayload: 256 * 1024 * 1024,
          handshakeTimeout: opts.timeoutMs ?? 3000,
        },
      );
      let settled = false;
      const fail = (e: Error) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        ws.terminate();
        reject(new LoupeError('NO_PAGE', `Could not attach to the Loupe hub on port ${port}: ${e.message}`));
      };
      const timer = setTimeout(() => fail(new Error('it did not answer in time')), (opts.timeoutMs ?? 3000) * 2);
      ws.on('error', fail);
      ws.once('unexpected-response', (_req, res) =>
        fail(new Error(`the hub refused (HTTP ${res.statusCode}); its token file may be stale`)),
      );
      ws.once('open', () => {
        ws.once('message', (d) => {
          const c = parseMessage(d.toString());
          if (c?.type !== 'challenge' || !proofsEqual(c.proof, hubProof(token, nonce))) {
            return fail(
              new Error(
                'the program on that port could not prove it holds the token in the hub file (not the hub that wrote it); nothing was sent to it',
              ),
            );
          }
          ws.send(
            JSON.stringify({ type: 'attach', protocol: PROTOCOL_VERSION, agent, proof: agentProof(token, c.nonce) }),
          );
          ws.once('message', (d2) => {
            const m = parseMessage(d2.toString());
            if (m?.type !== 'welcome')
              return fail(new Error(`it did not accept this companion${m?.type === 'bye' ? `: ${m.reason}` : ''}`));
            if (settled) return;
            settled = true;
            clearTimeout(timer);
            ws.off('error', fail);
            resolve(new ForwardClient(ws, port, opts.heartbeatMs ?? 5000));
          });
        });
      });
    });
  }

  /** Tell the hub who this companion serves (the MCP client's name arrives after attaching). */
  setAgent(agent: AgentInfo): void {
    this.send({ type: 'attach', protocol: PROTOCOL_VERSION, agent });
  }

  get alive(): boolean {
    return !this.closed;
  }

  status(): Promise<Record<string, unknown>> {
    return this.call(HUB_STATUS_TOOL, {}, { deadline: Date.now() + 5000 }).then(
      (r) => r.document as Record<string, unknown>,
    );
  }

  call(tool: string, args: Record<string, unknown>, o: CallOptions): Promise<ExecResult> {
    if (this.closed) return Promise.reject(hubGone());
    const id = 'f' + randomHex(8);
    const done = this.pending.open(id, {
      // The hub enforces the deadline; this local timer is the backstop if the hub goes silent.
      timeoutMs: Math.max(0, o.deadline - Date.now()) + 2000,
      signal: o.signal,
      onProgress: o.onProgress,
      onDeadline: () => new LoupeError('DEADLINE_EXCEEDED', `${tool} did not finish within its deadline.`),
      onCancel: () => {
        this.send({ type: 'cancel', id });
        return callCancelled();
      },
    });
    this.send({ type: 'call', id, tool, args, deadline: o.deadline });
    return done;
  }

  close(): void {
    this.ws.close();
    this.shutdown();
  }

  private send(m: object): void {
    if (this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(m));
  }

  private onMessage(text: string): void {
    this.beat.heard();
    const m = parseMessage(text) as HubToAgent | undefined;
    if (!m) return;
    switch (m.type) {
      case 'ping':
        return this.send({ type: 'pong', t: m.t });
      case 'welcome':
        return; // the answer to a repeated attach (setAgent)
      case 'progress':
      case 'result':
      case 'error':
        // the hub filled in the page's instance and model
        return this.pending.reply(m, (r) => execResult(r, r.instance_id, r.model));
      default:
        return;
    }
  }

  private shutdown(): void {
    if (this.closed) return;
    this.closed = true;
    this.beat.stop();
    this.pending.failAll(hubGone());
    this.onClose?.();
  }
}

function hubGone(): LoupeError {
  return new LoupeError(
    'PAGE_GONE',
    'The Loupe hub this companion was sharing went away (its companion exited).',
    'Call loupe_status: this companion takes the hub over and prints a new pairing URL; the page must be paired again.',
  );
}
