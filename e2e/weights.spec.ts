/**
 * The weight precision control: an F16 model from a loopback Hub mimic loaded with weights
 * "stored" runs with 16-bit weights in the page's worker, says so next to the control, and its
 * trace document records it — with the same numbers as the CLI on the same model and precision.
 */
import { execFileSync } from 'node:child_process';
import type { BrowserContext, Page } from '@playwright/test';
import {
  test,
  expect,
  openReady,
  loadFromHub,
  waitModelReady,
  runOp,
  shot,
  watchErrors,
  pageDoc,
  PROMPT,
  shotWidthsThemes,
} from './fixtures';
import { ALL_FAMILY_CASES, makeCaseModel, type RandomModel } from '../tests/reference';

test.describe.configure({ mode: 'serial' });

const REPO = 'loupe-test/gpt2-f16';
let context: BrowserContext;
let page: Page;
let rm: RandomModel;

test.beforeAll(async ({ browser, hub }) => {
  rm = makeCaseModel(
    ALL_FAMILY_CASES.find((c) => c.name === 'gpt2-tied')!,
    { dtype: 'F16' },
  );
  hub.addRepo(REPO, rm.dir);
  context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  watchErrors(page);
});
test.afterAll(async () => {
  await context.close();
  rm?.cleanup();
});

test('weights "stored": the page runs 16-bit weights, shows it, and the document records it', async ({ site, hub }) => {
  await openReady(page, site.url);
  await page.locator('#weights').selectOption('stored');
  await waitModelReady(page);
  await loadFromHub(page, hub.url, REPO);
  await expect(page.getByTestId('status-model')).toContainText(REPO, { timeout: 90_000 });
  await waitModelReady(page);
  await expect(page.getByTestId('weights-used')).toHaveText('using stored');
  await page.getByTestId('prompt').fill(PROMPT);
  await page.getByTestId('tab-trace').click();
  await runOp(page, 'trace');
  const doc = await pageDoc(page, 'trace');
  expect(doc.model.weights).toBe('stored');
  expect(doc.model.dtype).toBe('F16');
  const cli = JSON.parse(
    execFileSync(process.execPath, ['bin/loupe.mjs', 'trace', rm.dir, PROMPT, '--json', '--weights', 'stored'], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }),
  );
  expect(cli.model.weights).toBe('stored');
  let d = 0;
  for (let r = 0; r < cli.head_attribution.length; r++)
    for (let c = 0; c < cli.head_attribution[r].length; c++)
      d = Math.max(d, Math.abs(cli.head_attribution[r][c] - doc.head_attribution[r][c]));
  expect(d).toBeLessThan(1e-4);
  await expect(page.getByTestId('status-dtype')).toHaveText('dtype: F16 · stored');
  await page.locator('#weights').scrollIntoViewIfNeeded();
  await shotWidthsThemes(page, 'model-weights-stored');
});

test('weights "q8" on WASM: the page runs 8-bit matrices, says so, and its trace equals the CLI\'s q8 trace', async () => {
  test.setTimeout(240_000);
  await page.setViewportSize({ width: 1280, height: 800 });
  await page.locator('#backend').selectOption('wasm');
  await waitModelReady(page);
  await page.locator('#weights').selectOption('q8');
  await waitModelReady(page);
  await expect(page.getByTestId('status-model')).toContainText(REPO);
  await expect(page.getByTestId('weights-used')).toHaveText('using q8');
  await expect(page.getByTestId('status-dtype')).toHaveText('dtype: F16 · q8');
  await page.getByTestId('tab-trace').click();
  await runOp(page, 'trace');
  const doc = await pageDoc(page, 'trace');
  expect(doc.model.weights).toBe('q8');
  expect(doc.model.backend).toBe('wasm');
  const cli = JSON.parse(
    execFileSync(
      process.execPath,
      ['bin/loupe.mjs', 'trace', rm.dir, PROMPT, '--json', '--weights', 'q8', '--backend', 'wasm'],
      { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] },
    ),
  );
  expect(cli.model.weights).toBe('q8');
  let d = 0;
  for (let r = 0; r < cli.head_attribution.length; r++)
    for (let c = 0; c < cli.head_attribution[r].length; c++)
      d = Math.max(d, Math.abs(cli.head_attribution[r][c] - doc.head_attribution[r][c]));
  expect(d).toBeLessThan(1e-4);
  await page.locator('#weights').scrollIntoViewIfNeeded();
  await shot(page, 'model-weights-q8');
  await page.setViewportSize({ width: 1024, height: 800 });
  await shot(page, 'model-weights-q8-1024');
  await page
    .getByRole('button', { name: /dark|light/i })
    .first()
    .click();
  await shot(page, 'model-weights-q8-1024-other-theme');
  await page.setViewportSize({ width: 1280, height: 800 });
  await shot(page, 'model-weights-q8-other-theme');
  const info = await page.evaluate(() => (globalThis as any).__loupe.model.info);
  expect(info.weights_reason).toMatch(/quantised at load, kept in the q8 cache/);
  // the cold load wrote its q8 entry into IndexedDB and hands onnxruntime-web pieces read back from
  // it (Blob chunks, through the worker's reader thread), as a cached load does: no quantised bytes stay in JS
  const memCold = await page.evaluate(async () => {
    const m = (globalThis as any).__loupe.models;
    await m.refreshMemory();
    return m.memory;
  });
  console.log(`[e2e] memory after a cold q8 load and a trace: ${JSON.stringify(memCold)}`);
  expect(memCold).toMatchObject({ precision: 'q8', jsWeightBytes: 0, jsWeightsWhy: null });

  await page.locator('#weights').selectOption('auto');
  await waitModelReady(page);

  // q8 again: the quantised weights are read back from IndexedDB (Blob chunks), not quantised again, with the same trace
  await page.locator('#weights').selectOption('q8');
  await waitModelReady(page);
  const again = await page.evaluate(() => (globalThis as any).__loupe.model.info);
  expect(again.weights).toBe('q8');
  expect(again.weights_reason).toMatch(/read from the q8 cache/);
  expect(
    await page.evaluate(async () => {
      const m = (globalThis as any).__loupe.models;
      await m.refreshMemory();
      return m.memory.jsWeightBytes;
    }),
  ).toBe(0);
  await page.getByTestId('tab-trace').click();
  await runOp(page, 'trace');
  const doc2 = await pageDoc(page, 'trace');
  expect(doc2.head_attribution).toEqual(doc.head_attribution);
  // the cache list counts the model once, complete (its q8 entry with it)
  await expect(page.getByRole('button', { name: `Delete ${REPO} from the cache` })).toBeVisible();
  await page.locator('#weights').selectOption('auto');
  await waitModelReady(page);
});

test('q8 with no cache to keep it in (the bundled model): the Doctor says the quantised weights stay in JS, and why', async () => {
  await page.setViewportSize({ width: 1280, height: 800 });
  await page.getByRole('tab', { name: 'Bundled' }).click();
  await page.getByTestId('load-bundled').click();
  await page.waitForFunction(
    () =>
      (globalThis as any).__loupe.model?.info.source === 'bundled' &&
      (globalThis as any).__loupe.modelStatus === 'ready',
  );
  await page.locator('#weights').selectOption('q8');
  await waitModelReady(page);
  await expect(page.getByTestId('weights-used')).toHaveText('using q8');
  await page.getByRole('button', { name: 'Doctor' }).click();
  const why = page.getByTestId('doc-js-weights-why');
  await expect(why).toContainText(
    'the q8 weights are held in JS: this load has no q8 cache to write them to and read them back from',
  );
  await expect(why).toContainText("the model's files are held in JS");
  await expect(page.getByTestId('doc-memory')).not.toContainText('weights in JS 0 B');
  await why.scrollIntoViewIfNeeded();
  for (const theme of ['light', 'dark']) {
    const current = await page.evaluate(() => document.documentElement.dataset.theme);
    if (current !== theme) await page.getByRole('button', { name: /Switch to .* theme/ }).click();
    for (const w of [1280, 1024]) {
      await page.setViewportSize({ width: w, height: 800 });
      await why.scrollIntoViewIfNeeded();
      await shot(page, `doctor-js-weights-why-${theme}-${w}`);
    }
  }
  await page.setViewportSize({ width: 1280, height: 800 });
  await page.getByRole('button', { name: 'Close the doctor' }).click();
  await page.locator('#weights').selectOption('auto');
  await waitModelReady(page);
});
