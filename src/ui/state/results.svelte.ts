/** The documents the page shows: the latest per operation, whoever ran it (the form, a link, an agent). */
import type { ShareModel } from '../../share/codec';

export interface ResultEntry {
  op: string;
  input: Record<string, unknown>;
  doc: any;
  model: ShareModel | null;
  ms: number | null;
  /** shown from a share link, not (yet) computed here */
  fromLink: boolean;
}

export class ResultStore {
  byOp = $state.raw<Record<string, ResultEntry>>({});
  /** bumped when a run from this page produces a result (the result panel scrolls to it) */
  seq = $state(0);

  /** a new result (not one restored from the session): the session records it */
  onNew: (entry: ResultEntry) => void = () => {};

  set(entry: ResultEntry, opts: { restored?: boolean } = {}): void {
    this.byOp = { ...this.byOp, [entry.op]: entry };
    if (!opts.restored && !entry.fromLink) this.onNew(entry);
  }

  /** replace the whole map (the agent bridge writes it so): entries that changed are new */
  replace(next: Record<string, ResultEntry>): void {
    const prev = this.byOp;
    this.byOp = next;
    for (const [op, e] of Object.entries(next)) if (e !== prev[op] && !e.fromLink) this.onNew(e);
  }
}
