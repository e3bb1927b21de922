/**
 * Chat format: an instruct checkpoint's prompt rendered through the model's own `chat_template`
 * (tokenizer_config.json) with @huggingface/jinja, as transformers' apply_chat_template does with
 * one user message and add_generation_prompt. The one place a chat prompt is rendered; the
 * operation template (ops/types.ts) calls it for every operation that takes a prompt.
 *
 * BOS rule: a rendered chat template carries the BOS text itself where the model wants it (most
 * write `{{ bos_token }}` first), and the tokenizer maps that text to the BOS id. So a chat prompt
 * is tokenized WITHOUT prepending BOS (prepend_bos is forced false), or BOS would appear twice.
 *
 * A template is a program from the model's repository: it renders with bounds (caps.ts) on its
 * size, the work it does (steps, a deadline), the length of every string and list it builds, and the
 * integers it passes to a call or filter (range(1e8), indent(1e9) allocate before any step), so a
 * hostile one fails as BAD_CHAT_TEMPLATE instead of running forever or exhausting memory.
 */
import { Environment, Interpreter, Template } from '@huggingface/jinja';
import { CAPS } from './caps';
import { LoupeError } from './errors';

/** the template text in tokenizer_config.json: a string, or a list of named templates ('default' used) */
export function chatTemplateOf(tokenizerConfig: Record<string, unknown> | null): string | undefined {
  const t = tokenizerConfig?.chat_template;
  if (typeof t === 'string' && t.length > 0) return t;
  if (Array.isArray(t)) {
    const named = t.find((x) => x && typeof x === 'object' && (x as { name?: unknown }).name === 'default') as
      { template?: unknown } | undefined;
    if (named && typeof named.template === 'string') return named.template;
  }
  return undefined;
}

const specialText = (v: unknown): string =>
  typeof v === 'string'
    ? v
    : v && typeof v === 'object' && 'content' in v
      ? String((v as { content: unknown }).content)
      : '';

class TemplateLimit extends Error {}

const over = (what: string, limit: number) =>
  new TemplateLimit(`it ${what}, more than the limit of ${limit.toLocaleString('en-US')}`);

/**
 * @huggingface/jinja's interpreter, charging the work a rendering does to one budget of
 * maxTemplateSteps: every evaluation, every block (so every loop iteration, an empty body
 * included), one step per KiB (or 1,024 items) of every string or list an evaluation returns or
 * a block outputs, one per item a loop walks and one per
 * item range() builds (so nested loops are charged the product of their ranges). It stops at
 * templateDeadlineS too, checked at every charge: a filter's one step can sort a million items.
 */
class BoundedInterpreter extends Interpreter {
  private steps = 0;
  private readonly deadline = Date.now() + CAPS.templateDeadlineS * 1000;
  /** the iterable expressions of the loops met so far, whose values are charged per item */
  readonly loopSources = new Set<unknown>();

  charge(n: number): void {
    this.steps += n;
    if (this.steps > CAPS.maxTemplateSteps) throw over('takes more steps', CAPS.maxTemplateSteps);
    if (Date.now() > this.deadline)
      throw new TemplateLimit(`it ran past the deadline of ${CAPS.templateDeadlineS} s (templateDeadlineS)`);
  }

  override evaluate(...args: Parameters<Interpreter['evaluate']>): ReturnType<Interpreter['evaluate']> {
    this.charge(1);
    const v = super.evaluate(...args);
    const x = (v as { value?: unknown }).value;
    if ((typeof x === 'string' || Array.isArray(x)) && x.length > CAPS.maxTemplateOutputChars)
      throw over(
        `builds a ${typeof x === 'string' ? 'string' : 'list'} of ${x.length.toLocaleString('en-US')}`,
        CAPS.maxTemplateOutputChars,
      );
    if (typeof x === 'string' || Array.isArray(x)) this.charge(Math.floor(x.length / 1024));
    if (this.loopSources.has(args[0])) this.charge(Array.isArray(x) ? x.length : x instanceof Map ? x.size : 0);
    return v;
  }
}

// The interpreter's own methods, wrapped (they are private in its types): a block, and a loop's
// iterable, charged as above; a call's or filter's integer arguments past the output cap refused,
// as a count or width past it can only allocate past it.
type Method = (this: BoundedInterpreter, ...a: unknown[]) => unknown;
const own = Interpreter.prototype as unknown as Record<'evaluateBlock' | 'evaluateFor' | 'evaluateArguments', Method>;
const proto = BoundedInterpreter.prototype as unknown as typeof own;
proto.evaluateBlock = function (...a) {
  this.charge(1);
  const v = own.evaluateBlock.apply(this, a) as { value: string };
  this.charge(Math.floor(v.value.length / 1024));
  return v;
};
proto.evaluateFor = function (...a) {
  const it = (a[0] as { iterable: { type: string; lhs?: unknown } }).iterable;
  this.loopSources.add(it.type === 'SelectExpression' ? it.lhs : it);
  return own.evaluateFor.apply(this, a);
};
proto.evaluateArguments = function (...a) {
  const r = own.evaluateArguments.apply(this, a) as [{ value: unknown }[], Map<string, { value: unknown }>];
  for (const v of [...r[0], ...r[1].values()])
    if (typeof v.value === 'number' && Math.abs(v.value) > CAPS.maxTemplateOutputChars)
      throw over(`passes ${v.value} to a call`, CAPS.maxTemplateOutputChars);
  return r;
};

/** Python's range, refusing more items than a rendering may build; the items are charged as steps. */
function boundedRange(charge: (n: number) => void, start: number, stop?: number, step = 1): number[] {
  if (stop === undefined) [start, stop] = [0, start];
  if (step === 0) throw new Error('range() step must not be zero');
  const n = Math.max(0, Math.ceil((stop - start) / step));
  if (!(n <= CAPS.maxTemplateOutputChars)) throw over(`asks range() for ${n} items`, CAPS.maxTemplateOutputChars);
  charge(n);
  return Array.from({ length: n }, (_, i) => start + i * step);
}

/** The subset of Python's strftime that @huggingface/jinja's strftime_now offers (its own is not exported). */
function strftimeNow(format: string): string {
  const d = new Date();
  const pad2 = (n: number) => String(n).padStart(2, '0');
  return String(format).replace(/%[YmdbBHM%]/g, (t) => {
    switch (t) {
      case '%Y':
        return String(d.getFullYear());
      case '%m':
        return pad2(d.getMonth() + 1);
      case '%d':
        return pad2(d.getDate());
      case '%b':
        return new Intl.DateTimeFormat(undefined, { month: 'short' }).format(d);
      case '%B':
        return new Intl.DateTimeFormat(undefined, { month: 'long' }).format(d);
      case '%H':
        return pad2(d.getHours());
      case '%M':
        return pad2(d.getMinutes());
      default:
        return '%';
    }
  });
}

/** Template.render with the bounded interpreter; the globals are @huggingface/jinja's setupGlobals, range bounded. */
function renderBounded(source: string, items: Record<string, unknown>): string {
  const env = new Environment();
  const globals: Record<string, unknown> = {
    false: false,
    true: true,
    none: null,
    raise_exception: (msg: string) => {
      throw new Error(msg);
    },
    range: (start: number, stop?: number, step?: number) =>
      boundedRange((n) => interpreter.charge(n), start, stop, step),
    strftime_now: strftimeNow,
    True: true,
    False: false,
    None: null,
  };
  for (const [k, v] of Object.entries({ ...globals, ...items })) env.set(k, v);
  const interpreter = new BoundedInterpreter(env);
  const out = interpreter.run(new Template(source).parsed) as { value: unknown };
  return String(out.value);
}

/**
 * Render one user message through the model's chat template (with the generation prompt, so the
 * next token is the assistant's). NO_CHAT_TEMPLATE when the model has none; BAD_CHAT_TEMPLATE when
 * the template does not parse or raises.
 */
export function renderChat(tokenizerConfig: Record<string, unknown> | null, userText: string): string {
  const source = chatTemplateOf(tokenizerConfig);
  if (source === undefined) {
    throw new LoupeError(
      'NO_CHAT_TEMPLATE',
      'This model has no chat_template in its tokenizer_config.json, so the prompt cannot be put in chat format.',
      'Run without chat format (the prompt is used as written), or use an instruct checkpoint whose tokenizer_config.json has a chat_template.',
    );
  }
  if (source.length > CAPS.maxTemplateChars)
    throw new LoupeError(
      'BAD_CHAT_TEMPLATE',
      `The model's chat_template has ${source.length.toLocaleString('en-US')} characters, ` +
        `more than the limit of ${CAPS.maxTemplateChars.toLocaleString('en-US')} (maxTemplateChars).`,
      'Run without chat format, or fix chat_template in tokenizer_config.json.',
    );
  try {
    return renderBounded(source, {
      messages: [{ role: 'user', content: userText }],
      add_generation_prompt: true,
      bos_token: specialText(tokenizerConfig?.bos_token),
      eos_token: specialText(tokenizerConfig?.eos_token),
      unk_token: specialText(tokenizerConfig?.unk_token),
      pad_token: specialText(tokenizerConfig?.pad_token),
    });
  } catch (e) {
    throw new LoupeError(
      'BAD_CHAT_TEMPLATE',
      `The model's chat_template could not be rendered: ${e instanceof TemplateLimit ? 'it was stopped: ' : ''}${(e as Error).message}`,
      'Run without chat format, or fix chat_template in tokenizer_config.json.',
    );
  }
}
