/**
 * The page's Agent panel, in plain DOM (the page mounts it with `mountBridge(host, app)`):
 * pairing state, Connect / Disconnect, which agents are connected, and a live log of their calls
 * with a way to view each result. Everything an agent sends is shown with textContent only —
 * tool names, arguments and agent names are untrusted text.
 */
import { resultLink, shareModelOf } from './link';
import {
  connectBridge,
  rememberPairingToken,
  takePairingToken,
  type BridgeConnection,
  type BridgeLogEntry,
  type BridgeStatus,
} from './page-client';
import { pageExecutor, wireModel, type BridgeApp } from './page-adapter';

const MAX_LOG = 30;

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  props: Partial<HTMLElementTagNameMap[K]> & { dataset?: Record<string, string> } = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  const { dataset, ...rest } = props;
  Object.assign(e, rest);
  if (dataset) Object.assign(e.dataset, dataset);
  for (const c of children) e.append(c);
  return e;
}

const STATE_TEXT: Record<BridgeStatus['state'], string> = {
  connecting: 'connecting…',
  connected: 'connected',
  disconnected: 'disconnected',
  error: 'cannot connect',
};

export function mountBridge(host: HTMLElement, app: BridgeApp & { op?: string }): () => void {
  let token = takePairingToken();
  let conn: BridgeConnection | undefined;
  let status: BridgeStatus = { state: 'disconnected', agents: [] };
  const log: BridgeLogEntry[] = [];

  const dot = el('span', { className: 'bridge-dot', ariaHidden: 'true' });
  const stateText = el('span', { className: 'bridge-state', dataset: { testid: 'bridge-state' } });
  const agentsText = el('span', { className: 'bridge-agents small', dataset: { testid: 'bridge-agents' } });
  const detail = el('div', { className: 'bridge-detail small' });
  const button = el('button', { type: 'button', className: 'bridge-toggle', dataset: { testid: 'bridge-toggle' } });
  const pairInput = el('input', {
    type: 'text',
    placeholder: 'paste the pairing URL printed by `loupe mcp`',
    ariaLabel: 'Pairing URL',
    className: 'bridge-pair-input',
    dataset: { testid: 'bridge-pair-input' },
  });
  const pairButton = el('button', { type: 'button', textContent: 'Pair', dataset: { testid: 'bridge-pair' } });
  const pairRow = el('div', { className: 'bridge-pair' }, pairInput, pairButton);
  const list = el('ol', { className: 'bridge-log', ariaLabel: 'Agent calls', dataset: { testid: 'bridge-log' } });
  const root = el(
    'section',
    { className: 'bridge-panel', ariaLabel: 'Agent bridge' },
    el(
      'div',
      { className: 'bridge-head' },
      dot,
      el('strong', { textContent: 'Agent ' }),
      stateText,
      ' ',
      agentsText,
      ' ',
      button,
    ),
    detail,
    pairRow,
    list,
  );
  host.replaceChildren(root);

  function render(): void {
    root.dataset.state = status.state;
    dot.dataset.state = status.state;
    stateText.textContent = token ? STATE_TEXT[status.state] : 'not paired';
    agentsText.textContent =
      status.state === 'connected'
        ? status.agents.length
          ? `— ${status.agents.map((a) => a.name + (a.version ? ` ${a.version}` : '')).join(', ')}`
          : '— no agent yet'
        : '';
    detail.textContent = !token
      ? 'Run `loupe mcp` (your MCP client starts it) and open the pairing URL it prints, or paste it below.'
      : (status.detail ?? '');
    pairRow.hidden = !!token && status.state !== 'error';
    button.hidden = !token;
    button.textContent = conn ? 'Disconnect' : 'Connect';
  }

  function renderLog(): void {
    list.replaceChildren(
      ...log.map((e) => {
        const when = new Date(e.startedAt).toLocaleTimeString();
        const state =
          e.state === 'running'
            ? e.progress && e.progress.total > 0
              ? `running ${Math.round((100 * e.progress.done) / e.progress.total)}%`
              : 'running'
            : e.state === 'done'
              ? `done in ${Math.round((e.endedAt ?? e.startedAt) - e.startedAt)} ms`
              : e.state === 'cancelled'
                ? 'cancelled'
                : `failed: ${e.error?.code ?? ''}`;
        const item = el(
          'li',
          { className: `bridge-call ${e.state}`, title: JSON.stringify(e.args).slice(0, 500) },
          el('span', { className: 'small', textContent: when + ' ' }),
          el('code', { textContent: e.tool }),
          el('span', { className: 'small', textContent: ` ${e.agent?.name ? `by ${e.agent.name} ` : ''}· ${state}` }),
        );
        if (
          e.state === 'done' &&
          e.document !== undefined &&
          typeof (e.document as { operation?: unknown }).operation === 'string'
        ) {
          const show = el('button', { type: 'button', className: 'link small', textContent: 'view' });
          show.onclick = () => {
            app.results = {
              ...app.results,
              [e.tool]: { op: e.tool, input: e.args, doc: e.document, model: app.modelRef, ms: null, fromLink: false },
            };
            if ('op' in app) app.op = e.tool;
          };
          item.append(' ', show);
          if (e.link)
            item.append(
              ' ',
              el('a', { href: e.link, target: '_blank', rel: 'noopener', className: 'small', textContent: 'link' }),
            );
        }
        if (e.error?.message) item.append(el('div', { className: 'small err', textContent: e.error.message }));
        return item;
      }),
    );
  }

  function connect(): void {
    if (!token || conn) return;
    conn = connectBridge({
      token,
      instanceId: app.instanceId,
      getModel: () => wireModel(app),
      execute: pageExecutor(app),
      linkFor: (tool, args, document) => resultLink(location.href, shareModelOf(wireModel(app)), tool, args, document),
      onStatus: (s) => {
        status = s;
        render();
      },
      onLog: (e) => {
        const i = log.findIndex((x) => x.id === e.id);
        if (i >= 0) log[i] = e;
        else log.unshift(e);
        log.length = Math.min(log.length, MAX_LOG);
        renderLog();
      },
    });
    render();
  }

  function disconnect(): void {
    conn?.disconnect();
    conn = undefined;
    render();
  }

  button.onclick = () => (conn ? disconnect() : connect());
  pairButton.onclick = () => {
    const v = pairInput.value.trim();
    const m = /(?:#|&|^)pair=([0-9a-f]{64})/.exec(v) ?? /^([0-9a-f]{64})$/.exec(v);
    if (!m) {
      detail.textContent = 'That is not a Loupe pairing URL (it ends with #pair= and 64 hex digits).';
      return;
    }
    disconnect();
    rememberPairingToken(m[1]);
    token = m[1];
    pairInput.value = '';
    connect();
  };

  // The page tells the hub when its model changes (the user loaded another one).
  let lastModel = app.model;
  const watch = setInterval(() => {
    if (app.model !== lastModel) {
      lastModel = app.model;
      conn?.modelChanged();
    }
  }, 500);

  render();
  connect(); // opening the pairing URL is the user's consent to pair this tab

  return () => {
    clearInterval(watch);
    disconnect();
    host.replaceChildren();
  };
}
