/**
 * The checks a WebSocket upgrade must pass BEFORE the hub upgrades it. Pure functions of the
 * request's headers, so each rejection is testable on its own.
 *
 *  - Host must be 127.0.0.1:<port> or localhost:<port>. A DNS-rebinding page (evil.example
 *    resolving to 127.0.0.1) sends Host: evil.example:<port>; refusing it is the defence.
 *  - Origin must be present, not "null", and exactly the hub's own origin as the browser sees it
 *    (http://<that Host>). Browsers always send Origin on WebSocket upgrades and a web page cannot
 *    forge it, so a foreign site can never reach the socket, with or without the token. Sandboxed
 *    iframes and file: pages send "null", which is refused.
 *  - The token, offered as the subprotocol `loupe.token.<hex>` next to `loupe.v1`, must equal
 *    the hub's (constant-time). It proves the peer was given the pairing URL (or can read the
 *    0600 token file), which non-browser local processes that forge Origin cannot otherwise show.
 *    On /ws/agent a forwarding companion offers `loupe.challenge.<nonce>` instead; it is then
 *    upgraded but must prove the token over the hub's nonce before anything else (hub.ts).
 */
import {
  AGENT_PATH,
  CHALLENGE_PROTOCOL_PREFIX,
  PAGE_PATH,
  SUBPROTOCOL,
  TOKEN_PROTOCOL_PREFIX,
  isHex64,
} from './protocol';
import { tokensEqual } from './token';

/** `challenge`: an agent that offered a challenge nonce instead of the token (it must then prove the token over the hub's nonce) */
export type Verdict =
  { ok: true; kind: 'page' | 'agent'; challenge?: string } | { ok: false; status: number; reason: string };

type Headers = Record<string, string | string[] | undefined>;

const one = (h: string | string[] | undefined): string | undefined =>
  Array.isArray(h) ? (h.length === 1 ? h[0] : undefined) : h;

/** a peer address on this machine (listeners bind 127.0.0.1; the address is checked again) */
export const LOOPBACK = new Set(['127.0.0.1', '::1', '::ffff:127.0.0.1']);

/** The two spellings of this hub's authority; anything else is somebody else's name for us. */
export function allowedHosts(port: number): string[] {
  return [`127.0.0.1:${port}`, `localhost:${port}`];
}

export function checkHost(headers: Headers, port: number): { ok: true; host: string } | { ok: false; reason: string } {
  const host = one(headers.host)?.toLowerCase();
  if (!host) return { ok: false, reason: 'missing Host header' };
  if (!allowedHosts(port).includes(host)) return { ok: false, reason: `foreign Host ${JSON.stringify(host)}` };
  return { ok: true, host };
}

export function offeredProtocols(headers: Headers): string[] {
  const raw = one(headers['sec-websocket-protocol']);
  return raw
    ? raw
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean)
    : [];
}

/**
 * Origin present, not "null", and this server's own origin as the browser sees it
 * (http://<host>) or exactly one of `extra` (`loupe serve --origin`).
 */
export function checkOrigin(headers: Headers, host: string, extra: readonly string[] = []): string | null {
  const origin = one(headers.origin);
  if (origin === undefined) return 'missing Origin header';
  if (origin === 'null') return 'Origin "null" is not allowed';
  const o = origin.toLowerCase();
  if (o !== `http://${host}` && !extra.some((x) => x.toLowerCase() === o))
    return `foreign Origin ${JSON.stringify(origin.slice(0, 100))}`;
  return null;
}

/** Exactly one `loupe.token.<hex>` offered, equal to the token (constant-time); else why not. */
export function checkTokenProtocol(protocols: string[], token: string): string | null {
  const offered = protocols.filter((p) => p.startsWith(TOKEN_PROTOCOL_PREFIX));
  if (offered.length === 0) return 'missing pairing token';
  if (offered.length > 1 || !tokensEqual(offered[0].slice(TOKEN_PROTOCOL_PREFIX.length), token))
    return 'wrong pairing token';
  return null;
}

export function checkUpgrade(
  url: string | undefined,
  headers: Headers,
  opts: { port: number; token: string },
): Verdict {
  const host = checkHost(headers, opts.port);
  if (!host.ok) return { ok: false, status: 403, reason: host.reason };

  const badOrigin = checkOrigin(headers, host.host);
  if (badOrigin) return { ok: false, status: 403, reason: badOrigin };

  const pathname = (url ?? '').split('?')[0];
  const kind = pathname === PAGE_PATH ? 'page' : pathname === AGENT_PATH ? 'agent' : undefined;
  if (!kind) return { ok: false, status: 404, reason: `no WebSocket endpoint at ${JSON.stringify(pathname)}` };

  const protocols = offeredProtocols(headers);
  if (!protocols.includes(SUBPROTOCOL))
    return { ok: false, status: 400, reason: `subprotocol ${SUBPROTOCOL} not offered` };
  const challenges = protocols.filter((p) => p.startsWith(CHALLENGE_PROTOCOL_PREFIX));
  if (kind === 'agent' && !protocols.some((p) => p.startsWith(TOKEN_PROTOCOL_PREFIX)) && challenges.length > 0) {
    const nonce = challenges[0].slice(CHALLENGE_PROTOCOL_PREFIX.length);
    if (challenges.length > 1 || !isHex64(nonce)) return { ok: false, status: 400, reason: 'malformed challenge' };
    return { ok: true, kind, challenge: nonce };
  }
  const badToken = checkTokenProtocol(protocols, opts.token);
  if (badToken) return { ok: false, status: 401, reason: badToken };
  return { ok: true, kind };
}
