/**
 * `tsx bench/page-graph.ts [shape] [--features 16384] [--l0 15] [--tokens 32] [--max-feature-nodes 7500|all] [--keep]`
 * (after `npx vite build`; LOUPE_PAGE_DIST=DIR serves a page built with `--outDir DIR` instead)
 *
 * An attribution graph in the real page on WASM, in Debian's headless Chromium (playwright-core):
 * a bench:scale shape (default gemma-3-270m) with a random per-layer transcoder set of `features`
 * per layer in circuit-tracer's layout (bench/transcoder-gen.ts, F32, about `l0` active per
 * position), both served by the loopback Hub stand-in. The page loads the model, then runs
 * `attribution_graph` on `tokens` token ids (BOS first) with `max_feature_nodes`; the transcoder
 * set downloads into IndexedDB inside that call, so its time is in the graph's wall time.
 * Reported: the graph's wall time in the page, its cost block (forward-equivalents, frozen-backward
 * rows and their time, one forward), its nodes, and the renderer processes' peak RSS before the
 * model, then sampled every 250 ms through the load and the graph (lib.ts chromiumPeakSampler).
 * One run (the machine is shared: see the load).
 */
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { chromium } from 'playwright-core';
import { serveWorkbench } from '../src/node/serve';
import { startHubServer } from '../tests/helpers/hub-server';
import { CHROMIUM_ARGS } from '../playwright.config';
import { chromiumPeak, chromiumPeakSampler, ROOT } from './lib';
import { mdTable, startResults } from './results';
import { SHAPES, generate } from './scale';
import { generateTranscoders } from './transcoder-gen';
import { useScratchCacheDir } from '../tests/helpers/scratch-cache';

const CHROMIUM = process.env.LOUPE_CHROMIUM ?? '/usr/bin/chromium';

async function main() {
  if (!process.env.LOUPE_CACHE_DIR) process.on('exit', useScratchCacheDir());
  const record = startResults('page-graph', 'An attribution graph in the page on WASM: time and renderer peak');
  const args = process.argv.slice(2);
  const opt = (k: string, d: string) => {
    const i = args.indexOf(`--${k}`);
    return i >= 0 ? args[i + 1] : d;
  };
  const name = args.find((a, i) => !a.startsWith('--') && !(i > 0 && args[i - 1].startsWith('--'))) ?? 'gemma-3-270m';
  const F = Number(opt('features', '16384'));
  const l0 = Number(opt('l0', '15'));
  const T = Number(opt('tokens', '32'));
  const mfn = opt('max-feature-nodes', '7500');
  const maxFeatureNodes = mfn === 'all' ? null : Number(mfn);
  const shape = SHAPES.find((s) => s.name === name);
  if (!shape) throw new Error(`unknown shape ${name}: ${SHAPES.map((s) => s.name).join(', ')}`);
  const root = path.join(tmpdir(), 'loupe-page-graph');
  const dir = path.join(root, shape.name);
  const tcDir = path.join(root, `${shape.name}-plt-${F}-l0-${l0}`);
  if (!existsSync(path.join(dir, 'model.safetensors'))) generate(shape, dir);
  if (!existsSync(path.join(tcDir, `layer_${shape.L - 1}.safetensors`)))
    generateTranscoders({ nLayers: shape.L, dModel: shape.D, features: F, l0 }, tcDir);
  const dist = process.env.LOUPE_PAGE_DIST ?? path.join(ROOT, 'dist');
  if (!existsSync(path.join(dist, 'index.html'))) throw new Error('build the page first: npx vite build');
  const site = await serveWorkbench(0, dist);
  const hub = await startHubServer();
  const repo = `bench/${shape.name}`;
  const tcRepo = `bench/${shape.name}-plt-${F}`;
  hub.addRepo(repo, dir);
  hub.addRepo(tcRepo, tcDir);
  // a persistent profile: an off-the-record context's IndexedDB quota is a small share of RAM
  const profile = mkdtempSync(path.join(tmpdir(), 'loupe-page-graph-profile-'));
  const browser = await chromium.launchPersistentContext(profile, { executablePath: CHROMIUM, args: CHROMIUM_ARGS });
  const out: Record<string, unknown> = {
    shape: shape.name,
    features: F,
    l0_target: l0,
    tokens: T,
    max_feature_nodes: mfn,
  };
  const note = (k: string, v: unknown) => {
    out[k] = v;
    console.log(`[page-graph] ${k} ${JSON.stringify(v)}`);
  };
  try {
    const page = await browser.newPage();
    await page.goto(site.url);
    await page.waitForFunction(
      () => {
        const a = (globalThis as any).__loupe;
        return a && a.modelStatus === 'ready' && a.ops.length > 0;
      },
      null,
      { timeout: 600_000 },
    );
    note('renderer_before', chromiumPeak());
    const sampler = chromiumPeakSampler();
    await page.evaluate(
      ({ id, endpoint }) => {
        const a = (globalThis as any).__loupe;
        a.backend = 'wasm';
        void a.models.load({ kind: 'hub', id, revision: 'main', endpoint });
      },
      { id: repo, endpoint: hub.url },
    );
    // above 1 GB the page asks before downloading: answer at once
    for (;;) {
      await page.waitForFunction(
        (m) => {
          const a = (globalThis as any).__loupe;
          return (
            (a.models.model?.info.id === m && a.modelStatus === 'ready') || a.modelError || a.models.preview?.waiting
          );
        },
        repo,
        { timeout: 3_600_000 },
      );
      const asked = await page.evaluate(() => {
        const m = (globalThis as any).__loupe.models;
        if (!m.preview?.waiting) return false;
        m.answerPreview(true);
        return true;
      });
      if (!asked) break;
    }
    const err = await page.evaluate(() => (globalThis as any).__loupe.modelError);
    if (err) throw new Error(`load failed: ${JSON.stringify(err)}`);
    const info = await page.evaluate(() => (globalThis as any).__loupe.models.model.info);
    note('load_ms', Math.round(await page.evaluate(() => (globalThis as any).__loupe.models.model.loadMs as number)));
    note('backend_ran', info.backend);
    note('precision', info.weights);
    note('weight_bytes', info.weight_bytes);
    note('peak_after_load', sampler.peak());
    const bos = shape.V - 1; // bench:scale configs' bos_token_id
    const ids = [bos, ...Array.from({ length: T - 1 }, (_, i) => 1000 + ((i * 7919) % 20000))];
    const r = await page.evaluate(
      async (input) => {
        try {
          const { doc, ms } = await (globalThis as any).__loupe.execute('attribution_graph', input, { who: 'page' });
          return {
            ms,
            cost: doc.cost,
            active_features: doc.active_features,
            selected_features: doc.selected_features,
            nodes: doc.graph.nodes.length,
            links: doc.graph.links.length,
            scores: doc.scores,
            logit_nodes: doc.logit_nodes.length,
            transcoders: doc.transcoders,
          };
        } catch (e: any) {
          return { error: { code: e?.code, message: String(e?.message ?? e) } };
        }
      },
      {
        prompt: '',
        token_ids: ids,
        transcoder_source: `${hub.url}/${tcRepo}/resolve/main`,
        max_feature_nodes: maxFeatureNodes,
      },
    );
    note('graph', r);
    note('peak_after_graph', sampler.peak());
    sampler.stop();
    note('memory', await page.evaluate(() => (globalThis as any).__loupe.models.memory));
  } finally {
    await browser.close();
    rmSync(profile, { recursive: true, force: true });
    await hub.close();
    await site.close();
  }
  if (!args.includes('--keep')) rmSync(root, { recursive: true, force: true });
  const g = out.graph as any;
  console.log(JSON.stringify(out));
  const gb = (b: unknown) => `${(Number(b) / 1e9).toFixed(2)} GB`;
  const head = [
    'model (page, WASM)',
    'transcoders',
    'tokens, max_feature_nodes',
    'active features (L0 per position)',
    'graph wall time',
    'frozen backward rows (time)',
    'forward-equivalents',
    'graph nodes / links',
    'renderer peak: before model / after load / after graph',
  ];
  const row = g.error
    ? [shape.name, `PLT ${F}`, `${T}, ${mfn}`, '', `${g.error.code}: ${g.error.message}`, '', '', '', '']
    : [
        `${shape.name} (${out.precision}, ${gb(out.weight_bytes)} weights, load ${(Number(out.load_ms) / 1000).toFixed(1)} s)`,
        `random PLT ${F}/layer × ${shape.L} (${g.transcoders?.weight_bytes ? gb(g.transcoders.weight_bytes) : 'F32'})`,
        `${T}, ${mfn}`,
        `${g.active_features} (${(g.active_features / (shape.L * (T - 1))).toFixed(1)})`,
        `${(g.ms / 1000).toFixed(1)} s`,
        `${g.cost.backward_rows} in ${g.cost.runs} runs of ${g.cost.batch} (${(g.cost.rows_ms / 1000).toFixed(1)} s)`,
        `${g.cost.forward_equivalents.toFixed(0)} (one forward ${g.cost.forward_ms} ms)`,
        `${g.nodes} / ${g.links}`,
        `${gb(out.renderer_before)} / ${gb(out.peak_after_load)} / ${gb(out.peak_after_graph)}`,
      ];
  const notes = [
    'wall time includes downloading the transcoder set from the loopback Hub stand-in into IndexedDB (inside the call)',
  ];
  console.log(mdTable({ head, rows: [row] }));
  record.save([{ head, rows: [row] }], notes, out);
}
void main();
