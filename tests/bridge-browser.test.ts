/**
 * End to end with a real browser: `loupe mcp` serves the freshly built workbench, Debian Chromium
 * (driven by playwright-core) opens the pairing URL, and the SDK's MCP client calls tools that run
 * in that page's model worker. Checks: trace and sweep equal the headless companion's documents
 * within 1e-4; progress notifications increase; reloading the page mid-sweep fails the call with
 * isError within 2 s and the next call succeeds once the page has re-paired; cancelling from
 * the client stops the job in the page, whose job bar showed it (the page's JobStore runs agent calls).
 *
 * Builds the page into a temporary folder first (about 5 s), unless LOUPE_BRIDGE_DIST names a
 * built one. Skipped when /usr/bin/chromium is missing.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { chromium, type Browser, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { errorOf, poll, until } from './bridge-fake-page';
import { OrderedClient } from './helpers/mcp-client';

const ROOT = path.resolve(__dirname, '..');
const BIN = path.join(ROOT, 'bin', 'loupe.mjs');
const CHROMIUM = '/usr/bin/chromium';
const FLAGS = [
  '--no-sandbox',
  '--disable-gpu',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--disable-quic',
];
const PROMPT = 'Once upon a time, there was a little';
const TRACE_ARGS = { prompt: PROMPT, top_k: 10 };
const SWEEP_ARGS = { prompt: PROMPT, layer: 2, direction: 'random:1', max_new_tokens: 8 };
/** long enough to be interrupted (several seconds): a 241-token prompt, 32 α rows × 256 new tokens, batched (497 ≤ n_ctx 512) */
const LONG_SWEEP = {
  prompt: Array(12).fill('Once upon a time, there was a little girl who liked to play.').join(' '),
  layer: 2,
  direction: 'random:1',
  multiples: Array.from({ length: 32 }, (_, i) => (i - 16) / 8),
  max_new_tokens: 256,
  stop_at_eos: false,
};

/**
 * From progress messages "generating (…): k/200" and their arrival times, the time the sweep still
 * needs. The cancellation test only proves something if that is longer than the page's 3 s
 * hard-stop (after which the page would kill and restart a worker that did not stop by itself).
 */
function remainingMs(seen: { t: number; message?: string }[]): number {
  const steps = seen
    .map((s) => ({ t: s.t, m: /generating[^:]*: (\d+)\/(\d+)/.exec(s.message ?? '') }))
    .filter((s) => s.m);
  if (steps.length < 3) return NaN;
  const a = steps[1],
    b = steps[steps.length - 1]; // the first step includes the prompt pass
  if (b.t - a.t < 1000) return NaN; // progress arrives in bursts: measure over a second at least
  const perStep = (b.t - a.t) / (Number(b.m![1]) - Number(a.m![1]));
  return (Number(b.m![2]) - Number(b.m![1])) * perStep;
}

interface Mcp {
  client: Client;
  stderr: () => string;
}
async function companion(args: string[], name: string): Promise<Mcp> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [BIN, 'mcp', ...args],
    cwd: ROOT,
    stderr: 'pipe',
    env: { ...process.env, LOUPE_CONFIG_DIR: mkdtempSync(path.join(os.tmpdir(), 'loupe-cfg-')) } as Record<
      string,
      string
    >,
  });
  let err = '';
  transport.stderr?.on('data', (d) => (err += d.toString()));
  const client = new OrderedClient({ name, version: '1' });
  await client.connect(transport);
  return { client, stderr: () => err };
}

/**
 * Deep equality with numbers within tol — absolute for values up to 1, relative above (a ratio
 * such as sweep's relative_change can be ~100, where float32 rounding alone exceeds 1e-4
 * absolute). `skip` lists dotted paths not compared.
 */
function diffs(a: unknown, b: unknown, tol: number, skip: Set<string>, p = ''): string[] {
  if (skip.has(p)) return [];
  if (typeof a === 'number' && typeof b === 'number') {
    return Math.abs(a - b) <= tol * Math.max(1, Math.abs(a), Math.abs(b)) || (Number.isNaN(a) && Number.isNaN(b))
      ? []
      : [`${p}: ${a} vs ${b}`];
  }
  if (Array.isArray(a) && Array.isArray(b)) {
    if (a.length !== b.length) return [`${p}: length ${a.length} vs ${b.length}`];
    return a.flatMap((x, i) => diffs(x, b[i], tol, skip, `${p}[${i}]`));
  }
  if (a && b && typeof a === 'object' && typeof b === 'object') {
    const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
    return [...keys].flatMap((k) =>
      diffs((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k], tol, skip, p ? `${p}.${k}` : k),
    );
  }
  return a === b ? [] : [`${p}: ${JSON.stringify(a)?.slice(0, 80)} vs ${JSON.stringify(b)?.slice(0, 80)}`];
}
const SKIP = new Set(['model.backend']);

const enabled = existsSync(CHROMIUM);
let page: Page;
let browser: Browser;
let mcp: Mcp;
let headless: Mcp;
let pairingUrl = '';

async function ready(p: Page): Promise<void> {
  await p.waitForFunction(
    () => {
      const a = (globalThis as { __loupe?: { modelStatus: string } }).__loupe;
      return a?.modelStatus === 'ready';
    },
    null,
    { timeout: 90_000 },
  );
}
async function paired(): Promise<Record<string, any>> {
  return poll(
    async () => {
      const s = (await mcp.client.callTool({ name: 'loupe_status', arguments: {} })).structuredContent as Record<
        string,
        any
      >;
      return s.page?.model ? s : undefined;
    },
    90_000,
    'the page to pair with a model',
    200,
  );
}

describe.skipIf(!enabled)('the workbench page paired with loupe mcp (Chromium)', () => {
  let builtDist: string | undefined; // a build this file made, removed afterwards
  beforeAll(async () => {
    let dist = process.env.LOUPE_BRIDGE_DIST;
    if (!dist) {
      dist = builtDist = mkdtempSync(path.join(os.tmpdir(), 'loupe-bridge-dist-'));
      execFileSync(
        process.execPath,
        ['node_modules/vite/bin/vite.js', 'build', '--logLevel', 'error', '--outDir', dist, '--emptyOutDir'],
        { cwd: ROOT, stdio: 'inherit' },
      );
    }
    mcp = await companion(['--port', '0', '--dist', dist, '--page-wait', '20'], 'browser-test');
    headless = await companion(['--headless'], 'browser-test-headless');
    pairingUrl = (
      (await mcp.client.callTool({ name: 'loupe_status', arguments: {} })).structuredContent as { pairing_url: string }
    ).pairing_url;
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: FLAGS });
    page = await browser.newPage();
    await page.goto(pairingUrl);
    await ready(page);
    await paired();
  }, 180_000);

  afterAll(async () => {
    await browser?.close();
    await mcp?.client.close();
    await headless?.client.close();
    if (builtDist) rmSync(builtDist, { recursive: true, force: true });
  });

  it('the pairing token left the address bar; the panel shows the agent', async () => {
    expect(page.url()).not.toContain('pair=');
    await expect.poll(() => page.getByTestId('bridge-state').textContent()).toBe('connected');
    expect(await page.getByTestId('bridge-agents').textContent()).toContain('browser-test');
  });

  it('load_model in the page (WASM), then trace equals the headless document within 1e-4', async () => {
    const loaded = await mcp.client.callTool({ name: 'load_model', arguments: { model: 'default', backend: 'wasm' } });
    expect(loaded.structuredContent).toMatchObject({ loaded: true, model: { id: 'stories260K', backend: 'wasm' } });
    const inPage = await mcp.client.callTool({ name: 'trace', arguments: TRACE_ARGS });
    const ref = await headless.client.callTool({ name: 'trace', arguments: TRACE_ARGS });
    expect(inPage.isError).toBeFalsy();
    expect((inPage.structuredContent as { model: { backend: string } }).model.backend).toBe('wasm');
    expect(diffs(inPage.structuredContent, ref.structuredContent, 1e-4, SKIP)).toEqual([]);
    // its link opens the same result in the workbench
    expect((inPage._meta as Record<string, string>)['loupe/link']).toMatch(/#s=/);
  });

  it('sweep equals headless within 1e-4, with progress notifications that increase', async () => {
    const seen: { progress: number }[] = [];
    const inPage = await mcp.client.callTool(
      { name: 'sweep', arguments: SWEEP_ARGS },
      {
        onprogress: (p) => seen.push(p),
      },
    );
    const ref = await headless.client.callTool({ name: 'sweep', arguments: SWEEP_ARGS });
    expect(inPage.isError).toBeFalsy();
    expect(diffs(inPage.structuredContent, ref.structuredContent, 1e-4, SKIP)).toEqual([]);
    expect(seen.length).toBeGreaterThanOrEqual(2);
    for (let i = 1; i < seen.length; i++) expect(seen[i].progress).toBeGreaterThan(seen[i - 1].progress);
  });

  it('reloading the page mid-sweep: isError within 2 s (not at the 120 s timeout), and the next call succeeds after re-pairing', async () => {
    const seen: { t: number; message?: string }[] = [];
    const pending = mcp.client.callTool(
      { name: 'sweep', arguments: LONG_SWEEP },
      {
        onprogress: (p) => void seen.push({ t: Date.now(), message: p.message }),
        timeout: 120_000,
      },
    );
    await until(() => remainingMs(seen) > 3000, 60_000, 'the sweep to be generating');
    const t0 = Date.now();
    void page.reload(); // not awaited: the clock runs from the reload, not from the new page's load
    const r = await pending;
    // the clock includes Chromium unloading the page (1001 ms once at load ~12), so 2 s: still well
    // before the sweep would have ended and far from the call's timeout
    expect(Date.now() - t0).toBeLessThan(2000);
    expect(errorOf(r).code).toBe('PAGE_GONE');
    // the reloaded tab pairs again by itself (token kept for the tab) with a new instance
    await ready(page);
    const again = await mcp.client.callTool({ name: 'trace', arguments: TRACE_ARGS });
    expect(again.isError).toBeFalsy();
    expect((again.structuredContent as { operation: string }).operation).toBe('trace');
  });

  it('cancelling from the client stops the job in the page', async () => {
    await paired();
    const ctl = new AbortController();
    const seen: { t: number; message?: string }[] = [];
    const pending = mcp.client
      .callTool(
        { name: 'sweep', arguments: LONG_SWEEP },
        {
          signal: ctl.signal,
          onprogress: (p) => void seen.push({ t: Date.now(), message: p.message }),
          timeout: 120_000,
        },
      )
      .catch((e) => e);
    await until(() => remainingMs(seen) > 0, 60_000, 'the sweep to be generating');
    // precondition: uncancelled, the page's worker would stay busy at least this much longer (a
    // linear extrapolation of the per-token time, which only grows as the KV cache does; about 4 s
    // on an idle 2-core machine, more under load)
    const remaining = remainingMs(seen);
    expect(remaining, 'the sweep is too short here to show anything').toBeGreaterThan(3000);
    // the agent's job is the page's job (JobStore.track): in the job bar, with its stage
    expect(await page.getByTestId('job').textContent()).toContain('sweep (agent)');
    expect(await page.getByTestId('job-stage').textContent()).toMatch(/generating/);
    const tAbort = Date.now();
    ctl.abort('test cancels');
    expect(await pending).toBeInstanceOf(Error);
    // the cancel reached the page: its log shows the call cancelled (execute's signal aborted)
    await expect
      .poll(() => page.getByTestId('bridge-log').locator('li').first().textContent(), { timeout: 2000 })
      .toMatch(/sweep.*cancelled/);
    // and the job stopped there: the model worker is free (it answers a ping — or was restarted by
    // the page's hard stop) long before the sweep would have ended
    const freeAfter = await page.evaluate(async (t) => {
      const a = (
        globalThis as unknown as {
          __loupe: { client: { call(fn: (api: { ping(): Promise<string> }) => Promise<string>): Promise<string> } };
        }
      ).__loupe;
      await a.client.call((api) => api.ping()).catch(() => undefined); // rejected if the worker was restarted
      return Date.now() - t;
    }, tAbort);
    expect(freeAfter).toBeLessThan(remaining - 1000);
    // and the job bar let go of it
    await expect.poll(() => page.getByTestId('job').count(), { timeout: 2000 }).toBe(0);
    // and the next call succeeds
    const next = await mcp.client.callTool({ name: 'trace', arguments: TRACE_ARGS }, { timeout: 60_000 });
    expect(next.isError, JSON.stringify(next.content)).toBeFalsy();
  });
});
