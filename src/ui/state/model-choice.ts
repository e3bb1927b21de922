/** What the page can load, and when two references name the same model (plain functions, no state). */
import type { ShareModel } from '../../share/codec';
import { DEFAULT_ENDPOINT } from './prefs';

/** what the page can ask to load (a token is added from prefs for Hub models, never stored here) */
export type ModelChoice =
  | { kind: 'bundled' }
  /** `requested`: the catalog name (engine/catalog.ts) the id was picked or typed by */
  | { kind: 'hub'; id: string; revision: string; endpoint: string; requested?: string }
  | { kind: 'url'; id: string }
  | { kind: 'folder'; name: string; files: Record<string, Blob> };

export function sameModel(a: ShareModel | null | undefined, b: ShareModel | null | undefined): boolean {
  if (!a || !b) return false;
  // two known commits decide (a link's branch may have moved since); else the revisions
  const sameRev = a.commit && b.commit ? a.commit === b.commit : a.revision === b.revision;
  return (
    a.kind === b.kind && a.id === b.id && (a.kind === 'bundled' || sameRev) && (a.endpoint ?? '') === (b.endpoint ?? '')
  );
}

export function choiceOf(m: ShareModel): ModelChoice {
  if (m.kind === 'bundled') return { kind: 'bundled' };
  if (m.kind === 'url') return { kind: 'url', id: m.id };
  // a link that names a commit loads that commit: the same weights even after the branch moved
  return {
    kind: 'hub',
    id: m.id,
    revision: m.commit || m.revision || 'main',
    endpoint: m.endpoint ?? DEFAULT_ENDPOINT,
  };
}
