/**
 * The shareable link of a tool result: the workbench URL with the page's own share fragment
 * (`#s=…`, src/share/codec.ts) holding the model, the operation, its input and — when small —
 * the document. Opening it re-runs the operation locally, exactly as a link copied in the page.
 */
import { shareUrl, type ShareModel } from '../share/codec';

/** A model's share reference from what the page or engine reports; undefined when a link could
 * not reopen it (a local folder exists only on this machine, not in a browser). */
export function shareModelOf(model: Record<string, unknown> | null | undefined): ShareModel | undefined {
  if (!model) return undefined;
  const ref = model.ref as Record<string, unknown> | undefined;
  if (ref && typeof ref.id === 'string' && (ref.kind === 'bundled' || ref.kind === 'hub' || ref.kind === 'url')) {
    return {
      kind: ref.kind,
      id: ref.id,
      revision: typeof ref.revision === 'string' ? ref.revision : '',
      ...(typeof ref.endpoint === 'string' ? { endpoint: ref.endpoint } : {}),
    };
  }
  const source = model.source;
  const id = typeof model.id === 'string' ? model.id : undefined;
  if (!id) return undefined;
  if (source === 'bundled') return { kind: 'bundled', id, revision: '' };
  if (source === 'hub')
    return {
      kind: 'hub',
      id,
      revision: typeof model.revision === 'string' && model.revision ? model.revision : 'main',
    };
  if (source === 'url') return { kind: 'url', id, revision: '' };
  return undefined;
}

export function resultLink(
  pageUrl: string,
  model: ShareModel | undefined,
  op: string,
  input: Record<string, unknown>,
  document: unknown,
): string | undefined {
  if (!model) return undefined;
  try {
    return shareUrl(pageUrl, { v: 1, model, op, input, result: document }).url;
  } catch {
    return undefined; // a link is a convenience; never fail a tool call over it
  }
}
