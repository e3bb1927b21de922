/**
 * The page in a researcher's hands (issue 27): state that follows the model, views that show
 * what the operations compute, and the rough edges found in use. One test per item; each failed
 * on the page before its fix. Screenshots go to /tmp/loupe-shots-27 (LOUPE_SHOTS_27 to move them).
 */
import { join } from 'node:path';
import { mkdirSync } from 'node:fs';
import { chromium, type BrowserContext, type Page } from '@playwright/test';
import { CHROMIUM_ARGS } from '../playwright.config';
import {
  test,
  expect,
  openReady,
  loadFromHub,
  waitModelReady,
  runOp,
  pageDoc,
  watchErrors,
  SHARED_MODELS,
  PROMPT,
  useBackend,
} from './fixtures';

const SHOTS = process.env.LOUPE_SHOTS_27 ?? '/tmp/loupe-shots-27';
mkdirSync(SHOTS, { recursive: true });
const REPO = 'loupe-test/induction-gpt2-27';

let context: BrowserContext;
let page: Page;
let errors: string[];

test.beforeAll(async ({ browser, site, hub }) => {
  hub.addRepo(REPO, join(SHARED_MODELS, 'induction-gpt2'));
  context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  errors = watchErrors(page);
  await openReady(page, site.url);
});
test.afterAll(async () => {
  await context.close();
});

/** 1280 × 800 and 1024 × 700, light and dark; the page is left light at 1280 × 800 */
async function shots(p: Page, name: string, target?: string): Promise<void> {
  const take = async (suffix: string) => {
    await p.mouse.move(0, 0);
    if (target) await p.locator(target).first().scrollIntoViewIfNeeded();
    await p.screenshot({ path: `${SHOTS}/${name}-${suffix}.png` });
  };
  const theme = async (t: 'light' | 'dark') => {
    const now = await p.evaluate(() => document.documentElement.dataset.theme ?? 'light');
    if (now !== t) await p.getByRole('button', { name: t === 'dark' ? /dark/i : /light/i }).click();
  };
  await theme('light');
  await take('1280-light');
  await p.setViewportSize({ width: 1024, height: 700 });
  await take('1024-light');
  await theme('dark');
  await take('1024-dark');
  await p.setViewportSize({ width: 1280, height: 800 });
  await take('1280-dark');
  await theme('light');
}

test('1. after a model switch: old results say whose they are, the head panel closes, no form keeps a layer or head the model lacks, and a reload restores the model', async ({
  hub,
}) => {
  await page.getByTestId('prompt').fill(PROMPT);
  // stories260K has 5 layers × 8 heads; induction-gpt2 has 2 × 4
  await page.getByTestId('tab-ablate').click();
  await page.locator('#p-ablate-layer').fill('3');
  await page.locator('#p-ablate-head').fill('6');
  await runOp(page, 'trace');
  await page.locator('[data-testid=trace-heatmap] rect.cell[data-row="3"][data-col="6"]').click();
  await expect(page.getByTestId('head-panel')).toBeVisible();
  await expect(page.getByTestId('stale-result')).toHaveCount(0);

  await loadFromHub(page, hub.url, REPO);
  await page.waitForFunction(
    (id) => (globalThis as any).__loupe.model?.info.id === id && (globalThis as any).__loupe.modelStatus === 'ready',
    REPO,
  );
  await expect(page.getByTestId('head-panel')).toHaveCount(0);
  await page.getByTestId('tab-trace').click();
  await expect(page.getByTestId('stale-result')).toContainText('stories260K');
  await shots(page, 'stale-result', '[data-testid=result]');
  await expect(page.locator('[data-testid=notice]').filter({ hasText: 'ablate layer 3' })).toBeVisible();
  await page.getByTestId('tab-ablate').click();
  await expect(page.locator('#p-ablate-layer')).toHaveValue('');
  await expect(page.locator('#p-ablate-head')).toHaveValue('');
  await page.locator('#p-ablate-layer').fill('1');
  await page.locator('#p-ablate-head').fill('2');
  await runOp(page, 'ablate');
  expect((await pageDoc(page, 'ablate')).model.id).toBe(REPO);
  await expect(page.getByTestId('stale-result')).toHaveCount(0);

  // a reload opens the last model from this browser's cache, not the bundled one
  const before = hub.log.filter((r) => r.id === REPO).length;
  await page.reload();
  await waitModelReady(page);
  expect(await page.evaluate(() => (globalThis as any).__loupe.model.info.id)).toBe(REPO);
  expect(hub.log.filter((r) => r.id === REPO).length).toBe(before);
  expect(errors).toEqual([]);
});

/** induction-gpt2 loaded (a test run alone starts on the bundled model) */
async function useInduction(hub: { url: string }): Promise<void> {
  if (await page.evaluate((id) => (globalThis as any).__loupe.model?.info.id === id, REPO)) return;
  await loadFromHub(page, hub.url, REPO);
  await page.waitForFunction(
    (id) => (globalThis as any).__loupe.model?.info.id === id && (globalThis as any).__loupe.modelStatus === 'ready',
    REPO,
  );
}

/** WCAG contrast ratio of two computed CSS colours (rgb()/rgba()) */
function contrast(x: string, y: string): number {
  const lum = (c: string) => {
    const [r, g, b] = (c.match(/[\d.]+/g) ?? ['0', '0', '0']).slice(0, 3).map((v) => {
      const u = Number(v) / 255;
      return u <= 0.03928 ? u / 12.92 : ((u + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const [a, b] = [lum(x), lum(y)];
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
}

/** every cell text of the result's heatmaps: its text, and whether it fits its cell */
async function cellTexts(p: Page): Promise<{ text: string; fits: boolean }[]> {
  return p.$$eval('[data-testid=result] svg g.cells text', (els) =>
    els.map((t) => {
      const cw = Number((t.parentNode as Element).querySelector('rect.cell')?.getAttribute('width') ?? 0) + 1;
      return { text: t.textContent ?? '', fits: (t as SVGGraphicsElement).getBBox().width <= cw };
    }),
  );
}

test('9, 10. heatmap numbers only where they fit, no "-0.00", missing cells unlike near-zero ones, whole colour-bar titles, waterfall grouped by layer, method text, one-line status bar', async ({
  hub,
}) => {
  await useInduction(hub);
  // many positions (induction-gpt2 reads characters; its context is 64); the corrupted run predicts X

  const long = 'abcdefghij abcdefghij abcdefghij abcdefgh';
  await page.getByTestId('prompt').fill(long);
  await page.getByTestId('tab-patch').click();
  await page.locator('#p-patch-corrupted_prompt').fill(long.replaceAll('i', 'X'));
  await page.locator('#p-patch-heads').fill('[{"layer":0,"head":0},{"layer":1,"head":1}]');
  await runOp(page, 'patch');
  const patchTexts = await cellTexts(page);
  expect(patchTexts.length).toBeGreaterThan(0);
  for (const t of patchTexts) {
    expect(t.text, 'a number cut short reads as another number').not.toMatch(/…/);
    expect(t.fits, `"${t.text}" is wider than its cell`).toBe(true);
    expect(t.text).not.toMatch(/^-0?\.0+$/);
  }
  // heads the run did not patch have no value: hatched, not the near-white of a value near zero
  const headMap = page.locator('[data-testid=result] svg:has(rect.cell[data-missing])');
  await expect(headMap).toHaveCount(1);
  const missing = headMap.locator('rect.cell[data-missing=true]');
  expect(await missing.count()).toBeGreaterThan(0);
  expect(await missing.first().getAttribute('fill')).toMatch(/^url\(#hatch-/);
  // colour-bar titles whole
  for (const t of await page.locator('[data-testid=result] svg .legend-title').allTextContents())
    expect(t).toBe('normalised logit diff');
  await shots(page, 'patch-heatmaps', '[data-testid=result]');

  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'head_scores');
  await expect(page.getByTestId('result')).not.toContainText('[object Object]');
  await expect(page.getByTestId('result')).not.toContainText(/(^|[^\d])-0\.0+(?!\d*[1-9])/);
  for (const t of await page.locator('[data-testid=result] svg .legend-title').allTextContents())
    expect(t).not.toMatch(/…$/);
  await shots(page, 'head-scores', '[data-testid=result]');

  await runOp(page, 'trace');
  // the waterfall's rows of one layer share a band, every other layer shaded; value labels carry a halo
  const wf = page.locator('[data-testid=result] svg:has(rect.wf-term)');
  expect(await wf.locator('.wf-layers rect[data-layer]').count()).toBeGreaterThan(0);
  expect(await wf.locator('text.wf-value').first().getAttribute('paint-order')).toBe('stroke');
  await shots(page, 'trace-waterfall', '[data-testid=result] svg:has(rect.wf-term)');

  // the status bar stays one line at 1024 px
  await page.setViewportSize({ width: 1024, height: 700 });
  const bar = await page.getByTestId('status-bar').boundingBox();
  expect(bar!.height).toBeLessThan(32);
  await page.setViewportSize({ width: 1280, height: 800 });
  expect(errors).toEqual([]);
});

test('9. tabs answer Home/End, the form names a bad layer or head itself, the picked B stays visible on hover, session prompts differ where they differ', async () => {
  await page.getByTestId('tab-trace').click();
  await page.getByTestId('tab-trace').focus();
  await page.keyboard.press('End');
  const last = await page.evaluate(() => (globalThis as any).__loupe.ops.at(-1).name);
  await expect(page.getByTestId(`tab-${last}`)).toHaveAttribute('aria-selected', 'true');
  await page.keyboard.press('Home');
  await expect(page.getByTestId('tab-trace')).toHaveAttribute('aria-selected', 'true');

  await page.getByTestId('tab-ablate').click();
  await page.locator('#p-ablate-layer').fill('1.5');
  await page.locator('#p-ablate-head').fill('-1');
  await page.getByTestId('run').click();
  await expect(page.locator('[data-field=layer] [role=alert]')).toContainText('not an integer');
  await expect(page.locator('[data-field=head] [role=alert]')).toContainText('at least 0');
  await page.locator('#p-ablate-layer').fill('');
  await page.locator('#p-ablate-head').fill('');

  // two prompts alike at the start: their session entries still differ
  const a = 'Once upon a time, there was a little girl who went to the shop';
  const b = 'Once upon a time, there was a little girl who went to the park';
  for (const prompt of [a, b]) {
    await page.getByTestId('prompt').fill(prompt);
    await runOp(page, 'trace');
  }
  const labels = await page.locator('[data-testid=session-entry][data-op=trace] .mono').allTextContents();
  expect(labels[0]).not.toBe(labels[1]);
  expect(labels[0]).toMatch(/park$/);
  // and the sidebar shows them whole (no ellipsis of its own cutting off where they differ)
  for (const btn of await page.locator('[data-testid=session-entry][data-op=trace] button.left').all())
    expect(await btn.evaluate((e) => e.scrollWidth <= e.clientWidth + 1)).toBe(true);
  const bBtn = page.getByTestId('session-b').first();
  await bBtn.click();
  await bBtn.hover();
  const c = await bBtn.evaluate((el) => {
    const s = getComputedStyle(el);
    return { fg: s.color, bg: s.backgroundColor };
  });
  expect(contrast(c.fg, c.bg), `${c.fg} on ${c.bg}`).toBeGreaterThan(3);
  await shots(page, 'session', '[data-testid=session]');
  expect(errors).toEqual([]);
});

test('9. near-zero tokens stay near the background in the dark theme; the Doctor without WebGPU reads cleanly', async ({
  site,
}) => {
  await useBundled(); // its pair has equal token lengths on the bundled model, not on induction-gpt2
  await page.getByTestId('prompt').fill(PROMPT);
  await page.getByTestId('tab-integrated_gradients').click();
  await page.locator('#p-integrated_gradients-corrupted_prompt').fill(PROMPT.replace('little', 'big'));
  await runOp(page, 'integrated_gradients');
  await page.getByRole('button', { name: /dark/i }).click();
  // redrawn in the dark theme's colours
  await page.waitForFunction(() => document.documentElement.dataset.theme === 'dark');
  await page.waitForTimeout(300);
  const cells = await page.$$eval('[data-testid=result] rect.tok-cell', (els) =>
    els.map((e) => ({ v: Number(e.getAttribute('data-value')), fill: getComputedStyle(e).fill })),
  );
  const bg = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  const max = Math.max(...cells.map((c) => Math.abs(c.v)));
  const small = cells.filter((c) => c.v !== 0 && Math.abs(c.v) < 0.05 * max);
  for (const c of small) expect(contrast(c.fill, bg), `a token at ${c.v} of ±${max}`).toBeLessThan(2);
  await page.getByRole('button', { name: /light/i }).click();
  await shots(page, 'ig-tokens', '[data-testid=result]');

  const b = await chromium.launch({
    executablePath: process.env.LOUPE_CHROMIUM ?? '/usr/bin/chromium',
    args: CHROMIUM_ARGS.filter((a) => a !== '--enable-unsafe-webgpu'),
  });
  try {
    const p = await (await b.newContext({ viewport: { width: 1280, height: 800 } })).newPage();
    await openReady(p, site.url);
    await p.getByRole('button', { name: 'Doctor' }).click();
    await expect(p.getByTestId('doc-webgpu')).toContainText('unavailable');
    const text = (await p.locator('body').textContent()) ?? '';
    expect(text).not.toMatch(/\.\)\.|\)\.\)/);
  } finally {
    await b.close();
  }
  expect(errors).toEqual([]);
});

async function useBundled(): Promise<void> {
  if (await page.evaluate(() => (globalThis as any).__loupe.model?.ref.kind === 'bundled')) return;
  await page.evaluate(() => (globalThis as any).__loupe.loadModel({ kind: 'bundled' }));
  await page.waitForFunction(
    () =>
      (globalThis as any).__loupe.model?.ref.kind === 'bundled' && (globalThis as any).__loupe.modelStatus === 'ready',
  );
}

const cellValues = (p: Page, testid: string) =>
  p.$$eval(`[data-testid=${testid}] rect.cell`, (els) =>
    els.map((e) => ({ r: Number(e.dataset.row), c: Number(e.dataset.col), v: Number(e.dataset.value) })),
  );

test('2. patch, AtP and IG: the pair and its tokens carry across the tabs, one raw/normalised toggle, the small-gap warning shown, every AtP site compared', async () => {
  await useBundled();
  await page.getByTestId('prompt').fill(PROMPT);
  await page.getByTestId('tab-patch').click();
  await page.locator('#p-patch-heads').fill('');
  const corrupted = PROMPT.replace('little', 'big');
  await page.locator('#p-patch-corrupted_prompt').fill(corrupted);
  // She/He: the metric whose gap stories260K leaves below 1 logit on this pair
  await page.locator('#p-patch-answer').fill(' She');
  await page.locator('#p-patch-counterfactual').fill(' He');
  for (const op of ['attribution_patching', 'integrated_gradients']) {
    await page.getByTestId(`tab-${op}`).click();
    await expect(page.locator(`#p-${op}-corrupted_prompt`)).toHaveValue(corrupted);
    await expect(page.locator(`#p-${op}-answer`)).toHaveValue(' She');
    await expect(page.locator(`#p-${op}-counterfactual`)).toHaveValue(' He');
  }
  await page.getByTestId('tab-patch').click();
  await page.evaluate(() => (globalThis as any).__loupe.prefs.setMetricUnit('normalised'));
  await runOp(page, 'patch');
  const patch = await pageDoc(page, 'patch');
  // stories260K little/big: |M(clean) − M(corrupted)| < 1 logit, and the page says so
  expect(Math.abs(patch.clean_logit_diff - patch.corrupted_logit_diff)).toBeLessThan(1);
  await expect(page.getByTestId('doc-warnings')).toContainText('unstable');
  const gap = patch.clean_logit_diff - patch.corrupted_logit_diff;
  const norm = await cellValues(page, 'patch-resid_pre');
  expect(norm[0].v).toBeCloseTo(patch.resid_pre[norm[0].r][norm[0].c], 6);
  await page.getByTestId('unit-raw').click();
  const raw = await cellValues(page, 'patch-resid_pre');
  const i = raw.findIndex((x) => Math.abs(x.v) > 1e-3);
  expect(raw[i].v).toBeCloseTo(patch.resid_pre[raw[i].r][raw[i].c] * gap, 5);
  await shots(page, 'patch-raw', '[data-testid=result]');

  // AtP: estimates are raw ΔM; normalised divides by the same gap; every head and site validated
  await runOp(page, 'attribution_patching');
  const atp = await pageDoc(page, 'attribution_patching');
  await expect(page.getByTestId('doc-warnings')).toContainText('unstable');
  expect(atp.validation.scope).toBe('all');
  await expect(page.getByTestId('atp-scatter')).toContainText('every one of the');
  await expect(page.getByTestId('atp-scatter')).toContainText('same sign');
  const est = (l: number, h: number) => atp.heads.find((x: any) => x.layer === l && x.head === h).estimate;
  const rawHeads = await cellValues(page, 'atp-heads');
  expect(rawHeads[3].v).toBeCloseTo(est(rawHeads[3].r, rawHeads[3].c), 6);
  await page.getByTestId('unit-normalised').click();
  const gapA = atp.metric.clean - atp.metric.corrupted;
  const normHeads = await cellValues(page, 'atp-heads');
  expect(normHeads[3].v).toBeCloseTo(est(normHeads[3].r, normHeads[3].c) / gapA, 5);
  await shots(page, 'atp-normalised', '[data-testid=result]');

  // IG from the corrupted prompt: the same toggle, and the view names its baseline
  await runOp(page, 'integrated_gradients');
  const ig = await pageDoc(page, 'integrated_gradients');
  expect(ig.baseline).toBe('corrupted');
  await expect(page.getByTestId('ig-view')).toContainText(`the corrupted prompt “${corrupted}”`);
  await expect(page.getByTestId('metric-unit')).toHaveAttribute('data-unit', 'normalised');
  await shots(page, 'ig-view', '[data-testid=result]');
  expect(errors).toEqual([]);
});

test('3. steering: relative change left out where the base probability is tiny (Δ log-prob stated), how α was chosen, the direction carried to sweep and causality', async () => {
  await useBundled();
  await page.getByTestId('tab-steer').click();
  await page.getByTestId('fill-example').click();
  await page.locator('#p-steer-direction').fill('tokens: happy - big');
  await page.locator('#p-steer-layer').fill('2');
  await page.getByTestId('tab-causality').click();
  await expect(page.locator('#p-causality-direction')).toHaveValue('tokens: happy - big');
  await expect(page.locator('#p-causality-layer')).toHaveValue('2');
  await page.getByTestId('tab-sweep').click();
  await expect(page.locator('#p-sweep-direction')).toHaveValue('tokens: happy - big');
  await page.getByTestId('tab-steer').click();
  await runOp(page, 'steer');
  const st = await pageDoc(page, 'steer');
  expect(st.relative_change_note).not.toBeNull();
  await expect(page.getByTestId('relative-change')).toHaveCount(0);
  await expect(page.getByTestId('relative-change-note')).toContainText('log-probability');
  // the base and steered columns stay side by side, each as wide as the other
  const [l, r] = await Promise.all(['text-left', 'text-right'].map((t) => page.getByTestId(t).boundingBox()));
  expect(Math.abs(l!.width - r!.width)).toBeLessThan(2);
  await shots(page, 'steer', '[data-testid=result]');

  await page.getByTestId('tab-causality').click();
  await page.locator('#p-causality-n_random').fill('16');
  await runOp(page, 'causality');
  const ca = await pageDoc(page, 'causality');
  await expect(page.getByTestId('alpha-rule')).toContainText(ca.alpha_rule);
  await shots(page, 'causality', '[data-testid=result]');
  expect(errors).toEqual([]);
});

test('5. dashboard: the form shows the chosen subject kind only, a gated neuron leads with its minima, excluded tokens said', async () => {
  await useBundled();
  await page.getByTestId('tab-dashboard').click();
  await page.getByTestId('fill-example').click();
  await expect(page.locator('[data-field=neuron]')).toBeVisible();
  await expect(page.locator('[data-field=sae_source]')).toHaveCount(0);
  await page.locator('#p-dashboard-subject').selectOption('feature');
  await expect(page.locator('[data-field=neuron]')).toHaveCount(0);
  await expect(page.locator('[data-field=sae_source]')).toBeVisible();
  await page.locator('#p-dashboard-subject').selectOption('neuron');
  await page.locator('#p-dashboard-layer').fill('2');
  await page.locator('#p-dashboard-neuron').fill('15');
  await runOp(page, 'dashboard');
  const d = await pageDoc(page, 'dashboard');
  expect(d.dominant).toBe('min');
  await expect(page.getByTestId('side-min')).toHaveAttribute('aria-pressed', 'true');
  await expect(page.getByTestId('dashboard-examples')).toContainText('Min-activating');
  await expect(page.getByTestId('dashboard-examples')).toContainText(`min ${d.examples_min[0].min.toFixed(3)}`);
  await expect(page.getByTestId('dashboard-excluded')).toContainText(String(d.direct_path.excluded.count));
  await shots(page, 'dashboard-min', '[data-testid=result]');
  await page.getByTestId('side-max').click();
  await expect(page.getByTestId('dashboard-examples')).toContainText('Max-activating');
  expect(errors).toEqual([]);
});

test('6. head-score cells, their pattern grid and the attention small multiples open the head panel; "the prompt" updates the top tables', async () => {
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'head_scores');
  const panel = page.getByTestId('head-panel');
  await page.locator('[data-testid=head-scores-heatmap] rect.cell[data-row="1"][data-col="2"]').click();
  await expect(panel.getByRole('heading')).toHaveText('L1H2 pattern');
  await page.locator('[data-testid=head-grid] figure[data-layer="0"][data-head="3"]').click();
  await expect(panel.getByRole('heading')).toHaveText('L0H3 pattern');
  const doc = await pageDoc(page, 'head_scores');
  const best = (rows: any[]) => [...rows].sort((a, b) => b.induction - a.induction)[0];
  const firstCell = page
    .locator('[data-testid=head-scores-view] [data-testid=top-heads] tbody tr')
    .first()
    .locator('td')
    .first();
  const r = best(doc.heads);
  await expect(firstCell).toContainText(`L${r.layer}H${r.head}`);
  await page.getByTestId('source-prompt').click();
  const p = best(doc.prompt_scores.heads);
  await expect(firstCell).toContainText(`L${p.layer}H${p.head} ${p.induction.toFixed(3)}`);
  await shots(page, 'head-scores-linked', '[data-testid=result]');

  await runOp(page, 'attention');
  const layer = (await pageDoc(page, 'attention')).heads[0].layer;
  await page.locator('[data-testid=result] g.multiple[data-head="1"]').click();
  await expect(panel.getByRole('heading')).toHaveText(`L${layer}H1 pattern`);
  await shots(page, 'attention-linked', '[data-testid=head-panel]');
  expect(errors).toEqual([]);
});

test('7. activations shows the values per position and unit, and the top units at a chosen position', async () => {
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'activations');
  const d = await pageDoc(page, 'activations');
  const grid = page.locator('[data-testid=activations-values] svg');
  await expect(grid).toHaveAttribute('data-rows', String(d.values.grid.length));
  await expect(grid).toHaveAttribute('data-cols', String(d.values.width));
  const last = d.values.top.at(-1).units;
  const rows = page.locator('[data-testid=values-top] tbody tr');
  await expect(rows).toHaveCount(last.length);
  await expect(rows.first()).toHaveAttribute('data-unit', String(last[0].index));
  await page.locator('#act-pos').selectOption('2');
  await expect(rows.first()).toHaveAttribute('data-unit', String(d.values.top[2].units[0].index));
  await shots(page, 'activations-values', '[data-testid=activations-values]');
  expect(errors).toEqual([]);
});

test('8. a failed backend switch leaves the dropdown on the backend in use; a software WebGPU adapter is said to be slow before any run', async ({
  site,
}) => {
  const b = await chromium.launch({
    executablePath: process.env.LOUPE_CHROMIUM ?? '/usr/bin/chromium',
    args: CHROMIUM_ARGS.filter((a) => a !== '--enable-unsafe-webgpu'),
  });
  try {
    const p = await (await b.newContext({ viewport: { width: 1280, height: 800 } })).newPage();
    await openReady(p, site.url);
    await p.locator('#backend').selectOption('webgpu');
    await expect(p.locator('[data-testid=notice]').filter({ hasText: 'Could not switch to webgpu' })).toBeVisible();
    await expect(p.locator('#backend')).toHaveValue('auto');
    await expect(p.getByTestId('status-backend')).toContainText('wasm');
    await expect(p.getByTestId('slow-backend')).toHaveCount(0);
  } finally {
    await b.close();
  }

  // SwiftShader: WebGPU exists, on a software adapter
  await useBundled();
  await useBackend(page, 'webgpu');
  await page.getByTestId('tab-trace').click();
  await expect(page.getByTestId('slow-backend')).toContainText('software adapter');
  await shots(page, 'slow-backend');
  await page.locator('#backend').selectOption('wasm');
  await page.waitForFunction(
    () =>
      (globalThis as any).__loupe.model?.info.backend === 'wasm' && (globalThis as any).__loupe.modelStatus === 'ready',
  );
  await expect(page.getByTestId('slow-backend')).toHaveCount(0);
  // onnxruntime's WebGPU session logs its CPU-assigned shape nodes as console errors: not the page's
  expect(errors.filter((e) => !/\[W:onnxruntime:/.test(e))).toEqual([]);
  errors.length = 0;
});

test('9. compare has a Δ for the waterfall terms and the top neurons of two traces, not only the head grid', async () => {
  await useBundled();
  const docs = [];
  for (const prompt of [PROMPT, PROMPT.replace('little', 'big')]) {
    await page.getByTestId('prompt').fill(prompt);
    await runOp(page, 'trace');
    docs.push(await pageDoc(page, 'trace'));
  }
  const [a, b] = docs;
  const entries = page.locator('[data-testid=session-entry][data-op=trace]');
  await entries.nth(1).getByTestId('session-a').click();
  await entries.nth(0).getByTestId('session-b').click();
  const cmp = page.getByTestId('compare');
  await cmp.getByTestId('compare-grid').selectOption('terms');
  await expect(cmp.locator('[data-testid=compare-delta] rect.cell')).toHaveCount(a.decomposition.terms.length);
  const i = a.decomposition.terms.findIndex((t: any) => t.name === 'L1H2');
  const d = cmp.locator(`[data-testid=compare-delta] rect.cell[data-row="${i}"]`);
  expect(Number(await d.getAttribute('data-value'))).toBeCloseTo(
    b.decomposition.terms[i].value - a.decomposition.terms[i].value,
    6,
  );
  await shots(page, 'compare-terms', '[data-testid=compare]');

  await cmp.getByTestId('compare-grid').selectOption('top_neurons');
  await expect(cmp.locator('[data-testid=compare-delta] rect.cell')).toHaveCount(a.top_neurons.length * 2);
  const shared = a.top_neurons.findIndex((n: any) =>
    b.top_neurons.some((m: any) => m.layer === n.layer && m.neuron === n.neuron),
  );
  expect(shared).toBeGreaterThanOrEqual(0);
  const n = a.top_neurons[shared];
  const m = b.top_neurons.find((x: any) => x.layer === n.layer && x.neuron === n.neuron);
  const cell = cmp.locator(`[data-testid=compare-delta] rect.cell[data-row="${shared}"][data-col="0"]`);
  expect(Number(await cell.getAttribute('data-value'))).toBeCloseTo(m.logit_attribution - n.logit_attribution, 6);
  expect(errors).toEqual([]);
});

test('4. a tokens: direction on the SentencePiece model: each side tokenized as a word of running text, the hint naming its real first piece', async () => {
  await useBundled();
  await page.getByTestId('prompt').fill(PROMPT);
  await page.getByTestId('tab-steer').click();
  await page.locator('#p-steer-layer').fill('2');
  await page.locator('#p-steer-alpha').fill('4');
  // " sad" is two pieces in running text, [" sa", "d"]: not [" ", " sa", "d"] (a space added, and SentencePiece's own)
  await page.locator('#p-steer-direction').fill('tokens: happy - sad');
  await page.getByTestId('run').click();
  const err = page.getByTestId('job-error');
  await expect(err).toContainText('UNKNOWN_TOKEN');
  await expect(err).toContainText('[" sa" (#296), "d" (#418)]');
  await expect(err).toContainText('its first piece " sa"');
  // the piece the hint names steers
  await page.locator('#p-steer-direction').fill('tokens: happy - sa');
  await runOp(page, 'steer');
  expect((await pageDoc(page, 'steer')).direction.description).toContain('sa');
  expect(errors).toEqual([]);
});
