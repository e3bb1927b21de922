/**
 * "Open a folder" in the model panel (issue 42, item 4): the bundled model's folder, picked through
 * the <input webkitdirectory> fallback, loads as a folder model in the in-page engine, and its
 * trace equals the bundled model's (same bytes, another source) within 1e-6. Shots of the picker.
 */
import { appendFileSync, copyFileSync, mkdirSync, mkdtempSync, rmSync, utimesSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import {
  test,
  expect,
  openReady,
  runOp,
  pageDoc,
  compareDocs,
  shotWidthsThemes,
  atWidthsAndThemes,
  shot,
  PROMPT,
} from './fixtures';

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

test("a folder is cached under its files' names, sizes and times: the same folder reopens from the cache, a touched file misses it", async ({
  page,
  site,
}) => {
  await openReady(page, site.url);
  const dir = path.join(mkdtempSync(path.join(tmpdir(), 'loupe-folder-')), 'tiny');
  const pick = async () => {
    // the model loaded now is marked: the next one is a new load's summary
    await page.evaluate(() => ((globalThis as any).__loupe.model.seen = true));
    await page.getByTestId('folder-input').setInputFiles(dir);
    await page.waitForFunction(
      () => {
        const s = (globalThis as any).__loupe;
        return s.modelStatus === 'ready' && !s.model?.seen && s.model?.ref.id === 'folder:tiny';
      },
      null,
      { timeout: 60_000 },
    );
    return page.evaluate(() => {
      const s = (globalThis as any).__loupe;
      return {
        revision: s.model.ref.revision as string,
        files: s.loadFiles.map((f: { file: string; cached: boolean }) => [f.file, f.cached]) as [string, boolean][],
      };
    });
  };
  // the cache list is refreshed after a load (and an older copy dropped) in the background: poll it
  const cachedFolders = () =>
    page.evaluate(() =>
      (globalThis as any).__loupe.cache
        .filter((c: { endpoint: string }) => c.endpoint === 'folder')
        .map((c: { id: string; revision: string; complete: boolean }) => ({
          id: c.id,
          revision: c.revision,
          complete: c.complete,
        })),
    );
  try {
    mkdirSync(dir);
    for (const f of ['config.json', 'tokenizer.json', 'tokenizer_config.json', 'model.safetensors'])
      copyFileSync(path.join('public/models/stories260K', f), path.join(dir, f));
    await page.getByRole('tab', { name: 'Folder' }).click();

    const first = await pick();
    console.log(`[e2e] folder first open: ${first.revision}, ${JSON.stringify(first.files)}`);
    expect(first.revision).toMatch(/^local-[0-9a-f]{16}$/);
    expect(first.files.filter(([, c]) => c)).toEqual([]);
    await expect(page.getByTestId('local-folder')).toHaveText('a local folder');

    const again = await pick();
    console.log(`[e2e] folder reopened: ${again.revision}, ${JSON.stringify(again.files)}`);
    expect(again.revision).toBe(first.revision);
    expect(again.files.length).toBeGreaterThan(0);
    expect(again.files.filter(([, c]) => !c)).toEqual([]);
    await expect
      .poll(cachedFolders, { timeout: 20_000 })
      .toEqual([{ id: 'folder:tiny', revision: first.revision, complete: true }]);
    await expect(page.getByTestId('cache-local')).toContainText('a local folder');
    await page.getByTestId('cache-heading').scrollIntoViewIfNeeded();
    await atWidthsAndThemes(page, (tag) => shot(page, `model-folder-cached-${tag}`));

    // the same size, another time: the fingerprint moves and every file is read from the folder again
    const t = new Date(Date.now() + 120_000);
    utimesSync(path.join(dir, 'config.json'), t, t);
    const touched = await pick();
    console.log(`[e2e] folder after touching config.json: ${touched.revision}, ${JSON.stringify(touched.files)}`);
    expect(touched.revision).not.toBe(first.revision);
    expect(touched.files.filter(([, c]) => c)).toEqual([]);
    // the older copy of the same folder is dropped
    await expect
      .poll(async () => (await cachedFolders()).map((c: { revision: string }) => c.revision), { timeout: 20_000 })
      .toEqual([touched.revision]);

    // another size (a byte more in the tokenizer's config, still valid JSON): a miss too
    appendFileSync(path.join(dir, 'tokenizer_config.json'), ' ');
    const grown = await pick();
    expect(grown.revision).not.toBe(touched.revision);
    expect(grown.files.filter(([, c]) => c)).toEqual([]);
  } finally {
    rmSync(path.dirname(dir), { recursive: true, force: true });
  }
});
