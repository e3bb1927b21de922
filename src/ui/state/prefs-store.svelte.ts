/** The page's preferences as reactive state (persisted by prefs.ts): theme and backend. */
import { prefs, type Theme } from './prefs';
import type { BackendChoice } from '../../../workers/protocol';

export class PrefStore {
  theme = $state<Theme>(prefs.theme());
  backend = $state<BackendChoice>(prefs.backend());

  constructor() {
    applyTheme(this.theme);
  }

  setTheme(t: Theme): void {
    // the attribute changes before the state does: charts redrawn because the theme changed
    // read their colours from the new theme's CSS variables
    applyTheme(t);
    this.theme = t;
    prefs.setTheme(t);
  }

  setBackend(b: BackendChoice): void {
    this.backend = b;
    prefs.setBackend(b);
  }
}

function applyTheme(t: Theme): void {
  if (typeof document !== 'undefined') document.documentElement.dataset.theme = t;
}
