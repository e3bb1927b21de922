/**
 * Servers and helpers shared by the e2e specs. The page server and the Hub stand-in live for the
 * whole worker (one process, specs run one after another), so IndexedDB stays on one origin.
 */
import { test as base, expect, type Dialog, type Page } from '@playwright/test';
import { serveWorkbench } from '../src/node/serve';
import { startHubServer, type HubServer } from '../tests/helpers/hub-server';
import type { StaticServer } from '../src/node/static-server';

export const SHARED_MODELS = process.env.LOUPE_SHARED_MODELS ?? '../shared/models';
export const PROMPT = 'Once upon a time, there was a little';

interface WorkerFixtures {
  site: StaticServer;
  hub: HubServer;
}

export const test = base.extend<object, WorkerFixtures>({
  site: [
    async ({}, use) => {
      const s = await serveWorkbench(0);
      await use(s);
      await s.close();
    },
    { scope: 'worker' },
  ],
  hub: [
    async ({}, use) => {
      const h = await startHubServer();
      await use(h);
      await h.close();
    },
    { scope: 'worker' },
  ],
});
export { expect };

/** Console errors and page errors, kept so a test can assert there were none. */
export function watchErrors(page: Page): string[] {
  const errors: string[] = [];
  page.on('pageerror', (e) => errors.push(`pageerror: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(`console: ${m.text()}`);
  });
  return errors;
}

/** Open the page and wait until a model is ready (the bundled one unless the URL says otherwise). */
/** Load `id` from the Hub stand-in at `endpoint` through the model panel's Hub tab (does not wait for it). */
export async function loadFromHub(p: Page, endpoint: string, id: string): Promise<void> {
  await p.getByRole('tab', { name: 'Hub' }).click();
  if (!(await p.getByTestId('hub-endpoint').isVisible()))
    await p.getByRole('button', { name: /show endpoint/i }).click();
  await p.getByTestId('hub-endpoint').fill(endpoint);
  await p.getByTestId('hub-endpoint').dispatchEvent('change');
  await p.getByTestId('hub-id').fill(id);
  await p.getByTestId('load-hub').click();
}

export async function openReady(page: Page, url: string): Promise<void> {
  await page.goto(url);
  await waitModelReady(page);
}

export async function waitModelReady(page: Page, timeout = 90_000): Promise<void> {
  await page.waitForFunction(
    () => {
      const a = (globalThis as any).__loupe;
      return a && a.modelStatus === 'ready' && a.ops.length > 0;
    },
    null,
    { timeout },
  );
}

/** Choose a backend in the model panel and wait until the model is ready on it. */
export async function useBackend(page: Page, backend: 'webgpu' | 'wasm', timeout = 120_000): Promise<void> {
  await page.locator('#backend').selectOption(backend);
  await page.waitForFunction(
    (b) => (globalThis as any).__loupe.model?.info.backend === b && (globalThis as any).__loupe.modelStatus === 'ready',
    backend,
    { timeout },
  );
}

/** Select an operation tab, optionally fill the example, run, wait for its result view. */
export async function runOp(
  page: Page,
  op: string,
  opts: { example?: boolean; timeout?: number } = {},
): Promise<number> {
  await page.getByTestId(`tab-${op}`).click();
  if (opts.example) {
    // the example's prompt replaces a typed one only when the person confirms: a run of the example confirms
    const accept = (d: Dialog): void => void d.accept();
    page.on('dialog', accept);
    await page.getByTestId('fill-example').click();
    page.off('dialog', accept);
  }
  const t0 = Date.now();
  await page.getByTestId('run').click();
  await expect(page.getByTestId('job')).toHaveCount(0, { timeout: opts.timeout ?? 120_000 });
  const err = page.getByTestId('job-error');
  if (await err.count()) throw new Error(`${op} failed in the page: ${(await err.textContent())?.trim()}`);
  await expect(page.locator(`[data-testid=result][data-op=${op}]`)).toBeVisible();
  // views load lazily: wait until this one has mounted (or said why it could not draw the document)
  await expect(
    page
      .locator(`[data-testid=result][data-op=${op}]`)
      .locator('[data-testid=view-ready], [data-testid=view-error]')
      .first(),
  ).toBeAttached();
  return Date.now() - t0;
}

export async function shot(page: Page, name: string): Promise<void> {
  await page.mouse.move(0, 0);
  await page.screenshot({ path: `artifacts/screenshots/${name}.png` });
}

/** Runs `fn` at 1280×800 and 1024×700 in each theme (switched with the page's own button); its tag is `${w}-${theme}`. */
export async function atWidthsAndThemes(page: Page, fn: (tag: string) => Promise<void>): Promise<void> {
  for (const [w, h] of [
    [1280, 800],
    [1024, 700],
  ]) {
    await page.setViewportSize({ width: w, height: h });
    for (const theme of ['light', 'dark']) {
      if (((await page.locator('html').getAttribute('data-theme')) ?? 'light') !== theme) {
        await page.getByRole('button', { name: /Switch to (dark|light) theme/ }).click();
        await expect(page.locator('html')).toHaveAttribute('data-theme', theme);
      }
      await fn(`${w}-${theme}`);
    }
  }
}

/** Screenshots at 1280 and 1024 wide in the light theme, then both in the dark one (left dark, at 1280). */
export async function shotWidthsThemes(page: Page, name: string): Promise<void> {
  await shot(page, name);
  await page.setViewportSize({ width: 1024, height: 800 });
  await shot(page, `${name}-1024`);
  await page.getByRole('button', { name: /dark/i }).click();
  await shot(page, `${name}-1024-dark`);
  await page.setViewportSize({ width: 1280, height: 800 });
  await shot(page, `${name}-dark`);
}

/** The document the page holds for an operation. */
export function pageDoc(page: Page, op: string): Promise<any> {
  return page.evaluate((o) => (globalThis as any).__loupe.results[o]?.doc, op);
}

/**
 * Two documents compared number by number (|Δ| ≤ tol) and exactly elsewhere, skipping the paths
 * `skip` accepts (e.g. '.model.backend' between the page and the CLI): the mismatches (first 10)
 * and the largest |Δ|, for one assertion over documents too large for one expect per number.
 */
export function compareDocs(
  x: unknown,
  y: unknown,
  tol: number,
  skip: (path: string) => boolean = () => false,
): { bad: string[]; max: number } {
  let max = 0;
  const bad: string[] = [];
  const walk = (a: unknown, b: unknown, p: string): void => {
    if (skip(p)) return;
    if (typeof a === 'number' && typeof b === 'number') {
      const d = Math.abs(a - b);
      max = Math.max(max, d);
      if (!(d <= tol)) bad.push(`${p}: ${a} vs ${b}`);
      return;
    }
    if (Array.isArray(a) && Array.isArray(b)) {
      if (a.length !== b.length) bad.push(`${p}.length ${a.length} vs ${b.length}`);
      else a.forEach((v, i) => walk(v, b[i], `${p}[${i}]`));
      return;
    }
    if (a && b && typeof a === 'object' && typeof b === 'object') {
      for (const k of Object.keys(a)) walk((a as any)[k], (b as any)[k], `${p}.${k}`);
      return;
    }
    if (a !== b) bad.push(`${p}: ${JSON.stringify(a)} vs ${JSON.stringify(b)}`);
  };
  walk(x, y, '');
  return { bad: bad.slice(0, 10), max };
}
