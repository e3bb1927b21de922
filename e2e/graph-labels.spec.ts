/**
 * Issue 42 item 2 (labels): an attribution graph whose transcoder set carries explanations.json
 * shows each feature's description in the node list (searchable) and in the selected node's card.
 * A random PLT set of the bundled model with descriptions on every third feature; the graph is
 * computed in Node and shown as the page's result. Screenshots at 1280 and 1024, both themes.
 */
import path from 'node:path';
import { rmSync, writeFileSync } from 'node:fs';
import type { Page } from '@playwright/test';
import { test, expect, atWidthsAndThemes, openReady, shot, watchErrors, PROMPT } from './fixtures';
import { loadModelNode } from '../src/node/load';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import { operation } from '../src/ops/attribution_graph';
import { makeRandomTranscoders } from '../tests/helpers/random-transcoders';
import { loadModelDir } from '../tests/reference';
import { cleanState } from '../tests/reference/attribution64';

const GRAPH_PROMPT = `${PROMPT} girl named Lily. She liked to play`;
const TOPICS = ['names of girls', 'the word "play"', 'commas and full stops', 'past-tense verbs', 'story openings'];
let doc: any;

test.beforeAll(async () => {
  test.setTimeout(300_000);
  const model = await loadModelNode('default');
  const ids = model.tokenize(GRAPH_PROMPT);
  const o = { kind: 'plt', nLayers: 5, dModel: 64, features: 256, skip: true } as const;
  const probe = makeRandomTranscoders(o);
  const calibrate = cleanState(loadModelDir(path.resolve('public/models/stories260K')), ids, probe.ref).xin;
  probe.cleanup();
  const tc = makeRandomTranscoders({ ...o, calibrate, l0: 20, seed: 21 });
  const records = [];
  for (let l = 0; l < 5; l++)
    for (let f = 0; f < 256; f += 3)
      records.push({
        modelId: 'stories260K',
        layer: `${l}-random-plt`,
        index: String(f),
        description: `${TOPICS[(l * 7 + f) % TOPICS.length]} (L${l} #${f})`,
      });
  writeFileSync(path.join(tc.dir, 'explanations.json'), JSON.stringify(records));
  try {
    const loaders = createNodeSaeLoaders({ cache: false });
    doc = await operation.run(
      model,
      { token_ids: ids, transcoder_source: tc.dir, node_threshold: 0.8 },
      { loadTranscoders: loaders.loadTranscoders, loadSaeFile: loaders.loadSaeFile },
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

test("a set's explanations label the graph's features: in the node list, its search and the node card", async ({
  page,
  site,
}) => {
  const errors = watchErrors(page);
  await openReady(page, site.url);
  await show(page, doc);
  const feats = doc.graph.nodes.filter((n: any) => n.feature_type === 'cross layer transcoder');
  const labelled = feats.filter((n: any) => n.clerp);
  console.log(
    `[labels] ${labelled.length} of ${feats.length} feature nodes labelled (${doc.graph.nodes.length} nodes)`,
  );
  expect(labelled.length).toBeGreaterThan(3);
  expect(labelled.length).toBeLessThan(feats.length);

  // a label's words find exactly the nodes that carry them
  const topic = TOPICS.find((t) => labelled.some((n: any) => n.clerp.startsWith(t)))!;
  const withTopic = doc.graph.nodes.filter((n: any) => n.clerp.includes(topic));
  await page.getByTestId('graph-search').fill(topic);
  await expect(page.getByTestId('graph-matches')).toHaveText(`${withTopic.length} of ${doc.graph.nodes.length}`);
  const n = withTopic[0];
  const row = page.locator(`[data-testid=graph-nodelist] tr[data-node="${n.node_id}"]`);
  await expect(row.locator('td.label')).toHaveText(n.clerp);
  await row.getByRole('button').click();
  await expect(page.getByTestId('graph-node-label')).toHaveText(n.clerp);
  // a feature without a description says so, and its card has no label
  const bare = feats.find((x: any) => !x.clerp);
  await page.getByTestId('graph-search').fill(bare.node_id);
  const bareRow = page.locator(`[data-testid=graph-nodelist] tr[data-node="${bare.node_id}"]`);
  await expect(bareRow.locator('td.label')).toHaveText('no label');

  // hovering the node on the canvas names it too
  const k = doc.graph.nodes.indexOf(n);
  const c = page.getByTestId('graph-box');
  const at = await c.evaluate((box, i) => {
    const canvas = box.querySelector('canvas') as any;
    const [x, y] = canvas.graphLayout[i];
    box.scrollIntoView({ block: 'center', behavior: 'instant' });
    box.scrollLeft = Math.max(0, x - box.clientWidth / 2);
    box.scrollTop = Math.max(0, y - box.clientHeight / 2);
    const r = canvas.getBoundingClientRect();
    return { x: r.left + x, y: r.top + y };
  }, k);
  await page.mouse.move(at.x, at.y);
  await expect(page.getByTestId('chart-tooltip')).toContainText(n.clerp);

  await page.getByTestId('graph-search').fill(topic);
  await row.getByRole('button').click();
  await atWidthsAndThemes(page, async (tag) => {
    await page.getByTestId('graph-nodelist').evaluate((e) => e.scrollIntoView({ block: 'start' }));
    await shot(page, `graph-labels-${tag}`);
  });
  expect(errors).toEqual([]);
});
