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
import { CAPS } from '../engine/caps';
import { LoupeError } from '../engine/errors';
import { fromBase64Url, toBase64Url } from './base64url';
import { checkRequest, checkResponse, messageId, thrownAnswer } from './comlink-messages';

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

/** what one frame may make as it is decoded (counted over the whole frame before any of it is made) */
export interface DecodeLimits {
  /** relayed ports (each is a MessageChannel): a comlink call carries one per proxied callback */
  ports: number;
  /** bytes of typed arrays and ArrayBuffers together */
  typedBytes: number;
}
/** a call carries at most 2 callbacks today (loadModel: progress, preview) */
export const MAX_FRAME_PORTS = 8;
export const MAX_FRAME_TYPED_BYTES = 512 * 1024 * 1024;
const LIMITS: DecodeLimits = { ports: MAX_FRAME_PORTS, typedBytes: MAX_FRAME_TYPED_BYTES };

/**
 * What one frame's text may hold, counted before it is parsed (parsed, each array or object costs
 * tens of bytes and each value eight: 64 MiB of `[],` would be 22 M arrays, 2.3 GB and 49 s to read):
 * arrays and objects, and values (the commas between them) — maxDocumentValues, as for any document.
 */
export const MAX_FRAME_CONTAINERS = 2_000_000;
export const MAX_FRAME_VALUES = CAPS.maxDocumentValues;

/** why JSON text holds too much to parse (null: it may be parsed); brackets and commas outside strings */
export function frameTooBig(text: string, maxContainers: number, maxValues: number): string | null {
  if (text.length <= 2 * Math.min(maxContainers, maxValues)) return null; // each takes two characters at least
  let containers = 0;
  let values = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      // a backslash escapes the next character
      if (c === 92) i++;
      else if (c === 34) inString = false;
    } else if (c === 34) inString = true;
    else if (c === 44) {
      if (++values > maxValues) return `more than ${maxValues} values in one frame`;
    } else if ((c === 91 || c === 123) && ++containers > maxContainers)
      return `more than ${maxContainers} arrays and objects in one frame`;
  }
  return null;
}

/** the number tag's names; own properties of a prototype-less table only (`__proto__`, `toString`: unknown) */
const NUMBERS: Readonly<Record<string, number>> = Object.assign(Object.create(null), {
  NaN: NaN,
  Infinity: Infinity,
  '-Infinity': -Infinity,
  '-0': -0,
});
const own = (o: object, k: unknown): k is string => typeof k === 'string' && Object.prototype.hasOwnProperty.call(o, k);

/**
 * An encoded value (JSON.parse's output, which it reuses) → the value. The whole frame is read once
 * first (`check`: every tag known, every name an own one, depth, and the ports and typed-array bytes
 * it would make counted against `limits`), so a refused frame has made nothing; then it is built.
 */
export function decode(v: unknown, ports?: Ports, limits: DecodeLimits = LIMITS): unknown {
  return decodeCounted(v, ports, limits).value;
}

/** decode, and the number of relayed ports the value carried */
export function decodeCounted(
  v: unknown,
  ports?: Ports,
  limits: DecodeLimits = LIMITS,
): { value: unknown; ports: number } {
  const tally = { ports: 0, typedBytes: 0 };
  check(v, 0, tally, limits);
  return { value: build(v, ports), ports: tally.ports };
}

function check(v: unknown, depth: number, tally: { ports: number; typedBytes: number }, limits: DecodeLimits): void {
  if (depth > MAX_DEPTH) throw wireError(`nested deeper than ${MAX_DEPTH}`);
  if (v === null || typeof v !== 'object') return;
  if (Array.isArray(v)) {
    for (const x of v) check(x, depth + 1, tally, limits);
    return;
  }
  const o = v as Record<string, unknown>;
  if (!own(o, TAG)) {
    for (const k of Object.keys(o)) check(o[k], depth + 1, tally, limits);
    return;
  }
  const typed = (b: unknown, what: string, per = 1) => {
    if (typeof b !== 'string' || b.length % 4 === 1) throw wireError(`a malformed ${what}`);
    const bytes = Math.floor((b.length * 3) / 4);
    if (bytes % per) throw wireError(`a ${what} of ${bytes} bytes`);
    if ((tally.typedBytes += bytes) > limits.typedBytes)
      throw wireError(`more than ${limits.typedBytes} bytes of typed arrays in one frame`);
  };
  switch (o[TAG]) {
    case 'u':
      return;
    case 'n':
      if (!own(NUMBERS, o.v)) throw wireError(`an unknown number ${JSON.stringify(o.v)?.slice(0, 40)}`);
      return;
    case 'i':
      if (typeof o.v !== 'string' || !/^-?\d{1,400}$/.test(o.v)) throw wireError('a malformed bigint');
      return;
    case 't':
      if (!own(TYPED, o.k)) throw wireError(`an unknown typed array ${JSON.stringify(o.k)?.slice(0, 40)}`);
      return typed(o.b, o.k, TYPED[o.k as TypedName].BYTES_PER_ELEMENT);
    case 'a':
      return typed(o.b, 'ArrayBuffer');
    case 'p':
      if (typeof o.id !== 'string') throw wireError('a malformed MessagePort');
      if (++tally.ports > limits.ports) throw wireError(`more than ${limits.ports} MessagePorts in one frame`);
      return;
    case 'o':
      if (!o.v || typeof o.v !== 'object' || Array.isArray(o.v)) throw wireError('a malformed escaped object');
      for (const x of Object.values(o.v as object)) check(x, depth + 1, tally, limits);
      return;
    default:
      throw wireError(`an unknown tag ${JSON.stringify(o[TAG])?.slice(0, 40)}`);
  }
}

/** the fields of a plain object decoded where they are (a key `__proto__` is JSON.parse's own field, and stays one) */
function plain(o: Record<string, unknown>, ports: Ports | undefined): Record<string, unknown> {
  for (const k of Object.keys(o)) {
    const x = o[k];
    if (x !== null && typeof x === 'object') o[k] = build(x, ports);
  }
  return o;
}

/**
 * A checked value → the value, in place: JSON.parse's arrays and objects are reused, only tags are
 * replaced, so a frame costs its parse and not a second copy (check() has refused everything this
 * could throw on, but a port id).
 */
function build(v: unknown, ports: Ports | undefined): unknown {
  if (v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) {
      const x = v[i];
      if (x !== null && typeof x === 'object') v[i] = build(x, ports);
    }
    return v;
  }
  const o = v as Record<string, unknown>;
  if (!own(o, TAG)) return plain(o, ports);
  switch (o[TAG]) {
    case 'u':
      return undefined;
    case 'n':
      return NUMBERS[o.v as string];
    case 'i':
      return BigInt(o.v as string);
    case 't': {
      const C = TYPED[o.k as TypedName];
      const bytes = base64(o.b as string);
      return new C(bytes.buffer as ArrayBuffer, bytes.byteOffset, bytes.byteLength / C.BYTES_PER_ELEMENT);
    }
    case 'a':
      return base64(o.b as string).slice().buffer;
    case 'p':
      if (!ports) throw wireError('a MessagePort outside a relaying endpoint');
      return ports.receive(o.id as string);
    default:
      return plain(o.v as Record<string, unknown>, ports); // 'o'
  }
}

function base64(s: string): Uint8Array {
  try {
    return fromBase64Url(s);
  } catch (e) {
    throw wireError(`bytes that are not base64url (${(e as Error).message})`);
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
  /** a main-channel request to take (null) or why not (after comlink-messages.ts): a refused call is answered with that error */
  accept?: (data: unknown) => string | null;
  /** what one frame may make (default MAX_FRAME_PORTS, MAX_FRAME_TYPED_BYTES) */
  maxFramePorts?: number;
  maxFrameTypedBytes?: number;
  maxFrameContainers?: number;
  maxFrameValues?: number;
  /** where refusals and a listener's exception are told (default: nowhere) */
  log?: (msg: string) => void;
}

export const MAX_CHANNELS = 1024;

/** what the engine tells a page unasked: 'model_replaced' (another connection loaded `model`) */
export interface EngineNotice {
  type: 'model_replaced';
  model: string;
  message: string;
}

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
  private readonly limits: DecodeLimits;
  private readonly maxContainers: number;
  private readonly maxValues: number;
  private readonly guards = new WeakMap<EventListenerOrEventListenerObject, (ev: Event) => void>();

  constructor(
    private readonly socket: TextSocket,
    private readonly o: EndpointOptions,
  ) {
    super();
    this.maxChannels = o.maxChannels ?? MAX_CHANNELS;
    this.releaseMs = o.releaseMs ?? 5000;
    this.maxContainers = o.maxFrameContainers ?? MAX_FRAME_CONTAINERS;
    this.maxValues = o.maxFrameValues ?? MAX_FRAME_VALUES;
    this.limits = {
      ports: o.maxFramePorts ?? MAX_FRAME_PORTS,
      typedBytes: o.maxFrameTypedBytes ?? MAX_FRAME_TYPED_BYTES,
    };
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

  /**
   * One frame from the socket. A frame that cannot be read ends the connection; a message comlink
   * must not see (comlink-messages.ts) is refused: a request is answered with a thrown BAD_INPUT, a
   * malformed answer becomes one for the call it names. Nothing here throws.
   */
  receive(text: string): void {
    if (this.done) return;
    try {
      this.take(text);
    } catch (e) {
      this.fail(`the engine's socket failed on a frame: ${(e as Error)?.message ?? String(e)}`, 1011);
    }
  }

  private take(text: string): void {
    let frame: { c?: unknown; m?: unknown };
    let data: unknown;
    let ports: number;
    try {
      const tooBig = frameTooBig(text, this.maxContainers, this.maxValues);
      if (tooBig) throw wireError(tooBig);
      frame = JSON.parse(text) as { c?: unknown; m?: unknown };
      if (!frame || typeof frame !== 'object' || (frame.c !== undefined && typeof frame.c !== 'string'))
        throw wireError('not a frame');
      if ('n' in frame) return this.takeNotice((frame as { n: unknown }).n);
      // a channel that is gone (or never was) is not read at all
      if (frame.c !== undefined && !this.channels.has(frame.c as string)) return;
      ({ value: data, ports } = decodeCounted(frame.m, this.ports, this.limits));
    } catch (e) {
      this.fail(e instanceof LoupeError ? e.message : wireError('not JSON').message);
      return;
    }
    const channel = frame.c as string | undefined;
    // requests reach what this side exposes: the API (the engine's main channel), its own callbacks
    const kind = (channel === undefined ? this.o.side === 'engine' : channel[0] === this.o.side[0])
      ? 'request'
      : 'response';
    let refused =
      kind === 'request' ? checkRequest(data, channel === undefined ? 1 : 0, ports) : checkResponse(data, ports);
    if (refused === null && kind === 'request' && channel === undefined) refused = this.o.accept?.(data) ?? null;
    if (refused !== null) {
      this.closePorts(data);
      this.o.log?.(`refused a message: ${refused}`);
      const id = messageId(data);
      if (id === null) return;
      const error = new LoupeError(
        'BAD_INPUT',
        `The engine refused the message: ${refused}.`,
        "Only the protocol's calls and answers cross the engine's socket; both ends must run the same Loupe version.",
      ).toJSON();
      // a refused request is answered; a refused answer fails the call it names, on this side
      if (kind === 'request') return this.sendFrame(channel, thrownAnswer(id, error));
      data = thrownAnswer(id, error);
    }
    if (channel === undefined) this.dispatchEvent(new MessageEvent('message', { data }));
    else {
      const port = this.channels.get(channel)!;
      const transfer = ((data as { argumentList?: { value?: unknown }[] }).argumentList ?? [])
        .map((a) => a.value)
        .filter((v): v is MessagePort => v instanceof MessagePort);
      port.postMessage(data, transfer);
      this.noteRelease(channel, data);
    }
  }

  /**
   * The engine's news for the page outside any call (`{"n": notice}`): a 'notice' event whose
   * `detail` is the notice. Only the engine sends them; only a string `type` and string fields pass.
   */
  notify(notice: EngineNotice): void {
    if (this.done || this.o.side !== 'engine') return;
    this.socket.send(JSON.stringify({ n: notice }));
  }

  private takeNotice(n: unknown): void {
    if (this.o.side !== 'page' || !n || typeof n !== 'object' || Array.isArray(n)) return;
    const entries = Object.entries(n).filter(([, v]) => typeof v === 'string');
    const detail = Object.fromEntries(entries.map(([k, v]) => [k, (v as string).slice(0, 500)]));
    if (typeof detail.type !== 'string') return;
    this.dispatchEvent(Object.assign(new Event('notice'), { detail }));
  }

  /** comlink's listeners, each run inside a try: what one throws is logged, never the process's */
  override addEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: AddEventListenerOptions | boolean,
  ): void {
    if (!listener) return;
    let guarded = this.guards.get(listener);
    if (!guarded) {
      guarded = (ev: Event) => {
        try {
          if (typeof listener === 'function') listener.call(this, ev);
          else listener.handleEvent(ev);
        } catch (e) {
          this.o.log?.(`a ${ev.type} listener threw: ${(e as Error)?.message ?? String(e)}`);
        }
      };
      this.guards.set(listener, guarded);
    }
    super.addEventListener(type, guarded, options);
  }

  override removeEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: EventListenerOptions | boolean,
  ): void {
    if (listener) super.removeEventListener(type, this.guards.get(listener) ?? listener, options);
  }

  /** the relayed ports of a refused message: closed (their channels go with the connection or by eviction) */
  private closePorts(data: unknown): void {
    const args = (data as { argumentList?: unknown } | null)?.argumentList;
    if (Array.isArray(args))
      for (const a of args)
        if ((a as { value?: unknown })?.value instanceof MessagePort) (a.value as MessagePort).close();
  }

  /** the socket ended (`error`: unexpectedly, which the endpoint's owner hears as an 'error' event) */
  closed(reason: string, error = true): void {
    if (this.done) return;
    this.done = true;
    for (const p of this.channels.values()) p.close();
    this.channels.clear();
    if (error) this.dispatchEvent(Object.assign(new Event('error'), { message: reason }));
  }

  private fail(reason: string, code = 1003): void {
    this.o.log?.(`closed the connection: ${reason}`);
    this.closed(reason);
    this.socket.close(code, reason.slice(0, 120));
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
