/**
 * A third-party check (issue 30): the MCP Inspector's CLI (@modelcontextprotocol/inspector-cli
 * 1.0.3, on the SDK 1.x client) drives `loupe mcp --headless` over stdio and over Streamable HTTP:
 * it lists the tools (each operation naming its ui:// view), calls `trace` and gets the CLI's
 * document within 1e-5, lists resources and templates, and reads a ui:// view resource. Each
 * Inspector run is its own session, so a `loupe://results/{id}` of one run is not readable by the
 * next (results are per session): that read is checked within one session by bridge-eras.
 *
 * The Inspector CLI finds its own package.json by a path relative to the working directory, so it
 * runs from bin/ (whose parent holds a package.json) with absolute paths everywhere.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { compareDocuments } from '../src/share/compare';
import { buildApps } from '../vite.apps.config';
import { until } from './bridge-fake-page';

const run = promisify(execFile);
const ROOT = path.resolve(__dirname, '..');
const BIN = path.join(ROOT, 'bin', 'loupe.mjs');
const INSPECTOR = path.join(ROOT, 'node_modules', '@modelcontextprotocol', 'inspector-cli', 'build', 'index.js');
const PROMPT = 'Once upon a time';
const DIST = mkdtempSync(path.join(os.tmpdir(), 'loupe-inspector-dist-'));
const CONFIG = mkdtempSync(path.join(os.tmpdir(), 'loupe-cfg-inspector-'));
const ENV = { ...process.env, LOUPE_CONFIG_DIR: CONFIG };

let cliDoc: unknown;
let http: { child: ChildProcess; url: string; token: string };

/** One Inspector CLI run against `target` (a command line or a URL); its JSON output. */
async function inspector(target: string[], args: string[]): Promise<any> {
  const { stdout } = await run(process.execPath, [INSPECTOR, ...target, ...args], {
    cwd: path.join(ROOT, 'bin'),
    env: ENV,
    timeout: 120_000,
    maxBuffer: 64 * 1024 * 1024,
  });
  return JSON.parse(stdout);
}

beforeAll(async () => {
  await buildApps(['trace'], path.join(DIST, 'apps'));
  cliDoc = JSON.parse((await run(process.execPath, [BIN, 'trace', 'default', PROMPT, '--json'], { cwd: ROOT })).stdout);
  const child = spawn(process.execPath, [BIN, 'mcp', '--headless', '--dist', DIST, '--http', '--port', '0'], {
    cwd: ROOT,
    env: ENV,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr!.on('data', (d) => (stderr += d.toString()));
  const url = await until(
    () => /MCP over HTTP on (http:\/\/127\.0\.0\.1:\d+\/mcp)/.exec(stderr)?.[1],
    60_000,
    'the HTTP companion',
  );
  const token = JSON.parse(readFileSync(path.join(CONFIG, 'mcp-http.json'), 'utf8')).token as string;
  http = { child, url, token };
}, 300_000);
afterAll(() => {
  http?.child.kill('SIGTERM');
  rmSync(DIST, { recursive: true, force: true });
  rmSync(CONFIG, { recursive: true, force: true });
});

const stdio = () => [process.execPath, BIN, 'mcp', '--headless', '--dist', DIST];
const viaHttp = () => [http.url, '--transport', 'http', '--header', `Authorization: Bearer ${http.token}`];

describe.each([
  ['stdio', stdio],
  ['Streamable HTTP', viaHttp],
])('the MCP Inspector CLI over %s', (_, target) => {
  it('lists the tools, calls trace (the CLI document within 1e-5), lists resources and reads a ui:// view', async () => {
    const tools = (await inspector(target(), ['--method', 'tools/list'])).tools as any[];
    const trace = tools.find((t) => t.name === 'trace');
    expect(trace.outputSchema).toBeDefined();
    expect(trace._meta.ui.resourceUri).toBe('ui://loupe/trace');
    expect(tools.find((t) => t.name === 'logit_lens')._meta).toBeUndefined(); // its view is not built here

    const called = await inspector(target(), [
      '--method',
      'tools/call',
      '--tool-name',
      'trace',
      '--tool-arg',
      `prompt=${PROMPT}`,
    ]);
    expect(called.isError).toBeFalsy();
    const c = compareDocuments(cliDoc, called.structuredContent, 1e-5);
    expect(c.mismatches).toEqual([]);
    expect(c.compared).toBeGreaterThan(50);
    expect(called._meta['loupe/resource']).toMatch(/^loupe:\/\/results\/[0-9a-f]{32}$/);

    const listed = (await inspector(target(), ['--method', 'resources/list'])).resources as any[];
    expect(listed.map((r) => r.uri)).toEqual(['ui://loupe/trace']);
    const templates = (await inspector(target(), ['--method', 'resources/templates/list'])).resourceTemplates as any[];
    expect(templates.map((t) => t.uriTemplate)).toEqual(['loupe://results/{id}']);

    const view = (await inspector(target(), ['--method', 'resources/read', '--uri', 'ui://loupe/trace'])).contents[0];
    expect(view.mimeType).toBe('text/html;profile=mcp-app');
    expect(view.text).toBe(readFileSync(path.join(DIST, 'apps', 'trace.html'), 'utf8'));
  }, 300_000);
});
