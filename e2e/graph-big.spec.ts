/**
 * Issue 42 item 2: a big attribution graph can be read. 4,096 features per layer (a random PLT
 * set calibrated to about 24 active per position) on a 63-token prompt of the bundled model,
 * computed in Node and shown in the page: nodes of one cell stand at least NODE_STEP apart, so
 * the pointer reaches every node (each crowded cell checked with the mouse), the node list finds
 * any node by layer, position or feature id, zoom widens the canvas, and the pins and supernodes
 * travel in the share link even though the graph is too large to embed. Screenshots at 1280 and
 * 1024, both themes.
 */
import path from 'node:path';
import { rmSync } from 'node:fs';
import type { Page } from '@playwright/test';
import { test, expect, atWidthsAndThemes, openReady, watchErrors } from './fixtures';
import { loadModelNode } from '../src/node/load';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import { operation } from '../src/ops/attribution_graph';
import { makeRandomTranscoders } from '../tests/helpers/random-transcoders';
import { loadModelDir } from '../tests/reference';
import { cleanState } from '../tests/reference/attribution64';
import { decodeShare, parseFragment } from '../src/share/codec';
import { NODE_STEP } from '../src/ui/charts/attribution-graph';

test.describe.configure({ mode: 'serial' });

const TEXT =
  'Once upon a time, there was a little girl named Lily. She liked to play outside with her dog, Max. ' +
  'One day, Lily and Max went to the park to play. They saw a big tree and a little bird.';
let doc: any;

test.beforeAll(async () => {
  test.setTimeout(300_000);
  const model = await loadModelNode('default');
  const ids = model.tokenize(TEXT).slice(0, 63);
  const o = { kind: 'plt', nLayers: 5, dModel: 64, features: 4096, skip: true } as const;
  const probe = makeRandomTranscoders(o);
  const calibrate = cleanState(loadModelDir(path.resolve('public/models/stories260K')), ids, probe.ref).xin;
  probe.cleanup();
  const tc = makeRandomTranscoders({ ...o, calibrate, l0: 24, seed: 21 });
  try {
    doc = await operation.run(
      model,
      { token_ids: ids, transcoder_source: tc.dir, node_threshold: 0.9 },
      { loadTranscoders: createNodeSaeLoaders({ cache: false }).loadTranscoders },
    );
  } finally {
    rmSync(tc.dir, { recursive: true, force: true });
    await model.dispose();
  }
});

/** show `d` as the page's attribution_graph result (as a run would) */
async function show(page: Page, d: any): Promise<void> {
  await page.evaluate((x) => {
    const a = (globalThis as any).__loupe;
    a.results = {
      ...a.results,
      attribution_graph: {
        op: 'attribution_graph',
        input: { token_ids: x.tokens.map((t: any) => t.id), transcoder_source: '/nowhere' },
        doc: x,
        model: a.modelRef,
        ms: null,
        fromLink: false,
      },
    };
  }, d);
  await page.getByTestId('tab-attribution_graph').click();
  await expect(page.getByTestId('graph-summary')).toContainText(`${d.graph.nodes.length} nodes`);
}

/** node i's layout position, scrolled into the graph box's view, in page coordinates */
async function nodeAt(page: Page, i: number): Promise<{ x: number; y: number }> {
  return page.getByTestId('graph-box').evaluate((box, k) => {
    const c = box.querySelector('canvas') as any;
    const [x, y] = c.graphLayout[k];
    box.scrollIntoView({ block: 'center', behavior: 'instant' });
    box.scrollLeft = Math.max(0, x - box.clientWidth / 2);
    box.scrollTop = Math.max(0, y - box.clientHeight / 2);
    const r = c.getBoundingClientRect();
    return { x: r.left + x, y: r.top + y };
  }, i);
}

test('a 4,096-feature graph on 63 tokens: every node reachable by hover and by search', async ({ page, site }) => {
  test.setTimeout(300_000);
  const errors = watchErrors(page);
  const nodes = doc.graph.nodes;
  expect(doc.model.n_layers).toBe(5);
  expect(doc.tokens.length).toBe(63);
  expect(doc.transcoders.d_transcoder).toBe(4096);
  await openReady(page, site.url);
  await show(page, doc);

  // no two nodes closer than NODE_STEP: the pointer's nearest node is always the one under it
  const xy: [number, number][] = await page.getByTestId('graph-canvas').evaluate((c: any) => c.graphLayout);
  let min = Infinity;
  for (let i = 0; i < xy.length; i++)
    for (let j = i + 1; j < xy.length; j++) min = Math.min(min, Math.hypot(xy[i][0] - xy[j][0], xy[i][1] - xy[j][1]));
  console.log(
    `[graph-big] ${nodes.length} nodes, ${doc.graph.links.length} links; closest two nodes ${min.toFixed(2)} px apart`,
  );
  expect(min).toBeGreaterThanOrEqual(NODE_STEP - 1e-6);

  // the most crowded cell, node by node with the mouse
  const cells = new Map<string, number[]>();
  nodes.forEach((n: any, i: number) => {
    if (n.feature_type !== 'cross layer transcoder') return;
    const k = `${n.layer}:${n.ctx_idx}`;
    cells.set(k, [...(cells.get(k) ?? []), i]);
  });
  const crowded = [...cells.values()].sort((a, b) => b.length - a.length)[0];
  console.log(`[graph-big] the most crowded cell holds ${crowded.length} features`);
  expect(crowded.length).toBeGreaterThanOrEqual(21);
  for (const i of crowded) {
    const at = await nodeAt(page, i);
    await page.mouse.move(at.x, at.y);
    await expect(page.getByTestId('chart-tooltip')).toContainText(nodes[i].node_id);
  }
  // every node, through the same hit test the pointer uses (in the page, at each node's own point)
  const ids: string[] = nodes.map((n: any) => n.node_id);
  const missed = await page.getByTestId('graph-canvas').evaluate((c: any, idList: string[]) => {
    const out: string[] = [];
    const box = c.parentElement as HTMLElement;
    box.scrollIntoView({ block: 'center', behavior: 'instant' });
    for (let k = 0; k < c.graphLayout.length; k++) {
      const [x, y] = c.graphLayout[k];
      box.scrollLeft = Math.max(0, x - box.clientWidth / 2);
      box.scrollTop = Math.max(0, y - box.clientHeight / 2);
      const r = c.getBoundingClientRect();
      c.dispatchEvent(new MouseEvent('mousemove', { clientX: r.left + x, clientY: r.top + y, bubbles: true }));
      const title = document.querySelector('[data-testid=chart-tooltip] .tt-title')?.textContent ?? '';
      if (!title.startsWith(`${idList[k]} (`)) out.push(idList[k]);
    }
    return out;
  }, ids);
  expect(missed).toEqual([]);

  // search: a crowded cell by layer and position, then one feature by id
  const n0 = nodes[crowded[0]];
  await page.getByTestId('graph-search').fill(`L${n0.layer} pos ${n0.ctx_idx}`);
  await expect(page.getByTestId('graph-matches')).toHaveText(
    `${nodes.filter((n: any) => n.layer === n0.layer && n.ctx_idx === n0.ctx_idx && n.feature_type !== 'embedding' && n.feature_type !== 'logit').length} of ${nodes.length}`,
  );
  const last = nodes[crowded[crowded.length - 1]];
  await page.getByTestId('graph-search').fill(`#${last.node_id.split('_')[1]} L${last.layer}`);
  const row = page.locator(`[data-testid=graph-nodelist] tr[data-node="${last.node_id}"]`);
  await expect(row).toBeVisible();
  await row.getByRole('button').click();
  await expect(page.getByTestId('graph-node')).toContainText(last.node_id);

  // zoom widens the canvas
  const w0 = await page.getByTestId('graph-canvas').evaluate((c) => c.getBoundingClientRect().width);
  await page.getByTestId('graph-zoom-in').click();
  await expect(page.getByTestId('graph-zoom')).toHaveText('1.5×');
  await expect
    .poll(() => page.getByTestId('graph-canvas').evaluate((c) => c.getBoundingClientRect().width))
    .toBeGreaterThan(w0 * 1.3);
  await page.getByRole('button', { name: 'Zoom out' }).click();

  // pins and a supernode go into the share link, though the graph is too large to embed
  const second = nodes[crowded[1]];
  for (const n of [last, second]) {
    await page.getByTestId('graph-search').fill(`#${n.node_id.split('_')[1]} L${n.layer} pos ${n.ctx_idx}`);
    await page.locator(`[data-testid=graph-nodelist] tr[data-node="${n.node_id}"]`).getByRole('button').click();
    await page.getByTestId('graph-pin').click();
  }
  await page.getByLabel('Supernode name').fill('crowded pair');
  await page.getByTestId('graph-make-supernode').click();
  await page.getByTestId('copy-link').click();
  const url = await page.getByTestId('share-url').inputValue();
  const state = decodeShare(parseFragment(new URL(url).hash).get('s')!);
  expect(state.result).toBeUndefined();
  expect(state.view).toEqual({
    pinned: [last.node_id, second.node_id],
    supernodes: [['crowded pair', last.node_id, second.node_id]],
  });

  // screenshots: the view with the pair selected, at both widths in both themes
  await page.getByTestId('graph-search').fill(`L${n0.layer} pos ${n0.ctx_idx}`);
  await nodeAt(page, crowded[0]);
  await page.getByTestId('graph-view').evaluate((e) => e.scrollIntoView({ block: 'start' }));
  await atWidthsAndThemes(page, async (tag) => {
    await page.getByTestId('graph-view').evaluate((e) => e.scrollIntoView({ block: 'start' }));
    await page.mouse.move(0, 0);
    await page.screenshot({ path: `artifacts/screenshots/graph-big-${tag}.png` });
    await page.getByTestId('graph-nodelist').evaluate((e) => e.scrollIntoView({ block: 'start' }));
    await page.screenshot({ path: `artifacts/screenshots/graph-big-list-${tag}.png` });
  });
  expect(errors).toEqual([]);

  // the link opened elsewhere: its result re-runs (here it cannot: no transcoders at /nowhere), and
  // the graph shown for it starts with the link's pins and supernode
  const p2 = await page.context().newPage();
  await p2.goto(url);
  await expect(p2.getByTestId('shared-banner')).toBeVisible();
  await p2.waitForFunction(() => (globalThis as any).__loupe?.modelStatus === 'ready', null, { timeout: 90_000 });
  await expect(p2.getByTestId('shared-banner')).toHaveAttribute('data-status', /failed|rerun|differs|matched/, {
    timeout: 90_000,
  });
  await show(p2, doc);
  await expect(p2.getByTestId('graph-pins')).toContainText('Pinned (2)');
  await expect(p2.getByTestId('graph-pins')).toContainText('crowded pair (2)');
  await p2.close();
});
