/**
 * The page's side of its service worker (src/sw/sw.ts, built into dist/sw.js): register it, reload once on the
 * first visit so the page comes back cross-origin isolated, say when a new build's worker is ready, and keep why the
 * page is not isolated (for the Doctor).
 *
 * Not registered on a loopback page that is already isolated with no worker of its own: `npm start`, `loupe mcp` and
 * the dev server send the headers themselves, and a cache there would only go stale between builds.
 */
import type { SwMessage } from '../../sw/shell';

export type SwStatus = 'off' | 'unavailable' | 'failed' | 'installing' | 'active';

const RELOAD_KEY = 'loupe.sw-reload';
const LOOPBACK = new Set(['127.0.0.1', 'localhost', '[::1]']);

export class ServiceWorkerState {
  status = $state<SwStatus>('off');
  /** why the page is not cross-origin isolated, or why there is no worker */
  reason = $state('');
  /** the build the active worker serves, and whether its shell is in the cache (the page opens offline) */
  version = $state<string | null>(null);
  cached = $state<boolean | null>(null);
  cacheError = $state<string | null>(null);
  /** a new build's worker is installed and waits for applyUpdate() */
  updateReady = $state(false);
  private reg: ServiceWorkerRegistration | null = null;
  /** applyUpdate() asked the new worker to take over */
  private updating = false;
  private reloadAsked = false;

  constructor(private readonly notify: (kind: 'info' | 'warn', text: string, ms?: number) => void) {}

  async start(): Promise<void> {
    const container = typeof navigator !== 'undefined' ? navigator.serviceWorker : undefined;
    if (!container) {
      this.status = 'unavailable';
      this.reason = window.isSecureContext
        ? 'this browser or window offers no service workers (a private window or a setting may refuse them)'
        : 'service workers need a secure page (https or localhost)';
      return;
    }
    if (import.meta.env.DEV || (crossOriginIsolated && LOOPBACK.has(location.hostname) && !container.controller)) {
      this.reason = 'the server sends the isolation headers itself';
      return;
    }
    container.addEventListener('message', (e) => this.onMessage(e.data as SwMessage));
    container.addEventListener('controllerchange', () => this.onControllerChange());
    this.status = 'installing';
    this.reason = 'its service worker has not taken over yet (the page reloads once when it has)';
    try {
      this.reg = await container.register('./sw.js', { scope: './' });
    } catch (e) {
      this.status = 'failed';
      this.reason = `its service worker did not install (${(e as Error).message})`;
      return;
    }
    if (!this.reg) {
      // a browser (or an automation setting) that blocks workers without an error
      this.status = 'failed';
      this.reason = 'this browser refused its service worker';
      return;
    }
    this.watchUpdates(this.reg);
    await container.ready;
    this.status = 'active';
    container.controller?.postMessage({ type: 'status' } satisfies SwMessage);
    if (!crossOriginIsolated) {
      if (container.controller) this.reloadOnce();
      // else the worker claims the page (controllerchange), then the page reloads
    } else {
      this.reason = '';
      this.clearReloadMark();
    }
  }

  /** Hand the page to the waiting worker of a new build; the page reloads when it takes over. */
  applyUpdate(): void {
    const waiting = this.reg?.waiting;
    if (!waiting) return;
    this.updating = true;
    waiting.postMessage({ type: 'skip-waiting' } satisfies SwMessage);
  }

  private watchUpdates(reg: ServiceWorkerRegistration): void {
    const check = () => {
      if (reg.waiting && navigator.serviceWorker.controller) this.updateReady = true;
    };
    check();
    reg.addEventListener('updatefound', () => {
      const w = reg.installing;
      w?.addEventListener('statechange', () => w.state === 'installed' && check());
    });
  }

  private onControllerChange(): void {
    if (this.updating) location.reload();
    else if (!crossOriginIsolated) this.reloadOnce();
  }

  /** Reload, at most once per tab and page for isolation (a page still not isolated after it stays as it is). */
  private reloadOnce(): void {
    if (this.reloadAsked) return;
    this.reloadAsked = true;
    let done: string | null = null;
    try {
      done = sessionStorage.getItem(RELOAD_KEY);
      if (done !== location.pathname) sessionStorage.setItem(RELOAD_KEY, location.pathname);
    } catch {
      this.reason = 'the page could not note its reload (no session storage), so it stays single-threaded';
      return;
    }
    if (done === location.pathname) {
      this.reason = 'the page was reloaded under its service worker and is still not isolated';
      return;
    }
    location.reload();
  }

  private clearReloadMark(): void {
    try {
      sessionStorage.removeItem(RELOAD_KEY);
    } catch {
      /* nothing to clear */
    }
  }

  private onMessage(m: SwMessage): void {
    if (m?.type !== 'status-reply') return;
    this.version = m.version;
    this.cached = m.cached;
    this.cacheError = m.error ?? null;
    if (!m.cached)
      this.notify(
        'warn',
        `Loupe could not keep an offline copy of itself${m.error ? ` (${m.error})` : ''}; it works from the network.`,
        0,
      );
  }
}
