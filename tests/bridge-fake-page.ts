/**
 * Test helpers for the bridge: a fake page (a `ws` client speaking the app protocol exactly as
 * src/ui/bridge-client.ts does, but driven step by step by the test), a raw upgrade probe, and
 * a throwaway hub.
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import WebSocket from 'ws';
import { Hub, type HubOptions } from '../src/bridge/hub';
import { newInstanceId } from '../src/ops/lib/handles';
import {
  PAGE_PATH,
  PROTOCOL_VERSION,
  SUBPROTOCOL,
  parseMessage,
  tokenProtocol,
  type AnyMsg,
  type CallMsg,
  type WireModel,
} from '../src/bridge/protocol';
import { newToken } from '../src/bridge/token';

export function tmpDist(): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'loupe-dist-'));
  writeFileSync(path.join(dir, 'index.html'), '<!doctype html><title>Loupe test page</title>');
  return dir;
}

export async function startTestHub(o: Partial<HubOptions> = {}): Promise<Hub> {
  return Hub.start({
    port: 0,
    token: newToken(),
    distDir: tmpDist(),
    version: 'test',
    heartbeatMs: 5000,
    noPageWaitMs: 200,
    ...o,
  });
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Poll until pred() is truthy (or fail after ms). */
export async function until<T>(pred: () => T | undefined | false | null, ms = 3000, what = 'condition'): Promise<T> {
  const t0 = Date.now();
  for (;;) {
    const v = pred();
    if (v) return v;
    if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

/** Like until, for an async probe. */
export async function poll<T>(
  probe: () => Promise<T | undefined | false | null>,
  ms = 5000,
  what = 'condition',
  everyMs = 50,
): Promise<T> {
  const t0 = Date.now();
  for (;;) {
    const v = await probe();
    if (v) return v;
    if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}`);
    await sleep(everyMs);
  }
}

export interface FakePageOptions {
  token: string;
  tabId?: string;
  instanceId?: string;
  model?: WireModel;
  origin?: string;
  host?: string;
}

/** A fake page: records calls and cancels; the test answers them. Answers pings unless `hung`. */
export class FakePage {
  readonly calls: CallMsg[] = [];
  readonly cancels: string[] = [];
  readonly messages: AnyMsg[] = [];
  hung = false;
  /** set to answer calls automatically */
  onCall?: (m: CallMsg, page: FakePage) => void;
  readonly tabId: string;
  readonly instanceId: string;

  private constructor(
    readonly ws: WebSocket,
    tabId: string,
    instanceId: string,
  ) {
    this.tabId = tabId;
    this.instanceId = instanceId;
    ws.on('message', (d) => {
      const m = parseMessage(d.toString());
      if (!m) return;
      this.messages.push(m);
      if (m.type === 'ping' && !this.hung) this.send({ type: 'pong', t: m.t });
      if (m.type === 'call') {
        this.calls.push(m);
        this.onCall?.(m, this);
      }
      if (m.type === 'cancel') this.cancels.push(m.id);
    });
  }

  static connect(port: number, o: FakePageOptions): Promise<FakePage> {
    const tabId = o.tabId ?? 'tab-' + newInstanceId();
    const instanceId = o.instanceId ?? newInstanceId();
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(`ws://127.0.0.1:${port}${PAGE_PATH}`, [SUBPROTOCOL, tokenProtocol(o.token)], {
        origin: o.origin ?? `http://127.0.0.1:${port}`,
        headers: o.host ? { Host: o.host } : undefined,
      });
      ws.once('error', reject);
      ws.once('open', () => {
        ws.send(
          JSON.stringify({
            type: 'hello',
            protocol: PROTOCOL_VERSION,
            tab_id: tabId,
            instance_id: instanceId,
            model: o.model ?? null,
          }),
        );
        ws.once('message', (d) => {
          const m = parseMessage(d.toString());
          if (m?.type === 'welcome') resolve(new FakePage(ws, tabId, instanceId));
          else reject(new Error(`expected welcome, got ${d.toString()}`));
        });
      });
    });
  }

  send(m: object): void {
    this.ws.send(JSON.stringify(m));
  }

  progress(id: string, done: number, total: number, stage = 'working'): void {
    this.send({ type: 'progress', id, done, total, stage });
  }

  result(id: string, document: unknown, link?: string): void {
    this.send({ type: 'result', id, document, ...(link ? { link } : {}) });
  }

  error(id: string, code: string, message: string, hint?: string): void {
    this.send({ type: 'error', id, error: { code, message, ...(hint ? { hint } : {}) } });
  }

  waitCall(n = 1, ms = 3000): Promise<CallMsg> {
    return until(() => this.calls[n - 1], ms, `call #${n}`);
  }

  close(): Promise<void> {
    return new Promise((r) => {
      if (this.ws.readyState === WebSocket.CLOSED) return r();
      this.ws.once('close', () => r());
      this.ws.close();
    });
  }
}

/**
 * Attempt a WebSocket upgrade with exactly these headers (raw HTTP, so Host and Origin can be
 * anything) and report the HTTP status: 101 = upgraded, else the refusal.
 */
export function tryUpgrade(
  port: number,
  headers: Record<string, string | undefined>,
  pathname = PAGE_PATH,
): Promise<number> {
  return new Promise((resolve, reject) => {
    const h: Record<string, string> = {
      Connection: 'Upgrade',
      Upgrade: 'websocket',
      'Sec-WebSocket-Version': '13',
      'Sec-WebSocket-Key': randomBytes(16).toString('base64'),
    };
    for (const [k, v] of Object.entries(headers)) if (v !== undefined) h[k] = v;
    const req = http.request({ host: '127.0.0.1', port, path: pathname, headers: h, setHost: !('Host' in headers) });
    req.on('upgrade', (_res, socket) => {
      socket.destroy();
      resolve(101);
    });
    req.on('response', (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.on('error', reject);
    req.end();
  });
}

/** The first text block of a tool result. */
export function text(r: unknown): string {
  return (r as { content: { type: string; text?: string }[] }).content[0].text!;
}

/** The error document of an isError tool result (fails the test if it is not one). */
export function errorOf(r: unknown): { code: string; message: string; hint?: string } {
  if ((r as { isError?: boolean }).isError !== true)
    throw new Error(`expected an isError result, got ${JSON.stringify(r).slice(0, 300)}`);
  return JSON.parse(text(r)).error;
}
