/**
 * The causality view in the page on the bundled stories260K: the verdict, its reason and the
 * three check panels are drawn from the document, and the page's document equals the CLI's --json
 * for the same input (every number within 1e-4; the backend differs). Screenshots of the view at
 * 1280×800 and 1024×700 in both themes.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { test, expect, openReady, runOp, shot, pageDoc, watchErrors } from './fixtures';

test('causality: three panels with the verdict, and the same document as the CLI', async ({ page, site }) => {
  test.setTimeout(300_000);
  const errors = watchErrors(page);
  await page.setViewportSize({ width: 1280, height: 800 });
  await openReady(page, site.url);
  await runOp(page, 'causality', { example: true });
  const doc = await pageDoc(page, 'causality');
  await expect(page.getByTestId('verdict')).toHaveAttribute('data-verdict', doc.verdict);
  await expect(page.getByTestId('verdict-reason')).toHaveText(doc.verdict_reason);
  await expect(page.getByTestId('percentile')).toHaveText(doc.random_baseline.normalized.percentile.toFixed(1));
  await expect(page.getByTestId('raw-percentile')).toHaveText(doc.random_baseline.raw.percentile.toFixed(1));
  await expect(page.getByTestId('check-baseline')).toHaveAttribute(
    'data-flag',
    doc.control_normalization.softmax_epiphenomenon ? 'softmax' : 'ok',
  );
  await expect(page.getByTestId('check-template')).toHaveAttribute(
    'data-flag',
    doc.template_control.template_epiphenomenon ? 'template' : 'ok',
  );
  await expect(page.getByTestId('check-rigidity')).toHaveAttribute(
    'data-flag',
    doc.structural_rigidity.holds ? 'ok' : 'fails',
  );
  await expect(page.locator('[data-testid=check-template] table.prompts tbody tr')).toHaveCount(
    1 + doc.template_control.prompts.length,
  );
  await expect(page.locator('[data-testid=causality-hist] rect.hist-bin')).not.toHaveCount(0);
  await expect(page.locator('[data-testid=causality-sweep] path').first()).toBeAttached();

  for (const theme of ['light', 'dark']) {
    const current = await page.evaluate(() => document.documentElement.dataset.theme);
    if (current !== theme) await page.getByRole('button', { name: /Switch to .* theme/ }).click();
    for (const [w, h] of [
      [1280, 800],
      [1024, 700],
    ]) {
      await page.setViewportSize({ width: w, height: h });
      for (const id of ['causality-view', 'check-template', 'check-rigidity']) {
        await page.getByTestId(id).evaluate((e) => e.scrollIntoView({ block: 'start' }));
        await shot(page, `causality-${id}-${theme}-${w}`);
      }
      // nothing in the view is wider than its card
      const overflow = await page.getByTestId('causality-view').evaluate((v) => v.scrollWidth - v.clientWidth);
      expect(overflow).toBeLessThanOrEqual(1);
    }
  }

  const args = [
    'bin/loupe.mjs',
    'causality',
    'default',
    doc.prompt,
    '--layer',
    String(doc.layer),
    '--direction',
    'tokens: happy - big', // the example's direction, whose spec the document expands
    '--n-random',
    String(doc.random_baseline.n),
    '--json',
  ];
  const { stdout } = await promisify(execFile)(process.execPath, args, { maxBuffer: 64 << 20 });
  const cli = JSON.parse(stdout);
  let max = 0;
  const walk = (x: unknown, y: unknown, p: string): void => {
    if (p === '.model.backend') return;
    if (typeof x === 'number' && typeof y === 'number') {
      const d = Math.abs(x - y);
      max = Math.max(max, d);
      expect(d, `${p}: ${x} vs ${y}`).toBeLessThanOrEqual(1e-4);
      return;
    }
    if (Array.isArray(x) && Array.isArray(y)) {
      expect(y.length, `${p}.length`).toBe(x.length);
      x.forEach((v, i) => walk(v, y[i], `${p}[${i}]`));
      return;
    }
    if (x && y && typeof x === 'object' && typeof y === 'object') {
      expect(Object.keys(y).sort(), `${p} keys`).toEqual(Object.keys(x).sort());
      for (const k of Object.keys(x)) walk((x as any)[k], (y as any)[k], `${p}.${k}`);
      return;
    }
    expect(y, p).toEqual(x);
  };
  walk(cli, doc, '');
  console.log(`[e2e] causality page (wasm) vs CLI --json: verdict ${doc.verdict}, max |Δ| = ${max.toExponential(2)}`);
  expect(errors).toEqual([]);
});
