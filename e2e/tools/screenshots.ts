/**
 * Screenshots of the page's views at 1280×800 and 1024×700 in both themes, for looking at (not a
 * test): artifacts/screenshots/views/<view>-<width>-<theme>.png.
 * Usage: npx vite build && npx tsx e2e/tools/screenshots.ts
 */
import { mkdirSync } from 'node:fs';
import { chromium, type Page } from 'playwright-core';
import { serveWorkbench } from '../../src/node/serve';
import { CHROMIUM_ARGS } from '../../playwright.config';

const OUT = 'artifacts/screenshots/views';
const PROMPT = 'Once upon a time, there was a little';

async function run(page: Page, op: string, example = false, prompt = PROMPT): Promise<void> {
  await page.getByTestId(`tab-${op}`).click();
  if (example) await page.getByTestId('fill-example').click();
  await page.getByTestId('prompt').fill(prompt);
  await page.getByTestId('run').click();
  await page.waitForSelector('[data-testid=job]', { state: 'detached', timeout: 300_000 });
  await page
    .waitForSelector(`[data-testid=result][data-op=${op}] svg, [data-testid=result][data-op=${op}] table`, {
      timeout: 60_000,
    })
    .catch(() => {});
  await page.waitForTimeout(300);
}

async function main(): Promise<void> {
  mkdirSync(OUT, { recursive: true });
  const server = await serveWorkbench(0);
  const browser = await chromium.launch({
    executablePath: process.env.LOUPE_CHROMIUM ?? '/usr/bin/chromium',
    args: CHROMIUM_ARGS,
  });
  try {
    for (const [w, h] of [
      [1280, 800],
      [1024, 700],
    ] as const) {
      for (const theme of ['light', 'dark'] as const) {
        const ctx = await browser.newContext({ viewport: { width: w, height: h } });
        await ctx.addInitScript(`localStorage.setItem('loupe.theme', '"${theme}"')`);
        const page = await ctx.newPage();
        const shot = async (name: string, sel?: string) => {
          await page.mouse.move(0, 0);
          if (sel)
            await page
              .locator(sel)
              .first()
              .scrollIntoViewIfNeeded()
              .catch(() => {});
          await page.screenshot({ path: `${OUT}/${name}-${w}-${theme}.png` });
        };
        await page.goto(server.url);
        await page.waitForTimeout(600);
        await shot('first-load');
        await page.waitForFunction(
          `globalThis.__loupe?.modelStatus === 'ready' && globalThis.__loupe.ops.length > 0`,
          null,
          { timeout: 120_000 },
        );
        await run(page, 'trace');
        await shot('trace', '[data-testid=result]');
        await page.locator('[data-testid=trace-heatmap] rect.cell[data-row="1"][data-col="2"]').click();
        await page.waitForSelector('[data-testid=head-pattern] rect.cell', { timeout: 60_000 });
        await page.locator('[data-testid=trace-view] .token[data-pos="3"]').hover();
        await page.locator('[data-testid=head-panel]').scrollIntoViewIfNeeded();
        await page.screenshot({ path: `${OUT}/head-panel-${w}-${theme}.png` });
        await page.locator('[aria-label="Close the head panel"]').click();
        for (const [op, ex] of [
          ['activations', false],
          ['attention', false],
          ['circuit', true],
          ['patch', true],
          ['steer', true],
          ['sweep', true],
          ['causality', true],
        ] as const) {
          await run(page, op, ex);
          await shot(op, '[data-testid=result]');
        }
        await run(page, 'capture', true);
        await run(page, 'probe');
        await shot('probe', '[data-testid=result]');
        // compare two traces
        await run(page, 'trace', false, 'Lily went to the park with her dog');
        const tr = page.locator('[data-testid=session-entry][data-op=trace]');
        await tr.nth(1).getByTestId('session-a').click();
        await tr.nth(0).getByTestId('session-b').click();
        await shot('compare', '[data-testid=compare]');
        await page.locator('[aria-label="Close the comparison"]').click();
        // the job bar, scrolled
        await page.getByTestId('tab-generate').click();
        await page.locator('#p-generate-max_new_tokens').fill('400');
        await page.locator('#p-generate-stop_at_eos').uncheck();
        await page.getByTestId('run').click();
        await page.locator('main').evaluate((m) => m.scrollTo(0, m.scrollHeight));
        await page.waitForTimeout(800);
        await page.screenshot({ path: `${OUT}/job-bar-${w}-${theme}.png` });
        await page.keyboard.press('Escape');
        await page.getByRole('button', { name: 'Doctor' }).click();
        await page.getByTestId('run-q8-cost').click();
        await page.waitForSelector('[data-testid=q8-cost]', { timeout: 120_000 });
        await page.waitForTimeout(800);
        await shot('doctor', '#doctor');
        await ctx.close();
        console.log(`${w}×${h} ${theme}: done`);
      }
    }
  } finally {
    await browser.close();
    await server.close();
  }
}
void main();
