/**
 * The generic flag → input mapping of the CLI, on a schema that has every kind of field, and on
 * the real input schemas of operations other engineers wrote (so their flags work with no code).
 */
import { describe, it, expect } from 'vitest';
import { z } from 'zod';
import { splitArgs, flagsToInput, coerce, isBooleanField, properties, UsageError, CLI_FLAGS } from '../src/cli/args';
import { getOperation } from '../src/ops/index';
import { schemasOf } from '../src/ops/schemas';

const schema = z.object({
  prompt: z.string(),
  top_k: z.number().int().default(5),
  alpha: z.number(),
  stop_at_eos: z.boolean().default(true),
  positions: z.union([z.literal('all'), z.array(z.number().int())]).default('all'),
  method: z.enum(['zero', 'mean', 'resample']).default('zero'),
  mean_prompts: z.array(z.string()).optional(),
  heads: z.array(z.object({ layer: z.number().int(), head: z.number().int() })).optional(),
  direction: z.union([z.object({ tokens: z.tuple([z.string(), z.string()]) }), z.array(z.number())]).optional(),
  label: z.string().optional(),
});
const json = z.toJSONSchema(schema, { io: 'input' }) as Record<string, unknown>;
const props = properties(json);
const isBool = (n: string) =>
  n in CLI_FLAGS ? CLI_FLAGS[n].boolean : isBooleanField(json, props[n.replace(/-/g, '_')]);
const parse = (argv: string[]) => {
  const { positionals, flags } = splitArgs(argv, isBool);
  return { positionals, input: flagsToInput(json, flags) };
};

describe('CLI flags → operation input', () => {
  it("maps kebab-case flags to snake_case fields with the schema's types", () => {
    const { positionals, input } = parse([
      'default',
      'Hello there',
      '--top-k',
      '3',
      '--alpha',
      '-2.5',
      '--positions',
      '1,2,7',
      '--method',
      'mean',
      '--json',
    ]);
    expect(positionals).toEqual(['default', 'Hello there']);
    expect(input).toEqual({ top_k: 3, alpha: -2.5, positions: [1, 2, 7], method: 'mean' });
    expect(schema.safeParse({ prompt: 'x', ...input }).success).toBe(true);
  });

  it('booleans: bare, --no-, and =value', () => {
    expect(parse(['--stop-at-eos']).input).toEqual({ stop_at_eos: true });
    expect(parse(['--no-stop-at-eos']).input).toEqual({ stop_at_eos: false });
    expect(parse(['--stop-at-eos=false']).input).toEqual({ stop_at_eos: false });
    // a bare boolean does not swallow the next argument
    expect(parse(['--stop-at-eos', 'MODEL']).positionals).toEqual(['MODEL']);
  });

  it('unions: a constant, a comma list, a single number, JSON', () => {
    expect(parse(['--positions', 'all']).input).toEqual({ positions: 'all' });
    expect(parse(['--positions', '4']).input).toEqual({ positions: [4] });
    expect(parse(['--positions=[0,3]']).input).toEqual({ positions: [0, 3] });
    expect(parse(['--direction', '{"tokens":[" love"," hate"]}']).input).toEqual({
      direction: { tokens: [' love', ' hate'] },
    });
    expect(parse(['--direction', '0.5,-1,2']).input).toEqual({ direction: [0.5, -1, 2] });
  });

  it('arrays of strings and of objects; strings that look like numbers stay strings', () => {
    expect(parse(['--mean-prompts', 'a cat,a dog']).input).toEqual({ mean_prompts: ['a cat', 'a dog'] });
    expect(parse(['--mean-prompts', '["x, y","z"]']).input).toEqual({ mean_prompts: ['x, y', 'z'] });
    expect(parse(['--heads', '[{"layer":1,"head":2}]']).input).toEqual({ heads: [{ layer: 1, head: 2 }] });
    expect(parse(['--label', '42']).input).toEqual({ label: '42' });
    expect(coerce(json, props.alpha, '1e-3')).toBe(0.001);
  });

  it('usage errors name the problem', () => {
    const err = (argv: string[]) => {
      try {
        parse(argv);
      } catch (e) {
        expect(e).toBeInstanceOf(UsageError);
        return (e as Error).message;
      }
      throw new Error('expected a usage error');
    };
    expect(err(['--bogus', '1'])).toMatch(/Unknown option --bogus/);
    expect(err(['--top-k', 'lots'])).toMatch(/--top-k: expected a number/);
    expect(err(['--top-k', '2.5'])).toMatch(/expected an integer/);
    expect(err(['--method', 'erase'])).toMatch(/expected one of "zero", "mean", "resample"/);
    expect(err(['--heads', '1,2'])).toMatch(/JSON array/);
    expect(err(['--top-k'])).toMatch(/needs a value/);
    expect(err(['--alpha', '1', '--alpha', '2'])).toMatch(/given twice/);
    expect(err(['--prompt', 'x'])).toMatch(/Unknown option --prompt/); // the prompt is positional
    expect(err(['-x'])).toMatch(/Unknown option '-x'/);
  });

  it('everything after -- is positional; a prompt may start with a dash', () => {
    expect(parse(['m', '--', '--top-k']).positionals).toEqual(['m', '--top-k']);
    expect(parse(['m', '-5 degrees']).positionals).toEqual(['m', '-5 degrees']);
  });
});

describe('flags of operations written by others (their published input schemas)', () => {
  const mapped = (op: string, argv: string[]) => {
    const s = schemasOf(op).input;
    const p = properties(s);
    const { flags } = splitArgs(argv, (n) =>
      n in CLI_FLAGS ? CLI_FLAGS[n].boolean : isBooleanField(s, p[n.replace(/-/g, '_')]),
    );
    const input = { prompt: 'When Mary and John went to the store, John gave a drink to', ...flagsToInput(s, flags) };
    const r = getOperation(op)!.input.safeParse(input);
    expect(r.success, JSON.stringify(r.error?.issues)).toBe(true);
    return input;
  };
  it.skipIf(!getOperation('ablate'))('ablate --layer --head --method --positions', () => {
    expect(mapped('ablate', ['--layer', '1', '--head', '2', '--method', 'mean', '--positions', '1,2'])).toMatchObject({
      layer: 1,
      head: 2,
      method: 'mean',
      positions: [1, 2],
    });
    expect(mapped('ablate', ['--layer', '0', '--component', 'mlp_out'])).toMatchObject({
      layer: 0,
      component: 'mlp_out',
    });
    expect(mapped('ablate', ['--layer', '0', '--neuron', '17', '--method', 'resample', '--seed', '3'])).toMatchObject({
      neuron: 17,
      method: 'resample',
      seed: 3,
    });
  });
  it.skipIf(!getOperation('steer'))('steer --layer --alpha (negative) --direction', () => {
    const input = mapped('steer', [
      '--layer',
      '2',
      '--alpha',
      '-4',
      '--direction',
      '{"kind":"tokens","positive":" love","negative":" hate"}',
      '--max-new-tokens',
      '5',
    ]);
    expect(input).toMatchObject({ layer: 2, alpha: -4, max_new_tokens: 5 });
  });
});
