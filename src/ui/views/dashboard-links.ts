/**
 * "Open dashboard" on a neuron elsewhere (trace's top-neuron tables): fills the dashboard form
 * with that neuron and switches to its tab. It does not run it: the corpus is the person's to give
 * (the form keeps the last one). SAE features go through sae-links.ts, which carries the SAE along.
 */
import { app } from '../state/instance';

export function openNeuronDashboard(layer: number, neuron: number): void {
  app.forms.fill({ dashboard: { subject: 'neuron', layer: String(layer), neuron: String(neuron) } });
  app.forms.select('dashboard');
  document.getElementById('tab-dashboard')?.focus();
}
