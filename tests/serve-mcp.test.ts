/**
 * `loupe mcp --engine URL` forwards the tools to `loupe serve` (both started here as the CLI, the
 * engine on a random port): a trace through the MCP client equals the CLI's --json, a cancelled
 * call stops the engine's job (the served engine is free at once after), and an engine that dies
 * fails the call with ENGINE_GONE instead of leaving it hanging.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import type { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { errorOf } from './bridge-fake-page';
import { OrderedClient } from './helpers/mcp-client';

const ROOT = path.resolve(__dirname, '..');
const BIN = path.join(ROOT, 'bin', 'loupe.mjs');
const PROMPT = 'Once upon a time';
const configDir = mkdtempSync(path.join(tmpdir(), 'loupe-serve-mcp-'));

let serve: ChildProcess;
let pairing = '';
let client: Client;
let stderr = '';
let serveLog = '';

beforeAll(async () => {
  serve = spawn(process.execPath, [BIN, 'serve', '--port', '0'], {
    cwd: ROOT,
    env: { ...process.env, LOUPE_CONFIG_DIR: configDir },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  serve.stderr!.on('data', (d) => (serveLog += d));
  pairing = await new Promise<string>((resolve, reject) => {
    serve.stdout!.on('data', (d) => {
      out += d;
      const m = /pairing: (\S+)/.exec(out);
      if (m) resolve(m[1]);
    });
    serve.once('exit', (c) => reject(new Error(`loupe serve exited ${c}: ${out}`)));
  });
  // the URL alone: the token comes from the 0600 file loupe serve wrote in the same config folder
  const url = pairing.split('#')[0];
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [BIN, 'mcp', '--engine', url],
    cwd: ROOT,
    env: { ...(process.env as Record<string, string>), LOUPE_CONFIG_DIR: configDir },
    stderr: 'pipe',
  });
  transport.stderr?.on('data', (d) => (stderr += d.toString()));
  client = new OrderedClient({ name: 'serve-mcp-test', version: '1' });
  await client.connect(transport);
}, 60_000);

afterAll(async () => {
  await client?.close();
  if (serve?.exitCode === null) serve.kill('SIGINT');
  rmSync(configDir, { recursive: true, force: true });
});

const call = (name: string, args: Record<string, unknown>, o: { signal?: AbortSignal; onprogress?: () => void } = {}) =>
  client.callTool({ name, arguments: args }, o);

/** a long generate, resolved once its progress shows it running on the engine */
async function longGenerate(signal?: AbortSignal) {
  let progressed = 0;
  const pending = call(
    'generate',
    { prompt: PROMPT, max_new_tokens: 480, stop_at_eos: false },
    { signal, onprogress: () => void progressed++ },
  ).catch((e: Error) => e);
  const t0 = Date.now();
  while (progressed < 2 && Date.now() - t0 < 20_000) await new Promise((r) => setTimeout(r, 10));
  expect(progressed).toBeGreaterThanOrEqual(2);
  return { pending }; // wrapped: an async function's returned promise would be awaited with it
}

describe('loupe mcp --engine', () => {
  it('runs trace on the served engine: the same document as the CLI --json', async () => {
    const r = await call('trace', { prompt: PROMPT, top_k: 5 });
    expect(r.isError).toBeFalsy();
    const { stdout } = await promisify(execFile)(
      process.execPath,
      [BIN, 'trace', 'default', PROMPT, '--top-k', '5', '--json'],
      { cwd: ROOT },
    );
    expect(r.structuredContent).toEqual(JSON.parse(stdout));
    const status = (await call('loupe_status', {})).structuredContent as Record<string, unknown>;
    expect(JSON.stringify(status)).toContain(pairing.split('#')[0]);
  }, 60_000);

  it('a cancelled call stops the engine’s job', async () => {
    const ctl = new AbortController();
    const long = await longGenerate(ctl.signal);
    const before = serveLog.length;
    ctl.abort('test cancels');
    expect(await long.pending).toBeInstanceOf(Error);
    // the engine says when the run really stopped
    let line: RegExpExecArray | null = null;
    for (let t = Date.now(); !line && Date.now() - t < 3000; await new Promise((r) => setTimeout(r, 20)))
      line = /runOperation mcp-\S+: stopped (\d+) ms after its cancellation/.exec(serveLog.slice(before));
    expect(line, serveLog).not.toBeNull();
    expect(Number(line![1])).toBeLessThan(1000);
    const quick = await call('generate', { prompt: PROMPT, max_new_tokens: 2 });
    expect(quick.isError).toBeFalsy();
  }, 60_000);

  it('an engine killed mid-call fails the call with ENGINE_GONE', async () => {
    const long = await longGenerate();
    serve.kill('SIGKILL');
    const r = await long.pending;
    expect(r).not.toBeInstanceOf(Error);
    expect((r as { isError?: boolean }).isError).toBe(true);
    expect(errorOf(r).code).toBe('ENGINE_GONE');
  }, 60_000);
});
