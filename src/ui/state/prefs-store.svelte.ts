/** The page's preferences as reactive state (persisted by prefs.ts): theme, backend, weight precision, metric unit. */
import { prefs, type Theme, type MetricUnit } from './prefs';
import type { BackendChoice } from '../../../workers/protocol';
import type { WeightsMode } from '../../engine/precision';

export class PrefStore {
  theme = $state<Theme>(prefs.theme());
  backend = $state<BackendChoice>(prefs.backend());
  weights = $state<WeightsMode>(prefs.weights());
  /** one toggle for patch, attribution patching and integrated gradients */
  metricUnit = $state<MetricUnit>(prefs.metricUnit());

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

  setMetricUnit(u: MetricUnit): void {
    this.metricUnit = u;
    prefs.setMetricUnit(u);
  }

  setWeights(w: WeightsMode): void {
    this.weights = w;
    prefs.setWeights(w);
  }
}

function applyTheme(t: Theme): void {
  if (typeof document !== 'undefined') document.documentElement.dataset.theme = t;
}
