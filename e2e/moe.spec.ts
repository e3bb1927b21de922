/**
 * Mixture-of-experts interventions in the page: a random Mixtral (8 experts, top 2) from the Hub
 * stand-in, on the page's default backend (WASM). The ablate form takes a layer and an expert, and
 * a route (forbid / force); each run's document equals the CLI's `loupe ablate --expert [--route]
 * --json` (onnxruntime-node) within 1e-4, the model block aside, and the view names the target.
 * The numbers themselves are held to the float64 reference in tests/engine-moe.test.ts. edge_attribution
 * (eap) with each expert a node: the page's document equals the operation's on onnxruntime-node within
 * 1e-4 and the circuit draws the experts in the MLP's row (tests/ops-edge-attribution-moe.test.ts holds the
 * scores to float64).
 */
import { execFile } from 'node:child_process';
import { realpathSync } from 'node:fs';
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
  watchErrors,
  shot,
  atWidthsAndThemes,
} from './fixtures';
import { MOE_FAMILY_CASES, makeCaseModel, type RandomModel } from '../tests/reference';
import { loadModelNode } from '../src/node/load';
import { getOperation } from '../src/ops/index';

test.describe.configure({ mode: 'serial' });

const REPO = 'loupe-test/mixtral-moe';
const PROMPT = 'abc ab';
let rm: RandomModel;
let dir: string;
let context: BrowserContext;
let page: Page;
let errors: string[];
/** the expert layer 1 weighs most at the last position, so that each edit reaches the prediction */
let top: number;

test.beforeAll(async ({ browser, hub }) => {
  rm = makeCaseModel(MOE_FAMILY_CASES.find((c) => c.family === 'mixtral')!);
  dir = realpathSync(rm.dir);
  hub.addRepo(REPO, dir);
  const model = await loadModelNode(dir, { backend: 'node' });
  const probe: any = await getOperation('ablate')!.run(model, { prompt: PROMPT, layer: 1, expert: 0 });
  const ids = probe.tokens.map((t: { id: number }) => t.id);
  const w = (await model.run(ids, { hooks: ['blocks.1.mlp.hook_router_weights'] })).hooks[
    'blocks.1.mlp.hook_router_weights'
  ];
  const E = model.info.num_experts!;
  const last = Array.from(w.data.slice(w.data.length - E));
  top = last.indexOf(Math.max(...last));
  await model.dispose();
  context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  page = await context.newPage();
  errors = watchErrors(page);
});
test.afterAll(async () => {
  await context?.close();
  rm?.cleanup();
});

test('ablate one expert, and forbid or force its routing, from the page’s form: each document equals the CLI’s', async ({
  site,
  hub,
}) => {
  test.setTimeout(300_000);
  await openReady(page, site.url);
  await loadFromHub(page, hub.url, REPO);
  await expect(page.getByTestId('status-model')).toContainText(REPO, { timeout: 90_000 });
  await waitModelReady(page);
  await page.getByTestId('prompt').fill(PROMPT);
  await page.getByTestId('tab-ablate').click();
  const seen: number[] = [];
  for (const route of ['', 'forbid', 'force']) {
    await page.locator('#p-ablate-layer').fill('1');
    await page.locator('#p-ablate-expert').fill(String(top));
    await page.locator('#p-ablate-route').selectOption(route);
    await runOp(page, 'ablate', { timeout: 120_000 });
    const doc = await pageDoc(page, 'ablate');
    expect(doc.model.backend).not.toBe('node');
    const label = `L1E${top}${route ? `.${route}` : ''}`;
    expect(doc.entries[0].label).toBe(label);
    expect(doc.interventions[0].hook).toBe(
      route ? 'blocks.1.mlp.hook_router_logits' : `blocks.1.mlp.experts.${top}.hook_out`,
    );
    await expect(page.getByTestId('ablate-view')).toContainText(label);
    const args = ['ablate', dir, PROMPT, '--layer', '1', '--expert', String(top), ...(route ? ['--route', route] : [])];
    const { stdout } = await promisify(execFile)(process.execPath, ['bin/loupe.mjs', ...args, '--json']);
    const cli = JSON.parse(stdout);
    const { bad, max } = compareDocs(doc, cli, 1e-4, (p) => p === '.model');
    console.log(`[moe] ablate ${label}: page (${doc.model.backend}) vs CLI (node) largest |Δ| ${max.toExponential(2)}`);
    expect(bad).toEqual([]);
    expect(Math.abs(doc.entries[0].logit_delta)).toBeGreaterThan(1e-4);
    seen.push(doc.entries[0].logit_delta);
  }
  expect(new Set(seen.map((x) => x.toFixed(5))).size).toBe(3);
  expect(errors).toEqual([]);
});

test('edge_attribution with experts as nodes: the page’s document equals Node’s and the circuit draws the experts', async ({
  site,
  hub,
}) => {
  test.setTimeout(300_000);
  const model = await loadModelNode(dir, { backend: 'node' });
  const ids = (seed: number) => {
    let x = seed;
    return Array.from({ length: 8 }, () => (x = (x * 1103515245 + 12345) % 2 ** 31) % 90);
  };
  const dataset = [
    { clean_token_ids: ids(1), corrupted_token_ids: ids(2), answer: '#3', counterfactual: '#5' },
    { clean_token_ids: ids(3), corrupted_token_ids: ids(4), answer: '#4', counterfactual: '#7' },
  ];
  const node: any = await getOperation('edge_attribution')!.run(model, { dataset, method: 'eap' });
  await model.dispose();
  if (!(await page.getByTestId('status-model').textContent())?.includes(REPO)) {
    await openReady(page, site.url);
    await loadFromHub(page, hub.url, REPO);
    await waitModelReady(page);
  }
  await page.getByTestId('tab-edge_attribution').click();
  await page.locator('#p-edge_attribution-dataset').fill(JSON.stringify(dataset));
  await page.locator('#p-edge_attribution-method').selectOption('eap');
  await runOp(page, 'edge_attribution', { timeout: 240_000 });
  const doc = await pageDoc(page, 'edge_attribution');
  expect(doc.graph_cfg).toMatchObject({ n_experts: 8, shared_expert: false });
  const { bad, max } = compareDocs(doc, node, 1e-4, (p) => p === '.model');
  console.log(
    `[moe] edge_attribution eap, ${doc.n_edges} edges: page (${doc.model.backend}) vs node |Δ| ${max.toExponential(2)}`,
  );
  expect(bad).toEqual([]);
  await page.getByTestId('edge-n').fill(String(doc.n_edges));
  const circuit = page.getByTestId('edge-circuit');
  for (const n of ['m0.e0', 'm0.e7', 'm1.e3']) await expect(circuit.locator(`[data-node="${n}"]`)).toHaveCount(1);
  expect(await circuit.locator('.circuit-edge').count()).toBe(doc.n_edges);
  // edges into a router have a line style of their own, and the legend names it
  const router = page.getByTestId('edge-legend').locator('.item', { hasText: 'into an expert router' }).locator('line');
  await expect(router).toHaveAttribute('stroke-dasharray', '6 2 1.5 2');
  await expect(circuit.locator('.circuit-edge[data-edge$="<router>"]').first()).toHaveAttribute(
    'stroke-dasharray',
    '6 2 1.5 2',
  );
  await expect(circuit.locator('.circuit-edge[data-edge$="<in>"]').first()).not.toHaveAttribute(
    'stroke-dasharray',
    /./,
  );
  await circuit.scrollIntoViewIfNeeded();
  await atWidthsAndThemes(page, (tag) => shot(page, `moe-edge-circuit-${tag}`));
  expect(errors).toEqual([]);
});
