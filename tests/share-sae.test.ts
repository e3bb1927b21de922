/**
 * Share links of the SAE operations: their inputs (SAE source and path, feature, descriptions as
 * a URL or inline JSON, sweep values, positions) survive the link codec exactly, and a link that
 * fills the page's form (rawFromInput) gives back the same input when run (buildInput), for the
 * forms generated from the operations' own schemas — as the worker sends them to the page.
 */
import { describe, it, expect } from 'vitest';
import { z } from 'zod';
import { encodeShare, decodeShare, type ShareState } from '../src/share/codec';
import { fieldsOf, buildInput, rawFromInput } from '../src/ui/forms/schema-form';
import { carriedSae } from '../src/ui/forms/examples';
import { operations } from '../src/ops/index';

const SAE = {
  sae_source: 'http://127.0.0.1:8123/loupe-test/stories260K-saes/resolve/main',
  sae_path: 'blocks.2.hook_resid_pre',
};
const PROMPT = 'Once upon a time, there was a little';
const DESCRIPTIONS = [
  { index: '3', description: 'the word "little" — ünïcödé' },
  { index: '7', description: 'names' },
];

const INPUTS: Record<string, Record<string, unknown>> = {
  sae_features: {
    prompt: PROMPT,
    ...SAE,
    top_k: 8,
    position: 3,
    descriptions: 'https://example.org/explanations.json',
  },
  feature: {
    prompt: PROMPT,
    ...SAE,
    feature: 7,
    prompts: ['Lily was happy', 'The big dog'],
    top_k: 5,
    descriptions: DESCRIPTIONS,
  },
  sae_steer: {
    prompt: PROMPT,
    ...SAE,
    feature: 3,
    edit: 'clamp',
    alphas: [-8, 0, 2.5, 8],
    positions: [1, 4],
    max_new_tokens: 12,
    targets: [' happy'],
  },
};

/** the form fields the page builds for an operation (the worker's conversion: zod → JSON Schema, input side) */
function formFields(op: string) {
  return fieldsOf(
    z.toJSONSchema(operations[op].input, { io: 'input', unrepresentable: 'any' }) as Record<string, unknown>,
  );
}

describe('share links of the SAE operations', () => {
  for (const [op, input] of Object.entries(INPUTS)) {
    it(`${op}: the input survives the link and the form it fills`, () => {
      expect(operations[op].input.safeParse(input).success).toBe(true);
      const state: ShareState = {
        v: 1,
        model: { kind: 'bundled', id: 'stories260K', revision: '' },
        op,
        input,
        result: { operation: op, sae: { source: SAE.sae_source } },
      };
      const back = decodeShare(encodeShare(state).text);
      expect(back).toEqual(state);

      const fields = formFields(op);
      const raw = rawFromInput(fields, back.input);
      expect(raw.sae_source).toBe(SAE.sae_source);
      expect(raw.sae_path).toBe(SAE.sae_path);
      const rebuilt = buildInput(fields, raw, back.input.prompt as string);
      expect(rebuilt.errors).toEqual({});
      expect(rebuilt.input).toEqual(input);
    });
  }
});

describe('the SAE carries over between the SAE forms', () => {
  it('takes sae_source/sae_path (and descriptions) from another SAE form, never into other operations', () => {
    const params = {
      sae_features: { ...SAE, top_k: '8', descriptions: 'https://example.org/e.json' },
      trace: { top_k: '3' },
    };
    expect(carriedSae(params, 'feature')).toEqual({ ...SAE, descriptions: 'https://example.org/e.json' });
    expect(carriedSae(params, 'sae_features')).toEqual({});
    expect(carriedSae(params, 'trace')).toEqual({});
    expect(carriedSae({ feature: { sae_source: '  ' } }, 'sae_steer')).toEqual({});
  });
});
