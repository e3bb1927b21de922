/**
 * "Open a folder" in the model panel (issue 42, item 4): the bundled model's folder, picked through
 * the <input webkitdirectory> fallback, loads as a folder model in the in-page engine, and its
 * trace equals the bundled model's (same bytes, another source) within 1e-6. Shots of the picker.
 */
import { copyFileSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
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

test('a folder without config.json is refused with a structured error, and the loaded model stays', async ({
  page,
  site,
}) => {
  await openReady(page, site.url);
  const dir = path.join(mkdtempSync(path.join(tmpdir(), 'loupe-folder-')), 'half');
  try {
    mkdirSync(dir);
    copyFileSync('public/models/stories260K/tokenizer.json', path.join(dir, 'tokenizer.json'));
    await page.getByRole('tab', { name: 'Folder' }).click();
    await page.getByTestId('folder-input').setInputFiles(dir);
    await page.waitForFunction(() => (globalThis as any).__loupe.models.error, null, { timeout: 30_000 });
    const err = await page.evaluate(() => (globalThis as any).__loupe.models.error);
    console.log(`[e2e] folder without config.json: ${err.code}: ${err.message}`);
    expect(err.code).toBe('MISSING_CONFIG');
    expect(err.message).toContain('folder:half has no config.json');
    expect(await page.evaluate(() => (globalThis as any).__loupe.model?.info.id)).toBe('stories260K');
  } finally {
    rmSync(path.dirname(dir), { recursive: true, force: true });
  }
});
