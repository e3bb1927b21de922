/**
 * Screenshots of the views changed for issue 13's last items, at 1280×800 and 1024×700, light and
 * dark: a large attention result drawn as bitmaps, the patch map of one head (the head panel's
 * "patch"), the head panel, and Compare with a Δ and with the reason it has none. Each shot is of
 * the viewport with the element scrolled to its top; the test also checks nothing in those cards is wider than the card.
 */
import { test, expect, atWidthsAndThemes, openReady, runOp, pageDoc, watchErrors, PROMPT } from './fixtures';

const LONG = Array.from(
  { length: 5 },
  () => 'Once upon a time, there was a little girl named Lily who loved to play.',
).join(' ');

test('the changed views at both sizes in both themes', async ({ page, site }) => {
  test.setTimeout(300_000);
  const errors = watchErrors(page);
  await page.setViewportSize({ width: 1280, height: 800 });
  await openReady(page, site.url);
  await page.getByTestId('prompt').fill(LONG);
  await runOp(page, 'attention');
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'activations');
  await page.getByTestId('prompt').fill('Lily went to the park with her dog');
  await runOp(page, 'activations');
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'trace');
  await page.locator('[data-testid=trace-heatmap] rect.cell[data-row="1"][data-col="2"]').click();
  await expect(page.locator('[data-testid=head-pattern] rect.cell').first()).toBeAttached();
  await page.getByTestId('head-patch').click();
  await runOp(page, 'patch', { example: true });
  expect((await pageDoc(page, 'patch')).n_variants).toBe(1);

  /** the viewport with the element scrolled to its top (an element shot of a card inside the scrolling main pane comes out garbled) */
  const shotOf = async (sel: string, name: string) => {
    await page
      .locator(sel)
      .first()
      .evaluate((el) => el.scrollIntoView({ block: 'start', behavior: 'instant' }));
    await page.mouse.move(0, 0);
    await page.screenshot({ path: `artifacts/screenshots/${name}.png` });
  };
  /** no element of the card reaches past its right edge */
  const fits = (sel: string) =>
    page
      .locator(sel)
      .first()
      .evaluate((card) => {
        const right = card.getBoundingClientRect().right + 1;
        return [...card.querySelectorAll('*')]
          .filter((el) => {
            const r = el.getBoundingClientRect();
            return r.width > 0 && r.right > right;
          })
          .map((el) => el.tagName);
      });

  await atWidthsAndThemes(page, async (tag) => {
    await page.getByTestId('tab-attention').click();
    await expect(page.locator('[data-testid=attention-pattern] svg')).toHaveAttribute('data-render', 'raster');
    expect(await fits('[data-testid=result]')).toEqual([]);
    await shotOf('[data-testid=result]', `views-attention-raster-${tag}`);
    await page.getByTestId('tab-patch').click();
    await expect(page.locator('[data-testid=patch-heads] rect.cell[data-value="null"]').first()).toBeAttached();
    expect(await fits('[data-testid=result]')).toEqual([]);
    await shotOf('[data-testid=result]', `views-patch-one-head-${tag}`);
    expect(await fits('[data-testid=head-panel]')).toEqual([]);
    await shotOf('[data-testid=head-panel]', `views-head-panel-${tag}`);
    // Compare: two activations (Δ), then two attentions of different prompts (no Δ, and why)
    const acts = page.locator('[data-testid=session-entry][data-op=activations]');
    await acts.nth(1).getByTestId('session-a').click();
    await acts.nth(0).getByTestId('session-b').click();
    await expect(page.locator('[data-testid=compare-delta] rect.cell').first()).toBeAttached();
    expect(await fits('[data-testid=compare]')).toEqual([]);
    await shotOf('[data-testid=compare]', `views-compare-delta-${tag}`);
    await acts.nth(1).getByTestId('session-a').click();
    await acts.nth(0).getByTestId('session-b').click();
    await page.locator('[data-testid=session-entry][data-op=attention]').first().getByTestId('session-a').click();
    await page.locator('[data-testid=session-entry][data-op=trace]').first().getByTestId('session-b').click();
    await expect(page.getByTestId('compare-not-comparable')).toBeVisible();
    await shotOf('[data-testid=compare]', `views-compare-not-comparable-${tag}`);
    await page.getByTestId('compare').getByRole('button', { name: 'Close the comparison' }).click();
  });
  expect(errors).toEqual([]);
});
