/**
 * The head_scores view on the bundled stories260K: the layer × head heatmap and the grid of every
 * head's pattern are drawn from the document (one cell per head, framed by the chosen score), the
 * score and source switches redraw them, and the page's document equals the CLI's --json (numbers within 1e-4; the backend differs). Screenshots at 1280×800 and 1024×700, both themes.
 */
import { test, expect, openReady, runOp, shot, pageDoc, watchErrors, compareDocs, PROMPT } from './fixtures';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

test('head_scores: heatmap and pattern grid per head, the same document as the CLI', async ({ page, site }) => {
  test.setTimeout(300_000);
  const errors = watchErrors(page);
  const t0 = Date.now();
  const step = (what: string) => console.log(`[e2e] head_scores ${what} at ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  await page.setViewportSize({ width: 1280, height: 800 });
  await openReady(page, site.url);
  await page.getByTestId('prompt').fill(PROMPT);
  step('page ready');
  await runOp(page, 'head_scores');
  step('run done');
  const doc = await pageDoc(page, 'head_scores');
  const { n_layers: L, n_heads: H } = doc.model;
  await expect(page.locator('[data-testid=head-scores-heatmap] rect.cell')).toHaveCount(L * H);
  const cells = page.locator('[data-testid=head-grid] figure.cell');
  await expect(cells).toHaveCount(L * H);
  const first = doc.heads[0];
  await expect(cells.first()).toHaveAttribute('data-score', String(first.induction));
  await page.getByTestId('score-previous_token').click();
  await expect(cells.first()).toHaveAttribute('data-score', String(first.previous_token));
  await expect(page.locator('[data-testid=head-scores-heatmap] rect.cell').first()).toHaveAttribute(
    'data-value',
    String(first.previous_token),
  );
  await page.getByTestId('source-prompt').click();
  await expect(cells.first()).toHaveAttribute('data-score', String(doc.prompt_scores.heads[0].previous_token));
  await page.getByTestId('source-random').click();
  await page.getByTestId('score-induction').click();

  for (const theme of ['light', 'dark']) {
    const current = await page.evaluate(() => document.documentElement.dataset.theme);
    if (current !== theme) await page.getByRole('button', { name: /Switch to .* theme/ }).click();
    for (const [w, h] of [
      [1280, 800],
      [1024, 700],
    ]) {
      await page.setViewportSize({ width: w, height: h });
      for (const id of ['head-scores-view', 'head-grid']) {
        await page.getByTestId(id).evaluate((e) => e.scrollIntoView({ block: 'start' }));
        await shot(page, `head-scores-${id}-${theme}-${w}`);
      }
      const overflow = await page.getByTestId('head-scores-view').evaluate((v) => v.scrollWidth - v.clientWidth);
      expect(overflow).toBeLessThanOrEqual(1);
    }
  }

  step('screenshots done');
  // the CLI (the same registry entry MCP calls)
  const { stdout } = await promisify(execFile)(
    process.execPath,
    ['bin/loupe.mjs', 'head_scores', 'default', doc.prompt, '--json'],
    { maxBuffer: 64 << 20 },
  );
  const node = JSON.parse(stdout);
  step('CLI done');
  // one assertion at the end: the patterns alone are ~10⁵ numbers, too many for one expect each
  const { bad, max } = compareDocs(node, doc, 1e-4, (p) => p === '.model.backend');
  expect(bad).toEqual([]);
  console.log(`[e2e] head_scores page (wasm) vs CLI --json: ${L}×${H} heads, max |Δ| = ${max.toExponential(2)}`);
  expect(errors).toEqual([]);
});
