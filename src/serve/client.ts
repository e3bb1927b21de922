/**
 * A Node client of `loupe serve` (`loupe mcp --engine`, and the tests): the engine's protocol
 * over a `ws` socket, as the page's endpoint does it over the browser's WebSocket. The Origin it
 * sends is the server's own, as a page served by it would send.
 */
import * as Comlink from 'comlink';
import WebSocket from 'ws';
import { LoupeError } from '../engine/errors';
import { TOKEN_PROTOCOL_PREFIX } from '../bridge/protocol';
import { isTokenShaped, readEngineRecord } from '../bridge/token';
import { ENGINE_SUBPROTOCOL, SocketEndpoint, engineTarget } from '../share/wire';
import type { EngineWorkerApi } from '../../workers/protocol';

export interface EngineConnection {
  api: Comlink.Remote<EngineWorkerApi>;
  endpoint: SocketEndpoint;
  close(): void;
}

/**
 * The token for `url`: the one in its fragment (#token=…), else $LOUPE_ENGINE_TOKEN, else the
 * record `loupe serve` wrote on this machine for that port.
 */
export async function engineToken(url: string, env = process.env): Promise<string> {
  const t = engineTarget(url);
  if (t.token) return t.token;
  if (env.LOUPE_ENGINE_TOKEN) {
    if (!isTokenShaped(env.LOUPE_ENGINE_TOKEN))
      throw new LoupeError('BAD_INPUT', 'LOUPE_ENGINE_TOKEN is not a Loupe token (64 hex digits).');
    return env.LOUPE_ENGINE_TOKEN;
  }
  const rec = await readEngineRecord(Number(new URL(t.url).port || 80));
  if (rec) return rec.token;
  throw new LoupeError(
    'BAD_INPUT',
    `No token for the engine at ${t.url}.`,
    'Give the pairing line loupe serve printed (URL#token=…), or set LOUPE_ENGINE_TOKEN.',
  );
}

export function connectEngine(url: string, token: string, timeoutMs = 10_000): Promise<EngineConnection> {
  const t = engineTarget(url);
  const u = new URL(t.url);
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(t.url, [ENGINE_SUBPROTOCOL, TOKEN_PROTOCOL_PREFIX + token], {
      origin: `http://${u.host}`,
      handshakeTimeout: timeoutMs,
      maxPayload: 1024 * 1024 * 1024,
    });
    const endpoint = new SocketEndpoint(
      { send: (s) => ws.send(s), close: (code, reason) => ws.close(code, reason) },
      { side: 'page' },
    );
    let open = false;
    ws.on('message', (d) => {
      let text: string;
      try {
        text = String(d); // over V8's longest string (~512 MiB) this throws: such a frame ends the connection
      } catch {
        endpoint.closed(`the engine at ${t.url} sent a frame too large to read`);
        return ws.close(1009, 'frame too large');
      }
      endpoint.receive(text);
    });
    ws.on('unexpected-response', (_req, res) => {
      ws.terminate();
      reject(
        new LoupeError(
          'ENGINE_UNREACHABLE',
          `The engine at ${t.url} refused the connection (HTTP ${res.statusCode}).`,
          res.statusCode === 401 ? 'Check the token: loupe serve prints it with the URL.' : undefined,
        ),
      );
    });
    ws.on('error', (e) => {
      if (!open)
        reject(
          new LoupeError('ENGINE_UNREACHABLE', `No Loupe engine at ${t.url}: ${e.message}.`, 'Is loupe serve running?'),
        );
    });
    ws.on('close', (code) => endpoint.closed(`the engine at ${t.url} closed the connection (${code})`));
    ws.on('open', () => {
      open = true;
      resolve({
        api: Comlink.wrap<EngineWorkerApi>(endpoint as unknown as Comlink.Endpoint),
        endpoint,
        close: () => endpoint.terminate(),
      });
    });
  });
}
