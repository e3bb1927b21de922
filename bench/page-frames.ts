/**
 * Frame pacing of the page during jobs (issue 13, defect 14): serves the built page (dist/),
 * opens it in Debian's Chromium, runs a set of operations on the bundled model and records every
 * animation-frame interval and every long task (PerformanceObserver 'longtask') from the click
 * on Run until the result is drawn. Prints p50/p95/max frame interval and the longest task.
 * Usage: npx vite build && npx tsx bench/page-frames.ts [dist-dir] [--profile] [--ops=trace,attention] [--load]
 * --load only measures how long the bundled model takes to be ready: from navigation in a fresh
 * browser context (nothing cached), then from a reload of the same page, three times each.
 * --profile also records a CPU profile of the main thread per operation (Chrome DevTools Protocol)
 * and prints the functions with the most self time: what the long tasks were doing. Build with
 * `npx vite build --minify false --outDir /tmp/dist-prof` to read the names.
 */
import { chromium } from 'playwright-core';
import { serveWorkbench } from '../src/node/serve';
import { resolve } from 'node:path';
import { CHROMIUM_ARGS } from '../playwright.config';

const OPS: { op: string; example?: boolean }[] = [
  { op: 'trace' },
  { op: 'attention' },
  { op: 'logit_lens' },
  { op: 'patch', example: true },
  { op: 'circuit', example: true },
  { op: 'causality', example: true },
];
const PROMPT = 'Once upon a time, there was a little girl named Lily who loved to play in the park with her friends';

const q = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor(p * s.length))] : NaN;
};

interface CpuProfile {
  nodes: { id: number; callFrame: { functionName: string; url: string; lineNumber: number }; children?: number[] }[];
  samples: number[];
  timeDeltas: number[];
}

/** self time per function (ms) over the whole run and over its longest busy stretch (the long task), top 10 each */
function printProfile(op: string, p: CpuProfile): void {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const idle = (id: number) => ['(idle)', '(root)'].includes(byId.get(id)!.callFrame.functionName);
  const top = (from: number, to: number) => {
    const self = new Map<string, number>();
    for (let i = from; i < to; i++) {
      if (idle(p.samples[i])) continue;
      const f = byId.get(p.samples[i])!.callFrame;
      const key = `${f.functionName || '(anonymous)'} ${f.url.split('/').pop()}:${f.lineNumber + 1}`;
      self.set(key, (self.get(key) ?? 0) + (p.timeDeltas[i] ?? 0) / 1000);
    }
    return [...self].sort((a, b) => b[1] - a[1]).slice(0, 10);
  };
  // the longest run of consecutive busy samples
  let best = [0, 0, 0];
  for (let i = 0, start = 0, ms = 0; i <= p.samples.length; i++) {
    if (i === p.samples.length || idle(p.samples[i])) {
      if (ms > best[2]) best = [start, i, ms];
      start = i + 1;
      ms = 0;
    } else ms += (p.timeDeltas[i] ?? 0) / 1000;
  }
  console.log(`  ${op}: main-thread self time (ms), whole run`);
  for (const [k, ms] of top(0, p.samples.length)) console.log(`    ${ms.toFixed(1).padStart(8)}  ${k}`);
  console.log(`  ${op}: the longest busy stretch, ${best[2].toFixed(0)} ms`);
  for (const [k, ms] of top(best[0], best[1])) console.log(`    ${ms.toFixed(1).padStart(8)}  ${k}`);
}

interface TraceEvent {
  name: string;
  ph: string;
  ts: number;
  dur?: number;
  tid: number;
  pid: number;
  args?: { name?: string; beginData?: { dirtyObjects?: number; totalObjects?: number } };
}

/**
 * What the renderer's main thread did in its longest task, by trace event (style, layout, paint,
 * script compile and run, GC): the CPU profile folds the browser's own work into "(program)".
 * Events nest (a function call that forces layout contains it), so the rows overlap.
 */
function printTrace(op: string, events: TraceEvent[]): void {
  const main = events.find((e) => e.name === 'thread_name' && e.args?.name === 'CrRendererMain');
  if (!main) return;
  const mine = events.filter((e) => e.tid === main.tid && e.pid === main.pid && e.ph === 'X' && e.dur);
  const tasks = mine.filter((e) => e.name === 'RunTask').sort((a, b) => b.dur! - a.dur!);
  const task = tasks[0];
  if (!task) return;
  const sum = new Map<string, number>();
  for (const e of mine) {
    if (e === task || e.ts < task.ts || e.ts + e.dur! > task.ts + task.dur!) continue;
    sum.set(e.name, (sum.get(e.name) ?? 0) + e.dur! / 1000);
  }
  console.log(`  ${op}: the longest task ${(task.dur! / 1000).toFixed(0)} ms, by trace event (nested rows overlap)`);
  for (const [k, ms] of [...sum].sort((a, b) => b[1] - a[1]).slice(0, 12))
    console.log(`    ${ms.toFixed(1).padStart(8)}  ${k}`);
  const layouts = mine.filter((e) => e.name === 'Layout' && e.ts >= task.ts && e.ts <= task.ts + task.dur!);
  for (const l of layouts)
    console.log(
      `    layout ${(l.dur! / 1000).toFixed(0)} ms: ${l.args?.beginData?.dirtyObjects ?? '?'} of ${l.args?.beginData?.totalObjects ?? '?'} objects dirty`,
    );
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const profile = args.includes('--profile');
  const root = args.find((a) => !a.startsWith('--')) ?? 'dist';
  const only = args
    .find((a) => a.startsWith('--ops='))
    ?.slice(6)
    .split(',');
  const server = await serveWorkbench(0, resolve(root));
  const browser = await chromium.launch({
    executablePath: process.env.LOUPE_CHROMIUM ?? '/usr/bin/chromium',
    args: CHROMIUM_ARGS,
  });
  try {
    if (args.includes('--load')) {
      const ready = `globalThis.__loupe?.modelStatus === 'ready' && globalThis.__loupe.ops.length > 0`;
      for (let i = 0; i < 3; i++) {
        const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
        const p = await ctx.newPage();
        let t0 = Date.now();
        await p.goto(server.url);
        await p.waitForFunction(ready, null, { timeout: 120_000 });
        const fresh = Date.now() - t0;
        t0 = Date.now();
        await p.reload();
        await p.waitForFunction(ready, null, { timeout: 120_000 });
        console.log(`bundled model ready: fresh context ${fresh} ms after navigation, reload ${Date.now() - t0} ms`);
        await ctx.close();
      }
      return;
    }
    const page = await (await browser.newContext({ viewport: { width: 1280, height: 800 } })).newPage();
    const cdp = profile ? await page.context().newCDPSession(page) : null;
    if (cdp) {
      await cdp.send('Profiler.enable');
      await cdp.send('Profiler.setSamplingInterval', { interval: 500 });
    }
    await page.goto(server.url);
    await page.waitForFunction(
      `globalThis.__loupe?.modelStatus === 'ready' && globalThis.__loupe.ops.length > 0`,
      null,
      { timeout: 120_000 },
    );
    if (process.env.WAIT_MS) await page.waitForTimeout(Number(process.env.WAIT_MS));
    const all: number[] = [];
    const tasks: number[] = [];
    // --ops= runs those, in that order (the first to draw pays for the first layout of the charts' text)
    for (const { op, example } of only ? only.map((n) => OPS.find((o) => o.op === n) ?? { op: n }) : OPS) {
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
      if (cdp) {
        await cdp.send('Profiler.start');
        await browser.startTracing(page, {
          categories: [
            'devtools.timeline',
            'disabled-by-default-devtools.timeline',
            'v8',
            ...(process.env.TRACE_CATS?.split(',') ?? []),
          ],
        });
      }
      await page.getByTestId('run').click();
      await page.waitForSelector('[data-testid=job]', { state: 'detached', timeout: 300_000 });
      await page.waitForSelector(`[data-testid=result][data-op=${op}] svg`, { timeout: 60_000 }).catch(() => {});
      await page.waitForTimeout(500);
      const r = (await page.evaluate(
        `(() => { const w = globalThis; w.__on = false; w.__obs.disconnect(); return { frames: w.__frames.slice(1), tasks: w.__tasks }; })()`,
      )) as { frames: number[]; tasks: number[] };
      all.push(...r.frames);
      tasks.push(...r.tasks);
      if (cdp) {
        printProfile(op, ((await cdp.send('Profiler.stop')) as { profile: CpuProfile }).profile);
        printTrace(op, JSON.parse((await browser.stopTracing()).toString()).traceEvents as TraceEvent[]);
      }
      console.log(
        `${op.padEnd(12)} frames ${String(r.frames.length).padStart(5)}  p50 ${q(r.frames, 0.5).toFixed(1)} ms  p95 ${q(r.frames, 0.95).toFixed(1)} ms  max ${Math.max(...r.frames).toFixed(0)} ms  long tasks ${r.tasks.length} (max ${r.tasks.length ? Math.max(...r.tasks).toFixed(0) : 0} ms)`,
      );
    }
    console.log(
      `ALL          frames ${all.length}  p95 ${q(all, 0.95).toFixed(1)} ms  max ${Math.max(...all).toFixed(0)} ms  long tasks ${tasks.length} (max ${tasks.length ? Math.max(...tasks).toFixed(0) : 0} ms)`,
    );
  } finally {
    await browser.close();
    await server.close();
  }
}
void main();
