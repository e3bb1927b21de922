import { mount } from 'svelte';
import './styles.css';
import App from './App.svelte';
import { app, serviceWorker } from './state/instance';
import { warmFonts } from './charts/fonts';

mount(App, { target: document.getElementById('app')! });
void app.init();
void serviceWorker.start();
// the charts' font faces are laid out once while the page is idle, not in a result's first frame
requestIdleCallback(warmFonts, { timeout: 3000 });

// a handle for the e2e suite and for poking at the page from the devtools console
(globalThis as unknown as { __loupe: typeof app }).__loupe = app;
