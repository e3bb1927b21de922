/**
 * Hostile frames past the gates (issue 39, F1–F4), against the real processes: `loupe serve` (a
 * child process) gets malformed comlink messages on its main channel and on a relayed callback
 * channel, a frame of relayed-port tags and number tags that name prototype members; `loupe mcp
 * --engine` (a child process) gets the same shapes from a fake engine on its progress channel and
 * its main channel. After each, the process is alive and answers the next call; serve's peak
 * memory over the port-tag bomb is read from /proc and bounded.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket, { WebSocketServer } from 'ws';
import { TOKEN_PROTOCOL_PREFIX } from '../src/bridge/protocol';
import { LoupeError } from '../src/engine/errors';
import { decode, encode, ENGINE_SUBPROTOCOL } from '../src/share/wire';
import { InMemoryTransport } from '@modelcontextprotocol/client';
import { z } from 'zod';
import { createMcpServer } from '../src/bridge/mcp-server';
import type { Executor } from '../src/bridge/executor';
import type { Operation } from '../src/ops/types';
import { createEngineApi } from '../workers/engine-api';
import { nodeEngineHost } from '../src/serve/node-host';
import { NO_LOCAL } from '../src/node/local-access';
import { allowHosts, checkUrlHost, guardedFetch } from '../src/node/net-access';
import { parseServeArgs } from '../src/serve/main';

const ROOT = path.resolve(__dirname, '..');
const BIN = path.join(ROOT, 'bin', 'loupe.mjs');
const configDir = mkdtempSync(path.join(tmpdir(), 'loupe-hostile-serve-'));
const env = { ...process.env, LOUPE_CONFIG_DIR: configDir, HF_ENDPOINT: 'http://127.0.0.1:9' };
afterAll(() => rmSync(configDir, { recursive: true, force: true }));

/** the malformed requests of F1 (and their variants): each answered with a thrown BAD_INPUT */
const BAD_REQUESTS: Record<string, unknown>[] = [
  { type: 'APPLY', argumentList: [null] },
  { type: 'APPLY', argumentList: 'abc' },
  { type: 'APPLY', argumentList: {} },
  { type: 'APPLY', argumentList: [{ '~': 'u' }] },
  { type: 'APPLY', argumentList: [{ type: 'HANDLER', name: 'nope', value: 1 }] },
  { type: 'APPLY', argumentList: [{ type: 'HANDLER', name: 'throw', value: { isError: true, value: null } }] },
  { type: 'APPLY', argumentList: [{ type: 'HANDLER', name: 'proxy', value: 1 }] },
  { type: 'APPLY', argumentList: [{ type: 'HANDLER', name: 'proxy' }] },
  { type: 'APPLY', argumentList: [{ type: 'HANDLER', name: '__proto__', value: 1 }] },
  { type: 'APPLY', argumentList: [{ type: 'RAW', value: { '~': 'p', id: 'p900' } }] }, // a port hidden in a value
  { type: 'APPLY', argumentList: Array.from({ length: 17 }, () => ({ type: 'RAW', value: 1 })) },
  { type: 'RELEASE', path: [], argumentList: 'abc' },
  { type: 'RELEASE', path: [], argumentList: [null] },
  { type: 'GET' },
  { type: 'SET', value: { type: 'RAW', value: 1 } },
  { type: 'CONSTRUCT', argumentList: [] },
  { type: 'ENDPOINT' },
  { type: 'RAW', value: 1 }, // an answer where a request belongs
  { type: 'APPLY', path: 'ping', argumentList: [] },
  { type: 'APPLY', path: [1], argumentList: [] },
];

/** a message comlink would ignore or cannot answer: nothing comes back, nothing breaks */
const UNANSWERED: unknown[] = [null, 0, 'x', [], {}, { id: {}, type: 'APPLY' }, { id: 'a b', type: 'APPLY' }];

function vmHwmMiB(pid: number): number {
  const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : NaN;
}

/** a raw peer of the engine's socket: frames out, frames in by id or channel */
class Peer {
  readonly frames: { c?: string; m: any }[] = [];
  closed: Promise<number>;
  private waiters: (() => void)[] = [];
  private constructor(readonly ws: WebSocket) {
    ws.on('message', (d) => {
      const f = JSON.parse(String(d));
      this.frames.push({ ...f, m: decode(f.m, { send: () => '', receive: () => new MessageChannel().port2 }) });
      for (const w of this.waiters.splice(0)) w();
    });
    this.closed = new Promise((r) => ws.on('close', (code) => r(code)));
  }
  static async open(port: number, token: string): Promise<Peer> {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/engine`, [ENGINE_SUBPROTOCOL, TOKEN_PROTOCOL_PREFIX + token], {
      origin: `http://127.0.0.1:${port}`,
      maxPayload: 256 * 1024 * 1024,
    });
    await new Promise((r, j) => (ws.once('open', r), ws.once('error', j)));
    return new Peer(ws);
  }
  send(m: unknown, c?: string): void {
    this.ws.send(JSON.stringify(c === undefined ? { m } : { c, m }));
  }
  sendRaw(text: string): void {
    this.ws.send(text);
  }
  /** the first frame that matches, waiting up to `ms` */
  async next(match: (f: { c?: string; m: any }) => boolean, ms = 10_000): Promise<{ c?: string; m: any }> {
    const end = Date.now() + ms;
    for (;;) {
      const i = this.frames.findIndex(match);
      if (i >= 0) return this.frames.splice(i, 1)[0];
      if (Date.now() > end) throw new Error(`no matching frame in ${ms} ms`);
      await new Promise<void>((r) => (this.waiters.push(r), setTimeout(r, 50)));
    }
  }
  async ping(id = `ping-${Math.random().toString(36).slice(2)}`): Promise<unknown> {
    this.send({ id, type: 'APPLY', path: ['ping'], argumentList: [] });
    return (await this.next((f) => f.c === undefined && f.m?.id === id)).m.value;
  }
  close(): void {
    this.ws.close();
  }
}

const RAN = new LoupeError('RUNTIME_ERROR', 'the fake engine ran it');
const ranError = (r: any) => JSON.parse(r.content[0].text).error;
const refusal = (f: { m: any }) => f.m?.type === 'HANDLER' && f.m.name === 'throw' && f.m.value?.value?.error?.code;

describe('loupe serve, past the gates (F1, F3, F4)', () => {
  let serve: ChildProcess;
  let port = 0;
  let token = '';
  let log = '';
  beforeAll(async () => {
    serve = spawn(process.execPath, [BIN, 'serve', '--port', '0'], {
      cwd: ROOT,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    serve.stderr!.on('data', (d) => (log += d));
    let out = '';
    const pairing = await new Promise<string>((resolve, reject) => {
      serve.stdout!.on('data', (d) => {
        out += d;
        const m = /pairing: (\S+)/.exec(out);
        if (m) resolve(m[1]);
      });
      serve.once('exit', (c) => reject(new Error(`loupe serve exited ${c}: ${out}${log}`)));
    });
    port = Number(new URL(pairing.replace(/^ws/, 'http')).port);
    token = pairing.split('#token=')[1];
  }, 30_000);
  afterAll(() => {
    if (serve.exitCode === null) serve.kill('SIGINT');
  });
  const alive = () => expect(serve.exitCode, log).toBeNull();

  it(`answers each of ${BAD_REQUESTS.length} malformed requests with BAD_INPUT and the next call with pong`, async () => {
    const p = await Peer.open(port, token);
    for (const [i, bad] of BAD_REQUESTS.entries()) {
      p.send({ path: ['ping'], ...bad, id: `bad-${i}` });
      const f = await p.next((x) => x.m?.id === `bad-${i}`);
      expect(refusal(f), JSON.stringify(bad)).toBe('BAD_INPUT');
      expect(await p.ping()).toBe('pong');
    }
    for (const m of UNANSWERED) p.send(m);
    p.sendRaw(JSON.stringify({ c: 'p77', m: { '~': 'p', id: 'p78' } })); // a channel that does not exist
    expect(await p.ping()).toBe('pong');
    expect(p.frames).toEqual([]); // nothing answered what had no id
    p.close();
    alive();
  }, 30_000);

  it('takes malformed answers on a relayed callback channel as failed callbacks, and loads on', async () => {
    const p = await Peer.open(port, token);
    const proxy = { type: 'HANDLER', name: 'proxy', value: { '~': 'p', id: 'p1' } };
    const bad = [
      (id: string) => ({ id, type: 'HANDLER', name: 'proxy', value: { '~': 'p', id: 'p2' } }),
      (id: string) => ({ id, type: 'HANDLER', name: 'nope', value: 1 }),
      (id: string) => ({ id, type: 'HANDLER', name: 'throw', value: { isError: true, value: null } }),
      (id: string) => ({ id, type: 'APPLY', path: ['constructor'], argumentList: [] }),
      (id: string) => ({ id, type: 'GET' }),
    ];
    p.send({
      id: 'load-1',
      type: 'APPLY',
      path: ['loadModel'],
      argumentList: [{ type: 'RAW', value: 'job-1' }, { type: 'RAW', value: { model: 'default' } }, proxy],
    });
    let answered = 0;
    for (;;) {
      const f = await p.next((x) => x.c === 'p1' || x.m?.id === 'load-1', 30_000);
      if (f.m?.id === 'load-1') {
        expect(f.m.type, JSON.stringify(f.m)).toBe('RAW');
        expect(f.m.value.info).toBeTruthy();
        break;
      }
      if (f.m?.type === 'APPLY') p.send(bad[answered++ % bad.length](f.m.id), 'p1');
    }
    expect(answered).toBeGreaterThan(0);
    expect(await p.ping()).toBe('pong');
    p.close();
    alive();
  }, 40_000);

  it('refuses a frame of relayed-port tags before making any port, and one of 20 M objects before parsing it', async () => {
    const before = vmHwmMiB(serve.pid!);
    const p = await Peer.open(port, token);
    const n = 1_200_000;
    const tags = Array.from({ length: n }, (_, i) => `{"~":"p","id":"p${i + 1}"}`).join(',');
    const text = `{"m":{"id":"bomb","type":"APPLY","path":["ping"],"argumentList":[${tags}]}}`;
    const t0 = Date.now();
    p.sendRaw(text);
    expect(await p.closed).toBe(1003);
    const ms = Date.now() - t0;
    expect(log).toMatch(/more than 8 MessagePorts in one frame/);
    // nine tags in a well-formed call: refused the same way
    const q = await Peer.open(port, token);
    q.send({
      id: 'nine',
      type: 'APPLY',
      path: ['ping'],
      argumentList: Array.from({ length: 9 }, (_, i) => ({
        type: 'HANDLER',
        name: 'proxy',
        value: { '~': 'p', id: `p${i + 1}` },
      })),
    });
    expect(await q.closed).toBe(1003);
    // 60 MiB of empty objects (20 M of them: 3.3 GB and 79 s to parse and copy before): refused unparsed
    const objects = await Peer.open(port, token);
    const t1 = Date.now();
    objects.sendRaw(`{"m":[${'{},'.repeat(20 * 1024 * 1024)}{}]}`);
    expect(await objects.closed).toBe(1003);
    const msObjects = Date.now() - t1;
    expect(log).toMatch(/more than 2000000 arrays and objects in one frame/);
    const r = await Peer.open(port, token);
    expect(await r.ping()).toBe('pong');
    r.close();
    alive();
    const peak = vmHwmMiB(serve.pid!);
    console.log(`60 MiB of {}: refused in ${msObjects} ms`);
    console.log(
      `port-tag bomb: ${(text.length / 1e6).toFixed(1)} MB frame refused in ${ms} ms; serve peak RSS ${before.toFixed(0)} → ${peak.toFixed(0)} MiB`,
    );
    expect(peak).toBeLessThan(1024);
  }, 30_000);

  it('refuses number tags that name prototype members (__proto__, constructor, toString, valueOf, hasOwnProperty)', async () => {
    for (const name of ['__proto__', 'constructor', 'toString', 'valueOf', 'hasOwnProperty']) {
      const p = await Peer.open(port, token);
      p.send({ id: 'n', type: 'APPLY', path: ['ping'], argumentList: [{ type: 'RAW', value: { '~': 'n', v: name } }] });
      expect(await p.closed).toBe(1003);
      expect(p.frames).toEqual([]);
    }
    expect(log).toMatch(/unknown number "hasOwnProperty"/);
    const r = await Peer.open(port, token);
    expect(await r.ping()).toBe('pong');
    r.close();
    alive();
  }, 20_000);
});

describe('loupe mcp --engine, against a hostile engine (F2)', () => {
  let engine: WebSocketServer;
  let httpServer: http.Server;
  let client: Client;
  let transport: StdioClientTransport;
  let stderr = '';
  /** what the fake engine heard back on the progress channel, by request id */
  const heard = new Map<string, any>();
  let mode: 'hostile-progress' | 'hostile-answer' | 'bomb' | 'plain' = 'hostile-progress';

  beforeAll(async () => {
    httpServer = http.createServer();
    engine = new WebSocketServer({ server: httpServer, handleProtocols: () => ENGINE_SUBPROTOCOL });
    engine.on('connection', (ws) => {
      const send = (m: unknown, c?: string) => ws.send(JSON.stringify(c === undefined ? { m } : { c, m }));
      const answer = (id: string, value: unknown) => send(encode({ id, type: 'RAW', value }));
      ws.on('message', async (d) => {
        const f = JSON.parse(String(d));
        if (f.c !== undefined) return void (f.m?.id && heard.set(f.m.id, f.m));
        const m = f.m;
        if (m?.type !== 'APPLY') return;
        const name = m.path[0];
        if (name === 'doctor') return answer(m.id, { model: 'fake-model' });
        if (name !== 'runOperation') return answer(m.id, name === 'cancel' ? true : undefined);
        const channel = m.argumentList[3].value.id as string;
        if (mode === 'hostile-progress') {
          // the port hidden in a value names one of the engine's channel ids here
          for (const [i, bad] of BAD_REQUESTS.entries())
            send({ path: [], ...JSON.parse(JSON.stringify(bad).replace('"p900"', '"e900"')), id: `bad-${i}` }, channel);
          for (const u of UNANSWERED) send(u, channel);
          send(
            {
              id: 'good',
              type: 'APPLY',
              path: [],
              argumentList: [{ type: 'RAW', value: { stage: 'x', done: 1, total: 2 } }],
            },
            channel,
          );
          const end = Date.now() + 10_000;
          while (!heard.has('good') && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
        }
        if (mode === 'bomb') return ws.send(`{"m":[${'{},'.repeat(20 * 1024 * 1024)}{}]}`);
        if (mode === 'hostile-answer')
          return send({ id: m.id, type: 'HANDLER', name: 'proxy', value: { '~': 'p', id: 'e1' } });
        // an error the companion only gives if the call went round: the fake engine "ran" it
        send(encode({ id: m.id, type: 'HANDLER', name: 'throw', value: { isError: false, value: RAN.toJSON() } }));
      });
    });
    await new Promise<void>((r) => httpServer.listen(0, '127.0.0.1', r));
    const { port } = httpServer.address() as { port: number };
    transport = new StdioClientTransport({
      command: process.execPath,
      args: [BIN, 'mcp', '--engine', `ws://127.0.0.1:${port}/engine#token=${'a'.repeat(64)}`],
      cwd: ROOT,
      env: env as Record<string, string>,
      stderr: 'pipe',
    });
    transport.stderr?.on('data', (d) => (stderr += d.toString()));
    client = new Client({ name: 'hostile-serve-test', version: '1' });
    await client.connect(transport);
  }, 30_000);
  afterAll(async () => {
    await client?.close();
    engine?.close();
    httpServer?.close();
  });
  const alive = () => expect(transport.pid, stderr).not.toBeNull();

  it('answers each malformed callback request with BAD_INPUT on its channel, and goes on', async () => {
    const r = (await client.callTool({ name: 'trace', arguments: { prompt: 'hi' } })) as any;
    expect(ranError(r)).toMatchObject({ code: 'RUNTIME_ERROR', message: RAN.message });
    for (const i of BAD_REQUESTS.keys()) expect(refusal({ m: heard.get(`bad-${i}`) }), String(i)).toBe('BAD_INPUT');
    expect(heard.get('good')?.type).toBe('RAW');
    alive();
    expect((await client.callTool({ name: 'loupe_status', arguments: {} })).isError).toBeFalsy();
  }, 30_000);

  it('fails a call whose answer is a proxy with BAD_INPUT, and answers the next', async () => {
    mode = 'hostile-answer';
    const r = (await client.callTool({ name: 'trace', arguments: { prompt: 'hi' } })) as any;
    expect(ranError(r)).toMatchObject({ code: 'BAD_INPUT', message: /an answer of handler "proxy"/ });
    mode = 'plain';
    expect(ranError(await client.callTool({ name: 'trace', arguments: { prompt: 'hi' } }))).toMatchObject({
      code: 'RUNTIME_ERROR',
    });
    alive();
  }, 30_000);

  it('ends only the connection on a frame of 20 M objects (60 MiB), unparsed; the next call connects again', async () => {
    mode = 'bomb';
    const r = (await client.callTool({ name: 'trace', arguments: { prompt: 'hi' } })) as any;
    expect(ranError(r)).toMatchObject({ code: 'ENGINE_GONE', message: /more than 2000000 arrays and objects/ });
    mode = 'plain';
    expect(ranError(await client.callTool({ name: 'trace', arguments: { prompt: 'hi' } }))).toMatchObject({
      code: 'RUNTIME_ERROR',
    });
    alive();
    const peak = vmHwmMiB(transport.pid!);
    console.log(`loupe mcp --engine: peak RSS ${peak.toFixed(0)} MiB after the 60 MiB frame`);
    expect(peak).toBeLessThan(1024);
  }, 30_000);
});

describe('what loupe serve’s engine may fetch (issue 39, noted: a page steering server-side requests)', () => {
  let hits: string[] = [];
  let other: http.Server;
  let allowedSrv: http.Server;
  const portOf = (s: http.Server) => (s.address() as { port: number }).port;
  beforeAll(async () => {
    // the "other" host: nothing may reach it but a redirect an allowed host answers with
    other = http.createServer((req, res) => (hits.push(`other ${req.url}`), res.writeHead(404), res.end()));
    allowedSrv = http.createServer((req, res) => {
      hits.push(`allowed ${req.url}`);
      res.writeHead(302, { location: `http://localhost:${portOf(other)}${req.url}` });
      res.end();
    });
    await Promise.all([other, allowedSrv].map((s) => new Promise<void>((r) => s.listen(0, '127.0.0.1', r))));
  });
  afterAll(() => {
    other.close();
    allowedSrv.close();
  });
  const engine = (hosts: string[]) =>
    createEngineApi(nodeEngineHost({ backend: 'node', local: NO_LOCAL, net: allowHosts(hosts) }));
  const load = (api: ReturnType<typeof engine>, model: unknown) =>
    api.loadModel('j', { model: model as never, backend: 'auto' }, () => {}).catch((e) => e.error ?? e);

  it('refuses a URL, a Hub endpoint and an SAE source off the allowlist before any request', async () => {
    hits = [];
    const api = engine(['huggingface.co']);
    const url = `http://127.0.0.1:${portOf(other)}/m/`;
    expect(await load(api, { kind: 'url', id: url })).toMatchObject({ code: 'HOST_NOT_ALLOWED' });
    expect(await load(api, { kind: 'hub', id: 'a/b', endpoint: `http://127.0.0.1:${portOf(other)}` })).toMatchObject({
      code: 'HOST_NOT_ALLOWED',
    });
    expect(await load(api, 'default')).toMatchObject({ info: expect.anything() }); // no fetch: allowed
    const sae = await api
      .runOperation('s', 'sae_features', { prompt: 'hi', sae_source: url, sae_path: '' }, () => {})
      .catch((e) => e.error ?? e);
    expect(sae).toMatchObject({ code: 'HOST_NOT_ALLOWED' });
    expect(hits).toEqual([]);
  }, 20_000);

  it('fetches from an allowed host and follows its redirects', async () => {
    hits = [];
    const api = engine([`127.0.0.1:${portOf(allowedSrv)}`]);
    const r = await load(api, { kind: 'url', id: `http://127.0.0.1:${portOf(allowedSrv)}/m/` });
    expect(r.code).not.toBe('HOST_NOT_ALLOWED');
    expect(hits[0]).toMatch(/^allowed \/m\//);
    expect(hits).toContain(hits[0].replace('allowed', 'other'));
  }, 20_000);

  it('checks every request of a source, and reads --allow-host', async () => {
    const net = allowHosts(['huggingface.co', '127.0.0.1:8080']);
    expect(() => checkUrlHost('https://huggingface.co/x', net)).not.toThrow();
    expect(() => checkUrlHost('http://127.0.0.1:8080/x', net)).not.toThrow();
    for (const u of ['http://127.0.0.1:8081/x', 'https://evil.example/', 'file:///etc/passwd', 'not a url'])
      expect(() => checkUrlHost(u, net), u).toThrow(/fetches only from/);
    let called = 0;
    const f = guardedFetch(net, async () => (called++, new Response('')));
    await expect(f('https://evil.example/')).rejects.toMatchObject({ code: 'HOST_NOT_ALLOWED' });
    await f('https://huggingface.co/');
    expect(called).toBe(1);
    expect(allowHosts(['*'])).toBe('any');
    expect(() => allowHosts(['http://x/'])).toThrow(/--allow-host/);
    expect(parseServeArgs(['--allow-host', 'hf.co', '--allow-host=127.0.0.1:9']).allowHost).toEqual([
      'hf.co',
      '127.0.0.1:9',
    ]);
  });
});

describe('a deeply nested tool argument (issue 39, noted)', () => {
  it('is BAD_INPUT before anything recursive runs on it, not INTERNAL "Maximum call stack size exceeded"', async () => {
    let executed = 0;
    const executor: Executor = {
      mode: 'headless',
      status: async () => ({}),
      // the headless engine thread's postMessage is a structured clone: recursive
      execute: async (_tool, args) => (executed++, structuredClone(args), { document: { operation: 'open' } }),
      currentInstance: async () => undefined,
      setAgent: () => {},
      close: async () => {},
    };
    const op: Operation = {
      name: 'open',
      title: 'Open',
      description: 'TEST: a field of any JSON (as interventions[].direction and descriptions are)',
      input: z.object({ any: z.unknown() }),
      output: z.object({ operation: z.literal('open') }),
      run: async () => ({ operation: 'open' }),
    };
    const mcp = createMcpServer({ executor, operations: { open: op }, version: 'test', pageUrl: () => '' });
    const [a, b] = InMemoryTransport.createLinkedPair();
    await mcp.server.connect(a);
    const client = new Client({ name: 't', version: '1' });
    await client.connect(b);
    try {
      let deep: unknown = [];
      for (let i = 0; i < 1_000_000; i++) deep = [deep];
      const r = (await client.callTool({ name: 'open', arguments: { any: deep } })) as any;
      expect(JSON.parse(r.content[0].text).error).toMatchObject({ code: 'BAD_INPUT', message: /nest more than 64/ });
      expect(executed).toBe(0);
      expect(((await client.callTool({ name: 'open', arguments: { any: [[1]] } })) as any).isError).toBeFalsy();
    } finally {
      await client.close();
      await mcp.close();
    }
  });
});
