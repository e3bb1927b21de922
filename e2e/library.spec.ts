/**
 * The library's browser build in Chromium gives the same numbers as Node: src/library/browser.ts
 * bundled by Vite as a user's page would bundle it (e2e/library-page/entry.ts), docs/LIBRARY.md's
 * "find induction heads" example run as written (its import line swapped for the bundle, the model
 * served over HTTP) on the page's main thread and in a module Web Worker, against the same example
 * run by Node through the package's entry; and runWithHooks with x·sigmoid(x) at
 * blocks.0.hook_resid_mid against Node's logits.
 */
import { test, expect } from '@playwright/test';
import { execFileSync } from 'node:child_process';
import { createReadStream, existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import * as http from 'node:http';
import * as path from 'node:path';
import { build } from 'vite';
import { SHARED_MODELS } from './fixtures';
import { loadModel, tensor } from '../src/library';

const ROOT = process.cwd(); // playwright runs from the checkout's root
const SHARED = path.resolve(SHARED_MODELS, '..');
const OUT = path.join(ROOT, '.cache', 'library-browser');
const MODEL = path.resolve(SHARED_MODELS, 'induction-gpt2');
const DOC = readFileSync(path.join(ROOT, 'docs/LIBRARY.md'), 'utf8');
const EXAMPLE = /<!-- example: induction-heads -->\n```js\n([\s\S]*?)```/.exec(DOC)![1];
const PROMPT = 'The cat sat on the mat. The cat sat on';

const TYPES: Record<string, string> = {
  '.js': 'text/javascript',
  '.mjs': 'text/javascript',
  '.wasm': 'application/wasm',
  '.json': 'application/json',
  '.html': 'text/html',
};

function serve(): Promise<{ url: string; close: () => void }> {
  const roots: Record<string, string> = {
    lib: path.join(OUT, 'lib'),
    ort: path.join(ROOT, 'node_modules/onnxruntime-web/dist'),
    model: MODEL,
  };
  const server = http.createServer((req, res) => {
    const u = new URL(req.url ?? '/', 'http://x');
    if (u.pathname === '/') {
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end('<!doctype html><script type="module" src="/lib/loupe.js"></script>');
      return;
    }
    const [, top, ...rest] = u.pathname.split('/');
    const root = roots[top];
    const file = root && path.join(root, ...rest);
    if (!file || !file.startsWith(root) || !existsSync(file) || !statSync(file).isFile()) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, {
      'content-type': TYPES[path.extname(file)] ?? 'application/octet-stream',
      'content-length': statSync(file).size,
    });
    createReadStream(file).pipe(res);
  });
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      resolve({ url: `http://127.0.0.1:${port}`, close: () => server.close() });
    }),
  );
}

test('the library in Chromium: the induction-heads example and runWithHooks give Node’s numbers', async ({ page }) => {
  test.setTimeout(300_000);
  rmSync(OUT, { recursive: true, force: true });
  mkdirSync(OUT, { recursive: true });
  await build({
    configFile: false,
    logLevel: 'warn',
    build: {
      outDir: path.join(OUT, 'lib'),
      emptyOutDir: true,
      target: 'es2022',
      minify: false,
      lib: { entry: path.join(ROOT, 'e2e/library-page/entry.ts'), formats: ['es'], fileName: () => 'loupe.js' },
    },
  });
  // Node: the example through the package's entry, as docs/LIBRARY.md runs it
  const file = path.join(OUT, 'induction-heads.mjs');
  writeFileSync(file, EXAMPLE.replaceAll("'../shared/", `'${SHARED}/`));
  const nodeOut = execFileSync(process.execPath, [file], { cwd: ROOT, encoding: 'utf8' }).trim().split('\n');
  const model = await loadModel(MODEL);
  const ids = model.toTokens(PROMPT);
  const swish = (x: tensor.Tensor) => tensor.map(x, (v) => v / (1 + Math.exp(-v)));
  const nodeLogits = Array.from(
    (await model.runWithHooks(ids, { fwdHooks: [['blocks.0.hook_resid_mid', swish]] })).data,
  );
  await model.dispose();

  const { url, close } = await serve();
  try {
    const errors: string[] = [];
    page.on('pageerror', (e) => errors.push(e.message));
    await page.goto(url);
    await page.waitForFunction(() => 'loupe' in window);
    const body = EXAMPLE.replace(/^import .*$/m, 'const { loadModel, tensor } = loupe;').replaceAll(
      "'../shared/models/induction-gpt2'",
      `'${url}/model/'`,
    );
    // the example as written, on the page's main thread and in a module Web Worker
    const pageOut = (await page.evaluate(
      `(async () => { const logs = []; const console = { log: (...a) => logs.push(a.join(' ')) }; ` +
        `const loupe = window.loupe; ${body}; return logs; })()`,
    )) as string[];
    expect(pageOut).toEqual(nodeOut);
    const inWorker = (await page.evaluate(
      (code) =>
        new Promise((resolve) => {
          const w = new Worker('/lib/loupe.js', { type: 'module' });
          w.onmessage = (e) => (resolve(e.data), w.terminate());
          w.onerror = (e) => resolve({ error: e.message });
          w.postMessage(code);
        }),
      body,
    )) as { logs?: string[]; inWorker?: boolean; error?: string };
    expect(inWorker.error).toBeUndefined();
    expect(inWorker.inWorker).toBe(true);
    expect(inWorker.logs).toEqual(nodeOut);
    const pageLogits = (await page.evaluate(
      async ([u, prompt]) => {
        const { loadModel, tensor } = (window as any).loupe;
        const m = await loadModel(u);
        const swish = (x: any) => tensor.map(x, (v: number) => v / (1 + Math.exp(-v)));
        const l = await m.runWithHooks(m.toTokens(prompt), { fwdHooks: [['blocks.0.hook_resid_mid', swish]] });
        return { backend: m.cfg.device, data: Array.from(l.data as Float32Array) };
      },
      [`${url}/model/`, PROMPT],
    )) as { backend: string; data: number[] };
    expect(pageLogits.backend).toBe('wasm');
    expect(pageLogits.data.length).toBe(nodeLogits.length);
    let worst = 0;
    pageLogits.data.forEach((v, i) => (worst = Math.max(worst, Math.abs(v - nodeLogits[i]))));
    console.log(
      `induction scores in Chromium = Node: ${pageOut.join(' | ')}; runWithHooks logits max |Δ| ${worst.toExponential(2)}`,
    );
    expect(worst).toBeLessThan(1e-4);
    expect(errors).toEqual([]);
  } finally {
    close();
    rmSync(OUT, { recursive: true, force: true });
  }
});
