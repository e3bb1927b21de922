/**
 * The dashboard on the bundled stories260K: a top neuron of a trace opens its form; the example (a neuron over four stories and 8 samples
 * the model writes) runs in the worker, a JSON Lines file picked into the corpus field replaces the
 * text, and the view draws the max-activating windows as token rows, the histogram from the
 * document's bins and the promoted/suppressed tokens. The page's document equals the CLI's --json
 * on the same input (numbers within 1e-4; the backend differs). An empty corpus is an error with
 * its hint, a long generation shows progress and cancels, and an identical re-run is answered from
 * the worker's memory, and after a reload from IndexedDB. Screenshots at 1280×800
 * and 1024×700, both themes.
 */
import {
  test,
  expect,
  openReady,
  waitModelReady,
  runOp,
  shot,
  pageDoc,
  watchErrors,
  compareDocs,
  PROMPT,
} from './fixtures';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

const JSONL = [
  { text: 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park.' },
  { text: 'Tim had a big red ball. He liked to kick it high into the sky.' },
  { text: 'One day, a little dog found a bone under the tree. The dog was very happy.' },
]
  .map((r) => JSON.stringify(r))
  .join('\n');

test('dashboard: examples, histogram and direct-path tokens from a picked JSONL corpus and samples; the CLI agrees', async ({
  page,
  site,
}) => {
  test.setTimeout(300_000);
  const errors = watchErrors(page);
  await page.setViewportSize({ width: 1280, height: 800 });
  await openReady(page, site.url);
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'trace');
  // a top neuron of the trace opens its dashboard form
  const neuron = (await pageDoc(page, 'trace')).top_neurons[0];
  await page.locator('[data-testid=top-neurons] [data-testid=neuron-dashboard]').first().click();
  await expect(page.getByTestId('tab-dashboard')).toHaveAttribute('aria-selected', 'true');
  await expect(page.locator('#p-dashboard-subject')).toHaveValue('neuron');
  await expect(page.locator('#p-dashboard-layer')).toHaveValue(String(neuron.layer));
  await expect(page.locator('#p-dashboard-neuron')).toHaveValue(String(neuron.neuron));

  // an empty corpus (and no samples) is refused with what to give instead
  await page.getByTestId('run').click();
  await expect(page.getByTestId('job-error')).toContainText('The corpus is empty');
  await expect(page.getByTestId('job-error')).toContainText('samples > 0');

  await page.getByTestId('fill-example').click();
  await page
    .getByTestId('file-corpus')
    .setInputFiles({ name: 'stories.jsonl', mimeType: 'text/plain', buffer: Buffer.from(JSONL) });
  await expect(page.locator('[data-field=corpus] textarea')).toHaveValue(JSONL);
  await runOp(page, 'dashboard');
  const doc = await pageDoc(page, 'dashboard');
  expect(doc.corpus).toMatchObject({
    format: 'text+generated',
    documents: 3 + 8,
    samples: { n: 8, length: 32, seed: 0 },
  });
  expect(doc.subject).toMatchObject({ kind: 'neuron', layer: 4, index: 7 });
  expect(doc.cache.hit).toBe(false);

  await expect(page.getByTestId('dashboard-subject')).toHaveText('L4 N7');
  const cells = page.locator('[data-testid=dashboard-examples] rect.tok-cell');
  await expect(cells).toHaveCount(doc.examples.reduce((a: number, e: { tokens: unknown[] }) => a + e.tokens.length, 0));
  const top = doc.examples[0];
  await expect(
    page.locator(`[data-testid=dashboard-examples] rect.tok-cell[data-row="0"][data-col="${top.max_position}"]`),
  ).toHaveAttribute('data-value', String(top.max));
  const bins = page.locator('[data-testid=dashboard-histogram] rect.hist-bin');
  await expect(bins).toHaveCount(doc.histogram.counts.length);
  await expect(bins.nth(0)).toHaveAttribute('data-count', String(doc.histogram.counts[0]));
  await expect(page.locator('[data-testid=dashboard-promoted] svg')).toBeVisible();
  await expect(page.locator('[data-testid=dashboard-suppressed] svg')).toBeVisible();
  await page.locator('[data-testid=dashboard-examples] rect.tok-cell[data-row="0"]').nth(top.max_position).click();
  await expect(page.getByTestId('dashboard-selected-token')).toContainText(`token ${top.max_position}`);

  for (const theme of ['light', 'dark']) {
    const current = await page.evaluate(() => document.documentElement.dataset.theme);
    if (current !== theme) await page.getByRole('button', { name: /Switch to .* theme/ }).click();
    for (const [w, h] of [
      [1280, 800],
      [1024, 700],
    ]) {
      await page.setViewportSize({ width: w, height: h });
      await page.getByTestId('dashboard-view').evaluate((e) => e.scrollIntoView({ block: 'start' }));
      await shot(page, `dashboard-examples-${theme}-${w}`);
      await page.getByTestId('dashboard-histogram').evaluate((e) => e.scrollIntoView({ block: 'start' }));
      await shot(page, `dashboard-histogram-${theme}-${w}`);
      const overflow = await page.getByTestId('dashboard-view').evaluate((v) => v.scrollWidth - v.clientWidth);
      expect(overflow).toBeLessThanOrEqual(1);
    }
  }
  await page.locator('[data-field=corpus]').evaluate((e) => e.scrollIntoView({ block: 'start' }));
  await shot(page, 'dashboard-form-dark-1024');

  // a long corpus to generate: progress moves, Cancel stops it, the worker stays usable
  await page.locator('#p-dashboard-samples').fill('256');
  await page.locator('#p-dashboard-sample_length').fill('64');
  await page.getByTestId('run').click();
  await expect(page.getByTestId('job-stage')).toContainText('generating samples');
  await page.waitForFunction(
    () => Number(document.querySelector('[data-testid=job-progress]')?.getAttribute('aria-valuenow') ?? 0) > 0,
  );
  await page.getByTestId('cancel-job').click();
  await expect(page.getByTestId('job')).toHaveCount(0);
  await expect(page.getByTestId('job-error')).toContainText('cancelled');
  await page.locator('#p-dashboard-samples').fill('8');
  await page.locator('#p-dashboard-sample_length').fill('32');

  // the same input again: the worker's cache answers
  await runOp(page, 'dashboard');
  expect((await pageDoc(page, 'dashboard')).cache).toMatchObject({ hit: true, from: 'process' });
  await expect(page.getByTestId('dashboard-cached')).toBeVisible();
  // after a reload (a new worker), IndexedDB answers the same input
  await page.reload();
  await waitModelReady(page);
  await page.getByTestId('tab-dashboard').click();
  await expect(page.locator('[data-field=corpus] textarea')).toHaveValue(JSONL);
  await runOp(page, 'dashboard');
  const stored = await pageDoc(page, 'dashboard');
  expect(stored.cache).toMatchObject({ hit: true, from: 'store', key: doc.cache.key });
  expect(stored.examples).toEqual(doc.examples);

  // the CLI (the same registry entry MCP calls) on the same input
  const input = await page.evaluate(() => (globalThis as any).__loupe.results.dashboard.input);
  const { stdout } = await promisify(execFile)(
    process.execPath,
    ['bin/loupe.mjs', 'dashboard', 'default', '--input', JSON.stringify(input), '--json'],
    { maxBuffer: 64 << 20 },
  );
  const node = JSON.parse(stdout);
  const { bad, max } = compareDocs(
    node,
    doc,
    1e-4,
    (p) => p === '.model.backend' || p.startsWith('.cache') || p === '.method',
  );
  expect(bad).toEqual([]);
  console.log(
    `[e2e] dashboard page (wasm) vs CLI --json: ${doc.corpus.windows} windows, max |Δ| = ${max.toExponential(2)}`,
  );
  expect(errors).toEqual([]);
});
