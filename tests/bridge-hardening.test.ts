/**
 * Issue 9's numbered problems, each with the input that broke the companion or leaked a file
 * before its fix. (The randomised hostile-input suite is tests/hostile-bridge.test.ts.)
 */
import { spawn } from 'node:child_process';
import fs, { chmodSync, existsSync, mkdirSync, mkdtempSync, renameSync, symlinkSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import WebSocket, { WebSocketServer } from 'ws';
import { ForwardClient, probeHub } from '../src/bridge/forward';
import { PageExecutor } from '../src/bridge/page-executor';
import type { Hub } from '../src/bridge/hub';
import {
  AGENT_PATH,
  CHALLENGE_PROTOCOL_PREFIX,
  PAGE_PATH,
  SUBPROTOCOL,
  TOKEN_PROTOCOL_PREFIX,
  sanitizeWireModel,
  tokenProtocol,
} from '../src/bridge/protocol';
import { newToken, readHubRecord, tokenFilePath, tokensEqual, writeHubRecord } from '../src/bridge/token';
import { startStaticServer } from '../src/node/static-server';
import { FakePage, sleep, startTestHub, tmpDist, tryUpgrade, until } from './bridge-fake-page';

const ROOT = path.resolve(__dirname, '..');
const TSX = path.join(ROOT, 'node_modules', '.bin', 'tsx');
import { frame, rawRequest, textFrame, upgradeHead } from './helpers/raw-ws';

const get = (port: number, p: string) =>
  new Promise<{ status: number; body: string }>((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port, path: p, headers: { Host: `127.0.0.1:${port}` } }, (res) => {
        let body = '';
        res.on('data', (c) => (body += c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      })
      .on('error', reject);
  });

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
      const r = await rawRequest(
        hub.port,
        upgradeHead(p, { ...good, 'Sec-WebSocket-Protocol': `${SUBPROTOCOL}, ${bad}` }),
      );
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
          setTimeout(() => {
            r.socket!.destroy();
            resolve();
          }, 500);
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
    const info = {
      id: 'owner/name',
      revision: 'main',
      source: 'hub',
      architecture: 'llama',
      dtype: 'F32',
      backend: 'wasm',
      norm: 'rmsnorm',
      n_layers: 2,
      n_heads: 4,
      n_kv_heads: 4,
      d_model: 64,
      d_head: 16,
      d_mlp: 128,
      d_vocab: 512,
      n_ctx: 256,
      n_params: 1000,
    };
    const ref = { kind: 'hub', id: 'owner/name', revision: 'main', endpoint: 'https://huggingface.co' };
    const page = await FakePage.connect(hub.port, {
      token: hub.token,
      model: { ...info, ref, junk: 'x'.repeat(1_000_000) },
    });
    try {
      await until(() => hub.activePage?.tabId === page.tabId, 3000, 'pairing');
      expect(JSON.stringify(hub.status()).length).toBeLessThan(10_000);
      expect(hub.status().page?.model).toEqual({ ...info, ref });
      // a `model` message: 20 MB of extra fields, oversized strings, nested objects, wrong types
      page.send({
        type: 'model',
        model: {
          ...info,
          id: 'y'.repeat(20_000_000),
          ref: { ...ref, nested: { deep: 'z'.repeat(1000) } },
          n_layers: 'two',
          extra: Array(1000).fill({ a: 1 }),
        },
      });
      await until(() => hub.status().page?.model?.n_layers === undefined, 5000, 'the model message');
      const st = hub.status();
      expect(JSON.stringify(st).length).toBeLessThan(10_000);
      expect(st.page?.model).toEqual({
        ...Object.fromEntries(Object.entries(info).filter(([k]) => k !== 'id' && k !== 'n_layers')),
        ref,
      });
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

describe('6. config folder, token file, hub authentication, stale records', () => {
  const freePort = () =>
    new Promise<number>((resolve) => {
      const s = net.createServer().listen(0, '127.0.0.1', () => {
        const p = (s.address() as net.AddressInfo).port;
        s.close(() => resolve(p));
      });
    });
  const quietLog = () => undefined;

  it('a config folder open to others (0777), a link, or a file is refused with CONFIG_UNSAFE, before the hub listens', async () => {
    if (process.platform === 'win32') return;
    const base = mkdtempSync(path.join(os.tmpdir(), 'loupe-cfg-'));
    const open = path.join(base, 'open');
    mkdirSync(open, { mode: 0o777 });
    chmodSync(open, 0o777);
    const rec = { port: 6001, pid: process.pid, token: newToken(), started_at: '' };
    await expect(writeHubRecord(rec, open)).rejects.toMatchObject({ code: 'CONFIG_UNSAFE' });
    const link = path.join(base, 'link');
    const real = path.join(base, 'real');
    mkdirSync(real, { mode: 0o700 });
    symlinkSync(real, link);
    await expect(writeHubRecord(rec, link)).rejects.toMatchObject({ code: 'CONFIG_UNSAFE' });
    // a record in a folder that later became 0777 is refused too
    const ok = path.join(base, 'ok');
    await writeHubRecord(rec, ok);
    expect((await readHubRecord(6001, ok))?.token).toBe(rec.token);
    chmodSync(ok, 0o770);
    await expect(readHubRecord(6001, ok)).rejects.toMatchObject({ code: 'CONFIG_UNSAFE' });
    // the companion: a structured refusal, and nothing listening on the port
    const port = await freePort();
    const pe = new PageExecutor({ port, distDir: tmpDist(), version: 'test', log: quietLog, configDir: open });
    await expect(pe.started()).rejects.toMatchObject({
      code: 'CONFIG_UNSAFE',
      hint: expect.stringContaining('chmod 700'),
    });
    await pe.close();
    expect(await probeHub(port, 500)).toBeUndefined();
  });

  it('readHubRecord checks the file it reads: a planted file swapped in after the first check is never accepted', async () => {
    if (process.platform === 'win32') return;
    const dir = mkdtempSync(path.join(os.tmpdir(), 'loupe-cfg-'));
    const mine = newToken();
    const planted = newToken();
    const file = await writeHubRecord({ port: 6002, pid: process.pid, token: mine, started_at: '' }, dir);
    const plantedFile = path.join(dir, 'planted');
    writeFileSync(plantedFile, JSON.stringify({ port: 6002, pid: 1, token: planted, started_at: '' }), { mode: 0o666 });
    chmodSync(plantedFile, 0o666);
    // Swap right after the first filesystem call that names the record (the old code's lstat).
    let swapped = false;
    const spies = (['lstat', 'stat', 'open', 'readFile'] as const).map((name) => {
      const orig = fs.promises[name] as (...a: unknown[]) => Promise<unknown>;
      return vi.spyOn(fs.promises, name).mockImplementation((async (...a: unknown[]) => {
        const r = await orig.apply(fs.promises, a);
        if (!swapped && a[0] === file) {
          swapped = true;
          renameSync(plantedFile, file);
        }
        return r;
      }) as never);
    });
    try {
      const got = await readHubRecord(6002, dir).catch((e) => e);
      expect(swapped).toBe(true);
      expect(got?.token).not.toBe(planted);
    } finally {
      for (const s of spies) s.mockRestore();
    }
  });

  it('a forwarding companion never sends the token to a program squatting on the port, and attaches to the real hub by challenge–response', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'loupe-cfg-'));
    // an impostor: answers the probe like a hub, accepts any upgrade, records everything it sees
    const seen: string[] = [];
    const squat = http.createServer((req, res) => {
      seen.push(JSON.stringify(req.headers));
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ service: 'loupe-hub', protocol: 1, version: 'x', pid: 1 }));
    });
    const wss = new WebSocketServer({ noServer: true, handleProtocols: (p) => [...p][0] });
    squat.on('upgrade', (req, socket, head) => {
      seen.push(JSON.stringify(req.headers));
      wss.handleUpgrade(req, socket, head, (ws) => {
        ws.on('message', (d) => seen.push(d.toString()));
        ws.send(JSON.stringify({ type: 'challenge', proof: 'a'.repeat(64), nonce: 'b'.repeat(64) }));
      });
    });
    await new Promise<void>((r) => squat.listen(0, '127.0.0.1', () => r()));
    const port = (squat.address() as net.AddressInfo).port;
    const token = newToken();
    await writeHubRecord({ port, pid: process.pid, token, started_at: '' }, dir); // a stale record
    try {
      await expect(ForwardClient.connect(port, token, { name: 'test' }, { timeoutMs: 1000 })).rejects.toMatchObject({
        code: 'NO_PAGE',
        message: expect.stringMatching(/could not prove/),
      });
      expect(seen.length).toBeGreaterThan(0);
      expect(seen.join('\n')).not.toContain(token);
    } finally {
      wss.close();
      await new Promise<void>((r) => squat.close(() => r()));
    }
    // the real hub passes, and a peer that cannot prove the token gets nothing but the challenge
    const fwd = await ForwardClient.connect(hub.port, hub.token, { name: 'test' });
    expect(fwd.alive).toBe(true);
    expect((await fwd.status()).protocol_version).toBe(1);
    fwd.close();
    for (const first of [
      { type: 'attach', protocol: 1, agent: { name: 'x' }, proof: 'c'.repeat(64) },
      { type: 'call', id: 'a', tool: '$status', args: {}, deadline: Date.now() + 5000 },
      { type: 'attach', protocol: 1, agent: { name: 'x' } },
    ]) {
      const ws = new WebSocket(
        `ws://127.0.0.1:${hub.port}${AGENT_PATH}`,
        [SUBPROTOCOL, CHALLENGE_PROTOCOL_PREFIX + 'd'.repeat(64)],
        { origin: `http://127.0.0.1:${hub.port}` },
      );
      const got: string[] = [];
      ws.on('message', (d) => got.push(d.toString()));
      const closed = new Promise<number>((r) => ws.on('close', (code) => r(code)));
      await new Promise((r) => ws.once('open', r));
      ws.send(JSON.stringify(first));
      expect(await closed).toBe(4000);
      expect(got.map((g) => JSON.parse(g).type)).toEqual(['challenge']);
    }
  });

  it('peers upgraded on a challenge (no token yet) are few at a time and have a smaller frame limit', async () => {
    const challenge = (n: number) => ({
      ...good,
      'Sec-WebSocket-Protocol': `${SUBPROTOCOL}, ${CHALLENGE_PROTOCOL_PREFIX}${n.toString(16).padStart(64, '0')}`,
    });
    const held: Awaited<ReturnType<typeof rawRequest>>[] = [];
    for (let i = 0; i < 4; i++) held.push(await rawRequest(hub.port, upgradeHead(AGENT_PATH, challenge(i))));
    expect(held.map((h) => h.status)).toEqual([101, 101, 101, 101]);
    expect((await rawRequest(hub.port, upgradeHead(AGENT_PATH, challenge(9)))).status).toBe(503);
    // a frame over 64 MiB, announced by its header, closes the unauthenticated peer at once
    const closed = new Promise<void>((r) => held[0].socket!.once('close', () => r()));
    held[0].socket!.write(frame(0x1, Buffer.alloc(0), { declaredLength: 65 * 1024 * 1024 }));
    await closed;
    for (const h of held) h.socket!.destroy();
    await sleep(300); // the hub sees the sockets close and frees their slots
    const fwd = await ForwardClient.connect(hub.port, hub.token, { name: 'after' });
    expect(fwd.alive).toBe(true);
    fwd.close();
  });

  it('the hub record is removed when the companion crashes, and a record left by a killed one is cleared by the next', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'loupe-cfg-'));
    const script = (port: number, crash: boolean) => `(async () => {
const { PageExecutor } = await import(${JSON.stringify(path.join(ROOT, 'src/bridge/page-executor.ts'))});
const pe = new PageExecutor({ port: ${port}, distDir: ${JSON.stringify(tmpDist())}, version: 't', log: () => {}, configDir: ${JSON.stringify(dir)} });
await pe.started();
console.log('ready');
${crash ? "process.stdin.once('data', () => { throw new Error('simulated crash'); });" : 'setInterval(() => {}, 1000);'}
})();`;
    /** A companion child on a free port that owns its hub (retried when another test's process took the port first). */
    const runChild = async (crash: boolean) => {
      for (let attempt = 0; ; attempt++) {
        const port = await freePort();
        // node itself (not the tsx wrapper) so that SIGKILL reaches the process that wrote the record
        const file = path.join(dir, `child-${port}.mts`);
        writeFileSync(file, script(port, crash));
        const child = spawn(process.execPath, ['--import', 'tsx', file], {
          cwd: ROOT,
          stdio: ['pipe', 'pipe', 'pipe'],
        });
        let out = '';
        child.stdout.on('data', (d) => (out += d));
        await until(() => out.includes('ready'), 60_000, 'the child companion');
        if (existsSync(tokenFilePath(port, dir)) || attempt >= 3) {
          expect(existsSync(tokenFilePath(port, dir))).toBe(true);
          return { child, port };
        }
        await new Promise<void>((r) => {
          child.once('exit', () => r());
          child.kill('SIGKILL');
        });
      }
    };
    const { child: crashed, port: p1 } = await runChild(true);
    const exited = new Promise<number | null>((r) => crashed.once('exit', (c) => r(c)));
    crashed.stdin!.write('crash now\n'); // an uncaught exception in the child
    const code = await exited;
    expect(code).not.toBe(0);
    expect(existsSync(tokenFilePath(p1, dir))).toBe(false);

    const { child: killed, port: p2 } = await runChild(false);
    await new Promise<void>((r) => {
      killed.once('exit', () => r());
      killed.kill('SIGKILL');
    });
    expect(existsSync(tokenFilePath(p2, dir))).toBe(true); // SIGKILL runs no handler
    const p3 = await freePort();
    const next = new PageExecutor({ port: p3, distDir: tmpDist(), version: 't', log: quietLog, configDir: dir });
    try {
      await next.started();
      expect(existsSync(tokenFilePath(p2, dir))).toBe(false);
      expect(existsSync(tokenFilePath(p3, dir))).toBe(true);
    } finally {
      await next.close();
    }
    expect(existsSync(tokenFilePath(p3, dir))).toBe(false);
  });
});
