/**
 * From attribution patching's head map to a head's attention pattern: clicking a head runs the
 * `attention` operation for that head on the same clean prompt and switches to its tab.
 */
import { app } from '../state/instance';
import { hideTooltip } from '../charts/tooltip';

export function openHeadPattern(layer: number, head: number): void {
  hideTooltip(); // the clicked cell goes away with the tab, so its mouseleave never comes
  const input = app.results.attribution_patching?.input ?? {};
  // the same clean tokens: given ids go along as ids (their text need not re-tokenize to them)
  const raw: Record<string, unknown> = Array.isArray(input.token_ids)
    ? { token_ids: input.token_ids, heads: [{ layer, head }] }
    : { prompt: String(input.prompt ?? ''), prepend_bos: input.prepend_bos ?? true, heads: [{ layer, head }] };
  app.forms.fill({ attention: { heads: JSON.stringify(raw.heads) } });
  app.forms.select('attention');
  void app.runOperation('attention', raw);
}
