/**
 * The view's side of MCP Apps (the `io.modelcontextprotocol/ui` extension, spec 2026-01-26):
 * JSON-RPC 2.0 over postMessage with the host (window.parent). The view sends `ui/initialize`
 * and gets the host context (theme, dimensions), confirms with `ui/notifications/initialized`,
 * then hears `ui/notifications/tool-input` (the call's arguments), `ui/notifications/tool-result`
 * (the CallToolResult, whose structuredContent is the document) and
 * `ui/notifications/host-context-changed`. It may ask the host for `tools/call` and
 * `ui/open-link`, and reports its size with `ui/notifications/size-changed`.
 *
 * Only messages from window.parent are heard (a sandboxed view has an opaque origin, so the
 * source window is what identifies the host); a host that never answers leaves the view
 * waiting for a document, and a request the host does not answer in time fails, nothing more.
 */

export const APPS_PROTOCOL_VERSION = '2026-01-26';

export interface HostContext {
  theme?: 'light' | 'dark';
  displayMode?: string;
  containerDimensions?: Record<string, number>;
  locale?: string;
  [k: string]: unknown;
}

export interface ToolResult {
  content?: { type: string; text?: string }[];
  structuredContent?: Record<string, unknown>;
  isError?: boolean;
  _meta?: Record<string, unknown>;
}

export interface HostCapabilities {
  openLinks?: object;
  serverTools?: object;
  [k: string]: unknown;
}

export interface HostEvents {
  context(ctx: HostContext): void;
  input(args: Record<string, unknown>): void;
  result(r: ToolResult): void;
  cancelled(reason: string): void;
}

const REQUEST_MS = 10 * 60_000;

export class HostBridge {
  capabilities: HostCapabilities = {};
  private nextId = 1;
  private pending = new Map<number, { resolve(v: unknown): void; reject(e: Error): void }>();
  private readonly target: Window;

  constructor(
    private readonly events: HostEvents,
    private readonly app: { name: string; version: string },
    target: Window = window.parent,
  ) {
    this.target = target;
    window.addEventListener('message', (e) => {
      if (e.source !== this.target) return;
      this.onMessage(e.data);
    });
  }

  /** ui/initialize → host context, then ui/notifications/initialized; resizes are reported from here on */
  async connect(): Promise<void> {
    const r = (await this.request('ui/initialize', {
      protocolVersion: APPS_PROTOCOL_VERSION,
      appInfo: this.app,
      appCapabilities: { availableDisplayModes: ['inline'] },
    })) as { hostContext?: HostContext; hostCapabilities?: HostCapabilities } | undefined;
    this.capabilities = r?.hostCapabilities ?? {};
    if (r?.hostContext) this.events.context(r.hostContext);
    this.notify('ui/notifications/initialized', {});
    this.reportSize();
  }

  callTool(name: string, args: Record<string, unknown>): Promise<ToolResult> {
    return this.request('tools/call', { name, arguments: args }) as Promise<ToolResult>;
  }

  openLink(url: string): Promise<unknown> {
    return this.request('ui/open-link', { url });
  }

  private reportSize(): void {
    let last = '';
    const send = () => {
      const el = document.documentElement;
      const size = { width: Math.ceil(el.scrollWidth), height: Math.ceil(el.scrollHeight) };
      const key = `${size.width}x${size.height}`;
      if (key === last) return;
      last = key;
      this.notify('ui/notifications/size-changed', size);
    };
    let queued = false;
    new ResizeObserver(() => {
      if (queued) return;
      queued = true;
      requestAnimationFrame(() => ((queued = false), send()));
    }).observe(document.body);
    send();
  }

  private request(method: string, params: unknown): Promise<unknown> {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`The host did not answer ${method}.`));
      }, REQUEST_MS);
      this.pending.set(id, {
        resolve: (v) => (clearTimeout(timer), resolve(v)),
        reject: (e) => (clearTimeout(timer), reject(e)),
      });
      this.target.postMessage({ jsonrpc: '2.0', id, method, params }, '*');
    });
  }

  private notify(method: string, params: unknown): void {
    this.target.postMessage({ jsonrpc: '2.0', method, params }, '*');
  }

  private onMessage(m: unknown): void {
    if (!m || typeof m !== 'object' || (m as { jsonrpc?: unknown }).jsonrpc !== '2.0') return;
    const msg = m as { id?: unknown; method?: unknown; params?: unknown; result?: unknown; error?: unknown };
    if (typeof msg.method !== 'string') {
      const p = typeof msg.id === 'number' ? this.pending.get(msg.id) : undefined;
      if (!p) return;
      this.pending.delete(msg.id as number);
      if (msg.error) {
        const e = msg.error as { message?: unknown };
        p.reject(new Error(typeof e.message === 'string' ? e.message : 'The host refused the request.'));
      } else p.resolve(msg.result);
      return;
    }
    const params = (msg.params && typeof msg.params === 'object' ? msg.params : {}) as Record<string, unknown>;
    switch (msg.method) {
      case 'ui/notifications/tool-input':
        if (params.arguments && typeof params.arguments === 'object')
          this.events.input(params.arguments as Record<string, unknown>);
        return;
      case 'ui/notifications/tool-result':
        return this.events.result(params as ToolResult);
      case 'ui/notifications/tool-cancelled':
        return this.events.cancelled(typeof params.reason === 'string' ? params.reason : 'cancelled');
      case 'ui/notifications/host-context-changed':
        return this.events.context(params as HostContext);
      case 'ui/resource-teardown':
      case 'ping':
        if (msg.id !== undefined) this.target.postMessage({ jsonrpc: '2.0', id: msg.id, result: {} }, '*');
        return;
      default:
        if (msg.id !== undefined)
          this.target.postMessage(
            { jsonrpc: '2.0', id: msg.id, error: { code: -32601, message: `Method not found: ${msg.method}` } },
            '*',
          );
    }
  }
}
