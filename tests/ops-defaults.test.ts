/**
 * Defaults that must not mislead (issue 27), on the two shared models:
 *  - the vocabulary filter (ops/lib/vocab.ts): on stories260K the byte-fallback tokens share one
 *    unembedding row (untrained) and are left out, common words stay; on induction-gpt2 (bytes as
 *    ids) exactly the bytes that are not text on their own and <|endoftext|> are left out;
 *  - steering defaults name only such tokens (induction-gpt2 once picked four "�" targets);
 *  - `tokens:` directions tokenize each side as running text on SentencePiece (" sad" is
 *    [" sa", "d"] there, not [" ", " sa", "d"]) and the hint names the right piece;
 *  - a SwiGLU neuron's dashboard lists its most negative windows too, and its promoted tokens are
 *    no longer the tied untrained byte tokens.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { vocabFilter } from '../src/ops/lib/vocab';
import { resolveDirection } from '../src/ops/lib/directions';
import { MemoryHandleStore } from '../src/ops/lib/handle-store';
import { getOperation } from '../src/ops/index';
import { SHARED } from './helpers/shared';

let stories: LoadedModel;
let gpt: LoadedModel;
beforeAll(async () => {
  stories = await loadModelNode(SHARED + '/models/stories260K');
  gpt = await loadModelNode(SHARED + '/models/induction-gpt2');
}, 120_000);
afterAll(async () => {
  await stories?.dispose();
  await gpt?.dispose();
});

describe('the vocabulary filter', () => {
  it('stories260K: byte-fallback tokens are special/undecodable/untrained, words usable', async () => {
    const f = await vocabFilter(stories);
    const V = stories.info.d_vocab;
    // the byte-fallback pieces <0x00>…<0xFF> are ids 3…258 in stories260K's tokenizer.json
    const bytes = Array.from({ length: 256 }, (_, b) => 3 + b);
    const left = bytes.filter((id) => !f.usable(id));
    // a few bytes occur in training (tab, newline, …); the rest share one row
    expect(left.length).toBeGreaterThan(230);
    for (const w of [' the', ' happy', ' was', ' little', '.', ',']) expect(f.usable(stories.tokenId(w)!)).toBe(true);
    expect(f.counts.special).toBe(3); // <unk>, <s>, </s>
    expect(f.counts.untrained).toBeGreaterThan(50);
    const ok = Array.from({ length: V }, (_, i) => i).filter(f.usable).length;
    expect(ok).toBeGreaterThan(240);
    expect(f.rule).toMatch(/untrained/);
  });

  it('induction-gpt2: the bytes that are not text alone and <|endoftext|>, nothing untrained', async () => {
    const f = await vocabFilter(gpt);
    const shown = (id: number) => (id >= 32 && id < 127) || id === 9 || id === 10;
    for (let id = 0; id < 257; id++) expect(f.usable(id), `id ${id}`).toBe(shown(id));
    expect(f.counts.untrained).toBe(0);
  });
});

describe('steering defaults', () => {
  it('default targets and controls of a non-token direction are tokens the page can show', async () => {
    const doc: any = await getOperation('steer')!.run(
      gpt,
      { prompt: 'the cat sat on the mat', layer: 1, direction: 'random:3', alpha: 4, max_new_tokens: 2 },
      {},
    );
    for (const t of [...doc.targets, ...doc.controls]) {
      expect(t.token).not.toContain('\uFFFD');
      expect(t.token_id).toBeLessThan(127);
    }
    expect(doc.targets_rule).toMatch(/left out/);
    expect(doc.controls_rule).toMatch(/left out/);
  });

  it('relative change is no headline when the targets are improbable', async () => {
    const doc: any = await getOperation('steer')!.run(
      stories,
      {
        prompt: 'Once upon a time, there was a little',
        layer: 2,
        direction: 'tokens: happy - big',
        alpha: 4,
        max_new_tokens: 2,
      },
      {},
    );
    const p = Math.exp(doc.targets.reduce((a: number, t: any) => a + t.base_logprob, 0) / doc.targets.length);
    if (p < 0.01) expect(doc.relative_change_note).toMatch(/base probability is/);
    else expect(doc.relative_change_note).toBeNull();
    const likely: any = await getOperation('steer')!.run(
      stories,
      { prompt: 'Once upon a time, there was a little', layer: 2, direction: 'random:1', alpha: 1, max_new_tokens: 1 },
      {},
    );
    // default targets are d's own top tokens; whatever their probability, the note follows the rule
    const q = Math.exp(likely.targets.reduce((a: number, t: any) => a + t.base_logprob, 0) / likely.targets.length);
    expect(likely.relative_change_note === null).toBe(!(q < 0.01));
  });
});

describe('tokens: directions on SentencePiece', () => {
  const store = new MemoryHandleStore();
  it('" sad" is tokenized as running text, and the hint names its first piece', async () => {
    // running text: the pieces of " sad" after another word
    const inText = stories.tokenize('I was sad', { prependBos: false });
    const word = stories.wordIds(' sad');
    expect(inText.slice(-word.length)).toEqual(word);
    expect(stories.tokenStrings(word)).toEqual([' sa', 'd']);
    const err = await resolveDirection(stories, 'tokens: happy - sad', { layer: 2, store }).catch((e) => e);
    expect(err.code).toBe('UNKNOWN_TOKEN');
    expect(err.hint).toContain('" sa"');
    expect(err.hint).not.toContain('[" ",');
    // the piece the hint names works
    const d = await resolveDirection(stories, 'tokens: happy - sa', { layer: 2, store });
    expect(stories.tokenStrings(d.negative_ids)).toEqual([' sa']);
    // byte-level BPE without a dummy prefix keeps the space as part of the word
    expect(gpt.wordIds(' ab')).toEqual([32, 97, 98]);
  });
});

describe('dashboards of signed neurons', () => {
  it('a SwiGLU neuron lists its most negative windows; promoted tokens skip the untrained ones', async () => {
    const corpus = [
      'Once upon a time, there was a little girl named Lily. She loved to play outside in the park.',
      'Tim had a big red ball. He liked to kick it high into the sky.',
      'One day, a little dog found a bone under the tree. The dog was very happy.',
    ].join('\n\n');
    const doc: any = await getOperation('dashboard')!.run(
      stories,
      { subject: 'neuron', layer: 2, neuron: 15, corpus, window: 24 },
      {},
    );
    expect(doc.histogram.min).toBeLessThan(0);
    expect(doc.examples_min.length).toBeGreaterThan(0);
    expect(doc.examples_min[0].min).toBeCloseTo(doc.histogram.min, 5);
    for (let i = 1; i < doc.examples_min.length; i++)
      expect(doc.examples_min[i].min).toBeGreaterThanOrEqual(doc.examples_min[i - 1].min);
    const f = await vocabFilter(stories);
    for (const t of [...doc.direct_path.promoted, ...doc.direct_path.suppressed])
      expect(f.usable(t.token_id)).toBe(true);
    // before: the ten promoted tokens were byte tokens tied at one weight
    const weights = doc.direct_path.promoted.map((t: any) => t.weight.toFixed(3));
    expect(new Set(weights).size).toBeGreaterThan(1);
    expect(doc.direct_path.excluded.count).toBe(
      stories.info.d_vocab - Array.from({ length: stories.info.d_vocab }, (_, i) => i).filter(f.usable).length,
    );
    console.log(
      `L2N15: max ${doc.histogram.max.toFixed(3)}, min ${doc.histogram.min.toFixed(3)} (${doc.dominant}); promoted ${doc.direct_path.promoted
        .slice(0, 5)
        .map((t: any) => JSON.stringify(t.token))
        .join(' ')}; ${doc.direct_path.excluded.count} tokens left out`,
    );
  });
});
