/**
 * The build as a free static host serves it (issue 23): `npm run build`'s dist/ behind a server that sends no
 * isolation headers (src/node/preview.ts), under a sub-path and at /. The bundled model becomes ready, a trace draws
 * its heatmap, no page error and no failed request for the page's own files.
 */
import type { Browser, Page } from '@playwright/test';
import { test, expect, waitModelReady, runOp, watchErrors, PROMPT } from './fixtures';
import { servePlain } from '../src/node/preview';
import type { StaticServer } from '../src/node/static-server';

/**
 * Failed responses (status ≥ 400) and failed requests for URLs under `origin`; not ERR_ABORTED, which is the page's
 * own cancel (the engine stops a body once it holds the bytes of the range it asked for).
 */
function watchOwnFailures(page: Page, origin: string): string[] {
  const bad: string[] = [];
  page.on('response', (r) => {
    if (r.url().startsWith(origin) && r.status() >= 400) bad.push(`${r.status()} ${r.url()}`);
  });
  page.on('requestfailed', (r) => {
    if (r.url().startsWith(origin) && r.failure()?.errorText !== 'net::ERR_ABORTED')
      bad.push(`failed ${r.url()}: ${r.failure()?.errorText}`);
  });
  return bad;
}

async function traceHeatmap(page: Page): Promise<void> {
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'trace');
  const info = await page.evaluate(() => (globalThis as any).__loupe.model.info);
  await expect(page.locator('[data-testid=trace-heatmap] rect.cell')).toHaveCount(info.n_layers * info.n_heads);
}

for (const base of ['/sub/path/', '/']) {
  test(`served with no isolation headers at ${base}: bundled model ready, trace heatmap, no errors or 404s`, async ({
    browser,
  }: {
    browser: Browser;
  }) => {
    const site: StaticServer = await servePlain(0, base);
    const context = await browser.newContext();
    try {
      const page = await context.newPage();
      const errors = watchErrors(page);
      const origin = new URL(site.url).origin;
      const failures = watchOwnFailures(page, origin);
      const requests: string[] = [];
      page.on('request', (r) => requests.push(r.url()));
      await page.goto(site.url);
      await waitModelReady(page);
      await traceHeatmap(page);
      // the page's own files all came from under its path
      const own = requests.filter((u) => u.startsWith(origin));
      expect(
        own.every((u) => u.startsWith(site.url)),
        own.filter((u) => !u.startsWith(site.url)).join('\n'),
      ).toBe(true);
      expect(own.some((u) => u.startsWith(`${site.url}models/stories260K/`))).toBe(true);
      expect(own.some((u) => u.startsWith(`${site.url}ort/`))).toBe(true);
      expect(failures).toEqual([]);
      expect(errors).toEqual([]);
    } finally {
      await context.close();
      await site.close();
    }
  });
}
