/**
 * Tools for the hostile-input suites: a companion child process driven by raw JSON-RPC lines
 * (so a request can carry what no MCP client would send: 1e999, unknown fields, broken JSON),
 * a seeded generator of hostile values, and arguments generated from a tool's JSON Schema.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { mulberry32 } from '../reference';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const BIN = path.join(ROOT, 'bin', 'loupe.mjs');

export class Companion {
  readonly child: ChildProcess;
  stderr = '';
  exited: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  private buf = '';
  private nextId = 1;
  private waiting = new Map<number | string, (msg: Record<string, unknown>) => void>();

  constructor(args: string[], env: NodeJS.ProcessEnv) {
    this.child = spawn(process.execPath, [BIN, 'mcp', ...args], { cwd: ROOT, env, stdio: ['pipe', 'pipe', 'pipe'] });
    this.child.stderr!.on('data', (d) => {
      this.stderr += d.toString();
      if (this.stderr.length > 200_000) this.stderr = this.stderr.slice(-100_000);
    });
    this.child.stdout!.on('data', (d) => {
      this.buf += d.toString();
      for (let i = this.buf.indexOf('\n'); i >= 0; i = this.buf.indexOf('\n')) {
        const line = this.buf.slice(0, i);
        this.buf = this.buf.slice(i + 1);
        let msg: Record<string, unknown>;
        try {
          msg = JSON.parse(line);
        } catch {
          throw new Error(`the companion wrote a line that is not JSON on stdout: ${line.slice(0, 200)}`);
        }
        if (msg.id !== undefined && msg.id !== null) this.waiting.get(msg.id as number)?.(msg);
      }
    });
    this.child.stdin!.on('error', () => undefined);
    this.child.once('exit', (code, signal) => {
      this.exited = { code, signal };
      for (const w of this.waiting.values())
        w({ error: { code: -1, message: `companion exited (${code ?? signal})` } });
    });
  }

  get alive(): boolean {
    return !this.exited;
  }

  /** Send one raw line (it may be anything); resolve with the reply to `id`, or 'timeout'. */
  rawRequest(id: number | string, line: string, timeoutMs: number): Promise<Record<string, unknown> | 'timeout'> {
    return new Promise((resolve) => {
      const t = setTimeout(() => {
        this.waiting.delete(id);
        resolve('timeout');
      }, timeoutMs);
      this.waiting.set(id, (m) => {
        clearTimeout(t);
        this.waiting.delete(id);
        resolve(m);
      });
      this.child.stdin!.write(line + '\n');
    });
  }

  /** Write a line that expects no answer (a notification, or garbage). */
  write(line: string): void {
    this.child.stdin!.write(line + '\n');
  }

  request(method: string, params: unknown, timeoutMs = 30_000): Promise<Record<string, unknown> | 'timeout'> {
    const id = this.nextId++;
    return this.rawRequest(id, JSON.stringify({ jsonrpc: '2.0', id, method, params }), timeoutMs);
  }

  async initialize(): Promise<void> {
    const r = await this.request(
      'initialize',
      { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'hostile-suite', version: '1' } },
      60_000,
    );
    if (r === 'timeout' || !r.result) throw new Error(`initialize failed: ${JSON.stringify(r)}\n${this.stderr}`);
    this.write(JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }));
  }

  /** tools/call; the raw `arguments` text lets a test put 1e999 or -0 into the JSON. */
  callRaw(name: string, argumentsJson: string, timeoutMs: number): Promise<Record<string, unknown> | 'timeout'> {
    const id = this.nextId++;
    return this.rawRequest(
      id,
      `{"jsonrpc":"2.0","id":${id},"method":"tools/call","params":{"name":${JSON.stringify(name)},"arguments":${argumentsJson}}}`,
      timeoutMs,
    );
  }

  async close(): Promise<void> {
    if (this.exited) return;
    const done = new Promise<void>((r) => this.child.once('exit', () => r()));
    this.child.stdin!.end();
    const t = setTimeout(() => this.child.kill('SIGKILL'), 8000);
    await done;
    clearTimeout(t);
  }
}

// ------------------------------------------------------------------ hostile values

export type Rng = () => number;

export function rng(seed: number): Rng {
  return mulberry32(seed);
}

export const pick = <T>(r: Rng, xs: readonly T[]): T => xs[Math.floor(r() * xs.length)];
export const int = (r: Rng, lo: number, hi: number): number => lo + Math.floor(r() * (hi - lo + 1));

export const PATHS = [
  '/etc/passwd',
  '/etc/shadow',
  '../../../../etc/passwd',
  'file:///etc/passwd',
  '~/.ssh/id_rsa',
  '~',
  '.',
  '..',
  './',
  '/',
  'C:\\Windows\\win.ini',
  '\\\\server\\share\\x',
  '/proc/self/environ',
  '/dev/zero',
  '/dev/urandom',
  'node_modules',
  'package.json',
  'http://127.0.0.1:1/',
  'https://localhost:1/x',
  'data:text/plain,hi',
  'javascript:alert(1)',
  '%2e%2e/%2e%2e/etc/passwd',
];

/** Random bytes as a latin1 string (each char one byte 0–255). */
export function randomLatin1(r: Rng, n: number): string {
  let s = '';
  for (let i = 0; i < n; i++) s += String.fromCharCode(int(r, 0, 255));
  return s;
}

/** A JSON text for a hostile scalar or structure (raw text: may hold 1e999, -1e999, -0). */
export function hostileJson(r: Rng, depth = 0): string {
  const k = int(r, 0, 21);
  switch (k) {
    case 0:
      return 'null';
    case 1:
      return pick(r, ['true', 'false']);
    case 2:
      return pick(r, ['1e999', '-1e999', '-0', '1e-400', '9007199254740993', '-9007199254740993', '1e308', '-1e308']);
    case 3:
      return String(pick(r, [-1, -(2 ** 31), 2 ** 31, 2 ** 32, 2 ** 53, 0.5, -0.5, 1e9, 1e15, 4096, 65536, 1e6]));
    case 4:
      return JSON.stringify('x'.repeat(pick(r, [0, 1, 1000, 100_000, 1_000_000])));
    case 5:
      return JSON.stringify(randomLatin1(r, int(r, 1, 64)));
    case 6:
      return JSON.stringify(pick(r, PATHS));
    case 7:
      return JSON.stringify(
        pick(r, [
          '',
          ' ',
          '\u0000',
          '\ud800',
          '\uffff',
          '<script>',
          '${x}',
          '__proto__',
          'constructor',
          '%s%s%s',
          '\u202e',
        ]),
      );
    case 8:
      return depth > 2 ? '[]' : `[${Array.from({ length: int(r, 0, 4) }, () => hostileJson(r, depth + 1)).join(',')}]`;
    case 9:
      return depth > 2
        ? '{}'
        : `{${Array.from({ length: int(r, 0, 3) }, () => `${JSON.stringify(pick(r, ['__proto__', 'constructor', 'a', '', 'x'.repeat(300)]))}:${hostileJson(r, depth + 1)}`).join(',')}}`;
    case 10:
      return `[${Array(pick(r, [1000, 100_000]))
        .fill('1')
        .join(',')}]`;
    case 11:
      return '['.repeat(5000) + ']'.repeat(5000);
    case 12:
      return JSON.stringify(int(r, -5, 5));
    case 13:
      return JSON.stringify(int(r, 0, 1_000_000));
    case 14:
      return `[${Array(int(r, 1, 5000))
        .fill('-1e999')
        .join(',')}]`;
    case 15:
      return '{"__proto__":{"polluted":true}}';
    case 16:
      return JSON.stringify(Array.from({ length: int(r, 1, 50) }, () => pick(r, PATHS)));
    case 17:
      return JSON.stringify(r() * 1e6 - 5e5);
    case 18:
      return JSON.stringify('a b c '.repeat(int(r, 1, 20000)));
    case 19:
      return JSON.stringify({
        hook: 'blocks.0.hook_resid_pre',
        op: pick(r, ['zero', 'add', 'nope']),
        value: [1e999],
        head: -1,
      });
    case 20:
      return JSON.stringify([int(r, -1, 1e6), int(r, -1, 1e6)]);
    default:
      return JSON.stringify(
        pick(r, ['default', 'stories260K', 'blocks.0.hook_resid_pre', 'blocks.99.attn.hook_z', 'owner/name', 'all']),
      );
  }
}

type Schema = Record<string, unknown>;

/** A plausible value for a schema (so that other fields can get past validation and reach the op). */
function plausible(r: Rng, s: Schema | undefined, depth: number): string {
  if (!s || depth > 4) return hostileJson(r, 2);
  if (Array.isArray(s.enum) && s.enum.length) return JSON.stringify(pick(r, s.enum));
  if ('const' in s) return JSON.stringify(s.const);
  const alts = (s.anyOf ?? s.oneOf) as Schema[] | undefined;
  if (alts?.length) return plausible(r, pick(r, alts), depth + 1);
  const type = Array.isArray(s.type) ? pick(r, s.type as string[]) : (s.type as string | undefined);
  const lo =
    typeof s.minimum === 'number' ? s.minimum : typeof s.exclusiveMinimum === 'number' ? s.exclusiveMinimum + 1e-6 : 0;
  const hi =
    typeof s.maximum === 'number'
      ? s.maximum
      : typeof s.exclusiveMaximum === 'number'
        ? s.exclusiveMaximum - 1e-6
        : lo + 8;
  switch (type) {
    case 'integer':
      return String(Math.round(lo + r() * Math.min(hi - lo, 8)));
    case 'number':
      return JSON.stringify(lo + r() * Math.min(hi - lo, 4));
    case 'boolean':
      return pick(r, ['true', 'false']);
    case 'string':
      return JSON.stringify(pick(r, ['Once upon a time', ' the', 'blocks.0.hook_resid_pre', 'a', 'default']));
    case 'array': {
      const n = Math.max(
        typeof s.minItems === 'number' ? s.minItems : 0,
        Math.min(int(r, 0, 3), typeof s.maxItems === 'number' ? s.maxItems : 3),
      );
      return `[${Array.from({ length: n }, () => plausible(r, s.items as Schema, depth + 1)).join(',')}]`;
    }
    case 'object':
      return argsFromSchema(r, s, depth + 1, 0.1);
    default:
      return hostileJson(r, 2);
  }
}

/**
 * Arguments for a tool from its JSON Schema: each known property plausible or hostile (wrong
 * type, NaN-ish/huge/negative number, huge string, path), plus sometimes unknown fields.
 */
export function argsFromSchema(r: Rng, schema: Schema, depth = 0, hostileRate = 0.35): string {
  const props = (schema.properties ?? {}) as Record<string, Schema>;
  const required = new Set((schema.required ?? []) as string[]);
  const parts: string[] = [];
  for (const [k, s] of Object.entries(props)) {
    if (!required.has(k) && r() < 0.4) continue;
    const v = r() < hostileRate ? hostileJson(r) : plausible(r, s, depth);
    parts.push(`${JSON.stringify(k)}:${v}`);
  }
  if (r() < 0.25)
    parts.push(
      `${JSON.stringify(pick(r, ['unknown_field', '__proto__', 'constructor', 'path', 'file', 'sae_source', 'x'.repeat(1000)]))}:${hostileJson(r)}`,
    );
  return `{${parts.join(',')}}`;
}
