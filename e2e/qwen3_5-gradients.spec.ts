/**
 * Gradients through Qwen3.5's gated delta rule in the page (WASM worker): attribution patching and
 * integrated gradients on a random Qwen3.5 checkpoint (tests/reference/qwen3_5-64.ts) give the
 * documents Node gives within 1e-4 (Node's are checked against float64 in tests/ops-qwen3_5); the
 * head map hatches the linear-attention layers (no heads) and draws the full-attention layer's heads.
 * Screenshots in both themes at 1024 and 1280 px.
 */
import type { BrowserContext, Page } from '@playwright/test';
import { test, expect, openReady, loadFromHub, waitModelReady, watchErrors } from './fixtures';
import { loadModelNode } from '../src/node/load';
import { getOperation } from '../src/ops/index';
import { makeQwen35Model, type Qwen35Model } from '../tests/reference/qwen3_5-64';

test.describe.configure({ mode: 'serial' });

const REPO = 'loupe-test/qwen3_5-random';
let context: BrowserContext;
let page: Page;
let errors: string[];
let m: Qwen35Model;
let input: { token_ids: number[]; corrupted_token_ids: number[] };

test.beforeAll(async ({ browser, hub, site }) => {
  m = makeQwen35Model({ seed: 5 });
  const ids = [m.bosId, 11, 23, 35, 47, 59, 61, 73, 80];
  input = { token_ids: ids, corrupted_token_ids: ids.map((t, i) => (i === 3 ? 15 : t)) };
  hub.addRepo(REPO, m.dir);
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
  m?.cleanup();
});

async function runInPage(op: string, inp: Record<string, unknown>): Promise<any> {
  await page.evaluate((o) => (globalThis as any).__loupe.forms.select(o), op);
  const doc = await page.evaluate(([o, i]) => (globalThis as any).__loupe.runOperation(o, i), [op, inp] as const);
  expect(doc, `${op} failed in the page`).toBeTruthy();
  await expect(page.locator(`[data-testid=result][data-op=${op}]`)).toBeVisible();
  await expect(page.getByTestId('view-error')).toHaveCount(0);
  return doc;
}

/** the largest |a − b| over the numbers of two documents (model block aside) */
function worstDiff(a: any, b: any): number {
  if (typeof a === 'number' && typeof b === 'number') return Math.abs(a - b);
  if (Array.isArray(a) && Array.isArray(b)) {
    expect(a.length).toBe(b.length);
    return Math.max(0, ...a.map((x, i) => worstDiff(x, b[i])));
  }
  if (a && b && typeof a === 'object' && typeof b === 'object')
    return Math.max(0, ...Object.keys(a).map((k) => (k === 'model' ? 0 : worstDiff(a[k], b[k]))));
  expect(a).toEqual(b);
  return 0;
}

async function nodeDoc(op: string, inp: Record<string, unknown>): Promise<any> {
  const model = await loadModelNode(m.dir, { backend: 'node' });
  try {
    return JSON.parse(JSON.stringify(await getOperation(op as any)!.run(model, inp, {})));
  } finally {
    await model.dispose();
  }
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

test('attribution patching on Qwen3.5 in the page equals Node; linear-attention layers hatched in the head map', async () => {
  const inp = { ...input, validate: 4 };
  const pageDoc = await runInPage('attribution_patching', inp);
  const worst = worstDiff(pageDoc, await nodeDoc('attribution_patching', inp));
  console.log(`[e2e] qwen3_5 attribution patching, page (WASM) vs node: worst |Δ| ${worst.toExponential(2)}`);
  expect(worst).toBeLessThan(1e-4);
  const { n_layers: L, n_heads: H } = pageDoc.model;
  const linear = m.text.layer_types.filter((t: string) => t === 'linear_attention').length;
  expect(pageDoc.heads.length).toBe((L - linear) * H);
  await expect(page.locator('[data-testid=atp-heads] rect.cell')).toHaveCount(L * H);
  await expect(page.locator('[data-testid=atp-heads] rect.cell[data-missing=true]')).toHaveCount(linear * H);
  await shots('atp-qwen3_5-heads', 'atp-view');
});

test('integrated gradients on Qwen3.5 in the page equals Node', async () => {
  const inp = { ...input, steps: 8 };
  const pageDoc = await runInPage('integrated_gradients', inp);
  const worst = worstDiff(pageDoc, await nodeDoc('integrated_gradients', inp));
  console.log(`[e2e] qwen3_5 integrated gradients, page (WASM) vs node: worst |Δ| ${worst.toExponential(2)}`);
  expect(worst).toBeLessThan(1e-4);
  await expect(page.locator('[data-testid=ig-tokens] rect.tok-cell')).toHaveCount(pageDoc.tokens.length);
  expect(errors).toEqual([]);
});
