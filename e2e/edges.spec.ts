/**
 * edge_attribution in the page: a gpt2-shaped random model whose tokenizer has single-token names
 * (from the Hub stand-in), the IOI-style generator typed into the form, EAP-IG-inputs (m = 3) with
 * MIB's evaluation run in the worker (WASM). The page's document equals the CLI's (onnxruntime-node)
 * within 1e-4, number by number, the model block aside; tests/cli-edges.test.ts holds the CLI to
 * the operation and to headless MCP. The view: the circuit by layer follows the n slider, a clicked
 * head opens its panel, the faithfulness curve with CPR and CMD, the dataset's pairs. Screenshots in
 * both themes at 1024 and 1280 px.
 */
import { execFile } from 'node:child_process';
import { realpathSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import type { BrowserContext, Page } from '@playwright/test';
import {
  test,
  expect,
  openReady,
  loadFromHub,
  waitModelReady,
  runOp,
  pageDoc,
  compareDocs,
  shotWidthsThemes,
  watchErrors,
} from './fixtures';
import { makeRandomModel, type RandomModel } from '../tests/reference';
import { loadModelNode } from '../src/node/load';
import { getOperation } from '../src/ops/index';

test.describe.configure({ mode: 'serial' });

const REPO = 'loupe-test/gpt2-ioi';
const NAMES = ['Mary', 'John', 'Alice', 'Bob', 'Tom', 'James', 'Anna', 'David'];
const GEN = { task: 'ioi', n: 6, seed: 4, length: 10 };
let rm: RandomModel;
let context: BrowserContext;
let page: Page;
let errors: string[];
let cliDoc: any;
let patchNode: any;
const PATCH = { generate: GEN, scans: ['head_out'], bootstrap_seed: 7 };

test.beforeAll(async ({ browser, hub }) => {
  rm = makeRandomModel('gpt2', { seed: 9, dModel: 32, nLayers: 2, nHeads: 4, vocabSize: 420, words: NAMES });
  const dir = realpathSync(rm.dir);
  hub.addRepo(REPO, dir);
  const args = ['edge_attribution', dir, '--generate', JSON.stringify(GEN), '--method', 'eap_ig_inputs'];
  const { stdout } = await promisify(execFile)(
    process.execPath,
    ['bin/loupe.mjs', ...args, '--ig-steps', '3', '--evaluate', '--json'],
    { maxBuffer: 64 << 20 },
  );
  cliDoc = JSON.parse(stdout);
  const model = await loadModelNode(dir, { backend: 'node' });
  patchNode = await getOperation('patch')!.run(model, PATCH);
  await model.dispose();
  context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  page = await context.newPage();
  errors = watchErrors(page);
});
test.afterAll(async () => {
  await context?.close();
  rm?.cleanup();
});

test('IOI pairs generated in the form: the page’s edge_attribution document equals the CLI’s within 1e-4', async ({
  site,
  hub,
}) => {
  test.setTimeout(300_000);
  await openReady(page, site.url);
  await loadFromHub(page, hub.url, REPO);
  await expect(page.getByTestId('status-model')).toContainText(REPO, { timeout: 90_000 });
  await waitModelReady(page);
  await page.getByTestId('tab-edge_attribution').click();
  await page.locator('#p-edge_attribution-generate').fill(JSON.stringify(GEN));
  await page.locator('#p-edge_attribution-method').selectOption('eap_ig_inputs');
  await page.locator('#p-edge_attribution-ig_steps').fill('3');
  await page.locator('#p-edge_attribution-evaluate').check();
  await runOp(page, 'edge_attribution', { timeout: 240_000 });
  const doc = await pageDoc(page, 'edge_attribution');
  expect(doc.model.backend).not.toBe('node');
  expect(doc.dataset.source).toBe('generated');
  expect(doc.dataset.sha256).toBe(cliDoc.dataset.sha256);
  expect(doc.dataset.n_examples).toBeGreaterThan(3);
  expect(doc.edges.some((e: any) => Math.abs(e.score) > 1e-3)).toBe(true);
  const { bad, max } = compareDocs(doc, cliDoc, 1e-4, (p) => p === '.model');
  console.log(`[edges] page (${doc.model.backend}) vs CLI (node): largest |Δ| ${max.toExponential(2)}`);
  expect(bad).toEqual([]);
  // the same keys on both sides (compareDocs walks the page's)
  expect(Object.keys(doc).sort()).toEqual(Object.keys(cliDoc).sort());

  // the view: the summary, the slider, a head click, the curve, the pairs
  const view = page.getByTestId('edge-attribution-view');
  await expect(view).toContainText(`over ${doc.dataset.n_examples} pairs`);
  await expect(view).toContainText(doc.dataset.sha256.slice(0, 12));
  const drawn = () => page.locator('[data-testid=edge-circuit] .circuit-edge').count();
  // a circuit's pruned edges are a subset of a larger one's: more edges as n grows, all of them at n = E
  await page.getByTestId('edge-n').fill('40');
  const few = await drawn();
  await expect(view).toContainText(`(${few} after pruning)`);
  await page.getByTestId('edge-n').fill(String(doc.n_edges));
  expect(await drawn()).toBe(doc.n_edges);
  expect(few).toBeLessThan(doc.n_edges);
  await expect(page.getByTestId('edge-faithfulness')).toContainText('CPR');
  await expect(page.getByTestId('edge-faithfulness')).toContainText('CMD');
  const pairs = page.getByTestId('dataset-pairs');
  expect(doc.dataset.sample).toHaveLength(Math.min(doc.dataset.n_given, 8));
  await expect(pairs.locator('tbody tr')).toHaveCount(doc.dataset.sample.length);
  await expect(pairs).toContainText(doc.dataset.sample[0].clean);
  await expect(pairs.locator('tr.dropped')).toHaveCount(doc.dataset.sample.filter((p: any) => !p.used).length);
  const head = page.locator('[data-testid=edge-circuit] .circuit-head').first();
  const [l, h] = (await head.getAttribute('data-node'))!.match(/\d+/g)!.map(Number);
  await head.click();
  await expect(page.getByTestId('head-panel')).toContainText(`L${l}H${h}`);

  await page.getByTestId('edge-n').fill('60');
  await page.getByTestId('edge-attribution-view').evaluate((e) => e.scrollIntoView({ block: 'start' }));
  await shotWidthsThemes(page, 'edge-attribution');
  expect(errors).toEqual([]);
});

test('dataset-mode patch over the same pairs: per-component means with bootstrap CIs as error bars, as in Node', async () => {
  test.setTimeout(180_000);
  await page.evaluate(() => (globalThis as any).__loupe.prefs.setTheme('light'));
  await page.getByTestId('tab-patch').click();
  await page.locator('#p-patch-generate').fill(JSON.stringify(GEN));
  for (const scan of ['resid_pre', 'attn_out', 'mlp_out'])
    await page
      .locator('[data-field=scans] label', { hasText: new RegExp(`^\\s*${scan}\\s*$`) })
      .locator('input')
      .uncheck();
  await page.locator('#p-patch-bootstrap_seed').fill('7');
  await runOp(page, 'patch', { timeout: 120_000 });
  const doc = await pageDoc(page, 'patch');
  // the prompt box is left out in dataset mode: the document is the dataset's
  expect(doc.dataset.sha256).toBe(cliDoc.dataset.sha256);
  expect(doc.statistics.seed).toBe(7);
  const { bad, max } = compareDocs(doc, patchNode, 1e-4, (p) => p === '.model');
  console.log(`[edges] patch page vs Node: largest |Δ| ${max.toExponential(2)}`);
  expect(bad).toEqual([]);
  const shown = Math.min(20, doc.statistics.components.length);
  const chart = page.getByTestId('dataset-statistics');
  await expect(chart.locator('.bar-interval')).toHaveCount(shown);
  await expect(chart).toContainText('Seed 7');
  await page.getByTestId('dataset-panel').evaluate((e) => e.scrollIntoView({ block: 'start' }));
  await shotWidthsThemes(page, 'dataset-patch');
  expect(errors).toEqual([]);
});
