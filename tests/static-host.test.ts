/**
 * The built page served as a free static host serves it (`npm run preview`, src/node/preview.ts): under a sub-path,
 * with none of the isolation headers, byte ranges answered; `npm start`'s server keeps its headers.
 */
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { normalizeBasePath, startStaticServer, type StaticServer } from '../src/node/static-server';
import { byteRange } from '../src/engine/source/byte-range';
import { parsePreviewArgs, servePlain } from '../src/node/preview';

let root: string;
beforeAll(() => {
  root = mkdtempSync(path.join(os.tmpdir(), 'loupe-static-host-'));
  writeFileSync(path.join(root, 'index.html'), 'index');
  mkdirSync(path.join(root, 'models'));
  writeFileSync(path.join(root, 'models', 'w.bin'), '0123456789');
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

const get = (url: string, headers: Record<string, string> = {}) => fetch(url, { headers, redirect: 'manual' });

describe('byteRange', () => {
  it('reads one range, a suffix and an open end; refuses ranges outside the file; ignores what it cannot answer', () => {
    expect(byteRange('bytes=2-4', 10)).toEqual([2, 4]);
    expect(byteRange('bytes=8-', 10)).toEqual([8, 9]);
    expect(byteRange('bytes=5-99', 10)).toEqual([5, 9]);
    expect(byteRange('bytes=-3', 10)).toEqual([7, 9]);
    expect(byteRange('bytes=10-', 10)).toBeNull();
    expect(byteRange('bytes=4-2', 10)).toBeNull();
    expect(byteRange('bytes=-0', 10)).toBeNull();
    expect(byteRange(undefined, 10)).toBeUndefined();
    expect(byteRange('bytes=0-1,3-4', 10)).toBeUndefined();
    expect(byteRange('items=0-1', 10)).toBeUndefined();
  });
});

describe('base paths', () => {
  it('normalises and refuses dot segments', () => {
    expect(normalizeBasePath('loupe')).toBe('/loupe/');
    expect(normalizeBasePath('/a/b')).toBe('/a/b/');
    expect(normalizeBasePath('')).toBe('/');
    expect(() => normalizeBasePath('/a/../b')).toThrow(/bad base path/);
    expect(parsePreviewArgs([])).toEqual({ port: 4178, base: '/loupe/' });
    expect(parsePreviewArgs(['--port=0', '--base', 'x/y'])).toEqual({ port: 0, base: '/x/y/' });
    expect(() => parsePreviewArgs(['--port', 'abc'])).toThrow(/bad port/);
  });
});

describe('servePlain (npm run preview)', () => {
  let s: StaticServer;
  beforeAll(async () => {
    s = await servePlain(0, '/sub/path/', root);
  });
  afterAll(() => s.close());

  it('serves under the sub-path only, with no isolation headers', async () => {
    expect(s.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/sub\/path\/$/);
    const page = await get(s.url);
    expect(page.status).toBe(200);
    expect(await page.text()).toBe('index');
    for (const h of ['cross-origin-opener-policy', 'cross-origin-embedder-policy', 'cross-origin-resource-policy'])
      expect(page.headers.get(h), h).toBeNull();
    expect((await get(`${s.url}models/w.bin`)).status).toBe(200);
    // outside the sub-path, and the old absolute /assets/ URLs: 404
    expect((await get(new URL('/models/w.bin', s.url).href)).status).toBe(404);
    expect((await get(new URL('/index.html', s.url).href)).status).toBe(404);
    // the sub-path without its slash: a redirect to it, keeping the query
    const r = await get(new URL('/sub/path?x=1', s.url).href);
    expect(r.status).toBe(301);
    expect(r.headers.get('location')).toBe('/sub/path/?x=1');
    // no single-page fallback: a missing file is a 404, as on a static host
    expect((await get(`${s.url}nothing-here`)).status).toBe(404);
  });

  it('answers byte ranges with 206 and Content-Range, 416 past the end, the whole file under If-Range', async () => {
    const part = await get(`${s.url}models/w.bin`, { Range: 'bytes=3-5' });
    expect(part.status).toBe(206);
    expect(part.headers.get('content-range')).toBe('bytes 3-5/10');
    expect(await part.text()).toBe('345');
    const past = await get(`${s.url}models/w.bin`, { Range: 'bytes=10-' });
    expect(past.status).toBe(416);
    expect(past.headers.get('content-range')).toBe('bytes */10');
    const ifr = await get(`${s.url}models/w.bin`, { Range: 'bytes=3-5', 'If-Range': '"x"' });
    expect(ifr.status).toBe(200);
    expect(await ifr.text()).toBe('0123456789');
  });
});

describe("npm start's server", () => {
  it('still sends COOP/COEP/CORP at /', async () => {
    const s = await startStaticServer({ root });
    try {
      const r = await get(s.url);
      expect(r.headers.get('cross-origin-opener-policy')).toBe('same-origin');
      expect(r.headers.get('cross-origin-embedder-policy')).toBe('require-corp');
      expect(r.headers.get('cross-origin-resource-policy')).toBe('same-origin');
    } finally {
      await s.close();
    }
  });
});
