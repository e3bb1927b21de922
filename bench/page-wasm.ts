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
import { buildModelGraph } from '../src/engine/graph/build-model';
import { loadModelFilesNode } from '../src/node/load-files-node';
import type { WeightSet } from '../src/engine/safetensors-types';
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

const HARNESS = `<!doctype html><meta charset="utf-8"><script type="module">
import * as ort from '/ort/ort.bundle.min.mjs';
window.bench = async ({ threads, Ts, reps, warmup, inputs, outputs, sites, nLayers, nKv, dHead, weightFile }) => {
  ort.env.wasm.numThreads = threads;
  ort.env.wasm.wasmPaths = '/ort/';
  const session = await ort.InferenceSession.create('/graph.onnx', { executionProviders: ['wasm'], graphOptimizationLevel: 'all', externalData: [{ path: weightFile, data: '/' + weightFile }] });
  const res = {};
  for (const T of Ts) {
    const ids = window.ids[T];
    const feeds = {};
    feeds.input_ids = new ort.Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, T]);
    if (inputs.includes('position_ids')) feeds.position_ids = new ort.Tensor('int64', BigInt64Array.from(ids.map((_, t) => BigInt(t))), [T]);
    const mask = new Float32Array(T * T);
    for (let i = 0; i < T; i++) for (let j = i + 1; j < T; j++) mask[i * T + j] = -Infinity;
    feeds.attn_mask = new ort.Tensor('float32', mask, [T, T]);
    feeds.logit_positions = new ort.Tensor('int64', BigInt64Array.from(ids.map((_, t) => BigInt(t))), [T]);
    for (let l = 0; l < nLayers; l++) {
      feeds['past.' + l + '.key'] = new ort.Tensor('float32', new Float32Array(0), [1, nKv, 0, dHead]);
      feeds['past.' + l + '.value'] = new ort.Tensor('float32', new Float32Array(0), [1, nKv, 0, dHead]);
    }
    for (const s of sites) { feeds[s + '::mul'] = new ort.Tensor('float32', new Float32Array([1]), [1]); feeds[s + '::add'] = new ort.Tensor('float32', new Float32Array([0]), [1]); }
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
    for (const threads of [...new Set([1, hc])]) {
      const page = await browser.newPage();
      await page.goto(`http://127.0.0.1:${port}/`);
      await page.waitForFunction(() => (window as any).ready === true);
      await page.evaluate(
        (ids) => {
          (window as any).ids = ids;
        },
        Object.fromEntries(Ts.map((T) => [T, randomIds(T, spec.dVocab, 1000 + T)])),
      );
      const r = (await page.evaluate((a) => (window as any).bench(a), {
        threads,
        Ts,
        reps,
        warmup: 2,
        inputs: graph.inputNames,
        outputs,
        sites: graph.sites,
        nLayers: spec.nLayers,
        nKv: spec.nKvHeads,
        dHead: spec.dHead,
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
