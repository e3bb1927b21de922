import { mount } from 'svelte';
import './styles.css';
import App from './App.svelte';
import { app } from './state/instance';

mount(App, { target: document.getElementById('app')! });
void app.init();

// a handle for the e2e suite and for poking at the page from the devtools console
(globalThis as unknown as { __loupe: typeof app }).__loupe = app;
