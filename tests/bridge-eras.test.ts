/**
 * Both transports, both protocol eras, driven by the official client v2 (@modelcontextprotocol/
 * client 2.4.0, as OrderedClient: helpers/mcp-client): `loupe mcp --headless` over stdio and
 * `loupe mcp --headless --http` over Streamable HTTP, each with a 2025-era client (`initialize`:
 * 2025-06-18 and 2025-11-25) and a 2026-07-28 client (pinned: no fallback). Every one must get the
 * CLI's trace document within 1e-5, progress that increases, cancellation that stops the engine,
 * and its own results. Over HTTP: the bearer token (made 0600, printed once), 401 / 403 / 404
 * refusals, and clients that do not see each other's results.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, statSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { type Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { compareDocuments } from '../src/share/compare';
import { errorOf, until } from './bridge-fake-page';
import { OrderedClient } from './helpers/mcp-client';

const ROOT = path.resolve(__dirname, '..');
const BIN = path.join(ROOT, 'bin', 'loupe.mjs');
const PROMPT = 'Once upon a time';
const CONFIG = mkdtempSync(path.join(os.tmpdir(), 'loupe-cfg-eras-'));
const ENV = { ...process.env, LOUPE_CONFIG_DIR: CONFIG } as Record<string, string>;

type Era = {
  name: string;
  opts: ConstructorParameters<typeof OrderedClient>[1];
  version: string;
  era: 'legacy' | 'modern';
};
const ERAS: Era[] = [
  { name: '2025-06-18', opts: { supportedProtocolVersions: ['2025-06-18'] }, version: '2025-06-18', era: 'legacy' },
  { name: '2025-11-25', opts: {}, version: '2025-11-25', era: 'legacy' },
  {
    name: '2026-07-28',
    opts: { versionNegotiation: { mode: { pin: '2026-07-28' } } },
    version: '2026-07-28',
    era: 'modern',
  },
];

let cliDoc: Record<string, unknown>;
/** the document equals the CLI's: every number within 1e-5, everything else equal */
function expectCliDoc(doc: unknown) {
  const c = compareDocuments(cliDoc, doc, 1e-5);
  expect(c.mismatches).toEqual([]);
  expect(c.maxAbsDiff).toBeLessThanOrEqual(1e-5);
  expect(c.compared).toBeGreaterThan(50);
}

let http: { child: ChildProcess; url: string; token: string; stderr: string[] };
beforeAll(async () => {
  const { stdout } = await promisify(execFile)(process.execPath, [BIN, 'trace', 'default', PROMPT, '--json'], {
    cwd: ROOT,
  });
  cliDoc = JSON.parse(stdout);
  const child = spawn(process.execPath, [BIN, 'mcp', '--headless', '--http', '--port', '0'], {
    cwd: ROOT,
    env: ENV,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const stderr: string[] = [];
  child.stderr!.on('data', (d) => stderr.push(d.toString()));
  const url = await until(
    () => /MCP over HTTP on (http:\/\/127\.0\.0\.1:\d+\/mcp)/.exec(stderr.join(''))?.[1],
    60_000,
    'the HTTP companion',
  );
  const token = JSON.parse(readFileSync(path.join(CONFIG, 'mcp-http.json'), 'utf8')).token as string;
  http = { child, url, token, stderr };
}, 120_000);
afterAll(() => {
  http?.child.kill('SIGTERM');
});

function httpClient(era: Era, token = http.token): { client: Client; connect(): Promise<void> } {
  const client = new OrderedClient({ name: `eras-${era.name}`, version: '1' }, era.opts);
  const transport = new StreamableHTTPClientTransport(new URL(http.url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  return { client, connect: () => client.connect(transport) };
}

async function stdioClient(era: Era): Promise<{ client: Client; stderr: () => string }> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [BIN, 'mcp', '--headless'],
    cwd: ROOT,
    env: ENV,
    stderr: 'pipe',
  });
  let err = '';
  transport.stderr?.on('data', (d) => (err += d.toString()));
  const client = new OrderedClient({ name: `eras-${era.name}`, version: '1' }, era.opts);
  await client.connect(transport);
  return { client, stderr: () => err };
}

async function traceAndResources(client: Client, listed: boolean) {
  const r = await client.callTool({ name: 'trace', arguments: { prompt: PROMPT } });
  expect(r.isError).toBeFalsy();
  expectCliDoc(r.structuredContent);
  expect(JSON.parse((r.content[0] as { text: string }).text)).toEqual(r.structuredContent);
  const uri = (r._meta as Record<string, string>)['loupe/resource'];
  expect(uri).toMatch(/^loupe:\/\/results\/[0-9a-f]{32}$/);
  const read = await client.readResource({ uri });
  expect(JSON.parse((read.contents[0] as { text: string }).text)).toEqual(r.structuredContent);
  const resources = (await client.listResources()).resources.map((x) => x.uri);
  expect(resources.includes(uri)).toBe(listed);
  return uri;
}

describe.each(ERAS)('stdio, protocol $name', (era) => {
  it('negotiates the era, lists the tools, and a trace equals the CLI within 1e-5; progress increases', async () => {
    const { client } = await stdioClient(era);
    try {
      expect(client.getProtocolEra()).toBe(era.era);
      expect(client.getNegotiatedProtocolVersion()).toBe(era.version);
      const names = (await client.listTools()).tools.map((t) => t.name);
      expect(names).toContain('trace');
      expect(names).toContain('compare');
      await traceAndResources(client, true);
      const seen: number[] = [];
      const g = await client.callTool(
        { name: 'generate', arguments: { prompt: PROMPT, max_new_tokens: 40, stop_at_eos: false } },
        { onprogress: (p) => seen.push(p.progress) },
      );
      expect(g.isError).toBeFalsy();
      expect(seen.length).toBeGreaterThanOrEqual(2);
      for (let i = 1; i < seen.length; i++) expect(seen[i]).toBeGreaterThan(seen[i - 1]);
    } finally {
      await client.close();
    }
  });
});

describe.each(ERAS)('Streamable HTTP, protocol $name', (era) => {
  it('negotiates the era; trace equals the CLI within 1e-5; cancelling a call stops the engine', async () => {
    const { client, connect } = httpClient(era);
    await connect();
    try {
      expect(client.getProtocolEra()).toBe(era.era);
      expect(client.getNegotiatedProtocolVersion()).toBe(era.version);
      // 2026-07-28 has no session: results are readable by URI but listed to nobody
      await traceAndResources(client, era.era === 'legacy');
      const ctl = new AbortController();
      let progressed = 0;
      const before = http.stderr.join('').length;
      const pending = client
        .callTool(
          { name: 'generate', arguments: { prompt: PROMPT, max_new_tokens: 400, stop_at_eos: false } },
          { signal: ctl.signal, onprogress: () => void progressed++ },
        )
        .catch((e) => e);
      await until(() => progressed >= 2, 30_000, 'progress over HTTP');
      ctl.abort('test cancels');
      expect(await pending).toBeInstanceOf(Error);
      await until(
        () => /generate: stopped \d+ ms after cancellation/.test(http.stderr.join('').slice(before)),
        10_000,
        'the engine to stop',
      );
    } finally {
      await client.close();
    }
  });
});

describe('Streamable HTTP: token, gates and isolation', () => {
  it('the token is 0600 in the config folder and printed once, when made', () => {
    expect(statSync(path.join(CONFIG, 'mcp-http.json')).mode & 0o777).toBe(0o600);
    expect(http.stderr.join('')).toContain(http.token);
  });

  it('refuses no token and a wrong one (401), a foreign Host or Origin (403), an unknown session (404)', async () => {
    const init = JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
    });
    const post = (headers: Record<string, string>, body = init) =>
      fetch(http.url, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', ...headers },
        body,
      });
    const auth = { Authorization: `Bearer ${http.token}` };
    expect((await post({})).status).toBe(401);
    expect((await post({ Authorization: 'Bearer ' + '0'.repeat(64) })).status).toBe(401);
    expect((await post({ Authorization: `Basic ${http.token}` })).status).toBe(401);
    expect((await post({ ...auth, Origin: 'http://evil.example' })).status).toBe(403);
    expect((await post({ ...auth, Origin: 'null' })).status).toBe(403);
    const port = new URL(http.url).port;
    expect((await post({ ...auth, Origin: `http://127.0.0.1:${port}` })).status).toBe(200);
    // fetch will not forge Host; a raw request does
    const foreignHost = await new Promise<number>((resolve, reject) => {
      const req = httpRequest(
        {
          host: '127.0.0.1',
          port: Number(port),
          path: '/mcp',
          method: 'POST',
          headers: { ...auth, Host: 'evil.example' },
        },
        (res) => {
          res.resume();
          resolve(res.statusCode!);
        },
      );
      req.on('error', reject);
      req.end(init);
    });
    expect(foreignHost).toBe(403);
    expect((await post({ ...auth, 'Mcp-Session-Id': 'no-such-session' })).status).toBe(404);
  });

  it("one client's results are invisible to another", async () => {
    const era = ERAS[1];
    const a = httpClient(era);
    const b = httpClient(era);
    await a.connect();
    await b.connect();
    try {
      const uri = await traceAndResources(a.client, true);
      expect((await b.client.listResources()).resources.map((x) => x.uri)).not.toContain(uri);
      const e = await b.client.readResource({ uri }).catch((x) => x);
      expect(String(e?.message)).toMatch(/HANDLE_EXPIRED/);
      expect(errorOf(await b.client.callTool({ name: 'compare', arguments: { a: uri, b: uri } })).code).toBe(
        'HANDLE_EXPIRED',
      );
    } finally {
      await a.client.close();
      await b.client.close();
    }
  });
});
