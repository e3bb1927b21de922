/**
 * The engine socket's codec and port relay (src/share/wire.ts): what structured clone keeps and
 * JSON loses comes back as it went, refusals are structured, and comlink's proxied callbacks
 * cross two endpoints joined by an in-memory "socket" and are let go after a RELEASE.
 */
import { describe, expect, it } from 'vitest';
import * as Comlink from 'comlink';
import {
  decode,
  encode,
  engineTarget,
  frameTooBig,
  MAX_DEPTH,
  MAX_FRAME_PORTS,
  SocketEndpoint,
} from '../src/share/wire';
import { checkRequest, checkResponse } from '../src/share/comlink-messages';

const round = (v: unknown) => decode(JSON.parse(JSON.stringify(encode(v))));

describe('wire codec', () => {
  it('keeps undefined, NaN, ±Infinity, -0, bigint and typed arrays', () => {
    const v = {
      u: undefined,
      list: [1, undefined, NaN, Infinity, -Infinity, -0, null],
      big: 12345678901234567890n,
      f32: new Float32Array([0.1, -2.5e-38, 3.4e38, NaN]),
      i32: new Int32Array([-1, 2 ** 31 - 1]),
      u8: new Uint8Array([0, 255]).subarray(1),
      f64: new Float64Array([Math.PI]),
      ab: new Uint8Array([7, 8, 9]).buffer,
      nested: { deep: [{ x: 'é✓' }] },
    };
    const r = round(v) as typeof v;
    expect(Object.keys(r)).toEqual(Object.keys(v));
    expect('u' in r && r.u === undefined).toBe(true);
    expect(r.list[1]).toBeUndefined();
    expect(r.list[2]).toBeNaN();
    expect(r.list.slice(3, 5)).toEqual([Infinity, -Infinity]);
    expect(Object.is(r.list[5], -0)).toBe(true);
    expect(r.big).toBe(v.big);
    expect(r.f32).toBeInstanceOf(Float32Array);
    // bit for bit: a float32 document crosses exactly
    expect([...new Uint32Array(r.f32.buffer)]).toEqual([...new Uint32Array(v.f32.buffer)]);
    expect([...r.i32]).toEqual([-1, 2 ** 31 - 1]);
    expect([...r.u8]).toEqual([255]);
    expect(r.f64[0]).toBe(Math.PI);
    expect([...new Uint8Array(r.ab)]).toEqual([7, 8, 9]);
    expect(r.nested).toEqual(v.nested);
  });

  it('escapes a plain object that has the tag key', () => {
    const v = { '~': 'u', v: 1, inner: { '~': 't', k: 'Float32Array', b: 'AAAA' } };
    expect(round(v)).toEqual(v);
  });

  it('refuses what cannot be sent or read, as BAD_INPUT', () => {
    expect(() => encode({ f: () => 1 })).toThrow(/function cannot be sent/);
    expect(() => encode(new Map())).toThrow(/Map cannot be sent/);
    let deep: unknown = 1;
    for (let i = 0; i <= MAX_DEPTH + 1; i++) deep = [deep];
    expect(() => encode(deep)).toThrow(/deeper/);
    expect(() => decode({ '~': 'zz' })).toThrow(/unknown tag/);
    expect(() => decode({ '~': 't', k: 'constructor', b: '' })).toThrow(/typed array/);
    expect(() => decode({ '~': 't', k: 'Float32Array', b: 'AAA' })).toThrow(/bytes/);
    expect(() => decode({ '~': 'n', v: 'e' })).toThrow(/number/);
    expect(() => decode({ '~': 'p', id: 'e1' })).toThrow(/MessagePort/);
    try {
      decode({ '~': 'zz' });
    } catch (e) {
      expect((e as { code?: string }).code).toBe('BAD_INPUT');
    }
  });

  it('refuses number tags that name anything but its own four (no prototype lookups)', () => {
    for (const v of ['__proto__', 'constructor', 'toString', 'valueOf', 'hasOwnProperty', 'isPrototypeOf', 1, null])
      expect(() => decode({ '~': 'n', v }), String(v)).toThrow(/unknown number/);
    for (const k of ['__proto__', 'toString', 'BYTES_PER_ELEMENT'])
      expect(() => decode({ '~': 't', k, b: '' }), k).toThrow(/typed array/);
    // a key "__proto__" stays an own field, as JSON.parse makes it, and sets no prototype
    const r = decode(JSON.parse('{"__proto__":{"polluted":1},"o":{"~":"o","v":{"__proto__":[1]}}}')) as any;
    expect(Object.getPrototypeOf(r)).toBe(Object.prototype);
    expect(Object.keys(r)).toEqual(['__proto__', 'o']);
    expect(r.polluted).toBeUndefined();
    expect(Object.getOwnPropertyDescriptor(r.o, '__proto__')?.value).toEqual([1]);
  });

  it('counts what a frame would make before making any of it', () => {
    const made: string[] = [];
    const ports = { send: () => 'x', receive: (id: string) => (made.push(id), new MessageChannel().port2) };
    const tags = (n: number) => Array.from({ length: n }, (_, i) => ({ '~': 'p', id: `p${i}` }));
    expect(() => decode(tags(MAX_FRAME_PORTS + 1), ports)).toThrow(/more than 8 MessagePorts/);
    expect(made).toEqual([]);
    // a bad tag after good ones: nothing made either
    expect(() => decode([...tags(2), { '~': 'zz' }], ports)).toThrow(/unknown tag/);
    expect(made).toEqual([]);
    const f32 = { '~': 't', k: 'Float32Array', b: 'AAAAAAAAAAA' }; // 8 bytes
    expect(() => decode([f32, f32, f32], undefined, { ports: 0, typedBytes: 20 })).toThrow(/more than 20 bytes/);
    expect(decode([f32, f32], undefined, { ports: 0, typedBytes: 20 })).toHaveLength(2);
  });

  it('counts a frame’s arrays, objects and values on its text, before parsing it', () => {
    const text = (n: number) => JSON.stringify({ m: Array.from({ length: n }, () => ({})) });
    expect(frameTooBig(text(8), 10, 100)).toBeNull(); // 8, the array and the frame
    expect(frameTooBig(text(20), 10, 100)).toMatch(/more than 10 arrays and objects/);
    expect(frameTooBig(JSON.stringify({ m: Array(50).fill(0) }), 100, 20)).toMatch(/more than 20 values/);
    // brackets, commas and escaped quotes inside strings are not counted
    expect(frameTooBig(JSON.stringify({ m: ['[{,'.repeat(100) + '\\"[' + '{'.repeat(100)] }), 10, 10)).toBeNull();
    const closed: number[] = [];
    const ep = new SocketEndpoint(
      { send: () => {}, close: (c) => void closed.push(c ?? 0) },
      { side: 'engine', maxFrameContainers: 10 },
    );
    ep.receive(text(20));
    expect(closed).toEqual([1003]);
  });

  it('checks comlink messages: only APPLY and RELEASE requests, RAW and thrown answers', () => {
    const port = new MessageChannel().port1;
    const call = (argumentList: unknown, path: unknown = ['ping']) => ({
      id: 'a-1',
      type: 'APPLY',
      path,
      argumentList,
    });
    expect(checkRequest(call([]), 1, 0)).toBeNull();
    expect(
      checkRequest(
        call([
          { type: 'RAW', value: 1 },
          { type: 'HANDLER', name: 'proxy', value: port },
        ]),
        1,
        1,
      ),
    ).toBeNull();
    expect(checkRequest(call([{ type: 'HANDLER', name: 'proxy', value: port }]), 1, 2)).toMatch(/outside an argument/);
    expect(checkRequest(call([], []), 0, 0)).toBeNull();
    expect(checkRequest(call([], ['ping']), 0, 0)).toMatch(/into the object/);
    expect(checkRequest({ id: 'a', type: 'RELEASE' }, 1, 0)).toBeNull();
    expect(checkRequest({ id: 'a', type: 'RELEASE', path: ['x'] }, 1, 0)).toMatch(/into the object/);
    expect(checkResponse({ id: 'a', type: 'RAW', value: { x: 1 } }, 0)).toBeNull();
    expect(
      checkResponse({ id: 'a', type: 'HANDLER', name: 'throw', value: { isError: false, value: 1 } }, 0),
    ).toBeNull();
    expect(checkResponse({ id: 'a', type: 'HANDLER', name: 'throw', value: { isError: true, value: 'x' } }, 0)).toMatch(
      /thrown error/,
    );
    expect(checkResponse({ id: 'a', type: 'HANDLER', name: 'proxy', value: port }, 1)).toMatch(/MessagePort/);
    expect(checkResponse({ id: 'a', type: 'APPLY' }, 0)).toMatch(/type/);
  });

  it('reads a pairing line, a URL and a bare host:port', () => {
    const tok = 'ab'.repeat(32);
    expect(engineTarget(`ws://127.0.0.1:5179/engine#token=${tok}`)).toEqual({
      url: 'ws://127.0.0.1:5179/engine',
      token: tok,
    });
    expect(engineTarget('127.0.0.1:5179')).toEqual({ url: 'ws://127.0.0.1:5179/engine' });
    expect(engineTarget('https://box.example')).toEqual({ url: 'wss://box.example/engine' });
    expect(() => engineTarget('ftp://x')).toThrow(/not an engine URL/);
    expect(() => engineTarget('ws://127.0.0.1:5179/engine#token=short')).toThrow(/64 hex/);
  });
});

/** two endpoints joined back to back, as the page and the server are by a socket */
function pair(): { page: SocketEndpoint; engine: SocketEndpoint; frames: string[] } {
  const frames: string[] = [];
  let page!: SocketEndpoint;
  let engine!: SocketEndpoint;
  const close = () => {
    page.closed('closed');
    engine.closed('closed');
  };
  page = new SocketEndpoint(
    { send: (t) => (frames.push(t), queueMicrotask(() => engine.receive(t))), close },
    { side: 'page', releaseMs: 10 },
  );
  engine = new SocketEndpoint(
    { send: (t) => queueMicrotask(() => page.receive(t)), close },
    { side: 'engine', releaseMs: 10 },
  );
  return { page, engine, frames };
}

describe('SocketEndpoint', () => {
  it('carries comlink calls with proxied callbacks through relayed ports', async () => {
    const { page, engine } = pair();
    Comlink.expose(
      {
        async run(n: number, onStep: (i: number) => Promise<string>) {
          const got: string[] = [];
          for (let i = 0; i < n; i++) got.push(await onStep(i));
          return { got, data: new Float32Array([n]) };
        },
      },
      engine as unknown as Comlink.Endpoint,
    );
    const api = Comlink.wrap<{
      run(n: number, f: (i: number) => Promise<string>): Promise<{ got: string[]; data: Float32Array }>;
    }>(page as unknown as Comlink.Endpoint);
    const r = await api.run(
      3,
      Comlink.proxy(async (i: number) => `step ${i}`),
    );
    expect(r.got).toEqual(['step 0', 'step 1', 'step 2']);
    expect(r.data).toBeInstanceOf(Float32Array);
    expect(page.channelCount).toBe(1);
    expect(engine.channelCount).toBe(1);
    page.terminate();
  });

  it('turns a frame it cannot read into an error event and closes', async () => {
    const closedWith: number[] = [];
    const ep = new SocketEndpoint({ send: () => {}, close: (c) => void closedWith.push(c ?? 0) }, { side: 'page' });
    const errors: string[] = [];
    ep.addEventListener('error', (e) => errors.push((e as Event & { message: string }).message));
    ep.receive('{not json');
    expect(errors[0]).toMatch(/could not be read/);
    expect(closedWith).toEqual([1003]);
  });

  it('refuses a port id the other side could not have made', () => {
    const ep = new SocketEndpoint({ send: () => {}, close: () => {} }, { side: 'engine' });
    const errors: string[] = [];
    ep.addEventListener('error', (e) => errors.push((e as Event & { message: string }).message));
    ep.receive(JSON.stringify({ m: { '~': 'p', id: 'e5' } })); // its own side's prefix
    expect(errors[0]).toMatch(/port id/);
  });

  it('runs each listener inside a try: one that throws is logged, the next frame is read', () => {
    const logged: string[] = [];
    const ep = new SocketEndpoint({ send: () => {}, close: () => {} }, { side: 'page', log: (m) => logged.push(m) });
    const seen: unknown[] = [];
    const bad = () => {
      throw new TypeError('a listener bug');
    };
    ep.addEventListener('message', bad);
    ep.addEventListener('message', (e) => seen.push((e as MessageEvent).data.id));
    ep.receive(JSON.stringify({ m: { id: 'x1', type: 'RAW', value: 1 } }));
    ep.removeEventListener('message', bad);
    ep.receive(JSON.stringify({ m: { id: 'x2', type: 'RAW', value: 1 } }));
    expect(seen).toEqual(['x1', 'x2']);
    expect(logged).toEqual(['a message listener threw: a listener bug']);
  });

  it('keeps at most maxChannels relayed ports', () => {
    const ep = new SocketEndpoint({ send: () => {}, close: () => {} }, { side: 'engine', maxChannels: 4 });
    for (let i = 1; i <= 10; i++) ep.receive(JSON.stringify({ m: { '~': 'p', id: `p${i}` } }));
    expect(ep.channelCount).toBe(4);
    ep.closed('done', false);
    expect(ep.channelCount).toBe(0);
  });
});
