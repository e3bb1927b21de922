/**
 * The engine's worker protocol (workers/protocol.ts, spoken by comlink) over a WebSocket: the page
 * attached to `loupe serve`, and `loupe mcp --engine`. A SocketEndpoint is what comlink takes for
 * a Worker (postMessage, message events), and the page's EngineClient takes it for one too.
 *
 * Frames are JSON text, `{"c": channel, "m": message}`; no `c` is the main channel. The codec keeps
 * what JSON alone loses and structured clone keeps: undefined, NaN, ±Infinity and -0, typed arrays
 * and ArrayBuffers (as base64url), and MessagePorts. comlink passes a proxied callback (progress,
 * a load's preview) as a MessagePort; a port cannot cross a socket, so each one is relayed: the
 * sender names it by a channel id and forwards what arrives on it, and the receiver makes a
 * MessageChannel, hands its second port on in the port's place and forwards the first's messages
 * back. Both ends run this same code.
 */
import { LoupeError } from '../engine/errors';
import { fromBase64Url, toBase64Url } from './base64url';

/** where `loupe serve` listens for the page (ws://127.0.0.1:<port>/engine) and the subprotocol it speaks */
export const ENGINE_PATH = '/engine';
export const ENGINE_SUBPROTOCOL = 'loupe.engine.v1';

/**
 * What a person pastes to attach: the pairing line `ws://127.0.0.1:5179/engine#token=<hex>`, or
 * the URL alone (ws:, wss:, or http(s): of the same server; a bare host:port; the path defaults
 * to ENGINE_PATH). The token never goes into the URL the socket opens.
 */
export function engineTarget(raw: string): { url: string; token?: string } {
  let s = raw.trim();
  if (!/^[a-z]+:\/\//i.test(s)) s = `ws://${s}`;
  let u: URL;
  try {
    u = new URL(s);
  } catch {
    throw new LoupeError('BAD_INPUT', `"${raw.slice(0, 80)}" is not an engine URL.`, ENGINE_URL_HINT);
  }
  const scheme = { 'ws:': 'ws:', 'wss:': 'wss:', 'http:': 'ws:', 'https:': 'wss:' }[u.protocol];
  if (!scheme || u.username || u.password)
    throw new LoupeError('BAD_INPUT', `"${raw.slice(0, 80)}" is not an engine URL.`, ENGINE_URL_HINT);
  const token = /(?:^#|&)token=([0-9a-f]{64})(?:&|$)/.exec(u.hash)?.[1];
  if (u.hash && !token)
    throw new LoupeError('BAD_INPUT', 'The token after #token= must be the 64 hex digits loupe serve printed.');
  const path = u.pathname === '/' ? ENGINE_PATH : u.pathname;
  return { url: `${scheme}//${u.host}${path}`, ...(token ? { token } : {}) };
}
const ENGINE_URL_HINT = 'Paste the pairing line loupe serve printed: ws://127.0.0.1:<port>/engine#token=…';

/** the tag key of an encoded value; a plain object that has it is escaped ({"~": "o", v}) */
const TAG = '~';
const TYPED = {
  Float32Array,
  Float64Array,
  Int8Array,
  Int16Array,
  Int32Array,
  Uint8Array,
  Uint8ClampedArray,
  Uint16Array,
  Uint32Array,
  BigInt64Array,
  BigUint64Array,
} as const;
type TypedName = keyof typeof TYPED;

/** how deep a message may nest (documents are a few levels; a hostile frame is refused) */
export const MAX_DEPTH = 64;

export interface Ports {
  /** the channel id a port being sent is relayed under */
  send(port: MessagePort): string;
  /** the port to hand on in place of a relayed one the other side named */
  receive(id: string): MessagePort;
}

function wireError(message: string): LoupeError {
  return new LoupeError(
    'BAD_INPUT',
    `A message on the engine's socket could not be read: ${message}.`,
    'Both ends must run the same Loupe version.',
  );
}

/** A value → JSON-safe form (see the file comment). Functions, symbols, Maps and Sets are refused. */
export function encode(v: unknown, ports?: Ports, depth = 0): unknown {
  if (depth > MAX_DEPTH) throw wireError(`nested deeper than ${MAX_DEPTH}`);
  if (v === undefined) return { [TAG]: 'u' };
  if (typeof v === 'number') {
    if (Number.isNaN(v)) return { [TAG]: 'n', v: 'NaN' };
    if (v === Infinity) return { [TAG]: 'n', v: 'Infinity' };
    if (v === -Infinity) return { [TAG]: 'n', v: '-Infinity' };
    if (Object.is(v, -0)) return { [TAG]: 'n', v: '-0' };
    return v;
  }
  if (v === null || typeof v === 'string' || typeof v === 'boolean') return v;
  if (typeof v === 'bigint') return { [TAG]: 'i', v: v.toString() };
  if (typeof v !== 'object') throw wireError(`a ${typeof v} cannot be sent`);
  if (Array.isArray(v)) return v.map((x) => encode(x, ports, depth + 1));
  if (ArrayBuffer.isView(v)) {
    const name = v.constructor.name as TypedName;
    if (!(name in TYPED)) throw wireError(`a ${v.constructor.name} cannot be sent`);
    return { [TAG]: 't', k: name, b: toBase64Url(new Uint8Array(v.buffer, v.byteOffset, v.byteLength)) };
  }
  if (v instanceof ArrayBuffer) return { [TAG]: 'a', b: toBase64Url(new Uint8Array(v)) };
  if (typeof MessagePort !== 'undefined' && v instanceof MessagePort) {
    if (!ports) throw wireError('a MessagePort outside a relaying endpoint');
    return { [TAG]: 'p', id: ports.send(v) };
  }
  const proto = Object.getPrototypeOf(v);
  if (proto !== Object.prototype && proto !== null && !(v instanceof Error))
    throw wireError(`a ${(v as object).constructor?.name ?? 'object'} cannot be sent`);
  const out: Record<string, unknown> = {};
  if (v instanceof Error) {
    // as structured clone keeps them
    out.name = v.name;
    out.message = v.message;
  }
  for (const [k, x] of Object.entries(v)) out[k] = encode(x, ports, depth + 1);
  return TAG in out ? { [TAG]: 'o', v: out } : out;
}

export function decode(v: unknown, ports?: Ports, depth = 0): unknown {
  if (depth > MAX_DEPTH) throw wireError(`nested deeper than ${MAX_DEPTH}`);
  if (v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) return v.map((x) => decode(x, ports, depth + 1));
  const o = v as Record<string, unknown>;
  if (!(TAG in o)) {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(o)) out[k] = decode(x, ports, depth + 1);
    return out;
  }
  switch (o[TAG]) {
    case 'u':
      return undefined;
    case 'n': {
      const n = ({ NaN: NaN, Infinity: Infinity, '-Infinity': -Infinity, '-0': -0 } as Record<string, number>)[
        String(o.v)
      ];
      if (n === undefined) throw wireError(`an unknown number ${JSON.stringify(o.v)}`);
      return n;
    }
    case 'i':
      if (typeof o.v !== 'string' || !/^-?\d{1,400}$/.test(o.v)) throw wireError('a malformed bigint');
      return BigInt(o.v);
    case 't': {
      const C = TYPED[o.k as TypedName];
      if (!C || !Object.prototype.hasOwnProperty.call(TYPED, o.k as string) || typeof o.b !== 'string')
        throw wireError(`an unknown typed array ${JSON.stringify(o.k)}`);
      const bytes = fromBase64Url(o.b);
      if (bytes.byteLength % C.BYTES_PER_ELEMENT) throw wireError(`a ${o.k} of ${bytes.byteLength} bytes`);
      return new C(bytes.buffer as ArrayBuffer, bytes.byteOffset, bytes.byteLength / C.BYTES_PER_ELEMENT);
    }
    case 'a':
      if (typeof o.b !== 'string') throw wireError('a malformed ArrayBuffer');
      return fromBase64Url(o.b).slice().buffer;
    case 'p':
      if (!ports || typeof o.id !== 'string') throw wireError('a MessagePort outside a relaying endpoint');
      return ports.receive(o.id);
    case 'o': {
      if (!o.v || typeof o.v !== 'object' || Array.isArray(o.v)) throw wireError('a malformed escaped object');
      const out: Record<string, unknown> = {};
      for (const [k, x] of Object.entries(o.v as Record<string, unknown>)) out[k] = decode(x, ports, depth + 1);
      return out;
    }
    default:
      throw wireError(`an unknown tag ${JSON.stringify(o[TAG]).slice(0, 40)}`);
  }
}

/** The socket under an endpoint: text out; the owner feeds text in with `receive` and calls `closed`. */
export interface TextSocket {
  send(text: string): void;
  close(code?: number, reason?: string): void;
}

export interface EndpointOptions {
  /** prefix of the channel ids this end allocates (the two ends must differ) */
  side: 'page' | 'engine';
  /** relayed ports kept at most; the oldest is closed for a new one */
  maxChannels?: number;
  /** how long a channel lives after a comlink RELEASE passed over it */
  releaseMs?: number;
  /** a main-channel message to take (null) or why not: a refused call is answered with that error */
  accept?: (data: unknown) => string | null;
}

export const MAX_CHANNELS = 1024;

/**
 * A comlink Endpoint (and enough of a Worker for EngineClient) over a TextSocket. The socket's
 * end, or a frame that cannot be read, is an 'error' event: EngineClient fails its pending calls
 * with it, as for a worker that crashed.
 */
export class SocketEndpoint extends EventTarget {
  private channels = new Map<string, MessagePort>();
  private next = 0;
  private done = false;
  private readonly maxChannels: number;
  private readonly releaseMs: number;
  private readonly ports: Ports;

  constructor(
    private readonly socket: TextSocket,
    private readonly o: EndpointOptions,
  ) {
    super();
    this.maxChannels = o.maxChannels ?? MAX_CHANNELS;
    this.releaseMs = o.releaseMs ?? 5000;
    this.ports = {
      send: (port) => {
        const id = `${o.side[0]}${++this.next}`;
        this.relay(id, port);
        return id;
      },
      receive: (id) => {
        if (this.channels.has(id) || !/^[pe]\d{1,15}$/.test(id) || id[0] === o.side[0])
          throw wireError(`a port id ${JSON.stringify(id)} that is not new`);
        const mc = new MessageChannel();
        this.relay(id, mc.port1);
        return mc.port2;
      },
    };
  }

  get channelCount(): number {
    return this.channels.size;
  }

  /** comlink's postMessage: the transfer list is not needed (every port in the message is relayed) */
  postMessage(message: unknown, _transfer?: Transferable[]): void {
    this.sendFrame(undefined, message);
  }

  /** a Worker's start() and terminate(): terminate closes the socket */
  start(): void {}
  terminate(): void {
    this.closed('the engine was detached', false);
    this.socket.close(1000, 'detached');
  }

  /** one frame from the socket */
  receive(text: string): void {
    if (this.done) return;
    let frame: { c?: unknown; m?: unknown };
    let data: unknown;
    try {
      frame = JSON.parse(text) as { c?: unknown; m?: unknown };
      if (!frame || typeof frame !== 'object' || (frame.c !== undefined && typeof frame.c !== 'string'))
        throw wireError('not a frame');
      data = decode(frame.m, this.ports);
    } catch (e) {
      this.fail(e instanceof LoupeError ? e.message : wireError('not JSON').message);
      return;
    }
    if (frame.c === undefined) {
      const refused = this.o.accept?.(data) ?? null;
      if (refused === null) this.dispatchEvent(new MessageEvent('message', { data }));
      else this.refuse(data, refused);
    } else {
      const port = this.channels.get(frame.c as string);
      port?.postMessage(data);
      this.noteRelease(frame.c as string, data);
    }
  }

  /** the socket ended (`error`: unexpectedly, which the endpoint's owner hears as an 'error' event) */
  closed(reason: string, error = true): void {
    if (this.done) return;
    this.done = true;
    for (const p of this.channels.values()) p.close();
    this.channels.clear();
    if (error) this.dispatchEvent(Object.assign(new Event('error'), { message: reason }));
  }

  /** answer a refused comlink call with a thrown LoupeError, as a method that threw would be */
  private refuse(data: unknown, reason: string): void {
    const id = (data as { id?: unknown } | null)?.id;
    if (typeof id !== 'string' && typeof id !== 'number') return;
    const error = new LoupeError('BAD_INPUT', `The engine refused the message: ${reason}.`).toJSON();
    this.sendFrame(undefined, { id, type: 'HANDLER', name: 'throw', value: { isError: false, value: error } });
  }

  private fail(reason: string): void {
    this.closed(reason);
    this.socket.close(1003, reason.slice(0, 120));
  }

  private sendFrame(channel: string | undefined, message: unknown): void {
    if (this.done) return;
    let text: string;
    try {
      text = JSON.stringify(
        channel === undefined ? { m: encode(message, this.ports) } : { c: channel, m: encode(message, this.ports) },
      );
    } catch (e) {
      // what cannot be sent is this side's bug; say so on the main channel's listeners
      this.dispatchEvent(Object.assign(new Event('messageerror'), { message: (e as Error).message }));
      return;
    }
    this.socket.send(text);
    if (channel !== undefined) this.noteRelease(channel, message);
  }

  private relay(id: string, port: MessagePort): void {
    if (this.channels.size >= this.maxChannels) {
      const [oldest, p] = this.channels.entries().next().value as [string, MessagePort];
      p.close();
      this.channels.delete(oldest);
    }
    this.channels.set(id, port);
    port.onmessage = (ev: MessageEvent) => this.sendFrame(id, ev.data);
    (port as { unref?: () => void }).unref?.(); // Node: a relayed callback does not keep the process alive
  }

  /** a comlink RELEASE ends the proxy on that channel: the channel goes once its answer has passed */
  private noteRelease(id: string, data: unknown): void {
    if (!data || typeof data !== 'object' || (data as { type?: unknown }).type !== 'RELEASE') return;
    const t = setTimeout(() => {
      this.channels.get(id)?.close();
      this.channels.delete(id);
    }, this.releaseMs);
    (t as { unref?: () => void }).unref?.();
  }
}
