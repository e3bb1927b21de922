/**
 * `tsx bench/page-scale.ts [shape] [--weights stored|f32|q8] [--backend wasm|webgpu] [--cached-backend wasm|webgpu] [--skip memory,node] [--trace-timeout S] [--keep]`
 * (after `npx vite build`; LOUPE_PAGE_DIST=DIR serves a page built with `--outDir DIR` instead)
 *
 * A bench:scale shape in the real page, in Debian's headless Chromium (playwright-core, never a
 * downloaded browser), on WASM (or WebGPU: SwiftShader, its GPU process's peak RSS too; the
 * from-memory and Node rows are WASM only), loaded from a loopback Hub stand-in (tests/helpers/hub-server.ts):
 *   cold load     download into IndexedDB + session (the worker's loadMs)
 *   cached load   after a reload: from IndexedDB, no request
 *   from memory   onnxruntime-web creating the same hooked graph's session in a bare page from
 *                 bytes already in memory (the graph built in Node, the weights fetched first):
 *                 the floor a cached load is compared with (it leaves out Loupe's tokenizer and
 *                 graph building, so the ratio is conservative)
 *   first trace   `trace` in the page, and the same operation in Node on onnxruntime-web's WASM
 *                 (bench/memory-child.ts) right after
 *   peak memory   the renderer processes' peak RSS (VmHWM, the worker runs in the page's
 *                 renderer) over the weight bytes in the precision used, and the same above the
 *                 renderer's peak with the page and its bundled model before the big one
 * One run of each (the machine is shared and loaded: ratios side by side, not absolute times).
 */
import { spawnSync } from 'node:child_process';
import { createServer } from 'node:http';
import { existsSync, mkdtempSync, readFileSync, rmSync, createReadStream } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { chromium } from 'playwright-core';
import { serveWorkbench } from '../src/node/serve';
import { startHubServer } from '../tests/helpers/hub-server';
import { CHROMIUM_ARGS } from '../playwright.config';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { describeModel } from '../src/engine/arch';
import { buildModelGraph } from '../src/engine/graph/build-model';
import { pieceGraph, type Piece } from '../src/engine/runtime/pieces';
import { q8WeightSet } from '../src/engine/q8';
import type { WeightPrecision } from '../src/engine/precision';
import { chromiumPeak, ROOT } from './lib';
import { mdTable, startResults } from './results';
import { SHAPES, generate } from './scale';
import { useScratchCacheDir } from '../tests/helpers/scratch-cache';

const CHROMIUM = process.env.LOUPE_CHROMIUM ?? '/usr/bin/chromium';
const PROMPT = 'The quick brown fox jumps over the lazy';

/** onnxruntime-web creating a session from bytes in memory, in a bare cross-origin-isolated page */
async function fromMemory(
  browser: import('playwright-core').BrowserContext,
  dir: string,
  precision: WeightPrecision,
  vocabChunks: number,
): Promise<number> {
  const files = await loadModelFilesNode(dir);
  const spec = describeModel({ config: files.config as Record<string, any>, tensors: files.weights.tensors });
  // the graph the page built: same precision, same vocabulary split (model.ts)
  const vocabRows = vocabChunks > 1 ? Math.ceil(spec.dVocab / vocabChunks) : undefined;
  // at q8 the quantised matrices are in-memory files, as in the page (model.ts)
  const weights = precision === 'q8' ? await q8WeightSet(files.weights, spec) : files.weights;
  const graph = buildModelGraph(spec, weights.tensors, {
    hooks: true,
    withResult: false,
    weights: precision,
    vocabRows,
  });
  // the weights in the pieces the page feeds (runtime/pieces.ts: under 2 GiB each, llama's 2.47 GB file is three)
  const { graphBytes, pieces } = pieceGraph(graph.bytes);
  const send = (p: Piece, res: import('node:http').ServerResponse) => {
    const mem = weights.files.get(p.file);
    if (mem) return void res.end(mem.subarray(p.start, p.end));
    createReadStream(weights.paths.get(p.file)!, { start: p.start, end: p.end - 1 }).pipe(res);
  };
  const ortDir = path.join(ROOT, 'node_modules', 'onnxruntime-web', 'dist');
  const h = {
    'Cross-Origin-Opener-Policy': 'same-origin',
    'Cross-Origin-Embedder-Policy': 'require-corp',
    'Cross-Origin-Resource-Policy': 'same-origin',
  };
  const html = `<!doctype html><script type="module">import * as ort from '/ort/ort.bundle.min.mjs'; window.ort = ort; window.ready = true;</script>`;
  const server = createServer((req, res) => {
    const url = (req.url ?? '/').split('?')[0];
    if (url === '/') {
      res.writeHead(200, { ...h, 'Content-Type': 'text/html' });
      return void res.end(html);
    }
    if (url === '/graph.onnx') {
      res.writeHead(200, { ...h, 'Content-Type': 'application/octet-stream' });
      return void res.end(graphBytes);
    }
    const piece = pieces.find((p) => url === `/${p.path}`);
    if (piece) {
      res.writeHead(200, { ...h, 'Content-Length': piece.end - piece.start });
      return send(piece, res);
    }
    const m = /^\/ort\/([\w.-]+)$/.exec(url);
    if (m && existsSync(path.join(ortDir, m[1]))) {
      res.writeHead(200, { ...h, 'Content-Type': m[1].endsWith('.wasm') ? 'application/wasm' : 'text/javascript' });
      return void res.end(readFileSync(path.join(ortDir, m[1])));
    }
    res.writeHead(404, h);
    res.end();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  try {
    const page = await browser.newPage();
    await page.goto(`http://127.0.0.1:${(server.address() as { port: number }).port}/`);
    await page.waitForFunction(() => (window as any).ready === true);
    const ms = await page.evaluate(
      async ({ paths, threads }) => {
        const ort = (window as any).ort;
        ort.env.wasm.numThreads = threads;
        ort.env.wasm.wasmPaths = '/ort/';
        const graph = new Uint8Array(await (await fetch('/graph.onnx')).arrayBuffer());
        const externalData = [];
        for (const path of paths)
          externalData.push({ path, data: new Uint8Array(await (await fetch('/' + path)).arrayBuffer()) });
        const t0 = performance.now();
        const s = await ort.InferenceSession.create(graph, {
          executionProviders: ['wasm'],
          graphOptimizationLevel: 'all',
          externalData,
        });
        const t = performance.now() - t0;
        await s.release();
        return t;
      },
      { paths: pieces.map((p) => p.path), threads: 2 },
    );
    await page.close();
    return ms;
  } finally {
    server.close();
  }
}

async function main() {
  // its Node-side loads (the same trace in Node, the q8 weights) cache into a scratch folder, as
  // the other benches do: the models are temporary, so is what Loupe caches for them
  if (!process.env.LOUPE_CACHE_DIR) process.on('exit', useScratchCacheDir());
  const record = startResults(
    'page-scale',
    'The page in headless Chromium: load, first trace and renderer peak of real shapes',
  );
  const args = process.argv.slice(2);
  const opt = (k: string, d: string) => {
    const i = args.indexOf(`--${k}`);
    return i >= 0 ? args[i + 1] : d;
  };
  const name =
    args.find((a, i) => !a.startsWith('--') && !(i > 0 && args[i - 1].startsWith('--') && args[i - 1] !== '--keep')) ??
    'gpt2-small';
  const weights = opt('weights', 'stored') as WeightPrecision;
  const backend = opt('backend', 'wasm') as 'wasm' | 'webgpu';
  // --skip memory,node: leave out the from-memory session and/or the Node WASM comparison (both WASM only)
  const skip = new Set(opt('skip', backend === 'webgpu' ? 'memory,node' : '').split(','));
  // --cached-backend webgpu: the cached load (from IndexedDB, a fresh page) and its trace on the
  // other backend: one 5 GB download serves both rows of a big shape
  const cachedBackend = opt('cached-backend', backend) as 'wasm' | 'webgpu';
  // --trace-timeout S: a trace still running after S seconds is noted as such and the run goes on
  // (SwiftShader, a CPU emulating a GPU, takes minutes per forward of a big shape)
  const traceTimeoutMs = Number(opt('trace-timeout', '0')) * 1000;
  const timed = async (run: Promise<number>): Promise<number | string> => {
    if (!traceTimeoutMs) return Math.round(await run);
    let timer: NodeJS.Timeout | undefined;
    const r = await Promise.race([
      run,
      new Promise<string>((res) => {
        timer = setTimeout(() => res(`over ${traceTimeoutMs / 1000} s (stopped)`), traceTimeoutMs);
      }),
    ]);
    clearTimeout(timer);
    return typeof r === 'number' ? Math.round(r) : r;
  };
  const shape = SHAPES.find((s) => s.name === name)!;
  const dir = path.join(tmpdir(), 'loupe-page-scale', shape.name);
  if (!existsSync(path.join(dir, 'model.safetensors'))) generate(shape, dir);
  // LOUPE_PAGE_DIST: a page built elsewhere (`npx vite build --outDir DIR`), so a long run is not disturbed by rebuilding dist/
  const dist = process.env.LOUPE_PAGE_DIST ?? path.join(ROOT, 'dist');
  if (!existsSync(path.join(dist, 'index.html'))) throw new Error('build the page first: npx vite build');
  const site = await serveWorkbench(0, dist);
  const hub = await startHubServer();
  hub.addRepo(`bench/${shape.name}`, dir);
  // a persistent profile, as a person's browser has: a context of chromium.launch() is
  // off-the-record, whose IndexedDB quota is a small share of RAM (the 2.47 GB llama file failed
  // with QuotaExceededError there), not of the disk
  const profile = mkdtempSync(path.join(tmpdir(), 'loupe-page-scale-profile-'));
  const browser = await chromium.launchPersistentContext(profile, { executablePath: CHROMIUM, args: CHROMIUM_ARGS });
  const out: Record<string, unknown> = { shape: shape.name, weights, backend };
  // each number as soon as it is measured: a run that fails later still reports what it got
  const note = (k: string, v: unknown) => {
    out[k] = v;
    console.log(`[page-scale] ${k} ${JSON.stringify(v)}`);
  };
  /**
   * The model `id` ready, or its load's error thrown. Above 1 GB the page asks before downloading:
   * the bench gives the click at once (loadMs includes that wait, a polling interval).
   */
  const readyOrError = async (p: import('playwright-core').Page, id: string) => {
    for (;;) {
      await p.waitForFunction(
        (m) => {
          const a = (globalThis as any).__loupe;
          return (
            (a.models.model?.info.id === m && a.modelStatus === 'ready') || a.modelError || a.models.preview?.waiting
          );
        },
        id,
        { timeout: 3_600_000 },
      );
      const asked = await p.evaluate(() => {
        const m = (globalThis as any).__loupe.models;
        if (!m.preview?.waiting) return false;
        m.answerPreview(true);
        return true;
      });
      if (!asked) break;
    }
    const e = await p.evaluate(() => (globalThis as any).__loupe.modelError);
    if (e) throw new Error(`load failed: ${JSON.stringify(e)}`);
  };
  try {
    const ctx = browser;
    const page = await ctx.newPage();
    const ready = () =>
      page.waitForFunction(
        () => {
          const a = (globalThis as any).__loupe;
          return a && a.modelStatus === 'ready' && a.ops.length > 0;
        },
        null,
        { timeout: 1_800_000 },
      );
    await page.goto(site.url);
    await ready();
    // the renderer with the page and its bundled model, before the big model: what the browser
    // costs whatever the model (the peaks below are also given over the weights above this floor)
    note('renderer_before', chromiumPeak());
    const load = async () => {
      await page.evaluate(
        ({ id, endpoint, weights, backend }) => {
          const a = (globalThis as any).__loupe;
          a.backend = backend;
          a.setWeights(weights);
          void a.models.load({ kind: 'hub', id, revision: 'main', endpoint });
        },
        { id: `bench/${shape.name}`, endpoint: hub.url, weights, backend },
      );
      await readyOrError(page, `bench/${shape.name}`);
      return page.evaluate(() => (globalThis as any).__loupe.models.model.loadMs as number);
    };
    note('cold_load_ms', Math.round(await load()));
    note('peak_after_load', chromiumPeak());
    const info = await page.evaluate(() => (globalThis as any).__loupe.models.model.info);
    note('weight_bytes', info.weight_bytes);
    note('precision', info.weights);
    note('backend_ran', info.backend);
    note('vocab_chunks', info.vocab_chunks);
    const trace = async () =>
      page.evaluate(
        async (prompt) =>
          (await (globalThis as any).__loupe.execute('trace', { prompt }, { who: 'page' })).ms as number,
        PROMPT,
      );
    note('first_trace_ms', await timed(trace()));
    note('peak_after_first', chromiumPeak());
    if (backend === 'webgpu') note('gpu_process_peak', chromiumPeak('gpu-process'));
    await page.waitForFunction(() => (globalThis as any).__loupe.models.memory?.weightBytes > 0, null, {
      timeout: 600_000,
    });
    note('memory', await page.evaluate(() => (globalThis as any).__loupe.models.memory));
    // a fresh page (and renderer): the cached load from IndexedDB, then its first trace
    await page.close();
    hub.resetCounters();
    const page2 = await ctx.newPage();
    await page2.goto(site.url);
    await page2.waitForFunction(
      () => {
        const a = (globalThis as any).__loupe;
        return a && a.modelStatus === 'ready' && a.ops.length > 0;
      },
      null,
      { timeout: 1_800_000 },
    );
    // the page opens the last model by itself when the cache holds it whole (models.startChoice):
    // that is the cached load, on the backend the page remembers; loading it again would make the
    // renderer's peak that of two loads
    const opened = await page2.evaluate(() => {
      const m = (globalThis as any).__loupe.models.model;
      return m ? { id: m.info.id as string, backend: m.info.backend as string, loadMs: m.loadMs as number } : null;
    });
    const load2 = async () => {
      if (opened?.id === `bench/${shape.name}` && opened.backend === cachedBackend) return opened.loadMs;
      await page2.evaluate(
        ({ id, endpoint, backend }) => {
          const a = (globalThis as any).__loupe;
          a.backend = backend;
          void a.models.load({ kind: 'hub', id, revision: 'main', endpoint });
        },
        { id: `bench/${shape.name}`, endpoint: hub.url, backend: cachedBackend },
      );
      await readyOrError(page2, `bench/${shape.name}`);
      return page2.evaluate(() => (globalThis as any).__loupe.models.model.loadMs as number);
    };
    note('cached_load_ms', Math.round(await load2()));
    note('cached_backend_ran', await page2.evaluate(() => (globalThis as any).__loupe.models.model.info.backend));
    note(
      'cached_weights_reason',
      await page2.evaluate(() => (globalThis as any).__loupe.models.model.info.weights_reason),
    );
    note('cached_requests', hub.log.length);
    note(
      'cached_first_trace_ms',
      await timed(
        page2.evaluate(
          async (prompt) =>
            (await (globalThis as any).__loupe.execute('trace', { prompt }, { who: 'page' })).ms as number,
          PROMPT,
        ),
      ),
    );
    note('peak_cached', chromiumPeak());
    if (cachedBackend === 'webgpu') note('gpu_process_peak_cached', chromiumPeak('gpu-process'));
    note('memory_cached', await page2.evaluate(() => (globalThis as any).__loupe.models.memory));
    await page2.close();
    if (!skip.has('memory'))
      note(
        'from_memory_session_ms',
        Math.round(await fromMemory(browser, dir, out.precision as WeightPrecision, Number(out.vocab_chunks ?? 1))),
      );
  } finally {
    await browser.close();
    rmSync(profile, { recursive: true, force: true });
    await hub.close();
    await site.close();
  }
  // the same first trace in Node on onnxruntime-web's WASM
  if (!skip.has('node')) {
    const r = spawnSync(
      process.execPath,
      ['--import', 'tsx', path.join(import.meta.dirname, 'memory-child.ts'), dir, 'wasm', weights, '{}'],
      { encoding: 'utf8', maxBuffer: 1 << 26 },
    );
    const line = r.stdout
      .trim()
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .pop();
    out.node_wasm = line ? JSON.parse(line) : { error: r.stderr.slice(-300) };
  }
  if (!args.includes('--keep')) rmSync(dir, { recursive: true, force: true });
  const n = (out.node_wasm ?? {}) as Record<string, number>;
  const w = out.weight_bytes as number;
  const f = (a: number, b: number) => (a / b).toFixed(2);
  console.log(JSON.stringify(out));
  const floor = Number(out.renderer_before);
  const head = [
    'shape',
    'backend',
    'weights',
    'load',
    'cached load / session from memory',
    'first trace (page, Node WASM, page / Node)',
    'renderer peak / weights',
  ];
  const sec = (ms: number) => (Number.isFinite(ms) ? `${(ms / 1000).toFixed(1)} s` : 'skipped');
  const ratio = (a: number, b: number) => (Number.isFinite(a / b) ? f(a, b) : 'skipped');
  const row = [
    `${shape.name}`,
    `${backend}`,
    `${out.precision}`,
    `cold ${sec(Number(out.cold_load_ms))} / cached ${sec(Number(out.cached_load_ms))} (${out.cached_requests} requests)`,
    `from memory ${sec(Number(out.from_memory_session_ms))} → cached / memory ${ratio(Number(out.cached_load_ms), Number(out.from_memory_session_ms))}`,
    `first trace page ${sec(Number(out.first_trace_ms))} (after a cached load ${sec(Number(out.cached_first_trace_ms))}), Node WASM ${sec(n.trace_ms)} → ${ratio(Number(out.first_trace_ms), n.trace_ms)}`,
    `renderer peak ${f(Number(out.peak_after_first), w)}× (cached ${f(Number(out.peak_cached), w)}×), Node WASM ${ratio(n.hwm_trace, n.weight_bytes)}×`,
  ];
  const peakNote = `renderer peak above the page before the model: ${f(Number(out.peak_after_first) - floor, w)}× the weights (cached ${f(Number(out.peak_cached) - floor, w)}×); the page before: ${(floor / 1e9).toFixed(2)} GB`;
  console.log(peakNote);
  console.log(mdTable({ head, rows: [row] }));
  record.save([{ head, rows: [row] }], [peakNote], out);
}
void main();
