/**
 * The hostile-input suite over `loupe mcp --headless --http` (issue 30): a local attacker's worth of
 * bad requests to 127.0.0.1:PORT/mcp, bounded in count and reproducible from one seed
 * (LOUPE_HOSTILE_SEED, default below). Requests are written byte for byte on TCP sockets, so
 * headers can hold what no HTTP client sends.
 *
 *  A. gates: randomised Host, Origin, Authorization, method, session id and content type (bytes
 *     0–255 included). A request that fails any gate must never get a 2xx; one that passes all
 *     of them must not be refused for a gate (401/403).
 *  B. bodies: malformed and oversized JSON-RPC (broken JSON, batches, wrong jsonrpc, huge ids,
 *     deep nesting, hostile params), declared sizes above the 64 MiB cap, a body that runs past it.
 *  C. sessions: out-of-order requests (calls before initialize, reuse after DELETE, foreign and
 *     random session ids) and many more initializes than MAX_SESSIONS.
 *  D. slowloris: connections that send their headers a byte at a time, or stop half way through
 *     a body, while an honest client works.
 *
 * After every burst the companion must still run (no crash), answer the official client v2 in
 * both protocol eras, and give the same trace document as before the first burst; a request
 * that gets no answer in time counts as a hang. The counts are printed (README, "Security and limits").
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MAX_SESSIONS } from '../src/bridge/http';
import { compareDocuments } from '../src/share/compare';
import { sleep, until } from './bridge-fake-page';
import { BIN, ROOT, hostileJson, int, pick, randomLatin1, rng } from './helpers/hostile';

const SEED = Number(process.env.LOUPE_HOSTILE_SEED ?? 20261202);
const N_GATES = 300;
const N_BODIES = 200;
const N_SESSIONS = MAX_SESSIONS * 3;
const N_SLOW = 40;
const PROMPT = 'Once upon a time, there was a little';
/** a request unanswered after this long is a hang */
const HANG_MS = 20_000;

interface Tally {
  inputs: number;
  crashes: number;
  hangs: number;
  checks: number;
}
const tally: Record<string, Tally> = {};
const t = (k: string) => (tally[k] ??= { inputs: 0, crashes: 0, hangs: 0, checks: 0 });

const CONFIG = mkdtempSync(path.join(os.tmpdir(), 'loupe-cfg-hostile-http-'));
let child: ChildProcess;
let exited: string | undefined;
let port = 0;
let token = '';
let stderr = '';
let baseline: unknown;

interface Reply {
  /** the HTTP status, 0 when the socket closed without one, -1 on timeout */
  status: number;
  head: string;
  body: string;
}

/** Write `bytes` on a fresh socket and read one whole reply (up to `maxBytes`). */
function raw(bytes: Buffer | string, timeoutMs = HANG_MS, maxBytes = 1 << 20): Promise<Reply> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    let buf = Buffer.alloc(0);
    let done = false;
    const finish = (status?: number) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      s.destroy();
      const text = buf.toString('latin1');
      const end = text.indexOf('\r\n\r\n');
      const head = end < 0 ? text : text.slice(0, end);
      resolve({
        status: status ?? Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1] ?? 0),
        head,
        body: end < 0 ? '' : text.slice(end + 4),
      });
    };
    const timer = setTimeout(() => finish(-1), timeoutMs);
    s.on('error', () => finish());
    s.on('close', () => finish());
    s.on('data', (c) => {
      buf = Buffer.concat([buf, c]);
      if (buf.length > maxBytes) finish();
      // a JSON answer is complete at its length; an SSE stream ends when its message has come
      const text = buf.toString('latin1');
      const end = text.indexOf('\r\n\r\n');
      if (end < 0) return;
      const len = /\r\ncontent-length: *(\d+)/i.exec(text.slice(0, end))?.[1];
      if (len !== undefined && buf.length >= end + 4 + Number(len)) finish();
      if (/\r\ncontent-type: *text\/event-stream/i.test(text.slice(0, end)) && /\n\n/.test(text.slice(end + 4)))
        finish();
    });
    s.write(typeof bytes === 'string' ? Buffer.from(bytes, 'latin1') : bytes);
  });
}

/** A request text (latin1): the request line, these headers in order, and the body. */
function request(method: string, headers: [string, string][], body = ''): string {
  const b = Buffer.from(body, 'utf8');
  const lines = [`${method} /mcp HTTP/1.1`, ...headers.map(([k, v]) => `${k}: ${v}`)];
  if (body && !headers.some(([k]) => /^content-length$/i.test(k))) lines.push(`Content-Length: ${b.length}`);
  return lines.join('\r\n') + '\r\n\r\n' + b.toString('latin1');
}

const goodHeaders = (): [string, string][] => [
  ['Host', `127.0.0.1:${port}`],
  ['Authorization', `Bearer ${token}`],
  ['Content-Type', 'application/json'],
  ['Accept', 'application/json, text/event-stream'],
  ['Connection', 'close'],
];
const initBody = (id: number | string = 1) =>
  JSON.stringify({
    jsonrpc: '2.0',
    id,
    method: 'initialize',
    params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'hostile-http', version: '1' } },
  });

/** initialize over raw HTTP; the session id the companion gave, or undefined */
async function openSession(): Promise<string | undefined> {
  const r = await raw(request('POST', goodHeaders(), initBody()));
  return /\r\nmcp-session-id: *([^\r\n]+)/i.exec(r.head)?.[1];
}

async function officialClient(era: '2025' | '2026'): Promise<Client> {
  const client = new Client(
    { name: `hostile-http-${era}`, version: '1' },
    era === '2026' ? { versionNegotiation: { mode: { pin: '2026-07-28' } } } : {},
  );
  const transport = new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${port}/mcp`), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  await client.connect(transport);
  return client;
}

async function traceDoc(era: '2025' | '2026'): Promise<unknown> {
  const client = await officialClient(era);
  try {
    const r = await client.callTool({ name: 'trace', arguments: { prompt: PROMPT, top_k: 5 } });
    expect(r.isError).toBeFalsy();
    return r.structuredContent;
  } finally {
    await client.close();
  }
}

/** After a burst: the process runs, and both eras get the baseline trace. */
async function checkAlive(burst: string): Promise<void> {
  if (exited) t(burst).crashes += 1;
  expect(exited, `the companion exited during ${burst}:\n${stderr.slice(-3000)}`).toBeUndefined();
  for (const era of ['2025', '2026'] as const) {
    const c = compareDocuments(baseline, await traceDoc(era), 0);
    expect(c.mismatches).toEqual([]);
    t(burst).checks += 1;
  }
}

beforeAll(async () => {
  child = spawn(process.execPath, [BIN, 'mcp', '--headless', '--http', '--port', '0'], {
    cwd: ROOT,
    env: { ...process.env, LOUPE_CONFIG_DIR: CONFIG },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stderr!.on('data', (d) => {
    stderr += d.toString();
    if (stderr.length > 400_000) stderr = stderr.slice(-200_000);
  });
  child.once('exit', (code, signal) => (exited = `${code ?? signal}`));
  const url = await until(
    () => /MCP over HTTP on (http:\/\/127\.0\.0\.1:\d+\/mcp)/.exec(stderr)?.[1],
    60_000,
    'the HTTP companion',
  );
  port = Number(new URL(url).port);
  token = JSON.parse(readFileSync(path.join(CONFIG, 'mcp-http.json'), 'utf8')).token;
  baseline = await traceDoc('2025');
}, 120_000);

afterAll(() => {
  child?.kill('SIGTERM');
  rmSync(CONFIG, { recursive: true, force: true });
  const rows = Object.entries(tally).map(
    ([k, v]) => `${k}: ${v.inputs} inputs, ${v.crashes} crashes, ${v.hangs} hangs`,
  );
  const total = Object.values(tally).reduce(
    (a, v) => ({ inputs: a.inputs + v.inputs, crashes: a.crashes + v.crashes }),
    {
      inputs: 0,
      crashes: 0,
    },
  );
  console.log(
    `[hostile-http] seed ${SEED}; ${rows.join('; ')}; total ${total.inputs} inputs, ${total.crashes} crashes`,
  );
});

describe('hostile HTTP: the companion keeps serving', () => {
  it('A. randomised Host, Origin, token, method and session headers: no gate is passed without its value', async () => {
    const r = rng(SEED);
    const burst = 'gates';
    const hostile = () => randomLatin1(r, int(r, 0, 40)).replace(/[\r\n]/g, ' ');
    const wrong: string[] = [];
    for (let i = 0; i < N_GATES; i++) {
      const good = { host: r() < 0.5, origin: r() < 0.6, auth: r() < 0.5 };
      const host = good.host
        ? pick(r, [`127.0.0.1:${port}`, `localhost:${port}`])
        : pick(r, [
            'evil.example',
            `evil.example:${port}`,
            '127.0.0.1',
            `127.0.0.1:${port + 1}`,
            `127.0.0.1.evil.example:${port}`,
            `[::1]:${port}`,
            '',
            hostile(),
          ]);
      const origin = good.origin
        ? pick(r, [undefined, `http://${host}`])
        : pick(r, ['null', 'http://evil.example', `https://${host}`, `http://${host}.evil.example`, hostile()]);
      const auth = good.auth
        ? pick(r, [`Bearer ${token}`, `bearer ${token}`])
        : pick(r, [
            undefined,
            '',
            'Bearer',
            `Bearer ${token.slice(0, -1)}`,
            `Bearer ${token}x`,
            `Basic ${token}`,
            `Bearer ${'0'.repeat(token.length)}`,
            `Bearer ${token} ${token}`,
            hostile(),
          ]);
      const headers: [string, string][] = [['Host', host]];
      if (origin !== undefined) headers.push(['Origin', origin]);
      if (auth !== undefined) headers.push(['Authorization', auth]);
      if (r() < 0.3) headers.push(['Mcp-Session-Id', pick(r, ['x', hostile(), '0'.repeat(36), '../../etc'])]);
      if (r() < 0.3)
        headers.push(['Mcp-Protocol-Version', pick(r, ['2025-06-18', '2026-07-28', '1999-01-01', hostile()])]);
      headers.push(['Content-Type', pick(r, ['application/json', 'text/plain', hostile()])]);
      headers.push(['Accept', pick(r, ['application/json, text/event-stream', '*/*', hostile()])]);
      headers.push(['Connection', 'close']);
      const method = pick(r, ['POST', 'POST', 'GET', 'DELETE', 'PUT', 'OPTIONS', 'TRACE', 'PATCH']);
      const reply = await raw(request(method, headers, method === 'POST' || r() < 0.2 ? initBody(i) : ''));
      t(burst).inputs += 1;
      if (reply.status === -1) t(burst).hangs += 1;
      // a hostile byte in another header may make Node's parser answer 400 itself, or close: both refuse
      const allGood = good.host && good.origin && good.auth;
      if (!allGood && reply.status >= 200 && reply.status < 300)
        wrong.push(`${reply.status} for ${JSON.stringify(headers)}`);
      if (allGood && (reply.status === 401 || reply.status === 403))
        wrong.push(`${reply.status} refused good gates ${JSON.stringify(headers)}`);
    }
    expect(wrong).toEqual([]);
    expect(t(burst).hangs).toBe(0);
    await checkAlive(burst);
  }, 300_000);

  it('B. malformed and oversized JSON-RPC bodies', async () => {
    const r = rng(SEED + 1);
    const burst = 'bodies';
    const sid = await openSession();
    expect(sid).toBeTruthy();
    const bodies = (): string => {
      switch (int(r, 0, 11)) {
        case 0:
          return randomLatin1(r, int(r, 0, 400));
        case 1:
          return '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":' + '{'.repeat(int(r, 1, 20));
        case 2:
          return `[${Array.from({ length: int(r, 0, 50) }, (_, i) => initBody(i)).join(',')}]`;
        case 3:
          return JSON.stringify({ jsonrpc: pick(r, ['1.0', '3', '', 2]), id: 1, method: 'tools/list' });
        case 4:
          return `{"jsonrpc":"2.0","id":${pick(r, ['1e999', '-0', '{}', '[]', 'null', '"' + 'x'.repeat(100_000) + '"'])},"method":"tools/list"}`;
        case 5:
          return '['.repeat(int(r, 1000, 100_000)) + ']'.repeat(int(r, 0, 100_000));
        case 6:
          return `{"jsonrpc":"2.0","id":7,"method":${hostileJson(r)},"params":${hostileJson(r)}}`;
        case 7:
          return `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":${pick(r, ['"trace"', '"compare"', '"job_result"', hostileJson(r)])},"arguments":${hostileJson(r)}}}`;
        case 8:
          return `{"jsonrpc":"2.0","id":9,"method":"resources/read","params":{"uri":${pick(r, ['"ui://loupe/../../etc/passwd"', '"loupe://results/' + '0'.repeat(32) + '"', '"file:///etc/passwd"', hostileJson(r)])}}}`;
        case 9:
          // a 2026-07-28 envelope, mangled
          return `{"jsonrpc":"2.0","id":10,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":${hostileJson(r)},"io.modelcontextprotocol/clientInfo":${hostileJson(r)}}}}`;
        case 10:
          return JSON.stringify({
            jsonrpc: '2.0',
            method: pick(r, ['notifications/cancelled', 'notifications/initialized', 'notifications/progress']),
            params: { requestId: hostileJson(r), progressToken: 1 },
          });
        default:
          return '';
      }
    };
    for (let i = 0; i < N_BODIES; i++) {
      const headers = goodHeaders();
      if (r() < 0.5) headers.push(['Mcp-Session-Id', sid!]);
      const reply = await raw(request('POST', headers, bodies()));
      t(burst).inputs += 1;
      if (reply.status === -1) t(burst).hangs += 1;
      expect(reply.status === 0 || reply.status >= 200, `status ${reply.status}`).toBe(true);
    }
    // declared sizes over the cap: refused before a byte is read (a length past 2^53 is Node's
    // parser's to refuse: it closes the connection)
    for (const [len, want] of [
      ['67108865', [413]],
      ['1125899906842624', [413]],
      ['99999999999999999999', [0, 400, 413]],
    ] as const) {
      const h = goodHeaders();
      h.push(['Content-Length', len]);
      const reply = await raw(request('POST', h, '{"jsonrpc":"2.0"'));
      t(burst).inputs += 1;
      expect(want).toContain(reply.status);
    }
    // a chunked body that runs past the cap: 413, and the socket is closed by the companion
    {
      const s = net.connect(port, '127.0.0.1');
      const head = request('POST', [...goodHeaders(), ['Transfer-Encoding', 'chunked']]);
      const answered = new Promise<string>((resolve) => {
        let got = '';
        s.on('data', (c) => (got += c.toString('latin1')));
        s.on('close', () => resolve(got));
        s.on('error', () => resolve(got));
      });
      s.write(head);
      const chunk = Buffer.alloc(1 << 20, 0x20);
      const chunkHead = Buffer.from(`${chunk.length.toString(16)}\r\n`);
      for (let sent = 0; sent < 70 && !s.destroyed; sent++)
        await new Promise<void>((res) => s.write(Buffer.concat([chunkHead, chunk, Buffer.from('\r\n')]), () => res()));
      const got = await Promise.race([answered, sleep(HANG_MS).then(() => 'timeout')]);
      s.destroy();
      t(burst).inputs += 1;
      expect(got.slice(0, 12)).toBe('HTTP/1.1 413');
    }
    await checkAlive(burst);
  }, 300_000);

  it('C. out-of-order requests and many more sessions than the limit', async () => {
    const r = rng(SEED + 2);
    const burst = 'sessions';
    const call = (sid: string | undefined, body: string, method = 'POST') => {
      const h = goodHeaders();
      if (sid !== undefined) h.push(['Mcp-Session-Id', sid]);
      t(burst).inputs += 1;
      return raw(request(method, h, body));
    };
    const list = JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/list' });
    // a 2025-era request without the session its initialize returned
    expect(
      (await call(undefined, JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/list', params: {} }))).status,
    ).toBe(400);
    // a call before notifications/initialized, initialize twice, DELETE then reuse
    const sid = (await openSession())!;
    t(burst).inputs += 1;
    expect((await call(sid, list)).status).toBeLessThan(500);
    expect((await call(sid, initBody(3))).status).toBeLessThan(500);
    expect((await call(sid, '', 'DELETE')).status).toBeLessThan(300);
    expect((await call(sid, list)).status).toBe(404);
    // random and mangled session ids
    for (let i = 0; i < 40; i++) {
      const bogus = pick(r, [
        sid.toUpperCase(),
        sid + ' ',
        sid.slice(1),
        '',
        randomLatin1(r, 36).replace(/[\r\n]/g, ''),
      ]);
      const reply = await call(bogus, list);
      if (reply.status === -1) t(burst).hangs += 1;
      expect([0, 400, 404]).toContain(reply.status);
    }
    // three times MAX_SESSIONS initializes: each gets a session (the longest idle are closed)
    const sids: string[] = [];
    for (let i = 0; i < N_SESSIONS; i++) {
      const s = await openSession();
      t(burst).inputs += 1;
      expect(s).toBeTruthy();
      sids.push(s!);
    }
    // the newest answer, the oldest were closed for them
    expect((await call(sids.at(-1), list)).status).toBe(200);
    expect((await call(sids[0], list)).status).toBe(404);
    // an SSE GET stream opened and dropped many times
    for (let i = 0; i < 30; i++) {
      const h = goodHeaders().filter(([k]) => k !== 'Content-Type');
      h.push(['Mcp-Session-Id', sids.at(-1)!]);
      h[h.findIndex(([k]) => k === 'Accept')] = ['Accept', 'text/event-stream'];
      void raw(request('GET', h), 300);
      t(burst).inputs += 1;
    }
    await sleep(500);
    await checkAlive(burst);
  }, 300_000);

  it('D. slowloris: headers a byte at a time and stalled bodies while an honest client works', async () => {
    const burst = 'slowloris';
    const sockets: net.Socket[] = [];
    const text = request('POST', goodHeaders(), initBody());
    let stop = false;
    for (let i = 0; i < N_SLOW; i++) {
      const s = net.connect(port, '127.0.0.1');
      s.on('error', () => undefined);
      sockets.push(s);
      t(burst).inputs += 1;
      if (i % 2) {
        // a byte every 50 ms
        void (async () => {
          for (let k = 0; k < text.length && !stop && !s.destroyed; k++) {
            s.write(Buffer.from(text[k], 'latin1'));
            await sleep(50);
          }
        })();
      } else {
        // the headers, then half the declared body, then nothing
        s.write(request('POST', [...goodHeaders(), ['Content-Length', '100000']], '{"jsonrpc":"2.0",'));
      }
    }
    try {
      await sleep(1000);
      await checkAlive(burst);
    } finally {
      stop = true;
      for (const s of sockets) s.destroy();
    }
  }, 300_000);
});
