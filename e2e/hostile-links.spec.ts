/**
 * Hostile share links and session files (issue 22, failure 9): a 3.5 KB link whose head_scores
 * document claims 5e7 layers froze the main thread and crashed the renderer before any click;
 * the same document imported into the session hung every later load; an import of 50,000 entries
 * took 21.7 s and then 6.8 s on every load. Now such documents are refused before any view sees
 * them (naming the field and the limit), imports bring in at most the history limit, and after each
 * attack the page still answers.
 */
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import os from 'node:os';
import type { Page } from '@playwright/test';
import { test, expect, openReady, runOp, pageDoc, watchErrors, shot } from './fixtures';
import { encodeShare } from '../src/share/codec';
import { CAPS } from '../src/engine/caps';

test.describe.configure({ mode: 'serial' });

/** the page answers within 15 s (a frozen main thread never does) */
async function alive(p: Page): Promise<string> {
  return Promise.race([p.evaluate(() => 'alive'), new Promise<string>((r) => setTimeout(() => r('frozen'), 15_000))]);
}

let headScores: any;
let trace: any;

test('documents to attack with: head_scores and trace from the page', async ({ page, site }) => {
  await openReady(page, site.url);
  await runOp(page, 'head_scores');
  // without the example's patterns (null when large, as the schema allows): a link of a few kB
  const full = await pageDoc(page, 'head_scores');
  headScores = { ...full, example: { ...full.example, patterns: null } };
  await runOp(page, 'trace');
  trace = await pageDoc(page, 'trace');
  expect(headScores.model.n_layers).toBeGreaterThan(0);
});

const model = () => ({ kind: 'bundled' as const, id: headScores.model.id, revision: headScores.model.revision });

test('a link whose head_scores document claims 5e7 layers: refused, the page answers', async ({ browser, site }) => {
  const hostile = { ...headScores, model: { ...headScores.model, n_layers: 5e7 } };
  const { text, embedded } = encodeShare(
    { v: 1, model: model(), op: 'head_scores', input: {}, result: hostile },
    { maxChars: 1e6 },
  );
  expect(embedded).toBe(true);
  console.log(`[e2e] hostile link: ${text.length} characters`);
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  try {
    const p = await ctx.newPage();
    const errs = watchErrors(p);
    await p.goto(`${site.url}#s=${text}`);
    await expect(p.locator('[data-testid=notice][data-kind=error]')).toContainText('n_layers', { timeout: 30_000 });
    expect(await alive(p)).toBe('alive');
    await expect(p.locator('[data-testid=result][data-op=head_scores][data-from-link=true]')).toHaveCount(0);
    await shot(p, 'hostile-link');
    expect(errs.filter((e) => !/n_layers/.test(e))).toEqual([]);
  } finally {
    await ctx.close();
  }
});

test('a link whose attribution rows name heads the model does not have: refused, the page answers', async ({
  browser,
  site,
}) => {
  const rows = headScores.heads.map((r: any, i: number) => (i === 0 ? { ...r, layer: 999_999 } : r));
  const { text } = encodeShare(
    { v: 1, model: model(), op: 'head_scores', input: {}, result: { ...headScores, heads: rows } },
    { maxChars: 1e6 },
  );
  const ctx = await browser.newContext();
  try {
    const p = await ctx.newPage();
    await p.goto(`${site.url}#s=${text}`);
    await expect(p.locator('[data-testid=notice][data-kind=error]')).toContainText('layer', { timeout: 30_000 });
    expect(await alive(p)).toBe('alive');
    await expect(p.locator('[data-testid=result][data-op=head_scores][data-from-link=true]')).toHaveCount(0);
  } finally {
    await ctx.close();
  }
});

test('a session file of 50,000 entries with a hostile one: at most the history limit comes in, the bad one is refused, every load answers', async ({
  browser,
  site,
}) => {
  const N = 50_000;
  const now = Date.now();
  const entries: unknown[] = [];
  // the newest: the hostile document, then the history limit's worth of real traces, then stubs
  entries.push({
    id: 'hostile',
    at: now,
    op: 'head_scores',
    input: {},
    doc: { ...headScores, model: { ...headScores.model, n_layers: 5e7 } },
  });
  for (let i = 1; i < N; i++)
    entries.push({
      id: `e${i}`,
      at: now - i,
      op: 'trace',
      input: { prompt: trace.prompt },
      doc: i <= CAPS.maxSessionEntries ? trace : { operation: 'trace' },
    });
  const file = path.join(os.tmpdir(), `loupe-hostile-session-${process.pid}.json`);
  writeFileSync(file, JSON.stringify({ format: 'loupe-session', version: 1, exported_at: '', entries }));

  const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  try {
    const p = await ctx.newPage();
    await openReady(p, site.url);
    await p.getByTestId('session-import').setInputFiles(file);
    const msg = p.getByTestId('session-import-msg');
    await expect(msg).toContainText('Imported', { timeout: 60_000 });
    console.log(`[e2e] import: ${(await msg.textContent())?.trim()}`);
    await expect(msg).toContainText('refused');
    expect(await alive(p)).toBe('alive');
    const n = await p.getByTestId('session-entry').count();
    expect(n).toBeLessThanOrEqual(CAPS.maxSessionEntries);
    expect(n).toBeGreaterThan(0);
    expect(await p.locator('[data-testid=session-entry][data-op=head_scores]').count()).toBe(0);
    await shot(p, 'hostile-session-import');
    // every later load still answers, with no more than the limit
    await p.reload();
    await expect(p.getByTestId('session-entry').first()).toBeVisible({ timeout: 60_000 });
    expect(await alive(p)).toBe('alive');
    expect(await p.getByTestId('session-entry').count()).toBeLessThanOrEqual(CAPS.maxSessionEntries);
  } finally {
    await ctx.close();
  }
});
