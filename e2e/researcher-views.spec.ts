/**
 * The page in a researcher's hands (issue 27): state that follows the model, views that show
 * what the operations compute, and the rough edges found in use. One test per item; each failed
 * on the page before its fix. Screenshots go to /tmp/loupe-shots-27 (LOUPE_SHOTS_27 to move them).
 */
import { join } from 'node:path';
import { mkdirSync } from 'node:fs';
import type { BrowserContext, Page } from '@playwright/test';
import {
  test,
  expect,
  openReady,
  loadFromHub,
  waitModelReady,
  runOp,
  pageDoc,
  watchErrors,
  SHARED_MODELS,
  PROMPT,
} from './fixtures';

const SHOTS = process.env.LOUPE_SHOTS_27 ?? '/tmp/loupe-shots-27';
mkdirSync(SHOTS, { recursive: true });
const REPO = 'loupe-test/induction-gpt2-27';

let context: BrowserContext;
let page: Page;
let errors: string[];

test.beforeAll(async ({ browser, site, hub }) => {
  hub.addRepo(REPO, join(SHARED_MODELS, 'induction-gpt2'));
  context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  errors = watchErrors(page);
  await openReady(page, site.url);
});
test.afterAll(async () => {
  await context.close();
});

/** 1280 × 800 and 1024 × 700, light and dark; the page is left light at 1280 × 800 */
async function shots(p: Page, name: string, target?: string): Promise<void> {
  const take = async (suffix: string) => {
    await p.mouse.move(0, 0);
    if (target) await p.locator(target).first().scrollIntoViewIfNeeded();
    await p.screenshot({ path: `${SHOTS}/${name}-${suffix}.png` });
  };
  const theme = async (t: 'light' | 'dark') => {
    const now = await p.evaluate(() => document.documentElement.dataset.theme ?? 'light');
    if (now !== t) await p.getByRole('button', { name: t === 'dark' ? /dark/i : /light/i }).click();
  };
  await theme('light');
  await take('1280-light');
  await p.setViewportSize({ width: 1024, height: 700 });
  await take('1024-light');
  await theme('dark');
  await take('1024-dark');
  await p.setViewportSize({ width: 1280, height: 800 });
  await take('1280-dark');
  await theme('light');
}

test('1. after a model switch: old results say whose they are, the head panel closes, no form keeps a layer or head the model lacks, and a reload restores the model', async ({
  hub,
}) => {
  await page.getByTestId('prompt').fill(PROMPT);
  // stories260K has 5 layers × 8 heads; induction-gpt2 has 2 × 4
  await page.getByTestId('tab-ablate').click();
  await page.locator('#p-ablate-layer').fill('3');
  await page.locator('#p-ablate-head').fill('6');
  await runOp(page, 'trace');
  await page.locator('[data-testid=trace-heatmap] rect.cell[data-row="3"][data-col="6"]').click();
  await expect(page.getByTestId('head-panel')).toBeVisible();
  await expect(page.getByTestId('stale-result')).toHaveCount(0);

  await loadFromHub(page, hub.url, REPO);
  await page.waitForFunction(
    (id) => (globalThis as any).__loupe.model?.info.id === id && (globalThis as any).__loupe.modelStatus === 'ready',
    REPO,
  );
  await expect(page.getByTestId('head-panel')).toHaveCount(0);
  await page.getByTestId('tab-trace').click();
  await expect(page.getByTestId('stale-result')).toContainText('stories260K');
  await shots(page, 'stale-result', '[data-testid=result]');
  await expect(page.locator('[data-testid=notice]').filter({ hasText: 'ablate layer 3' })).toBeVisible();
  await page.getByTestId('tab-ablate').click();
  await expect(page.locator('#p-ablate-layer')).toHaveValue('');
  await expect(page.locator('#p-ablate-head')).toHaveValue('');
  await page.locator('#p-ablate-layer').fill('1');
  await page.locator('#p-ablate-head').fill('2');
  await runOp(page, 'ablate');
  expect((await pageDoc(page, 'ablate')).model.id).toBe(REPO);
  await expect(page.getByTestId('stale-result')).toHaveCount(0);

  // a reload opens the last model from this browser's cache, not the bundled one
  const before = hub.log.filter((r) => r.id === REPO).length;
  await page.reload();
  await waitModelReady(page);
  expect(await page.evaluate(() => (globalThis as any).__loupe.model.info.id)).toBe(REPO);
  expect(hub.log.filter((r) => r.id === REPO).length).toBe(before);
  expect(errors).toEqual([]);
});
