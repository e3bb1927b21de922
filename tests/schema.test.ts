/**
 * The published JSON Schemas: one input and one output schema per registered operation, valid
 * draft 2020-12 (compiled by ajv, an independent validator), every output carrying the common
 * document head, and the input schemas agreeing with the zod validation the operations run.
 */
import { describe, it, expect } from 'vitest';
import Ajv2020 from 'ajv/dist/2020';
import { operations } from '../src/ops/index';
import { allSchemas, schemasOf } from '../src/ops/schemas';
import { SCHEMA_VERSION } from '../src/schema/common';
import { schemaErrors } from './schema-helpers';

describe('published JSON Schemas', () => {
  const all = allSchemas();

  it('every registered operation has input and output schemas that compile', () => {
    expect(Object.keys(all).sort()).toEqual(Object.keys(operations).sort());
    const ajv = new Ajv2020({ strict: false });
    for (const [name, s] of Object.entries(all)) {
      expect(s.name).toBe(name);
      expect(s.schema_version).toBe(SCHEMA_VERSION);
      expect(s.description.length).toBeGreaterThan(20);
      expect(s.input.$schema).toBe('https://json-schema.org/draft/2020-12/schema');
      expect(() => ajv.compile(s.input), `${name} input`).not.toThrow();
      expect(() => ajv.compile(s.output), `${name} output`).not.toThrow();
      const out = s.output as { properties: Record<string, any>; required: string[] };
      for (const f of ['schema_version', 'operation', 'model', 'tokens'])
        expect(out.required, `${name} output requires ${f}`).toContain(f);
      expect(out.properties.operation.const).toBe(name);
      expect(out.properties.schema_version.const).toBe(SCHEMA_VERSION);
    }
  });

  it('input schemas accept what the operations accept and reject what they reject', () => {
    const cases: [string, unknown, boolean][] = [
      ['trace', { prompt: 'x' }, true],
      ['trace', { prompt: 'x', convention: 'raw', top_k: 3, answer: ' a', counterfactual: '#4', position: 0 }, true],
      ['trace', { prompt: 'x', convention: 'folded' }, false],
      ['trace', { prompt: 'x', top_k: 0 }, false],
      ['trace', {}, false],
      ['generate', { prompt: 'x', max_new_tokens: 4, temperature: 0.7, top_p: 0.9, seed: 1 }, true],
      ['generate', { prompt: 'x', temperature: -1 }, false],
      ['logit_lens', { prompt: 'x', positions: 'all' }, true],
      ['logit_lens', { prompt: 'x', positions: [0, 2] }, true],
      ['logit_lens', { prompt: 'x', positions: 'last' }, false],
      ['attention', { prompt: 'x', heads: [{ layer: 0, head: 1 }] }, true],
      ['attention', { prompt: 'x', heads: [{ layer: 0 }] }, false],
      ['activations', { prompt: 'x', sites: ['resid_pre', 'pattern'] }, true],
      ['activations', { prompt: 'x', sites: ['resid'] }, false],
    ];
    for (const [op, input, ok] of cases) {
      expect(schemaErrors(op, input, 'input').length === 0, `${op} ${JSON.stringify(input)} (JSON Schema)`).toBe(ok);
      expect(operations[op].input.safeParse(input).success, `${op} ${JSON.stringify(input)} (zod)`).toBe(ok);
    }
  });

  it('an output schema rejects a document with a wrong or missing field', () => {
    expect(schemaErrors('generate', { schema_version: SCHEMA_VERSION, operation: 'generate' }).length).toBeGreaterThan(
      0,
    );
    expect(() => schemasOf('nope')).toThrow(/No operation named/);
  });
});
