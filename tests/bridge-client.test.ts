/**
 * The page-side client (src/bridge/page-client.ts, exported by src/ui/bridge-client.ts) against a
 * real hub, in Node with the `ws` package standing in for the browser's WebSocket: hello with the
 * instance id, calls executed with progress, errors carried with code and hint, cancellation and
 * deadlines reaching `execute`'s signal, heartbeats, model changes, reconnection, and a refused
 * token.
 */
import WebSocket from 'ws';
import { afterEach, describe, expect, it } from 'vitest';
import { LoupeError } from '../src/engine/errors';
import type { Hub } from '../src/bridge/hub';
import {
  connectBridge,
  takePairingToken,
  type BridgeConnection,
  type BridgeStatus,
  type ExecuteContext,
  type BridgeLogEntry,
} from '../src/ui/bridge-client';
import type { Progress } from '../src/ops/types';
import { sleep, startTestHub, until } from './bridge-fake-page';
import { newToken } from '../src/bridge/token';

const hubs: Hub[] = [];
const conns: BridgeConnection[] = [];
afterEach(async () => {
  conns.splice(0).forEach((c) => c.disconnect());
  await Promise.all(hubs.splice(0).map((h) => h.close()));
});

/** the browser sends Origin itself; in Node the ws client must be told */
function wsFor(port: number): typeof globalThis.WebSocket {
  return class extends WebSocket {
    constructor(url: string, protocols: string[]) {
      super(url, protocols, { origin: `http://127.0.0.1:${port}` });
    }
  } as unknown as typeof globalThis.WebSocket;
}

async function setup(
  execute: (tool: string, args: Record<string, unknown>, ctx: ExecuteContext) => Promise<unknown>,
  o: { hub?: Parameters<typeof startTestHub>[0]; token?: string; model?: Record<string, unknown> } = {},
) {
  const hub = await startTestHub(o.hub);
  hubs.push(hub);
  const statuses: BridgeStatus[] = [];
  const logs: BridgeLogEntry[] = [];
  let model = o.model ?? { id: 'stories260K', n_layers: 5 };
  const conn = connectBridge({
    token: o.token ?? hub.token,
    url: `ws://127.0.0.1:${hub.port}/ws/page`,
    instanceId: 'abcdefabcdef',
    tabId: 'tab-client',
    getModel: () => model,
    execute,
    linkFor: (tool) => `http://127.0.0.1:${hub.port}/#s=${tool}`,
    onStatus: (s) => statuses.push(s),
    onLog: (e) => logs.push(e),
    WebSocketImpl: wsFor(hub.port),
    progressIntervalMs: 0,
  });
  conns.push(conn);
  return { hub, conn, statuses, logs, setModel: (m: Record<string, unknown>) => (model = m) };
}

describe('connectBridge', () => {
  it('pairs (hello with instance id and model), runs calls with progress, and returns the link', async () => {
    const { hub, conn, logs } = await setup(async (tool, args, ctx) => {
      ctx.onProgress({ stage: 's', done: 1, total: 2 });
      ctx.onProgress({ stage: 's', done: 2, total: 2 });
      return { tool, echo: args };
    });
    await until(() => conn.status().state === 'connected', 3000, 'connected');
    expect(hub.status().page).toMatchObject({
      tab_id: 'tab-client',
      instance_id: 'abcdefabcdef',
      model: { id: 'stories260K' },
    });
    const seen: Progress[] = [];
    const r = await hub.execute(
      'trace',
      { prompt: 'x' },
      { deadline: Date.now() + 5000, onProgress: (p) => seen.push(p) },
    );
    expect(r.document).toEqual({ tool: 'trace', echo: { prompt: 'x' } });
    expect(r.link).toBe(`http://127.0.0.1:${hub.port}/#s=trace`);
    expect(seen.map((p) => p.done)).toEqual([1, 2]);
    const last = logs.filter((l) => l.tool === 'trace').at(-1)!;
    expect(last.state).toBe('done');
  });

  it("carries execute's LoupeError code, message and hint", async () => {
    const { hub, conn } = await setup(async () => {
      throw new LoupeError('UNKNOWN_TOKEN', 'nope', 'try " love"');
    });
    await until(() => conn.status().state === 'connected');
    const e = await hub.execute('trace', {}, { deadline: Date.now() + 5000 }).catch((x) => x);
    expect(e).toMatchObject({ code: 'UNKNOWN_TOKEN', message: 'nope', hint: 'try " love"' });
    // the worker's JSON form of an error works too
    const { hub: hub2, conn: conn2 } = await setup(async () => {
      throw { error: { code: 'NO_MODEL', message: 'no model', hint: 'load one' } };
    });
    await until(() => conn2.status().state === 'connected');
    expect(await hub2.execute('trace', {}, { deadline: Date.now() + 5000 }).catch((x) => x)).toMatchObject({
      code: 'NO_MODEL',
      hint: 'load one',
    });
  });

  it('client cancellation and deadlines abort the signal given to execute', async () => {
    const aborted: string[] = [];
    const { hub, conn } = await setup(
      (tool, _args, ctx) =>
        new Promise((_r, reject) => {
          ctx.signal.addEventListener('abort', () => {
            aborted.push(tool);
            reject(new Error('stopped'));
          });
        }),
    );
    await until(() => conn.status().state === 'connected');
    const ctl = new AbortController();
    const a = hub.execute('sweep', {}, { deadline: Date.now() + 10_000, signal: ctl.signal }).catch((x) => x);
    await sleep(50);
    ctl.abort();
    expect((await a).code).toBe('CANCELLED');
    await until(() => aborted.includes('sweep'), 1000, 'execute to see the cancel');
    const d = await hub.execute('circuit', {}, { deadline: Date.now() + 200 }).catch((x) => x);
    expect(d.code).toBe('DEADLINE_EXCEEDED');
    await until(() => aborted.includes('circuit'), 1000, 'execute to see the deadline');
  });

  it('answers heartbeats (the hub keeps it), reports model changes, reconnects after a drop', async () => {
    // the drop window (20 beats, 1 s) is wide enough that a busy machine's pauses do not drop a
    // page that answers (3 beats, 150 ms, did under load ~13), and the wait outlasts it: a page
    // that did not answer would be gone by the check
    const { hub, conn, setModel } = await setup(async () => 'ok', { hub: { heartbeatMs: 50, missedBeats: 20 } });
    await until(() => conn.status().state === 'connected');
    await sleep(1500); // 30 heartbeats
    expect(hub.status().page?.instance_id).toBe('abcdefabcdef');
    setModel({ id: 'induction-gpt2' });
    conn.modelChanged();
    await until(
      () => (hub.status().page?.model as { id?: string } | null)?.id === 'induction-gpt2',
      1000,
      'the model change',
    );
    // the hub drops the page (as on a companion hiccup): the client comes back by itself
    hub.activePage!.close('test drop');
    await until(() => hub.status().page === null, 1000);
    await until(() => hub.status().page !== null, 3000, 'the client to reconnect');
    expect((await hub.execute('trace', {}, { deadline: Date.now() + 5000 })).document).toBe('ok');
  });

  it('a refused token ends in an error state and never pairs', async () => {
    const { hub, conn, statuses } = await setup(async () => 'never', { token: newToken() });
    await until(
      () => statuses.some((s) => s.state === 'error' || (s.state === 'connecting' && s.detail)),
      5000,
      'a refusal',
    );
    expect(conn.status().state).not.toBe('connected');
    expect(hub.status().page).toBeNull();
    expect(conn.status().detail).toMatch(/refused the pairing token|Could not reach/);
  });

  it('disconnect() closes the socket and stops reconnecting', async () => {
    const { hub, conn } = await setup(async () => 'x');
    await until(() => conn.status().state === 'connected');
    conn.disconnect();
    await until(() => hub.status().page === null, 1000);
    await sleep(800);
    expect(hub.status().page).toBeNull();
    expect(conn.status().state).toBe('disconnected');
  });
});

describe('takePairingToken', () => {
  it('reads #pair=, keeps it for the tab, and removes it from the address bar', () => {
    const store = new Map<string, string>();
    const token = newToken();
    let replaced = '';
    const g = globalThis as Record<string, unknown>;
    const saved = { location: g.location, history: g.history, sessionStorage: g.sessionStorage };
    g.location = { hash: `#pair=${token}&s=abc`, pathname: '/', search: '' };
    g.history = { state: null, replaceState: (_s: unknown, _t: string, url: string) => (replaced = url) };
    g.sessionStorage = {
      getItem: (k: string) => store.get(k) ?? null,
      setItem: (k: string, v: string) => store.set(k, v),
      removeItem: (k: string) => store.delete(k),
    };
    try {
      expect(takePairingToken()).toBe(token);
      expect(replaced).toBe('/#s=abc'); // the share link part stays
      g.location = { hash: '', pathname: '/', search: '' };
      expect(takePairingToken()).toBe(token); // from sessionStorage after the fragment is gone
      g.location = { hash: '#pair=not-a-token', pathname: '/', search: '' };
      expect(takePairingToken()).toBe(token); // a malformed one does not replace it
    } finally {
      Object.assign(g, saved);
    }
  });
});
