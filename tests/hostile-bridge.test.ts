/**
 * The hostile-input suite (issue 9): a local attacker's worth of bad input, loopback only,
 * bounded in count, reproducible from one seed (LOUPE_HOSTILE_SEED, default below).
 *
 *  A. a page-mode companion (child process, its hub on 127.0.0.1) and a fake page in this
 *     process that runs the real operations: randomised upgrade headers (bytes 0–255 in the
 *     subprotocol, Origin and Host), malformed and oversized frames, out-of-order and mutated
 *     protocol messages from pages and agents.
 *  B. a headless companion: every tool called with arguments generated from its own JSON Schema
 *     (wrong types, 1e999/-1e999, huge and negative numbers, huge strings, unknown fields,
 *     paths), plus broken JSON-RPC lines.
 *
 * After every burst the companion must still be running (no crash), answer loupe_status, serve
 * the page (A), and give the same trace document as before the first burst; a request that gets
 * no answer in time counts as a hang. The counts are printed (README, "Security and limits").
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import type { LoadedModel } from '../src/engine/api';
import { toLoupeError } from '../src/engine/errors';
import { loadModelNode } from '../src/node/load';
import { getOperation } from '../src/ops/index';
import { parseOperationInput } from '../src/ops/types';
import { AGENT_PATH, PAGE_PATH, SUBPROTOCOL, tokenProtocol } from '../src/bridge/protocol';
import { FakePage, sleep, until } from './bridge-fake-page';
import { Companion, argsFromSchema, hostileJson, int, pick, randomLatin1, rng, type Rng } from './helpers/hostile';
import { frame, rawRequest, textFrame, upgradeHead } from './helpers/raw-ws';

const SEED = Number(process.env.LOUPE_HOSTILE_SEED ?? 20261201);
const N_UPGRADES = 240;
const N_FRAME_PEERS = 60;
const N_MESSAGE_PEERS = 120;
const ARGS_PER_TOOL = 8;
const TRACE_ARGS = '{"prompt":"Once upon a time, there was a little","top_k":5}';
/** a request unanswered after this long is a hang (the companion's own call deadline is 20 s) */
const HANG_MS = 45_000;

interface Tally {
  inputs: number;
  crashes: number;
  hangs: number;
  checks: number;
}
const tally: Record<string, Tally> = {};
const count = (k: string, n = 1) => ((tally[k] ??= { inputs: 0, crashes: 0, hangs: 0, checks: 0 }).inputs += n);
const hang = (k: string) => ((tally[k] ??= { inputs: 0, crashes: 0, hangs: 0, checks: 0 }).hangs += 1);

const structured = (r: Record<string, unknown> | 'timeout') =>
  r === 'timeout' ? undefined : (r.result as { structuredContent?: unknown; isError?: boolean } | undefined);

let model: LoadedModel;
const tmp: string[] = [];
const mk = (p: string) => {
  const d = mkdtempSync(path.join(os.tmpdir(), p));
  tmp.push(d);
  return d;
};
const env = (): NodeJS.ProcessEnv => ({
  ...process.env,
  LOUPE_CONFIG_DIR: path.join(mk('loupe-hostile-cfg-'), 'loupe'),
  LOUPE_CACHE_DIR: mk('loupe-hostile-cache-'),
  HF_ENDPOINT: 'http://127.0.0.1:9', // loopback, nothing listens: Hub ids fail fast, never leave the machine
});

beforeAll(async () => {
  model = await loadModelNode('default');
});
afterAll(async () => {
  await model?.dispose();
  for (const d of tmp) rmSync(d, { recursive: true, force: true });
  const rows = Object.entries(tally).map(
    ([k, t]) => `${k}: ${t.inputs} hostile inputs, ${t.crashes} crashes, ${t.hangs} hangs, ${t.checks} checks passed`,
  );
  const total = Object.values(tally).reduce(
    (a, t) => ({
      inputs: a.inputs + t.inputs,
      crashes: a.crashes + t.crashes,
      hangs: a.hangs + t.hangs,
      checks: a.checks + t.checks,
    }),
    { inputs: 0, crashes: 0, hangs: 0, checks: 0 },
  );
  console.log(
    `[hostile] seed ${SEED}\n[hostile] ${rows.join('\n[hostile] ')}\n[hostile] total: ${total.inputs} hostile inputs, ${total.crashes} crashes, ${total.hangs} hangs`,
  );
});

// ------------------------------------------------------------------ A. page mode: the hub

describe('hostile input to the hub (page mode)', () => {
  let c: Companion;
  let port = 0;
  let token = '';
  let page: FakePage;
  let dist: string;
  let baseline: unknown;

  /** The real operation, as the page would run it. */
  const runOnPage = async (m: { id: string; tool: string; args: Record<string, unknown> }, p: FakePage) => {
    try {
      const op = getOperation(m.tool);
      if (!op) throw toLoupeError({ error: { code: 'UNKNOWN_OPERATION', message: `Unknown operation ${m.tool}.` } });
      const doc = await op.run(model, parseOperationInput(op, m.args), {});
      p.result(m.id, doc);
    } catch (e) {
      const err = toLoupeError(e);
      p.error(m.id, err.code, err.message, err.hint);
    }
  };

  async function check(burst: string): Promise<void> {
    if (!c.alive) tally[burst].crashes += 1;
    expect(c.alive, `${burst}: the companion exited (${JSON.stringify(c.exited)})\n${c.stderr.slice(-3000)}`).toBe(
      true,
    );
    // the page of this suite is the active one again (hostile pages were closed)
    let st: Record<string, unknown> | 'timeout' = 'timeout';
    for (let i = 0; i < 50; i++) {
      st = await c.callRaw('loupe_status', '{}', HANG_MS);
      const page0 = (structured(st)?.structuredContent as { page?: { instance_id?: string } } | undefined)?.page;
      if (st === 'timeout' || page0?.instance_id === page.instanceId) break;
      await sleep(100);
    }
    if (st === 'timeout') hang(burst);
    expect(st, `${burst}: loupe_status`).not.toBe('timeout');
    expect((structured(st)?.structuredContent as { page?: { instance_id?: string } }).page?.instance_id).toBe(
      page.instanceId,
    );
    const html = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      http
        .get(
          { host: '127.0.0.1', port, path: '/', headers: { Host: `127.0.0.1:${port}` }, timeout: HANG_MS },
          (res) => {
            let body = '';
            res.on('data', (d) => (body += d));
            res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
          },
        )
        .on('error', reject);
    });
    expect(html.status).toBe(200);
    expect(html.body).toContain('hostile-suite page');
    const tr = await c.callRaw('trace', TRACE_ARGS, HANG_MS);
    if (tr === 'timeout') hang(burst);
    expect(structured(tr)?.structuredContent, `${burst}: trace`).toEqual(baseline);
    tally[burst].checks += 1;
  }

  beforeAll(async () => {
    dist = mk('loupe-hostile-dist-');
    writeFileSync(path.join(dist, 'index.html'), '<!doctype html><title>hostile-suite page</title>');
    c = new Companion(['--port', '0', '--page-wait', '2', '--dist', dist], env());
    await c.initialize();
    const m = await until(
      () => /#pair=([0-9a-f]{64})/.exec(c.stderr) && /127\.0\.0\.1:(\d+)\/#pair=/.exec(c.stderr),
      60_000,
      'the pairing URL',
    );
    port = Number(m[1]);
    token = /#pair=([0-9a-f]{64})/.exec(c.stderr)![1];
    page = await FakePage.connect(port, {
      token,
      model: { ...model.info, ref: { kind: 'bundled', id: 'stories260K', revision: '' } },
    });
    page.onCall = (call, p) => void runOnPage(call, p);
    const first = await c.callRaw('trace', TRACE_ARGS, HANG_MS);
    baseline = structured(first)?.structuredContent;
    expect(baseline).toMatchObject({ operation: 'trace' });
  });
  afterAll(async () => {
    await page?.close();
    await c?.close();
  });

  const good = () => ({
    Host: `127.0.0.1:${port}`,
    Origin: `http://127.0.0.1:${port}`,
    'Sec-WebSocket-Protocol': `${SUBPROTOCOL}, ${tokenProtocol(token)}`,
  });

  it(`randomised upgrade headers (${N_UPGRADES}: bytes 0–255 in subprotocol, Origin, Host)`, async () => {
    const r = rng(SEED + 1);
    const burst = 'upgrade headers';
    const hostile = (r: Rng, goodValue: string) => {
      switch (int(r, 0, 5)) {
        case 0:
          return randomLatin1(r, int(r, 0, 80));
        case 1:
          return goodValue + randomLatin1(r, int(r, 1, 8));
        case 2: {
          const i = int(r, 0, Math.max(0, goodValue.length - 1));
          return goodValue.slice(0, i) + String.fromCharCode(int(r, 128, 255)) + goodValue.slice(i + 1);
        }
        case 3:
          return undefined;
        case 4:
          return goodValue.toUpperCase();
        default:
          return goodValue;
      }
    };
    let refused = 0;
    for (let b = 0; b < N_UPGRADES; b += 20) {
      const batch = Array.from({ length: Math.min(20, N_UPGRADES - b) }, async () => {
        const g = good();
        const tokenPart = pick(r, ['token', 'token', 'challenge']);
        const proto =
          tokenPart === 'token'
            ? hostile(r, `${SUBPROTOCOL}, ${tokenProtocol(token)}`)
            : `${SUBPROTOCOL}, loupe.challenge.${randomLatin1(r, 64)}`;
        // at least one of the three is hostile, so no request here carries the right credentials
        const which = int(r, 0, 2);
        const headers: Record<string, string | undefined> = {
          Host: which === 0 || r() < 0.3 ? hostile(r, g.Host) : g.Host,
          Origin: which === 1 || r() < 0.3 ? hostile(r, g.Origin) : g.Origin,
          'Sec-WebSocket-Protocol':
            which === 2 || tokenPart === 'challenge' || r() < 0.3 ? proto : g['Sec-WebSocket-Protocol'],
        };
        const pathname = pick(r, [PAGE_PATH, PAGE_PATH, AGENT_PATH, AGENT_PATH, '/', '/ws/' + randomLatin1(r, 4)]);
        count(burst);
        const res = await rawRequest(port, upgradeHead(pathname.replace(/[\r\n ]/g, '_'), headers), 10_000);
        if (res.status === -1) hang(burst);
        // Host and Origin compare case-insensitively (HTTP://127.0.0.1:P is the same origin)
        const sameAsGood =
          headers.Host?.toLowerCase() === g.Host &&
          headers.Origin?.toLowerCase() === g.Origin &&
          headers['Sec-WebSocket-Protocol'] === g['Sec-WebSocket-Protocol'];
        if (res.status === 101) {
          res.socket?.destroy();
          expect(sameAsGood, `upgraded with hostile headers ${JSON.stringify(headers)}`).toBe(true);
        } else refused += 1;
      });
      await Promise.all(batch);
    }
    expect(refused).toBeGreaterThan(N_UPGRADES / 2);
    await check(burst);
  });

  it(`malformed and oversized frames (${N_FRAME_PEERS} authenticated peers)`, async () => {
    const r = rng(SEED + 2);
    const burst = 'frames';
    const badFrame = (): Buffer => {
      switch (int(r, 0, 10)) {
        case 0:
          return Buffer.from(randomLatin1(r, int(r, 1, 64)), 'latin1'); // random bytes
        case 1:
          return frame(int(r, 3, 7), Buffer.from('x')); // reserved data opcodes
        case 2:
          return frame(int(r, 11, 15), Buffer.from('x')); // reserved control opcodes
        case 3:
          return frame(0x1, Buffer.from('{}'), { rsv: int(r, 1, 7) });
        case 4:
          return frame(0x1, Buffer.from(randomLatin1(r, 32), 'latin1')); // invalid UTF-8
        case 5:
          return frame(0x9, Buffer.alloc(200)); // control frame over 125 bytes
        case 6:
          return frame(0x8, Buffer.from([0x03, 0xe7])); // close with code 999
        case 7:
          return Buffer.concat([
            frame(0x1, Buffer.from('{"type":'), { fin: false }),
            frame(0x1, Buffer.from('"ping"}')),
          ]); // new message mid-fragment
        case 8:
          return frame(0x1, Buffer.alloc(0), { declaredLength: 300 * 1024 * 1024 }); // over maxPayload
        case 9:
          return frame(0x1, Buffer.from('{}'), { mask: false });
        default:
          return frame(0x0, Buffer.from('orphan continuation'));
      }
    };
    for (let b = 0; b < N_FRAME_PEERS; b += 10) {
      await Promise.all(
        Array.from({ length: Math.min(10, N_FRAME_PEERS - b) }, async () => {
          const res = await rawRequest(port, upgradeHead(pick(r, [PAGE_PATH, AGENT_PATH]), good()), 10_000);
          if (res.status !== 101) return;
          const n = int(r, 1, 3);
          for (let i = 0; i < n; i++) {
            count(burst);
            res.socket!.write(badFrame());
          }
          await new Promise<void>((resolve) => {
            res.socket!.once('close', () => resolve());
            setTimeout(() => {
              res.socket!.destroy();
              resolve();
            }, 300);
          });
        }),
      );
    }
    // one real oversized message: 8 MB of text that is not JSON, on each endpoint
    for (const p of [PAGE_PATH, AGENT_PATH]) {
      const res = await rawRequest(port, upgradeHead(p, good()), 10_000);
      count(burst);
      res.socket?.write(textFrame('{'.repeat(8 * 1024 * 1024)));
      await sleep(300);
      res.socket?.destroy();
    }
    await check(burst);
  });

  it(`out-of-order and mutated protocol messages (${N_MESSAGE_PEERS} peers, pages and agents)`, async () => {
    const r = rng(SEED + 3);
    const burst = 'protocol messages';
    const ids = ['c0000', 'f1', 'x'.repeat(129), '', '__proto__'];
    const templates = (): Record<string, unknown>[] => [
      {
        type: 'hello',
        protocol: pick(r, [1, 2, 0, -1]),
        tab_id: 'tab-' + int(r, 0, 1e6),
        instance_id: 'i' + int(r, 0, 1e6),
        model: null,
      },
      {
        type: 'model',
        model: pick(r, [null, { id: 'x'.repeat(1000) }, { n_layers: -1, ref: { kind: 'folder', id: '/etc' } }]),
      },
      {
        type: 'progress',
        id: pick(r, ids),
        done: int(r, -5, 5),
        total: int(r, -5, 5),
        stage: 'x'.repeat(int(r, 0, 5000)),
      },
      { type: 'result', id: pick(r, ids), document: { operation: 'trace' } },
      { type: 'error', id: pick(r, ids), error: { code: 'INTERNAL', message: 'm'.repeat(int(r, 0, 10000)) } },
      { type: 'ping', t: pick(r, [0, -1, 1e308]) },
      { type: 'pong', t: 1 },
      {
        type: 'attach',
        protocol: pick(r, [1, 2]),
        agent: { name: 'n'.repeat(int(r, 0, 1000)), version: 'v' },
        ...(r() < 0.3 ? { proof: 'a'.repeat(64) } : {}),
      },
      {
        type: 'call',
        id: 'h' + int(r, 0, 1e6),
        tool: pick(r, ['$status', 'trace', 'nope', 'load_model', 'generate', '__proto__']),
        args: {},
        deadline: pick(r, [0, Date.now() + 2000, 1e308]),
      },
      { type: 'cancel', id: pick(r, ids) },
      { type: 'welcome', protocol: 1, hub: {}, agents: [] },
      { type: 'bye', reason: 'x' },
      { type: 'agents', agents: [] },
      { type: 'challenge', proof: 'b'.repeat(64), nonce: 'c'.repeat(64) },
    ];
    const message = (): string => {
      const k = int(r, 0, 9);
      if (k === 0) return hostileJson(r);
      if (k === 1) return randomLatin1(r, int(r, 0, 100));
      const m = pick(r, templates());
      if (k <= 4) {
        // mutate one field to a hostile value
        const keys = Object.keys(m);
        const key = pick(r, [...keys, 'extra']);
        return JSON.stringify(m).replace(/}$/, '') + `,${JSON.stringify(key)}:${hostileJson(r, 2)}}`;
      }
      return JSON.stringify(m);
    };
    const peers: WebSocket[] = [];
    for (let b = 0; b < N_MESSAGE_PEERS; b += 10) {
      await Promise.all(
        Array.from({ length: Math.min(10, N_MESSAGE_PEERS - b) }, async () => {
          const p = pick(r, [PAGE_PATH, AGENT_PATH]);
          const ws = new WebSocket(`ws://127.0.0.1:${port}${p}`, [SUBPROTOCOL, tokenProtocol(token)], {
            origin: `http://127.0.0.1:${port}`,
          });
          ws.on('error', () => undefined);
          peers.push(ws);
          const opened = await new Promise<boolean>((resolve) => {
            ws.once('open', () => resolve(true));
            ws.once('close', () => resolve(false));
            setTimeout(() => resolve(false), 10_000);
          });
          if (!opened) return;
          const n = int(r, 1, 6);
          for (let i = 0; i < n && ws.readyState === WebSocket.OPEN; i++) {
            count(burst);
            ws.send(message());
          }
          await sleep(int(r, 0, 100));
        }),
      );
    }
    // hostile pages that paired are now the active page: close them all, ours takes over again
    for (const ws of peers) ws.terminate();
    await check(burst);
  });
});

// ------------------------------------------------------------------ B. headless: tool arguments

describe('hostile tool arguments (headless)', () => {
  let c: Companion;
  let tools: { name: string; inputSchema: Record<string, unknown> }[] = [];
  let baseline: unknown;

  beforeAll(async () => {
    c = new Companion(['--headless', '--deadline', '20', '--job-deadline', '20'], env());
    await c.initialize();
    const list = await c.request('tools/list', {}, 60_000);
    tools = (list as { result: { tools: typeof tools } }).result.tools;
    baseline = structured(await c.callRaw('trace', TRACE_ARGS, HANG_MS))?.structuredContent;
    expect(baseline).toMatchObject({ operation: 'trace' });
  });
  afterAll(async () => {
    await c?.close();
  });

  async function check(burst: string): Promise<void> {
    if (!c.alive) tally[burst].crashes += 1;
    expect(c.alive, `${burst}: the companion exited (${JSON.stringify(c.exited)})\n${c.stderr.slice(-3000)}`).toBe(
      true,
    );
    const st = await c.callRaw('loupe_status', '{}', HANG_MS);
    if (st === 'timeout') hang(burst);
    expect(structured(st)?.structuredContent).toMatchObject({ mode: 'headless' });
    const tr = await c.callRaw('trace', TRACE_ARGS, HANG_MS);
    if (tr === 'timeout') hang(burst);
    expect(structured(tr)?.structuredContent, `${burst}: trace`).toEqual(baseline);
    tally[burst].checks += 1;
  }

  it(`every tool, ${ARGS_PER_TOOL} argument sets each, generated from its JSON Schema`, async () => {
    const r = rng(SEED + 4);
    const burst = 'tool arguments';
    expect(tools.length).toBeGreaterThan(15);
    const answered: Record<string, number> = {};
    for (const t of tools) {
      await Promise.all(
        Array.from({ length: ARGS_PER_TOOL }, async () => {
          const args = argsFromSchema(r, t.inputSchema);
          count(burst);
          const res = await c.callRaw(t.name, args, HANG_MS);
          if (res === 'timeout') {
            hang(burst);
            throw new Error(`${t.name} did not answer within ${HANG_MS} ms: ${args.slice(0, 500)}`);
          }
          expect(c.alive, `${t.name} ${args.slice(0, 500)}: the companion exited\n${c.stderr.slice(-3000)}`).toBe(true);
          // an answer is a result (isError or not) or a JSON-RPC error; never nothing
          expect(res.result !== undefined || res.error !== undefined).toBe(true);
          const kind = res.error ? 'rpc-error' : (res.result as { isError?: boolean }).isError ? 'isError' : 'ok';
          answered[kind] = (answered[kind] ?? 0) + 1;
        }),
      );
      if (t === tools[Math.floor(tools.length / 2)]) await check(burst);
    }
    await check(burst);
    console.log(`[hostile] tool arguments answered: ${JSON.stringify(answered)}`);
  });

  it('broken JSON-RPC lines on stdin', async () => {
    const r = rng(SEED + 5);
    const burst = 'json-rpc lines';
    const lines = [
      'not json',
      '{',
      '[]',
      '{}',
      'null',
      '"x"',
      '{"jsonrpc":"2.0"}',
      '{"jsonrpc":"2.0","id":{},"method":"tools/call"}',
      '{"jsonrpc":"2.0","id":9001,"method":"tools/call","params":{"name":"trace","arguments":NaN}}',
      '{"jsonrpc":"2.0","id":9002,"method":"tools/call","params":{"name":"trace","arguments":{"prompt":1e999}}}',
      '{"jsonrpc":"2.0","id":9003,"method":"tools/call","params":{"name":"__proto__","arguments":{}}}',
      '{"jsonrpc":"2.0","id":9004,"method":"tools/call","params":null}',
      '{"jsonrpc":"2.0","id":9005,"method":"nope/nope","params":{}}',
      '{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":123456}}',
      '{"jsonrpc":"2.0","id":9006,"method":"tools/call","params":{"name":"trace","arguments":' +
        '['.repeat(10000) +
        ']'.repeat(10000) +
        '}}',
      '{"jsonrpc":"2.0","id":9007,"method":"resources/read","params":{"uri":"loupe://../../etc/passwd"}}',
      '{"jsonrpc":"2.0","id":9008,"method":"tools/call","params":{"name":"trace","arguments":{"prompt":"' +
        'y'.repeat(2_000_000) +
        '"}}}',
      // over the SDK's 10 MiB line buffer, which used to close the transport and end the companion
      '{"jsonrpc":"2.0","id":9009,"method":"tools/call","params":{"name":"trace","arguments":{"prompt":"' +
        'z'.repeat(12_000_000) +
        '"}}}',
      '{"jsonrpc":"2.0","id":9010,"method":"tools/call","params":{"name":"trace","arguments":{"prompt":"a"}}, "extra": ' +
        hostileJson(r) +
        '}',
      '{"jsonrpc":"1.0","id":9011,"method":"tools/list"}',
      // over the companion's own 64 MiB line limit: refused with an answer, the rest of the stream intact
      '{"jsonrpc":"2.0","id":9013,"method":"tools/call","params":{"name":"trace","arguments":{"prompt":"' +
        'w'.repeat(65 * 1024 * 1024) +
        '"}}}',
      '{"jsonrpc":"2.0","id":9012,"method":"tools/call","params":{"name":"trace","arguments":{"prompt":"a"' +
        ',"x":1'.repeat(100000) +
        '}}}',
      ...Array.from({ length: 20 }, () => randomLatin1(r, int(r, 1, 200)).replace(/[\r\n]/g, ' ')),
    ];
    for (const l of lines) {
      count(burst);
      let parsed: { id?: unknown } | undefined;
      try {
        parsed = JSON.parse(l);
      } catch {
        parsed = undefined;
      }
      // A line that is not JSON has no id to answer (the SDK drops it); the check below shows
      // the companion still answers. Every parseable request with an id must get an answer.
      const id = typeof parsed?.id === 'number' ? parsed.id : undefined;
      if (id !== undefined) {
        const res = await c.rawRequest(id, l, HANG_MS);
        if (res === 'timeout') hang(burst);
        expect(res, `${l.slice(0, 120)}\n${c.stderr.slice(-2000)}`).not.toBe('timeout');
      } else c.write(l);
    }
    await sleep(200);
    await check(burst);
  });
});
