/**
 * Compare, pins, history and session files (issue 13): results go to the session (IndexedDB) and
 * come back after a reload; two results side by side with Δ = B − A (trace DLA, attention of
 * both); pins survive Clear; a session exported as one file imports into a fresh browser.
 */
import { readFileSync } from 'node:fs';
import type { BrowserContext, Page } from '@playwright/test';
import { test, expect, openReady, runOp, shot, pageDoc, watchErrors } from './fixtures';

test.describe.configure({ mode: 'serial' });

let context: BrowserContext;
let page: Page;
let errors: string[];
const P1 = 'Once upon a time, there was a little';
const P2 = 'Lily went to the park with her dog';

test.beforeAll(async ({ browser, site }) => {
  context = await browser.newContext({ viewport: { width: 1280, height: 800 }, acceptDownloads: true });
  page = await context.newPage();
  errors = watchErrors(page);
  await openReady(page, site.url);
});
test.afterAll(async () => {
  await context.close();
});

const entries = () => page.getByTestId('session-entry');

test('two traces side by side with their Δ', async () => {
  await page.getByTestId('prompt').fill(P1);
  await runOp(page, 'trace');
  const a = await pageDoc(page, 'trace');
  await page.getByTestId('prompt').fill(P2);
  await runOp(page, 'trace');
  const b = await pageDoc(page, 'trace');
  await expect(entries()).toHaveCount(2);
  // newest first: the second entry is A (P1), the first B (P2)
  await entries().nth(1).getByTestId('session-a').click();
  await entries().nth(0).getByTestId('session-b').click();
  const cmp = page.getByTestId('compare');
  await expect(cmp).toHaveAttribute('data-op', 'trace');
  const L = a.head_attribution.length,
    H = a.head_attribution[0].length;
  await expect(cmp.locator('[data-testid=compare-delta] rect.cell')).toHaveCount(L * H);
  const cell = cmp.locator('[data-testid=compare-delta] rect.cell[data-row="1"][data-col="2"]');
  expect(Number(await cell.getAttribute('data-value'))).toBeCloseTo(
    b.head_attribution[1][2] - a.head_attribution[1][2],
    6,
  );
  expect(
    Number(
      await cmp.locator('[data-testid=compare-a] rect.cell[data-row="1"][data-col="2"]').getAttribute('data-value'),
    ),
  ).toBe(a.head_attribution[1][2]);
  await shot(page, 'compare-trace');
});

test('two attention results: both patterns', async () => {
  await page.getByTestId('prompt').fill(P1);
  await runOp(page, 'attention');
  await page.getByTestId('prompt').fill(P2);
  await runOp(page, 'attention');
  const att = page.locator('[data-testid=session-entry][data-op=attention]');
  await att.nth(1).getByTestId('session-a').click();
  await att.nth(0).getByTestId('session-b').click();
  const cmp = page.getByTestId('compare');
  await expect(cmp).toHaveAttribute('data-op', 'attention');
  await expect(cmp.locator('[data-testid=compare-a] rect.cell').first()).toBeAttached();
  await expect(cmp.locator('[data-testid=compare-b] rect.cell').first()).toBeAttached();
  await shot(page, 'compare-attention');
  await cmp.getByRole('button', { name: 'Close the comparison' }).click();
});

test('two logit lenses of one prompt: Δ is zero in every cell', async () => {
  await page.getByTestId('prompt').fill(P1);
  await runOp(page, 'logit_lens');
  const lens = await pageDoc(page, 'logit_lens');
  await runOp(page, 'logit_lens');
  const ll = page.locator('[data-testid=session-entry][data-op=logit_lens]');
  await ll.nth(1).getByTestId('session-a').click();
  await ll.nth(0).getByTestId('session-b').click();
  const cmp = page.getByTestId('compare');
  await expect(cmp).toHaveAttribute('data-op', 'logit_lens');
  const cells = cmp.locator('[data-testid=compare-delta] rect.cell');
  await expect(cells).toHaveCount(lens.layers.length * lens.positions.length);
  const values = await cells.evaluateAll((els) => els.map((e) => Number(e.getAttribute('data-value'))));
  expect(values.every((v) => v === 0)).toBe(true);
  await cmp.getByRole('button', { name: 'Close the comparison' }).click();
});

/** pick the newest two entries of an operation as A (older) and B (newer) */
async function pickAB(op: string, older = 1, newer = 0): Promise<void> {
  const list = page.locator(`[data-testid=session-entry][data-op=${op}]`);
  await list.nth(older).getByTestId('session-a').click();
  await list.nth(newer).getByTestId('session-b').click();
  await expect(page.getByTestId('compare')).toHaveAttribute('data-op', op);
}
const close = () => page.getByTestId('compare').getByRole('button', { name: 'Close the comparison' }).click();
const deltaCell = (r: number, c: number) =>
  page.locator(`[data-testid=compare-delta] rect.cell[data-row="${r}"][data-col="${c}"]`);

test('activations, patch and ablate results have a Δ too (matched by row and column names)', async () => {
  // activations of two prompts: Δ of each statistic per layer × site
  await page.getByTestId('prompt').fill(P1);
  await runOp(page, 'activations');
  const a = await pageDoc(page, 'activations');
  await page.getByTestId('prompt').fill(P2);
  await runOp(page, 'activations');
  const b = await pageDoc(page, 'activations');
  await pickAB('activations');
  const site0 = a.layers[0].sites[0].site;
  await expect(page.getByTestId('compare-grid')).toHaveValue('mean');
  await expect(page.locator('[data-testid=compare-delta] rect.cell')).toHaveCount(
    a.layers.length * a.layers[0].sites.length,
  );
  expect(Number(await deltaCell(1, 0).getAttribute('data-value'))).toBeCloseTo(
    b.layers[1].sites.find((s: any) => s.site === site0).mean - a.layers[1].sites[0].mean,
    6,
  );
  await page.getByTestId('compare-grid').selectOption('max');
  expect(Number(await deltaCell(0, 0).getAttribute('data-value'))).toBeCloseTo(
    b.layers[0].sites.find((s: any) => s.site === site0).max - a.layers[0].sites[0].max,
    6,
  );
  await page.getByTestId('compare-delta').scrollIntoViewIfNeeded();
  await shot(page, 'compare-activations');
  await close();

  // patch twice on the example: every map has a Δ, zero everywhere (the same inputs)
  await runOp(page, 'patch', { example: true });
  const p1 = await pageDoc(page, 'patch');
  await runOp(page, 'patch', { example: true });
  await pickAB('patch');
  await expect(page.getByTestId('compare-grid')).toHaveValue('resid_pre');
  await page.getByTestId('compare-grid').selectOption('head_out');
  const cells = page.locator('[data-testid=compare-delta] rect.cell');
  await expect(cells).toHaveCount(p1.head_out.length * p1.head_out[0].length);
  expect(
    (await cells.evaluateAll((els) => els.map((e) => Number(e.getAttribute('data-value'))))).every((v) => v === 0),
  ).toBe(true);
  await page.getByTestId('compare-delta').scrollIntoViewIfNeeded();
  await shot(page, 'compare-patch');
  await close();

  // ablate: rows are the targets, matched by label (not by rank)
  await runOp(page, 'ablate', { example: true });
  const ab = await pageDoc(page, 'ablate');
  await runOp(page, 'ablate', { example: true });
  await pickAB('ablate');
  await expect(page.locator('[data-testid=compare-delta] rect.cell')).toHaveCount(ab.entries.length);
  await expect(page.getByTestId('compare-delta')).toContainText(ab.entries[0].label);
  await close();
  expect(errors).toEqual([]);
});

test('results that are not comparable say so', async () => {
  // attention over prompts of different lengths: both patterns, no Δ, and why
  await page.getByTestId('prompt').fill(P1);
  await runOp(page, 'attention');
  await page.getByTestId('prompt').fill('Once upon a time');
  await runOp(page, 'attention');
  await pickAB('attention');
  await expect(page.locator('[data-testid=compare-a] svg')).toBeVisible();
  await expect(page.locator('[data-testid=compare-b] svg')).toBeVisible();
  await expect(page.getByTestId('compare-delta')).toHaveCount(0);
  await expect(page.getByTestId('compare-no-delta')).toContainText('Not comparable: the two have different positions');
  await page.getByTestId('compare-no-delta').scrollIntoViewIfNeeded();
  await shot(page, 'compare-not-comparable');
  await close();
  // two different operations
  await page.locator('[data-testid=session-entry][data-op=attention]').first().getByTestId('session-a').click();
  await page.locator('[data-testid=session-entry][data-op=activations]').first().getByTestId('session-b').click();
  await expect(page.getByTestId('compare-not-comparable')).toContainText(
    'A is a result of Attention and B of Activations',
  );
  await close();
  expect(errors).toEqual([]);
});

test('pins and history survive a reload', async () => {
  const n = await entries().count();
  await entries().last().getByTestId('session-pin').click();
  await expect(entries().first()).toHaveAttribute('data-pinned', 'true');
  await page.reload();
  await expect(entries()).toHaveCount(n, { timeout: 60_000 });
  await expect(entries().first()).toHaveAttribute('data-pinned', 'true');
  // the newest result of the selected operation is back without running anything
  await page.getByTestId('tab-trace').click();
  await expect(
    page.locator('[data-testid=result][data-op=trace] [data-testid=trace-heatmap] rect.cell').first(),
  ).toBeAttached();
  await expect(page.getByTestId('job')).toHaveCount(0);
  expect(errors).toEqual([]);
});

test('a session exported as one file imports into a fresh browser', async ({ browser, site }) => {
  const n = await entries().count();
  const [dl] = await Promise.all([page.waitForEvent('download'), page.getByTestId('session-export').click()]);
  const path = await dl.path();
  const file = JSON.parse(readFileSync(path!, 'utf8'));
  expect(file.format).toBe('loupe-session');
  expect(file.entries.length).toBe(n);
  const fresh = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  try {
    const p2 = await fresh.newPage();
    const errs = watchErrors(p2);
    await openReady(p2, site.url);
    await expect(p2.getByTestId('session-entry')).toHaveCount(0);
    await p2.getByTestId('session-import').setInputFiles(path!);
    await expect(p2.getByTestId('session-entry')).toHaveCount(n);
    await expect(p2.getByTestId('session-import-msg')).toContainText(`Imported ${n}`);
    await p2.locator('[data-testid=session-entry][data-op=trace]').first().getByRole('button').first().click();
    await expect(
      p2.locator('[data-testid=result][data-op=trace] [data-testid=trace-heatmap] rect.cell').first(),
    ).toBeAttached();
    // a file that is not a session says so
    await p2
      .getByTestId('session-import')
      .setInputFiles({ name: 'x.json', mimeType: 'application/json', buffer: Buffer.from('{"a":1}') });
    await expect(p2.getByTestId('session-import-msg')).toContainText('not a Loupe session file');
    expect(errs).toEqual([]);
  } finally {
    await fresh.close();
  }
  // Clear forgets everything but the pinned entry
  await page.getByRole('button', { name: 'Clear' }).click();
  await expect(entries()).toHaveCount(1);
  await expect(entries().first()).toHaveAttribute('data-pinned', 'true');
});
