/**
 * The page's one manifest of operations: for each, its tab title, its place among the tabs (the
 * order of this list), the view that draws its document, and what follows a run. Adding an
 * operation to the page is one line here (plus its view). Views load lazily, so the page's first
 * JavaScript carries neither d3 nor any view until a result is shown. An operation the worker
 * lists but this manifest does not still gets a tab (after these, titled from its name) and its
 * document is shown as JSON.
 */
import type { Component } from 'svelte';

type Loader = () => Promise<{ default: Component<{ doc: any }> }>;

/** Form values a run hands on: `{ op: { field: value } }` merged into those forms. */
export type Fills = Record<string, Record<string, unknown>>;

export interface OpManifest {
  op: string;
  title: string;
  view?: Loader;
  /** what follows a run: the form fields its document fills in other operations */
  after?: (doc: any, input: Record<string, unknown>) => Fills | null;
}

const MANIFEST: OpManifest[] = [
  { op: 'trace', title: 'Trace', view: () => import('./TraceView.svelte') },
  { op: 'activations', title: 'Activations', view: () => import('./ActivationsView.svelte') },
  { op: 'attention', title: 'Attention', view: () => import('./AttentionView.svelte') },
  { op: 'logit_lens', title: 'Logit lens', view: () => import('./LogitLensView.svelte') },
  { op: 'head_scores', title: 'Head scores', view: () => import('./HeadScoresView.svelte') },
  { op: 'ablate', title: 'Ablate', view: () => import('./AblateView.svelte') },
  { op: 'circuit', title: 'Circuit', view: () => import('./CircuitView.svelte') },
  { op: 'layer_ablation', title: 'Layer ablation', view: () => import('./LayerAblationView.svelte') },
  { op: 'patch', title: 'Patch', view: () => import('./PatchView.svelte') },
  { op: 'attribution_patching', title: 'Attribution patching', view: () => import('./AttributionPatchingView.svelte') },
  { op: 'integrated_gradients', title: 'Integrated gradients', view: () => import('./IntegratedGradientsView.svelte') },
  { op: 'steer', title: 'Steer', view: () => import('./SteerView.svelte') },
  { op: 'sweep', title: 'α-sweep', view: () => import('./SweepView.svelte') },
  { op: 'causality', title: 'Causality', view: () => import('./CausalityView.svelte') },
  // a capture's handle is what the probe needs next
  { op: 'capture', title: 'Capture', view: () => import('./CaptureView.svelte'), after: (doc) => (typeof doc?.handle === 'string' ? { probe: { capture: doc.handle } } : null) },
  { op: 'probe', title: 'Probe', view: () => import('./ProbeView.svelte') },
  { op: 'generate', title: 'Generate', view: () => import('./GenerateView.svelte') },
  { op: 'sae_features', title: 'SAE features', view: () => import('./SaeFeaturesView.svelte') },
  { op: 'feature', title: 'Feature card', view: () => import('./FeatureView.svelte') },
  { op: 'sae_steer', title: 'SAE steer', view: () => import('./SaeSteerView.svelte') },
  { op: 'dashboard', title: 'Dashboard', view: () => import('./DashboardView.svelte') },
];

const byOp = new Map(MANIFEST.map((m, i) => [m.op, { ...m, order: i }]));

export function manifestOf(op: string): (OpManifest & { order: number }) | undefined {
  return byOp.get(op);
}

/** a tab title for any operation, including ones the manifest does not list */
export function opTitle(op: string): string {
  return byOp.get(op)?.title ?? op.replace(/_/g, ' ').replace(/^\w/, (c) => c.toUpperCase());
}

/** tab order: the manifest's, then unlisted operations in the worker's order */
export function opOrder(op: string): number {
  return byOp.get(op)?.order ?? MANIFEST.length;
}

/** operations without a dedicated view show their document as JSON */
export function viewFor(op: string): Loader | null {
  return byOp.get(op)?.view ?? null;
}
