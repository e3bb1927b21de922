/**
 * Issue 9's numbered problems, each with the input that broke the companion or leaked a file
 * before its fix. (The randomised hostile-input suite is tests/hostile-bridge.test.ts.)
 */
import { mkdirSync, mkdtempSync, symlinkSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Hub } from '../src/bridge/hub';
import { AGENT_PATH, PAGE_PATH, SUBPROTOCOL, TOKEN_PROTOCOL_PREFIX, sanitizeWireModel, tokenProtocol } from '../src/bridge/protocol';
import { tokensEqual } from '../src/bridge/token';
import { startStaticServer } from '../src/node/static-server';
import { FakePage, startTestHub, tryUpgrade, until } from './bridge-fake-page';
import { frame, rawRequest, textFrame, upgradeHead } from './helpers/raw-ws';

const get = (port: number, p: string) => new Promise<{ status: number; body: string }>((resolve, reject) => {
  http.get({ host: '127.0.0.1', port, path: p, headers: { Host: `127.0.0.1:${port}` } }, (res) => {
    let body = '';
    res.on('data', (c) => (body += c));
    res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
  }).on('error', reject);
});

let hub: Hub;
let good: Record<string, string>;
beforeAll(async () => {
  hub = await startTestHub();
  good = { Host: `127.0.0.1:${hub.port}`, Origin: `http://127.0.0.1:${hub.port}`, 'Sec-WebSocket-Protocol': `${SUBPROTOCOL}, ${tokenProtocol(hub.token)}` };
});
afterAll(() => hub.close());

describe('1. token comparison and catch-alls', () => {
  it('tokensEqual compares bytes after a shape check: a 64-character token with a non-ASCII byte is unequal, not a throw', () => {
    const t = 'a'.repeat(64);
    expect(tokensEqual(t, t)).toBe(true);
    expect(tokensEqual('\u00e9' + t.slice(1), t)).toBe(false);
    expect(tokensEqual('\u{1F600}' + t.slice(2), t)).toBe(false);
    expect(tokensEqual(t.toUpperCase(), t)).toBe(false);
    expect(tokensEqual(undefined, t)).toBe(false);
    expect(tokensEqual(42, t)).toBe(false);
  });

  it('an upgrade offering a token with byte 0xE9 is refused (401) and the companion keeps serving', async () => {
    for (const p of [PAGE_PATH, AGENT_PATH]) {
      const bad = TOKEN_PROTOCOL_PREFIX + '\u00e9' + hub.token.slice(1);
      const r = await rawRequest(hub.port, upgradeHead(p, { ...good, 'Sec-WebSocket-Protocol': `${SUBPROTOCOL}, ${bad}` }));
      expect(r.status, p).toBe(401);
    }
    expect((await get(hub.port, '/')).status).toBe(200);
    expect(await tryUpgrade(hub.port, good)).toBe(101);
  });

  it('malformed frames (unmasked, reserved opcode, RSV bits, binary, 2^63 length) drop only that peer', async () => {
    const bad = [
      Buffer.from([0x81, 0x02, 0x68, 0x69]), // unmasked client frame
      frame(0x3, Buffer.from('x')), // reserved opcode
      frame(0x1, Buffer.from('{}'), { rsv: 4 }), // RSV1 without an extension
      frame(0x2, Buffer.from([1, 2, 3])), // binary where text is expected
      frame(0x1, Buffer.alloc(0), { declaredLength: 2 ** 53 }), // absurd length
      textFrame('\u0000'.repeat(10)),
      frame(0x1, Buffer.from([0xff, 0xfe, 0xfd])), // invalid UTF-8 in a text frame
    ];
    for (const p of [PAGE_PATH, AGENT_PATH]) {
      for (const f of bad) {
        const r = await rawRequest(hub.port, upgradeHead(p, good));
        expect(r.status).toBe(101);
        await new Promise<void>((resolve) => {
          r.socket!.once('close', () => resolve());
          r.socket!.write(f);
          setTimeout(() => { r.socket!.destroy(); resolve(); }, 500);
        });
      }
    }
    expect((await get(hub.port, '/')).status).toBe(200);
    expect(await tryUpgrade(hub.port, good, AGENT_PATH)).toBe(101);
  });
});

describe('4. static server and symlinks', () => {
  it('refuses a symlink that points out of the served folder, serves one that stays inside', async () => {
    const outside = mkdtempSync(path.join(os.tmpdir(), 'loupe-outside-'));
    writeFileSync(path.join(outside, 'secret.txt'), 'top secret');
    mkdirSync(path.join(outside, 'dir'));
    writeFileSync(path.join(outside, 'dir', 'index.html'), 'secret index');
    const root = mkdtempSync(path.join(os.tmpdir(), 'loupe-static-'));
    writeFileSync(path.join(root, 'index.html'), 'index');
    writeFileSync(path.join(root, 'app.js'), 'js');
    symlinkSync(path.join(outside, 'secret.txt'), path.join(root, 'leak.txt'));
    symlinkSync(path.join(outside, 'dir'), path.join(root, 'linkdir'));
    symlinkSync(path.join(root, 'app.js'), path.join(root, 'alias.js'));
    // a served folder that is itself a symlink still works
    const linkedRoot = path.join(mkdtempSync(path.join(os.tmpdir(), 'loupe-link-')), 'dist');
    symlinkSync(root, linkedRoot);
    for (const r of [root, linkedRoot]) {
      const s = await startStaticServer({ root: r, spaFallback: false });
      try {
        for (const p of ['/leak.txt', '/linkdir/', '/linkdir/index.html']) {
          const res = await get(s.port, p);
          expect(res.body, p).not.toContain('secret');
          expect(res.status, p).toBe(404);
        }
        expect((await get(s.port, '/alias.js')).body).toBe('js');
        expect((await get(s.port, '/')).body).toBe('index');
      } finally {
        await s.close();
      }
    }
    // and through the hub (loupe mcp --dist DIR)
    const h = await startTestHub({ distDir: root });
    try {
      const res = await get(h.port, '/leak.txt');
      expect(res.body).not.toContain('secret');
    } finally {
      await h.close();
    }
  });
});

describe('5. what a paired page may report', () => {
  it('the model a page reports is whitelisted and bounded before loupe_status echoes it', async () => {
    const info = { id: 'owner/name', revision: 'main', source: 'hub', architecture: 'llama', dtype: 'F32', backend: 'wasm', norm: 'rmsnorm', n_layers: 2, n_heads: 4, n_kv_heads: 4, d_model: 64, d_head: 16, d_mlp: 128, d_vocab: 512, n_ctx: 256, n_params: 1000 };
    const ref = { kind: 'hub', id: 'owner/name', revision: 'main', endpoint: 'https://huggingface.co' };
    const page = await FakePage.connect(hub.port, { token: hub.token, model: { ...info, ref, junk: 'x'.repeat(1_000_000) } });
    try {
      await until(() => hub.activePage?.tabId === page.tabId, 3000, 'pairing');
      expect(JSON.stringify(hub.status()).length).toBeLessThan(10_000);
      expect(hub.status().page?.model).toEqual({ ...info, ref });
      // a `model` message: 20 MB of extra fields, oversized strings, nested objects, wrong types
      page.send({ type: 'model', model: { ...info, id: 'y'.repeat(20_000_000), ref: { ...ref, nested: { deep: 'z'.repeat(1000) } }, n_layers: 'two', extra: Array(1000).fill({ a: 1 }) } });
      await until(() => hub.status().page?.model?.n_layers === undefined, 5000, 'the model message');
      const st = hub.status();
      expect(JSON.stringify(st).length).toBeLessThan(10_000);
      expect(st.page?.model).toEqual({ ...Object.fromEntries(Object.entries(info).filter(([k]) => k !== 'id' && k !== 'n_layers')), ref });
    } finally {
      await page.close();
    }
  });

  it('every field of a real ModelInfo survives the whitelist', async () => {
    const { loadModelNode } = await import('../src/node/load');
    const m = await loadModelNode('default');
    try {
      const wire = { ...m.info, ref: { kind: 'bundled', id: 'stories260K', revision: '' } };
      expect(sanitizeWireModel(wire)).toEqual(wire);
    } finally {
      await m.dispose();
    }
  });
});
