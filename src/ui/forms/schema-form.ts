/**
 * Parameter forms generated from each operation's input JSON Schema (zod → JSON Schema, sent by
 * the worker), so every operation — including ones added later — gets a form without page code.
 *
 * The form keeps raw values (what the person typed); `buildInput` turns them into the input
 * document, leaving out empty fields so the operation's own defaults apply, and `rawFromInput`
 * goes the other way when a share link fills the form.
 */

export type FieldKind =
  | 'text'
  | 'textarea'
  | 'number'
  | 'integer'
  | 'boolean'
  | 'enum'
  | 'multi'
  | 'lines'
  | 'numbers'
  | 'all_or_numbers'
  | 'string_or_json'
  | 'json';

export interface Field {
  name: string;
  kind: FieldKind;
  label: string;
  description?: string;
  default?: unknown;
  required: boolean;
  options?: string[];
  min?: number;
  max?: number;
  /** 'prompt' is edited in the page's prompt box, not in the form */
  fromPromptBox?: boolean;
  /** for JSON fields: a value of the right shape, written as JSON (the format hint) */
  example?: string;
  /** a text that may come from a file (JSON Schema contentMediaType): the form offers drop and pick */
  file?: boolean;
  /** shown (and sent) only while these fields hold one of these values (x-loupe-when, ops/types.ts formWhen) */
  when?: Record<string, string[]>;
}

/** The fields that apply to the form's current values: those whose `when` holds (a field's own default counts). */
export function visibleFields(fields: Field[], raw: Record<string, unknown>): Field[] {
  const value = (name: string) => {
    const v = raw[name];
    return v === undefined || v === null || v === '' ? fields.find((f) => f.name === name)?.default : v;
  };
  return fields.filter(
    (f) => !f.when || Object.entries(f.when).every(([k, allowed]) => allowed.includes(String(value(k) ?? ''))),
  );
}

type Json = Record<string, any>;

const BIG = 9007199254740991;

function nonNull(s: Json): Json {
  const alts = (s.anyOf ?? s.oneOf) as Json[] | undefined;
  if (!alts) return s;
  const rest = alts.filter((a) => a.type !== 'null');
  return rest.length === 1 ? { ...s, ...rest[0], anyOf: undefined, oneOf: undefined } : s;
}

function kindOf(name: string, s: Json): Pick<Field, 'kind' | 'options' | 'min' | 'max' | 'file'> {
  const alts = (s.anyOf ?? s.oneOf) as Json[] | undefined;
  if (alts) {
    const hasAll = alts.some((a) => a.const === 'all');
    const arr = alts.find((a) => a.type === 'array');
    if (hasAll && arr && ['integer', 'number'].includes(arr.items?.type)) return { kind: 'all_or_numbers' };
    // e.g. a steering direction: the shorthand string ("tokens: love - hate") or an object
    if (alts.some((a) => a.type === 'string' && a.const === undefined && a.enum === undefined))
      return { kind: 'string_or_json' };
    return { kind: 'json' };
  }
  const lim = (x: unknown) => (typeof x === 'number' && Math.abs(x) < BIG ? x : undefined);
  switch (s.type) {
    case 'string':
      if (Array.isArray(s.enum)) return { kind: 'enum', options: s.enum.map(String) };
      if (typeof s.contentMediaType === 'string') return { kind: 'textarea', file: true };
      return { kind: /prompt|clean|corrupted|text/.test(name) ? 'textarea' : 'text' };
    case 'integer':
      return { kind: 'integer', min: lim(s.minimum), max: lim(s.maximum) };
    case 'number':
      return { kind: 'number', min: lim(s.minimum ?? s.exclusiveMinimum), max: lim(s.maximum ?? s.exclusiveMaximum) };
    case 'boolean':
      return { kind: 'boolean' };
    case 'array': {
      const it = nonNull(s.items ?? {});
      if (it.type === 'string' && Array.isArray(it.enum)) return { kind: 'multi', options: it.enum.map(String) };
      if (it.type === 'string') return { kind: 'lines' };
      if (it.type === 'integer' || it.type === 'number') return { kind: 'numbers' };
      return { kind: 'json' };
    }
    default:
      return { kind: 'json' };
  }
}

/**
 * A small value of a schema's shape, for the format hint of JSON fields: arrays of one item,
 * objects with their required properties plus the first optional integer one (a target's
 * `head`), numbers at their minimum.
 */
export function exampleOf(raw: Json, depth = 0): unknown {
  if (depth > 4) return null;
  const alts = (raw.anyOf ?? raw.oneOf) as Json[] | undefined;
  if (alts) {
    const pick =
      alts.find((a) => a.type === 'array' || a.type === 'object') ?? alts.find((a) => a.type !== 'null') ?? {};
    return exampleOf(pick, depth + 1);
  }
  if (raw.const !== undefined) return raw.const;
  if (Array.isArray(raw.enum)) return raw.enum[0];
  switch (raw.type) {
    case 'array':
      return [exampleOf(raw.items ?? {}, depth + 1)];
    case 'object': {
      const props = (raw.properties ?? {}) as Record<string, Json>;
      const req = new Set<string>((raw.required ?? []) as string[]);
      const extra = Object.keys(props).find((k) => !req.has(k) && nonNull(props[k]).type === 'integer');
      const keys = Object.keys(props).filter((k) => req.has(k) || k === extra);
      return Object.fromEntries(keys.map((k) => [k, exampleOf(props[k], depth + 1)]));
    }
    case 'integer':
    case 'number':
      return typeof raw.minimum === 'number' && Math.abs(raw.minimum) < BIG ? raw.minimum : 0;
    case 'boolean':
      return false;
    case 'string':
      return '…';
    default:
      return null;
  }
}

export function labelOf(name: string): string {
  return name.replace(/_/g, ' ');
}

export function fieldsOf(schema: Json): Field[] {
  const props = (schema.properties ?? {}) as Record<string, Json>;
  const required = new Set<string>((schema.required ?? []) as string[]);
  return Object.entries(props)
    .map(([name, raw]) => {
      const s = nonNull(raw);
      return {
        name,
        label: labelOf(name),
        description: raw.description ?? s.description,
        default: raw.default ?? s.default,
        required: required.has(name),
        fromPromptBox: name === 'prompt',
        ...(raw['x-loupe-when'] ? { when: raw['x-loupe-when'] as Record<string, string[]> } : {}),
        ...kindOf(name, s),
      };
    })
    .map((f) => {
      if (f.kind !== 'json' && f.kind !== 'string_or_json') return f;
      const ex = exampleOf(nonNull(props[f.name]));
      return ex === null || ex === undefined ? f : { ...f, example: JSON.stringify(ex) };
    });
}

export interface BuildResult {
  input: Record<string, unknown>;
  errors: Record<string, string>;
}

const isEmpty = (v: unknown) => v === undefined || v === null || (typeof v === 'string' && v.trim() === '');

function parseNumbers(text: string, integer: boolean): number[] {
  return text
    .split(/[\s,]+/)
    .filter(Boolean)
    .map((t) => {
      const n = Number(t);
      if (!Number.isFinite(n) || (integer && !Number.isInteger(n)))
        throw new Error(`"${t}" is not ${integer ? 'an integer' : 'a number'}`);
      return n;
    });
}

/** the fields that put an operation in dataset mode (ops/lib/dataset.ts datasetFields) */
const DATASET_SOURCES = ['dataset', 'dataset_text', 'generate'];

/**
 * Raw form values (+ the prompt box) → the operation's input. Empty optional fields are left out;
 * so is the prompt box where the form names a dataset (each pair carries its own prompts).
 */
export function buildInput(fields: Field[], raw: Record<string, unknown>, prompt: string): BuildResult {
  const input: Record<string, unknown> = {};
  const errors: Record<string, string> = {};
  for (const f of fields) {
    if (f.fromPromptBox) {
      input[f.name] = prompt;
      continue;
    }
    const v = raw[f.name];
    if (f.kind === 'boolean') {
      if (typeof v === 'boolean' && v !== (f.default ?? false)) input[f.name] = v;
      else if (typeof v === 'boolean' && f.default === undefined) input[f.name] = v;
      continue;
    }
    if (f.kind === 'multi') {
      if (Array.isArray(v)) input[f.name] = v;
      continue;
    }
    if (isEmpty(v)) {
      if (f.required) errors[f.name] = 'required';
      continue;
    }
    const text = String(v);
    try {
      switch (f.kind) {
        case 'text':
        case 'textarea':
        case 'enum':
          input[f.name] = text;
          break;
        case 'integer':
        case 'number': {
          const n = Number(text);
          if (!Number.isFinite(n)) throw new Error('not a number');
          if (f.kind === 'integer' && !Number.isInteger(n)) throw new Error('not an integer');
          if (f.min !== undefined && n < f.min) throw new Error(`at least ${f.min}`);
          if (f.max !== undefined && n > f.max) throw new Error(`at most ${f.max}`);
          input[f.name] = n;
          break;
        }
        case 'lines':
          input[f.name] = text
            .split('\n')
            .map((l) => l.replace(/\r$/, ''))
            .filter((l) => l.length > 0);
          break;
        case 'numbers':
          input[f.name] = parseNumbers(text, false);
          break;
        case 'all_or_numbers':
          input[f.name] = text.trim() === 'all' ? 'all' : parseNumbers(text, true);
          break;
        case 'string_or_json':
          input[f.name] = /^\s*[[{]/.test(text) ? JSON.parse(text) : text;
          break;
        case 'json':
          input[f.name] = JSON.parse(text);
          break;
      }
    } catch (e) {
      errors[f.name] = e instanceof SyntaxError ? 'not valid JSON' : (e as Error).message;
    }
  }
  if (DATASET_SOURCES.some((k) => k in input)) for (const f of fields) if (f.fromPromptBox) delete input[f.name];
  return { input, errors };
}

/** An input document → raw form values (for share links and "edit this run"). */
export function rawFromInput(fields: Field[], input: Record<string, unknown>): Record<string, unknown> {
  const raw: Record<string, unknown> = {};
  for (const f of fields) {
    if (f.fromPromptBox || !(f.name in input)) continue;
    const v = input[f.name];
    switch (f.kind) {
      case 'boolean':
      case 'multi':
        raw[f.name] = v;
        break;
      case 'lines':
        raw[f.name] = Array.isArray(v) ? v.join('\n') : String(v);
        break;
      case 'numbers':
      case 'all_or_numbers':
        raw[f.name] = Array.isArray(v) ? v.join(', ') : String(v);
        break;
      case 'json':
        raw[f.name] = JSON.stringify(v);
        break;
      case 'string_or_json':
        raw[f.name] = typeof v === 'string' ? v : JSON.stringify(v);
        break;
      default:
        raw[f.name] = String(v);
    }
  }
  return raw;
}

/** Placeholder text that shows the default the operation will use. */
export function placeholderOf(f: Field): string {
  if (f.default === undefined) return f.example ? `e.g. ${f.example}` : f.required ? 'required' : 'optional';
  if (Array.isArray(f.default)) return f.default.join(f.kind === 'lines' ? ' / ' : ', ');
  return typeof f.default === 'object' ? JSON.stringify(f.default) : String(f.default);
}
