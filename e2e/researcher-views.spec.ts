/**
 * The page in a researcher's hands (issue 27): state that follows the model, views that show
 * what the operations compute, and the rough edges found in use. One test per item; each failed
 * on the page before its fix. Screenshots go to /tmp/loupe-shots-27 (LOUPE_SHOTS_27 to move them).
 */
import { join } from 'node:path';
import { mkdirSync } from 'node:fs';
import { chromium, type BrowserContext, type Page } from '@playwright/test';
import { CHROMIUM_ARGS } from '../playwright.config';
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

/** induction-gpt2 loaded (a test run alone starts on the bundled model) */
async function useInduction(hub: { url: string }): Promise<void> {
  if (await page.evaluate((id) => (globalThis as any).__loupe.model?.info.id === id, REPO)) return;
  await loadFromHub(page, hub.url, REPO);
  await page.waitForFunction(
    (id) => (globalThis as any).__loupe.model?.info.id === id && (globalThis as any).__loupe.modelStatus === 'ready',
    REPO,
  );
}

/** WCAG contrast ratio of two computed CSS colours (rgb()/rgba()) */
function contrast(x: string, y: string): number {
  const lum = (c: string) => {
    const [r, g, b] = (c.match(/[\d.]+/g) ?? ['0', '0', '0']).slice(0, 3).map((v) => {
      const u = Number(v) / 255;
      return u <= 0.03928 ? u / 12.92 : ((u + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const [a, b] = [lum(x), lum(y)];
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
}

/** every cell text of the result's heatmaps: its text, and whether it fits its cell */
async function cellTexts(p: Page): Promise<{ text: string; fits: boolean }[]> {
  return p.$$eval('[data-testid=result] svg g.cells text', (els) =>
    els.map((t) => {
      const cw = Number((t.parentNode as Element).querySelector('rect.cell')?.getAttribute('width') ?? 0) + 1;
      return { text: t.textContent ?? '', fits: (t as SVGGraphicsElement).getBBox().width <= cw };
    }),
  );
}

test('9, 10. heatmap numbers only where they fit, no "-0.00", missing cells unlike near-zero ones, whole colour-bar titles, waterfall grouped by layer, method text, one-line status bar', async ({
  hub,
}) => {
  await useInduction(hub);
  // many positions (induction-gpt2 reads characters; its context is 64); the corrupted run predicts X

  const long = 'abcdefghij abcdefghij abcdefghij abcdefgh';
  await page.getByTestId('prompt').fill(long);
  await page.getByTestId('tab-patch').click();
  await page.locator('#p-patch-corrupted_prompt').fill(long.replaceAll('i', 'X'));
  await page.locator('#p-patch-heads').fill('[{"layer":0,"head":0},{"layer":1,"head":1}]');
  await runOp(page, 'patch');
  const patchTexts = await cellTexts(page);
  expect(patchTexts.length).toBeGreaterThan(0);
  for (const t of patchTexts) {
    expect(t.text, 'a number cut short reads as another number').not.toMatch(/…/);
    expect(t.fits, `"${t.text}" is wider than its cell`).toBe(true);
    expect(t.text).not.toMatch(/^-0?\.0+$/);
  }
  // heads the run did not patch have no value: hatched, not the near-white of a value near zero
  const headMap = page.locator('[data-testid=result] svg:has(rect.cell[data-missing])');
  await expect(headMap).toHaveCount(1);
  const missing = headMap.locator('rect.cell[data-missing=true]');
  expect(await missing.count()).toBeGreaterThan(0);
  expect(await missing.first().getAttribute('fill')).toMatch(/^url\(#hatch-/);
  // colour-bar titles whole
  for (const t of await page.locator('[data-testid=result] svg .legend-title').allTextContents())
    expect(t).toBe('normalised logit diff');
  await shots(page, 'patch-heatmaps', '[data-testid=result]');

  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'head_scores');
  await expect(page.getByTestId('result')).not.toContainText('[object Object]');
  await expect(page.getByTestId('result')).not.toContainText(/(^|[^\d])-0\.0+(?!\d*[1-9])/);
  for (const t of await page.locator('[data-testid=result] svg .legend-title').allTextContents())
    expect(t).not.toMatch(/…$/);
  await shots(page, 'head-scores', '[data-testid=result]');

  await runOp(page, 'trace');
  // the waterfall's rows of one layer share a band, every other layer shaded; value labels carry a halo
  const wf = page.locator('[data-testid=result] svg:has(rect.wf-term)');
  expect(await wf.locator('.wf-layers rect[data-layer]').count()).toBeGreaterThan(0);
  expect(await wf.locator('text.wf-value').first().getAttribute('paint-order')).toBe('stroke');
  await shots(page, 'trace-waterfall', '[data-testid=result] svg:has(rect.wf-term)');

  // the status bar stays one line at 1024 px
  await page.setViewportSize({ width: 1024, height: 700 });
  const bar = await page.getByTestId('status-bar').boundingBox();
  expect(bar!.height).toBeLessThan(32);
  await page.setViewportSize({ width: 1280, height: 800 });
  expect(errors).toEqual([]);
});

test('9. tabs answer Home/End, the form names a bad layer or head itself, the picked B stays visible on hover, session prompts differ where they differ', async () => {
  await page.getByTestId('tab-trace').click();
  await page.getByTestId('tab-trace').focus();
  await page.keyboard.press('End');
  const last = await page.evaluate(() => (globalThis as any).__loupe.ops.at(-1).name);
  await expect(page.getByTestId(`tab-${last}`)).toHaveAttribute('aria-selected', 'true');
  await page.keyboard.press('Home');
  await expect(page.getByTestId('tab-trace')).toHaveAttribute('aria-selected', 'true');

  await page.getByTestId('tab-ablate').click();
  await page.locator('#p-ablate-layer').fill('1.5');
  await page.locator('#p-ablate-head').fill('-1');
  await page.getByTestId('run').click();
  await expect(page.locator('[data-field=layer] [role=alert]')).toContainText('not an integer');
  await expect(page.locator('[data-field=head] [role=alert]')).toContainText('at least 0');
  await page.locator('#p-ablate-layer').fill('');
  await page.locator('#p-ablate-head').fill('');

  // two prompts alike at the start: their session entries still differ
  const a = 'Once upon a time, there was a little girl who went to the shop';
  const b = 'Once upon a time, there was a little girl who went to the park';
  for (const prompt of [a, b]) {
    await page.getByTestId('prompt').fill(prompt);
    await runOp(page, 'trace');
  }
  const labels = await page.locator('[data-testid=session-entry][data-op=trace] .mono').allTextContents();
  expect(labels[0]).not.toBe(labels[1]);
  expect(labels[0]).toMatch(/park$/);
  const bBtn = page.getByTestId('session-b').first();
  await bBtn.click();
  await bBtn.hover();
  const c = await bBtn.evaluate((el) => {
    const s = getComputedStyle(el);
    return { fg: s.color, bg: s.backgroundColor };
  });
  expect(contrast(c.fg, c.bg), `${c.fg} on ${c.bg}`).toBeGreaterThan(3);
  await shots(page, 'session', '[data-testid=session]');
  expect(errors).toEqual([]);
});

test('9. near-zero tokens stay near the background in the dark theme; the Doctor without WebGPU reads cleanly', async ({
  site,
}) => {
  await page.getByTestId('prompt').fill(PROMPT);
  await page.getByTestId('tab-integrated_gradients').click();
  await page.locator('#p-integrated_gradients-corrupted_prompt').fill(PROMPT.replace('little', 'big'));
  await runOp(page, 'integrated_gradients');
  await page.getByRole('button', { name: /dark/i }).click();
  // redrawn in the dark theme's colours
  await page.waitForFunction(() => document.documentElement.dataset.theme === 'dark');
  await page.waitForTimeout(300);
  const cells = await page.$$eval('[data-testid=result] rect.tok-cell', (els) =>
    els.map((e) => ({ v: Number(e.getAttribute('data-value')), fill: getComputedStyle(e).fill })),
  );
  const bg = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  const max = Math.max(...cells.map((c) => Math.abs(c.v)));
  const small = cells.filter((c) => c.v !== 0 && Math.abs(c.v) < 0.05 * max);
  for (const c of small) expect(contrast(c.fill, bg), `a token at ${c.v} of ±${max}`).toBeLessThan(2);
  await page.getByRole('button', { name: /light/i }).click();
  await shots(page, 'ig-tokens', '[data-testid=result]');

  const b = await chromium.launch({
    executablePath: process.env.LOUPE_CHROMIUM ?? '/usr/bin/chromium',
    args: CHROMIUM_ARGS.filter((a) => a !== '--enable-unsafe-webgpu'),
  });
  try {
    const p = await (await b.newContext({ viewport: { width: 1280, height: 800 } })).newPage();
    await openReady(p, site.url);
    await p.getByRole('button', { name: 'Doctor' }).click();
    await expect(p.getByTestId('doc-webgpu')).toContainText('unavailable');
    const text = (await p.locator('body').textContent()) ?? '';
    expect(text).not.toMatch(/\.\)\.|\)\.\)/);
  } finally {
    await b.close();
  }
  expect(errors).toEqual([]);
});
