/** Help text, generated from the registry and the operations' input schemas. */
import { operations } from '../ops/index';
import type { Operation } from '../ops/types';
import { operationSchemas, type JsonSchema } from '../ops/schemas';
import { CLI_FLAGS, kebab, properties } from './args';

function firstSentence(s: string): string {
  const m = /^(.+?\.)(\s|$)/.exec(s);
  const t = m ? m[1] : s;
  return t.length > 100 ? t.slice(0, 99) + '…' : t;
}

export function mainHelp(): string {
  const ops = Object.values(operations);
  const w = Math.max(8, ...ops.map((o) => o.name.length));
  return [
    'loupe — mechanistic interpretability on Hugging Face models, in the browser or here.',
    '',
    'usage: loupe <operation> MODEL PROMPT [options]',
    '       loupe <operation> --help     fields of one operation',
    "       loupe models [FILTER]        model names (TransformerLens's), families, sizes, memory per backend",
    '       loupe doctor                 runtime, backends, threads, backend agreement, cache',
    '       loupe doctor --verify-cache  hash every cached file against the SHA-256 recorded when it was written',
    '       loupe schema [operation]     JSON Schemas of inputs and outputs',
    '       loupe mcp ...                the MCP bridge',
    "       loupe serve ...              this machine's engine for a page elsewhere (over ssh -L)",
    '',
    "MODEL: 'default' (the bundled stories260K), a name as TransformerLens gives it (gpt2-small, gemma-3-270m; 'loupe models'),",
    '       a Hugging Face Hub id, or a folder with config.json + safetensors.',
    '',
    'operations:',
    ...ops.map((o) => `  ${o.name.padEnd(w)}  ${firstSentence(o.description)}`),
    '',
    'options for every operation:',
    ...Object.entries(CLI_FLAGS).map(([k, v]) => `  --${k.padEnd(10)} ${v.help}`),
    "  any input field as --kebab-case-name VALUE (numbers and comma lists parsed by the field's type)",
    '',
    'exit codes: 0 ok, 1 runtime error, 2 usage error, 3 unsupported model.',
    'e.g. loupe trace default "Once upon a time" --top-k 5 --json',
  ].join('\n');
}

function typeOf(root: JsonSchema, s: JsonSchema): string {
  if (s.$ref) {
    const defs = (root.$defs ?? {}) as Record<string, JsonSchema>;
    return typeOf(root, defs[String(s.$ref).replace('#/$defs/', '')] ?? {});
  }
  const br = (s.anyOf ?? s.oneOf) as JsonSchema[] | undefined;
  if (br) return br.map((b) => typeOf(root, b)).join(' | ');
  if ('const' in s) return JSON.stringify(s.const);
  if (Array.isArray(s.enum)) return (s.enum as unknown[]).map(String).join('|');
  const t = Array.isArray(s.type) ? (s.type as string[]).join('|') : String(s.type ?? 'json');
  if (t === 'array') {
    const it = typeOf(root, (s.items ?? {}) as JsonSchema);
    return it === 'JSON object' ? 'JSON array' : `${it},${it},… or a JSON array`;
  }
  if (t === 'object') return 'JSON object';
  return t;
}

export function operationHelp(op: Operation): string {
  const schema = operationSchemas(op).input;
  const props = properties(schema);
  const required = new Set((schema.required as string[] | undefined) ?? []);
  const hasPrompt = 'prompt' in props;
  const lines = [`loupe ${op.name} MODEL${hasPrompt ? ' PROMPT' : ''} [options]`, '', op.description, '', 'options:'];
  for (const [name, p] of Object.entries(props)) {
    if (name === 'prompt') continue;
    const def = 'default' in p ? ` (default ${JSON.stringify(p.default)})` : required.has(name) ? ' (required)' : '';
    const isBool = p.type === 'boolean';
    lines.push(`  --${kebab(name)}${isBool ? ` / --no-${kebab(name)}` : ` <${typeOf(schema, p)}>`}${def}`);
    if (p.description) lines.push(`      ${p.description}`);
  }
  lines.push('', ...Object.entries(CLI_FLAGS).map(([k, v]) => `  --${k.padEnd(10)} ${v.help}`));
  return lines.join('\n');
}
