/**
 * The built companion as an MCP client launches it: `node bin/loupe.mjs mcp` over stdio, driven
 * by the SDK's Client + StdioClientTransport, with the real operation registry. Covers: tools
 * with no page, stdout purity, a real trace document served by a (fake) paired page, and
 * several companions sharing one hub (forwarding, then take-over when the first one exits).
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, statSync, existsSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { operations } from '../src/ops/index';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { tokenFilePath } from '../src/bridge/token';
import { errorOf, FakePage, poll, text, until } from './bridge-fake-page';

const ROOT = path.resolve(__dirname, '..');
const BIN = path.join(ROOT, 'bin', 'loupe.mjs');
const CONFIG = mkdtempSync(path.join(os.tmpdir(), 'loupe-cfg-'));

interface Companion {
  client: Client;
  stderr: string[];
  close(): Promise<void>;
}

async function companion(args: string[], name = 'stdio-test'): Promise<Companion> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [BIN, 'mcp', ...args],
    cwd: ROOT,
    env: { ...process.env, LOUPE_CONFIG_DIR: CONFIG } as Record<string, string>,
    stderr: 'pipe',
  });
  const stderr: string[] = [];
  transport.stderr?.on('data', (d) => stderr.push(d.toString()));
  const client = new Client({ name, version: '1.0' });
  await client.connect(transport);
  return { client, stderr, close: () => client.close() };
}

const running: Companion[] = [];
const pages: FakePage[] = [];
afterEach(async () => {
  await Promise.all(pages.splice(0).map((p) => p.close()));
  await Promise.all(running.splice(0).map((c) => c.close()));
});

async function status(c: Companion): Promise<Record<string, any>> {
  return (await c.client.callTool({ name: 'loupe_status', arguments: {} })).structuredContent as Record<string, any>;
}
function pairing(s: Record<string, any>): { port: number; token: string } {
  const u = new URL(s.pairing_url);
  return { port: Number(u.port), token: u.hash.replace('#pair=', '') };
}
function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.listen(0, '127.0.0.1', () => {
      const p = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(p));
    });
  });
}

let model: LoadedModel;
beforeAll(async () => {
  model = await loadModelNode('default', { backend: 'node' });
});
afterAll(async () => {
  await model?.dispose();
});

describe('loupe mcp over stdio', () => {
  it('lists every tool with no page, schemas from the operations', async () => {
    const c = await companion(['--port', '0']);
    running.push(c);
    const { tools } = await c.client.listTools();
    const names = tools.map((t) => t.name);
    for (const n of ['loupe_status', 'load_model', 'list_models', 'job_status', 'job_result', 'job_cancel', 'compare'])
      expect(names).toContain(n);
    for (const op of Object.values(operations)) {
      const t = tools.find((x) => x.name === op.name);
      expect(t, op.name).toBeTruthy();
      expect(t!.description!.startsWith(op.description)).toBe(true);
      expect(t!.inputSchema.type).toBe('object');
      expect(t!.outputSchema?.type).toBe('object');
      expect('as_job' in (t!.inputSchema.properties ?? {})).toBe(!!op.long);
    }
    expect(names).toHaveLength(7 + Object.keys(operations).length);
    const s = await status(c);
    expect(s).toMatchObject({ mode: 'page', role: 'hub', page: null });
    expect(s.pairing_url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/#pair=[0-9a-f]{64}$/);
    expect(c.stderr.join('')).toContain(s.pairing_url); // printed for the user
  });

  it('stdout carries only JSON-RPC', async () => {
    const child = spawn(process.execPath, [BIN, 'mcp', '--port', '0', '--page-wait', '0.2'], {
      cwd: ROOT,
      env: { ...process.env, LOUPE_CONFIG_DIR: CONFIG },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    const send = (m: object) => child.stdin.write(JSON.stringify(m) + '\n');
    send({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
    });
    send({ jsonrpc: '2.0', method: 'notifications/initialized' });
    send({ jsonrpc: '2.0', id: 2, method: 'tools/list' });
    send({ jsonrpc: '2.0', id: 3, method: 'tools/call', params: { name: 'trace', arguments: { prompt: 'Hi' } } }); // no page: an isError result
    await until(() => out.split('\n').filter(Boolean).length >= 3, 60_000, 'three responses');
    child.stdin.end();
    await new Promise((r) => child.once('exit', r));
    const lines = out.split('\n').filter(Boolean);
    expect(lines.length).toBe(3);
    for (const l of lines) expect(JSON.parse(l).jsonrpc).toBe('2.0');
    expect(JSON.parse(lines[2]).result.isError).toBe(true);
  });

  it('a real trace document from a paired page comes back as structuredContent, with the page instance', async () => {
    const c = await companion(['--port', '0', '--page-wait', '2']);
    running.push(c);
    const { port, token } = pairing(await status(c));
    const page = await FakePage.connect(port, {
      token,
      model: { ...model.info, ref: { kind: 'bundled', id: 'stories260K', revision: '' } },
    });
    pages.push(page);
    // the fake page runs the real operation in this process, as the page's worker would
    page.onCall = async (m, p) => {
      const op = operations[m.tool];
      try {
        p.result(m.id, await op.run(model, m.args, { onProgress: (x) => p.progress(m.id, x.done, x.total, x.stage) }));
      } catch (e) {
        p.error(m.id, 'INTERNAL', String(e));
      }
    };
    const r = await c.client.callTool({ name: 'trace', arguments: { prompt: 'Once upon a time', top_k: 3 } });
    const direct = await operations.trace.run(model, { prompt: 'Once upon a time', top_k: 3 }, {});
    expect(r.isError).toBeFalsy();
    expect(r.structuredContent).toEqual(direct);
    expect(JSON.parse(text(r))).toEqual(direct);
    expect(page.calls[0].agent?.name).toBe('stdio-test');
    // an agent-fixable error from the operation itself
    const bad = errorOf(
      await c.client.callTool({ name: 'trace', arguments: { prompt: 'Once', answer: 'not-a-single-token-xyz' } }),
    );
    expect(bad.code).toBeTruthy();
  });

  it('a second companion on the same port forwards to the first hub; when the first exits it takes over', async () => {
    const port = await freePort();
    const a = await companion(['--port', String(port), '--page-wait', '2'], 'agent-A');
    running.push(a);
    const sa = await status(a);
    expect(sa.role).toBe('hub');
    const file = tokenFilePath(port, CONFIG);
    expect(statSync(file).mode & 0o777).toBe(0o600);

    const b = await companion(['--port', String(port), '--page-wait', '2'], 'agent-B');
    running.push(b);
    const page = await FakePage.connect(port, pairing(sa));
    pages.push(page);
    page.onCall = (m, p) => p.result(m.id, { generated: true, by: m.agent?.name });
    const sb = await status(b);
    expect(sb).toMatchObject({ role: 'forwarding', page: { instance_id: page.instanceId } });
    expect(sb.agents.map((x: { name: string }) => x.name).sort()).toEqual(['agent-A', 'agent-B']);
    // a call from B runs in the page paired with A's hub, marked as B's
    const r = await b.client.callTool({ name: 'list_models', arguments: {} });
    expect(page.calls.at(-1)).toMatchObject({ tool: 'list_models', agent: { name: 'agent-B' } });
    // this fake page's answer is not a list_models document: the companion says so instead of passing it on
    expect(errorOf(r).code).toBe('INTERNAL');

    // A exits: B takes the port over with a new token
    running.splice(running.indexOf(a), 1);
    await a.close();
    const taken = await poll(
      async () => {
        const st = await status(b).catch(() => undefined);
        return st?.role === 'hub' ? st : undefined;
      },
      10_000,
      'B to become the hub',
      100,
    );
    expect(pairing(taken).port).toBe(port);
    expect(pairing(taken).token).not.toBe(pairing(sa).token);
    expect(existsSync(file) && statSync(file).mode & 0o777).toBe(0o600);
    const page2 = await FakePage.connect(port, pairing(taken));
    pages.push(page2);
    page2.onCall = (m, p) => p.result(m.id, { loaded: null, models: [{ id: 'default', source: 'bundled' }] });
    const ok = await b.client.callTool({ name: 'list_models', arguments: {} });
    expect(ok.structuredContent).toEqual({ loaded: null, models: [{ id: 'default', source: 'bundled' }] });
    // the old token no longer opens the socket
    await expect(FakePage.connect(port, pairing(sa))).rejects.toThrow();
  });
});
