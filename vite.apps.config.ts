/**
 * The MCP Apps views (src/bridge/apps.ts serves them as `ui://loupe/<op>`): one self-contained
 * HTML file per operation, dist/apps/<op>.html, built from the page's own view component for
 * that operation (src/ui/views/<Op>View.svelte) with src/ui/apps/ as its runtime.
 *
 * - `../state/instance` (the page's AppState with its model worker) resolves to
 *   src/ui/apps/instance.svelte.ts for the views and ChartFrame: no worker, no onnxruntime.
 * - Script and styles are inlined; the file loads nothing. Its CSP allows only that script (by
 *   its SHA-256), inline styles, and data:/blob: images; no connections, frames, forms or base.
 *
 * `tsx vite.apps.config.ts` builds every view (after `vite build`, which empties dist/);
 * `tsx vite.apps.config.ts trace attention` builds those; `--out DIR` writes elsewhere.
 */
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { svelte } from '@sveltejs/vite-plugin-svelte';
import { build, type InlineConfig, type Plugin } from 'vite';

const ROOT = fileURLToPath(new URL('.', import.meta.url));
const APPS = resolve(ROOT, 'src/ui/apps');
const VIEWS = resolve(ROOT, 'src/ui/views');
const VIEW_ID = 'virtual:loupe-app-view';

/** `logit_lens` → LogitLensView.svelte (as src/ui/views/registry.ts names them) */
const viewFile = (op: string) =>
  `${op
    .split('_')
    .map((w) => w.charAt(0).toUpperCase() + w.slice(1))
    .join('')}View.svelte`;

/** the operations that have a view: every *View.svelte but the JSON fallback */
export function viewOps(): string[] {
  return readdirSync(VIEWS)
    .filter((f) => /^[A-Z][A-Za-z]*View\.svelte$/.test(f) && f !== 'JsonView.svelte')
    .map((f) => f.slice(0, -'View.svelte'.length).replace(/[A-Z]/g, (c, i) => (i ? '_' : '') + c.toLowerCase()));
}

export const APP_CSP = (scriptHash: string) =>
  [
    "default-src 'none'",
    `script-src '${scriptHash}'`,
    "style-src 'unsafe-inline'",
    'img-src data: blob:',
    'font-src data:',
    "base-uri 'none'",
    "form-action 'none'",
    "frame-src 'none'",
    "object-src 'none'",
  ].join('; ');

/** The view component of `op` as the virtual module, and the app stand-in for the page's instance. */
function appModules(op: string): Plugin {
  return {
    name: 'loupe-app-modules',
    enforce: 'pre',
    resolveId(source, importer) {
      if (source === VIEW_ID) return resolve(VIEWS, viewFile(op));
      if (importer && /(^|\/)state\/instance(\.ts)?$/.test(source) && importer.startsWith(resolve(ROOT, 'src/ui')))
        return resolve(APPS, 'instance.svelte.ts');
      return null;
    },
  };
}

/** Inline the entry chunk and its CSS into the HTML, add the CSP, and name the file `<op>.html`. */
function singleFile(op: string): Plugin {
  return {
    name: 'loupe-app-single-file',
    enforce: 'post',
    generateBundle(_, bundle) {
      const htmlKey = Object.keys(bundle).find((k) => k.endsWith('.html'));
      if (!htmlKey) throw new Error('the apps build made no HTML');
      const htmlAsset = bundle[htmlKey] as { source: string | Uint8Array };
      let html = String(typeof htmlAsset.source === 'string' ? htmlAsset.source : Buffer.from(htmlAsset.source));
      let script = '';
      let css = '';
      for (const [k, out] of Object.entries(bundle)) {
        if (out.type === 'chunk') script += out.code;
        else if (k.endsWith('.css')) css += String(out.source);
        else if (k !== htmlKey) throw new Error(`the ${op} view would load a file (${k}): inline it`);
        delete bundle[k];
      }
      html = html
        .replace(/<script type="module"[^>]*src="[^"]*"[^>]*><\/script>\s*/g, '')
        .replace(/<link rel="stylesheet"[^>]*>\s*/g, '')
        .replace(/<link rel="modulepreload"[^>]*>\s*/g, '');
      if (/\s(src|href)="/.test(html)) throw new Error(`the ${op} view still references a file`);
      // a `</script` inside the code would end the element early
      script = script.replace(/<\/(script)/gi, '<\\/$1');
      const hash = `sha256-${createHash('sha256').update(script, 'utf8').digest('base64')}`;
      html = html
        .replace(
          '<meta charset="utf-8" />',
          `<meta charset="utf-8" />\n    <meta http-equiv="Content-Security-Policy" content="${APP_CSP(hash)}" />`,
        )
        // function replacers: the code holds `$&`-like sequences a replacement string would expand
        .replace('</head>', () => `<style>${css}</style>\n  </head>`)
        .replace('</body>', () => `<script type="module">${script}</script>\n  </body>`);
      this.emitFile({ type: 'asset', fileName: `${op}.html`, source: html });
    },
  };
}

export function appConfig(op: string, outDir = resolve(ROOT, 'dist/apps'), title = op): InlineConfig {
  const version = JSON.parse(readFileSync(resolve(ROOT, 'package.json'), 'utf8')).version as string;
  return {
    configFile: false,
    root: APPS,
    logLevel: 'warn',
    publicDir: false,
    plugins: [appModules(op), svelte(), singleFile(op)],
    define: {
      __LOUPE_APP_OP__: JSON.stringify(op),
      __LOUPE_APP_TITLE__: JSON.stringify(title),
      __LOUPE_VERSION__: JSON.stringify(version),
    },
    build: {
      outDir,
      emptyOutDir: false,
      target: 'es2022',
      modulePreload: false,
      cssCodeSplit: false,
      assetsInlineLimit: 100_000_000,
      reportCompressedSize: false,
      chunkSizeWarningLimit: 4000,
      rollupOptions: { input: resolve(APPS, 'index.html'), output: { codeSplitting: false } },
    },
  };
}

/** Build these operations' views (all by default); the file sizes in bytes. */
export async function buildApps(ops = viewOps(), outDir = resolve(ROOT, 'dist/apps')): Promise<Record<string, number>> {
  const sizes: Record<string, number> = {};
  for (const op of ops) {
    await build(appConfig(op, outDir));
    sizes[op] = statSync(resolve(outDir, `${op}.html`)).size;
  }
  return sizes;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const args = process.argv.slice(2);
  const o = args.indexOf('--out');
  const outDir = o >= 0 ? resolve(args[o + 1]) : undefined;
  const ops = args.filter((a, i) => !a.startsWith('--') && (o < 0 || i !== o + 1));
  const t0 = Date.now();
  const sizes = await buildApps(ops.length ? ops : undefined, outDir);
  for (const [op, n] of Object.entries(sizes)) console.log(`  ${op}.html ${(n / 1024).toFixed(1)} kB`);
  console.log(`built ${Object.keys(sizes).length} MCP Apps views in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
}
