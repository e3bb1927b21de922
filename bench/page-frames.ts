/**
 * Frame pacing of the page during jobs (issue 13, defect 14): serves the built page (dist/),
 * opens it in Debian's Chromium, runs a set of operations on the bundled model and records every
 * animation-frame interval and every long task (PerformanceObserver 'longtask') from the click
 * on Run until the result is drawn. Prints p50/p95/max frame interval and the longest task.
 * Usage: npx vite build && npx tsx bench/page-frames.ts [dist-dir]
 */
import { chromium } from 'playwright-core';
import { serveWorkbench } from '../src/node/serve';
import { resolve } from 'node:path';
import { CHROMIUM_ARGS } from '../playwright.config';

const OPS: { op: string; example?: boolean }[] = [
  { op: 'trace' }, { op: 'attention' }, { op: 'logit_lens' }, { op: 'patch', example: true }, { op: 'circuit', example: true }, { op: 'causality', example: true },
];
const PROMPT = 'Once upon a time, there was a little girl named Lily who loved to play in the park with her friends';

const q = (xs: number[], p: number) => { const s = [...xs].sort((a, b) => a - b); return s.length ? s[Math.min(s.length - 1, Math.floor(p * s.length))] : NaN; };

async function main(): Promise<void> {
  const root = process.argv[2] ?? 'dist';
  const server = await serveWorkbench(0, resolve(root));
  const browser = await chromium.launch({ executablePath: process.env.LOUPE_CHROMIUM ?? '/usr/bin/chromium', args: CHROMIUM_ARGS });
  try {
    const page = await (await browser.newContext({ viewport: { width: 1280, height: 800 } })).newPage();
    await page.goto(server.url);
    await page.waitForFunction(`globalThis.__loupe?.modelStatus === 'ready' && globalThis.__loupe.ops.length > 0`, null, { timeout: 120_000 });
    const all: number[] = [];
    const tasks: number[] = [];
    for (const { op, example } of OPS) {
      await page.getByTestId(`tab-${op}`).click();
      if (example) await page.getByTestId('fill-example').click();
      await page.getByTestId('prompt').fill(PROMPT);
      // a string, not a function: tsx's name helpers do not exist in the page
      await page.evaluate(`(() => {
        const w = globalThis;
        w.__frames = []; w.__tasks = [];
        let last = performance.now();
        w.__on = true;
        const tick = (t) => { w.__frames.push(t - last); last = t; if (w.__on) requestAnimationFrame(tick); };
        requestAnimationFrame(tick);
        w.__obs = new PerformanceObserver((l) => { for (const e of l.getEntries()) w.__tasks.push(e.duration); });
        w.__obs.observe({ type: 'longtask' });
      })()`);
      await page.getByTestId('run').click();
      await page.waitForSelector('[data-testid=job]', { state: 'detached', timeout: 300_000 });
      await page.waitForSelector(`[data-testid=result][data-op=${op}] svg`, { timeout: 60_000 }).catch(() => {});
      await page.waitForTimeout(500);
      const r = await page.evaluate(`(() => { const w = globalThis; w.__on = false; w.__obs.disconnect(); return { frames: w.__frames.slice(1), tasks: w.__tasks }; })()`) as { frames: number[]; tasks: number[] };
      all.push(...r.frames); tasks.push(...r.tasks);
      console.log(`${op.padEnd(12)} frames ${String(r.frames.length).padStart(5)}  p50 ${q(r.frames, 0.5).toFixed(1)} ms  p95 ${q(r.frames, 0.95).toFixed(1)} ms  max ${Math.max(...r.frames).toFixed(0)} ms  long tasks ${r.tasks.length} (max ${r.tasks.length ? Math.max(...r.tasks).toFixed(0) : 0} ms)`);
    }
    console.log(`ALL          frames ${all.length}  p95 ${q(all, 0.95).toFixed(1)} ms  max ${Math.max(...all).toFixed(0)} ms  long tasks ${tasks.length} (max ${tasks.length ? Math.max(...tasks).toFixed(0) : 0} ms)`);
  } finally {
    await browser.close();
    await server.close();
  }
}
void main();
