/**
 * Chat format: an instruct checkpoint's prompt rendered through the model's own `chat_template`
 * (tokenizer_config.json) with @huggingface/jinja, as transformers' apply_chat_template does with
 * one user message and add_generation_prompt. The one place a chat prompt is rendered; the
 * operation template (ops/types.ts) calls it for every operation that takes a prompt.
 *
 * BOS rule: a rendered chat template carries the BOS text itself where the model wants it (most
 * write `{{ bos_token }}` first), and the tokenizer maps that text to the BOS id. So a chat prompt
 * is tokenized WITHOUT prepending BOS (prepend_bos is forced false), or BOS would appear twice.
 */
import { Template } from '@huggingface/jinja';
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
  try {
    return new Template(source).render({
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
      `The model's chat_template could not be rendered: ${(e as Error).message}`,
      'Run without chat format, or fix chat_template in tokenizer_config.json.',
    );
  }
}
