/**
 * A document from outside (a share link's result, a session file's entry) checked in full before
 * the page shows it: the size and consistency checks any thread can run (share/document-check.ts),
 * then the operation's own output schema, the one every document it makes passes. Runs where the
 * operations are (the page's worker).
 */
import { checkDocument } from '../src/share/document-check';
import { requireOperation } from '../src/ops/index';
import { parseInput } from '../src/ops/types';

export function checkForeignDocument(op: string, doc: unknown, what = 'the document'): void {
  const operation = requireOperation(op);
  checkDocument(op, doc, what);
  parseInput(operation.output, doc, `${what} (${op})`);
}
