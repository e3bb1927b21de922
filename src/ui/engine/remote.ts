/**
 * The page's side of `loupe serve`: a SocketEndpoint (src/share/wire.ts) over the browser's
 * WebSocket, which EngineClient takes as it takes the in-page Worker. Frames sent before the
 * socket opens wait for it; the socket's end is the endpoint's 'error' event.
 */
import { LoupeError } from '../../engine/errors';
import { TOKEN_PROTOCOL_PREFIX } from '../../bridge/protocol';
import { ENGINE_SUBPROTOCOL, SocketEndpoint } from '../../share/wire';

export function engineSocket(url: string, token: string): SocketEndpoint {
  const ws = new WebSocket(url, [ENGINE_SUBPROTOCOL, TOKEN_PROTOCOL_PREFIX + token]);
  const queue: string[] = [];
  const ep = new SocketEndpoint(
    {
      send: (t) => (ws.readyState === WebSocket.CONNECTING ? queue.push(t) : ws.send(t)),
      close: (code, reason) => ws.close(code === 1000 || (code ?? 0) >= 3000 ? code : 1000, reason),
    },
    { side: 'page' },
  );
  let opened = false;
  ws.onopen = () => {
    opened = true;
    for (const t of queue.splice(0)) ws.send(t);
    ep.dispatchEvent(new Event('open'));
  };
  ws.onmessage = (ev) => ep.receive(typeof ev.data === 'string' ? ev.data : '');
  ws.onclose = (ev) =>
    ep.closed(
      opened
        ? `the Loupe engine at ${url} went away (the connection closed${ev.code === 1006 ? '' : `, ${ev.code}`}${ev.reason ? `: ${ev.reason}` : ''})`
        : `no Loupe engine answered at ${url} (not running, a wrong token, or this page's origin not allowed)`,
    );
  return ep;
}

/** Open a socket and wait until it is open (or fail with why not). */
export function connectEngineSocket(url: string, token: string, timeoutMs = 10_000): Promise<SocketEndpoint> {
  const ep = engineSocket(url, token);
  return new Promise((resolve, reject) => {
    const fail = (message: string) => {
      clearTimeout(timer);
      ep.terminate();
      reject(
        new LoupeError(
          'ENGINE_UNREACHABLE',
          `Could not attach: ${message}.`,
          `Check that loupe serve runs (through ssh -L from another machine), the token it printed, and that it allows this page: --origin ${location.origin}.`,
        ),
      );
    };
    const timer = setTimeout(() => fail(`no answer from ${url} within ${timeoutMs / 1000} s`), timeoutMs);
    ep.addEventListener('open', () => (clearTimeout(timer), resolve(ep)), { once: true });
    ep.addEventListener('error', (ev) => fail((ev as Event & { message?: string }).message ?? 'the socket failed'), {
      once: true,
    });
  });
}
