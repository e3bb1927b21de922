/**
 * The model panel's picker (engine/catalog.ts): TransformerLens's names, each judged before any
 * download; picking gemma-3-270m loads google/gemma-3-270m from the Hub stand-in (a gemma3-shaped
 * random model) on WASM, and a trace's document records requested_name and resolved_name. A
 * one-part name the table lacks is refused in the panel with the nearest names, before any request.
 */
import type { BrowserContext, Page } from '@playwright/test';
import { test, expect, openReady, waitModelReady, watchErrors, runOp } from './fixtures';
import { ALL_FAMILY_CASES, makeCaseModel, type RandomModel } from '../tests/reference';

test.describe.configure({ mode: 'serial' });

const REPO = 'google/gemma-3-270m';
let context: BrowserContext;
let page: Page;
let errors: string[];
let rm: RandomModel;

test.beforeAll(async ({ browser, hub }) => {
  rm = makeCaseModel(ALL_FAMILY_CASES.find((c) => c.name === 'gemma3-text-bf16')!);
  hub.addRepo(REPO, rm.dir);
  context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  errors = watchErrors(page);
});
test.afterAll(async () => {
  await context?.close();
  rm?.cleanup();
});

test('the picker offers the names, judged; picking gemma-3-270m loads it on WASM and documents both names', async ({
  site,
  hub,
}) => {
  await openReady(page, site.url);
  await page.locator('#backend').selectOption('wasm');
  await waitModelReady(page);
  await page.getByRole('tab', { name: 'Hub' }).click();
  if (!(await page.getByTestId('hub-endpoint').isVisible()))
    await page.getByRole('button', { name: /show endpoint/i }).click();
  await page.getByTestId('hub-endpoint').fill(hub.url);
  await page.getByTestId('hub-endpoint').dispatchEvent('change');
  const pick = page.getByTestId('hub-pick');
  await expect(pick.locator(`option[value="${REPO}"]`)).toHaveAttribute('data-verdict', 'fits WASM');
  await expect(pick.locator('option[value="google/gemma-2-2b"]')).toHaveAttribute('data-verdict', 'needs q8');
  await expect(pick.locator('option[value="google/gemma-3-4b-pt"]')).toHaveAttribute('data-verdict', 'WebGPU only');
  await expect(pick.locator('optgroup[label="olmo2"] option')).toHaveCount(2);

  // a one-part name the table lacks: refused here, nothing asked of the Hub
  const asked = hub.log.length;
  await page.getByTestId('hub-id').fill('gemma-3-207m');
  await page.getByTestId('load-hub').click();
  await expect(page.getByTestId('hub-name-error')).toContainText("'gemma-3-270m'");
  expect(hub.log.length).toBe(asked);

  await pick.selectOption(REPO);
  await expect(page.getByTestId('hub-id')).toHaveValue('gemma-3-270m');
  await expect(page.getByTestId('hub-resolved')).toContainText(`${REPO} · gemma3_text · fits WASM`);
  await page.mouse.move(0, 0);
  await page.screenshot({ path: '/tmp/m24-shots/picker-1280.png' });
  await page.getByTestId('load-hub').click();
  await waitModelReady(page);
  await expect(page.getByTestId('requested-name')).toHaveText('as gemma-3-270m');
  await expect(page.getByTestId('hub-name-error')).toHaveCount(0);
  const info = await page.evaluate(() => (globalThis as any).__loupe.model.info);
  expect(info).toMatchObject({
    id: REPO,
    requested_name: 'gemma-3-270m',
    backend: 'wasm',
    architecture: 'gemma3_text',
  });
  await runOp(page, 'trace');
  const doc = await page.evaluate(() => (globalThis as any).__loupe.results.trace.doc);
  expect(doc.model).toMatchObject({ id: REPO, requested_name: 'gemma-3-270m', resolved_name: REPO });
  for (const [w, theme] of [
    [1280, 'light'],
    [1024, 'light'],
    [1024, 'dark'],
    [1280, 'dark'],
  ] as const) {
    await page.setViewportSize({ width: w, height: 800 });
    if (theme === 'dark' && w === 1024) await page.getByRole('button', { name: /dark/i }).click();
    await page.getByRole('tab', { name: 'Hub' }).click();
    await page.mouse.move(0, 0);
    await page.screenshot({ path: `/tmp/m24-shots/loaded-${w}-${theme}.png` });
  }
  expect(errors).toEqual([]);
});
