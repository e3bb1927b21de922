/**
 * `npm start` (after `vite build`): serve the built workbench (`dist/`) on
 * http://127.0.0.1:<port>, cross-origin isolated (COOP/COEP, see src/node/static-server.ts) so
 * onnxruntime-web can use threaded WASM, loopback only.
 *
 * Port: `--port N`, else $LOUPE_PORT, else $PORT, else 5178 — fixed by default so the page's
 * IndexedDB weight cache stays on one origin between runs.
 */
import { resolve } from 'node:path';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { startStaticServer, type StaticServer } from './static-server';

export const DEFAULT_PORT = 5178;
export const DIST = resolve(fileURLToPath(new URL('.', import.meta.url)), '../../dist');

export function parsePort(argv: string[], env: Record<string, string | undefined>): number {
  const i = argv.findIndex((a) => a === '--port' || a.startsWith('--port='));
  const raw =
    i < 0
      ? (env.LOUPE_PORT ?? env.PORT)
      : argv[i].includes('=')
        ? argv[i].slice(argv[i].indexOf('=') + 1)
        : argv[i + 1];
  if (raw === undefined || raw === '') return DEFAULT_PORT;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 0 || n > 65535) throw new Error(`bad port ${JSON.stringify(raw)}`);
  return n;
}

/** Serve a built page folder (the e2e suite calls this with port 0). */
export function serveWorkbench(port: number, root = DIST): Promise<StaticServer> {
  if (!existsSync(resolve(root, 'index.html'))) {
    return Promise.reject(new Error(`${root}/index.html does not exist: build the page first (npm run build).`));
  }
  return startStaticServer({ root, port, spaFallback: true });
}

async function main(): Promise<void> {
  let port: number;
  try {
    port = parsePort(process.argv.slice(2), process.env);
  } catch (e) {
    console.error(`loupe: ${(e as Error).message}`);
    process.exit(2);
  }
  try {
    const s = await serveWorkbench(port);
    console.log(`Loupe workbench: ${s.url}`);
    console.log('(cross-origin isolated, loopback only; Ctrl-C to stop)');
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    console.error(
      err.code === 'EADDRINUSE'
        ? `loupe: port ${port} is in use; pass --port N or set LOUPE_PORT.`
        : `loupe: ${err.message}`,
    );
    process.exit(1);
  }
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) void main();
