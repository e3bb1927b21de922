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

  set(entry: ResultEntry): void {
    this.byOp = { ...this.byOp, [entry.op]: entry };
  }
}
