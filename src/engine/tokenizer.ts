/**
 * The model's own tokenizer.json through @huggingface/tokenizers (no network). TransformerLens
 * semantics: encode without the tokenizer's special tokens, then prepend BOS when asked.
 */
import { Tokenizer } from '@huggingface/tokenizers';
import { LoupeError } from './errors';
import { renderChat } from './chat';

export class ModelTokenizer {
  private readonly tok: Tokenizer;
  readonly bosTokenId: number | undefined;
  readonly eosTokenId: number | undefined;

  constructor(
    tokenizerJson: Record<string, unknown>,
    private readonly tokenizerConfig: Record<string, unknown> | null,
    config: Record<string, any>,
  ) {
    try {
      this.tok = new Tokenizer(tokenizerJson, tokenizerConfig ?? {});
    } catch (e) {
      throw new LoupeError(
        'MISSING_TOKENIZER',
        `tokenizer.json could not be loaded: ${(e as Error).message}`,
        "The model's tokenizer.json is not a Hugging Face tokenizers file this library understands.",
      );
    }
    const special = (v: unknown) =>
      typeof v === 'string' ? v : v && typeof v === 'object' && 'content' in v ? String((v as any).content) : undefined;
    const idOf = (v: unknown) => {
      const s = special(v);
      return s !== undefined ? this.tok.token_to_id(s) : undefined;
    };
    const first = (v: unknown) => (Array.isArray(v) ? v[0] : v);
    this.bosTokenId =
      idOf(tokenizerConfig?.bos_token) ?? (typeof config.bos_token_id === 'number' ? config.bos_token_id : undefined);
    this.eosTokenId =
      idOf(tokenizerConfig?.eos_token) ??
      (typeof first(config.eos_token_id) === 'number' ? first(config.eos_token_id) : undefined);
  }

  encode(text: string, prependBos = true): number[] {
    const ids = this.tok.encode(text, { add_special_tokens: false }).ids;
    return prependBos && this.bosTokenId !== undefined ? [this.bosTokenId, ...ids] : ids;
  }

  /** a user message in the model's chat format (engine/chat.ts; tokenize the result without prepending BOS) */
  chatPrompt(text: string): string {
    return renderChat(this.tokenizerConfig, text);
  }

  decode(ids: number[]): string {
    return this.tok.decode(ids, { skip_special_tokens: false });
  }

  /** Display text of each token: decoded alone, with the word-start marker shown as a space. */
  tokenStrings(ids: number[]): string[] {
    return ids.map((id) => {
      const piece = this.tok.id_to_token(id) ?? '';
      let text = this.tok.decode([id], { skip_special_tokens: false });
      if ((piece.startsWith('▁') || piece.startsWith('Ġ')) && !text.startsWith(' ')) text = ' ' + text;
      return text;
    });
  }

  /** id of a string that is exactly one token, trying the word-start markers for a leading space */
  tokenId(text: string): number | undefined {
    const direct = this.tok.token_to_id(text);
    if (direct !== undefined) return direct;
    if (text.startsWith(' ')) {
      for (const marker of ['▁', 'Ġ']) {
        const id = this.tok.token_to_id(marker + text.slice(1));
        if (id !== undefined) return id;
      }
    }
    const ids = this.tok.encode(text, { add_special_tokens: false }).ids;
    return ids.length === 1 ? ids[0] : undefined;
  }
}
