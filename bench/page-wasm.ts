/**
 * onnxruntime-web WASM in Debian's Chromium (headless, playwright-core, never a downloaded browser)
 * on the bench model: the hooked graph fetching every hook, T = 16 and 128, with 1 thread and with
 * every core (navigator.hardwareConcurrency), as the page's worker sets it under cross-origin
 * isolation (workers/engine-adapter.ts). A loopback server gives the harness page COOP/COEP, the
 * onnxruntime-web bundle from node_modules, the graph and the weights file; each thread count
 * gets a fresh page (ORT-web fixes its thread pool when it starts).
 *
 *   tsx bench/page-wasm.ts <model dir> [--reps N]   → JSON on stdout
 */
import { createServer } from 'node:http';
import { createReadStream, existsSync, readFileSync, statSync } from 'node:fs';
import * as path from 'node:path';
import { chromium } from 'playwright-core';
import { describeModel } from '../src/engine/arch';
import { buildModelGraph, type BuiltGraph } from '../src/engine/graph/build-model';
import { loadModelFilesNode } from '../src/node/load-files-node';
import type { WeightSet } from '../src/engine/safetensors-types';
import type { ModelSpec } from '../src/engine/spec';
import { buildFeeds } from '../src/engine/runtime/feeds';
import type { OrtModule } from '../src/engine/runtime/ort-session';
import { ROOT, median } from './lib';
import { randomIds } from './model-gen';

const CHROMIUM = process.env.LOUPE_CHROMIUM ?? '/usr/bin/chromium';

export interface PageWasmResult {
  hardware_concurrency: number;
  cross_origin_isolated: boolean;
  /** per thread count, per T: median ms of the all-hooks run */
  runs: Record<string, Record<string, { median_ms: number; samples_ms: number[] }>>;
  n_outputs: number;
}

/** a feed as it crosses into the page: plain numbers (page.evaluate does not carry a BigInt64Array) */
export interface WireTensor {
  type: string;
  dims: number[];
  data: number[];
}

/**
 * The hooked graph's feeds for these token rows, every hook site at identity, from the engine's one
 * builder (runtime/feeds.ts buildFeeds), so an input the graph gains is fed here too.
 */
export function wireFeeds(spec: ModelSpec, graph: BuiltGraph, rows: number[][]): Record<string, WireTensor> {
  const Tensor = class {
    constructor(
      readonly type: string,
      readonly data: ArrayLike<number | bigint>,
      readonly dims: readonly number[],
    ) {}
  };
  const ort = { Tensor, InferenceSession: { create: () => Promise.reject(new Error('feeds only')) } };
  const feeds = buildFeeds(ort as unknown as OrtModule, spec, graph, { rows, sites: new Map() });
  return Object.fromEntries(
    Object.entries(feeds).map(([name, t]) => {
      const { type, data, dims } = t as InstanceType<typeof Tensor>;
      return [name, { type, dims: [...dims], data: Array.from(data, Number) }];
    }),
  );
}

/** the page's side of wireFeeds (JS source, run in the harness and by tests/bench-page-feeds in Node) */
export const FROM_WIRE = `(ort, wire) => Object.fromEntries(Object.entries(wire).map(([name, f]) => [name,
  new ort.Tensor(f.type, f.type === 'int64' ? BigInt64Array.from(f.data, BigInt) : Float32Array.from(f.data), f.dims)]))`;

const HARNESS = `<!doctype html><meta charset="utf-8"><script type="module">
import * as ort from '/ort/ort.bundle.min.mjs';
window.bench = async ({ threads, Ts, reps, warmup, feedsByT, outputs, weightFile }) => {
  ort.env.wasm.numThreads = threads;
  ort.env.wasm.wasmPaths = '/ort/';
  const session = await ort.InferenceSession.create('/graph.onnx', { executionProviders: ['wasm'], graphOptimizationLevel: 'all', externalData: [{ path: weightFile, data: '/' + weightFile }] });
  const fromWire = ${FROM_WIRE};
  const res = {};
  for (const T of Ts) {
    const feeds = fromWire(ort, feedsByT[T]);
    for (let w = 0; w < warmup; w++) await session.run(feeds, outputs);
    const samples = [];
    for (let r = 0; r < reps; r++) { const t0 = performance.now(); await session.run(feeds, outputs); samples.push(performance.now() - t0); }
    res[T] = samples;
  }
  await session.release();
  return { res, hc: navigator.hardwareConcurrency, isolated: crossOriginIsolated };
};
window.ready = true;
</script>`;

export async function pageWasm(dir: string, reps = 5, Ts = [16, 128]): Promise<PageWasmResult> {
  if (!existsSync(CHROMIUM)) throw new Error(`no Chromium at ${CHROMIUM}`);
  const files = await loadModelFilesNode(dir);
  const weights = files.weights as WeightSet;
  const spec = describeModel({ config: files.config as Record<string, any>, tensors: weights.tensors });
  const graph = buildModelGraph(spec, weights.tensors, { hooks: true, withResult: false });
  const [weightFile, weightPath] = [...weights.paths][0];
  const ortDir = path.join(ROOT, 'node_modules', 'onnxruntime-web', 'dist');
  const server = createServer((req, res) => {
    const url = (req.url ?? '/').split('?')[0];
    const h = {
      'Cross-Origin-Opener-Policy': 'same-origin',
      'Cross-Origin-Embedder-Policy': 'require-corp',
      'Cross-Origin-Resource-Policy': 'same-origin',
    };
    const send = (type: string, body: Buffer | Uint8Array | string) => {
      res.writeHead(200, { ...h, 'Content-Type': type });
      res.end(body);
    };
    if (url === '/') return send('text/html', HARNESS);
    if (url === '/graph.onnx') return send('application/octet-stream', graph.bytes);
    if (url === `/${weightFile}`) {
      res.writeHead(200, {
        ...h,
        'Content-Type': 'application/octet-stream',
        'Content-Length': statSync(weightPath).size,
      });
      return void createReadStream(weightPath).pipe(res);
    }
    const m = /^\/ort\/([\w.-]+)$/.exec(url);
    if (m && existsSync(path.join(ortDir, m[1])))
      return send(
        m[1].endsWith('.wasm') ? 'application/wasm' : 'text/javascript',
        readFileSync(path.join(ortDir, m[1])),
      );
    res.writeHead(404, h);
    res.end();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  try {
    const out: PageWasmResult = {
      hardware_concurrency: 0,
      cross_origin_isolated: false,
      runs: {},
      n_outputs: graph.outputNames.length,
    };
    const probe = await browser.newPage();
    await probe.goto(`http://127.0.0.1:${port}/`);
    const hc = await probe.evaluate(() => navigator.hardwareConcurrency);
    await probe.close();
    const outputs = graph.outputNames.filter((n) => !n.startsWith('present.'));
    const feedsByT = Object.fromEntries(
      Ts.map((T) => [T, wireFeeds(spec, graph, [randomIds(T, spec.dVocab, 1000 + T)])]),
    );
    for (const threads of [...new Set([1, hc])]) {
      const page = await browser.newPage();
      await page.goto(`http://127.0.0.1:${port}/`);
      await page.waitForFunction(() => (window as any).ready === true);
      const r = (await page.evaluate((a) => (window as any).bench(a), {
        threads,
        Ts,
        reps,
        warmup: 2,
        feedsByT,
        outputs,
        weightFile,
      })) as { res: Record<string, number[]>; hc: number; isolated: boolean };
      out.hardware_concurrency = r.hc;
      out.cross_origin_isolated = r.isolated;
      out.runs[String(threads)] = Object.fromEntries(
        Object.entries(r.res).map(([T, s]) => [
          T,
          { median_ms: median(s), samples_ms: s.map((x) => Math.round(x * 10) / 10) },
        ]),
      );
      process.stderr.write(
        `  [page wasm] ${threads} thread(s): ${Object.entries(r.res)
          .map(([T, s]) => `T=${T} ${median(s).toFixed(1)} ms`)
          .join(', ')}\n`,
      );
      await page.close();
    }
    return out;
  } finally {
    await browser.close();
    server.close();
  }
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(new URL(import.meta.url).pathname)) {
  const dir = process.argv[2];
  const reps = Number(process.argv.find((a) => a.startsWith('--reps='))?.slice(7) ?? 5);
  pageWasm(dir, reps).then(
    (r) => {
      process.stdout.write(JSON.stringify(r) + '\n');
    },
    (e) => {
      console.error(e);
      process.exit(1);
    },
  );
}
