import { describe, it, expect } from 'vitest';
import { deflateSync } from 'fflate';
import {
  encodeShare,
  decodeShare,
  shareUrl,
  parseFragment,
  formatFragment,
  MAX_JSON_BYTES,
  type ShareState,
} from '../src/share/codec';
import { toBase64Url, fromBase64Url } from '../src/share/base64url';
import { LoupeError } from '../src/engine/errors';

const state: ShareState = {
  v: 1,
  model: { kind: 'hub', id: 'owner/model', revision: 'abc123', endpoint: 'http://127.0.0.1:9999' },
  op: 'trace',
  input: { prompt: 'Once upon a time, ünïcödé ✓ "quoted" & #hash', top_k: 5, convention: 'raw' },
  result: { operation: 'trace', top_heads: [{ layer: 0, head: 1, logit_attribution: -0.123456789 }] },
};

describe('base64url', () => {
  it('round-trips every length and byte value', () => {
    for (let n = 0; n < 70; n++) {
      const b = new Uint8Array(n).map((_, i) => (i * 37 + n * 11) & 255);
      const s = toBase64Url(b);
      expect(s).toMatch(/^[A-Za-z0-9_-]*$/);
      expect(Array.from(fromBase64Url(s))).toEqual(Array.from(b));
    }
    expect(toBase64Url(new Uint8Array([251, 255]))).toBe('-_8');
  });
  it('rejects characters outside the alphabet and impossible lengths', () => {
    expect(() => fromBase64Url('ab+c')).toThrow();
    expect(() => fromBase64Url('abcde')).toThrow();
  });
});

describe('share codec', () => {
  it('round-trips a state with its result, exactly', () => {
    const { text, embedded } = encodeShare(state);
    expect(embedded).toBe(true);
    expect(decodeShare(text)).toEqual(state);
  });

  it('never carries a token or other stray fields', () => {
    const withToken = { ...state, model: { ...state.model, token: 'hf_secret' }, extra: 1 } as unknown as ShareState;
    const { text } = encodeShare(withToken);
    const back = decodeShare(text) as unknown as Record<string, any>;
    expect(JSON.stringify(back)).not.toContain('hf_secret');
    expect(back.extra).toBeUndefined();
  });

  it('drops a result that would make the link too long, and says so', () => {
    const big = { ...state, result: { data: Array.from({ length: 20000 }, (_, i) => Math.sin(i) * 1e3) } };
    const { text, embedded } = encodeShare(big, { maxChars: 4000 });
    expect(embedded).toBe(false);
    expect(text.length).toBeLessThan(4000);
    const back = decodeShare(text);
    expect(back.result).toBeUndefined();
    expect(back.result_omitted).toBe(true);
    expect(back.input).toEqual(state.input);
  });

  it('builds a link that parses back from its fragment, keeping the page path', () => {
    const { url } = shareUrl('http://127.0.0.1:5178/?x=1#pair=tok', state);
    expect(url.startsWith('http://127.0.0.1:5178/?x=1#s=')).toBe(true);
    expect(url).not.toContain('pair=');
    const frag = parseFragment(new URL(url).hash);
    expect(decodeShare(frag.get('s')!)).toEqual(state);
  });

  it('reads fragments with several parameters and writes them back', () => {
    const f = parseFragment('#pair=abc%2Fdef&s=XYZ_-&bad=%E0%A4%A');
    expect(f.get('pair')).toBe('abc/def');
    expect(f.get('s')).toBe('XYZ_-');
    expect(f.has('bad')).toBe(false);
    expect(parseFragment(formatFragment(f))).toEqual(f);
  });

  const enc = (o: unknown) => toBase64Url(deflateSync(new TextEncoder().encode(JSON.stringify(o))));
  it.each([
    ['garbage text', '!!!not-base64'],
    ['base64 that is not deflate', toBase64Url(new TextEncoder().encode('hello world'))],
    ['deflate that is not JSON', toBase64Url(deflateSync(new TextEncoder().encode('{oops')))],
    ['wrong version', enc({ ...state, v: 2 })],
    ['no model', enc({ ...state, model: undefined })],
    ['bad model kind', enc({ ...state, model: { ...state.model, kind: 'ftp' } })],
    ['javascript: endpoint', enc({ ...state, model: { ...state.model, endpoint: 'javascript:alert(1)' } })],
    ['bad op name', enc({ ...state, op: '../x' })],
    ['no input', enc({ ...state, input: 'x' })],
  ])('rejects %s with a BAD_INPUT LoupeError', (_name, text) => {
    let err: unknown;
    try {
      decodeShare(text);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(LoupeError);
    expect((err as LoupeError).code).toBe('BAD_INPUT');
    expect((err as LoupeError).hint).toBeTruthy();
  });

  it('refuses a decompression bomb instead of inflating it', () => {
    const bomb = toBase64Url(deflateSync(new Uint8Array(MAX_JSON_BYTES + 1024).fill(32)));
    expect(bomb.length).toBeLessThan(100_000);
    expect(() => decodeShare(bomb)).toThrow(/too large/);
  });
});
