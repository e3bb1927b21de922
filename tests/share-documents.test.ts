/**
 * Documents from outside (issue 22, failure 9): a share link's result or a session file's entry
 * is checked against Loupe's limits and its operation's output schema before any view sees it.
 * Real documents of stories260K pass; a head_scores document claiming 5e7 layers (it froze the
 * page in 27 s and crashed the renderer), rows naming heads the model lacks, deep nesting, too
 * many values and schema breaks are refused with the field named; a session file brings in at
 * most the history limit (an import of 50,000 entries had taken 21.7 s). The page itself: e2e/hostile-links.spec.ts.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { operation as headScoresOp } from '../src/ops/head_scores';
import { operation as traceOp } from '../src/ops/trace';
import { CAPS } from '../src/engine/caps';
import { LoupeError } from '../src/engine/errors';
import { checkDocument } from '../src/share/document-check';
import { checkForeignDocument } from '../workers/documents';
import { readSessionFile } from '../src/share/session-file';
import { decodeShare, encodeShare } from '../src/share/codec';
import { viaJson } from './schema-helpers';
import { SHARED } from './helpers/shared';

let model: LoadedModel;
let hs: any;
let trace: any;
beforeAll(async () => {
  model = await loadModelNode(SHARED + '/models/stories260K');
  hs = viaJson(await headScoresOp.run(model, { batch: 2, seq_len: 8 }, {}));
  trace = viaJson(await traceOp.run(model, { prompt: 'Once upon a time' }, {}));
});
afterAll(async () => {
  await model?.dispose();
});

function refusal(fn: () => void): LoupeError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(LoupeError);
    return e as LoupeError;
  }
  throw new Error('not refused');
}

/** a seeded generator, for the randomised sizes */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => (s = (s * 1664525 + 1013904223) >>> 0) / 2 ** 32;
}

describe('a document from outside is checked before any view sees it', () => {
  it("real documents pass, in full (limits and the operation's output schema)", () => {
    for (const [op, d] of [
      ['head_scores', hs],
      ['trace', trace],
    ] as const) {
      expect(() => checkForeignDocument(op, d)).not.toThrow();
      // and through a share link, as the page receives them
      const { text, embedded } = encodeShare(
        { v: 1, model: { kind: 'bundled', id: d.model.id, revision: 'main' }, op, input: {}, result: d },
        { maxChars: 1e7 },
      );
      expect(embedded).toBe(true);
      expect(() => checkForeignDocument(op, decodeShare(text).result)).not.toThrow();
    }
  });

  it('head_scores claiming 5e7 layers (the 3.5 KB link that crashed the page), and every model size at random', () => {
    const e = refusal(() =>
      checkDocument('head_scores', { ...hs, model: { ...hs.model, n_layers: 5e7 } }, "the link's result"),
    );
    expect(e.code).toBe('TOO_LARGE');
    expect(e.message).toContain('model.n_layers');
    expect(e.message).toContain('maxLayers');
    const caps = {
      n_layers: 'maxLayers',
      n_heads: 'maxHeads',
      n_kv_heads: 'maxHeads',
      d_model: 'maxDModel',
      d_head: 'maxDHead',
      d_mlp: 'maxDMlp',
      d_vocab: 'maxVocab',
      n_ctx: 'maxPositions',
    } as const;
    const r = rng(22);
    let n = 0;
    for (const [field, cap] of Object.entries(caps))
      for (let k = 0; k < 5; k++, n++) {
        const value = CAPS[cap] + 1 + Math.floor(r() * 10 ** (1 + Math.floor(r() * 8)));
        const err = refusal(() => checkDocument('trace', { ...trace, model: { ...trace.model, [field]: value } }));
        expect(err.code, `${field} = ${value}`).toBe('TOO_LARGE');
        expect(err.message).toContain(`model.${field}`);
      }
    expect(n).toBe(40);
    // not an integer, negative: BAD_INPUT
    for (const v of [-1, 1.5, '12', null])
      expect(refusal(() => checkDocument('trace', { ...trace, model: { ...trace.model, n_layers: v } })).code).toBe(
        'BAD_INPUT',
      );
  });

  it('a grid of heads over maxModelHeads, and sizes in other blocks (edge graphs carry graph_cfg)', () => {
    const e = refusal(() =>
      checkDocument('trace', { ...trace, model: { ...trace.model, n_layers: 1024, n_heads: 64 } }),
    );
    expect(e.message).toContain('maxModelHeads');
    const g = refusal(() =>
      checkDocument('edge_attribution', { operation: 'edge_attribution', graph_cfg: { n_layers: 1e6 } }),
    );
    expect(g.message).toContain('graph_cfg.n_layers');
  });

  it('rows naming a layer or head the model does not have', () => {
    const L = hs.model.n_layers;
    for (const [layer, head] of [
      [L, 0],
      [999_999, 0],
      [-1, 0],
      [0, hs.model.n_heads],
      [0.5, 0],
    ]) {
      const heads = hs.heads.map((x: any, i: number) => (i === 1 ? { ...x, layer, head } : x));
      const err = refusal(() => checkDocument('head_scores', { ...hs, heads }));
      expect(err.code).toBe('BAD_INPUT');
      expect(err.message).toMatch(/heads\[1\]\.(layer|head)/);
    }
  });

  it('nesting past maxDocumentDepth, values past maxDocumentValues, the wrong operation', () => {
    let deep: unknown = 0;
    for (let i = 0; i < 10_000; i++) deep = [deep];
    expect(refusal(() => checkDocument('trace', { ...trace, extra: deep })).message).toContain('nested');
    const many = refusal(() => checkDocument('trace', { ...trace, extra: new Array(CAPS.maxDocumentValues).fill(0) }));
    expect(many.code).toBe('TOO_LARGE');
    expect(many.message).toContain('maxDocumentValues');
    expect(refusal(() => checkDocument('head_scores', trace)).code).toBe('BAD_INPUT');
    expect(refusal(() => checkDocument('trace', [trace])).code).toBe('BAD_INPUT');
  });

  it("the operation's output schema: a field of the wrong type, a missing one, an unknown operation", () => {
    const e = refusal(() => checkForeignDocument('head_scores', { ...hs, heads: 'x' }, "the link's result"));
    expect(e.code).toBe('BAD_INPUT');
    expect(e.message).toContain('heads');
    const { top: _top, ...noTop } = hs;
    expect(refusal(() => checkForeignDocument('head_scores', noTop)).message).toContain('top');
    expect(refusal(() => checkForeignDocument('no_such_op', { operation: 'no_such_op' })).code).toBe(
      'UNKNOWN_OPERATION',
    );
  });
});

describe('a session file is read as a file from outside', () => {
  const file = (entries: unknown[]) =>
    JSON.stringify({ format: 'loupe-session', version: 1, exported_at: '', entries });

  it('50,000 entries: the newest maxSessionEntries come in, the rest are left out unread', () => {
    const now = 1_700_000_000_000;
    const entries = Array.from({ length: 50_000 }, (_, i) => ({
      id: `e${i}`,
      at: now - i,
      op: 'trace',
      input: { prompt: 'x' },
      // only the newest carry a real document: the rest would be refused if they were looked at
      doc: i < CAPS.maxSessionEntries ? trace : { operation: 'trace', model: { n_layers: 5e7 } },
    }));
    const r = readSessionFile(file(entries));
    expect(r.total).toBe(50_000);
    expect(r.entries).toHaveLength(CAPS.maxSessionEntries);
    expect(r.skipped).toBe(50_000 - CAPS.maxSessionEntries);
    expect(r.refused).toEqual([]);
    expect(r.entries[0].id).toBe('e0');
  });

  it('a hostile entry is refused with its reason; the others come in with only the fields an entry has', () => {
    const r = readSessionFile(
      file([
        { id: 'bad', at: 2, op: 'head_scores', doc: { ...hs, model: { ...hs.model, n_layers: 5e7 } } },
        {
          id: 'good',
          at: 1,
          op: 'trace',
          doc: trace,
          input: 'not an object',
          model: { kind: 'hub', id: 'o/m', revision: 'main', token: 'hf_secret', endpoint: 'javascript:alert(1)' },
          extra: 'dropped',
        },
        { id: 'noop', at: 0, op: '../x', doc: trace },
        'not an entry',
      ]),
    );
    expect(r.entries.map((e) => e.id)).toEqual(['good']);
    expect(r.entries[0].input).toEqual({});
    expect(r.entries[0].model).toEqual({ kind: 'hub', id: 'o/m', revision: 'main' });
    expect(Object.keys(r.entries[0]).sort()).toEqual(['at', 'doc', 'id', 'input', 'model', 'ms', 'op', 'pinned']);
    expect(r.refused.map((x) => x.id)).toEqual(['bad', 'noop', '#3']);
    expect(r.refused[0].message).toContain('n_layers');
  });

  it('not a session file: BAD_INPUT', () => {
    for (const t of ['{', '[]', JSON.stringify({ format: 'loupe-session', version: 2, entries: [] })])
      expect(refusal(() => readSessionFile(t)).code).toBe('BAD_INPUT');
  });
});
