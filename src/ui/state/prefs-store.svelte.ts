/** The page's preferences as reactive state (persisted by prefs.ts): theme and backend. */
import { prefs, type Theme } from './prefs';
import type { BackendChoice } from '../../../workers/protocol';

export class PrefStore {
  theme = $state<Theme>(prefs.theme());
  backend = $state<BackendChoice>(prefs.backend());

  setTheme(t: Theme): void {
    this.theme = t;
    prefs.setTheme(t);
  }

  setBackend(b: BackendChoice): void {
    this.backend = b;
    prefs.setBackend(b);
  }
}
