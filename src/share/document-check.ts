/**
 * Documents from outside — a share link's embedded result, an imported session's entries, the
 * session stored in this browser — checked before any view sees them. A view sizes its loops by
 * the document's model block (a grid of n_layers × n_heads, a row per layer), so those numbers are
 * bounded here, wherever they appear (`model`, `graph_cfg`, …), and a row that names a layer or a
 * head must lie inside that model. The walk is iterative and counts every value, so a document
 * of any shape costs at most maxDocumentValues steps. This is the part that needs no operation
 * code (the page's main thread runs it); the operation's own output schema is checked in the
 * worker (workers/documents.ts).
 */
import { CAPS, checkCap, type CapName } from '../engine/caps';
import { LoupeError } from '../engine/errors';

/** sizes views build from: bounded wherever they appear */
const DIMS: Record<string, CapName> = {
  n_layers: 'maxLayers',
  n_heads: 'maxHeads',
  n_kv_heads: 'maxHeads',
  d_model: 'maxDModel',
  d_head: 'maxDHead',
  d_mlp: 'maxDMlp',
  d_vocab: 'maxVocab',
  n_ctx: 'maxPositions',
  num_experts: 'maxExperts',
  n_experts: 'maxExperts',
};

type Obj = Record<string, unknown>;
const isObj = (x: unknown): x is Obj => !!x && typeof x === 'object' && !Array.isArray(x);

function bad(what: string, msg: string, field?: string): LoupeError {
  return new LoupeError(
    'BAD_INPUT',
    `${what} is not a valid document: ${msg}.`,
    'It was not made by this version of Loupe, or it was altered; nothing of it is shown.',
    field ? { field } : undefined,
  );
}

/**
 * Throws BAD_INPUT (wrong shape) or TOO_LARGE (a size over its cap, naming the field and the
 * limit) unless `doc` is a document of operation `op` that views can draw within Loupe's limits.
 * `what` names the document in the message ("the link's result", "session entry 3").
 */
export function checkDocument(op: string, doc: unknown, what = 'the document'): void {
  if (!isObj(doc)) throw bad(what, 'it is not an object');
  if (doc.operation !== op) throw bad(what, `its operation is ${JSON.stringify(doc.operation)}, not "${op}"`);
  const model = isObj(doc.model) ? doc.model : null;
  const L = typeof model?.n_layers === 'number' ? model.n_layers : Infinity;
  const H = typeof model?.n_heads === 'number' ? model.n_heads : Infinity;
  let values = 0;
  const count = (n: number) => {
    values += n;
    if (values > CAPS.maxDocumentValues)
      checkCap('maxDocumentValues', values, `${what}: values`, {
        hint: 'The document is larger than any Loupe makes; nothing of it is shown.',
      });
  };
  const stack: { v: unknown; depth: number; path: string }[] = [{ v: doc, depth: 0, path: '' }];
  while (stack.length) {
    const { v, depth, path } = stack.pop()!;
    if (depth > CAPS.maxDocumentDepth)
      throw bad(what, `${path || 'it'} is nested more than ${CAPS.maxDocumentDepth} levels deep`, path);
    if (Array.isArray(v)) {
      let leaves = 0;
      for (let i = 0; i < v.length; i++) {
        const x = v[i];
        if (x !== null && typeof x === 'object') stack.push({ v: x, depth: depth + 1, path: `${path}[${i}]` });
        else leaves++;
      }
      count(leaves + 1);
      continue;
    }
    if (v === null || typeof v !== 'object') {
      count(1);
      continue;
    }
    const o = v as Obj;
    const keys = Object.keys(o);
    count(keys.length + 1);
    for (const k of keys) {
      const x = o[k];
      const field = path ? `${path}.${k}` : k;
      if (k in DIMS && x !== undefined) {
        if (typeof x !== 'number' || !Number.isSafeInteger(x) || x < 0)
          throw bad(what, `${field} = ${JSON.stringify(x)} is not a non-negative integer`, field);
        checkCap(DIMS[k], x, `${what}: ${field}`, {
          hint: 'No model Loupe reads is that large: the document was altered; nothing of it is shown.',
        });
      }
      if (x !== null && typeof x === 'object') stack.push({ v: x, depth: depth + 1, path: field });
    }
    if (typeof o.n_layers === 'number' && typeof o.n_heads === 'number')
      checkCap('maxModelHeads', o.n_layers * o.n_heads, `${what}: ${path ? `${path}.` : ''}n_layers × n_heads`, {
        hint: 'No model Loupe reads has that many heads: the document was altered; nothing of it is shown.',
      });
    // a row that names a layer and a head (head rankings, patching and attribution rows) lies inside the model
    if (typeof o.layer === 'number' && typeof o.head === 'number' && model) {
      if (!(Number.isInteger(o.layer) && o.layer >= 0 && o.layer < L))
        throw bad(what, `${path}.layer = ${o.layer} is not a layer of a model with ${L} layers`, `${path}.layer`);
      if (!(Number.isInteger(o.head) && o.head >= -1 && o.head < H))
        throw bad(what, `${path}.head = ${o.head} is not a head of a model with ${H} heads`, `${path}.head`);
    }
  }
}

/**
 * Throws BAD_INPUT when `v` (a tool's arguments, a request) nests more than maxDocumentDepth levels:
 * checked before anything recursive (a structured clone, a schema walk) could run out of stack on it.
 * The walk is iterative and stops at the first level too deep.
 */
export function checkNesting(v: unknown, what: string): void {
  const stack: [unknown, number][] = [[v, 0]];
  while (stack.length) {
    const [x, depth] = stack.pop()!;
    if (x === null || typeof x !== 'object') continue;
    if (depth >= CAPS.maxDocumentDepth)
      throw new LoupeError(
        'BAD_INPUT',
        `${what} nest more than ${CAPS.maxDocumentDepth} levels deep.`,
        'No Loupe input nests that deep; send the value the tool’s input schema describes.',
      );
    for (const y of Array.isArray(x) ? x : Object.values(x))
      if (y !== null && typeof y === 'object') stack.push([y, depth + 1]);
  }
}
