/** The operation's view component, chosen per build by vite.apps.config.ts. */
declare module 'virtual:loupe-app-view' {
  import type { Component } from 'svelte';
  const View: Component<{ doc: any }>;
  export default View;
}
/** the operation this bundle draws, and Loupe's version (vite.apps.config.ts `define`) */
declare const __LOUPE_APP_OP__: string;
declare const __LOUPE_APP_TITLE__: string;
declare const __LOUPE_VERSION__: string;
