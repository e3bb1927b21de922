/**
 * Issue 22, the limits (src/engine/caps.ts) at the causes of the audit's failures: each case
 * here failed before its fix (a crash, a hang, INTERNAL or the wrong code) and is bounded in
 * time and memory on the fixed code. The end-to-end attacks, against the CLI and the headless
 * companion through a hostile Hub stand-in, are in tests/hostile-hub.test.ts.
 */
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Template } from '@huggingface/jinja';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LoadedModel } from '../src/engine/api';
import { describeModel } from '../src/engine/arch';
import { CAPS, maxTextChars } from '../src/engine/caps';
import { renderChat } from '../src/engine/chat';
import { LoupeError, toLoupeError } from '../src/engine/errors';
import { checkTokenizerPatterns, ModelTokenizer, backtrackingRisk } from '../src/engine/tokenizer';
import { loadModelNode } from '../src/node/load';
import { getOperation } from '../src/ops/index';
import { parseOperationInput } from '../src/ops/types';
import { SHARED } from './helpers/shared';

/** the LoupeError a function throws (fails the test when it returns) */
function errorOf(f: () => unknown): LoupeError {
  try {
    f();
  } catch (e) {
    if (e instanceof LoupeError) return e;
    throw e;
  }
  throw new Error('expected a LoupeError');
}

const llamaConfig = (over: Record<string, unknown>) => ({
  model_type: 'llama',
  hidden_size: 64,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  vocab_size: 128,
  intermediate_size: 128,
  ...over,
});

describe('a model config is bounded before the adapter builds anything per layer (failure 1)', () => {
  // 5e6 layers: the old adapter built per-layer arrays first and then failed on a missing tensor
  // (at 1e9, V8 ran out of heap after 46 s); now BAD_CONFIG names the field and the limit.
  for (const [field, value, family] of [
    ['num_hidden_layers', 5_000_000, 'llama'],
    ['num_hidden_layers', 5_000_000, 'gemma2'],
    ['num_hidden_layers', 5_000_000, 'mistral'],
    ['vocab_size', 1e12, 'qwen2'],
    ['hidden_size', 2 ** 40, 'llama'],
    ['num_attention_heads', 1e7, 'qwen3'],
    ['max_position_embeddings', 1e300, 'llama'],
    ['num_hidden_layers', -3, 'llama'],
    ['num_hidden_layers', 2.5, 'llama'],
  ] as const) {
    it(`${family}: ${field} = ${value}`, () => {
      const e = errorOf(() =>
        describeModel({ config: llamaConfig({ model_type: family, [field]: value }), tensors: new Map() }),
      );
      expect(e.code).toBe('BAD_CONFIG');
      expect(e.message).toContain(field);
      if (value > 0 && Number.isInteger(value)) expect(e.message).toMatch(/limit of [\d,]+/);
    });
  }
  it('gpt2 and gpt_neox too', () => {
    const g = errorOf(() =>
      describeModel({
        config: { model_type: 'gpt2', n_embd: 64, n_layer: 1e8, n_head: 4, vocab_size: 10, n_positions: 8 },
        tensors: new Map(),
      }),
    );
    expect([g.code, g.message.includes('n_layer')]).toEqual(['BAD_CONFIG', true]);
    const n = errorOf(() =>
      describeModel({
        config: { ...llamaConfig({ model_type: 'gpt_neox' }), intermediate_size: CAPS.maxDMlp + 1 },
        tensors: new Map(),
      }),
    );
    expect([n.code, n.message.includes('intermediate_size')]).toEqual(['BAD_CONFIG', true]);
  });
  it('layer_types must list num_hidden_layers entries', () => {
    const e = errorOf(() =>
      describeModel({ config: llamaConfig({ layer_types: ['full_attention'] }), tensors: new Map() }),
    );
    expect(e.code).toBe('BAD_CONFIG');
  });
});

describe('a chat template renders with bounds (failure 3)', () => {
  const render = (chat_template: string) => renderChat({ chat_template, bos_token: '<s>' }, 'hi');
  const stopped = (tpl: string) => {
    const t0 = Date.now();
    const e = errorOf(() => render(tpl));
    expect(e.code).toBe('BAD_CHAT_TEMPLATE');
    expect(e.message).toMatch(/stopped|limit/);
    return Date.now() - t0;
  };
  it('a loop of 8 million steps (the old renderer ran every one; 1e9 ran forever)', () => {
    stopped(
      '{% for a in range(200) %}{% for b in range(200) %}{% for c in range(200) %}x{% endfor %}{% endfor %}{% endfor %}',
    );
  });
  it('range(3e6) is refused before it is built (range(1e8) took 4.7 GB)', () => {
    stopped('{% for i in range(3000000) %}{% endfor %}');
  });
  it('a string doubled past the output cap, a list doubled, a huge indent', () => {
    stopped(
      '{% set ns = namespace(s="ab") %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}',
    );
    stopped(
      '{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}',
    );
    stopped('{{ "a\\nb"|indent(400000000) }}');
  });
  it('a template over its size limit is refused before it is parsed', () => {
    expect(errorOf(() => render('x'.repeat(CAPS.maxTemplateChars + 1))).code).toBe('BAD_CHAT_TEMPLATE');
  });
  it('real templates render exactly as @huggingface/jinja renders them', () => {
    const templates = [
      // Llama 3 style
      "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
      // ChatML (Qwen) style, with a namespace and loop.last
      "{% set ns = namespace(n=0) %}{% for message in messages %}{% set ns.n = ns.n + 1 %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% if loop.last and add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}{% endfor %}",
      // Gemma style, raise_exception on a bad role, range over a few items
      "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('roles must alternate') }}{% endif %}<start_of_turn>{{ message['role'] }}\\n{{ message['content'] | trim }}<end_of_turn>\\n{% endfor %}{% for i in range(2) %}{{ i }}{% endfor %}<start_of_turn>model\\n",
    ];
    for (const t of templates) {
      const items = {
        messages: [{ role: 'user', content: 'hi' }],
        add_generation_prompt: true,
        bos_token: '<s>',
        eos_token: '',
        unk_token: '',
        pad_token: '',
      };
      expect(render(t)).toBe(new Template(t).render(items));
    }
  });
});

describe("a tokenizer's regexes are checked when it is loaded (failure 4)", () => {
  const tok = JSON.parse(readFileSync(path.join(SHARED, 'models/stories260K/tokenizer.json'), 'utf8'));
  const withNormalizer = (pattern: string) => ({
    ...tok,
    normalizer: {
      type: 'Sequence',
      normalizers: [tok.normalizer, { type: 'Replace', pattern: { Regex: pattern }, content: 'x' }].filter(Boolean),
    },
  });
  it('an exponentially backtracking normalizer is refused (it hung a 30-character prompt past every deadline)', () => {
    const e = errorOf(() => new ModelTokenizer(withNormalizer('([^\\d]+)+\\d'), null, {}));
    expect(e.code).toBe('UNSUPPORTED_CONFIG');
    expect(e.message).toContain('repeats a group that itself repeats');
  });
  it("the shapes of nested repetition and repeated alternation, and none of the Hub's own patterns", () => {
    const hub = [
      "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", // GPT-2
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", // Llama 3
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", // Qwen 2
      ' ',
      '\\s+',
      '[(+)]+',
      '\\(a+\\)+',
      '(?<name>ab)+',
      '(ab?)+',
      '(a{1,3})+',
      '(?=a+)b',
      '(?:ab|cd)?x',
    ];
    const nested = [
      '(a+)+',
      '(?:\\s*)*x',
      '((ab)*c)+',
      '(a{2,})*',
      '(?<n>a*)+',
      '(?i:a+)+',
      '((a)+)+',
      '(a+){2,}',
      '(x(a+))+',
      '(x|x)*y',
      '(?:a|ab)+',
      '(a|b)+',
    ];
    expect(hub.filter((p) => backtrackingRisk(p))).toEqual([]);
    expect(nested.filter((p) => !backtrackingRisk(p))).toEqual([]);
    for (const f of ['stories260K', 'induction-gpt2'])
      checkTokenizerPatterns(JSON.parse(readFileSync(path.join(SHARED, `models/${f}/tokenizer.json`), 'utf8')));
  });
});

describe('every text that reaches the tokenizer is capped before tokenizing (failure 5)', () => {
  let model: LoadedModel;
  let long: LoadedModel;
  const dir = mkdtempSync(path.join(os.tmpdir(), 'loupe-longctx-'));
  beforeAll(async () => {
    model = await loadModelNode('default');
    // stories260K claiming a 131072-token context: the old cap (n_ctx × 1024) let 134 M characters through
    for (const f of ['tokenizer.json', 'tokenizer_config.json', 'model.safetensors'])
      copyFileSync(path.join(SHARED, 'models/stories260K', f), path.join(dir, f));
    const cfg = JSON.parse(readFileSync(path.join(SHARED, 'models/stories260K/config.json'), 'utf8'));
    writeFileSync(path.join(dir, 'config.json'), JSON.stringify({ ...cfg, max_position_embeddings: 131072 }));
    long = await loadModelNode(dir);
  }, 120_000);
  afterAll(async () => {
    await model?.dispose();
    await long?.dispose();
    rmSync(dir, { recursive: true, force: true });
  });
  const refused = async (m: LoadedModel, op: string, args: Record<string, unknown>, field: string) => {
    const o = getOperation(op)!;
    const e = toLoupeError(
      await o.run(m, parseOperationInput(o, args), {}).then(
        () => undefined,
        (x) => x,
      ),
    );
    expect(e.code).toBe('PROMPT_TOO_LONG');
    expect(e.details).toMatchObject({ field, limit: maxTextChars(m.info.n_ctx) });
  };
  const huge = 'a'.repeat(maxTextChars(512) + 1);
  it('answer and counterfactual', async () => {
    await refused(model, 'trace', { prompt: 'Once upon a time', answer: huge }, 'answer');
    await refused(
      model,
      'trace',
      { prompt: 'Once upon a time', answer: ' the', counterfactual: huge },
      'counterfactual',
    );
  });
  it('targets and controls', async () => {
    const dir_ = { kind: 'tokens', positive: ' happy', negative: ' the' };
    await refused(model, 'steer', { prompt: 'Once', layer: 1, alpha: 4, direction: dir_, targets: [huge] }, 'targets');
    await refused(
      model,
      'steer',
      { prompt: 'Once', layer: 1, alpha: 4, direction: dir_, targets: [' the'], controls: [huge] },
      'controls',
    );
  });
  it('corpus entries', async () => {
    await refused(model, 'dashboard', { corpus: huge, layer: 0, neuron: 1 }, 'corpus entry');
  });
  it('the prompt, by min(n_ctx, the token cap) and not n_ctx alone', async () => {
    expect(maxTextChars(131072)).toBe(CAPS.maxTokens * CAPS.maxCharsPerToken);
    await refused(long, 'trace', { prompt: 'Once '.repeat(30_000) }, 'prompt');
  });
});
