// Small tokenizer.json / tokenizer_config.json generators for the random test models.
// Two kinds, both BPE models that @huggingface/tokenizers (and HF tokenizers) load:
//  - 'bytelevel': GPT-2 style, the 256 byte symbols of GPT-2's bytes-to-unicode table as ids
//    0..255 (id = byte value), then the special tokens, then merge tokens for common words.
//  - 'char': SentencePiece/Llama style ('▁' for spaces, Prepend + Replace normalizers), the
//    special tokens first, then single characters, then merge tokens; unknown chars → unk.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

export type TokenizerKind = 'bytelevel' | 'char';

export interface TokenizerSpec {
  kind: TokenizerKind;
  specials: string[];
  bos: string;
  eos: string;
  unk?: string;
  pad?: string;
  /** prepend BOS in the post-processor (Llama / Gemma style) */
  addBos: boolean;
  tokenizerClass: string;
  modelMaxLength: number;
  /** words to merge into single tokens before the built-in list (byte-level: also with a leading space) */
  words?: string[];
}

export interface GeneratedTokenizer {
  tokenizerJson: Record<string, any>;
  tokenizerConfig: Record<string, any>;
  specialTokensMap: Record<string, any>;
  /** token string → id of each special token */
  specialIds: Record<string, number>;
  vocab: Record<string, number>;
}

const WORDS = [
  'the',
  'cat',
  'sat',
  'on',
  'mat',
  'once',
  'upon',
  'a',
  'time',
  'there',
  'was',
  'little',
  'dog',
  'and',
  'she',
  'he',
  'it',
  'in',
  'to',
  'of',
  'is',
  'big',
  'red',
  'ball',
  'play',
  'day',
  'happy',
  'tree',
  'bird',
  'sun',
  'girl',
  'boy',
  'said',
  'went',
  'saw',
  'with',
  'her',
  'his',
  'they',
  'you',
];

export function bytesToUnicode(): string[] {
  const bs: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++)
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n);
      n++;
    }
  const table: string[] = new Array(256);
  for (let i = 0; i < bs.length; i++) table[bs[i]] = String.fromCharCode(cs[i]);
  return table;
}

/** Add prefix merges for words (as symbol arrays) until the vocab holds `size` entries. */
function addMerges(vocab: Record<string, number>, merges: string[], words: string[][], size: number) {
  let next = Object.keys(vocab).length;
  const tryWord = (syms: string[]) => {
    if (!syms.every((s) => s in vocab)) return;
    let cur = syms[0];
    for (let i = 1; i < syms.length && next < size; i++) {
      const merged = cur + syms[i];
      if (!(merged in vocab)) {
        merges.push(`${cur} ${syms[i]}`);
        vocab[merged] = next++;
      }
      cur = merged;
    }
  };
  for (const w of words) {
    if (next >= size) return;
    tryWord(w);
  }
  // still room: two-letter pairs
  const letters = 'etaoinshrdlucmfwypvbgkjqxz';
  for (const a of letters)
    for (const b of letters) {
      if (next >= size) return;
      tryWord([a, b]);
    }
  if (next < size) throw new Error(`tokenizer: could not fill a vocab of ${size}`);
}

function addedTokens(specialIds: Record<string, number>) {
  return Object.entries(specialIds)
    .sort((a, b) => a[1] - b[1])
    .map(([content, id]) => ({
      id,
      content,
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: false,
      special: true,
    }));
}

export function makeTokenizer(spec: TokenizerSpec, vocabSize: number): GeneratedTokenizer {
  const vocab: Record<string, number> = {};
  const merges: string[] = [];
  const specialIds: Record<string, number> = {};
  let tokenizerJson: Record<string, any>;

  const templateWithBos = (bos: string, bosId: number) => ({
    type: 'TemplateProcessing',
    single: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
    pair: [
      { SpecialToken: { id: bos, type_id: 0 } },
      { Sequence: { id: 'A', type_id: 0 } },
      { SpecialToken: { id: bos, type_id: 1 } },
      { Sequence: { id: 'B', type_id: 1 } },
    ],
    special_tokens: { [bos]: { id: bos, ids: [bosId], tokens: [bos] } },
  });

  if (spec.kind === 'bytelevel') {
    if (vocabSize < 256 + spec.specials.length)
      throw new Error(`bytelevel tokenizer needs vocab ≥ ${256 + spec.specials.length}`);
    const table = bytesToUnicode();
    for (let b = 0; b < 256; b++) vocab[table[b]] = b;
    spec.specials.forEach((s, i) => {
      vocab[s] = 256 + i;
      specialIds[s] = 256 + i;
    });
    const space = table[0x20]; // 'Ġ'
    const words = [...(spec.words ?? []), ...WORDS].flatMap((w) => [[space, ...w], [...w]]);
    addMerges(vocab, merges, words, vocabSize);
    tokenizerJson = {
      version: '1.0',
      truncation: null,
      padding: null,
      added_tokens: addedTokens(specialIds),
      normalizer: null,
      pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
      post_processor: spec.addBos
        ? templateWithBos(spec.bos, specialIds[spec.bos])
        : { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
      decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
      model: {
        type: 'BPE',
        dropout: null,
        unk_token: null,
        continuing_subword_prefix: '',
        end_of_word_suffix: '',
        fuse_unk: false,
        byte_fallback: false,
        ignore_merges: false,
        vocab,
        merges,
      },
    };
  } else {
    spec.specials.forEach((s, i) => {
      vocab[s] = i;
      specialIds[s] = i;
    });
    const chars = ['▁', ...'abcdefghijklmnopqrstuvwxyz', ...".,!?'", ...'0123456789'];
    // capitals only when that still leaves room for ≥ 20 word-piece merges
    if (vocabSize >= spec.specials.length + chars.length + 26 + 20) chars.push(...'ABCDEFGHIJKLMNOPQRSTUVWXYZ');
    for (const ch of chars) {
      if (Object.keys(vocab).length >= vocabSize) break;
      vocab[ch] = Object.keys(vocab).length;
    }
    const words = [...(spec.words ?? []), ...WORDS].map((w) => ['▁', ...w]);
    addMerges(vocab, merges, words, vocabSize);
    tokenizerJson = {
      version: '1.0',
      truncation: null,
      padding: null,
      added_tokens: addedTokens(specialIds),
      normalizer: {
        type: 'Sequence',
        normalizers: [
          { type: 'Prepend', prepend: '▁' },
          { type: 'Replace', pattern: { String: ' ' }, content: '▁' },
        ],
      },
      pre_tokenizer: null,
      post_processor: spec.addBos ? templateWithBos(spec.bos, specialIds[spec.bos]) : null,
      decoder: {
        type: 'Sequence',
        decoders: [
          { type: 'Replace', pattern: { String: '▁' }, content: ' ' },
          { type: 'Fuse' },
          { type: 'Strip', content: ' ', start: 1, stop: 0 },
        ],
      },
      model: {
        type: 'BPE',
        dropout: null,
        unk_token: spec.unk ?? null,
        continuing_subword_prefix: null,
        end_of_word_suffix: null,
        fuse_unk: true,
        byte_fallback: false,
        ignore_merges: false,
        vocab,
        merges,
      },
    };
  }
  if (Object.keys(vocab).length !== vocabSize)
    throw new Error(`tokenizer: built ${Object.keys(vocab).length} tokens, wanted ${vocabSize}`);

  const decoderEntries: Record<string, any> = {};
  for (const t of addedTokens(specialIds)) {
    const { id, ...rest } = t;
    decoderEntries[String(id)] = rest;
  }
  const tokenizerConfig: Record<string, any> = {
    add_bos_token: spec.addBos,
    add_eos_token: false,
    added_tokens_decoder: decoderEntries,
    bos_token: spec.bos,
    eos_token: spec.eos,
    unk_token: spec.unk ?? null,
    pad_token: spec.pad ?? null,
    clean_up_tokenization_spaces: false,
    model_max_length: spec.modelMaxLength,
    tokenizer_class: spec.tokenizerClass,
  };
  const specialTokensMap: Record<string, any> = { bos_token: spec.bos, eos_token: spec.eos };
  if (spec.unk) specialTokensMap.unk_token = spec.unk;
  if (spec.pad) specialTokensMap.pad_token = spec.pad;
  return { tokenizerJson, tokenizerConfig, specialTokensMap, specialIds, vocab };
}

/** A generated tokenizer's three files, written into a checkpoint folder as HF saves them. */
export function writeTokenizerFiles(dir: string, tok: GeneratedTokenizer): void {
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tok.tokenizerJson, null, 2));
  writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify(tok.tokenizerConfig, null, 2));
  writeFileSync(join(dir, 'special_tokens_map.json'), JSON.stringify(tok.specialTokensMap, null, 2));
}
