/**
 * The one heartbeat watchdog of the bridge's links (hub ↔ agent, hub ↔ page, forwarder ↔ hub,
 * page ↔ hub). Every `intervalMs` it either finds the peer silent for longer than `silenceMs`
 * and calls `onSilent` (each tick until the link is stopped), or sends a `ping` when given one.
 * Any message counts as a sign of life (`heard`), not just a pong.
 *
 * App-level pings rather than WebSocket protocol pings: a browser's network stack answers protocol
 * pings even when the page's JavaScript is hung; only the page itself answers these.
 */
export interface Heartbeat {
  /** the peer said something */
  heard(): void;
  stop(): void;
}

export interface HeartbeatOptions {
  intervalMs: number;
  silenceMs: number;
  /** send a ping (omitted by a side that only listens for the other's pings) */
  ping?: () => void;
  onSilent: () => void;
}

export function startHeartbeat(o: HeartbeatOptions): Heartbeat {
  let lastHeard = Date.now();
  const timer = setInterval(() => {
    if (Date.now() - lastHeard > o.silenceMs) return o.onSilent();
    o.ping?.();
  }, o.intervalMs);
  // never keep a Node process alive just to ping (no-op in browsers)
  (timer as { unref?: () => void }).unref?.();
  return {
    heard: () => {
      lastHeard = Date.now();
    },
    stop: () => clearInterval(timer),
  };
}
