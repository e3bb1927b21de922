/** The page's service worker's response work (src/sw/shell.ts): isolation headers, which cached file answers, ranges. */
import { describe, expect, it } from 'vitest';
import { cacheName, rangeFromCache, shellFile, withIsolation } from '../src/sw/shell';

const SCOPE = 'https://user.github.io/loupe/';
const FILES = new Set(['index.html', 'assets/index-abc.js', 'models/stories260K/model.safetensors', 'ort/a b.wasm']);

describe('withIsolation', () => {
  it('adds COOP/COEP/CORP and keeps status, type and body', async () => {
    const r = withIsolation(
      new Response('abc', { status: 206, headers: { 'Content-Type': 'application/wasm', 'Content-Range': 'x' } }),
    );
    expect(r.status).toBe(206);
    expect(r.headers.get('cross-origin-opener-policy')).toBe('same-origin');
    expect(r.headers.get('cross-origin-embedder-policy')).toBe('require-corp');
    expect(r.headers.get('cross-origin-resource-policy')).toBe('same-origin');
    expect(r.headers.get('content-type')).toBe('application/wasm');
    expect(r.headers.get('content-range')).toBe('x');
    expect(await r.text()).toBe('abc');
  });
  it('answers a 304 or 204 with no body', () => {
    expect(withIsolation(new Response(null, { status: 204 })).status).toBe(204);
  });
});

describe('shellFile', () => {
  it('maps a navigation to the scope (any query) to index.html, files by their path, nothing outside', () => {
    expect(shellFile(SCOPE, SCOPE, FILES, true)).toBe('index.html');
    expect(shellFile(`${SCOPE}?wasm_threads=1#s=x`, SCOPE, FILES, true)).toBe('index.html');
    expect(shellFile(`${SCOPE}index.html`, SCOPE, FILES, true)).toBe('index.html');
    expect(shellFile(`${SCOPE}assets/index-abc.js`, SCOPE, FILES, false)).toBe('assets/index-abc.js');
    expect(shellFile(`${SCOPE}ort/a%20b.wasm`, SCOPE, FILES, false)).toBe('ort/a b.wasm');
    expect(shellFile(`${SCOPE}assets/other.js`, SCOPE, FILES, false)).toBeUndefined();
    expect(shellFile('https://user.github.io/other/index.html', SCOPE, FILES, true)).toBeUndefined();
    // the scope itself is not a file: only a navigation gets index.html
    expect(shellFile(SCOPE, SCOPE, FILES, false)).toBeUndefined();
  });
  it('names caches by version', () => expect(cacheName('abc')).toBe('loupe-shell-abc'));
});

describe('rangeFromCache', () => {
  const file = () => new Response('0123456789', { headers: { 'Content-Type': 'application/octet-stream' } });
  it('cuts a 206 with Content-Range from a cached whole file', async () => {
    const r = await rangeFromCache(file(), 'bytes=0-7');
    expect(r.status).toBe(206);
    expect(r.headers.get('content-range')).toBe('bytes 0-7/10');
    expect(r.headers.get('content-length')).toBe('8');
    expect(await r.text()).toBe('01234567');
    expect(await (await rangeFromCache(file(), 'bytes=8-')).text()).toBe('89');
  });
  it('416 past the end, the whole file with no or an unanswerable Range', async () => {
    const past = await rangeFromCache(file(), 'bytes=10-');
    expect(past.status).toBe(416);
    expect(past.headers.get('content-range')).toBe('bytes */10');
    expect(await (await rangeFromCache(file(), null)).text()).toBe('0123456789');
    const multi = await rangeFromCache(file(), 'bytes=0-1,4-5');
    expect(multi.status).toBe(200);
    expect(await multi.text()).toBe('0123456789');
  });
});
