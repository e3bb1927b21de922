/**
 * `npm run preview`: serve the built page (`dist/`) as a free static host (GitHub Pages, a Hugging Face static
 * Space) does: under a sub-path (default /loupe/), with none of the cross-origin isolation headers, loopback only. What
 * a developer sees here is what users of a hosted copy get: the service worker makes the page isolated and offline.
 *
 *   npm run preview -- --port 4178 --base /loupe/
 */
import { resolve } from 'node:path';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { DIST } from './serve';
import { normalizeBasePath, startStaticServer, type StaticServer } from './static-server';

export const PREVIEW_PORT = 4178;
export const PREVIEW_BASE = '/loupe/';

function option(argv: string[], name: string): string | undefined {
  const i = argv.findIndex((a) => a === name || a.startsWith(`${name}=`));
  if (i < 0) return undefined;
  return argv[i].includes('=') ? argv[i].slice(argv[i].indexOf('=') + 1) : argv[i + 1];
}

export function parsePreviewArgs(argv: string[]): { port: number; base: string } {
  const rawPort = option(argv, '--port');
  const port = rawPort === undefined ? PREVIEW_PORT : Number(rawPort);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`bad port ${JSON.stringify(rawPort)}`);
  return { port, base: normalizeBasePath(option(argv, '--base') ?? PREVIEW_BASE) };
}

/** Serve a built page folder as a static host would (the e2e suite calls this with port 0). */
export function servePlain(port: number, base: string, root = DIST): Promise<StaticServer> {
  if (!existsSync(resolve(root, 'index.html')))
    return Promise.reject(new Error(`${root}/index.html does not exist: build the page first (npm run build).`));
  return startStaticServer({ root, port, basePath: base, isolation: false, spaFallback: false });
}

async function main(): Promise<void> {
  try {
    const { port, base } = parsePreviewArgs(process.argv.slice(2));
    const s = await servePlain(port, base);
    console.log(`Loupe as a static host serves it: ${s.url}`);
    console.log('(no isolation headers, loopback only; Ctrl-C to stop)');
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    console.error(err.code === 'EADDRINUSE' ? `loupe: that port is in use; pass --port N.` : `loupe: ${err.message}`);
    process.exit(1);
  }
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) void main();
