import { describe, it, expect } from 'vitest';
import { z } from 'zod';
import { fieldsOf, buildInput, rawFromInput } from '../src/ui/forms/schema-form';
import { patchInput } from '../src/ops/patch';

const schema = z.object({
  prompt: z.string(),
  prepend_bos: z.boolean().default(true),
  convention: z.enum(['transformer_lens', 'raw']).default('transformer_lens'),
  top_k: z.number().int().min(1).default(10),
  alpha: z.number().optional(),
  sites: z.array(z.enum(['a', 'b'])).default(['a', 'b']),
  prompts: z.array(z.string()).optional(),
  alphas: z.array(z.number()).optional(),
  positions: z.union([z.literal('all'), z.array(z.number().int())]).default('all'),
  heads: z.array(z.object({ layer: z.number().int(), head: z.number().int() })).optional(),
  clean: z.string(),
  direction: z.union([z.string(), z.object({ kind: z.literal('tokens'), positive: z.string() })]).optional(),
  corpus: z.string().default('').meta({ contentMediaType: 'text/plain' }),
});
const json = z.toJSONSchema(schema, { io: 'input' }) as Record<string, unknown>;
const fields = fieldsOf(json);
const kind = (n: string) => fields.find((f) => f.name === n)!.kind;

describe('schema forms', () => {
  it('picks a control for each kind of field', () => {
    expect(kind('prompt')).toBe('textarea');
    expect(fields.find((f) => f.name === 'prompt')!.fromPromptBox).toBe(true);
    expect(kind('prepend_bos')).toBe('boolean');
    expect(kind('convention')).toBe('enum');
    expect(kind('top_k')).toBe('integer');
    expect(fields.find((f) => f.name === 'top_k')!.min).toBe(1);
    expect(kind('alpha')).toBe('number');
    expect(kind('sites')).toBe('multi');
    expect(kind('prompts')).toBe('lines');
    expect(kind('alphas')).toBe('numbers');
    expect(kind('positions')).toBe('all_or_numbers');
    expect(kind('heads')).toBe('json');
    expect(kind('clean')).toBe('textarea');
    expect(kind('direction')).toBe('string_or_json');
    // a text that may come from a file (JSON Schema contentMediaType): a textarea with drop/pick
    expect(kind('corpus')).toBe('textarea');
    expect(fields.find((f) => f.name === 'corpus')!.file).toBe(true);
    expect(fields.find((f) => f.name === 'clean')!.file).toBeUndefined();
  });

  it("a dataset in the form leaves the prompt box out (patch's dataset mode refuses a prompt beside it)", () => {
    const patch = fieldsOf(z.toJSONSchema(patchInput, { io: 'input' }) as Record<string, unknown>);
    const gen = '{"task": "ioi", "n": 4}';
    const single = buildInput(patch, { corrupted_prompt: 'b' }, 'a');
    expect(single.input).toMatchObject({ prompt: 'a', corrupted_prompt: 'b' });
    const ds = buildInput(patch, { generate: gen }, 'a');
    expect(ds.errors).toEqual({});
    expect(ds.input).toEqual({ generate: { task: 'ioi', n: 4 } });
    expect(patchInput.parse(ds.input).generate).toMatchObject({ task: 'ioi', n: 4 });
    expect(buildInput(patch, { dataset_text: '{"clean": "x"}' }, 'a').input.prompt).toBeUndefined();
    // JSON Lines / CSV may come from a file
    expect(patch.find((f) => f.name === 'dataset_text')!.file).toBe(true);
  });

  it('takes a shorthand string or a JSON object for string-or-object fields', () => {
    expect(buildInput(fields, { clean: 'c', direction: 'tokens: love - hate' }, 'p').input.direction).toBe(
      'tokens: love - hate',
    );
    expect(
      buildInput(fields, { clean: 'c', direction: ' {"kind":"tokens","positive":" a"}' }, 'p').input.direction,
    ).toEqual({ kind: 'tokens', positive: ' a' });
    expect(buildInput(fields, { clean: 'c', direction: '{oops' }, 'p').errors.direction).toBe('not valid JSON');
  });

  it('builds an input that the schema accepts, leaving defaults to the operation', () => {
    const raw = {
      top_k: '3',
      alpha: '-2.5',
      prompts: 'a b\n\nc',
      alphas: '0, 1.5 -2',
      positions: '1,2',
      heads: '[{"layer":0,"head":1}]',
      clean: 'x',
      prepend_bos: true,
    };
    const { input, errors } = buildInput(fields, raw, 'Once upon');
    expect(errors).toEqual({});
    expect(input).toEqual({
      prompt: 'Once upon',
      top_k: 3,
      alpha: -2.5,
      prompts: ['a b', 'c'],
      alphas: [0, 1.5, -2],
      positions: [1, 2],
      heads: [{ layer: 0, head: 1 }],
      clean: 'x',
    });
    const parsed = schema.parse(input);
    expect(parsed.convention).toBe('transformer_lens');
    expect(parsed.prepend_bos).toBe(true);
  });

  it('reports bad values per field instead of sending them', () => {
    const { errors } = buildInput(fields, { top_k: '0', alpha: 'x', heads: '[{', alphas: '1, two' }, '');
    expect(Object.keys(errors).sort()).toEqual(['alpha', 'alphas', 'clean', 'heads', 'top_k']);
    expect(errors.top_k).toMatch(/at least 1/);
  });

  it('round-trips an input through the form', () => {
    const input = {
      prompt: 'p',
      top_k: 4,
      prepend_bos: false,
      sites: ['a'],
      prompts: ['u', 'v'],
      alphas: [1, 2],
      positions: 'all',
      heads: [{ layer: 1, head: 0 }],
      clean: 'c',
      direction: { kind: 'tokens', positive: ' x' },
    };
    const raw = rawFromInput(fields, input);
    expect(buildInput(fields, raw, 'p').input).toEqual(input);
  });
});
