/**
 * trace: the DLA sum invariant (both conventions, and the logit difference) on both shared models
 * and a random model of every family, every term equal to the same formula computed from the
 * float64 reference forward's hooks, the prediction equal to llama2.c's run.c, input errors, and
 * documents valid against the published JSON Schema.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { readFileSync } from 'node:fs';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { operation as trace } from '../src/ops/trace';
import {
  ALL_FAMILY_CASES,
  makeCaseModel,
  caseTokens,
  loadModelDir,
  referenceForward,
  type RandomModel,
  type RefModel,
} from './reference';
import { refReadout, refTerms, foldRun, type Convention } from './ops-trace-ref';
import { schemaErrors, viaJson } from './schema-helpers';
import { SHARED } from './helpers/shared';
import type { OperationDocument } from '../src/ops/index';
type TraceDocument = OperationDocument<'trace'>;

const STORIES = SHARED + '/models/stories260K';
const INDUCTION = SHARED + '/models/induction-gpt2';
const runC = JSON.parse(readFileSync(SHARED + '/references/stories260K-run-c.json', 'utf8'));
const TOL = 1e-4;
const ctx = {};

async function traceDoc(model: LoadedModel, input: Record<string, unknown>): Promise<TraceDocument> {
  const doc = await trace.run(model, input as any, ctx);
  expect(schemaErrors('trace', viaJson(doc))).toEqual([]);
  expect(trace.output.safeParse(doc).success).toBe(true);
  return doc;
}

function termMap(doc: TraceDocument) {
  return new Map(doc.decomposition.terms.map((t) => [t.name, t.value]));
}

/** every engine term equals the reference term; the target equals the reference's logit */
function expectMatchesReference(
  doc: TraceDocument,
  ref: RefModel,
  tokens: number[],
  conv: Convention,
  cf: number | undefined,
  L: number,
  H: number,
) {
  const fwd = referenceForward(ref, tokens);
  const fold = conv === 'transformer_lens' ? foldRun(ref, tokens) : undefined;
  const r = refTerms(refReadout(ref), fwd, doc.position, doc.target.token_id, conv, { cf, fold, H, L });
  const mine = termMap(doc);
  expect([...mine.keys()].sort()).toEqual([...r.terms.keys()].sort());
  let worst = 0;
  for (const [name, v] of r.terms) worst = Math.max(worst, Math.abs(mine.get(name)! - v));
  expect(worst).toBeLessThan(TOL);
  expect(Math.abs(doc.decomposition.target - r.target)).toBeLessThan(TOL);
  return worst;
}

describe('trace on the shared models', () => {
  let stories: LoadedModel;
  let induction: LoadedModel;
  let storiesRef: RefModel;
  let inductionRef: RefModel;
  beforeAll(async () => {
    stories = await loadModelNode('default');
    induction = await loadModelNode(INDUCTION);
    storiesRef = loadModelDir(STORIES);
    inductionRef = loadModelDir(INDUCTION);
  });
  afterAll(async () => {
    await stories?.dispose();
    await induction?.dispose();
  });

  it('stories260K predicts what llama2.c run.c predicts, with its logits', async () => {
    const doc = await traceDoc(stories, { prompt: 'Once upon a time', top_k: 5 });
    expect(doc.tokens.map((t) => t.id)).toEqual(runC.prompt_ids);
    expect(doc.predicted_token_id).toBe(runC.argmax);
    for (const p of doc.top_predictions)
      expect(Math.abs(p.logit - runC.final_position_logits[p.token_id])).toBeLessThan(TOL);
    expect(doc.top_predictions.map((p) => p.token_id)).toEqual(
      [...runC.final_position_logits.keys()]
        .sort((a: number, b: number) => runC.final_position_logits[b] - runC.final_position_logits[a])
        .slice(0, 5),
    );
    // raw target is the model's own logit, which run.c printed
    const raw = await traceDoc(stories, { prompt: 'Once upon a time', convention: 'raw' });
    expect(Math.abs(raw.decomposition.target - runC.final_position_logits[runC.argmax])).toBeLessThan(TOL);
  });

  const cases: { name: string; prompt: string; answer?: string; counterfactual?: string }[] = [
    { name: 'stories260K', prompt: 'Once upon a time' },
    {
      name: 'stories260K',
      prompt: 'Lily and Ben went to the park. Lily saw a big dog and',
      answer: ' she',
      counterfactual: ' he',
    },
    { name: 'stories260K', prompt: 'The cat sat on the', answer: '#400' },
    { name: 'induction-gpt2', prompt: 'The quick brown fox. The quick brown f' },
    { name: 'induction-gpt2', prompt: 'x7#Qp!zx7#Qp', answer: '!', counterfactual: 'Q' },
  ];
  for (const c of cases) {
    for (const convention of ['transformer_lens', 'raw'] as const) {
      it(`${c.name} "${c.prompt.slice(0, 24)}"${c.answer ? ` answer ${c.answer}` : ''}${c.counterfactual ? ` − ${c.counterfactual}` : ''} [${convention}]: terms sum to the target and equal the float64 reference`, async () => {
        const model = c.name === 'stories260K' ? stories : induction;
        const ref = c.name === 'stories260K' ? storiesRef : inductionRef;
        const doc = await traceDoc(model, {
          prompt: c.prompt,
          convention,
          answer: c.answer,
          counterfactual: c.counterfactual,
          top_k: 1000,
        });
        const { n_layers: L, n_heads: H } = model.info;
        // the invariant
        expect(Math.abs(doc.decomposition.sum - doc.decomposition.target)).toBeLessThan(TOL);
        expect(doc.decomposition.sum).toBeCloseTo(
          doc.decomposition.terms.reduce((a, t) => a + t.value, 0),
          9,
        );
        expect(doc.target.kind).toBe(
          c.counterfactual ? 'logit_difference' : convention === 'raw' ? 'logit' : 'centered_logit',
        );
        // heads: all listed, sorted by |attribution|, equal to the matrix and to the decomposition terms
        expect(doc.top_heads).toHaveLength(L * H);
        const abs = doc.top_heads.map((h) => Math.abs(h.logit_attribution));
        expect(abs).toEqual([...abs].sort((a, b) => b - a));
        const terms = termMap(doc);
        for (const h of doc.top_heads) {
          expect(doc.head_attribution[h.layer][h.head]).toBe(h.logit_attribution);
          expect(terms.get(`L${h.layer}H${h.head}`)).toBe(h.logit_attribution);
        }
        // neurons: per layer they sum to the MLP term minus the output-bias term (0 for Llama)
        if (model === stories) {
          const all = doc.top_neurons; // 5 × 172 = 860 ≤ top_k
          expect(all).toHaveLength(L * model.info.d_mlp);
          for (let l = 0; l < L; l++) {
            const s = all.filter((n) => n.layer === l).reduce((a, n) => a + n.logit_attribution, 0);
            expect(Math.abs(s - terms.get(`L${l}.mlp`)!)).toBeLessThan(TOL);
          }
        }
        const tokens = doc.tokens.map((t) => t.id);
        expectMatchesReference(doc, ref, tokens, convention, doc.target.counterfactual_token_id, L, H);
        // the hooks and parameters agree with each other (float32 rounding only)
        expect(doc.checks.residual_reconstruction_max_abs).toBeLessThan(1e-4);
        expect(doc.checks.attention_reconstruction_max_abs).toBeLessThan(1e-4);
      });
    }
  }

  it('GPT-2 (LayerNorm, biases): the value-bias fold the reference comparison checks is not a no-op', () => {
    // b_V'[h]·W_O[h] measured by the reference (see ops-trace-ref.ts) is far from zero on this model
    const fold = foldRun(inductionRef, [256, 97, 98]);
    const r = fold.hooks['blocks.1.attn.hook_result'].data;
    expect(Math.max(...Array.from(r, Math.abs))).toBeGreaterThan(1e-2);
  });

  it("keeps no float32 copy of W_V in JavaScript after a trace (b_V' is folded from it once)", async () => {
    const fresh = await loadModelNode(INDUCTION);
    try {
      await traceDoc(fresh, { prompt: 'x7#Qp!zx7#Qp' });
      const { n_kv_heads: Hkv, d_model: D, d_head: Dh } = fresh.info;
      // the small parameters DLA keeps (biases, norm weights) are far less than one layer's W_V
      expect(fresh.memory().param_bytes).toBeLessThan(4 * Hkv * D * Dh);
      expect(fresh.memory().param_bytes).toBeGreaterThan(0);
    } finally {
      await fresh.dispose();
    }
  });

  it('a difference trace equals the difference of the two raw traces, term by term', async () => {
    const prompt = 'x7#Qp!zx7#Qp';
    const a = await traceDoc(induction, { prompt, convention: 'raw', answer: '!' });
    const b = await traceDoc(induction, { prompt, convention: 'raw', answer: 'Q' });
    const d = await traceDoc(induction, { prompt, convention: 'raw', answer: '!', counterfactual: 'Q' });
    const ta = termMap(a),
      tb = termMap(b);
    for (const t of d.decomposition.terms)
      expect(Math.abs(t.value - (ta.get(t.name)! - tb.get(t.name)!))).toBeLessThan(1e-6);
  });

  it('position: traces an earlier position', async () => {
    const doc = await traceDoc(stories, { prompt: 'Once upon a time', position: 2, convention: 'raw' });
    expect(doc.position).toBe(2);
    expect(Math.abs(doc.decomposition.sum - doc.decomposition.target)).toBeLessThan(TOL);
    expectMatchesReference(doc, storiesRef, runC.prompt_ids, 'raw', undefined, 5, 8);
  });

  it('refuses bad input with structured errors before running', async () => {
    const err = async (input: Record<string, unknown>, model = stories) => {
      try {
        await trace.run(model, input as any, ctx);
      } catch (e: any) {
        return { code: e.code, message: e.message, hint: e.hint };
      }
      throw new Error('expected an error');
    };
    expect((await err({ prompt: '' })).code).toBe('EMPTY_PROMPT');
    const unk = await err({ prompt: 'Once upon a time', answer: 'dragonfly' });
    expect(unk.code).toBe('UNKNOWN_TOKEN');
    expect(unk.hint).toMatch(/tokenizes as \[/);
    expect((await err({ prompt: 'Once upon a time', answer: '#99999' })).code).toBe('UNKNOWN_TOKEN');
    expect((await err({ prompt: 'Once upon a time', counterfactual: ' he' })).code).toBe('BAD_INPUT');
    expect((await err({ prompt: 'Once upon a time', convention: 'folded' })).code).toBe('BAD_INPUT');
    expect((await err({ prompt: 'Once upon a time', top_k: 0 })).code).toBe('BAD_INPUT');
    expect((await err({ prompt: 'Once upon a time', top_k: 5000 })).code).toBe('TOO_LARGE');
    expect((await err({ prompt: 'Once upon a time', position: 5 })).code).toBe('BAD_INPUT');
    expect((await err({ prompt: 'a'.repeat(64) }, induction)).code).toBe('PROMPT_TOO_LONG'); // 65 tokens with BOS, n_ctx 64
    expect((await err({})).code).toBe('BAD_INPUT');
  });

  it('reports progress and honours an aborted signal before running', async () => {
    const stages: string[] = [];
    await trace.run(stories, { prompt: 'Once' }, { onProgress: (p) => stages.push(`${p.stage} ${p.done}/${p.total}`) });
    expect(stages).toEqual(['forward pass 0/2', 'attribution 1/2', 'attribution 2/2']);
    const ac = new AbortController();
    ac.abort();
    await expect(trace.run(stories, { prompt: 'Once' }, { signal: ac.signal })).rejects.toMatchObject({
      code: 'ABORTED',
    });
  });

  it('accepts " love", "love" and "#id" for the same token', async () => {
    const a = await traceDoc(induction, { prompt: 'abc', answer: 'd' });
    const b = await traceDoc(induction, { prompt: 'abc', answer: '#100' });
    expect(a.target.token_id).toBe(100);
    expect(b.target.token_id).toBe(100);
    // stories260K: " upon" (#407) is the word-initial piece; both spellings find it
    const c = await traceDoc(stories, { prompt: 'Once', answer: ' upon' });
    const e = await traceDoc(stories, { prompt: 'Once', answer: 'upon' });
    expect(c.target.token_id).toBe(407);
    expect(e.target.token_id).toBe(407);
  });
});

describe('trace on random-weight models of every family', () => {
  for (const c of ALL_FAMILY_CASES) {
    describe(c.name, () => {
      let rm: RandomModel;
      let model: LoadedModel;
      let ref: RefModel;
      beforeAll(async () => {
        rm = makeCaseModel(c);
        model = await loadModelNode(rm.dir);
        ref = loadModelDir(rm.dir);
      });
      afterAll(async () => {
        await model?.dispose();
        rm?.cleanup();
      });

      it('sum invariant and reference terms, both conventions and a logit difference', async () => {
        const ids = caseTokens(rm, c.seqLen);
        const { n_layers: L, n_heads: H } = model.info;
        // drive the op by token ids: the text of ids may not re-tokenize to them, so use ids via decode → check
        const prompt = model.decode(ids.slice(1));
        const toks = model.tokenize(prompt);
        for (const convention of ['transformer_lens', 'raw'] as const) {
          const doc = await traceDoc(model, { prompt, convention });
          expect(Math.abs(doc.decomposition.sum - doc.decomposition.target)).toBeLessThan(TOL);
          expectMatchesReference(doc, ref, toks, convention, undefined, L, H);
          const second =
            doc.top_predictions.length > 1
              ? doc.top_predictions[1].token_id
              : (doc.predicted_token_id + 1) % model.info.d_vocab;
          const diff = await traceDoc(model, {
            prompt,
            convention,
            answer: `#${doc.predicted_token_id}`,
            counterfactual: `#${second}`,
          });
          expect(Math.abs(diff.decomposition.sum - diff.decomposition.target)).toBeLessThan(TOL);
          expectMatchesReference(diff, ref, toks, convention, second, L, H);
          if (model.spec.finalSoftcap) expect(doc.method).toMatch(/PRE-soft-cap/);
        }
      });
    });
  }
});
