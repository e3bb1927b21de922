/**
 * The page attached to `loupe serve` on 127.0.0.1 (a random port, started here as the CLI): the
 * model loads there, a trace equals the CLI's within 1e-5, a job cancels mid-run, detach returns
 * to the in-page engine without a reload, and an engine killed mid-job leaves the page saying so,
 * on its own engine, with its inputs and results. A wrong token is refused.
 */
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { Browser, Page } from '@playwright/test';
import {
  test,
  expect,
  openReady,
  runOp,
  pageDoc,
  compareDocs,
  shotWidthsThemes,
  waitModelReady,
  PROMPT,
} from './fixtures';

interface Served {
  proc: ChildProcess;
  url: string;
  token: string;
  pairing: string;
}

let page: Page;
let origin: string;
const configDir = mkdtempSync(path.join(tmpdir(), 'loupe-serve-cfg-'));

/** `loupe serve --port 0 --origin <the page's>`, resolved once it prints its pairing line */
function startServe(): Promise<Served> {
  const proc = spawn(process.execPath, ['bin/loupe.mjs', 'serve', '--port', '0', '--origin', origin], {
    env: { ...process.env, LOUPE_CONFIG_DIR: configDir },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  proc.stderr!.on('data', (d) => process.stderr.write(`[serve] ${d}`));
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`loupe serve printed no pairing line: ${out}`)), 30_000);
    proc.stdout!.on('data', (d) => {
      out += d;
      const m = /pairing: (ws:\/\/\S+)#token=([0-9a-f]{64})/.exec(out);
      if (m) {
        clearTimeout(t);
        resolve({ proc, url: m[1], token: m[2], pairing: `${m[1]}#token=${m[2]}` });
      }
    });
    proc.once('exit', (code) => reject(new Error(`loupe serve exited (${code}): ${out}`)));
  });
}

function stop(s: Served | undefined): void {
  if (s && s.proc.exitCode === null) s.proc.kill('SIGINT');
}

async function attach(s: Served): Promise<void> {
  const panel = page.getByTestId('engine');
  if (!(await page.getByTestId('engine-url-input').isVisible())) await panel.locator('summary').click();
  await page.getByTestId('engine-url-input').fill(s.pairing);
  await page.getByTestId('attach-engine').click();
  await expect(page.getByTestId('engine-url')).toHaveText(s.url);
  await page.waitForFunction(
    () =>
      (globalThis as any).__loupe.model?.info.backend === 'node' && (globalThis as any).__loupe.modelStatus === 'ready',
    null,
    { timeout: 60_000 },
  );
}

test.beforeAll(async ({ browser, site }: { browser: Browser; site: { url: string } }) => {
  origin = new URL(site.url).origin;
  page = await (await browser.newContext()).newPage();
  await openReady(page, site.url);
});

test.afterAll(async () => {
  await page?.close();
  rmSync(configDir, { recursive: true, force: true });
});

test('attached to loupe serve: the model loads there, a trace equals the CLI within 1e-5, detach returns', async () => {
  const s = await startServe();
  try {
    await page.getByTestId('prompt').fill(PROMPT);
    await page.getByTestId('tab-trace').click();
    await page.locator('#p-trace-top_k').fill('40');
    await runOp(page, 'trace');
    const inPage = await pageDoc(page, 'trace');
    expect(inPage.model.backend).not.toBe('node');

    await attach(s);
    const doctor = await page.evaluate(() => (globalThis as any).__loupe.client.call((api: any) => api.doctor()));
    expect(doctor.userAgent).toContain('Loupe engine');
    expect(doctor.backend).toBe('node');
    await runOp(page, 'trace');
    const served = await pageDoc(page, 'trace');
    expect(served.model.backend).toBe('node');
    const cli = JSON.parse(
      execFileSync(process.execPath, ['bin/loupe.mjs', 'trace', 'default', PROMPT, '--json', '--top-k', '40'], {
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'ignore'],
      }),
    );
    const { bad, max } = compareDocs(served, cli, 1e-5);
    console.log(`[e2e] served trace vs CLI: max |Δ| = ${max.toExponential(2)}`);
    expect(bad).toEqual([]);
    await page.getByTestId('engine').scrollIntoViewIfNeeded();
    await shotWidthsThemes(page, 'engine-attached');
    await page.getByRole('button', { name: /light/i }).click();

    // back to the in-page engine, without a reload: the result stays, the model loads here again
    const marker = await page.evaluate(() => ((globalThis as any).__marker = Math.random()));
    await page.getByTestId('detach-engine').click();
    await expect(page.getByTestId('engine-url')).toHaveCount(0);
    await page.waitForFunction(
      () =>
        (globalThis as any).__loupe.model?.info.backend !== 'node' &&
        (globalThis as any).__loupe.modelStatus === 'ready',
    );
    expect(await page.evaluate(() => (globalThis as any).__marker)).toBe(marker);
    await expect(page.locator('[data-testid=result][data-op=trace]')).toBeVisible();
  } finally {
    stop(s);
  }
});

test('a job on the served engine cancels mid-run, and the engine stays attached', async () => {
  const s = await startServe();
  try {
    await attach(s);
    await page.getByTestId('tab-generate').click();
    await page.getByTestId('prompt').fill('Once upon a time');
    await page.locator('#p-generate-max_new_tokens').fill('480');
    await page.locator('#p-generate-stop_at_eos').uncheck();
    await page.getByTestId('run').click();
    await expect(page.getByTestId('job')).toBeVisible();
    await page.waitForTimeout(200);
    const t0 = Date.now();
    await page.getByTestId('cancel-job').click();
    await page.waitForFunction(
      () =>
        !document.querySelector('[data-testid=job]') &&
        /cancelled/.test(document.querySelector('[data-testid=job-error]')?.textContent ?? ''),
      null,
      { polling: 'raf', timeout: 1000 },
    );
    console.log(`[e2e] served: UI free ${Date.now() - t0} ms after Cancel`);
    await page.locator('#p-generate-max_new_tokens').fill('8');
    await runOp(page, 'generate');
    expect((await pageDoc(page, 'generate')).model.backend).toBe('node');
    await expect(page.getByTestId('engine-url')).toHaveText(s.url);
    await page.getByTestId('detach-engine').click();
    await waitModelReady(page);
  } finally {
    stop(s);
  }
});

test('the engine killed mid-job: the page says so, falls back to its own engine and keeps its state', async () => {
  const s = await startServe();
  try {
    await attach(s);
    await page.getByTestId('tab-trace').click();
    await page.getByTestId('prompt').fill(PROMPT);
    await runOp(page, 'trace');
    await page.getByTestId('tab-generate').click();
    await page.locator('#p-generate-max_new_tokens').fill('480');
    await page.locator('#p-generate-stop_at_eos').uncheck();
    await page.getByTestId('run').click();
    await expect(page.getByTestId('job')).toBeVisible();
    s.proc.kill('SIGKILL');
    await expect(page.getByTestId('job-error')).toContainText(/went away/i);
    await expect(
      page.locator('[data-testid=notice][data-kind=warn]').filter({ hasText: /back on its own engine/ }),
    ).toHaveCount(1);
    await expect(page.getByTestId('engine-url')).toHaveCount(0);
    await expect(page.getByTestId('prompt')).toHaveValue(PROMPT);
    await expect(page.locator('#p-generate-max_new_tokens')).toHaveValue('480');
    await page.getByTestId('tab-trace').click();
    await expect(page.locator('[data-testid=result][data-op=trace]')).toBeVisible();
    await page.waitForFunction(
      () =>
        (globalThis as any).__loupe.model?.info.backend !== 'node' &&
        (globalThis as any).__loupe.modelStatus === 'ready',
    );
    await runOp(page, 'trace');
  } finally {
    stop(s);
  }
});

test('a wrong token is refused and the page stays on its own engine', async () => {
  const s = await startServe();
  try {
    if (!(await page.getByTestId('engine-url-input').isVisible()))
      await page.getByTestId('engine').locator('summary').click();
    await page.getByTestId('engine-url-input').fill(`${s.url}#token=${'0'.repeat(64)}`);
    await page.getByTestId('attach-engine').click();
    await expect(page.getByTestId('attach-error')).toHaveAttribute('data-code', 'ENGINE_UNREACHABLE');
    await expect(page.getByTestId('engine-url')).toHaveCount(0);
    await shotWidthsThemes(page, 'engine-attach-form');
    await page.getByRole('button', { name: /light/i }).click();
    expect(await page.evaluate(() => (globalThis as any).__loupe.modelStatus)).toBe('ready');
  } finally {
    stop(s);
  }
});

test('a page served by loupe serve, its engine killed: it falls back to its own WASM with the server gone', async ({
  browser,
}: {
  browser: Browser;
}) => {
  const s = await startServe();
  const served = await (await browser.newContext()).newPage();
  try {
    const at = s.url.replace(/^ws:/, 'http:').replace(/\/engine$/, '/');
    await openReady(served, at);
    await served.getByTestId('prompt').fill(PROMPT);
    await runOp(served, 'trace');
    const inPage = await pageDoc(served, 'trace');
    if (!(await served.getByTestId('engine-url-input').isVisible()))
      await served.getByTestId('engine').locator('summary').click();
    await served.getByTestId('engine-url-input').fill(s.pairing);
    await served.getByTestId('attach-engine').click();
    await served.waitForFunction(
      () =>
        (globalThis as any).__loupe.model?.info.backend === 'node' &&
        (globalThis as any).__loupe.modelStatus === 'ready',
      null,
      { timeout: 60_000 },
    );
    s.proc.kill('SIGKILL');
    // other warnings may stand beside it (a cache listing cut off by the engine's exit): find this one
    await expect(
      served.locator('[data-testid=notice][data-kind=warn]').filter({ hasText: /back on its own engine/ }),
    ).toHaveCount(1);
    await served
      .waitForFunction(
        () =>
          (globalThis as any).__loupe.model?.info.backend !== 'node' &&
          (globalThis as any).__loupe.modelStatus === 'ready',
        null,
        { timeout: 30_000 },
      )
      .catch(async (e) => {
        const why = await served.evaluate(() => JSON.stringify((globalThis as any).__loupe.models.error));
        throw new Error(`the page did not load its model on its own engine: ${why}`, { cause: e });
      });
    await runOp(served, 'trace');
    const after = await pageDoc(served, 'trace');
    const { bad } = compareDocs(after, inPage, 1e-6);
    expect(bad).toEqual([]);
  } finally {
    stop(s);
    await served.close();
  }
});

test("two pages on one served engine: B's load tells A at once, A's panel stops naming its model", async ({
  browser,
}: {
  browser: Browser;
}) => {
  const s = await startServe();
  const b = await (await browser.newContext()).newPage();
  try {
    await attach(s);
    await openReady(b, page.url());
    await b.getByTestId('engine').locator('summary').click();
    await b.getByTestId('engine-url-input').fill(s.pairing);
    await b.getByTestId('attach-engine').click();
    await b.waitForFunction(
      () =>
        (globalThis as any).__loupe.model?.info.backend === 'node' &&
        (globalThis as any).__loupe.modelStatus === 'ready',
      null,
      { timeout: 60_000 },
    );
    await expect(
      page.locator('[data-testid=notice][data-kind=warn]').filter({ hasText: /Another page loaded stories260K/ }),
    ).toHaveCount(1);
    expect(await page.evaluate(() => (globalThis as any).__loupe.model)).toBeNull();
    await page.getByTestId('detach-engine').click();
    await waitModelReady(page);
  } finally {
    stop(s);
    await b.close();
  }
});
