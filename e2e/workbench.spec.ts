/**
 * The workbench on the bundled model: trace equals the CLI, every view draws (screenshots), the
 * α-sweep chart carries the document's numbers, jobs cancel at once, a crashed worker is replaced
 * with the page's state intact, and a shared link re-runs to the same result in a fresh browser.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import type { Browser, BrowserContext, Page } from '@playwright/test';
import { test, expect, openReady, runOp, shot, pageDoc, watchErrors, PROMPT } from './fixtures';
import { operations } from '../src/ops/index';
import { loadModelNode } from '../src/node/load';

test.describe.configure({ mode: 'serial' });

let context: BrowserContext;
let page: Page;
let errors: string[];

test.beforeAll(async ({ browser }: { browser: Browser }) => {
  context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  errors = watchErrors(page);
});
test.afterAll(async () => {
  await context.close();
});

test('opens on the bundled model with no download and traces it exactly as the CLI does', async ({ site }) => {
  const requests: string[] = [];
  page.on('request', (r) => requests.push(r.url()));
  const t0 = Date.now();
  await openReady(page, site.url);
  console.log(`[e2e] page ready with stories260K in ${Date.now() - t0} ms`);
  // everything came from our own origin: the page, the ORT runtime and the bundled model
  const foreign = requests.filter((u) => !u.startsWith(site.url) && !u.startsWith('data:') && !u.startsWith('blob:'));
  expect(foreign).toEqual([]);
  expect(requests.some((u) => u.includes('/models/stories260K/model.safetensors'))).toBe(true);
  expect(requests.some((u) => /\/ort\/ort-wasm-simd-threaded\.(jsep|asyncify)\.wasm$/.test(u))).toBe(true);
  expect(await page.evaluate(() => crossOriginIsolated)).toBe(true);
  await expect(page.getByTestId('status-model')).toContainText('stories260K');
  await expect(page.getByTestId('status-backend')).toContainText('wasm');
  // the runtime build (native EP / JSEP) is a WebGPU matter: on WASM it is named only when it is a fallback
  await expect(page.getByTestId('status-backend')).not.toContainText('EP');

  await page.getByTestId('prompt').fill(PROMPT);
  await page.getByTestId('tab-trace').click();
  await page.locator('#p-trace-top_k').fill('40');
  const ms = await runOp(page, 'trace');
  console.log(`[e2e] trace in the page: ${ms} ms`);
  // a fresh result is scrolled to the top of the pane (the form above pushes it down)
  const resultTop = () =>
    page.getByTestId('result').evaluate((el) => {
      const pane = el.closest('main')!;
      return pane.scrollTop > 0 ? Math.abs(el.getBoundingClientRect().top - pane.getBoundingClientRect().top) : -1;
    });
  await expect.poll(resultTop).toBeGreaterThanOrEqual(0);
  expect(await resultTop()).toBeLessThan(30);

  const info = await page.evaluate(() => (globalThis as any).__loupe.model.info);
  const cells = page.locator('[data-testid=trace-heatmap] rect.cell');
  await expect(cells).toHaveCount(info.n_layers * info.n_heads);
  const shown = await cells.evaluateAll((els) =>
    els.map((e) => [
      Number(e.getAttribute('data-row')),
      Number(e.getAttribute('data-col')),
      Number(e.getAttribute('data-value')),
    ]),
  );

  const cli = JSON.parse(
    execFileSync(process.execPath, ['bin/loupe.mjs', 'trace', 'default', PROMPT, '--json', '--top-k', '40'], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }),
  );
  expect(cli.model.backend).toBe('node');
  let maxDiff = 0;
  for (const [r, c, v] of shown) maxDiff = Math.max(maxDiff, Math.abs(v - cli.head_attribution[r][c]));
  console.log(`[e2e] heatmap vs CLI --json: ${shown.length} cells, max |Δ| = ${maxDiff.toExponential(2)}`);
  expect(maxDiff).toBeLessThan(1e-4);
  // the tables and headline show the same numbers (as printed, 5 decimals)
  await expect(page.getByTestId('predicted-token')).toHaveText(cli.predicted_token.replace(/ /g, '␣'));
  const topHeads = await page
    .locator('[data-testid=top-heads] td[data-value]')
    .evaluateAll((els) => els.map((e) => Number(e.getAttribute('data-value'))));
  expect(topHeads.length).toBe(cli.top_heads.length);
  topHeads.forEach((v, i) => expect(Math.abs(v - cli.top_heads[i].logit_attribution)).toBeLessThan(1e-4));
  const doc = await pageDoc(page, 'trace');
  expect(Math.abs(doc.decomposition.sum - cli.decomposition.sum)).toBeLessThan(1e-4);
  // hover shows the numbers; click selects
  await cells.nth(3).hover();
  await expect(page.getByTestId('chart-tooltip')).toContainText('L0H3');
  await cells.nth(3).click();
  await expect(page.getByTestId('selected-head')).toContainText('L0H3');
  await shot(page, 'trace');
  // exports: the heatmap as PNG and SVG, the document as JSON
  const heat = page.getByTestId('trace-heatmap');
  const [png] = await Promise.all([
    page.waitForEvent('download'),
    heat.getByRole('button', { name: /as PNG/ }).click(),
  ]);
  const pngBytes = readFileSync((await png.path())!);
  expect(png.suggestedFilename()).toBe('trace-heads.png');
  expect([...pngBytes.subarray(1, 4)].map((b) => String.fromCharCode(b)).join('')).toBe('PNG');
  const [svg] = await Promise.all([
    page.waitForEvent('download'),
    heat.getByRole('button', { name: /as SVG/ }).click(),
  ]);
  const svgText = readFileSync((await svg.path())!, 'utf8');
  expect(svgText.match(/class="cell"/g)?.length).toBe(info.n_layers * info.n_heads);
  const [json] = await Promise.all([page.waitForEvent('download'), page.getByTestId('export-json').click()]);
  expect(JSON.parse(readFileSync((await json.path())!, 'utf8')).head_attribution).toEqual(doc.head_attribution);
  await page.getByTestId('trace-waterfall').scrollIntoViewIfNeeded();
  await shot(page, 'trace-waterfall');
});

test('every view draws its document', async () => {
  test.setTimeout(420_000);
  const timings: Record<string, number> = {};
  const check: Record<string, string> = {
    activations: '[data-testid=activations-chart] circle.point',
    attention: '[data-testid=attention-pattern] rect.cell',
    logit_lens: '[data-testid=logit-lens-heatmap] rect.cell',
    ablate: '[data-testid=ablate-bars] rect.bar',
    circuit: '[data-testid=circuit-singles] rect.bar',
    layer_ablation: '[data-testid=layer-ablation-bars] rect.bar',
    patch: '[data-testid=patch-heads] rect.cell',
    steer: '[data-testid=side-by-side]',
    causality: '[data-testid=causality-hist] line.hist-marker',
    capture: '[data-testid=capture-handle]',
    probe: '[data-testid=probe-roc] path.roc-curve',
    generate: '[data-testid=generated-text]',
  };
  const withExample = new Set(['ablate', 'circuit', 'patch', 'steer', 'causality', 'capture', 'generate']);
  for (const op of Object.keys(check)) {
    if (op !== 'capture' && op !== 'probe') await page.getByTestId('prompt').fill(PROMPT);
    timings[op] = await runOp(page, op, { example: withExample.has(op) });
    await expect(page.locator(check[op]).first()).toBeAttached();
    await expect(page.locator(`[data-testid=result][data-op=${op}]`)).toBeVisible();
    await expect(page.getByTestId('view-error')).toHaveCount(0);
    await shot(page, op);
  }
  // spot checks of what the views say against their documents
  await page.getByTestId('tab-logit_lens').click();
  const lens = await pageDoc(page, 'logit_lens');
  await expect(page.locator('[data-testid=logit-lens-heatmap] rect.cell')).toHaveCount(
    lens.layers.length * lens.positions.length,
  );
  await page.getByTestId('tab-probe').click();
  const probe = await pageDoc(page, 'probe');
  await expect(page.getByTestId('auroc')).toHaveText(probe.auroc.toFixed(3));
  await page.getByTestId('tab-causality').click();
  const causality = await pageDoc(page, 'causality');
  await expect(page.getByTestId('verdict')).toHaveAttribute('data-verdict', causality.verdict);
  await expect(page.locator('[data-testid=causality-hist] rect.hist-bin')).not.toHaveCount(0);
  console.log('[e2e] view timings (ms):', JSON.stringify(timings));
  // attention small multiples: one per head of the layer
  await page.getByTestId('tab-attention').click();
  const info = await page.evaluate(() => (globalThis as any).__loupe.model.info);
  await expect(page.locator('[data-testid=attention-multiples] g.multiple')).toHaveCount(info.n_heads);
  await page.getByTestId('attention-multiples').scrollIntoViewIfNeeded();
  await shot(page, 'attention-multiples');
});

test('α-sweep: the chart plots the document, which matches the same sweep in Node', async () => {
  await page.getByTestId('prompt').fill(PROMPT);
  const ms = await runOp(page, 'sweep', { example: true });
  const doc = await pageDoc(page, 'sweep');
  const input = await page.evaluate(() => (globalThis as any).__loupe.results.sweep.input);
  const points = await page.locator('[data-testid=sweep-chart] circle.point').evaluateAll((els) =>
    els.map((e) => ({
      s: e.getAttribute('data-series'),
      x: Number(e.getAttribute('data-x')),
      y: Number(e.getAttribute('data-y')),
    })),
  );
  const series: Record<string, string> = {
    'target Δ log-prob': 'target_logprob_delta',
    'control Δ log-prob': 'control_logprob_delta',
    'normalised effect': 'normalized_effect',
  };
  expect(points.length).toBe(doc.alphas.length * 3);
  for (const p of points) {
    const i = doc.alphas.indexOf(p.x);
    expect(i).toBeGreaterThanOrEqual(0);
    expect(p.y).toBe(doc.curves[series[p.s!]][i]);
  }
  // the shown α is marked; clicking another point moves the mark and the steered text
  const maxAlpha = doc.alphas.reduce((m: number, a: number) => (Math.abs(a) > Math.abs(m) ? a : m));
  await expect(page.locator('[data-testid=sweep-chart] line.mark-x')).toHaveAttribute('data-x', String(maxAlpha));
  const other = doc.generations.find((g: any) => g.alpha !== maxAlpha && g.alpha !== 0);
  await page.locator(`[data-testid=sweep-view] button[data-alpha="${other.alpha}"]`).click();
  await expect(page.locator('[data-testid=sweep-chart] line.mark-x')).toHaveAttribute('data-x', String(other.alpha));
  await expect(page.getByTestId('text-right')).toContainText(other.generated_text.trim());
  await shot(page, 'sweep');

  // the same input through the operation registry in Node (onnxruntime-node)
  const model = await loadModelNode('default');
  try {
    const ref: any = await operations.sweep.run(model, input, {});
    expect(ref.alphas.length).toBe(doc.alphas.length);
    let maxDiff = 0;
    for (const k of ['target_logprob_delta', 'control_logprob_delta', 'normalized_effect', 'kl_from_base']) {
      doc.curves[k].forEach((v: number, i: number) => (maxDiff = Math.max(maxDiff, Math.abs(v - ref.curves[k][i]))));
    }
    doc.alphas.forEach((a: number, i: number) => expect(Math.abs(a - ref.alphas[i])).toBeLessThan(1e-4));
    console.log(
      `[e2e] sweep in the page ${ms} ms; page (wasm) vs Node: max |Δ| over curves = ${maxDiff.toExponential(2)}`,
    );
    expect(maxDiff).toBeLessThan(1e-4);
    expect(doc.generations.map((g: any) => g.generated_token_ids)).toEqual(
      ref.generations.map((g: any) => g.generated_token_ids),
    );
  } finally {
    await model.dispose();
  }
});

test('cancelling a long job frees the UI within a second', async () => {
  await page.getByTestId('tab-generate').click();
  await page.getByTestId('prompt').fill('Once upon a time');
  await page.locator('#p-generate-max_new_tokens').fill('480');
  await page.locator('#p-generate-stop_at_eos').uncheck();
  await page.getByTestId('run').click();
  await expect(page.getByTestId('job')).toBeVisible();
  await page.waitForTimeout(300);
  await expect(page.getByTestId('job')).toBeVisible(); // still running: the job really is long
  const t0 = Date.now();
  await page.getByTestId('cancel-job').click();
  // polled every animation frame, so the time measured is the page's, not the poller's
  await page.waitForFunction(
    () =>
      !document.querySelector('[data-testid=job]') &&
      /cancelled/.test(document.querySelector('[data-testid=job-error]')?.textContent ?? '') &&
      !(document.querySelector('[data-testid=run]') as HTMLButtonElement).disabled,
    null,
    { polling: 'raf', timeout: 1000 },
  );
  console.log(`[e2e] UI free ${Date.now() - t0} ms after Cancel`);
  // the worker is usable again right away (it stopped the job, or was replaced)
  await page.locator('#p-generate-max_new_tokens').fill('8');
  await runOp(page, 'generate');
  const restarts = await page.evaluate(() => (globalThis as any).__loupe.workerRestarts);
  console.log(`[e2e] after cancel the worker was ${restarts ? 'restarted' : 'still the same (it honoured the abort)'}`);
});

test('a crashed worker is replaced and the page keeps its inputs and results', async () => {
  const before = await page.evaluate(() => (globalThis as any).__loupe.workerRestarts);
  await page.getByTestId('tab-trace').click();
  const prompt = await page.getByTestId('prompt').inputValue();
  // an uncaught error in the worker reaches the page as the Worker's 'error' event
  await page.evaluate(() =>
    (globalThis as any).__loupe.client.worker.dispatchEvent(
      new ErrorEvent('error', { message: 'simulated worker crash' }),
    ),
  );
  await expect(page.getByTestId('worker-restarts')).toContainText(`×${before + 1}`);
  await expect(page.locator('[data-testid=notice][data-kind=warn]').filter({ hasText: 'crashed' })).toHaveCount(1);
  await expect(page.getByTestId('prompt')).toHaveValue(prompt);
  await expect(page.locator('[data-testid=result][data-op=trace]')).toBeVisible();
  await page.waitForFunction(() => (globalThis as any).__loupe.modelStatus === 'ready');
  await runOp(page, 'trace');
  expect(errors.filter((e) => !e.includes('simulated worker crash'))).toEqual([]);
});

test('a shared link shows the result at once and re-runs it to the same numbers in a fresh browser', async ({
  browser,
  site,
}) => {
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'trace');
  await page.getByTestId('copy-link').click();
  const url = await page.getByTestId('share-url').inputValue();
  expect(url.startsWith(`${site.url}#s=`)).toBe(true);
  expect(url.length).toBeLessThan(24_500);
  const original = await pageDoc(page, 'trace');

  const fresh = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  try {
    const p2 = await fresh.newPage();
    const errs = watchErrors(p2);
    await p2.goto(url);
    // the embedded result is on screen before the model has finished loading
    await expect(p2.locator('[data-testid=result][data-op=trace][data-from-link=true]')).toBeVisible();
    const statusWhenShown = await p2.evaluate(() => (globalThis as any).__loupe.modelStatus);
    console.log(`[e2e] shared result visible while the model status was "${statusWhenShown}"`);
    await expect(p2.getByTestId('shared-banner')).toHaveAttribute('data-status', 'matched', { timeout: 90_000 });
    await expect(p2.getByTestId('share-verdict')).toContainText('matched');
    const rerun = await pageDoc(p2, 'trace');
    expect(rerun.head_attribution).toEqual(
      original.head_attribution.map((r: number[]) => r.map((v) => expect.closeTo(v, 4))),
    );
    await expect(p2.locator('[data-testid=trace-heatmap] rect.cell')).toHaveCount(
      original.model.n_layers * original.model.n_heads,
    );
    await shot(p2, 'shared-link');
    expect(errs).toEqual([]);
  } finally {
    await fresh.close();
  }
});

test('the Doctor reports isolation, threads and the WebGPU adapter', async () => {
  await page.getByRole('button', { name: 'Doctor' }).click();
  await expect(page.getByTestId('doc-isolated')).toHaveText('yes');
  await expect(page.getByTestId('doc-backend')).toHaveText('wasm');
  const gpu = (await page.getByTestId('doc-webgpu').textContent())?.trim();
  console.log(`[e2e] Doctor: WebGPU ${gpu}`);
  await shot(page, 'doctor');
  await page.getByRole('button', { name: 'Close the doctor' }).click();
});

test('the Doctor measures what q8 costs, as the CLI does', async () => {
  await page.getByRole('button', { name: 'Doctor' }).click();
  const prompt = await page.getByTestId('prompt').inputValue();
  await page.getByTestId('run-q8-cost').click();
  const table = page.getByTestId('q8-cost');
  await expect(table).toBeVisible({ timeout: 120_000 });
  const got = {
    logit: Number(await table.getAttribute('data-max-logit')),
    dla: Number(await table.getAttribute('data-max-dla')),
  };
  // the same comparison in Node on onnxruntime-web's WASM (src/ops/lib/precision-cost.ts)
  const { precisionCost } = await import('../src/ops/lib/precision-cost');
  const [base, cand] = [
    await loadModelNode('default', { backend: 'wasm', weights: 'stored' }),
    await loadModelNode('default', { backend: 'wasm', weights: 'q8' }),
  ];
  try {
    const want = await precisionCost(base, cand, prompt);
    console.log(
      `[e2e] q8 cost in the page: logits ${got.logit}, DLA ${got.dla}; in Node: ${want.max_abs_logit_diff}, ${want.max_abs_dla_diff}`,
    );
    expect(want.max_abs_logit_diff).toBeGreaterThan(0);
    expect(got.logit).toBeCloseTo(want.max_abs_logit_diff, 3);
    expect(got.dla).toBeCloseTo(want.max_abs_dla_diff, 3);
  } finally {
    await base.dispose();
    await cand.dispose();
  }
  await shot(page, 'doctor-q8-cost');
  await page.getByRole('button', { name: 'Close the doctor' }).click();
});

test('dark theme and the keyboard', async () => {
  await page.getByRole('button', { name: /dark theme/i }).click();
  await expect(page.locator('html')).toHaveAttribute('data-theme', 'dark');
  await page.getByTestId('tab-trace').focus();
  await page.keyboard.press('ArrowRight');
  await expect(page.getByTestId('tab-activations')).toBeFocused();
  await page.keyboard.press('ArrowLeft');
  await page.getByTestId('prompt').focus();
  await page.keyboard.press('Control+Enter');
  await expect(page.getByTestId('job')).toHaveCount(0, { timeout: 60_000 });
  await expect(page.locator('[data-testid=trace-heatmap] rect.cell').first()).toBeVisible();
  await shot(page, 'trace-dark');
  await page.getByRole('button', { name: /light theme/i }).click();
});
