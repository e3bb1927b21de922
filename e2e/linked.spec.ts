/**
 * Linked views (issue 13): a head is one object in every view — clicking it in the trace heatmap,
 * the top-heads table, circuit bars or the patch map opens `L{l}H{h} pattern` with actions that
 * fill the ablate / patch / steer forms (no JSON typed); hovering a token highlights that position
 * in every view that draws positions; clicking a token fills the form's positions.
 */
import type { BrowserContext, Page } from '@playwright/test';
import { test, expect, openReady, runOp, shot, pageDoc, watchErrors, PROMPT } from './fixtures';

test.describe.configure({ mode: 'serial' });

let context: BrowserContext;
let page: Page;
let errors: string[];

test.beforeAll(async ({ browser, site }) => {
  context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  errors = watchErrors(page);
  await openReady(page, site.url);
});
test.afterAll(async () => {
  await context.close();
});

test('clicking a head in the trace heatmap opens its pattern on the prompt, with ablate / steer actions', async () => {
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'trace');
  await page.locator('[data-testid=trace-heatmap] rect.cell[data-row="1"][data-col="2"]').click();
  const panel = page.getByTestId('head-panel');
  await expect(panel.getByRole('heading')).toHaveText('L1H2 pattern');
  // the pattern is the attention operation's, for this head, on the prompt
  await expect(panel.locator('[data-testid=head-pattern] rect.cell').first()).toBeAttached();
  const T = (await pageDoc(page, 'trace')).tokens.length;
  await expect(panel.locator('[data-testid=head-pattern] rect.cell')).toHaveCount(T * T);
  // the same head is selected in the trace view's table
  await expect(page.getByTestId('selected-head')).toContainText('L1H2');
  await shot(page, 'linked-head-panel');

  await panel.getByTestId('head-ablate').click();
  await expect(page.getByTestId('tab-ablate')).toHaveAttribute('aria-selected', 'true');
  await expect(page.locator('#p-ablate-layer')).toHaveValue('1');
  await expect(page.locator('#p-ablate-head')).toHaveValue('2');
  await runOp(page, 'ablate');
  const ab = await pageDoc(page, 'ablate');
  expect(JSON.stringify(ab.interventions ?? ab.targets ?? ab)).toContain('"head":2');

  await panel.getByTestId('head-steer').click();
  await expect(page.getByTestId('tab-steer')).toHaveAttribute('aria-selected', 'true');
  await expect(page.locator('#p-steer-direction')).toHaveValue(/"kind":"head","layer":1,"head":2/);
  await runOp(page, 'steer');
  const st = await pageDoc(page, 'steer');
  expect(st.direction.kind).toBe('head');
  expect(st.direction.description).toContain('L1H2');
  expect(errors).toEqual([]);
});

test('the top-heads table, the patch head map and circuit bars open the same head', async () => {
  await page.getByTestId('tab-trace').click();
  const first = page.locator('[data-testid=top-heads] tr[data-head]').first();
  const label = (await first.getAttribute('data-head'))!;
  await first.click();
  await expect(page.getByTestId('head-panel').getByRole('heading')).toHaveText(`${label} pattern`);

  await runOp(page, 'patch', { example: true });
  await page.locator('[data-testid=patch-heads] rect.cell[data-row="0"][data-col="1"]').click();
  await expect(page.getByTestId('head-panel').getByRole('heading')).toHaveText('L0H1 pattern');

  await runOp(page, 'circuit', { example: true });
  const bar = page.locator('[data-testid=circuit-singles] rect.bar[data-label^="L"][data-label*="H"]').first();
  const barLabel = (await bar.getAttribute('data-label'))!;
  await bar.click();
  await expect(page.getByTestId('head-panel').getByRole('heading')).toHaveText(`${barLabel} pattern`);
  // and the bar of the head in focus is outlined
  await expect(page.locator(`[data-testid=circuit-singles] rect.bar[data-label="${barLabel}"]`)).not.toHaveAttribute(
    'stroke',
    'none',
  );

  // the attention view shows the head in focus
  await runOp(page, 'attention');
  const [l, h] = barLabel.slice(1).split('H');
  await expect(page.locator('#att-layer')).toHaveValue(l);
  await expect(page.locator('#att-head')).toHaveValue(h);
});

test('the head panel\'s "patch" patches that head only', async () => {
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'trace');
  await page.locator('[data-testid=trace-heatmap] rect.cell[data-row="1"][data-col="2"]').click();
  await expect(page.getByTestId('head-panel').getByRole('heading')).toHaveText('L1H2 pattern');
  await page.getByTestId('head-patch').click();
  await expect(page.getByTestId('tab-patch')).toHaveAttribute('aria-selected', 'true');
  await expect(page.locator('#p-patch-heads')).toHaveValue('[{"layer":1,"head":2}]');
  // the example gives the corrupted prompt; the head stays chosen
  await runOp(page, 'patch', { example: true });
  const doc = await pageDoc(page, 'patch');
  expect(doc.n_variants).toBe(1);
  expect(doc.interventions).toEqual([
    { hook: 'blocks.1.attn.hook_z', op: 'patch', head: 2, positions: 'all', from: "the clean prompt's run" },
  ]);
  expect(doc.resid_pre).toBeNull();
  expect(doc.head_out[1][2]).toEqual(expect.any(Number));
  expect(doc.head_out.flat().filter((v: number | null) => v !== null)).toHaveLength(1);
  // the head map shows that one cell; the others say they were not patched
  await expect(page.locator('[data-testid=patch-heads] rect.cell[data-row="1"][data-col="2"]')).toHaveAttribute(
    'data-value',
    String(doc.head_out[1][2]),
  );
  await expect(page.locator('[data-testid=patch-heads] rect.cell[data-value="null"]')).toHaveCount(
    doc.head_out.flat().length - 1,
  );
  await page.getByTestId('patch-heads').scrollIntoViewIfNeeded();
  await shot(page, 'linked-head-patch');
  expect(errors).toEqual([]);
});

test('hovering a token highlights its position in every view; clicking it fills positions', async () => {
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'trace');
  await page.locator('[data-testid=trace-heatmap] rect.cell').first().click();
  await expect(page.locator('[data-testid=head-pattern] rect.cell').first()).toBeAttached();
  // hover position 3 in the trace view's token strip: the head panel's pattern column 3 lights up
  await page.locator('[data-testid=trace-view] .token[data-pos="3"]').hover();
  const cell = page.locator('[data-testid=head-pattern] rect.cell[data-pos="3"]').first();
  await expect.poll(() => cell.evaluate((e) => getComputedStyle(e).strokeWidth)).toBe('2px');
  const other = page.locator('[data-testid=head-pattern] rect.cell[data-pos="2"]').first();
  expect(await other.evaluate((e) => getComputedStyle(e).strokeWidth)).not.toBe('2px');
  await shot(page, 'linked-token-hover');
  // the logit lens draws positions too
  await runOp(page, 'logit_lens');
  await page.locator('[data-testid=head-panel] .tok[data-pos="3"]').hover();
  await expect
    .poll(() =>
      page
        .locator('[data-testid=logit-lens-heatmap] rect.cell[data-pos="3"]')
        .first()
        .evaluate((e) => getComputedStyle(e).strokeWidth),
    )
    .toBe('2px');

  // a click on a token adds its position to the current form's positions
  await page.getByTestId('tab-ablate').click();
  await page.locator('#p-ablate-positions').fill('');
  await page.locator('[data-testid=head-panel] .tok[data-pos="5"]').click();
  await page.locator('[data-testid=head-panel] .tok[data-pos="3"]').click();
  await expect(page.locator('#p-ablate-positions')).toHaveValue('3, 5');
  // on a tab without positions (trace), the click goes to ablate's
  await page.getByTestId('tab-trace').click();
  await page.locator('[data-testid=head-panel] .tok[data-pos="3"]').click();
  await page.getByTestId('tab-ablate').click();
  await expect(page.locator('#p-ablate-positions')).toHaveValue('5');
  expect(errors).toEqual([]);
});
