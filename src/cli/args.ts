/**
 * Command-line flags → an operation's input, driven by the operation's published JSON Schema, so
 * every operation (whoever wrote it) gets flags with no per-operation code:
 *   --top-k 5          → top_k: 5          (kebab-case flag → snake_case field)
 *   --positions 1,2    → positions: [1, 2] (comma lists for arrays; items typed by the schema)
 *   --stop-at-eos / --no-stop-at-eos / --stop-at-eos=false   (booleans)
 *   --heads '[{"layer":1,"head":2}]'       (objects and arrays of objects as JSON)
 *   --input '{"top_k": 3}'                 (any fields, merged over the flags)
 */
import type { JsonSchema } from '../ops/schemas';
import { NODE_BACKENDS_HELP } from '../node/backends';

/** a mistake in how the command was written: exit code 2 */
export class UsageError extends Error {
  constructor(
    message: string,
    readonly hint?: string,
  ) {
    super(message);
    this.name = 'UsageError';
  }
}

/** flags the CLI itself owns, for every operation */
export const CLI_FLAGS: Record<string, { boolean: boolean; help: string }> = {
  json: { boolean: true, help: 'print only the JSON document on stdout (errors as {"error": {...}})' },
  help: { boolean: true, help: 'show this help' },
  quiet: { boolean: true, help: 'no progress on stderr' },
  backend: { boolean: false, help: NODE_BACKENDS_HELP },
  weights: {
    boolean: false,
    help:
      'weight precision: auto (default: float32 when it fits, else stored), f32, ' +
      'stored (F16/BF16 kept 16-bit, widened at use), q8 (8-bit matrices) or q4 (4-bit Linears, other ' +
      'matrices q8); q8 and q4 are opt-in: the numbers change; `loupe doctor` reports by how much',
  },
  input: { boolean: false, help: 'operation input as JSON, merged over the other flags' },
  'idle-timeout': {
    boolean: false,
    help:
      'seconds a download may wait for its next byte before it fails (default 60, or $LOUPE_IDLE_TIMEOUT); ' +
      'every download also has an overall deadline ($LOUPE_REQUEST_DEADLINE, default 300 s plus 1 s per 64 KiB)',
  },
};

export const kebab = (s: string) => s.replace(/_/g, '-');
export const snake = (s: string) => s.replace(/-/g, '_');

export interface RawArgs {
  positionals: string[];
  /** flag name (kebab, without --) → its text, or true for a bare boolean; `no-x` bare → x: false */
  flags: Map<string, string | boolean>;
}

/**
 * Split argv into positionals and flags. `isBoolean(name)` says which flags take no value, so a
 * value such as a negative number (`--alpha -3`) is never mistaken for a flag.
 */
export function splitArgs(argv: string[], isBoolean: (name: string) => boolean): RawArgs {
  const positionals: string[] = [];
  const flags = new Map<string, string | boolean>();
  let onlyPositionals = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (onlyPositionals || !a.startsWith('-') || a === '-' || /^-\d/.test(a)) {
      positionals.push(a);
      continue;
    }
    if (a === '--') {
      onlyPositionals = true;
      continue;
    }
    if (a === '-h') {
      flags.set('help', true);
      continue;
    }
    if (!a.startsWith('--')) throw new UsageError(`Unknown option '${a}'.`, 'Options are written --name value.');
    let name = a.slice(2);
    let value: string | boolean | undefined;
    const eq = name.indexOf('=');
    if (eq >= 0) {
      value = name.slice(eq + 1);
      name = name.slice(0, eq);
    }
    name = kebab(name);
    if (value === undefined) {
      if (isBoolean(name)) value = true;
      else if (name.startsWith('no-') && isBoolean(name.slice(3))) {
        name = name.slice(3);
        value = false;
      } else {
        if (i + 1 >= argv.length) throw new UsageError(`Option --${name} needs a value.`);
        value = argv[++i];
      }
    }
    if (flags.has(name)) throw new UsageError(`Option --${name} is given twice.`);
    flags.set(name, value);
  }
  return { positionals, flags };
}

// ------------------------------------------------------------------ schema-driven coercion

/** the JSON Schema of one property, with $ref resolved against the root's $defs */
function resolve(root: JsonSchema, s: JsonSchema): JsonSchema {
  const ref = s.$ref as string | undefined;
  if (ref && ref.startsWith('#/$defs/')) {
    const defs = (root.$defs ?? {}) as Record<string, JsonSchema>;
    return resolve(root, defs[ref.slice('#/$defs/'.length)] ?? {});
  }
  return s;
}

function types(s: JsonSchema): string[] {
  const t = s.type;
  return Array.isArray(t) ? (t as string[]) : typeof t === 'string' ? [t] : [];
}

export function isBooleanField(root: JsonSchema, s: JsonSchema | undefined): boolean {
  if (!s) return false;
  const r = resolve(root, s);
  return types(r).includes('boolean') && types(r).length === 1;
}

/** text → a value of the schema's type; throws an Error with a reason when it cannot */
export function coerce(root: JsonSchema, schema: JsonSchema, text: string): unknown {
  const s = resolve(root, schema);
  const branches = (s.anyOf ?? s.oneOf) as JsonSchema[] | undefined;
  if (branches) {
    // exact constants first (e.g. 'all'), then the typed branches in order
    const sorted = [...branches].sort(
      (a, b) =>
        Number('const' in resolve(root, b) || 'enum' in resolve(root, b)) -
        Number('const' in resolve(root, a) || 'enum' in resolve(root, a)),
    );
    const errors: string[] = [];
    for (const b of sorted) {
      try {
        return coerce(root, b, text);
      } catch (e) {
        errors.push((e as Error).message);
      }
    }
    throw new Error(errors.join('; or '));
  }
  if ('const' in s) {
    if (String(s.const) === text) return s.const;
    throw new Error(`expected ${JSON.stringify(s.const)}`);
  }
  if (Array.isArray(s.enum)) {
    const hit = (s.enum as unknown[]).find((v) => String(v) === text);
    if (hit !== undefined) return hit;
    throw new Error(`expected one of ${(s.enum as unknown[]).map((v) => JSON.stringify(v)).join(', ')}`);
  }
  const ts = types(s);
  if (ts.includes('integer') || ts.includes('number')) {
    const n = Number(text);
    if (text.trim() !== '' && Number.isFinite(n)) {
      if (ts.includes('integer') && !Number.isInteger(n) && !ts.includes('number'))
        throw new Error(`expected an integer, got '${text}'`);
      return n;
    }
    if (ts.length === 1 || !ts.some((t) => t !== 'integer' && t !== 'number'))
      throw new Error(`expected a number, got '${text}'`);
  }
  if (ts.includes('boolean')) {
    if (/^(true|1|yes)$/i.test(text)) return true;
    if (/^(false|0|no)$/i.test(text)) return false;
    if (ts.length === 1) throw new Error(`expected true or false, got '${text}'`);
  }
  if (ts.includes('array')) {
    const t = text.trim();
    if (t.startsWith('[')) return parseJson(t);
    const items = (s.items ?? {}) as JsonSchema;
    const it = resolve(root, items);
    if (types(it).includes('object')) throw new Error('expected a JSON array, e.g. [{"layer":0,"head":1}]');
    return t === '' ? [] : t.split(',').map((x) => coerce(root, items, x.trim()));
  }
  if (ts.includes('object')) {
    const t = text.trim();
    if (t.startsWith('{')) return parseJson(t);
    throw new Error('expected a JSON object');
  }
  if (ts.includes('string') || ts.length === 0) return text;
  if (ts.includes('null') && text === 'null') return null;
  throw new Error(`cannot read '${text}' as ${ts.join(' | ')}`);
}

function parseJson(t: string): unknown {
  try {
    return JSON.parse(t);
  } catch (e) {
    throw new Error(`invalid JSON: ${(e as Error).message}`);
  }
}

/** properties of an object schema */
export function properties(root: JsonSchema): Record<string, JsonSchema> {
  return (resolve(root, root).properties ?? {}) as Record<string, JsonSchema>;
}

/**
 * Operation flags → input fields. Unknown flags are usage errors that list the valid ones.
 */
export function flagsToInput(inputSchema: JsonSchema, flags: Map<string, string | boolean>): Record<string, unknown> {
  const props = properties(inputSchema);
  const out: Record<string, unknown> = {};
  for (const [flag, value] of flags) {
    if (flag in CLI_FLAGS) continue;
    const field = snake(flag);
    const p = props[field];
    if (!p || field === 'prompt') {
      const valid = Object.keys(props)
        .filter((k) => k !== 'prompt')
        .map((k) => `--${kebab(k)}`);
      throw new UsageError(
        `Unknown option --${flag}.`,
        `Options of this operation: ${valid.join(', ') || '(none)'}; plus ${Object.keys(CLI_FLAGS)
          .map((k) => `--${k}`)
          .join(', ')}.`,
      );
    }
    if (typeof value === 'boolean') {
      if (!isBooleanField(inputSchema, p)) throw new UsageError(`Option --${flag} needs a value.`);
      out[field] = value;
      continue;
    }
    try {
      out[field] = coerce(inputSchema, p, value);
    } catch (e) {
      throw new UsageError(`Option --${flag}: ${(e as Error).message}.`);
    }
  }
  return out;
}
