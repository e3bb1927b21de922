/**
 * The hub and the app protocol, with a fake page (a `ws` client the test drives): calls,
 * progress, errors, and every way a call must end — page gone, reload, deadline, lost
 * heartbeats, client cancellation, stale handles, no page.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { LoupeError } from '../src/engine/errors';
import type { Hub } from '../src/bridge/hub';
import { mintHandle } from '../src/ops/lib/handles';
import type { Progress } from '../src/ops/types';
import { FakePage, sleep, startTestHub, until } from './bridge-fake-page';

const hubs: Hub[] = [];
const pages: FakePage[] = [];
async function hubWith(o: Parameters<typeof startTestHub>[0] = {}) {
  const h = await startTestHub(o);
  hubs.push(h);
  return h;
}
async function pageOn(h: Hub, o: Partial<Parameters<typeof FakePage.connect>[1]> = {}) {
  const p = await FakePage.connect(h.port, { token: h.token, ...o });
  pages.push(p);
  return p;
}
afterEach(async () => {
  await Promise.all(pages.splice(0).map((p) => p.close()));
  await Promise.all(hubs.splice(0).map((h) => h.close()));
});

const soon = (ms = 10_000) => Date.now() + ms;

/** Settle a promise into {ok, value|error, at} so timing can be checked. */
function track<T>(p: Promise<T>) {
  const s: { done: boolean; value?: T; error?: LoupeError; at?: number } = { done: false };
  p.then(
    (v) => Object.assign(s, { done: true, value: v, at: Date.now() }),
    (e) => Object.assign(s, { done: true, error: e, at: Date.now() }),
  );
  return s;
}

describe('calls through a paired page', () => {
  it('runs a call, relays progress in order, and returns the document with the page instance', async () => {
    const hub = await hubWith();
    const page = await pageOn(hub, { model: { id: 'stories260K', n_layers: 5 } });
    const seen: Progress[] = [];
    const call = hub.execute('trace', { prompt: 'Hi' }, { deadline: soon(), onProgress: (p) => seen.push(p) });
    const m = await page.waitCall();
    expect(m).toMatchObject({ tool: 'trace', args: { prompt: 'Hi' } });
    expect(m.deadline).toBeGreaterThan(Date.now());
    page.progress(m.id, 1, 3, 'a');
    page.progress(m.id, 2, 3, 'a');
    page.result(m.id, { operation: 'trace', x: 1 }, 'http://127.0.0.1/#s=abc');
    const r = await call;
    expect(r.document).toEqual({ operation: 'trace', x: 1 });
    expect(r.link).toBe('http://127.0.0.1/#s=abc');
    expect(r.instance_id).toBe(page.instanceId);
    expect(seen).toEqual([
      { done: 1, total: 3, stage: 'a' },
      { done: 2, total: 3, stage: 'a' },
    ]);
    expect(hub.status().page).toMatchObject({
      tab_id: page.tabId,
      instance_id: page.instanceId,
      model: { id: 'stories260K' },
    });
  });

  it("relays the page's error with its code, message and hint", async () => {
    const hub = await hubWith();
    const page = await pageOn(hub);
    const call = track(hub.execute('trace', {}, { deadline: soon() }));
    const m = await page.waitCall();
    page.error(m.id, 'UNKNOWN_TOKEN', 'no such token', 'use a single-token string');
    await until(() => call.done);
    expect(call.error).toBeInstanceOf(LoupeError);
    expect(call.error).toMatchObject({
      code: 'UNKNOWN_TOKEN',
      message: 'no such token',
      hint: 'use a single-token string',
    });
  });

  it('keeps concurrent calls apart', async () => {
    const hub = await hubWith();
    const page = await pageOn(hub);
    const a = hub.execute('a', {}, { deadline: soon() });
    const b = hub.execute('b', {}, { deadline: soon() });
    const mb = await page.waitCall(2);
    const ma = page.calls[0];
    page.result(mb.id, 'B');
    page.result(ma.id, 'A');
    expect((await a).document).toBe('A');
    expect((await b).document).toBe('B');
  });
});

describe('failure handling', () => {
  it('page closed mid-call: every pending call fails with PAGE_GONE within a second', async () => {
    const hub = await hubWith();
    const page = await pageOn(hub);
    const calls = [
      track(hub.execute('x', {}, { deadline: soon() })),
      track(hub.execute('y', {}, { deadline: soon() })),
    ];
    await page.waitCall(2);
    const t0 = Date.now();
    page.ws.terminate(); // an abrupt close, as when a tab crashes
    await until(() => calls.every((c) => c.done), 1000, 'both calls to fail');
    for (const c of calls) {
      expect(c.error?.code).toBe('PAGE_GONE');
      expect(c.at! - t0).toBeLessThan(1000);
    }
    await until(() => hub.status().page === null, 1000, 'page to be forgotten');
  });

  it('page reloaded (same tab, new instance) fails the old calls at once; the new page serves the next call', async () => {
    const hub = await hubWith();
    const old = await pageOn(hub, { tabId: 'tab-1' });
    const pending = track(hub.execute('sweep', {}, { deadline: soon() }));
    await old.waitCall();
    const t0 = Date.now();
    // the new instance says hello while the old socket is still open
    const fresh = await pageOn(hub, { tabId: 'tab-1' });
    await until(() => pending.done, 1000, 'the old call to fail');
    expect(pending.error?.code).toBe('PAGE_GONE');
    expect(pending.at! - t0).toBeLessThan(1000);
    fresh.onCall = (m, p) => p.result(m.id, 'ok');
    expect((await hub.execute('trace', {}, { deadline: soon() })).instance_id).toBe(fresh.instanceId);
    expect(old.calls).toHaveLength(1);
  });

  it('a hard deadline fails the call with DEADLINE_EXCEEDED and cancels it in the page', async () => {
    const hub = await hubWith();
    const page = await pageOn(hub);
    const t0 = Date.now();
    const call = track(hub.execute('circuit', {}, { deadline: Date.now() + 300 }));
    const m = await page.waitCall();
    await until(() => call.done, 2000);
    expect(call.error?.code).toBe('DEADLINE_EXCEEDED');
    expect(call.at! - t0).toBeGreaterThanOrEqual(290);
    expect(call.at! - t0).toBeLessThan(1000);
    await until(() => page.cancels.includes(m.id), 1000, 'cancel to reach the page');
    // a late answer from the page is ignored, and the page stays usable
    page.result(m.id, 'late');
    page.onCall = (c, p) => p.result(c.id, 'next');
    expect((await hub.execute('trace', {}, { deadline: soon() })).document).toBe('next');
  });

  it('a page that stops answering heartbeats is dropped and its calls fail; one that answers stays', async () => {
    const hub = await hubWith({ heartbeatMs: 100, missedBeats: 3 });
    const alive = await pageOn(hub, { tabId: 'alive' });
    const hung = await pageOn(hub, { tabId: 'hung' }); // most recent: calls go here
    const call = track(hub.execute('sweep', {}, { deadline: soon() }));
    await hung.waitCall();
    const t0 = Date.now();
    hung.hung = true;
    await until(() => call.done, 1500, 'the hung page to be dropped');
    expect(call.error?.code).toBe('PAGE_GONE');
    expect(call.error?.message).toMatch(/stopped answering/);
    expect(call.at! - t0).toBeLessThan(1000);
    await sleep(400); // > 3 beats: the answering page must still be there
    expect(hub.status().page?.tab_id).toBe('alive');
    alive.onCall = (m, p) => p.result(m.id, 'still here');
    expect((await hub.execute('trace', {}, { deadline: soon() })).document).toBe('still here');
  });

  it('client cancellation fails the call with CANCELLED and sends cancel to the page', async () => {
    const hub = await hubWith();
    const page = await pageOn(hub);
    const ctl = new AbortController();
    const call = track(hub.execute('sweep', {}, { deadline: soon(), signal: ctl.signal }));
    const m = await page.waitCall();
    ctl.abort();
    await until(() => call.done, 500);
    expect(call.error?.code).toBe('CANCELLED');
    await until(() => page.cancels.includes(m.id), 1000, 'cancel to reach the page');
  });

  it('rejects handles minted by a previous page instance as HANDLE_EXPIRED without calling the page', async () => {
    const hub = await hubWith();
    const first = await pageOn(hub, { tabId: 'tab-h' });
    const oldHandle = mintHandle('capture', first.instanceId);
    const second = await pageOn(hub, { tabId: 'tab-h' }); // reload
    second.onCall = (m, p) => p.result(m.id, 'ran');
    const stale = track(hub.execute('probe', { capture_id: oldHandle }, { deadline: soon() }));
    await until(() => stale.done, 1000);
    expect(stale.error?.code).toBe('HANDLE_EXPIRED');
    expect(second.calls).toHaveLength(0);
    // nested in arrays too
    const nested = track(hub.execute('probe', { sets: [{ ids: [oldHandle] }] }, { deadline: soon() }));
    await until(() => nested.done, 1000);
    expect(nested.error?.code).toBe('HANDLE_EXPIRED');
    // a handle of the current instance goes through
    const current = mintHandle('capture', second.instanceId);
    expect((await hub.execute('probe', { capture_id: current }, { deadline: soon() })).document).toBe('ran');
    expect(second.calls[0].args).toEqual({ capture_id: current });
  });

  it('with no page: NO_PAGE naming the pairing URL, after the short wait', async () => {
    const hub = await hubWith({ noPageWaitMs: 300 });
    const t0 = Date.now();
    const e = await hub.execute('trace', {}, { deadline: soon() }).catch((x) => x);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(290);
    expect(e.code).toBe('NO_PAGE');
    expect(e.message).toContain(hub.pairingUrl);
    expect(hub.pairingUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/#pair=[0-9a-f]{64}$/);
  });

  it('a call made just before the page pairs waits for it', async () => {
    const hub = await hubWith({ noPageWaitMs: 3000 });
    const call = hub.execute('trace', {}, { deadline: soon() });
    await sleep(100);
    const page = await pageOn(hub);
    page.onCall = (m, p) => p.result(m.id, 'late pairing');
    if (page.calls[0]) page.result(page.calls[0].id, 'late pairing');
    expect((await call).document).toBe('late pairing');
  });

  it('refuses a hello with another protocol version', async () => {
    const hub = await hubWith();
    const WebSocket = (await import('ws')).default;
    const { SUBPROTOCOL, tokenProtocol, PAGE_PATH } = await import('../src/bridge/protocol');
    const ws = new WebSocket(`ws://127.0.0.1:${hub.port}${PAGE_PATH}`, [SUBPROTOCOL, tokenProtocol(hub.token)], {
      origin: `http://127.0.0.1:${hub.port}`,
    });
    const msgs: string[] = [];
    ws.on('message', (d) => msgs.push(d.toString()));
    await new Promise((r) => ws.once('open', r));
    ws.send(JSON.stringify({ type: 'hello', protocol: 999, tab_id: 't', instance_id: 'i', model: null }));
    const code = await new Promise<number>((r) => ws.once('close', (c) => r(c)));
    expect(code).toBe(4000);
    expect(msgs.join()).toMatch(/protocol 999 is not supported/);
    expect(hub.status().page).toBeNull();
  });
});
