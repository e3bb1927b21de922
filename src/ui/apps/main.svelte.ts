/**
 * An MCP Apps view's entry (one bundle per operation, vite.apps.config.ts): connect to the host,
 * take its theme, and draw the tool result's document with the page's view for the operation.
 */
import { mount } from 'svelte';
import View from 'virtual:loupe-app-view';
import '../styles.css';
import './apps.css';
import AppView from './AppView.svelte';
import { HostBridge } from './host';
import { app } from './instance.svelte';

app.op = __LOUPE_APP_OP__;
// the system's theme until the host says otherwise
app.prefs.setTheme(matchMedia('(prefers-color-scheme: dark)').matches ? 'dark' : 'light');

const props = $state({
  View,
  title: __LOUPE_APP_TITLE__,
  error: null as string | null,
  canOpenLinks: () => Boolean(bridge.capabilities.openLinks),
  openLink: (url: string) => bridge.openLink(url),
});

const bridge = new HostBridge(
  {
    context: (ctx) => {
      if (ctx.theme === 'light' || ctx.theme === 'dark') app.prefs.setTheme(ctx.theme);
    },
    input: (args) => (app.input = args),
    result: (r) => {
      if (r.isError || !r.structuredContent || typeof r.structuredContent !== 'object') {
        let msg = 'The tool returned no document.';
        try {
          const e = JSON.parse(r.content?.find((c) => c.type === 'text')?.text ?? '{}').error;
          if (e?.message) msg = `${e.code ?? 'ERROR'}: ${e.message}`;
        } catch {
          /* not a Loupe error document */
        }
        props.error = msg;
        return;
      }
      props.error = null;
      app.doc = r.structuredContent;
      const link = r._meta?.['loupe/link'];
      app.link = typeof link === 'string' && /^https?:\/\//.test(link) ? link : undefined;
    },
    cancelled: (reason) => {
      if (!app.doc) props.error = `The call was cancelled (${reason}).`;
    },
  },
  { name: `loupe-${__LOUPE_APP_OP__}`, version: __LOUPE_VERSION__ },
);
app.host = { callTool: (n, a) => bridge.callTool(n, a), canCallTools: () => Boolean(bridge.capabilities.serverTools) };

mount(AppView, { target: document.getElementById('app')!, props });
bridge.connect().catch((e) => {
  // no host answered: nothing to draw until one does
  console.warn(`Loupe view: ${(e as Error).message}`);
});
