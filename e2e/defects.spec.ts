/**
 * The defects found using the page as a researcher would (issue 13), one test each. Every test
 * here failed on the page before its fix (run against the commit before them).
 */
import { join } from 'node:path';
import { chromium, type BrowserContext, type Page } from '@playwright/test';
import {
  test,
  expect,
  openReady,
  waitModelReady,
  runOp,
  shot,
  pageDoc,
  watchErrors,
  SHARED_MODELS,
  PROMPT,
} from './fixtures';
import { CHROMIUM_ARGS } from '../playwright.config';
import { shareUrl } from '../src/share/codec';

// not serial: each test stands alone (a failure restarts the worker, and beforeAll opens the page again)

let context: BrowserContext;
let page: Page;
let errors: string[];

test.beforeAll(async ({ browser, site }) => {
  context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  errors = watchErrors(page);
  await openReady(page, site.url);
});
test.afterAll(async () => {
  await context.close();
});

/** WCAG contrast ratio of two CSS colours as the browser computed them */
async function contrasts(p: Page, selector: string): Promise<{ text: string; ratio: number }[]> {
  return p.$$eval(selector, (els) => {
    const rgb = (c: string) => (c.match(/[\d.]+/g) ?? ['0', '0', '0']).slice(0, 3).map(Number);
    const lum = (c: number[]) => {
      const [r, g, b] = c.map((v) => {
        const x = v / 255;
        return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4;
      });
      return 0.2126 * r + 0.7152 * g + 0.0722 * b;
    };
    return els.map((el) => {
      const cs = getComputedStyle(el);
      const a = lum(rgb(cs.color));
      const b = lum(rgb(cs.backgroundColor));
      return { text: el.textContent ?? '', ratio: (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05) };
    });
  });
}

/** elements of a result that stick out of its card, and SVG texts drawn outside their SVG */
async function overflows(p: Page): Promise<string[]> {
  return p.evaluate(() => {
    const out: string[] = [];
    const card = document.querySelector('[data-testid=result]')!;
    const right = card.getBoundingClientRect().right + 1;
    for (const el of card.querySelectorAll('*')) {
      const r = el.getBoundingClientRect();
      if (r.width > 0 && r.right > right)
        out.push(
          `${el.tagName.toLowerCase()}.${(el.getAttribute('class') ?? '').split(' ')[0]} "${(el.textContent ?? '').slice(0, 30)}" right ${r.right.toFixed(0)} > card ${right.toFixed(0)}`,
        );
    }
    for (const svg of card.querySelectorAll('svg')) {
      const vb = svg.viewBox.baseVal;
      if (!vb || !vb.width) continue;
      for (const t of svg.querySelectorAll('text')) {
        const b = (t as SVGGraphicsElement).getBBox();
        const m = (t as SVGGraphicsElement).getCTM();
        const sm = svg.getCTM();
        if (!m || !sm) continue;
        // the text's box in the SVG's own coordinates
        const rel = sm.inverse().multiply(m);
        const xs = [b.x, b.x + b.width].flatMap((x) =>
          [b.y, b.y + b.height].map((y) => new DOMPoint(x, y).matrixTransform(rel).x),
        );
        if (Math.max(...xs) > vb.width + 1 || Math.min(...xs) < -1)
          out.push(
            `svg text "${t.textContent}" spans ${Math.min(...xs).toFixed(0)}…${Math.max(...xs).toFixed(0)} of ${vb.width.toFixed(0)}`,
          );
      }
    }
    return out;
  });
}

test('1. a share link to a Hub model loads nothing by itself and "Load and re-run" works at once', async ({
  browser,
  site,
  hub,
}) => {
  const REPO = 'loupe-test/shared-induction';
  hub.addRepo(REPO, join(SHARED_MODELS, 'induction-gpt2'));
  const { url } = shareUrl(site.url, {
    v: 1,
    model: { kind: 'hub', id: REPO, revision: 'main', endpoint: hub.url },
    op: 'trace',
    input: { prompt: 'abcabcab' },
  });
  const fresh = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  try {
    const p2 = await fresh.newPage();
    const errs = watchErrors(p2);
    const bundled: string[] = [];
    p2.on('request', (r) => {
      if (/\/models\/stories260K\//.test(r.url())) bundled.push(r.url());
    });
    await p2.goto(url);
    await expect(p2.getByTestId('shared-banner')).toHaveAttribute('data-status', 'waiting-model');
    await p2.waitForTimeout(500);
    // the link does not need the bundled model: nothing loads until the click
    expect(await p2.evaluate(() => (globalThis as any).__loupe.modelStatus)).not.toBe('loading');
    await p2.getByTestId('load-shared').click();
    await expect(p2.getByTestId('shared-banner')).toHaveAttribute('data-status', 'rerun', { timeout: 120_000 });
    expect(await p2.evaluate(() => (globalThis as any).__loupe.model?.info.id)).toBe(REPO);
    expect(bundled).toEqual([]);
    expect(errs).toEqual([]);
  } finally {
    await fresh.close();
  }
});

test('12. the first load: the Bundled tab is selected, and "starting" is said once the files are in', async ({
  site,
}) => {
  const t0 = Date.now();
  await page.goto(site.url);
  await expect(page.getByRole('tab', { name: 'Bundled' })).toHaveAttribute('aria-selected', 'true');
  // sample every frame until ready: whenever all files are in and the model is still loading,
  // the panel must not just show 100%
  const bad = await page.evaluate(
    () =>
      new Promise<string[]>((resolve) => {
        const seen: string[] = [];
        const tick = () => {
          const a = (globalThis as any).__loupe;
          const rows = [...document.querySelectorAll('[data-testid=file-row]')];
          if (
            a?.modelStatus === 'loading' &&
            rows.length &&
            rows.every((r) => r.getAttribute('data-done') === 'true') &&
            !document.querySelector('[data-testid=load-phase]')
          )
            seen.push(document.querySelector('[data-testid=load-pct]')?.textContent ?? '');
          if (a?.modelStatus === 'ready') resolve(seen);
          else requestAnimationFrame(tick);
        };
        tick();
      }),
  );
  console.log(
    `[e2e] bundled model ready ${Date.now() - t0} ms after navigation; frames showing only "100%" while starting: ${bad.length}`,
  );
  expect(bad).toEqual([]);
  await waitModelReady(page);
});

test('2. the job bar stays in view while scrolled, shows elapsed time, moves, and Esc cancels', async () => {
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'trace');
  await page.getByTestId('tab-generate').click();
  await page.locator('#p-generate-max_new_tokens').fill('480');
  await page.locator('#p-generate-stop_at_eos').uncheck();
  await page.getByTestId('run').click();
  await expect(page.getByTestId('job')).toBeVisible();
  await page.locator('main').evaluate((m) => m.scrollTo(0, m.scrollHeight));
  await page.waitForTimeout(400);
  const box = await page.getByTestId('job').boundingBox();
  expect(box).not.toBeNull();
  expect(box!.y).toBeGreaterThanOrEqual(0);
  expect(box!.y + box!.height).toBeLessThanOrEqual(800);
  await expect(page.getByTestId('cancel-job')).toBeInViewport();
  await expect(page.getByTestId('job-elapsed')).toHaveText(/\d+(\.\d)? s/);
  const v1 = Number(await page.getByTestId('job-progress').getAttribute('aria-valuenow'));
  await page.waitForTimeout(700);
  const v2 = Number(await page.getByTestId('job-progress').getAttribute('aria-valuenow'));
  expect(v2).toBeGreaterThan(v1);
  await shot(page, 'job-bar-sticky');
  await page.keyboard.press('Escape');
  await expect(page.getByTestId('job')).toHaveCount(0);
  await expect(page.getByTestId('job-error')).toContainText('cancelled');
});

test('3. switching the theme redraws charts already drawn in the new colours', async () => {
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'trace');
  const svg = page.locator('[data-testid=trace-heatmap] svg');
  await expect(svg).toBeVisible();
  const bgOf = () => page.evaluate(() => getComputedStyle(document.documentElement).getPropertyValue('--bg').trim());
  const wasLight = (await page.locator('html').getAttribute('data-theme')) !== 'dark';
  await page.getByRole('button', { name: /Switch to (dark|light) theme/ }).click();
  const want = await bgOf();
  expect(await svg.evaluate((s) => (s as SVGSVGElement).style.background)).toBe(
    await page.evaluate((c) => {
      const d = document.createElement('div');
      d.style.background = c;
      return d.style.background;
    }, want),
  );
  await shot(page, `trace-${wasLight ? 'dark' : 'light'}-after-switch`);
  await page.getByRole('button', { name: /Switch to (dark|light) theme/ }).click();
});

test('4. attention and circuit fit their card at 1024 wide with a long token', async () => {
  await page.setViewportSize({ width: 1024, height: 700 });
  try {
    await page.getByTestId('prompt').fill('<|endoftext|>Once upon a time, there was a little');
    await runOp(page, 'attention');
    // stories260K splits <|endoftext|> into pieces: give the drawn document GPT-2's single long token
    await page.evaluate(() => {
      const a = (globalThis as any).__loupe;
      const r = a.results.attention;
      a.results = {
        ...a.results,
        attention: {
          ...r,
          doc: {
            ...r.doc,
            tokens: r.doc.tokens.map((t: any, i: number) => (i % 3 === 1 ? { ...t, text: '<|endoftext|>' } : t)),
          },
        },
      };
    });
    await expect(page.locator('[data-testid=attention-view] .tok').nth(1)).toHaveText('<|endoftext|>');
    await page.locator('[data-testid=attention-view] .tok').first().hover();
    expect(await overflows(page)).toEqual([]);
    await shot(page, 'attention-1024-long-token');
    await runOp(page, 'circuit', { example: true });
    expect(await overflows(page)).toEqual([]);
    await shot(page, 'circuit-1024');
  } finally {
    await page.setViewportSize({ width: 1280, height: 800 });
  }
});

test('9. token chips stay readable on dark attention colours', async () => {
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'attention');
  // the last token attends somewhere: its row colours the chips
  await page.locator('[data-testid=attention-view] .tok').last().hover();
  const chips = await contrasts(page, '[data-testid=attention-view] .strip .tok');
  const unreadable = chips.filter((c) => c.ratio < 4.5);
  expect(unreadable).toEqual([]);
});

test('5. every activations series has its own colour', async () => {
  await runOp(page, 'activations');
  // the view loads lazily: wait for its curves
  await expect.poll(() => page.locator('[data-testid=activations-chart] path.series-line').count()).toBeGreaterThan(6);
  const strokes = await page.$$eval('[data-testid=activations-chart] path.series-line', (ps) =>
    ps.map((p) => `${p.getAttribute('data-series')}=${p.getAttribute('stroke')}`),
  );
  expect(strokes.length).toBeGreaterThan(6);
  const colours = strokes.map((s) => s.split('=')[1]);
  expect(new Set(colours).size, strokes.join(', ')).toBe(colours.length);
});

test('10. sweep and causality draw the same quantity in the same colour', async () => {
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'sweep', { example: true });
  await expect(page.locator('[data-testid=sweep-chart] path.series-line').first()).toBeAttached();
  const sweep = await page.$$eval(
    '[data-testid=sweep-metrics] path.series-line, [data-testid=sweep-chart] path.series-line',
    (ps) => Object.fromEntries(ps.map((p) => [p.getAttribute('data-series'), p.getAttribute('stroke')])),
  );
  await runOp(page, 'causality', { example: true });
  await expect(page.locator('[data-testid=causality-view] path.series-line').first()).toBeAttached();
  const caus = await page.$$eval('[data-testid=causality-view] path.series-line', (ps) =>
    Object.fromEntries(ps.map((p) => [p.getAttribute('data-series'), p.getAttribute('stroke')])),
  );
  const shared = Object.keys(caus).filter((k) => k in sweep);
  expect(shared.length).toBeGreaterThan(0);
  for (const k of shared) expect(caus[k], k).toBe(sweep[k]);
});

test('6. patch with an empty corrupted prompt names corrupted_prompt', async () => {
  await page.getByTestId('tab-patch').click();
  await page.locator('#p-patch-corrupted_prompt').fill('');
  await page.getByTestId('run').click();
  await expect(page.getByTestId('job-error')).toContainText('corrupted_prompt');
});

test('7. JSON inputs show their format', async () => {
  await page.getByTestId('tab-ablate').click();
  await expect(page.locator('[data-field=targets] label')).toContainText('{"layer":0,"head":0}');
  await page.getByTestId('tab-attention').click();
  await expect(page.locator('[data-field=heads] label')).toContainText('{"layer":0,"head":0}');
});

test('8. an error goes away once the input that caused it is corrected', async () => {
  await page.getByTestId('tab-ablate').click();
  await page.locator('#p-ablate-targets').fill('[{"layer": 0, "head": 1');
  await page.getByTestId('run').click();
  await expect(page.getByTestId('job-error')).toBeVisible();
  await page.locator('#p-ablate-targets').fill('[{"layer": 0, "head": 1}]');
  await expect(page.getByTestId('job-error')).toHaveCount(0);
});

test('13. the sentences under steer and probe results say what they are', async () => {
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'steer', { example: true });
  await expect(page.locator('[data-testid=steer-view] > p').last().locator('strong')).toHaveCount(1);
  await runOp(page, 'capture', { example: true });
  await runOp(page, 'probe');
  await expect(page.locator('[data-testid=probe-view] > p').last().locator('strong')).toHaveCount(1);
  expect(errors).toEqual([]);
});

test('11. without WebGPU the Doctor does not offer the agreement check', async ({ site }) => {
  const b = await chromium.launch({
    executablePath: process.env.LOUPE_CHROMIUM ?? '/usr/bin/chromium',
    args: CHROMIUM_ARGS.filter((a) => a !== '--enable-unsafe-webgpu'),
  });
  try {
    const p = await (await b.newContext({ viewport: { width: 1280, height: 800 } })).newPage();
    await openReady(p, site.url);
    await p.getByRole('button', { name: 'Doctor' }).click();
    await expect(p.getByTestId('doc-webgpu')).toContainText('unavailable');
    await expect(p.getByTestId('run-agreement')).toBeDisabled();
  } finally {
    await b.close();
  }
});

test('14. a large result arrives laid out without an element per cell, and nothing walks its numbers on the main thread', async () => {
  // ~120 tokens: every head's pattern is 14,400 cells, a layer's small multiples eight times that
  const long = Array.from(
    { length: 5 },
    () => 'Once upon a time, there was a little girl named Lily who loved to play.',
  ).join(' ');
  await page.setViewportSize({ width: 1280, height: 800 });
  await page.getByTestId('prompt').fill(long);
  // count structuredClone calls on the main thread while the result is stored and drawn: Svelte's
  // $state.snapshot of a document calls it once per number (the session write did, ~350 ms)
  await page.evaluate(() => {
    const w = globalThis as any;
    w.__clones = 0;
    w.__origClone ??= w.structuredClone;
    w.structuredClone = (v: unknown, o?: StructuredSerializeOptions) => {
      w.__clones++;
      return w.__origClone(v, o);
    };
  });
  await runOp(page, 'attention');
  const doc = await pageDoc(page, 'attention');
  const T = doc.tokens.length;
  expect(T).toBeGreaterThan(100);
  const pattern = page.locator('[data-testid=attention-pattern] svg');
  await expect(pattern).toHaveAttribute('data-render', 'raster');
  await expect(pattern).toHaveAttribute('data-rows', String(T));
  await expect(pattern.locator('rect.cell')).toHaveCount(0);
  await expect(pattern.locator('image.cells-raster')).toHaveCount(1);
  // the small multiples: one bitmap per head, no <rect> per cell
  const multiples = page.locator('[data-testid=attention-multiples] g.multiple');
  await expect(multiples).toHaveCount(doc.heads.filter((h: any) => h.layer === doc.heads[0].layer).length);
  await expect(page.locator('[data-testid=attention-multiples] g.multiple image')).toHaveCount(await multiples.count());
  const elements = await page.locator('[data-testid=result]').evaluate((el) => el.querySelectorAll('*').length);
  expect(elements).toBeLessThan(3000);
  // the session entry is stored (IndexedDB), and the document was not walked number by number
  await expect(page.getByTestId('session-entry').first()).toHaveAttribute('data-op', 'attention');
  expect(await page.evaluate(() => (globalThis as any).__clones)).toBeLessThan(100);

  // the bitmap keeps the grid's hover: the tooltip shows the weight of the cell under the pointer
  await pattern.scrollIntoViewIfNeeded();
  const box = (await pattern.locator('image.cells-raster').boundingBox())!;
  const q = 12,
    k = 3;
  await page.mouse.move(box.x + (k + 0.5) * (box.width / T), box.y + (q + 0.5) * (box.height / T));
  await expect(page.getByTestId('chart-tooltip')).toContainText(`(${q}) → `);
  await expect(page.getByTestId('chart-tooltip')).toContainText(`(${k})`);
  // and the linked highlight: the hovered key position is outlined here when hovered in the token strip
  await page.locator('[data-testid=attention-view] .tok[data-pos="5"]').hover();
  await expect(pattern.locator('path.pos-highlight')).toHaveAttribute('d', /^M/);
  await shot(page, 'attention-large-raster');
  await page.evaluate(() => {
    const w = globalThis as any;
    w.structuredClone = w.__origClone;
  });
  expect(errors).toEqual([]);
});
