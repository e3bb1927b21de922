/**
 * The page's side of the agent bridge: connects to the companion's hub over a loopback
 * WebSocket, says hello, runs the calls it receives through `execute` (page-adapter.ts maps that
 * to the page's model worker), streams progress, and answers heartbeats. Plain TypeScript, no
 * DOM and no Svelte (page-panel.ts is the panel around it):
 *
 *   const token = takePairingToken();            // from #pair=…, kept in sessionStorage
 *   const bridge = connectBridge({ token, instanceId, getModel, execute, onStatus, onLog });
 *   …  bridge.modelChanged();  …  bridge.disconnect();
 *
 * `instanceId` must be the id the worker's HandleStore mints handles with (see
 * src/ops/lib/handles.ts): the hub rejects handles of earlier page instances as expired.
 */
import { toLoupeError } from '../engine/errors';
import { newInstanceId } from '../ops/lib/handles';
import { startHeartbeat } from './heartbeat';
import type { Progress } from '../ops/types';
import {
  PAGE_PATH,
  PROTOCOL_VERSION,
  SUBPROTOCOL,
  parseMessage,
  tokenProtocol,
  type AgentInfo,
  type CallMsg,
  type PageToHub,
  type WireModel,
} from './protocol';

export interface ExecuteContext {
  onProgress(p: Progress): void;
  signal: AbortSignal;
  /** hard deadline, epoch ms (the hub fails the call then; stop working too) */
  deadline: number;
  agent?: AgentInfo;
}

export type BridgeState = 'connecting' | 'connected' | 'disconnected' | 'error';

export interface BridgeStatus {
  state: BridgeState;
  /** the agents (MCP clients) using this page through the hub */
  agents: AgentInfo[];
  /** why the state is what it is, for a person */
  detail?: string;
  /** when state is 'error' or 'connecting' after a failure: next attempt in this many ms */
  retryInMs?: number;
}

export interface BridgeLogEntry {
  id: string;
  tool: string;
  args: Record<string, unknown>;
  agent?: AgentInfo;
  state: 'running' | 'done' | 'error' | 'cancelled';
  startedAt: number;
  endedAt?: number;
  progress?: Progress;
  error?: { code: string; message: string; hint?: string };
  /** the result document (state 'done'), for "view result" */
  document?: unknown;
  link?: string;
}

export interface BridgeOptions {
  /** pairing token (64 hex) from the `#pair=` fragment */
  token: string;
  /** WebSocket URL; default ws://<this page's host>/ws/page (the hub serves the page) */
  url?: string;
  /** this page load's instance id; default a fresh one (see `pageInstanceId`) */
  instanceId?: string;
  /** stable per tab; default kept in sessionStorage */
  tabId?: string;
  /** the loaded model: ModelInfo plus `ref` {kind, id, revision, endpoint?} (never a token), or null */
  getModel?: () => WireModel;
  /** run one tool: an operation name, 'load_model' or 'list_models'. Resolve with the document;
   * reject with a LoupeError (or its JSON) — its code, message and hint reach the agent. */
  execute(tool: string, args: Record<string, unknown>, ctx: ExecuteContext): Promise<unknown>;
  /** the share link of a result, if the page wants to supply it (the companion makes one otherwise) */
  linkFor?(tool: string, args: Record<string, unknown>, document: unknown): string | undefined;
  onStatus?(s: BridgeStatus): void;
  onLog?(e: BridgeLogEntry): void;
  /** reconnect after a drop (default true) */
  reconnect?: boolean;
  /** assume the hub is gone after this long without hearing from it (default 20 s) */
  hubSilenceMs?: number;
  /** progress messages at most this often per call (default 100 ms; the last one always goes) */
  progressIntervalMs?: number;
  /** WebSocket constructor (tests in Node pass the `ws` package's) */
  WebSocketImpl?: typeof WebSocket;
}

export interface BridgeConnection {
  /** tell the hub the page loaded another model */
  modelChanged(): void;
  status(): BridgeStatus;
  /** close and stop reconnecting; running calls are cancelled */
  disconnect(): void;
}

/** One id per page load: handles minted by this page carry it. */
export const pageInstanceId: string = newInstanceId();

const PAIR_KEY = 'loupe.bridge.pair';
const TAB_KEY = 'loupe.bridge.tab';

function session(): Storage | undefined {
  try {
    return globalThis.sessionStorage;
  } catch {
    return undefined;
  }
}

/**
 * The pairing token: taken from `#pair=…` (then removed from the address bar, so it is not left
 * in a screenshot, a copied link or the history entry), else the one kept for this tab.
 */
export function takePairingToken(): string | undefined {
  const store = session();
  const loc = globalThis.location;
  if (loc?.hash) {
    const params = loc.hash.replace(/^#/, '').split('&');
    const pair = params.find((p) => p.startsWith('pair='));
    if (pair) {
      const token = decodeURIComponent(pair.slice(5));
      if (/^[0-9a-f]{64}$/.test(token)) store?.setItem(PAIR_KEY, token);
      const rest = params.filter((p) => !p.startsWith('pair=')).join('&');
      try {
        globalThis.history?.replaceState(
          globalThis.history.state,
          '',
          loc.pathname + loc.search + (rest ? '#' + rest : ''),
        );
      } catch {
        /* not fatal */
      }
    }
  }
  const t = store?.getItem(PAIR_KEY) ?? undefined;
  return t && /^[0-9a-f]{64}$/.test(t) ? t : undefined;
}

export function rememberPairingToken(token: string): void {
  if (/^[0-9a-f]{64}$/.test(token)) session()?.setItem(PAIR_KEY, token);
}

export function forgetPairingToken(): void {
  session()?.removeItem(PAIR_KEY);
}

export function tabId(): string {
  const store = session();
  let id = store?.getItem(TAB_KEY);
  if (!id) {
    id = 't' + newInstanceId();
    store?.setItem(TAB_KEY, id);
  }
  return id;
}

export function connectBridge(o: BridgeOptions): BridgeConnection {
  const WS = o.WebSocketImpl ?? globalThis.WebSocket;
  const url =
    o.url ?? `${globalThis.location?.protocol === 'https:' ? 'wss' : 'ws'}://${globalThis.location?.host}${PAGE_PATH}`;
  const instanceId = o.instanceId ?? pageInstanceId;
  const tab = o.tabId ?? tabId();
  const silenceMs = o.hubSilenceMs ?? 20_000;
  const progressMs = o.progressIntervalMs ?? 100;
  const running = new Map<string, { ctl: AbortController; entry: BridgeLogEntry }>();
  let ws: WebSocket | undefined;
  let status: BridgeStatus = { state: 'connecting', agents: [] };
  let stopped = false;
  let failures = 0;
  let retryTimer: ReturnType<typeof setTimeout> | undefined;

  const setStatus = (s: Partial<BridgeStatus>) => {
    status = { ...status, ...s };
    if (s.state === 'connected') delete status.retryInMs;
    o.onStatus?.(status);
  };
  const log = (e: BridgeLogEntry) => o.onLog?.({ ...e });
  const send = (m: PageToHub) => {
    if (ws && ws.readyState === WS.OPEN) ws.send(JSON.stringify(m));
  };

  function open(): void {
    setStatus({ state: 'connecting', detail: undefined });
    let welcomed = false;
    const sock = new WS(url, [SUBPROTOCOL, tokenProtocol(o.token)]);
    ws = sock;
    sock.onopen = () => {
      silence.heard();
      send({
        type: 'hello',
        protocol: PROTOCOL_VERSION,
        tab_id: tab,
        instance_id: instanceId,
        model: o.getModel?.() ?? null,
        app: { name: 'loupe-page' },
      });
    };
    sock.onmessage = (ev: MessageEvent) => {
      if (ws !== sock) return;
      silence.heard();
      const m = parseMessage(typeof ev.data === 'string' ? ev.data : String(ev.data));
      if (!m) return;
      switch (m.type) {
        case 'welcome':
          welcomed = true;
          failures = 0;
          return setStatus({ state: 'connected', agents: m.agents, detail: undefined });
        case 'agents':
          return setStatus({ agents: m.agents });
        case 'ping':
          return send({ type: 'pong', t: m.t });
        case 'call':
          return void runCall(m);
        case 'cancel': {
          const r = running.get(m.id);
          r?.ctl.abort();
          return;
        }
        case 'bye':
          setStatus({ detail: m.reason });
          return;
        default:
          return;
      }
    };
    sock.onclose = (ev: CloseEvent) => {
      if (ws !== sock) return;
      ws = undefined;
      for (const r of running.values()) r.ctl.abort(); // the hub has already failed them
      if (stopped) return setStatus({ state: 'disconnected', agents: [], detail: undefined });
      if (!welcomed) failures++;
      const refusedBeforeOpen = !welcomed && ev.code === 1006;
      const detail = refusedBeforeOpen
        ? 'Could not reach the Loupe companion, or it refused the pairing token. Is `loupe mcp` running? If it restarted, open the new pairing URL it printed.'
        : (status.detail ?? `Connection closed (${ev.code}${ev.reason ? `: ${ev.reason}` : ''}).`);
      if (o.reconnect === false) return setStatus({ state: 'disconnected', agents: [], detail });
      const delay = Math.min(15_000, 500 * 2 ** Math.min(failures, 5));
      setStatus({ state: failures > 1 ? 'error' : 'connecting', agents: [], detail, retryInMs: delay });
      retryTimer = setTimeout(open, delay);
    };
    sock.onerror = () => {
      /* onclose follows and decides */
    };
  }

  async function runCall(m: CallMsg): Promise<void> {
    const ctl = new AbortController();
    const entry: BridgeLogEntry = {
      id: m.id,
      tool: m.tool,
      args: m.args,
      agent: m.agent,
      state: 'running',
      startedAt: Date.now(),
    };
    running.set(m.id, { ctl, entry });
    log(entry);
    let pastDeadline = false;
    const deadlineTimer = setTimeout(
      () => {
        pastDeadline = true;
        ctl.abort();
      },
      Math.max(0, m.deadline - Date.now()),
    );
    let lastSent = 0;
    let pending: ReturnType<typeof setTimeout> | undefined;
    let latest: Progress | undefined;
    const flush = () => {
      pending = undefined;
      if (!latest || ctl.signal.aborted) return;
      lastSent = Date.now();
      send({ type: 'progress', id: m.id, done: latest.done, total: latest.total, stage: latest.stage });
      entry.progress = latest;
      log(entry);
    };
    const onProgress = (p: Progress) => {
      latest = { stage: String(p.stage), done: Number(p.done), total: Number(p.total) };
      const final = latest.total > 0 && latest.done >= latest.total;
      if (final || Date.now() - lastSent >= progressMs) {
        if (pending) clearTimeout(pending);
        flush();
      } else if (!pending) {
        pending = setTimeout(flush, progressMs);
      }
    };
    try {
      const document = await o.execute(m.tool, m.args, {
        onProgress,
        signal: ctl.signal,
        deadline: m.deadline,
        agent: m.agent,
      });
      if (pending) clearTimeout(pending);
      let link: string | undefined;
      try {
        link = o.linkFor?.(m.tool, m.args, document);
      } catch {
        link = undefined;
      }
      send({ type: 'result', id: m.id, document, ...(link ? { link } : {}) });
      Object.assign(entry, { state: 'done', endedAt: Date.now(), document, link });
    } catch (e) {
      if (pending) clearTimeout(pending);
      // our own deadline timer can fire before the hub's (timers skew on a busy machine): say which it was
      const err = pastDeadline
        ? { code: 'DEADLINE_EXCEEDED', message: `${m.tool} did not finish within its deadline.` }
        : ctl.signal.aborted
          ? { code: 'CANCELLED', message: 'The call was cancelled.' }
          : wireError(e);
      send({ type: 'error', id: m.id, error: err });
      Object.assign(entry, { state: ctl.signal.aborted ? 'cancelled' : 'error', endedAt: Date.now(), error: err });
    } finally {
      clearTimeout(deadlineTimer);
      running.delete(m.id);
      log(entry);
    }
  }

  // The hub pings every few seconds; silence means it is gone (or this tab was frozen).
  const silence = startHeartbeat({
    intervalMs: Math.max(250, Math.min(5000, silenceMs / 4)),
    silenceMs,
    onSilent: () => {
      if (ws && ws.readyState === WS.OPEN) ws.close();
    },
  });

  open();

  return {
    modelChanged() {
      send({ type: 'model', model: o.getModel?.() ?? null });
    },
    status: () => ({ ...status }),
    disconnect() {
      stopped = true;
      clearTimeout(retryTimer);
      silence.stop();
      for (const r of running.values()) r.ctl.abort();
      const s = ws;
      ws = undefined;
      s?.close(1000, 'disconnected by the user');
      setStatus({ state: 'disconnected', agents: [], detail: undefined });
    },
  };
}

function wireError(e: unknown): { code: string; message: string; hint?: string } {
  const err = toLoupeError(e);
  return { code: err.code, message: err.message, ...(err.hint ? { hint: err.hint } : {}) };
}
