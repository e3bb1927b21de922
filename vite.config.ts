/**
 * Vite config for the workbench page.
 *
 * - The model runs in a module Web Worker (workers/engine.worker.ts), so workers are built as ES modules.
 * - onnxruntime-web's .wasm/.mjs runtime files are copied into `dist/ort/` and the worker points
 *   `ort.env.wasm.wasmPaths` there: the runtime always comes from our own origin, never a CDN.
 * - The dev server sends COOP/COEP so the page is cross-origin isolated (threaded WASM); `npm run preview` serves the
 *   build as a static host does (src/node/preview.ts).
 * - base './': every URL in the build is relative, so one dist/ works at / and under any sub-path.
 * - dist/sw.js, the page's service worker (src/sw/sw.ts), is built last with the shell inlined: every file of dist/
 *   and a version hashed from their bytes, so each build's worker differs and replaces the last one's cache whole.
 */
import { build, defineConfig, type Plugin, type Rollup } from 'vite';
import { svelte } from '@sveltejs/vite-plugin-svelte';
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join, relative, resolve, sep } from 'node:path';

const ORT_DIST = 'node_modules/onnxruntime-web/dist';
/**
 * The page's onnxruntime-web builds (chosen at run time by workers/ort-runtime.ts). onnxruntime-web 1.30 has two
 * WebGPU providers: the native one (ort.webgpu.min.mjs and the asyncify runtime: onnxruntime's C++ WebGPU provider
 * compiled to WASM with the CPU one), the page's, and JSEP (ort.min.mjs and the jsep runtime; deprecated since 1.29),
 * shipped as the fallback a load falls back to when the native build is missing or cannot create its session. The
 * fallback's runtime is not in the service worker's offline copy: it is fetched only when used. LOUPE_ORT_EP=native
 * or =jsep ships that build alone (for comparing); the native build is never shipped where this onnxruntime-web has
 * none. The other builds are never used.
 */
const NATIVE = { entry: 'ort.webgpu.min.mjs', runtime: 'asyncify' };
const JSEP = { entry: 'ort.min.mjs', runtime: 'jsep' };
const hasNative =
  existsSync(join(ORT_DIST, NATIVE.entry)) &&
  existsSync(join(ORT_DIST, `ort-wasm-simd-threaded.${NATIVE.runtime}.wasm`));
const wanted = process.env.LOUPE_ORT_EP;
export const ORT_BUILDS = {
  native: hasNative && wanted !== 'jsep',
  jsep: wanted !== 'native' || !hasNative,
};
const runtimeFiles = (b: { runtime: string }) =>
  readdirSync(ORT_DIST).filter(
    (f) => f === `ort-wasm-simd-threaded.${b.runtime}.mjs` || f === `ort-wasm-simd-threaded.${b.runtime}.wasm`,
  );
const ORT_FILES = [...(ORT_BUILDS.native ? runtimeFiles(NATIVE) : []), ...(ORT_BUILDS.jsep ? runtimeFiles(JSEP) : [])];
/** the fallback's runtime, left out of the offline copy */
const ORT_FALLBACK_FILES = ORT_BUILDS.native && ORT_BUILDS.jsep ? runtimeFiles(JSEP).map((f) => `ort/${f}`) : [];

export const isolationHeaders = {
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Embedder-Policy': 'require-corp',
  'Cross-Origin-Resource-Policy': 'same-origin',
};

/** Emit onnxruntime-web's runtime into /ort/ of the build, and serve it there in dev. */
function ortRuntime(): Plugin {
  return {
    name: 'loupe-ort-runtime',
    generateBundle() {
      for (const f of ORT_FILES) {
        this.emitFile({ type: 'asset', fileName: `ort/${f}`, source: readFileSync(join(ORT_DIST, f)) });
      }
    },
    configureServer(server) {
      server.middlewares.use((req, res, next) => {
        const m = req.url?.match(/^\/ort\/([^?]+)/);
        if (!m || !ORT_FILES.includes(m[1])) return next();
        res.setHeader('Content-Type', m[1].endsWith('.wasm') ? 'application/wasm' : 'text/javascript');
        res.end(readFileSync(join(ORT_DIST, m[1])));
      });
    },
  };
}

const SW_FILE = 'sw.js';

/** every file under dir, relative to root and with '/' separators */
function filesIn(dir: string, root = dir): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? filesIn(p, root) : [relative(root, p).split(sep).join('/')];
  });
}
const OUT_DIR = resolve('dist');

/** After the page is written: build src/sw/sw.ts into <outDir>/sw.js, one classic script, with the shell inlined. */
function serviceWorker(): Plugin {
  let outDir = OUT_DIR; // --outDir overrides it (the tests build into temporary folders)
  return {
    name: 'loupe-service-worker',
    apply: 'build',
    configResolved(c) {
      outDir = resolve(c.root, c.build.outDir);
    },
    async closeBundle() {
      const files = filesIn(outDir)
        .filter((f) => f !== SW_FILE && !ORT_FALLBACK_FILES.includes(f))
        .sort();
      const hash = createHash('sha256');
      for (const f of files) hash.update(`${f}\0`).update(readFileSync(join(outDir, f)));
      const shell = { version: hash.digest('hex').slice(0, 16), files };
      const out = (await build({
        configFile: false,
        logLevel: 'warn',
        define: { __LOUPE_SHELL__: JSON.stringify(shell) },
        build: {
          write: false,
          target: 'es2022',
          minify: true,
          lib: { entry: resolve('src/sw/sw.ts'), formats: ['iife'], name: 'loupeServiceWorker' },
        },
      })) as Rollup.RollupOutput | Rollup.RollupOutput[];
      const chunk = (Array.isArray(out) ? out[0] : out).output.find((o) => o.type === 'chunk');
      if (!chunk) throw new Error('the service worker build wrote no script');
      writeFileSync(join(outDir, SW_FILE), chunk.code);
    },
  };
}

export default defineConfig({
  plugins: [svelte(), ortRuntime(), serviceWorker()],
  resolve: {
    // The non-bundled build of onnxruntime-web (what its "onnxruntime-web-use-extern-wasm" export
    // condition selects): it imports the runtime glue from env.wasm.wasmPaths (our /ort/) instead of
    // embedding it and making Vite emit a second 28 MB copy of the .wasm.
    alias: [
      { find: /^onnxruntime-web$/, replacement: resolve(ORT_DIST, JSEP.entry) },
      { find: /^onnxruntime-web\/webgpu$/, replacement: resolve(ORT_DIST, NATIVE.entry) },
    ],
  },
  define: { __LOUPE_ORT_NATIVE__: String(ORT_BUILDS.native), __LOUPE_ORT_JSEP__: String(ORT_BUILDS.jsep) },
  base: './',
  publicDir: 'public',
  worker: { format: 'es' },
  build: {
    outDir: OUT_DIR,
    target: 'es2022',
    // the 28 MB wasm is an asset loaded by the worker on demand; don't warn about it
    chunkSizeWarningLimit: 1500,
    reportCompressedSize: true,
  },
  server: { host: '127.0.0.1', port: 5178, headers: isolationHeaders },
});
