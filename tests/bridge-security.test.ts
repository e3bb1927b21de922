/**
 * The hub's security checks, each with a request that must be refused, next to the one request
 * that must pass (so a refusal cannot come from a broken endpoint).
 */
import { mkdtempSync, statSync, writeFileSync, mkdirSync, chmodSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Hub } from '../src/bridge/hub';
import { SUBPROTOCOL, tokenProtocol, AGENT_PATH } from '../src/bridge/protocol';
import { readHubRecord, writeHubRecord, newToken, tokenFilePath } from '../src/bridge/token';
import { startStaticServer } from '../src/node/static-server';
import { startTestHub, tryUpgrade } from './bridge-fake-page';

let hub: Hub;
let good: Record<string, string>;

beforeAll(async () => {
  hub = await startTestHub();
  good = {
    Host: `127.0.0.1:${hub.port}`,
    Origin: `http://127.0.0.1:${hub.port}`,
    'Sec-WebSocket-Protocol': `${SUBPROTOCOL}, ${tokenProtocol(hub.token)}`,
  };
});
afterAll(() => hub.close());

describe('WebSocket upgrade checks (before upgrading)', () => {
  it('accepts the right token, the hub origin and a loopback Host', async () => {
    expect(await tryUpgrade(hub.port, good)).toBe(101);
    expect(
      await tryUpgrade(hub.port, { ...good, Host: `localhost:${hub.port}`, Origin: `http://localhost:${hub.port}` }),
    ).toBe(101);
    expect(await tryUpgrade(hub.port, good, AGENT_PATH)).toBe(101);
  });

  it('rejects a wrong token', async () => {
    const wrong = newToken();
    expect(
      await tryUpgrade(hub.port, { ...good, 'Sec-WebSocket-Protocol': `${SUBPROTOCOL}, ${tokenProtocol(wrong)}` }),
    ).toBe(401);
    // a prefix of the right token, and the right token offered twice with a wrong one
    expect(
      await tryUpgrade(hub.port, {
        ...good,
        'Sec-WebSocket-Protocol': `${SUBPROTOCOL}, ${tokenProtocol(hub.token.slice(0, 63))}`,
      }),
    ).toBe(401);
    expect(
      await tryUpgrade(hub.port, {
        ...good,
        'Sec-WebSocket-Protocol': `${SUBPROTOCOL}, ${tokenProtocol(wrong)}, ${tokenProtocol(hub.token)}`,
      }),
    ).toBe(401);
  });

  it('rejects a missing token', async () => {
    expect(await tryUpgrade(hub.port, { ...good, 'Sec-WebSocket-Protocol': SUBPROTOCOL })).toBe(401);
    expect(await tryUpgrade(hub.port, { ...good, 'Sec-WebSocket-Protocol': undefined })).toBe(400);
  });

  it('rejects a token sent in the URL instead of the subprotocol', async () => {
    expect(
      await tryUpgrade(hub.port, { ...good, 'Sec-WebSocket-Protocol': SUBPROTOCOL }, `/ws/page?token=${hub.token}`),
    ).toBe(401);
  });

  it('rejects a foreign Origin', async () => {
    expect(await tryUpgrade(hub.port, { ...good, Origin: 'http://evil.example' })).toBe(403);
    expect(await tryUpgrade(hub.port, { ...good, Origin: `http://evil.example:${hub.port}` })).toBe(403);
    expect(await tryUpgrade(hub.port, { ...good, Origin: `http://127.0.0.1:${hub.port + 1}` })).toBe(403);
    expect(await tryUpgrade(hub.port, { ...good, Origin: `https://127.0.0.1:${hub.port}` })).toBe(403);
    // origin of the other loopback name than the Host used: not this page's own origin
    expect(await tryUpgrade(hub.port, { ...good, Origin: `http://localhost:${hub.port}` })).toBe(403);
  });

  it('rejects no Origin', async () => {
    expect(await tryUpgrade(hub.port, { ...good, Origin: undefined })).toBe(403);
  });

  it('rejects Origin: null', async () => {
    expect(await tryUpgrade(hub.port, { ...good, Origin: 'null' })).toBe(403);
  });

  it('rejects a foreign Host (DNS rebinding), even with the right token and a matching Origin', async () => {
    expect(
      await tryUpgrade(hub.port, {
        ...good,
        Host: `evil.example:${hub.port}`,
        Origin: `http://evil.example:${hub.port}`,
      }),
    ).toBe(403);
    expect(await tryUpgrade(hub.port, { ...good, Host: `127.0.0.1:${hub.port + 1}` })).toBe(403);
    expect(await tryUpgrade(hub.port, { ...good, Host: '127.0.0.1' })).toBe(403);
    expect(
      await tryUpgrade(hub.port, { ...good, Host: `0.0.0.0:${hub.port}`, Origin: `http://0.0.0.0:${hub.port}` }),
    ).toBe(403);
  });

  it('rejects other paths', async () => {
    expect(await tryUpgrade(hub.port, good, '/ws/other')).toBe(404);
  });
});

describe('HTTP side of the hub', () => {
  const get = (port: number, p: string, host: string) =>
    new Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }>((resolve, reject) => {
      http
        .get({ host: '127.0.0.1', port, path: p, headers: { Host: host } }, (res) => {
          let body = '';
          res.on('data', (c) => (body += c));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
        })
        .on('error', reject);
    });

  it('listens on 127.0.0.1 only', () => {
    const a = hub.server.address();
    expect(a && typeof a === 'object' ? a.address : a).toBe('127.0.0.1');
  });

  it('serves the page cross-origin isolated, and refuses a foreign Host', async () => {
    const ok = await get(hub.port, '/', `127.0.0.1:${hub.port}`);
    expect(ok.status).toBe(200);
    expect(ok.body).toContain('Loupe test page');
    expect(ok.headers['cross-origin-opener-policy']).toBe('same-origin');
    expect(ok.headers['cross-origin-embedder-policy']).toBe('require-corp');
    expect((await get(hub.port, '/', `evil.example:${hub.port}`)).status).toBe(403);
  });

  it('the hub probe carries no token', async () => {
    const r = await get(hub.port, '/.well-known/loupe-hub', `127.0.0.1:${hub.port}`);
    expect(r.status).toBe(200);
    expect(JSON.parse(r.body).service).toBe('loupe-hub');
    expect(r.body).not.toContain(hub.token);
  });
});

describe('static server', () => {
  it('refuses path traversal and serves files with isolation headers on 127.0.0.1', async () => {
    const root = mkdtempSync(path.join(os.tmpdir(), 'loupe-static-'));
    writeFileSync(path.join(root, 'index.html'), 'index');
    writeFileSync(path.join(root, 'app.js'), 'js');
    writeFileSync(path.join(os.tmpdir(), 'loupe-secret.txt'), 'secret');
    const s = await startStaticServer({ root });
    try {
      expect((s.server.address() as { address: string }).address).toBe('127.0.0.1');
      const raw = (p: string) =>
        new Promise<{ status: number; body: string; type?: string; coep?: string }>((resolve, reject) => {
          // a raw request so the client does not normalise the path
          const req = http.request(
            { host: '127.0.0.1', port: s.port, path: p, headers: { Host: `127.0.0.1:${s.port}` } },
            (res) => {
              let body = '';
              res.on('data', (c) => (body += c));
              res.on('end', () =>
                resolve({
                  status: res.statusCode ?? 0,
                  body,
                  type: res.headers['content-type'],
                  coep: res.headers['cross-origin-embedder-policy'] as string,
                }),
              );
            },
          );
          req.on('error', reject);
          req.end();
        });
      const js = await raw('/app.js');
      expect(js.status).toBe(200);
      expect(js.type).toContain('javascript');
      expect(js.coep).toBe('require-corp');
      for (const p of [
        '/../loupe-secret.txt',
        '/%2e%2e/loupe-secret.txt',
        '/..%2floupe-secret.txt',
        '/a/../../loupe-secret.txt',
        '/%00',
      ]) {
        const r = await raw(p);
        expect(r.body, p).not.toContain('secret');
        expect(r.status, p).toBeGreaterThanOrEqual(400);
      }
    } finally {
      await s.close();
    }
  });
});

describe('token file hand-off', () => {
  it('is written 0600 in a 0700 folder and refused when others can read it', async () => {
    if (process.platform === 'win32') return;
    const dir = path.join(mkdtempSync(path.join(os.tmpdir(), 'loupe-cfg-')), 'loupe');
    const token = newToken();
    const file = await writeHubRecord(
      { port: 5999, pid: process.pid, token, started_at: new Date().toISOString() },
      dir,
    );
    expect(statSync(file).mode & 0o777).toBe(0o600);
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    expect((await readHubRecord(5999, dir))?.token).toBe(token);
    chmodSync(file, 0o644);
    await expect(readHubRecord(5999, dir)).rejects.toThrow(/other users/);
    // a planted, group-writable file in a fresh folder is refused as well
    const dir2 = mkdtempSync(path.join(os.tmpdir(), 'loupe-cfg2-'));
    mkdirSync(dir2, { recursive: true });
    writeFileSync(tokenFilePath(6000, dir2), JSON.stringify({ port: 6000, pid: 1, token, started_at: '' }), {
      mode: 0o660,
    });
    chmodSync(tokenFilePath(6000, dir2), 0o660);
    await expect(readHubRecord(6000, dir2)).rejects.toThrow();
  });
});
