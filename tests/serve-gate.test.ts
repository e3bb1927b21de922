/**
 * `loupe serve`'s gates (src/serve/gate.ts, server.ts): what is refused before an upgrade — not
 * loopback, a foreign Host, a missing or foreign Origin, no token or a wrong one — each on its own
 * and against a live server, and what a connection that passed may still not do (walk the API
 * object, flood frames). The engine behind the live server is a stub: the gates are the subject.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import http from 'node:http';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as Comlink from 'comlink';
import { checkEngineUpgrade, normalOrigin } from '../src/serve/gate';
import { MAX_CONNECTIONS, startEngineServer, type EngineServer } from '../src/serve/server';
import { connectEngine } from '../src/serve/client';
import { TOKEN_PROTOCOL_PREFIX } from '../src/bridge/protocol';
import { ENGINE_PATH, ENGINE_SUBPROTOCOL } from '../src/share/wire';
import { parseServeArgs } from '../src/serve/main';
import type { EngineWorkerApi } from '../workers/protocol';

const TOKEN = 'a'.repeat(64);
const PORT = 5179;
const good = () => ({
  url: ENGINE_PATH,
  socket: { remoteAddress: '127.0.0.1' },
  headers: {
    host: `127.0.0.1:${PORT}`,
    origin: `http://127.0.0.1:${PORT}`,
    'sec-websocket-protocol': `${ENGINE_SUBPROTOCOL}, ${TOKEN_PROTOCOL_PREFIX}${TOKEN}`,
  } as Record<string, string | undefined>,
});
const check = (r: ReturnType<typeof good>, origins: string[] = []) =>
  checkEngineUpgrade(r, { port: PORT, token: TOKEN, origins });

describe('checkEngineUpgrade', () => {
  it('passes the server’s own origin with the token', () => {
    expect(check(good())).toEqual({ ok: true });
  });
  it('refuses a peer not on loopback', () => {
    const r = good();
    r.socket.remoteAddress = '10.0.0.2';
    expect(check(r)).toMatchObject({ ok: false, status: 403, reason: 'not from loopback' });
  });
  it('refuses a non-loopback Host (DNS rebinding)', () => {
    const r = good();
    r.headers.host = `evil.example:${PORT}`;
    expect(check(r)).toMatchObject({ ok: false, status: 403 });
    r.headers.host = `127.0.0.1:${PORT + 1}`;
    expect(check(r)).toMatchObject({ ok: false, status: 403 });
  });
  it('refuses a missing, "null" or foreign Origin; takes an exact --origin', () => {
    const r = good();
    delete r.headers.origin;
    expect(check(r)).toMatchObject({ ok: false, status: 403, reason: 'missing Origin header' });
    r.headers.origin = 'null';
    expect(check(r)).toMatchObject({ ok: false, status: 403 });
    r.headers.origin = 'http://127.0.0.1:5178';
    expect(check(r)).toMatchObject({ ok: false, status: 403 });
    expect(check(r, ['http://127.0.0.1:5178'])).toEqual({ ok: true });
    r.headers.origin = 'http://127.0.0.1:51780';
    expect(check(r, ['http://127.0.0.1:5178'])).toMatchObject({ ok: false, status: 403 });
  });
  it('refuses no token, a wrong one, two, and a missing subprotocol', () => {
    const r = good();
    r.headers['sec-websocket-protocol'] = ENGINE_SUBPROTOCOL;
    expect(check(r)).toMatchObject({ ok: false, status: 401, reason: 'missing pairing token' });
    r.headers['sec-websocket-protocol'] = `${ENGINE_SUBPROTOCOL}, ${TOKEN_PROTOCOL_PREFIX}${'b'.repeat(64)}`;
    expect(check(r)).toMatchObject({ ok: false, status: 401, reason: 'wrong pairing token' });
    r.headers['sec-websocket-protocol'] =
      `${ENGINE_SUBPROTOCOL}, ${TOKEN_PROTOCOL_PREFIX}${TOKEN}, ${TOKEN_PROTOCOL_PREFIX}${'b'.repeat(64)}`;
    expect(check(r)).toMatchObject({ ok: false, status: 401 });
    r.headers['sec-websocket-protocol'] = `loupe.v1, ${TOKEN_PROTOCOL_PREFIX}${TOKEN}`;
    expect(check(r)).toMatchObject({ ok: false, status: 400 });
  });
  it('refuses another path', () => {
    const r = good();
    r.url = '/ws/page';
    expect(check(r)).toMatchObject({ ok: false, status: 404 });
  });
  it('reads --origin, --backend and --port strictly', () => {
    expect(normalOrigin('http://127.0.0.1:5178/')).toBe('http://127.0.0.1:5178');
    expect(normalOrigin('http://127.0.0.1:5178/app')).toBeNull();
    expect(normalOrigin('file:///x')).toBeNull();
    expect(parseServeArgs(['--backend', 'cpu', '--port=0', '--origin', 'https://a.example'])).toMatchObject({
      backend: 'node',
      port: 0,
      origins: ['https://a.example'],
    });
    expect(() => parseServeArgs(['--backend', 'cuda'])).toThrow(/--backend/);
    expect(() => parseServeArgs(['--origin', 'not a url'])).toThrow(/--origin/);
    expect(() => parseServeArgs(['--port', '70000'])).toThrow(/--port/);
  });
});

describe('a live loupe serve listener', () => {
  let server: EngineServer;
  const cancelled: string[] = [];
  let release: () => void = () => {};
  const held = new Map<string, () => void>();
  const api = {
    async ping() {
      return 'pong' as const;
    },
    async runOperation(jobId: string, _name: string, input: unknown, onProgress: (p: unknown) => void) {
      await onProgress({ stage: 'x', done: 1, total: 2 });
      if ((input as { hold?: boolean }).hold) await new Promise<void>((r) => (held.set(jobId, r), (release = r)));
      return { input, nan: NaN, f32: new Float32Array([1.5, -Infinity]) };
    },
    async cancel(jobId: string) {
      cancelled.push(jobId);
      (held.get(jobId) ?? release)();
      return true;
    },
  } as unknown as EngineWorkerApi;

  const dist = mkdtempSync(path.join(tmpdir(), 'loupe-serve-dist-'));
  beforeAll(async () => {
    writeFileSync(path.join(dist, 'index.html'), '<!doctype html><title>page</title>');
    server = await startEngineServer({ api, port: 0, token: TOKEN, frameRate: 50, frameBurst: 60, dist });
  });
  afterAll(async () => {
    await server.close();
    rmSync(dist, { recursive: true, force: true });
  });

  it('serves the built page at / (isolated), and nothing under a foreign Host', async () => {
    const get = (host: string) =>
      new Promise<{ status: number; coop?: string; body: string }>((resolve, reject) => {
        const req = http.get({ host: '127.0.0.1', port: server.port, path: '/', headers: { host } }, (res) => {
          let body = '';
          res.on('data', (d) => (body += d));
          res.on('end', () =>
            resolve({ status: res.statusCode ?? 0, coop: res.headers['cross-origin-opener-policy'] as string, body }),
          );
        });
        req.on('error', reject);
      });
    const ok = await get(`127.0.0.1:${server.port}`);
    expect(ok.status).toBe(200);
    expect(ok.coop).toBe('same-origin');
    expect(ok.body).toContain('<title>page</title>');
    expect((await get(`evil.example:${server.port}`)).status).toBe(403);
  });

  /** the HTTP status an upgrade gets (101 when it is taken) */
  const status = (protocols: string[], headers: Record<string, string> = {}, origin?: string) =>
    new Promise<number>((resolve) => {
      const ws = new WebSocket(`ws://127.0.0.1:${server.port}${ENGINE_PATH}`, protocols, {
        ...(origin === undefined ? {} : { origin }),
        headers,
      });
      ws.on('open', () => (ws.close(), resolve(101)));
      ws.on('unexpected-response', (_q, res) => (resolve(res.statusCode ?? 0), ws.terminate()));
      ws.on('error', () => resolve(-1));
    });
  const own = () => `http://127.0.0.1:${server.port}`;

  it('upgrades the right peer and refuses each wrong one with its status', async () => {
    expect(await status([ENGINE_SUBPROTOCOL, TOKEN_PROTOCOL_PREFIX + TOKEN], {}, own())).toBe(101);
    expect(await status([ENGINE_SUBPROTOCOL], {}, own())).toBe(401);
    expect(await status([ENGINE_SUBPROTOCOL, TOKEN_PROTOCOL_PREFIX + 'c'.repeat(64)], {}, own())).toBe(401);
    expect(await status([ENGINE_SUBPROTOCOL, TOKEN_PROTOCOL_PREFIX + TOKEN], {}, 'https://evil.example')).toBe(403);
    expect(await status([ENGINE_SUBPROTOCOL, TOKEN_PROTOCOL_PREFIX + TOKEN])).toBe(403); // no Origin
    expect(
      await status([ENGINE_SUBPROTOCOL, TOKEN_PROTOCOL_PREFIX + TOKEN], { host: `evil.example:${server.port}` }, own()),
    ).toBe(403);
  });

  it('carries calls, callbacks and the codec’s values; refuses anything but a method call', async () => {
    const c = await connectEngine(`ws://127.0.0.1:${server.port}${ENGINE_PATH}#token=${TOKEN}`, TOKEN);
    try {
      expect(await c.api.ping()).toBe('pong');
      const seen: unknown[] = [];
      const doc = (await c.api.runOperation(
        'j1',
        'trace',
        { a: undefined, b: [1, NaN] },
        Comlink.proxy((p) => void seen.push(p)),
      )) as any;
      expect(seen).toEqual([{ stage: 'x', done: 1, total: 2 }]);
      expect(doc.nan).toBeNaN();
      expect(doc.f32).toBeInstanceOf(Float32Array);
      expect([...doc.f32]).toEqual([1.5, -Infinity]);
      expect('a' in doc.input && doc.input.a === undefined).toBe(true);
      // a property read, a write, a path into the object: refused as a structured error
      await expect((c.api as any).constructor).rejects.toMatchObject({ error: { code: 'BAD_INPUT' } });
      await expect((c.api as any).ping.call).rejects.toMatchObject({ error: { code: 'BAD_INPUT' } });
      await expect((c.api as any).nothing()).rejects.toMatchObject({ error: { code: 'BAD_INPUT' } });
      expect(await c.api.ping()).toBe('pong'); // the connection lives on
    } finally {
      c.close();
    }
  });

  it('cancels the jobs of a connection that closes', async () => {
    const c = await connectEngine(`ws://127.0.0.1:${server.port}${ENGINE_PATH}`, TOKEN);
    const held = c.api.runOperation(
      'held-1',
      'x',
      { hold: true },
      Comlink.proxy(() => {}),
    );
    held.catch(() => {});
    await new Promise((r) => setTimeout(r, 100));
    c.endpoint.terminate();
    await expect.poll(() => cancelled.some((id) => id.endsWith(':held-1'))).toBe(true);
  });

  it('keeps each connection’s jobs its own: another’s cancel is NOT_FOUND, the same id never meets', async () => {
    const url = `ws://127.0.0.1:${server.port}${ENGINE_PATH}`;
    const a = await connectEngine(url, TOKEN);
    const b = await connectEngine(url, TOKEN);
    try {
      const held = a.api.runOperation(
        'shared-id',
        'x',
        { hold: true },
        Comlink.proxy(() => {}),
      );
      held.catch(() => {});
      await new Promise((r) => setTimeout(r, 50));
      await expect(b.api.cancel('shared-id')).rejects.toMatchObject({ error: { code: 'NOT_FOUND' } });
      expect(cancelled).not.toContain('shared-id');
      // b's own job of the same id runs beside a's, and b cancels only its own
      const mine = b.api.runOperation(
        'shared-id',
        'x',
        { v: 2 },
        Comlink.proxy(() => {}),
      );
      expect(((await mine) as any).input).toEqual({ v: 2 });
      expect(await a.api.cancel('shared-id')).toBe(true);
      expect(cancelled.filter((id) => id.endsWith(':shared-id'))).toHaveLength(1);
      await expect(a.api.cancel('shared-id')).rejects.toMatchObject({ error: { code: 'NOT_FOUND' } });
    } finally {
      a.close();
      b.close();
    }
  });

  it('closes a connection that floods frames', async () => {
    const ws = new WebSocket(
      `ws://127.0.0.1:${server.port}${ENGINE_PATH}`,
      [ENGINE_SUBPROTOCOL, TOKEN_PROTOCOL_PREFIX + TOKEN],
      {
        origin: own(),
      },
    );
    await new Promise((r) => ws.on('open', r));
    const closed = new Promise<number>((r) => ws.on('close', (code) => r(code)));
    for (let i = 0; i < 200; i++) ws.send(JSON.stringify({ c: 'p1', m: null }));
    expect(await closed).toBe(1008);
  });
});

describe('loupe serve’s connections: idle ones make room, silent ones are closed', () => {
  const api = {
    async ping() {
      return 'pong' as const;
    },
  } as unknown as EngineWorkerApi;
  const open = (port: number, o: WebSocket.ClientOptions = {}) =>
    new Promise<WebSocket>((resolve, reject) => {
      const ws = new WebSocket(
        `ws://127.0.0.1:${port}${ENGINE_PATH}`,
        [ENGINE_SUBPROTOCOL, TOKEN_PROTOCOL_PREFIX + TOKEN],
        {
          origin: `http://127.0.0.1:${port}`,
          ...o,
        },
      );
      ws.once('open', () => resolve(ws));
      ws.once('unexpected-response', (_q, res) => reject(new Error(`HTTP ${res.statusCode}`)));
    });

  it('closes the connection idle longest when all are taken, and refuses (503) while none is idle', async () => {
    const log: string[] = [];
    const server = await startEngineServer({ api, port: 0, token: TOKEN, idleEvictMs: 1000, log: (m) => log.push(m) });
    try {
      const first = await open(server.port);
      const closed = new Promise<number>((r) => first.on('close', (c) => r(c)));
      const rest = [];
      for (let i = 1; i < MAX_CONNECTIONS; i++) rest.push(await open(server.port));
      const talk = async (to: WebSocket[]) => {
        for (const ws of to) ws.send(JSON.stringify({ m: null })); // a frame: not idle
        await new Promise((r) => setTimeout(r, 50));
      };
      await talk([first, ...rest]);
      await expect(open(server.port)).rejects.toThrow(/HTTP 503/); // none idle
      await new Promise((r) => setTimeout(r, 1000));
      await talk(rest);
      const late = await open(server.port);
      expect(await closed).toBe(1001);
      expect(log.join('\n')).toMatch(/closed a connection idle \d+ s to make room/);
      expect(server.connections()).toBe(MAX_CONNECTIONS);
      for (const ws of [...rest, late]) ws.close();
    } finally {
      await server.close();
    }
  });

  it('closes a peer that stops answering pings', async () => {
    const server = await startEngineServer({ api, port: 0, token: TOKEN, pingMs: 100 });
    try {
      const silent = await open(server.port, { autoPong: false });
      const answering = await open(server.port);
      const code = await new Promise<number>((r) => silent.on('close', (c) => r(c)));
      expect(code).toBe(1006); // terminated
      expect(answering.readyState).toBe(WebSocket.OPEN);
      answering.close();
    } finally {
      await server.close();
    }
  }, 10_000);
});
