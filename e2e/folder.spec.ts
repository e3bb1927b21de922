/**
 * "Open a folder" in the model panel (issue 42, item 4): the bundled model's folder, picked through
 * the <input webkitdirectory> fallback, loads as a folder model in the in-page engine, and its
 * trace equals the bundled model's (same bytes, another source) within 1e-6. Shots of the picker.
 */
import path from 'node:path';
import { test, expect, openReady, runOp, pageDoc, compareDocs, shotWidthsThemes, PROMPT } from './fixtures';

test('a model folder picked in the page loads, and traces as the bundled model does', async ({ page, site }) => {
  await openReady(page, site.url);
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'trace');
  const bundled = await pageDoc(page, 'trace');

  await page.getByRole('tab', { name: 'Folder' }).click();
  await expect(page.getByTestId('open-folder')).toBeVisible();
  await shotWidthsThemes(page, 'model-folder');
  await page.getByRole('button', { name: /light/i }).click();
  await page.getByTestId('folder-input').setInputFiles(path.resolve('public/models/stories260K'));
  await page.waitForFunction(
    () => {
      const a = (globalThis as any).__loupe;
      return a.modelStatus === 'ready' && /^folder:stories260K$/.test(a.model?.ref.id ?? '');
    },
    null,
    { timeout: 60_000 },
  );
  await runOp(page, 'trace');
  const folder = await pageDoc(page, 'trace');
  // the model's name and source differ (the folder's), every number and token must not
  const { bad, max } = compareDocs(folder, bundled, 1e-6, (p) => p.startsWith('.model'));
  console.log(`[e2e] folder vs bundled trace: max |Δ| = ${max.toExponential(2)}`);
  expect(bad).toEqual([]);
});
