/**
 * Moving between the SAE views: "card" on a feature of sae_features (or "steer" / "dashboard" on
 * a feature card) fills the other operation's form with the same SAE, its descriptions and the feature,
 * and switches to its tab. It does not run it: the person sets the prompts or strengths first.
 */
import { app } from '../state/instance';

interface SaeDoc {
  operation: string;
  sae: { source: string; path: string };
}

export function openSaeOp(op: 'feature' | 'sae_steer' | 'dashboard', from: SaeDoc, feature: number): void {
  const raw: Record<string, unknown> = {
    sae_source: from.sae.source,
    sae_path: from.sae.path,
    feature: String(feature),
  };
  // the dashboard scans a corpus for any subject: say this one is the feature
  if (op === 'dashboard') raw.subject = 'feature';
  // descriptions the person gave (inline JSON or a URL) go along; the ones found next to the SAE are found again
  const given = app.results[from.operation]?.input?.descriptions;
  if (given !== undefined) raw.descriptions = typeof given === 'string' ? given : JSON.stringify(given);
  app.forms.fill({ [op]: raw });
  app.forms.select(op);
  document.getElementById(`tab-${op}`)?.focus();
}

export const openFeatureCard = (from: SaeDoc, feature: number) => openSaeOp('feature', from, feature);
