/**
 * Loading from a server in the Hub's URL layout (tests/helpers/hub-server.ts on 127.0.0.1):
 * download progress to 100%, the IndexedDB cache (a reload loads with zero requests), cancelling
 * a slow download, and the errors a bad id and a corrupt file give — with the page still usable.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { BrowserContext, Page } from '@playwright/test';
import {
  test,
  expect,
  openReady,
  loadFromHub,
  waitModelReady,
  runOp,
  shot,
  watchErrors,
  SHARED_MODELS,
  PROMPT,
} from './fixtures';

test.describe.configure({ mode: 'serial' });

const REPO = 'loupe-test/induction-gpt2';
let context: BrowserContext;
let page: Page;

test.beforeAll(async ({ browser, hub }) => {
  hub.addRepo(REPO, join(SHARED_MODELS, 'induction-gpt2'));
  context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  watchErrors(page);
});
test.afterAll(async () => {
  await context.close();
});

const requestsFor = (hub: { log: { id?: string }[] }, id: string) => hub.log.filter((r) => r.id === id).length;

test('loads induction-gpt2 from the Hub layout with per-file progress to 100%', async ({ site, hub }) => {
  await openReady(page, site.url);
  // pace the weights so the progress bar is seen moving
  hub.throttle(REPO, 'model.safetensors', { chunkSize: 64 * 1024, chunkDelayMs: 60 });
  await loadFromHub(page, hub.url, REPO);
  const row = page.locator('[data-testid=file-row][data-file="model.safetensors"]');
  await expect(row).toBeVisible();
  await expect.poll(async () => Number(await row.getAttribute('data-loaded')), { timeout: 30_000 }).toBeGreaterThan(0);
  const mid = Number(await row.getAttribute('data-loaded'));
  await shot(page, 'hub-loading');
  await waitModelReady(page);
  await expect(page.getByTestId('status-model')).toContainText(REPO);
  const size = readFileSync(join(SHARED_MODELS, 'induction-gpt2', 'model.safetensors')).length;
  await expect(row).toHaveAttribute('data-loaded', String(size));
  await expect(row).toHaveAttribute('data-total', String(size));
  await expect(page.getByTestId('load-pct')).toHaveText('100%');
  for (const r of await page.locator('[data-testid=file-row]').all()) {
    expect(await r.getAttribute('data-loaded')).toBe(await r.getAttribute('data-total'));
  }
  console.log(`[e2e] progress seen at ${mid} of ${size} bytes, then 100%`);
  expect(hub.stats(REPO, 'model.safetensors').requests).toBeGreaterThan(0);
  await expect(page.locator(`[data-testid=cache-row][data-id="${REPO}"]`)).toBeVisible();
  await page.getByTestId('prompt').fill('abcabcab');
  await runOp(page, 'trace');
  await shot(page, 'hub-loaded-trace');
});

test('after a reload it loads from IndexedDB with zero requests to the server', async ({ hub }) => {
  const before = requestsFor(hub, REPO);
  await page.reload();
  await waitModelReady(page); // the last model, from this browser's cache
  await page
    .getByTestId('recent')
    .getByRole('button', { name: new RegExp(REPO) })
    .click();
  await page.waitForFunction(
    (id) => (globalThis as any).__loupe.model?.info.id === id && (globalThis as any).__loupe.modelStatus === 'ready',
    REPO,
  );
  expect(requestsFor(hub, REPO)).toBe(before);
  await expect(page.getByTestId('load-summary')).toContainText("all from this browser's cache");
  for (const r of await page.locator('[data-testid=file-row]').all())
    expect(await r.getAttribute('data-cached')).toBe('true');
  console.log(`[e2e] reload: ${requestsFor(hub, REPO) - before} requests to the Hub server`);
  // the weights were read from IndexedDB's chunks by range (Blobs, streamed by the worker's reader
  // thread into a shared window, workers/blob-reader.ts): the worker holds no copy of them, and the
  // WASM heap holds them
  await page.getByTestId('prompt').fill('abcabcab');
  await runOp(page, 'trace');
  await page.waitForFunction(() => ((globalThis as any).__loupe.models.memory?.hooksBytes ?? 0) > 0);
  const mem = await page.evaluate(() => (globalThis as any).__loupe.models.memory);
  console.log(`[e2e] memory after a cached load and a trace: ${JSON.stringify(mem)}`);
  expect(mem.jsWeightBytes).toBe(0);
  expect(mem.blobReads.shared).toBeGreaterThan(0);
  expect(mem.weightBytes).toBeGreaterThan(0);
  expect(mem.wasmHeapBytes).toBeGreaterThan(mem.weightBytes);
  await expect(page.getByTestId('status-memory')).toContainText('heap');
});

test('cancelling a slow download frees the page within a second and keeps the current model', async ({ hub }) => {
  const SLOW = 'loupe-test/slow';
  hub.addRepo(SLOW, join(SHARED_MODELS, 'induction-gpt2'));
  hub.throttle(SLOW, 'model.safetensors', { chunkSize: 8 * 1024, chunkDelayMs: 100 });
  await loadFromHub(page, hub.url, SLOW);
  const row = page.locator('[data-testid=file-row][data-file="model.safetensors"]');
  await expect
    .poll(async () => Number((await row.getAttribute('data-loaded')) ?? 0), { timeout: 30_000 })
    .toBeGreaterThan(0);
  const t0 = Date.now();
  await page.getByTestId('cancel-load').click();
  // polled every animation frame, so the time measured is the page's, not the poller's
  await page.waitForFunction(
    () =>
      !document.querySelector('[data-testid=cancel-load]') &&
      !(document.querySelector('[data-testid=run]') as HTMLButtonElement).disabled,
    null,
    { polling: 'raf', timeout: 1000 },
  );
  console.log(`[e2e] download cancelled, page free after ${Date.now() - t0} ms`);
  await expect(page.getByTestId('status-model')).toContainText(REPO);
  await expect(page.getByTestId('model-error')).toHaveCount(0);
  await runOp(page, 'trace');
});

test('a bad Hub id shows a clear error and the page stays usable', async ({ hub }) => {
  await loadFromHub(page, hub.url, 'loupe-test/no-such-model');
  const err = page.getByTestId('model-error');
  await expect(err).toBeVisible();
  await expect(err).toHaveAttribute('data-code', 'MODEL_NOT_FOUND');
  await expect(err).toContainText('loupe-test/no-such-model');
  await shot(page, 'error-bad-id');
  await expect(page.getByTestId('status-model')).toContainText(REPO);
  await runOp(page, 'trace');
});

test('a corrupt weights file shows a clear error and the page stays usable', async ({ hub }) => {
  const BAD = 'loupe-test/corrupt';
  hub.addRepo(BAD, join(SHARED_MODELS, 'induction-gpt2'));
  const bytes = readFileSync(join(SHARED_MODELS, 'induction-gpt2', 'model.safetensors'));
  hub.addFile(BAD, 'model.safetensors', bytes.subarray(0, Math.floor(bytes.length / 2)));
  await loadFromHub(page, hub.url, BAD);
  const err = page.getByTestId('model-error');
  await expect(err).toBeVisible();
  const code = await err.getAttribute('data-code');
  console.log(`[e2e] truncated safetensors → ${code}: ${(await err.textContent())?.trim().slice(0, 160)}`);
  expect(code).toMatch(/^SAFETENSORS_/);
  await expect(err).toContainText('model.safetensors');
  await shot(page, 'error-corrupt-file');
  await expect(page.getByTestId('status-model')).toContainText(REPO);
  await page.getByTestId('prompt').fill(PROMPT.slice(0, 20));
  await runOp(page, 'trace');
});

test('a cached model can be deleted', async () => {
  const row = page.locator(`[data-testid=cache-row][data-id="${REPO}"]`);
  await expect(row).toBeVisible();
  await row.getByRole('button', { name: /delete/i }).click();
  await expect(row).toHaveCount(0);
});
