/**
 * Judge before download, in the page: a load from the Hub stand-in first shows what it will cost
 * ("downloads X, needs about Y on WASM / WebGPU"), waits for a click above 1 GB, and refuses a
 * model too large for the backend — each before a tensor byte is served. Big models are sparse
 * files (valid header, then a hole) in a temporary folder, deleted afterwards.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { BrowserContext, Page } from '@playwright/test';
import {
  test,
  expect,
  openReady,
  loadFromHub,
  waitModelReady,
  shot,
  watchErrors,
  runOp,
  SHARED_MODELS,
} from './fixtures';
import { writeSparseGpt2 } from '../tests/helpers/sparse-model';
import { startHubServer } from '../tests/helpers/hub-server';

test.describe.configure({ mode: 'serial' });

const SMALL = 'preflight/induction-gpt2';
const MEDIUM = 'preflight/gpt2-medium'; // 355M F32 parameters: 1.4 GB, asks for a click
const XL = 'preflight/gpt2-xl'; // 1.56B F32 parameters: 6.2 GB, over the 4 GiB WASM heap
/** made in beforeAll (not at import: the runner imports specs in more than one process) */
let tmp = '';
let context: BrowserContext;
let page: Page;
let errors: string[];
let medium: ReturnType<typeof writeSparseGpt2>;
let xl: ReturnType<typeof writeSparseGpt2>;

test.beforeAll(async ({ browser, hub }) => {
  tmp = mkdtempSync(join(tmpdir(), 'loupe-e2e-preflight-'));
  const tok = join(SHARED_MODELS, 'induction-gpt2');
  medium = writeSparseGpt2(tmp, 'gpt2-medium', { nLayer: 24, nEmbd: 1024, nHead: 16 }, 'F32', tok);
  xl = writeSparseGpt2(tmp, 'gpt2-xl', { nLayer: 48, nEmbd: 1600, nHead: 25 }, 'F32', tok);
  hub.addRepo(SMALL, tok);
  hub.addRepo(MEDIUM, medium.dir);
  hub.addRepo(XL, xl.dir);
  context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  errors = watchErrors(page);
});
test.afterAll(async () => {
  await context?.close();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

/** bytes served for a weight file, and whether each request stayed inside its header */
function weightTraffic(
  hub: { log: { id?: string; file?: string; range: string; bytes: number }[] },
  id: string,
  headerBytes: number,
) {
  const reqs = hub.log.filter((r) => r.id === id && r.file === 'model.safetensors');
  return {
    bytes: reqs.reduce((a, r) => a + r.bytes, 0),
    insideHeader: reqs.every((r) => {
      const m = /^bytes=\d+-(\d+)$/.exec(r.range);
      return !!m && Number(m[1]) < headerBytes;
    }),
  };
}

test('a small model shows what it costs while it loads, with no click', async ({ site, hub }) => {
  await openReady(page, site.url);
  hub.throttle(SMALL, 'model.safetensors', { chunkSize: 16 * 1024, chunkDelayMs: 80 });
  await loadFromHub(page, hub.url, SMALL);
  const needs = page.getByTestId('load-needs');
  await expect(needs).toContainText(/downloads .*MB, needs about .* on (WASM|WebGPU) \/ .* on (WASM|WebGPU)/);
  await expect(page.getByTestId('confirm-download')).toHaveCount(0);
  await waitModelReady(page);
  await expect(page.getByTestId('status-model')).toContainText(SMALL);
});

test('above 1 GB the download waits for a click; "Not now" stops it before a tensor byte', async ({ hub }) => {
  hub.resetCounters();
  await loadFromHub(page, hub.url, MEDIUM);
  const confirm = page.getByTestId('confirm-download');
  await expect(confirm).toBeVisible();
  await expect(confirm).toHaveText(/Download 1\.4 GB/);
  await expect(page.getByTestId('load-needs')).toContainText('downloads 1.4 GB');
  await expect(page.getByTestId('load-preview')).toContainText('355M params');
  for (const theme of ['light', 'dark']) {
    const current = await page.evaluate(() => document.documentElement.dataset.theme);
    if (current !== theme) await page.getByRole('button', { name: /Switch to .* theme/ }).click();
    for (const w of [1280, 1024]) {
      await page.setViewportSize({ width: w, height: 800 });
      await shot(page, `preflight-confirm-${theme}-${w}`);
    }
  }
  await page.setViewportSize({ width: 1280, height: 800 });
  expect(weightTraffic(hub, MEDIUM, medium.headerBytes)).toEqual({ bytes: medium.headerBytes, insideHeader: true });
  await page.getByRole('button', { name: 'Not now' }).click();
  await expect(confirm).toHaveCount(0);
  await expect(page.getByTestId('model-error')).toHaveCount(0);
  // the previous model is still loaded and usable
  await expect(page.getByTestId('status-model')).toContainText(SMALL);
  expect(weightTraffic(hub, MEDIUM, medium.headerBytes).bytes).toBe(medium.headerBytes);
});

test('a model too large for the backend is refused from its header, with a hint', async ({ hub }) => {
  await page
    .getByLabel('Backend')
    .selectOption('wasm')
    .catch(() => page.locator('#backend').selectOption('wasm'));
  await waitModelReady(page);
  hub.resetCounters();
  await loadFromHub(page, hub.url, XL);
  const err = page.getByTestId('model-error');
  await expect(err).toContainText('TOO_LARGE');
  await expect(err).toContainText(/1\.56B parameters/);
  await expect(err).toContainText(/WebAssembly heap/);
  expect(weightTraffic(hub, XL, xl.headerBytes)).toEqual({ bytes: xl.headerBytes, insideHeader: true });
  await shot(page, 'preflight-too-large-1280');
  await expect(page.getByTestId('status-model')).toContainText(SMALL);
  expect(errors.filter((e) => !/TOO_LARGE|Failed to load resource/.test(e))).toEqual([]);
});

test("weights behind a 302 to a CDN origin load in the page: CORS, Range across the redirect, no token there, the Hub's commit recorded", async ({
  site,
  hub,
}) => {
  if (page.url() === 'about:blank') await openReady(page, site.url);
  const cdn = await startHubServer();
  try {
    const REPO = 'preflight/lfs';
    const tok = join(SHARED_MODELS, 'induction-gpt2');
    hub.addRepo(REPO, tok, { token: 'hf_page' });
    cdn.addRepo('cdn/lfs', tok);
    hub.redirect(REPO, 'model.safetensors', `${cdn.url}/cdn/lfs/resolve/main/model.safetensors`);
    await page.getByRole('tab', { name: 'Hub' }).click();
    if (!(await page.getByTestId('hub-endpoint').isVisible()))
      await page.getByRole('button', { name: /show endpoint/i }).click();
    await page.getByTestId('hub-endpoint').fill(hub.url);
    await page.getByTestId('hub-endpoint').dispatchEvent('change');
    // the token field follows the endpoint: fill it after
    await page.locator('#hub-token').fill('hf_page');
    await page.getByTestId('hub-id').fill(REPO);
    await page.getByTestId('load-hub').click();
    await waitModelReady(page);
    await expect(page.getByTestId('status-model')).toContainText(REPO);
    const ranges = cdn.log.filter((r) => r.method === 'GET').map((r) => r.range);
    expect(ranges[0]).toBe('bytes=0-7');
    expect(ranges[ranges.length - 1]).toMatch(/^bytes=\d+-$/);
    expect(cdn.log.every((r) => r.authorization === '')).toBe(true);
    expect(
      hub.log.filter((r) => r.id === REPO && r.method === 'GET').every((r) => r.authorization === 'Bearer hf_page'),
    ).toBe(true);
    const commit = await page.evaluate(() => (globalThis as any).__loupe.model?.info.commit);
    expect(commit).toBe(hub.commitOf(REPO));
    await page.locator('#hub-token').fill('');
  } finally {
    await cdn.close();
  }
});

/**
 * navigator.storage.estimate() reporting `left` bytes free. The download runs in the worker:
 * addInitScript does not reach workers (Playwright #28029), so each worker the page starts gets the
 * same stub by `evaluate` (the estimate is asked only when a load starts, after that).
 */
const estimateStub = (left: number) => {
  Object.defineProperty(StorageManager.prototype, 'estimate', {
    configurable: true,
    value: async () => ({ usage: 4e9, quota: 4e9 + left }),
  });
};

test('a model that does not fit the storage quota left is refused before its weights, and the page stays usable', async ({
  browser,
  site,
  hub,
}) => {
  const QUOTA = 'preflight/quota-gpt2';
  const tok = join(SHARED_MODELS, 'induction-gpt2');
  hub.addRepo(QUOTA, tok);
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  try {
    await ctx.addInitScript(estimateStub, 100_000);
    const p = await ctx.newPage();
    const errs = watchErrors(p);
    const stubbed: Promise<unknown>[] = [];
    // the engine's worker (onnxruntime's thread workers sit in Atomics.wait: not evaluated)
    const engine = (w: { url(): string }) => /engine\.worker/.test(w.url());
    p.on('worker', (w) => {
      if (engine(w)) stubbed.push(w.evaluate(estimateStub, 100_000));
    });
    await openReady(p, site.url);
    await Promise.all(stubbed);
    // what the page and its worker (where the download runs) are told
    expect(stubbed.length).toBeGreaterThan(0);
    expect(await p.evaluate(async () => (await navigator.storage.estimate()).quota)).toBe(4e9 + 100_000);
    for (const w of p.workers().filter(engine))
      expect(await w.evaluate(async () => (await navigator.storage.estimate()).quota)).toBe(4e9 + 100_000);
    hub.resetCounters();
    await loadFromHub(p, hub.url, QUOTA);
    const err = p.getByTestId('model-error');
    await expect(err).toContainText('TOO_LARGE');
    await expect(err).toContainText(
      /preflight\/quota-gpt2 needs \d+ kB of this browser's storage, but only 100 kB is available to this site \(4\.0 GB used of 4\.0 GB\)/,
    );
    await expect(err).toContainText(/private or incognito window/);
    // the header's ranged reads, nothing of a tensor
    const headerBytes = 8 + Number(readFileSync(join(tok, 'model.safetensors')).readBigUInt64LE(0));
    const reqs = hub.log.filter((r) => r.id === QUOTA && r.file === 'model.safetensors');
    console.log(
      `[e2e] storage quota refusal: ${reqs.length} requests for model.safetensors (${reqs.map((r) => r.range).join(', ')})`,
    );
    expect(weightTraffic(hub, QUOTA, headerBytes)).toMatchObject({ insideHeader: true });
    expect(weightTraffic(hub, QUOTA, headerBytes).bytes).toBeLessThanOrEqual(headerBytes);
    for (const theme of ['light', 'dark']) {
      const current = await p.evaluate(() => document.documentElement.dataset.theme);
      if (current !== theme) await p.getByRole('button', { name: /Switch to .* theme/ }).click();
      for (const w of [1280, 1024]) {
        await p.setViewportSize({ width: w, height: 800 });
        await err.scrollIntoViewIfNeeded();
        await shot(p, `preflight-storage-quota-${theme}-${w}`);
      }
    }
    await p.setViewportSize({ width: 1280, height: 800 });
    // the page stays usable: the model it had is loaded, and runs
    await expect(p.getByTestId('status-model')).not.toContainText(QUOTA);
    await p.getByTestId('prompt').fill('Once upon a time');
    await runOp(p, 'trace');
    expect(errs.filter((e) => !/TOO_LARGE|Failed to load resource/.test(e))).toEqual([]);
  } finally {
    await ctx.close();
  }
});
