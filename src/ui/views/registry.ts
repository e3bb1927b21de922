/**
 * Which view draws which document. Views load lazily, so the page's first JavaScript carries
 * neither d3 nor any view until a result is shown.
 */
import type { Component } from 'svelte';

type Loader = () => Promise<{ default: Component<{ doc: any }> }>;

const views: Record<string, Loader> = {
  trace: () => import('./TraceView.svelte'),
  activations: () => import('./ActivationsView.svelte'),
  attention: () => import('./AttentionView.svelte'),
  logit_lens: () => import('./LogitLensView.svelte'),
  generate: () => import('./GenerateView.svelte'),
  ablate: () => import('./AblateView.svelte'),
  circuit: () => import('./CircuitView.svelte'),
  layer_ablation: () => import('./LayerAblationView.svelte'),
  patch: () => import('./PatchView.svelte'),
  steer: () => import('./SteerView.svelte'),
  sweep: () => import('./SweepView.svelte'),
  causality: () => import('./CausalityView.svelte'),
  capture: () => import('./CaptureView.svelte'),
  probe: () => import('./ProbeView.svelte'),
  sae_features: () => import('./SaeFeaturesView.svelte'),
  feature: () => import('./FeatureView.svelte'),
  sae_steer: () => import('./SaeSteerView.svelte'),
};

/** operations without a dedicated view show their document as JSON */
export function viewFor(op: string): Loader | null {
  return views[op] ?? null;
}
