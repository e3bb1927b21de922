/**
 * The build as a free static host serves it (issue 23): `npm run build`'s dist/ behind a server that sends no
 * isolation headers (src/node/preview.ts), under a sub-path and at /. The bundled model becomes ready, a trace draws
 * its heatmap, no page error and no failed request for the page's own files; the service worker makes the page
 * cross-origin isolated by the second visit, serves it with the network refused, and swaps a new deploy in whole.
 */
import type { Browser, BrowserContext, Page } from '@playwright/test';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test, expect, loadFromHub, waitModelReady, runOp, watchErrors, PROMPT, SHARED_MODELS } from './fixtures';
import { startHubServer } from '../tests/helpers/hub-server';
import { servePlain } from '../src/node/preview';
import type { StaticServer } from '../src/node/static-server';

/**
 * Failed responses (status ≥ 400) and failed requests for URLs under `origin`; not ERR_ABORTED, which is the page's
 * own cancel (the engine stops a body once it holds the bytes of the range it asked for).
 */
function watchOwnFailures(page: Page, origin: string): string[] {
  const bad: string[] = [];
  page.on('response', (r) => {
    if (r.url().startsWith(origin) && r.status() >= 400) bad.push(`${r.status()} ${r.url()}`);
  });
  page.on('requestfailed', (r) => {
    if (r.url().startsWith(origin) && r.failure()?.errorText !== 'net::ERR_ABORTED')
      bad.push(`failed ${r.url()}: ${r.failure()?.errorText}`);
  });
  return bad;
}

async function traceHeatmap(page: Page): Promise<void> {
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'trace');
  const info = await page.evaluate(() => (globalThis as any).__loupe.model.info);
  await expect(page.locator('[data-testid=trace-heatmap] rect.cell')).toHaveCount(info.n_layers * info.n_heads);
}

/** main-frame navigations of a page (its first load and every reload) */
function countNavigations(page: Page): { n: number } {
  const c = { n: 0 };
  page.on('framenavigated', (f) => {
    if (f === page.mainFrame()) c.n++;
  });
  return c;
}

const isolated = (page: Page) => page.evaluate(() => crossOriginIsolated);

/**
 * First visit: the page installs its service worker and reloads itself once, coming back isolated; a second visit is
 * isolated from its first byte. Both trace the bundled model with no page error and no failed own request.
 */
async function visitTwice(context: BrowserContext, site: StaticServer): Promise<void> {
  const origin = new URL(site.url).origin;
  const first = await context.newPage();
  const errors = watchErrors(first);
  const failures = watchOwnFailures(first, origin);
  const requests: string[] = [];
  first.on('request', (r) => requests.push(r.url()));
  const nav = countNavigations(first);
  await first.goto(site.url);
  await first.waitForFunction(() => crossOriginIsolated, null, { timeout: 90_000 });
  await waitModelReady(first);
  await traceHeatmap(first);
  expect(nav.n, 'one reload, and only one').toBe(2);
  // the page's own files all came from under its path
  const own = requests.filter((u) => u.startsWith(origin));
  expect(own.filter((u) => !u.startsWith(site.url))).toEqual([]);
  expect(own.some((u) => u.startsWith(`${site.url}models/stories260K/`))).toBe(true);
  expect(own.some((u) => u.startsWith(`${site.url}ort/`))).toBe(true);
  await first.close();

  const second = await context.newPage();
  const errors2 = watchErrors(second);
  const failures2 = watchOwnFailures(second, origin);
  const nav2 = countNavigations(second);
  await second.goto(site.url);
  expect(await isolated(second)).toBe(true);
  await waitModelReady(second);
  await traceHeatmap(second);
  // the worker is isolated too: onnxruntime-web got more than one thread where there are cores for them
  const info = await second.evaluate(async () => {
    const a = (globalThis as any).__loupe;
    await a.doctor.run();
    return a.doctor.info;
  });
  expect(info.crossOriginIsolated).toBe(true);
  if (info.hardwareConcurrency > 1) expect(info.wasmThreads).toBeGreaterThan(1);
  expect(nav2.n).toBe(1);
  await checkManifest(context, second);
  await second.close();
  expect([...failures, ...failures2]).toEqual([]);
  expect([...errors, ...errors2]).toEqual([]);
}

/** The web app manifest parses, its icons load, and Chromium finds nothing against installing the page. */
async function checkManifest(context: BrowserContext, page: Page): Promise<void> {
  const cdp = await context.newCDPSession(page);
  const m = (await cdp.send('Page.getAppManifest')) as { url: string; errors: unknown[]; data?: string };
  expect(m.errors).toEqual([]);
  const manifest = JSON.parse(m.data!);
  expect(manifest.icons.map((i: { sizes: string }) => i.sizes)).toEqual(['192x192', '512x512', 'any']);
  for (const icon of manifest.icons as { src: string; type: string }[]) {
    const r = await page.request.get(new URL(icon.src, m.url).href);
    expect(r.status(), icon.src).toBe(200);
    expect(r.headers()['content-type']).toBe(icon.type);
  }
  const inst = (await cdp.send('Page.getInstallabilityErrors')) as { installabilityErrors: { errorId: string }[] };
  // a Playwright context is an incognito profile, where nothing installs: that is the context's, not the page's
  expect(inst.installabilityErrors.map((e) => e.errorId).filter((id) => id !== 'in-incognito')).toEqual([]);
  await cdp.detach();
}

for (const base of ['/sub/path/', '/']) {
  test(`served with no isolation headers at ${base}: bundled model ready, trace heatmap, no errors or 404s, isolated by the second visit`, async ({
    browser,
  }: {
    browser: Browser;
  }) => {
    const site: StaticServer = await servePlain(0, base);
    const context = await browser.newContext();
    try {
      await visitTwice(context, site);
    } finally {
      await context.close();
      await site.close();
    }
  });
}

test('a second visit with every request refused opens from the cache and traces the bundled model', async ({
  browser,
}: {
  browser: Browser;
}) => {
  const site: StaticServer = await servePlain(0, '/sub/path/');
  const context = await browser.newContext();
  try {
    await visitTwice(context, site);
    await site.close();
    // nothing answers on that port now: every request the page makes past its service worker is refused
    const page = await context.newPage();
    const errors = watchErrors(page);
    const failures = watchOwnFailures(page, new URL(site.url).origin);
    await page.goto(site.url);
    expect(await isolated(page)).toBe(true);
    await waitModelReady(page);
    await traceHeatmap(page);
    expect(failures).toEqual([]);
    expect(errors).toEqual([]);
  } finally {
    await context.close();
    await site.close();
  }
});

test("a Hub model loads through the stand-in under the service worker's embedder policy, its weights behind a 302 to a CDN origin, and again offline from IndexedDB", async ({
  browser,
}: {
  browser: Browser;
}) => {
  const site: StaticServer = await servePlain(0, '/sub/path/');
  const hub = await startHubServer();
  const cdn = await startHubServer();
  const context = await browser.newContext();
  try {
    const REPO = 'hosted/lfs';
    const dir = join(SHARED_MODELS, 'induction-gpt2');
    hub.addRepo(REPO, dir);
    cdn.addRepo('cdn/lfs', dir);
    hub.redirect(REPO, 'model.safetensors', `${cdn.url}/cdn/lfs/resolve/main/model.safetensors`);
    const page = await context.newPage();
    const errors = watchErrors(page);
    await page.goto(site.url);
    await page.waitForFunction(() => crossOriginIsolated, null, { timeout: 90_000 });
    await waitModelReady(page);
    const policy = await page.evaluate(async () => {
      const r = await fetch(location.href);
      return r.headers.get('cross-origin-embedder-policy');
    });
    expect(policy).toBe('require-corp');
    await loadFromHub(page, hub.url, REPO);
    await waitModelReady(page);
    await expect(page.getByTestId('status-model')).toContainText(REPO);
    // the weights came from the CDN origin, in ranges, across the redirect
    expect(cdn.log.filter((r) => r.method === 'GET').length).toBeGreaterThan(0);
    await traceHeatmap(page);
    await page.close();

    // offline: the page's server, the Hub and its CDN all gone; the page opens from its cache, the model from IndexedDB
    await site.close();
    await hub.close();
    await cdn.close();
    const again = await context.newPage();
    errors.push(...watchErrors(again));
    await again.goto(site.url);
    await waitModelReady(again);
    await loadFromHub(again, hub.url, REPO);
    await waitModelReady(again);
    await expect(again.getByTestId('status-model')).toContainText(REPO);
    await traceHeatmap(again);
    expect(errors.filter((e) => !/Failed to load resource|ERR_CONNECTION_REFUSED/.test(e))).toEqual([]);
  } finally {
    await context.close();
    await site.close();
    await hub.close().catch(() => {});
    await cdn.close().catch(() => {});
  }
});

test('a new deploy: the page says a new version is ready, reloads on the click, and keeps only the new build’s cache', async ({
  browser,
}: {
  browser: Browser;
}) => {
  // a copy of the build that can be redeployed in place
  const root = mkdtempSync(join(tmpdir(), 'loupe-deploy-'));
  cpSync('dist', root, { recursive: true });
  const site: StaticServer = await servePlain(0, '/sub/path/', root);
  const context = await browser.newContext();
  try {
    const page = await context.newPage();
    const errors = watchErrors(page);
    await page.goto(site.url);
    await page.waitForFunction(() => crossOriginIsolated, null, { timeout: 90_000 });
    await waitModelReady(page);
    const caches1 = await page.evaluate(() => caches.keys());
    expect(caches1).toHaveLength(1);
    await expect(page.getByTestId('update-ready')).toHaveCount(0);

    // the next build: another index.html, so another version in sw.js
    const html = readFileSync(join(root, 'index.html'), 'utf8').replace(
      '<title>',
      '<meta name="loupe-build" content="2" /><title>',
    );
    writeFileSync(join(root, 'index.html'), html);
    const sw = readFileSync(join(root, 'sw.js'), 'utf8');
    const v1 = /version:`([0-9a-f]+)`/.exec(sw)![1];
    writeFileSync(join(root, 'sw.js'), sw.replace(`version:\`${v1}\``, 'version:`0000000000000002`'));

    // the page that was open keeps its build until the click
    await page.evaluate(() => navigator.serviceWorker.getRegistration().then((r) => r?.update()));
    await expect(page.getByTestId('update-ready')).toBeVisible();
    expect(await page.locator('meta[name=loupe-build]').count()).toBe(0);
    await Promise.all([page.waitForEvent('load'), page.getByTestId('update-reload').click()]);
    await waitModelReady(page);
    expect(await page.locator('meta[name=loupe-build]').getAttribute('content')).toBe('2');
    expect(await isolated(page)).toBe(true);
    // one cache, the new one: the old build's files are gone with it
    expect(await page.evaluate(() => caches.keys())).toEqual(['loupe-shell-0000000000000002']);
    await expect(page.getByTestId('update-ready')).toHaveCount(0);
    expect(errors).toEqual([]);
  } finally {
    await context.close();
    await site.close();
    rmSync(root, { recursive: true, force: true });
  }
});

test('an offline copy that cannot be written (a shell file the host lost): a notice says why, and the page is still isolated and traces from the network', async ({
  browser,
}: {
  browser: Browser;
}) => {
  // the same path as a full storage: the install's cache write fails part-way and the partial cache is dropped
  const root = mkdtempSync(join(tmpdir(), 'loupe-lost-'));
  cpSync('dist', root, { recursive: true });
  rmSync(join(root, 'models', 'stories260K', 'README.md'));
  const site: StaticServer = await servePlain(0, '/sub/path/', root);
  const context = await browser.newContext();
  try {
    const page = await context.newPage();
    const errors = watchErrors(page);
    await page.goto(site.url);
    await page.waitForFunction(() => crossOriginIsolated, null, { timeout: 90_000 });
    const notice = page.getByTestId('notice').filter({ hasText: 'could not keep an offline copy' });
    await expect(notice).toContainText('models/stories260K/README.md: HTTP 404');
    expect(await page.evaluate(() => caches.keys())).toEqual([]);
    await waitModelReady(page);
    await traceHeatmap(page);
    await page.getByRole('button', { name: 'Doctor' }).click();
    await expect(page.getByTestId('doc-sw')).toContainText('no offline copy');
    await page.screenshot({ path: '/tmp/hosted-no-cache.png' });
    // the service worker's own fetch of the lost file is the one failure
    expect(errors.filter((e) => !/Failed to load resource.*404/.test(e))).toEqual([]);
  } finally {
    await context.close();
    await site.close();
    rmSync(root, { recursive: true, force: true });
  }
});

test('where service workers are refused the page runs single-threaded, traces, and the Doctor says why', async ({
  browser,
}: {
  browser: Browser;
}) => {
  const site: StaticServer = await servePlain(0, '/sub/path/');
  const context = await browser.newContext({ serviceWorkers: 'block' });
  try {
    const page = await context.newPage();
    const errors = watchErrors(page);
    const nav = countNavigations(page);
    await page.goto(site.url);
    await waitModelReady(page);
    await traceHeatmap(page);
    expect(await isolated(page)).toBe(false);
    expect(nav.n).toBe(1);
    await page.getByRole('button', { name: 'Doctor' }).click();
    await expect(page.getByTestId('doc-isolated')).toContainText('WASM runs on 1 thread');
    await expect(page.getByTestId('doc-isolated')).toContainText('because');
    const why = [await page.getByTestId('doc-isolated').textContent(), await page.getByTestId('doc-sw').textContent()];
    console.log(
      `[e2e] the Doctor with service workers refused: ${why.map((t) => t?.replace(/\s+/g, ' ').trim()).join(' | ')}`,
    );
    await expect(page.getByTestId('doc-sw')).toHaveAttribute('data-status', 'failed');
    expect(errors).toEqual([]);
  } finally {
    await context.close();
    await site.close();
  }
});
