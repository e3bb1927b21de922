/**
 * The gradient operations in the page on induction-gpt2 (from the Hub stand-in): attribution
 * patching and integrated gradients run in the worker (WASM), their documents equal the same
 * operations run in Node within 1e-4, their views draw (head map with the validated subset
 * marked, site maps, estimate-vs-actual scatter; IG tokens with the completeness readout), a
 * clicked head opens its pattern. Screenshots in both themes at 1024 and 1280 px.
 */
import { join, resolve } from 'node:path';
import type { BrowserContext, Page } from '@playwright/test';
import {
  test,
  expect,
  openReady,
  loadFromHub,
  waitModelReady,
  watchErrors,
  SHARED_MODELS,
  useBackend,
} from './fixtures';
import { loadModelNode } from '../src/node/load';
import { getOperation } from '../src/ops/index';

test.describe.configure({ mode: 'serial' });

const REPO = 'loupe-test/induction-gpt2';
const R = [12, 200, 45, 77, 130, 9, 250, 66, 31, 180, 99, 143];
const R2 = [55, 3, 210, 160, 88, 20, 190, 121, 71, 240, 14, 111];
const ATP = {
  token_ids: [256, ...R, ...R.slice(0, -1)],
  corrupted_token_ids: [256, ...R2, ...R.slice(0, -1)],
  answer: `#${R[11]}`,
  counterfactual: `#${R2[11]}`,
  validate: 8,
};
const IG = { token_ids: ATP.token_ids, answer: `#${R[11]}`, counterfactual: `#${R2[11]}`, steps: 16 };

let context: BrowserContext;
let page: Page;
let errors: string[];

test.beforeAll(async ({ browser, hub, site }) => {
  hub.addRepo(REPO, join(SHARED_MODELS, 'induction-gpt2'));
  context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  page = await context.newPage();
  errors = watchErrors(page);
  await openReady(page, site.url);
  await loadFromHub(page, hub.url, REPO);
  await waitModelReady(page);
  await expect(page.getByTestId('status-model')).toContainText(REPO);
});
test.afterAll(async () => {
  await context.close();
});

async function runInPage(op: string, input: Record<string, unknown>): Promise<any> {
  await page.evaluate((o) => (globalThis as any).__loupe.forms.select(o), op);
  const doc = await page.evaluate(([o, i]) => (globalThis as any).__loupe.runOperation(o, i), [op, input] as const);
  expect(doc, `${op} failed in the page`).toBeTruthy();
  await expect(page.locator(`[data-testid=result][data-op=${op}]`)).toBeVisible();
  await expect(page.getByTestId('view-error')).toHaveCount(0);
  return doc;
}

function close(a: unknown, b: unknown, tol: number, at = '$'): void {
  if (typeof a === 'number' && typeof b === 'number') {
    expect(Math.abs(a - b), at).toBeLessThanOrEqual(tol);
    return;
  }
  if (Array.isArray(a) && Array.isArray(b)) {
    expect(a.length, at).toBe(b.length);
    a.forEach((x, i) => close(x, b[i], tol, `${at}[${i}]`));
    return;
  }
  if (a && b && typeof a === 'object' && typeof b === 'object') {
    for (const k of Object.keys(a)) if (k !== 'model') close((a as any)[k], (b as any)[k], tol, `${at}.${k}`);
    return;
  }
  expect(a, at).toEqual(b);
}

async function shots(name: string, testid: string): Promise<void> {
  for (const theme of ['light', 'dark'] as const) {
    await page.evaluate((t) => (globalThis as any).__loupe.prefs.setTheme(t), theme);
    await expect(page.locator('html')).toHaveAttribute('data-theme', theme);
    for (const width of [1024, 1280]) {
      await page.setViewportSize({ width, height: 900 });
      await page.mouse.move(0, 0);
      await page.getByTestId(testid).evaluate((e) => e.scrollIntoView({ block: 'start' }));
      await page.screenshot({ path: `artifacts/screenshots/${name}-${theme}-${width}.png` });
    }
  }
  await page.evaluate(() => (globalThis as any).__loupe.prefs.setTheme('light'));
  await page.setViewportSize({ width: 1280, height: 900 });
}

test('attribution patching: the page document equals Node within 1e-4; the views draw; a head opens its pattern', async () => {
  const pageDoc = await runInPage('attribution_patching', ATP);
  const model = await loadModelNode(resolve(SHARED_MODELS, 'induction-gpt2'), { backend: 'node' });
  const nodeDoc = await getOperation('attribution_patching')!.run(model, ATP, {});
  await model.dispose();
  close(pageDoc, JSON.parse(JSON.stringify(nodeDoc)), 1e-4);

  const { n_layers: L, n_heads: H } = pageDoc.model;
  await expect(page.locator('[data-testid=atp-heads] rect.cell')).toHaveCount(L * H);
  const marked = await page.locator('[data-testid=atp-heads] text').allTextContents();
  expect(marked.filter((t) => t.startsWith('✓')).length).toBe(pageDoc.validation.heads.length);
  await expect(page.locator('[data-testid=atp-scatter] circle.pt')).toHaveCount(
    pageDoc.validation.heads.length + pageDoc.validation.sites.length,
  );
  await expect(page.locator('[data-testid=atp-resid_pre] rect.cell')).toHaveCount(L * pageDoc.tokens.length);
  await shots('atp-heads', 'atp-view');
  await shots('atp-scatter', 'atp-scatter');
  await shots('atp-sites', 'atp-attn_out');

  // a head opens its pattern (the attention operation for that head)
  await page.locator('[data-testid=atp-heads] rect.cell[data-row="1"][data-col="3"]').click();
  await expect(page.locator('[data-testid=result][data-op=attention]')).toBeVisible({ timeout: 60_000 });
  const att = await page.evaluate(() => (globalThis as any).__loupe.results.attention?.doc);
  expect(att.heads.map((h: any) => [h.layer, h.head])).toEqual([[1, 3]]);
});

test('integrated gradients: the page document equals Node within 1e-4; tokens coloured, completeness shown', async () => {
  const pageDoc = await runInPage('integrated_gradients', IG);
  const model = await loadModelNode(resolve(SHARED_MODELS, 'induction-gpt2'), { backend: 'node' });
  const nodeDoc = await getOperation('integrated_gradients')!.run(model, IG, {});
  await model.dispose();
  close(pageDoc, JSON.parse(JSON.stringify(nodeDoc)), 1e-4);
  await expect(page.locator('[data-testid=ig-tokens] rect.tok-cell')).toHaveCount(pageDoc.tokens.length);
  await expect(page.getByTestId('ig-completeness')).toContainText(pageDoc.completeness.sum.toFixed(4).slice(0, 5));
  await shots('ig', 'ig-view');
  expect(errors).toEqual([]);
});

test('attribution patching on WebGPU agrees with Node', async () => {
  test.setTimeout(300_000);
  const adapter = await page.evaluate(async () => {
    const gpu = (navigator as any).gpu;
    return gpu ? !!(await gpu.requestAdapter()) : false;
  });
  test.skip(!adapter, 'WEBGPU UNAVAILABLE in this Chromium: the WebGPU gradient check did NOT run');
  await useBackend(page, 'webgpu');
  const pageDoc = await runInPage('attribution_patching', ATP);
  expect(pageDoc.model.backend).toBe('webgpu');
  const model = await loadModelNode(resolve(SHARED_MODELS, 'induction-gpt2'), { backend: 'node' });
  const nodeDoc: any = await getOperation('attribution_patching')!.run(model, ATP, {});
  await model.dispose();
  let worst = 0;
  pageDoc.heads.forEach(
    (h: any, i: number) => (worst = Math.max(worst, Math.abs(h.estimate - nodeDoc.heads[i].estimate))),
  );
  pageDoc.sites.forEach(
    (s: any, i: number) => (worst = Math.max(worst, Math.abs(s.estimate - nodeDoc.sites[i].estimate))),
  );
  console.log(`[e2e] attribution patching, WebGPU vs node: max |Δ estimate| ${worst.toExponential(2)}`);
  expect(worst).toBeLessThan(1e-4);
  await page.locator('#backend').selectOption('wasm');
});
