/**
 * The model's own tokenizer.json through @huggingface/tokenizers (no network). TransformerLens
 * semantics: encode without the tokenizer's special tokens, then prepend BOS when asked.
 */
import { Tokenizer } from '@huggingface/tokenizers';
import { CAPS } from './caps';
import { LoupeError } from './errors';
import { renderChat } from './chat';

/** The quantifier at src[i]: its length (0 when none) and whether it repeats without a small bound. */
function quantifierAt(src: string, i: number): { len: number; unbounded: boolean } {
  const c = src[i];
  let len = 0,
    unbounded = false;
  if (c === '*' || c === '+') [len, unbounded] = [1, true];
  else if (c === '?') len = 1;
  else if (c === '{') {
    const m = /^\{(\d*)(,(\d*))?\}/.exec(src.slice(i, i + 32));
    if (!m) return { len: 0, unbounded: false };
    len = m[0].length;
    const lo = Number(m[1] || 0);
    unbounded = m[2] !== undefined && (m[3] === '' || Number(m[3]) - lo > 16);
  }
  if (len > 0 && (src[i + len] === '?' || src[i + len] === '+')) len++; // lazy or possessive
  return { len, unbounded };
}

/**
 * Why a regex's backtracking can be exponential in the text's length, or undefined: it repeats
 * without bound a group that itself repeats without bound — (a+)+, (?:\s*)*, ([^\d]+)+\d — or a
 * group of alternatives — (x|x)*y. A failing match of 30 characters then never ends. No tokenizer
 * the Hub ships has either (their patterns repeat character classes, and alternate at the top).
 */
export function backtrackingRisk(src: string): string | undefined {
  // per open group: does it hold an unbounded repetition, an alternation?
  const stack: { holds: boolean; alt: boolean }[] = [{ holds: false, alt: false }];
  for (let i = 0; i < src.length;) {
    const c = src[i];
    let closed: { holds: boolean; alt: boolean } | undefined;
    if (c === '\\') {
      i += 2;
      if ('pPuk'.includes(src[i - 1]) && src[i] === '{') i = Math.max(i, src.indexOf('}', i) + 1);
      else if (src[i - 1] === 'u' || src[i - 1] === 'x') while (/[0-9a-fA-F]/.test(src[i] ?? '')) i++;
    } else if (c === '[') {
      for (i++; i < src.length && src[i] !== ']'; i++) if (src[i] === '\\') i++;
      i++;
    } else if (c === '(') {
      stack.push({ holds: false, alt: false });
      i++;
      if (src[i] === '?') {
        i++;
        if (src[i] === '<' && src[i + 1] !== '=' && src[i + 1] !== '!') {
          const end = src.indexOf('>', i); // (?<name>
          i = end < 0 ? src.length : end + 1;
        } else if (src[i] === '<') i += 2;
        else if (/[:=!>]/.test(src[i])) i++;
        else {
          while (i < src.length && /[a-zA-Z-]/.test(src[i])) i++; // (?i:  inline flags
          if (src[i] === ':') i++;
        }
      }
      continue;
    } else if (c === ')') {
      closed = stack.length > 1 ? stack.pop()! : undefined;
      i++;
    } else if (c === '|') {
      stack[stack.length - 1].alt = true;
      i++;
      continue;
    } else if (c === '^' || c === '$') {
      i++;
      continue;
    } else i++;
    const q = quantifierAt(src, i);
    if (q.unbounded && closed?.holds) return 'it repeats a group that itself repeats without bound';
    if (q.unbounded && closed?.alt) return 'it repeats a group of alternatives without bound';
    if (q.unbounded || closed?.holds) stack[stack.length - 1].holds = true;
    i += q.len;
  }
  return undefined;
}

/** Every regex in a tokenizer.json (normalizers, pre-tokenizers, decoders: `{"Regex": "…"}`), checked when it is loaded. */
export function checkTokenizerPatterns(json: unknown, where = 'tokenizer.json'): void {
  const seen: unknown[] = [json];
  for (let n = 0; n < seen.length; n++) {
    const v = seen[n];
    if (!v || typeof v !== 'object') continue;
    if (Array.isArray(v)) {
      // the vocabulary and merges are long lists of strings and pairs: nothing to look at
      if (v.length > 0 && typeof v[0] !== 'object') continue;
      for (const x of v) if (x && typeof x === 'object') seen.push(x);
      continue;
    }
    for (const [k, x] of Object.entries(v as Record<string, unknown>)) {
      if (k === 'vocab' || k === 'merges') continue;
      if (k === 'Regex' && typeof x === 'string') {
        if (x.length > CAPS.maxTokenizerRegexChars)
          throw new LoupeError(
            'UNSUPPORTED_CONFIG',
            `${where}: a pattern has ${x.length} characters, more than the limit of ${CAPS.maxTokenizerRegexChars} (maxTokenizerRegexChars).`,
            "The model's tokenizer.json is damaged or hostile.",
          );
        const risk = backtrackingRisk(x);
        if (risk)
          throw new LoupeError(
            'UNSUPPORTED_CONFIG',
            `${where}: the pattern ${JSON.stringify(x.slice(0, 80))} is refused: ${risk}, so matching it can take exponential time.`,
            "The model's tokenizer.json is damaged or hostile; no tokenizer the Hub ships has such a pattern.",
            { pattern: x.slice(0, 200) },
          );
      } else if (x && typeof x === 'object') seen.push(x);
    }
  }
}

export class ModelTokenizer {
  private readonly tok: Tokenizer;
  readonly bosTokenId: number | undefined;
  readonly eosTokenId: number | undefined;

  constructor(
    tokenizerJson: Record<string, unknown>,
    private readonly tokenizerConfig: Record<string, unknown> | null,
    config: Record<string, any>,
  ) {
    checkTokenizerPatterns(tokenizerJson);
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
    const ids = this.wordIds(text);
    return ids.length === 1 ? ids[0] : undefined;
  }

  private prefix: boolean | undefined;
  /**
   * whether encoding adds the word-start marker itself (SentencePiece's dummy prefix: "sad" →
   * ["▁sa", "d"]), so that a leading space of the text would become a second marker
   */
  private addsPrefixSpace(): boolean {
    if (this.prefix === undefined) {
      const ids = this.tok.encode('a', { add_special_tokens: false }).ids;
      const piece = ids.length ? (this.tok.id_to_token(ids[0]) ?? '') : '';
      this.prefix = piece.startsWith('▁');
    }
    return this.prefix;
  }

  /**
   * Ids of text as a word of running text: " sad" as it tokenizes after another word. Encoding
   * " sad" alone on a tokenizer that adds a dummy prefix gives ["▁", "▁sa", "d"] (two markers);
   * the word in running text is ["▁sa", "d"], which is what encoding "sad" gives there.
   */
  wordIds(text: string): number[] {
    const t = text.startsWith(' ') && this.addsPrefixSpace() ? text.slice(1) : text;
    return t ? this.tok.encode(t, { add_special_tokens: false }).ids : [];
  }
}
