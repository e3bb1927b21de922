/**
 * The checks a `loupe serve` WebSocket upgrade must pass before it is upgraded: the bridge's gates
 * (src/bridge/guard.ts) with an Origin allowlist.
 *
 *  - the peer is on loopback (the listener binds 127.0.0.1 only; this is the second wall);
 *  - Host is 127.0.0.1:<port> or localhost:<port> (a DNS-rebinding page names its own host);
 *  - Origin is present, not "null", and the server's own (http://<that Host>) or exactly one of
 *    the `--origin`s (the page's, when it is served from elsewhere);
 *  - the path is ENGINE_PATH and the subprotocol ENGINE_SUBPROTOCOL is offered;
 *  - exactly one `loupe.token.<hex>` subprotocol, equal to the server's token (constant-time).
 */
import { LOOPBACK, checkHost, checkOrigin, checkTokenProtocol, offeredProtocols } from '../bridge/guard';
import { ENGINE_PATH, ENGINE_SUBPROTOCOL } from '../share/wire';

type Headers = Record<string, string | string[] | undefined>;

export type EngineVerdict = { ok: true } | { ok: false; status: number; reason: string };

export function checkEngineUpgrade(
  req: { url?: string; headers: Headers; socket: { remoteAddress?: string } },
  o: { port: number; token: string; origins?: readonly string[] },
): EngineVerdict {
  if (!LOOPBACK.has(req.socket.remoteAddress ?? '')) return { ok: false, status: 403, reason: 'not from loopback' };
  const host = checkHost(req.headers, o.port);
  if (!host.ok) return { ok: false, status: 403, reason: host.reason };
  const badOrigin = checkOrigin(req.headers, host.host, o.origins);
  if (badOrigin) return { ok: false, status: 403, reason: badOrigin };
  const pathname = (req.url ?? '').split('?')[0];
  if (pathname !== ENGINE_PATH)
    return { ok: false, status: 404, reason: `no engine at ${JSON.stringify(pathname.slice(0, 100))}` };
  const protocols = offeredProtocols(req.headers);
  if (!protocols.includes(ENGINE_SUBPROTOCOL))
    return { ok: false, status: 400, reason: `subprotocol ${ENGINE_SUBPROTOCOL} not offered` };
  const badToken = checkTokenProtocol(protocols, o.token);
  if (badToken) return { ok: false, status: 401, reason: badToken };
  return { ok: true };
}

/** An `--origin` as the browser sends it (scheme://host[:port], no path), or null if it is not one. */
export function normalOrigin(s: string): string | null {
  try {
    const u = new URL(s);
    if (u.protocol !== 'http:' && u.protocol !== 'https:') return null;
    if (u.pathname !== '/' || u.search || u.hash || u.username) return null;
    return u.origin;
  } catch {
    return null;
  }
}
