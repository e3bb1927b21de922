/**
 * WebGPU in headless Chromium (SwiftShader, a software adapter): stories260K and induction-gpt2
 * run on the `webgpu` backend and agree with WASM within 1e-4 on logits and every hook (the
 * Doctor's agreement check), and a trace on WebGPU equals the CLI's. If this Chromium offers no
 * adapter the tests say so loudly and are skipped, never passed (LOUPE_REQUIRE_WEBGPU=1 fails them).
 */
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import type { Page } from '@playwright/test';
import { test, expect, openReady, waitModelReady, runOp, shot, SHARED_MODELS, PROMPT } from './fixtures';

test.describe.configure({ mode: 'serial' });

async function requireWebGpu(page: Page): Promise<void> {
  const adapter = await page.evaluate(async () => {
    const gpu = (navigator as any).gpu;
    if (!gpu) return 'navigator.gpu is missing';
    const a = await gpu.requestAdapter();
    return a ? null : 'requestAdapter() returned null';
  });
  if (adapter) {
    const msg = `WEBGPU UNAVAILABLE in this Chromium (${adapter}): the WebGPU checks did NOT run.`;
    console.error(`\n${'!'.repeat(msg.length)}\n${msg}\n${'!'.repeat(msg.length)}\n`);
    if (process.env.LOUPE_REQUIRE_WEBGPU === '1') throw new Error(msg);
    test.skip(true, msg);
  }
}

async function agreement(page: Page, label: string): Promise<void> {
  if (!(await page.getByTestId('doctor').isVisible())) await page.getByRole('button', { name: 'Doctor' }).click();
  await expect(page.getByTestId('doc-webgpu')).toHaveText('available');
  await page.getByTestId('run-agreement').click();
  const res = page.getByTestId('agreement');
  const err = page.getByTestId('agreement-error');
  await expect(res.or(err)).toBeVisible({ timeout: 150_000 });
  if (await err.isVisible()) throw new Error(`${label}: the agreement check failed in the page: ${(await err.textContent())?.trim()}`);
  const [pass, logit, hook, prob, top1] = await Promise.all(['data-pass', 'data-max-logit', 'data-max-hook', 'data-max-prob', 'data-top1'].map((a) => res.getAttribute(a)));
  console.log(`[e2e] ${label}: webgpu vs wasm max |Δ| logits ${Number(logit).toExponential(2)}, hooks ${Number(hook).toExponential(2)}, probs ${Number(prob).toExponential(2)}, top-1 ${top1 === 'true' ? 'same' : 'DIFFERENT'}`);
  expect(Number(logit)).toBeLessThanOrEqual(1e-4);
  expect(Number(hook)).toBeLessThanOrEqual(1e-4);
  expect(top1).toBe('true');
  expect(pass).toBe('true');
}

test('stories260K on WebGPU: a trace equals the CLI and every hook agrees with WASM', async ({ page, site }) => {
  test.setTimeout(300_000);
  await openReady(page, site.url);
  await requireWebGpu(page);
  await page.locator('#backend').selectOption('webgpu');
  await page.waitForFunction(() => (globalThis as any).__loupe.model?.info.backend === 'webgpu' && (globalThis as any).__loupe.modelStatus === 'ready', null, { timeout: 120_000 });
  await expect(page.getByTestId('status-backend')).toContainText('webgpu');
  await page.getByTestId('prompt').fill(PROMPT);
  await page.getByTestId('tab-trace').click();
  await page.locator('#p-trace-top_k').fill('40');
  const ms = await runOp(page, 'trace', { timeout: 120_000 });
  const doc = await page.evaluate(() => (globalThis as any).__loupe.results.trace.doc);
  expect(doc.model.backend).toBe('webgpu');
  const cli = JSON.parse(execFileSync(process.execPath, ['bin/loupe.mjs', 'trace', 'default', PROMPT, '--json', '--top-k', '40'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }));
  let d = 0;
  doc.head_attribution.forEach((row: number[], l: number) => row.forEach((v, h) => (d = Math.max(d, Math.abs(v - cli.head_attribution[l][h])))));
  console.log(`[e2e] trace on webgpu ${ms} ms; vs CLI (node) max |Δ| head attribution ${d.toExponential(2)}`);
  expect(d).toBeLessThan(1e-4);
  await agreement(page, 'stories260K');
  await shot(page, 'doctor-webgpu');
});

test('induction-gpt2 on WebGPU agrees with WASM on logits and every hook', async ({ page, site, hub }) => {
  test.setTimeout(300_000);
  const repo = 'loupe-test/induction-gpt2-webgpu';
  hub.addRepo(repo, join(SHARED_MODELS, 'induction-gpt2'));
  await openReady(page, site.url);
  await requireWebGpu(page);
  await page.getByRole('tab', { name: 'Hub' }).click();
  await page.getByRole('button', { name: /show endpoint/i }).click();
  await page.getByTestId('hub-endpoint').fill(hub.url);
  await page.getByTestId('hub-id').fill(repo);
  await page.locator('#backend').selectOption('webgpu');
  await waitModelReady(page);
  await page.getByTestId('load-hub').click();
  await page.waitForFunction((id) => (globalThis as any).__loupe.model?.info.id === id && (globalThis as any).__loupe.modelStatus === 'ready', repo, { timeout: 120_000 });
  await expect(page.getByTestId('status-backend')).toContainText('webgpu');
  await page.getByTestId('prompt').fill('xq7#kLm2xq7#kLm2xq7#');
  await agreement(page, 'induction-gpt2');
});
