/**
 * Issue 42, the page in a researcher's hands (round 2): a result card's share link is that
 * result's, never an older one's.
 */
import { test, expect, atWidthsAndThemes, openReady, runOp, watchErrors, PROMPT } from './fixtures';
import { rmSync } from 'node:fs';
import { decodeShare, parseFragment } from '../src/share/codec';
import { loadModelNode } from '../src/node/load';
import { operations } from '../src/ops/index';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import { makeRandomSae } from '../tests/helpers/random-sae';

const linkState = (url: string) => decodeShare(parseFragment(new URL(url).hash).get('s')!);

test("a result card's link is its own result's: a new run hides the older link", async ({ page, site }) => {
  const errors = watchErrors(page);
  await openReady(page, site.url);
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'trace');
  await page.getByTestId('copy-link').click();
  const first = await page.getByTestId('share-url').inputValue();
  expect(linkState(first).input.prompt).toBe(PROMPT);

  await page.getByTestId('prompt').fill('Lily went to the park');
  await runOp(page, 'trace');
  // the card shows no link until this result's own is made, and that one carries the new prompt
  await expect(page.getByTestId('share-url')).toHaveCount(0);
  await page.getByTestId('copy-link').click();
  expect(linkState(await page.getByTestId('share-url').inputValue()).input.prompt).toBe('Lily went to the park');
  expect(errors).toEqual([]);
});

test('the head panel names its model, offers a re-run after the prompt changes, and refuses another model', async ({
  page,
  site,
}) => {
  const errors = watchErrors(page);
  await openReady(page, site.url);
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'trace');
  await page.locator('[data-testid=trace-heatmap] rect.cell[data-row="1"][data-col="2"]').click();
  const panel = page.getByTestId('head-panel');
  await expect(panel.getByTestId('head-model')).toHaveText('stories260K');
  await expect(panel.locator('[data-testid=head-pattern] rect.cell').first()).toBeAttached();
  await expect(panel.getByTestId('head-prompt-changed')).toHaveCount(0);
  // a new prompt: the pattern says it is the old prompt's, and re-runs on the new one when asked
  await page.getByTestId('prompt').fill('Lily went to the park');
  await expect(panel.getByTestId('head-prompt-changed')).toBeVisible();
  await panel.getByTestId('head-rerun').click();
  await expect(panel.getByTestId('head-prompt-changed')).toHaveCount(0);
  await expect(panel).toContainText('Lily went to the park');
  await panel.getByRole('button', { name: 'Close the head panel' }).click();

  // a trace result of another model (kept after a switch): its heads are that model's
  await page.evaluate(() => {
    const a = (globalThis as any).__loupe;
    const r = a.results.trace;
    a.results = {
      ...a.results,
      trace: { ...r, model: { kind: 'url', id: 'https://example.test/other', revision: '' } },
    };
  });
  await expect(page.getByTestId('stale-result')).toBeVisible();
  await page.locator('[data-testid=trace-heatmap] rect.cell[data-row="0"][data-col="1"]').click();
  await expect(panel.getByTestId('head-model')).toHaveText('https://example.test/other');
  await expect(panel.getByTestId('head-other-model')).toBeVisible();
  await expect(panel.getByTestId('head-ablate')).toBeDisabled();
  await expect(panel.locator('[data-testid=head-pattern]')).toHaveCount(0);
  expect(errors).toEqual([]);
});

test("causality takes the sweep's layer and direction; Fill example asks before replacing a typed prompt", async ({
  page,
  site,
}) => {
  await openReady(page, site.url);
  await page.getByTestId('tab-sweep').click();
  await page.getByTestId('fill-example').click();
  await page.locator('#p-sweep-direction').fill('tokens: sad - big');
  await page.getByTestId('tab-causality').click();
  await expect(page.locator('#p-causality-direction')).toHaveValue('tokens: sad - big');
  await expect(page.locator('#p-causality-layer')).toHaveValue('2');

  // a prompt the person typed stays unless they confirm
  await page.getByTestId('tab-steer').click();
  await page.getByTestId('prompt').fill('My own prompt about a dragon');
  const asked: string[] = [];
  page.once('dialog', (d) => (asked.push(d.message()), void d.dismiss()));
  await page.getByTestId('fill-example').click();
  await expect(page.locator('#p-steer-direction')).toHaveValue('tokens: happy - big');
  await expect(page.getByTestId('prompt')).toHaveValue('My own prompt about a dragon');
  expect(asked).toEqual([expect.stringContaining('Replace your prompt')]);
  page.once('dialog', (d) => void d.accept());
  await page.getByTestId('fill-example').click();
  await expect(page.getByTestId('prompt')).toHaveValue(PROMPT);
  // the example's own prompt is replaced without asking
  await page.getByTestId('fill-example').click();
  await expect(page.getByTestId('prompt')).toHaveValue(PROMPT);
});

test('a number in a table never wraps', async ({ page, site }) => {
  await page.setViewportSize({ width: 1024, height: 700 });
  await openReady(page, site.url);
  await runOp(page, 'trace');
  const ws = await page
    .locator('td.num')
    .first()
    .evaluate((el) => getComputedStyle(el).whiteSpace);
  expect(ws).toBe('nowrap');
});

test("the feature card names the max activation's prompt as the list does, and the descriptions path has one slash", async ({
  page,
  site,
}) => {
  const model = await loadModelNode('default');
  const sae = makeRandomSae({ hook: 'blocks.2.hook_resid_post', dIn: 64, dSae: 128, seed: 3 });
  let doc: any;
  try {
    // the source with a trailing slash, as a folder is often pasted
    doc = await operations.feature.run(
      model,
      {
        prompt: 'Once upon a time',
        prompts: ['Lily went to the park', 'The dog ran'],
        sae_source: `${sae.dir}/`,
        feature: 7,
      },
      createNodeSaeLoaders({ cache: false }),
    );
  } finally {
    await model.dispose();
    rmSync(sae.dir, { recursive: true, force: true });
  }
  expect(doc.descriptions.looked_for).toBe(`${sae.dir}/explanations.json`);
  await openReady(page, site.url);
  await page.evaluate((d) => {
    const a = (globalThis as any).__loupe;
    a.results = {
      ...a.results,
      feature: { op: 'feature', input: {}, doc: d, model: a.modelRef, ms: null, fromLink: false },
    };
  }, doc);
  await page.getByTestId('tab-feature').click();
  const k = doc.max_activation_prompt;
  await expect(page.getByTestId('feature-max-where')).toHaveText(k === 0 ? 'prompt' : `prompts[${k - 1}]`);
  await expect(page.getByTestId('sae-descriptions')).toContainText(`${sae.dir}/explanations.json`);
});

test('the edge circuit: hit areas wider than the stroke, a q/k/v legend, a sortable edge table with p-values', async ({
  page,
  site,
}) => {
  test.setTimeout(240_000);
  const model = await loadModelNode('default');
  let doc: any;
  try {
    doc = await operations.edge_attribution.run(model, {
      generate: { task: 'induction', n: 8, seed: 1, length: 8 },
      method: 'eap',
      evaluate: true,
    });
  } finally {
    await model.dispose();
  }
  const errors = watchErrors(page);
  await openReady(page, site.url);
  await page.evaluate((d) => {
    const a = (globalThis as any).__loupe;
    const entry = { op: 'edge_attribution', input: {}, doc: d, model: a.modelRef, ms: null, fromLink: false };
    a.results = { ...a.results, edge_attribution: entry };
  }, doc);
  await page.getByTestId('tab-edge_attribution').click();
  await page.getByTestId('edge-n').fill('60');

  // the legend names each dash pattern the circuit uses
  const legend = page.getByTestId('edge-legend');
  for (const [k, dash] of [
    ['k', '5 2'],
    ['v', '1.5 2'],
  ]) {
    await expect(legend.locator('.item', { hasText: `${k}: into a` }).locator('line')).toHaveAttribute(
      'stroke-dasharray',
      dash,
    );
    const drawn = page.locator(`[data-testid=edge-circuit] .circuit-edge[data-edge$="<${k}>"]`).first();
    if (await drawn.count()) await expect(drawn).toHaveAttribute('stroke-dasharray', dash);
  }

  // a thin drawn edge answers the pointer 4 px beside its line (where nothing else is)
  const target = await page.locator('[data-testid=edge-circuit] .circuit-edge').evaluateAll((paths) => {
    const thin = paths
      .map((p) => ({ p: p as SVGPathElement, w: Number(p.getAttribute('stroke-width')) }))
      .filter((x) => x.w < 2)
      .sort((a, b) => a.w - b.w);
    for (const { p, w } of thin) {
      p.scrollIntoView({ block: 'center', behavior: 'instant' });
      const m = p.getScreenCTM()!;
      for (const f of [0.3, 0.5, 0.7]) {
        const pt = p.getPointAtLength(p.getTotalLength() * f);
        const x = m.a * pt.x + m.e + 4;
        const y = m.d * pt.y + m.f;
        const hit = document.elementFromPoint(x, y);
        if (hit?.getAttribute('data-edge') === p.dataset.edge) return { name: p.dataset.edge!, w, x, y };
      }
    }
    return null;
  });
  expect(target).not.toBeNull();
  await page.mouse.move(target!.x, target!.y);
  await expect(page.getByTestId('chart-tooltip').locator('.tt-title')).toHaveText(target!.name);

  // the table sorts by any column; p-values come with Holm and BH
  const names = () =>
    page.locator('[data-testid=edge-table] tbody tr').evaluateAll((r) => r.map((x) => x.getAttribute('data-edge')));
  const byAbs = [...doc.edges].sort((a: any, b: any) => Math.abs(b.score) - Math.abs(a.score));
  expect((await names()).slice(0, 10)).toEqual(byAbs.slice(0, 10).map((e: any) => e.name));
  await page.getByTestId('edge-sort-score').click();
  const byScore = [...doc.edges]
    .map((e: any, i: number) => ({ e, i }))
    .sort((a: any, b: any) => a.e.score - b.e.score || a.i - b.i);
  expect((await names()).slice(0, 10)).toEqual(byScore.slice(0, 10).map((x: any) => x.e.name));
  await page.getByTestId('edge-sort-p_value').click();
  const ps = await page.locator('[data-testid=edge-table] tbody tr td:nth-child(5)').allTextContents();
  const nums = ps.map(Number);
  for (let i = 1; i < nums.length; i++) expect(nums[i]).toBeGreaterThanOrEqual(nums[i - 1]);
  await expect(page.getByTestId('edge-table').locator('th', { hasText: 'p Holm' })).toBeVisible();
  await expect(page.getByTestId('edge-statistics')).toContainText('Benjamini–Hochberg');

  await atWidthsAndThemes(page, async (tag) => {
    await page.getByTestId('edge-circuit').evaluate((e) => e.scrollIntoView({ block: 'start' }));
    await page.mouse.move(0, 0);
    await page.screenshot({ path: `artifacts/screenshots/edges-circuit-${tag}.png` });
    await page.getByTestId('edge-table').evaluate((e) => e.scrollIntoView({ block: 'start' }));
    await page.screenshot({ path: `artifacts/screenshots/edges-table-${tag}.png` });
    await page.getByTestId('dataset-panel').evaluate((e) => e.scrollIntoView({ block: 'start' }));
    await page.screenshot({ path: `artifacts/screenshots/edges-dataset-${tag}.png` });
  });
  expect(errors).toEqual([]);
});

test('screenshots of the changed views at 1280 and 1024, light and dark', async ({ page, site }) => {
  test.setTimeout(300_000);
  const model = await loadModelNode('default');
  const sae = makeRandomSae({ hook: 'blocks.2.hook_resid_post', dIn: 64, dSae: 128, seed: 3 });
  let feature: any;
  let patch: any;
  try {
    feature = await operations.feature.run(
      model,
      { prompt: 'Once upon a time', prompts: ['Lily went to the park'], sae_source: `${sae.dir}/`, feature: 7 },
      createNodeSaeLoaders({ cache: false }),
    );
    patch = await operations.patch.run(model, {
      generate: { task: 'induction', n: 6, seed: 2, length: 6 },
      scans: ['head_out'],
    });
  } finally {
    await model.dispose();
    rmSync(sae.dir, { recursive: true, force: true });
  }
  const errors = watchErrors(page);
  await openReady(page, site.url);
  await page.evaluate(
    ([f, p]) => {
      const a = (globalThis as any).__loupe;
      const e = (op: string, doc: any) => ({ op, input: {}, doc, model: a.modelRef, ms: null, fromLink: false });
      a.results = { ...a.results, feature: e('feature', f), patch: e('patch', p) };
    },
    [feature, patch],
  );
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'trace');
  await page.getByTestId('copy-link').click();
  await page.locator('[data-testid=trace-heatmap] rect.cell[data-row="1"][data-col="2"]').click();
  await expect(page.locator('[data-testid=head-pattern] rect.cell').first()).toBeAttached();
  await page.getByTestId('prompt').fill('Lily went to the park');
  await expect(page.getByTestId('head-prompt-changed')).toBeVisible();
  const shotOf = async (sel: string, name: string) => {
    await page
      .locator(sel)
      .first()
      .evaluate((el) => el.scrollIntoView({ block: 'start', behavior: 'instant' }));
    await page.mouse.move(0, 0);
    await page.screenshot({ path: `artifacts/screenshots/${name}.png` });
  };
  await atWidthsAndThemes(page, async (tag) => {
    await page.getByTestId('tab-trace').click();
    await shotOf('[data-testid=result]', `round2-trace-link-${tag}`);
    await shotOf('[data-testid=head-panel]', `round2-head-panel-${tag}`);
    await page.getByTestId('tab-feature').click();
    await shotOf('[data-testid=result]', `round2-feature-card-${tag}`);
    await page.getByTestId('tab-patch').click();
    await shotOf('[data-testid=dataset-stats-table]', `round2-dataset-stats-${tag}`);
  });
  expect(errors).toEqual([]);
});
