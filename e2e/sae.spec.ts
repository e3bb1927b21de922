/**
 * The SAE views in the page, on the bundled stories260K with a random SAE in SAELens layout
 * (blocks.2.hook_resid_pre, d_in 64) served by the Hub stand-in: sae_features draws its token
 * table and equals the CLI's --json (with SAE download progress in the job bar); a reloaded page
 * loads the SAE from IndexedDB with zero requests; the feature card and the feature sweep draw;
 * a mismatched SAE (d_in 32) shows SAE_MISMATCH and the page stays usable; a shared link to an SAE
 * result waits for a click before downloading the SAE, then re-runs to the same numbers.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import type { BrowserContext, Page } from '@playwright/test';
import { test, expect, openReady, runOp, shot, pageDoc, watchErrors, waitModelReady, PROMPT } from './fixtures';
import { makeRandomSae, type RandomSae } from '../tests/helpers/random-sae';

test.describe.configure({ mode: 'serial' });

const REPO = 'loupe-test/stories260K-saes';
const SAE_PATH = 'blocks.2.hook_resid_pre';
const BAD_PATH = 'd32/blocks.2.hook_resid_pre';
const TOP_K = 8;

let context: BrowserContext;
let page: Page;
let errors: string[];
let saes: RandomSae[] = [];
let cacheDir: string;
/** the SAE's folder as a URL on the Hub stand-in: the page (bundled model, public-Hub endpoint) reads it as a URL */
let source: string;

test.beforeAll(async ({ browser, hub }) => {
  const good = makeRandomSae({ hook: SAE_PATH, dIn: 64, dSae: 256, seed: 31, modelName: 'stories260K' });
  const bad = makeRandomSae({ hook: SAE_PATH, dIn: 32, dSae: 64, seed: 32 });
  saes = [good, bad];
  hub.addRepo(REPO, null);
  for (const [s, dir] of [
    [good, SAE_PATH],
    [bad, BAD_PATH],
  ] as const) {
    for (const f of ['cfg.json', 'sae_weights.safetensors'])
      hub.addFile(REPO, `${dir}/${f}`, readFileSync(path.join(s.dir, f)));
  }
  // descriptions for the even features only: odd ones must read "no description"
  const records = Array.from({ length: 128 }, (_, i) => ({
    modelId: 'stories260K',
    layer: '2-res-test',
    index: String(2 * i),
    description: `even feature ${2 * i}`,
  }));
  hub.addFile(REPO, `${SAE_PATH}/explanations.json`, JSON.stringify(records));
  // paced, so the download is seen in the job bar
  hub.throttle(REPO, `${SAE_PATH}/sae_weights.safetensors`, { chunkSize: 16 * 1024, chunkDelayMs: 60 });
  source = `${hub.url}/${REPO}/resolve/main`;
  cacheDir = mkdtempSync(path.join(tmpdir(), 'loupe-e2e-sae-'));
  context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  errors = watchErrors(page);
});
test.afterAll(async () => {
  await context.close();
  for (const s of saes) rmSync(s.dir, { recursive: true, force: true });
  rmSync(cacheDir, { recursive: true, force: true });
});

/** A 1280×800 screenshot with `testid` at the top of the view and no transient notices over it. */
async function shotOf(p: Page, name: string, testid: string): Promise<void> {
  for (const b of await p.locator('[data-testid=notice] button').all()) await b.click().catch(() => {});
  await p.evaluate(() => (document.activeElement as HTMLElement | null)?.blur());
  await p.getByTestId(testid).evaluate((e) => e.scrollIntoView({ block: 'start' }));
  await shot(p, name);
}

const requestsFor = (hub: { log: { id?: string }[] }) => hub.log.filter((r) => r.id === REPO).length;

async function fillSae(p: Page, op: string, sae: string, saePath: string): Promise<void> {
  await p.getByTestId(`tab-${op}`).click();
  await p.locator(`#p-${op}-sae_source`).fill(sae);
  await p.locator(`#p-${op}-sae_path`).fill(saePath);
}

/** Every number within 1e-4 (ids, positions and feature indices exactly), every string equal; the backend may differ. */
function expectSameDoc(a: unknown, b: unknown, where = ''): number {
  const EXACT = new Set([
    'feature',
    'token_id',
    'id',
    'position',
    'l0',
    'top_k',
    'positions',
    'd_in',
    'd_sae',
    'index',
    'count',
    'records',
    'hook_layer',
  ]);
  let max = 0;
  const walk = (x: unknown, y: unknown, p: string, key: string): void => {
    if (p === '.model.backend') return;
    if (typeof x === 'number' && typeof y === 'number') {
      if (EXACT.has(key)) expect(y, p).toBe(x);
      else {
        const d = Math.abs(x - y);
        max = Math.max(max, d);
        expect(d, `${p}: ${x} vs ${y}`).toBeLessThanOrEqual(1e-4);
      }
      return;
    }
    if (Array.isArray(x) && Array.isArray(y)) {
      expect(y.length, `${p}.length`).toBe(x.length);
      x.forEach((v, i) => walk(v, y[i], `${p}[${i}]`, key));
      return;
    }
    if (x && y && typeof x === 'object' && typeof y === 'object') {
      expect(Object.keys(y).sort(), `${p} keys`).toEqual(Object.keys(x).sort());
      for (const k of Object.keys(x)) walk((x as any)[k], (y as any)[k], `${p}.${k}`, k);
      return;
    }
    expect(y, p).toEqual(x);
  };
  walk(a, b, where, '');
  return max;
}

test('sae_features: the token table, download progress, and the same document as the CLI', async ({ site, hub }) => {
  await openReady(page, site.url);
  await page.getByTestId('prompt').fill(PROMPT);
  await fillSae(page, 'sae_features', source, SAE_PATH);
  await page.locator('#p-sae_features-top_k').fill(String(TOP_K));
  await page.getByTestId('run').click();
  // the weights' download shows in the job bar, in bytes
  await expect(page.getByTestId('job')).toContainText(/loading SAE .*sae_weights\.safetensors \(.*KB of .*KB\)/, {
    timeout: 20_000,
  });
  await expect(page.getByTestId('job')).toHaveCount(0, { timeout: 60_000 });
  await expect(page.getByTestId('job-error')).toHaveCount(0);
  const doc = await pageDoc(page, 'sae_features');
  const T = doc.tokens.length;

  // one token per position; the final one is selected first and lists its features
  const toks = page.locator('[data-testid=sae-token-strip] [data-position]');
  await expect(toks).toHaveCount(T);
  await expect(page.getByTestId('sae-selected')).toHaveAttribute('data-position', String(T - 1));
  const rowsOf = () =>
    page.locator('[data-testid=sae-feature-table] tr[data-feature]').evaluateAll((els) =>
      els.map((e) => ({
        f: Number(e.getAttribute('data-feature')),
        a: Number(e.getAttribute('data-activation')),
        l: e.getAttribute('data-logit-attribution'),
        text: e.textContent ?? '',
      })),
    );
  const check = async (pos: number) => {
    const want = doc.positions[pos].features;
    const rows = await rowsOf();
    expect(rows.map((r) => r.f)).toEqual(want.map((f: any) => f.feature));
    rows.forEach((r, i) => {
      expect(r.a).toBe(want[i].activation);
      expect(r.l === '' ? null : Number(r.l)).toBe(want[i].logit_attribution);
      expect(r.text).toContain(want[i].description ?? 'no description');
    });
    return rows;
  };
  const last = await check(T - 1);
  expect(last.length).toBe(Math.min(TOP_K, doc.positions[T - 1].l0));
  expect(last.every((r) => r.l !== '')).toBe(true); // the final position carries logit attributions
  // hover a token: its features; keyboard: → moves to the next token
  await toks.nth(2).hover();
  await expect(page.getByTestId('sae-selected')).toHaveAttribute('data-position', '2');
  const mid = await check(2);
  expect(mid.every((r) => r.l === '')).toBe(true);
  await toks.nth(2).focus();
  await page.keyboard.press('ArrowRight');
  await expect(page.getByTestId('sae-selected')).toHaveAttribute('data-position', '3');
  await expect(toks.nth(3)).toBeFocused();
  await check(3);
  // described and undescribed features both appear, the latter said so
  const all = doc.positions.flatMap((p: any) => p.features);
  expect(all.some((f: any) => f.description === null) && all.some((f: any) => f.description !== null)).toBe(true);
  // the bar chart carries the numbers; hover shows them
  const bars = page.locator('[data-testid=sae-features-bars] rect.bar');
  await expect(bars).toHaveCount(doc.positions[3].features.length);
  await bars.first().hover();
  await expect(page.getByTestId('chart-tooltip')).toContainText(`#${doc.positions[3].features[0].feature}`);
  await expect(page.locator('[data-testid=sae-recon-chart] circle.point')).toHaveCount(
    doc.positions.filter((p: any) => p.reconstruction.mse !== null).length,
  );
  await expect(page.locator('[data-testid=sae-logit-bars] rect.bar')).not.toHaveCount(0);
  await toks.nth(T - 1).hover();
  await shotOf(page, 'sae-features', 'sae-features-view');
  await shotOf(page, 'sae-features-charts', 'sae-features-bars');

  // the CLI, finding the same SAE on the Hub stand-in through HF_ENDPOINT (async: this process serves the Hub)
  const { stdout } = await promisify(execFile)(
    process.execPath,
    [
      'bin/loupe.mjs',
      'sae_features',
      'default',
      PROMPT,
      '--sae-source',
      source,
      '--sae-path',
      SAE_PATH,
      '--top-k',
      String(TOP_K),
      '--json',
    ],
    { env: { ...process.env, HF_ENDPOINT: hub.url, LOUPE_CACHE_DIR: cacheDir } },
  );
  const cli = JSON.parse(stdout);
  expect(cli.model.backend).toBe('node');
  const maxDiff = expectSameDoc(cli, doc);
  console.log(
    `[e2e] sae_features page (wasm) vs CLI --json: ${doc.positions.length} positions, max |Δ| = ${maxDiff.toExponential(2)}`,
  );
  expect(errors).toEqual([]);
});

test('a reloaded page loads the SAE from IndexedDB with zero requests', async ({ hub }) => {
  const first = await pageDoc(page, 'sae_features');
  const before = requestsFor(hub);
  await page.reload();
  await waitModelReady(page);
  // the form remembers its inputs across the reload
  await page.getByTestId('tab-sae_features').click();
  await expect(page.locator('#p-sae_features-sae_source')).toHaveValue(source);
  await runOp(page, 'sae_features');
  expect(requestsFor(hub)).toBe(before);
  expect(await pageDoc(page, 'sae_features')).toEqual(first);
  // the SAE is listed with the cached models (it can be deleted there)
  await expect(page.locator(`[data-testid=cache-row][data-id="${source}/"]`)).toBeVisible();
  console.log(`[e2e] SAE after reload: ${requestsFor(hub) - before} requests to the Hub stand-in`);
});

test('the feature card: promoted/suppressed tokens and the activation heat over the prompts', async () => {
  const features = (await pageDoc(page, 'sae_features')).positions.at(-1).features;
  await page.locator(`[data-testid=sae-feature-table] tr[data-feature="${features[0].feature}"] button`).click();
  await expect(page.getByTestId('tab-feature')).toHaveAttribute('aria-selected', 'true');
  await expect(page.locator('#p-feature-sae_source')).toHaveValue(source);
  await expect(page.locator('#p-feature-feature')).toHaveValue(String(features[0].feature));
  await page.locator('#p-feature-prompts').fill('Lily was very happy\nThe big dog ran to the park');
  await runOp(page, 'feature');
  const doc = await pageDoc(page, 'feature');
  expect(doc.feature.index).toBe(features[0].feature);
  await expect(page.locator('[data-testid=feature-promoted] rect.bar')).toHaveCount(doc.logit_weights.promoted.length);
  await expect(page.locator('[data-testid=feature-suppressed] rect.bar')).toHaveCount(
    doc.logit_weights.suppressed.length,
  );
  const cells = page.locator('[data-testid=feature-activations] rect.tok-cell');
  const n = doc.activations.reduce((s: number, a: any) => s + a.values.length, 0);
  await expect(cells).toHaveCount(n);
  const shown = await cells.evaluateAll((els) => els.map((e) => Number(e.getAttribute('data-value'))));
  expect(shown).toEqual(doc.activations.flatMap((a: any) => a.values));
  await cells.nth(doc.activations[0].max_position).hover();
  await expect(page.getByTestId('chart-tooltip')).toContainText('activation');
  await cells.nth(doc.activations[0].max_position).click();
  await expect(page.getByTestId('feature-selected-token')).toContainText(String(doc.activations[0].max.toFixed(5)));
  // the heat exports as SVG with every token
  const [svg] = await Promise.all([
    page.waitForEvent('download'),
    page
      .getByTestId('feature-activations')
      .getByRole('button', { name: /as SVG/ })
      .click(),
  ]);
  expect(readFileSync((await svg.path())!, 'utf8').match(/class="tok-cell"/g)?.length).toBe(n);
  await shotOf(page, 'feature', 'feature-view');
});

test('sae_steer as a sweep: the curves, the shown value marked, base vs steered text', async () => {
  await page.getByRole('button', { name: 'Steer with it' }).click();
  await expect(page.getByTestId('tab-sae_steer')).toHaveAttribute('aria-selected', 'true');
  await page.locator('#p-sae_steer-alphas').fill('-6, 0, 6, 12');
  await page.locator('#p-sae_steer-max_new_tokens').fill('8');
  await runOp(page, 'sae_steer');
  const doc = await pageDoc(page, 'sae_steer');
  expect(doc.mode).toBe('sweep');
  const points = page.locator('[data-testid=sae-steer-chart] circle.point');
  await expect(points).toHaveCount(doc.sweep.alphas.length * 3);
  await expect(page.locator('[data-testid=sae-steer-chart] line.mark-x')).toHaveAttribute('data-x', '12');
  await expect(page.getByTestId('text-right')).toContainText(doc.sweep.generations[3].generated_text.trim());
  await expect(page.getByTestId('text-left')).toContainText(doc.base.generated_text.trim());
  await page.locator('[data-testid=sae-steer-view] button[data-alpha="-6"]').click();
  await expect(page.locator('[data-testid=sae-steer-chart] line.mark-x')).toHaveAttribute('data-x', '-6');
  await expect(page.getByTestId('text-right')).toContainText(doc.sweep.generations[0].generated_text.trim());
  // α = 0 is the base run
  expect(doc.sweep.generations[1].generated_token_ids).toEqual(doc.base.generated_token_ids);
  await page.locator('[data-testid=sae-steer-view] button[data-alpha="12"]').click();
  await shotOf(page, 'sae-steer', 'sae-steer-view');
  // one strength: base vs steered and the targets' and controls' changes
  await page.locator('#p-sae_steer-alphas').fill('');
  await page.locator('#p-sae_steer-alpha').fill('12');
  await runOp(page, 'sae_steer');
  const single = await pageDoc(page, 'sae_steer');
  expect(single.mode).toBe('single');
  expect(single.steered.generated_token_ids).toEqual(doc.sweep.generations[3].generated_token_ids);
  await expect(page.getByTestId('text-right')).toContainText(single.steered.generated_text.trim());
  await expect(page.locator('[data-testid=sae-steer-deltas] rect.bar')).toHaveCount(
    single.targets.length + single.controls.length,
  );
  await shotOf(page, 'sae-steer-single', 'sae-steer-view');
});

test('"Dashboard" on the feature card fills the dashboard form; over the card\'s prompts it reads the same activations and tokens', async () => {
  await page.getByTestId('tab-feature').click();
  const card = await pageDoc(page, 'feature');
  await page.getByTestId('open-dashboard').click();
  await expect(page.getByTestId('tab-dashboard')).toHaveAttribute('aria-selected', 'true');
  await expect(page.locator('#p-dashboard-subject')).toHaveValue('feature');
  await expect(page.locator('#p-dashboard-sae_source')).toHaveValue(source);
  await expect(page.locator('#p-dashboard-feature')).toHaveValue(String(card.feature.index));
  // the card's extra prompts as the corpus, one document each
  const prompts = card.activations.slice(1);
  await page.locator('#p-dashboard-corpus').fill(prompts.map((a: any) => a.prompt).join('\n\n'));
  await runOp(page, 'dashboard');
  const doc = await pageDoc(page, 'dashboard');
  expect(doc.subject).toMatchObject({ kind: 'feature', index: card.feature.index, hook: card.sae.hook });
  expect(doc.corpus.windows).toBe(prompts.length);
  for (const e of doc.examples) {
    const a = prompts[e.document];
    expect(e.tokens.map((t: any) => t.id)).toEqual(a.tokens.slice(1).map((t: any) => t.id));
    e.values.forEach((v: number, i: number) => expect(Math.abs(v - a.values[i + 1])).toBeLessThan(1e-5));
  }
  expect(doc.direct_path.promoted.map((t: any) => t.token_id)).toEqual(
    card.logit_weights.promoted.map((t: any) => t.token_id),
  );
  await expect(page.locator('[data-testid=dashboard-examples] rect.tok-cell')).toHaveCount(doc.corpus.tokens);
  await shotOf(page, 'dashboard-feature', 'dashboard-view');
});

test('a mismatched SAE shows SAE_MISMATCH and the page stays usable', async () => {
  await fillSae(page, 'sae_features', source, BAD_PATH);
  await page.getByTestId('run').click();
  const err = page.getByTestId('job-error');
  await expect(err).toHaveAttribute('data-code', 'SAE_MISMATCH');
  await expect(err).toContainText('32');
  await shotOf(page, 'sae-mismatch', 'job-error');
  await page.locator('#p-sae_features-sae_path').fill(SAE_PATH);
  await runOp(page, 'sae_features');
  await expect(page.getByTestId('job-error')).toHaveCount(0);
  expect(errors).toEqual([]);
});

test('a shared sae_features link downloads its SAE only after a click, then re-runs to the same numbers', async ({
  browser,
  site,
}) => {
  await page.getByTestId('copy-link').click();
  const url = await page.getByTestId('share-url').inputValue();
  expect(url.startsWith(`${site.url}#s=`)).toBe(true);
  const fresh = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  try {
    const p2 = await fresh.newPage();
    const errs = watchErrors(p2);
    await p2.goto(url);
    await expect(p2.locator('[data-testid=result][data-op=sae_features][data-from-link=true]')).toBeVisible();
    await expect(p2.getByTestId('shared-banner')).toHaveAttribute('data-status', 'waiting-sae', { timeout: 60_000 });
    await p2.getByTestId('load-shared-sae').click();
    await expect(p2.getByTestId('shared-banner')).toHaveAttribute('data-status', 'matched', { timeout: 60_000 });
    await expect(p2.locator('#p-sae_features-sae_source')).toHaveValue(source);
    expect(errs).toEqual([]);
  } finally {
    await fresh.close();
  }
});
