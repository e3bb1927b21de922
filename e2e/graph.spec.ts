/**
 * The attribution graph in the page: the bundled stories260K with a random PLT set (skip, 256
 * features per layer) in circuit-tracer's layout, served by the Hub stand-in as a URL folder.
 * The graph (≥ 500 nodes) draws on a canvas; hovering a node shows its numbers, clicking selects
 * it, pins go into a supernode that the exported JSON's qParams carries, and an intervention on
 * the supernode (feature_intervention) shows the new top tokens. The page's graph equals the one
 * the operation computes in Node (node ids; scores within 1e-4). Screenshots in both themes.
 */
import { readFileSync, readdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import type { BrowserContext, Page } from '@playwright/test';
import { test, expect, openReady, runOp, shotWidthsThemes, pageDoc, watchErrors, PROMPT } from './fixtures';
import { makeRandomTranscoders, type RandomTranscoderSet } from '../tests/helpers/random-transcoders';
import { loadModelDir } from '../tests/reference';
import { cleanState } from '../tests/reference/attribution64';
import { loadModelNode } from '../src/node/load';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import { operation } from '../src/ops/attribution_graph';

test.describe.configure({ mode: 'serial' });

const REPO = 'loupe-test/stories260K-transcoders';
const GRAPH_PROMPT = `${PROMPT} girl named Lily. She liked to play`;
/** keeps more of the graph than circuit-tracer's 0.8, for a graph of 500+ nodes from 2000 features */
const NODE_THRESHOLD = 0.9;
let context: BrowserContext;
let page: Page;
let errors: string[];
let tc: RandomTranscoderSet;
let source: string;
let nodeDoc: any;

test.beforeAll(async ({ browser, hub }) => {
  const model = await loadModelNode('default');
  const ids = model.tokenize(GRAPH_PROMPT);
  const o = { kind: 'plt', nLayers: 5, dModel: 64, features: 256, skip: true } as const;
  const probe = makeRandomTranscoders(o);
  const calibrate = cleanState(loadModelDir(path.resolve('public/models/stories260K')), ids, probe.ref).xin;
  probe.cleanup();
  tc = makeRandomTranscoders({ ...o, calibrate, l0: 20, seed: 21 });
  hub.addRepo(REPO, null);
  for (const f of readdirSync(tc.dir)) hub.addFile(REPO, `plt/${f}`, readFileSync(path.join(tc.dir, f)));
  source = `${hub.url}/${REPO}/resolve/main`;
  nodeDoc = await operation.run(
    model,
    { prompt: GRAPH_PROMPT, transcoder_source: tc.dir, node_threshold: NODE_THRESHOLD },
    { loadTranscoders: createNodeSaeLoaders({ cache: false }).loadTranscoders },
  );
  await model.dispose();
  context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  errors = watchErrors(page);
});
test.afterAll(async () => {
  await context?.close();
  if (tc) rmSync(tc.dir, { recursive: true, force: true });
});

/** the page coordinates of node i of the drawn graph */
async function nodeAt(p: Page, i: number): Promise<{ x: number; y: number }> {
  const c = p.getByTestId('graph-canvas');
  await c.scrollIntoViewIfNeeded();
  const [x, y] = await c.evaluate((el, k) => (el as any).graphLayout[k], i);
  const box = (await c.boundingBox())!;
  return { x: box.x + x, y: box.y + y };
}

test('attribution_graph: a 500-node graph with hover, pin, supernode and an intervention', async ({ site }) => {
  test.setTimeout(360_000);
  await openReady(page, site.url);
  await page.getByTestId('prompt').fill(GRAPH_PROMPT);
  await page.getByTestId('tab-attribution_graph').click();
  await page.locator('#p-attribution_graph-transcoder_source').fill(source);
  await page.locator('#p-attribution_graph-transcoder_path').fill('plt');
  await page.locator('#p-attribution_graph-node_threshold').fill(String(NODE_THRESHOLD));
  await runOp(page, 'attribution_graph', { timeout: 240_000 });
  const doc = await pageDoc(page, 'attribution_graph');
  console.log(`[graph] page: ${doc.cost.wall_ms} ms (rows ${doc.cost.rows_ms} ms); Node: ${nodeDoc.cost.wall_ms} ms`);
  expect(doc.graph.nodes.length).toBeGreaterThanOrEqual(500);
  await expect(page.getByTestId('graph-summary')).toContainText(`${doc.graph.nodes.length} nodes`);
  // the same graph as in Node (WASM vs onnxruntime-node: float32 rounding only)
  expect(doc.graph.nodes.map((n: any) => n.node_id)).toEqual(nodeDoc.graph.nodes.map((n: any) => n.node_id));
  expect(Math.abs(doc.scores.replacement - nodeDoc.scores.replacement)).toBeLessThan(1e-4);
  expect(Math.abs(doc.scores.completeness - nodeDoc.scores.completeness)).toBeLessThan(1e-4);

  // hover: a feature's numbers in the tooltip
  const feats = doc.graph.nodes
    .map((n: any, i: number) => ({ n, i }))
    .filter(({ n }: any) => n.feature_type === 'cross layer transcoder');
  const top = feats.reduce((a: any, b: any) => (b.n.influence < a.n.influence ? b : a));
  let at = await nodeAt(page, top.i);
  await page.mouse.move(at.x, at.y);
  await expect(page.getByTestId('chart-tooltip')).toContainText(top.n.node_id);
  await expect(page.getByTestId('chart-tooltip')).toContainText('activation');
  // the threshold slider changes how many links are drawn
  const drawn = async () => Number((await page.getByTestId('graph-drawn').textContent())!.split(' ')[0]);
  await page.mouse.move(0, 0);
  await page.getByTestId('graph-threshold').fill('60');
  const few = await drawn();
  await page.getByTestId('graph-threshold').fill('5');
  expect(await drawn()).toBeGreaterThan(few);

  // click, pin two features, group them into a supernode
  const second = feats.filter((f: any) => f.i !== top.i && f.n.layer === top.n.layer)[0] ?? feats[1];
  for (const f of [top, second]) {
    at = await nodeAt(page, f.i);
    await page.mouse.click(at.x, at.y);
    await expect(page.getByTestId('graph-node')).toContainText(f.n.node_id);
    await page.getByTestId('graph-pin').click();
  }
  await expect(page.getByTestId('graph-pins')).toContainText('Pinned (2)');
  await page.getByLabel('Supernode name').fill('my supernode');
  await page.getByTestId('graph-make-supernode').click();
  await expect(page.getByTestId('graph-pins')).toContainText('my supernode (2)');
  const [download] = await Promise.all([page.waitForEvent('download'), page.getByTestId('graph-export').click()]);
  const exported = JSON.parse(readFileSync(await download.path(), 'utf8'));
  expect(exported.qParams.supernodes).toEqual([['my supernode', top.n.node_id, second.n.node_id]]);
  expect(exported.qParams.pinnedIds).toEqual([top.n.node_id, second.n.node_id]);
  expect(exported.nodes.length).toBe(doc.graph.nodes.length);

  // intervene on the supernode: zero both features, errors recomputed
  await expect(page.getByTestId('graph-intervene')).toContainText('supernode “my supernode” (2 features)');
  await page.getByTestId('graph-run-intervention').click();
  await expect(page.getByTestId('intervention-table').locator('tbody tr')).not.toHaveCount(0, { timeout: 60_000 });
  await expect(page.getByTestId('graph-intervene')).toContainText('error nodes recomputed');
  await expect(page.getByTestId('graph-intervene')).not.toContainText('BAD_INPUT');

  // the screenshots: the default link threshold, the top feature selected with its links
  await page.getByTestId('graph-threshold').fill('35');
  at = await nodeAt(page, top.i);
  await page.mouse.click(at.x, at.y);
  await expect(page.getByTestId('graph-node')).toContainText('incoming');
  await page.getByTestId('graph-view').evaluate((e) => e.scrollIntoView({ block: 'start' }));
  await shotWidthsThemes(page, 'attribution-graph');
  expect(errors).toEqual([]);
});
