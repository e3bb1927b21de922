/** The test Hub server itself (reused by browser tests) and HTTP edge cases of HttpSource. */
import 'fake-indexeddb/auto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import * as net from 'node:net';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LoupeError } from '../src/engine/errors';
import { HubSource } from '../src/engine/source/hub-source';
import { IdbCache } from '../src/engine/source/idb-cache';
import type { FileProgress } from '../src/engine/source/types';
import { startHubServer, type HubServer } from './helpers/hub-server';

const tmp = mkdtempSync(path.join(tmpdir(), 'loupe-http-'));
const payload = new Uint8Array(5000).map((_, i) => (i * 13) & 0xff);
let hub: HubServer;

beforeAll(async () => {
  writeFileSync(path.join(tmp, 'blob.bin'), payload);
  hub = await startHubServer();
  hub.addRepo('o/r', tmp);
});
afterAll(async () => {
  await hub.close();
  rmSync(tmp, { recursive: true, force: true });
});

const url = (f: string) => `${hub.url}/o/r/resolve/main/${f}`;

describe('hub-server helper', () => {
  it('serves with CORS / CORP headers, answers preflight, and counts bytes', async () => {
    hub.resetCounters();
    const res = await fetch(url('blob.bin'));
    expect(res.status).toBe(200);
    expect(res.headers.get('access-control-allow-origin')).toBe('*');
    expect(res.headers.get('cross-origin-resource-policy')).toBe('cross-origin');
    expect(res.headers.get('access-control-expose-headers')).toMatch(/Content-Range/);
    expect(res.headers.get('access-control-expose-headers')).toMatch(/ETag/);
    expect(res.headers.get('content-length')).toBe('5000');
    expect(new Uint8Array(await res.arrayBuffer())).toEqual(payload);
    const pre = await fetch(url('blob.bin'), { method: 'OPTIONS' });
    expect(pre.status).toBe(204);
    expect(pre.headers.get('access-control-allow-headers')).toMatch(/Range/);
    expect(pre.headers.get('access-control-allow-headers')).toMatch(/Authorization/);
    expect(hub.stats('o/r', 'blob.bin')).toMatchObject({ requests: 1, bytes: 5000 });
  });

  it('ranges: 206 with Content-Range, If-Range, 416', async () => {
    const etag = (await fetch(url('blob.bin'))).headers.get('etag')!;
    const r = await fetch(url('blob.bin'), { headers: { Range: 'bytes=4000-' } });
    expect(r.status).toBe(206);
    expect(r.headers.get('content-range')).toBe('bytes 4000-4999/5000');
    expect(new Uint8Array(await r.arrayBuffer())).toEqual(payload.slice(4000));
    const ok = await fetch(url('blob.bin'), { headers: { Range: 'bytes=10-19', 'If-Range': etag } });
    expect(ok.status).toBe(206);
    expect(new Uint8Array(await ok.arrayBuffer())).toEqual(payload.slice(10, 20));
    const stale = await fetch(url('blob.bin'), { headers: { Range: 'bytes=10-', 'If-Range': '"other"' } });
    expect(stale.status).toBe(200);
    await stale.arrayBuffer();
    const bad = await fetch(url('blob.bin'), { headers: { Range: 'bytes=9000-' } });
    expect(bad.status).toBe(416);
    await bad.arrayBuffer();
  });

  it('404s say whether the repository or the file is missing', async () => {
    const a = await fetch(`${hub.url}/nobody/x/resolve/main/config.json`);
    expect([a.status, a.headers.get('x-error-code')]).toEqual([404, 'RepositoryNotFound']);
    const b = await fetch(url('nope.json'));
    expect([b.status, b.headers.get('x-error-code')]).toEqual([404, 'EntryNotFound']);
    const c = await fetch(`${hub.url}/o/r/resolve/v9/blob.bin`);
    expect(c.headers.get('x-error-code')).toBe('RevisionNotFound');
    const e = await new HubSource('o/r', { endpoint: hub.url, revision: 'v9' }).fetchFile('blob.bin').catch((x) => x);
    expect(e.code).toBe('MODEL_NOT_FOUND');
  });

  it('close() ends stalled connections', async () => {
    const h = await startHubServer();
    h.addRepo('o/r', tmp);
    h.fault('o/r', 'blob.bin', { stallAfter: 100 });
    const res = await fetch(`${h.url}/o/r/resolve/main/blob.bin`);
    const reader = res.body!.getReader();
    const first = await reader.read();
    expect(first.value!.byteLength).toBe(100);
    const pending = reader.read().then(
      () => 'ended',
      () => 'errored',
    );
    await h.close();
    expect(['ended', 'errored']).toContain(await pending);
  });
});

describe('HttpSource edge cases (injected fetch)', () => {
  it('a body longer than its Content-Length (hidden compression) is accepted with an unknown size', async () => {
    const body = new TextEncoder().encode(JSON.stringify({ model_type: 'x', pad: 'a'.repeat(500) }));
    const fakeFetch = (async () =>
      new Response(body, { status: 200, headers: { 'content-length': '40' } })) as typeof fetch;
    const events: FileProgress[] = [];
    const got = await new HubSource('o/r', { endpoint: 'http://127.0.0.1:1', fetch: fakeFetch }).fetchFile(
      'config.json',
      { onProgress: (p) => events.push(p) },
    );
    expect(got).toEqual(body);
    expect(events[events.length - 1]).toMatchObject({ loaded: body.byteLength, total: body.byteLength, done: true });
  });

  it('a 206 that starts elsewhere than asked restarts from zero once', async () => {
    const calls: (string | null)[] = [];
    const fakeFetch = (async (_u: string, init?: RequestInit) => {
      const range = new Headers(init?.headers).get('range');
      calls.push(range);
      if (range)
        return new Response(payload.slice(10), {
          status: 206,
          headers: { 'content-range': 'bytes 10-4999/5000', 'content-length': '4990' },
        });
      return new Response(payload, { status: 200, headers: { 'content-length': '5000', etag: '"e"' } });
    }) as unknown as typeof fetch;
    const cache = new IdbCache({ dbName: `edge-${Math.random()}` });
    const src = new HubSource('o/r', { endpoint: 'http://127.0.0.1:1', fetch: fakeFetch });
    await cache.putPartial(src.cacheKey('blob.bin'), payload.slice(0, 2000), { etag: '"e"', total: 5000 });
    const events: FileProgress[] = [];
    const got = await src.fetchFile('blob.bin', { cache, onProgress: (p) => events.push(p) });
    expect(got).toEqual(payload);
    expect(calls).toEqual(['bytes=2000-', null]);
    expect(events.some((e) => e.restarted)).toBe(true);
  });

  it('a server that resets every connection gives NETWORK_ERROR after the retries', async () => {
    const srv = net.createServer((s) => s.destroy());
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    const port = (srv.address() as net.AddressInfo).port;
    let n = 0;
    const counting = ((...a: Parameters<typeof fetch>) => {
      n++;
      return fetch(...a);
    }) as typeof fetch;
    const e = await new HubSource('o/r', {
      endpoint: `http://127.0.0.1:${port}`,
      fetch: counting,
      retries: 2,
      retryDelayMs: 1,
    })
      .fetchFile('config.json')
      .catch((x) => x);
    srv.close();
    expect(e).toBeInstanceOf(LoupeError);
    expect(e.code).toBe('NETWORK_ERROR');
    expect(n).toBe(3);
  });
});
