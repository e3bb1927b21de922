/**
 * MCP Apps views in Chromium (issue 30): `loupe mcp --headless` over stdio with the official
 * client v2 calls every operation tool once; each result is drawn by the tool's `ui://loupe/<op>`
 * view (read as a resource, text/html;profile=mcp-app) inside e2e/apps-host/host.html, a host
 * written from the MCP Apps spec that runs each view in an iframe sandboxed to allow-scripts.
 * Screenshots of every view in both themes at 1280 and 1024 wide go to artifacts/screenshots/apps-*.
 *
 * Builds the views first (tsx vite.apps.config.ts) unless LOUPE_E2E_NO_BUILD=1 and they exist.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { expect, test, type Page } from '@playwright/test';
import { operations } from '../src/ops/index';
import { callsFor, startCompanion } from './apps-host/results';

test.describe.configure({ mode: 'serial' });

const HOST_URL = 'http://apps-host.invalid/';
const HOST_HTML = readFileSync(path.resolve('e2e/apps-host/host.html'), 'utf8');
type Result = { content: unknown[]; structuredContent?: Record<string, unknown>; _meta?: Record<string, unknown> };
const calls: { op: string; args: Record<string, unknown>; result: Result; html: string }[] = [];
let companion: Awaited<ReturnType<typeof startCompanion>>;
/** the tools that name a ui:// view */
let withViews: string[] = [];

test.beforeAll(async ({}, info) => {
  info.setTimeout(600_000);
  if (!(process.env.LOUPE_E2E_NO_BUILD === '1' && existsSync('dist/apps/trace.html')))
    execFileSync(process.execPath, ['node_modules/tsx/dist/cli.mjs', 'vite.apps.config.ts'], { stdio: 'inherit' });
  companion = await startCompanion();
  const tools = (await companion.client.listTools()).tools;
  withViews = tools.filter((t) => (t._meta as { ui?: unknown } | undefined)?.ui).map((t) => t.name);
  let handle = '';
  let node: Record<string, number> | undefined;
  for (const [op, args] of Object.entries(callsFor(companion.sae, companion.saePath, companion.tc))) {
    if (op === 'probe') args.capture = handle;
    if (op === 'feature_intervention') args.interventions = [node];
    const r = (await companion.client.callTool({ name: op, arguments: args })) as Result & { isError?: boolean };
    expect(r.isError, `${op}: ${JSON.stringify(r.content).slice(0, 300)}`).toBeFalsy();
    const doc = r.structuredContent!;
    if (op === 'capture') handle = doc.handle as string;
    if (op === 'attribution_graph') {
      const n = (doc.graph as { nodes: { node_id: string; feature_type: string }[] }).nodes.find(
        (x) => x.feature_type === 'cross layer transcoder',
      )!;
      const [layer, feature, position] = n.node_id.split('_').map(Number);
      node = { layer, feature, position, scale: 0 };
    }
    const uri = (tools.find((t) => t.name === op)?._meta as { ui?: { resourceUri?: string } } | undefined)?.ui
      ?.resourceUri;
    expect(uri, `${op} names its view`).toBe(`ui://loupe/${op}`);
    const res = await companion.client.readResource({ uri: uri! });
    expect(res.contents[0].mimeType).toBe('text/html;profile=mcp-app');
    calls.push({ op, args, result: r, html: (res.contents[0] as { text: string }).text });
  }
});
test.afterAll(async () => {
  await companion?.close();
});

async function openHost(page: Page): Promise<string[]> {
  const errors: string[] = [];
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(m.text());
  });
  page.on('pageerror', (e) => errors.push(e.message));
  // the host page is served by the test itself: nothing leaves the machine
  await page.route(HOST_URL, (route) => route.fulfill({ contentType: 'text/html', body: HOST_HTML }));
  await page.exposeFunction('hostCallTool', async (name: string, args: Record<string, unknown>) =>
    JSON.parse(JSON.stringify(await companion.client.callTool({ name, arguments: args }))),
  );
  await page.goto(HOST_URL);
  return errors;
}

const frameOf = (page: Page, op: string, nth = 0) => page.frameLocator(`.turn[data-op="${op}"] iframe`).nth(nth);

/** A screenshot of one view's turn; its frame is painted only inside the viewport, so that is made tall enough. */
async function shotTurn(page: Page, op: string, w: number, h: number, name: string): Promise<void> {
  const turn = page.locator(`.turn[data-op="${op}"]`);
  const tall = Math.ceil((await turn.boundingBox())!.height) + 40;
  await page.setViewportSize({ width: w, height: Math.min(Math.max(h, tall), 6000) });
  await turn.evaluate((el) => el.scrollIntoView({ block: 'start', behavior: 'instant' }));
  await page.mouse.move(0, 0);
  await page.waitForTimeout(50);
  await turn.screenshot({ path: `artifacts/screenshots/${name}.png` });
}

test('every operation tool has a view that draws its real result in a sandboxed iframe, both themes', async ({
  page,
}) => {
  test.setTimeout(600_000);
  const errors = await openHost(page);
  // every tool with a view, and every operation, has its call here
  expect(calls.map((c) => c.op).sort()).toEqual([...withViews].sort());
  expect(calls.length).toBe(Object.keys(operations).length);
  for (const c of calls) {
    await page.evaluate(([op, html, args, result]) => void (window as any).loupeHost.render(op, html, args, result), [
      c.op,
      c.html,
      c.args,
      c.result,
    ] as const);
  }
  const drawn: Record<string, string> = {};
  for (const c of calls) {
    const view = frameOf(page, c.op).locator('[data-testid=app-view]');
    await expect(view, c.op).toHaveAttribute('data-ready', 'true');
    await page.waitForTimeout(100);
    // what the view drew from the document, below its header: elements, chart marks, text
    const n = await view.evaluate((el) => {
      const body = [...el.children].filter((x) => x.tagName !== 'HEADER');
      const all = body.flatMap((x) => [...x.querySelectorAll('*')]);
      const marks = all.filter(
        (x) => /^(rect|path|circle|line|td)$/.test(x.tagName) || (x as HTMLCanvasElement).width > 0,
      );
      return { elements: all.length, marks: marks.length, text: body.map((x) => x.textContent ?? '').join('').length };
    });
    drawn[c.op] = `${n.elements} elements, ${n.marks} marks, ${n.text} chars`;
    if (n.elements < 10 || n.text < 40) drawn[c.op] += ' — too little';
  }
  console.log(`[apps] ${JSON.stringify(drawn)}`);
  expect(Object.entries(drawn).filter(([, v]) => v.endsWith('too little'))).toEqual([]);
  for (const [w, h] of [
    [1280, 800],
    [1024, 700],
  ]) {
    await page.setViewportSize({ width: w, height: h });
    for (const theme of ['light', 'dark'] as const) {
      await page.evaluate((t) => (window as any).loupeHost.setTheme(t), theme);
      for (const c of calls) {
        await expect(frameOf(page, c.op).locator('html')).toHaveAttribute('data-theme', theme);
        await shotTurn(page, c.op, w, h, `apps-${c.op}-${w}-${theme}`);
      }
    }
  }
  expect(errors).toEqual([]);
});

test('a view runs sandboxed: an opaque origin, no network, no reach into the host', async ({ page }) => {
  await openHost(page);
  const c = calls.find((x) => x.op === 'trace')!;
  await page.evaluate(([op, html, args, result]) => void (window as any).loupeHost.render(op, html, args, result), [
    c.op,
    c.html,
    c.args,
    c.result,
  ] as const);
  await expect(frameOf(page, 'trace').locator('[data-testid=app-view]')).toHaveAttribute('data-ready', 'true');
  const frame = page.frames().find((f) => f !== page.mainFrame())!;
  const probe = await frame.evaluate(async () => {
    const fetched = await fetch('http://127.0.0.1:1/').then(
      () => 'loaded',
      () => 'blocked',
    );
    let parentDoc = 'blocked';
    try {
      parentDoc = window.parent.document.title;
    } catch {
      /* cross-origin */
    }
    let storage = 'blocked';
    try {
      localStorage.setItem('x', '1');
      storage = 'allowed';
    } catch {
      /* sandboxed */
    }
    return { origin: window.origin, fetched, parentDoc, storage };
  });
  expect(probe).toEqual({ origin: 'null', fetched: 'blocked', parentDoc: 'blocked', storage: 'blocked' });
});

test('clicking a head asks the host for attention on it; "Open in Loupe" opens the share link', async ({ page }) => {
  await openHost(page);
  const c = calls.find((x) => x.op === 'trace')!;
  await page.evaluate(([op, html, args, result]) => void (window as any).loupeHost.render(op, html, args, result), [
    c.op,
    c.html,
    c.args,
    c.result,
  ] as const);
  const view = frameOf(page, 'trace');
  await view.locator('[data-testid=trace-heatmap] rect.cell[data-row="1"][data-col="0"]').click();
  await expect(view.locator('[data-testid=app-follow-up] [data-testid=attention-pattern] svg')).toBeAttached();
  const toolCalls = await page.evaluate(() => (window as any).toolCalls);
  expect(toolCalls).toEqual([
    {
      from: 'trace',
      name: 'attention',
      arguments: {
        token_ids: (c.result.structuredContent!.tokens as { id: number }[]).map((t) => t.id),
        heads: [{ layer: 1, head: 0 }],
      },
    },
  ]);
  await shotTurn(page, 'trace', 1280, 800, 'apps-trace-follow-up');
  await view.getByTestId('open-in-loupe').click();
  await expect.poll(() => page.evaluate(() => (window as any).openedLinks)).toEqual([c.result._meta!['loupe/link']]);
});

test('a host that cannot call back: the view draws from the document alone', async ({ page }) => {
  await openHost(page);
  const c = calls.find((x) => x.op === 'trace')!;
  await page.evaluate(
    ([op, html, args, result]) => void (window as any).loupeHost.render(op, html, args, result, { noCalls: true }),
    [c.op, c.html, c.args, c.result] as const,
  );
  const view = frameOf(page, 'trace');
  await expect(view.locator('[data-testid=app-view]')).toHaveAttribute('data-ready', 'true');
  await view.locator('[data-testid=trace-heatmap] rect.cell[data-row="1"][data-col="0"]').click();
  await page.waitForTimeout(300);
  expect(await page.evaluate(() => (window as any).toolCalls)).toEqual([]);
  await expect(view.getByTestId('open-in-loupe')).toHaveCount(0);
  await expect(view.locator('[data-testid=app-follow-up]')).toHaveCount(0);
});
