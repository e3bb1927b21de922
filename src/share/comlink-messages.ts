/**
 * The comlink (4.4.2) messages that may cross the engine's socket, checked after a frame is decoded
 * and before comlink sees it. comlink reads a request's `argumentList` and a HANDLER's name outside
 * its own try, in a message listener: a malformed one there is an uncaught exception in whichever
 * process received it (`loupe serve`, `loupe mcp --engine`, the page's tab).
 *
 * Two kinds travel, and each channel carries one (wire.ts SocketEndpoint knows which):
 *  - requests, to an object comlink exposes: the engine's API (serve's main channel) and a proxied
 *    callback (a relayed channel its own side made). Only APPLY and RELEASE (Loupe sends no GET, SET,
 *    CONSTRUCT or ENDPOINT); `path` at most one name (none for a callback); `argumentList` an array
 *    of wire values: RAW, or HANDLER "proxy" whose value is a relayed MessagePort.
 *  - responses, to a comlink wrap: the engine's answers (the page's main channel) and a callback's
 *    (a relayed channel the other side made). RAW, or HANDLER "throw" with `{isError, value}`; a
 *    proxy is never an answer in workers/protocol.ts.
 * A message's MessagePorts must all be HANDLER "proxy" arguments (the count is the frame's port tags),
 * so no port hides in a RAW value.
 */

export type MessageKind = 'request' | 'response';

const isRecord = (v: unknown): v is Record<string, unknown> => !!v && typeof v === 'object' && !Array.isArray(v);
const isPort = (v: unknown): v is MessagePort => typeof MessagePort !== 'undefined' && v instanceof MessagePort;
const own = (o: object, k: string) => Object.prototype.hasOwnProperty.call(o, k);
const shown = (v: unknown) => JSON.stringify(String(v).slice(0, 24));

/** arguments of one call (the protocol's methods take at most four) */
export const MAX_ARGUMENTS = 16;
/** comlink's ids are four hex numbers joined by "-"; any short word is answered */
const ID = /^[\w.:-]{1,100}$/;

export const messageId = (m: unknown): string | null =>
  isRecord(m) && typeof m.id === 'string' && ID.test(m.id) ? m.id : null;

/**
 * Why `m` is not a request comlink may see (null: it may). `names`: how many path names a call may
 * have (1 for an API's methods, 0 for a callback); `ports`: the MessagePorts the frame carried.
 */
export function checkRequest(m: unknown, names: 0 | 1, ports: number): string | null {
  if (!isRecord(m)) return 'not a comlink message';
  if (messageId(m) === null) return 'a message without a well-formed id';
  if (m.type !== 'APPLY' && m.type !== 'RELEASE') return `a ${shown(m.type)} message`;
  const path = m.path;
  if (path !== undefined && (!Array.isArray(path) || path.some((p) => typeof p !== 'string')))
    return 'a path that is not a list of names';
  if (((path as string[] | undefined)?.length ?? 0) > (m.type === 'APPLY' ? names : 0)) return 'a call into the object';
  const args = m.argumentList;
  if (args === undefined && m.type === 'RELEASE') return ports ? 'a MessagePort outside an argument' : null;
  if (!Array.isArray(args)) return 'an argumentList that is not a list';
  if (args.length > MAX_ARGUMENTS) return `more than ${MAX_ARGUMENTS} arguments`;
  let proxies = 0;
  for (const a of args) {
    if (!isRecord(a)) return 'an argument that is not a wire value';
    if (a.type === 'RAW') continue;
    if (a.type !== 'HANDLER') return `an argument of type ${shown(a.type)}`;
    if (a.name !== 'proxy') return `an argument of handler ${shown(a.name)}`;
    if (!isPort(a.value)) return 'a proxied argument without its port';
    proxies++;
  }
  return proxies === ports ? null : 'a MessagePort outside an argument';
}

/** Why `m` is not a response comlink may see (null: it may). */
export function checkResponse(m: unknown, ports: number): string | null {
  if (!isRecord(m)) return 'not a comlink message';
  if (messageId(m) === null) return 'a message without a well-formed id';
  if (ports) return 'a MessagePort in an answer';
  if (m.type === 'RAW') return null;
  if (m.type !== 'HANDLER') return `an answer of type ${shown(m.type)}`;
  if (m.name !== 'throw') return `an answer of handler ${shown(m.name)}`;
  const t = m.value;
  if (!isRecord(t) || typeof t.isError !== 'boolean' || !own(t, 'value')) return 'a malformed thrown value';
  if (t.isError && !isRecord(t.value)) return 'a malformed thrown error';
  return null;
}

/** a comlink answer that throws `error` (a LoupeError's JSON), as a method that threw would be answered */
export const thrownAnswer = (id: string, error: unknown) => ({
  id,
  type: 'HANDLER',
  name: 'throw',
  value: { isError: false, value: error },
});
