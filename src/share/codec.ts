/**
 * Share links: the model (id + revision, never a token), the prompt(s), the operation and its
 * parameters — plus the result when it is small — packed into the URL fragment as
 * `#s=<base64url(deflate(JSON))>`. The fragment never reaches a server, and it can sit beside the
 * bridge's `#pair=` token (`#pair=…&s=…`).
 */
import { deflateSync, strToU8, strFromU8 } from 'fflate';
import { inflateCapped } from '../engine/inflate';
import { CAPS } from '../engine/caps';
import { LoupeError } from '../engine/errors';
import { toBase64Url, fromBase64Url } from './base64url';

export const SHARE_VERSION = 1;
/** a link longer than this is refused on decode (a guard against hostile links) */
export const MAX_LINK_CHARS = CAPS.maxLinkChars;
/** inflated JSON larger than this is refused (a guard against decompression bombs) */
export const MAX_JSON_BYTES = CAPS.maxLinkJsonBytes;
/** embed the result only while the whole encoded state stays under this many characters */
export const DEFAULT_MAX_EMBED_CHARS = 24_000;

export interface ShareModel {
  /** 'bundled' for the model shipped with the page, 'hub' for a Hub id, 'url' for a base URL */
  kind: 'bundled' | 'hub' | 'url';
  id: string;
  revision: string;
  /** the commit `revision` resolved to when the result was made: a link re-runs these weights even after the branch moves */
  commit?: string;
  /** Hub endpoint when it is not the public Hub (e.g. a mirror) */
  endpoint?: string;
}

export interface ShareState {
  v: typeof SHARE_VERSION;
  model: ShareModel;
  /** operation name, e.g. 'trace' */
  op: string;
  /** the operation's input document exactly as it was run (prompts included) */
  input: Record<string, unknown>;
  /** the result document, when small enough to embed */
  result?: unknown;
  /** true when a result existed but was too large to embed */
  result_omitted?: boolean;
  /** what the person marked in the result's view (an attribution graph's pins and supernodes), kept even when the result is not embedded */
  view?: ShareView;
}

export interface ShareView {
  pinned: string[];
  /** [name, ...node ids], as the graph JSON's qParams writes them */
  supernodes: string[][];
}

const isIdList = (x: unknown, max: number): x is string[] =>
  Array.isArray(x) && x.length <= max && x.every((s) => typeof s === 'string' && s.length <= 200);

/** a view state from a link, or undefined when it is not one (a link never fails on it) */
function cleanView(v: unknown): ShareView | undefined {
  if (!v || typeof v !== 'object') return undefined;
  const { pinned, supernodes } = v as Record<string, unknown>;
  if (!isIdList(pinned, 4096) || !Array.isArray(supernodes) || supernodes.length > 256) return undefined;
  if (!supernodes.every((g) => isIdList(g, 4097) && g.length >= 1)) return undefined;
  return { pinned: [...pinned], supernodes: supernodes.map((g) => [...g]) };
}

function deflate(json: string): string {
  return toBase64Url(deflateSync(strToU8(json), { level: 9 }));
}

/** Keep only the fields a link may carry; this is where a stray token would be dropped. */
function clean(state: ShareState): ShareState {
  const m = state.model;
  const model: ShareModel = { kind: m.kind, id: m.id, revision: m.revision };
  if (typeof m.commit === 'string' && /^[0-9a-f]{40}$/.test(m.commit)) model.commit = m.commit;
  if (m.endpoint) model.endpoint = m.endpoint;
  const out: ShareState = { v: SHARE_VERSION, model, op: state.op, input: state.input };
  if (state.result !== undefined) out.result = state.result;
  if (state.result_omitted) out.result_omitted = true;
  const view = cleanView(state.view);
  if (view && (view.pinned.length || view.supernodes.length)) out.view = view;
  return out;
}

export interface EncodeOptions {
  /** embed `result` only if the encoded text stays within this many characters */
  maxChars?: number;
}

/** Encode a state for the `s=` fragment parameter; drops the result if it would make the link too long. */
export function encodeShare(state: ShareState, opts: EncodeOptions = {}): { text: string; embedded: boolean } {
  const max = opts.maxChars ?? DEFAULT_MAX_EMBED_CHARS;
  const s = clean(state);
  if (s.result !== undefined) {
    const full = deflate(JSON.stringify(s));
    if (full.length <= max) return { text: full, embedded: true };
    delete s.result;
    s.result_omitted = true;
  }
  return { text: deflate(JSON.stringify(s)), embedded: false };
}

function inflateLink(bytes: Uint8Array): string {
  const tooLarge = () => new Error('inflated link is too large');
  return strFromU8(inflateCapped(bytes, { format: 'deflate', maxBytes: MAX_JSON_BYTES, tooLarge }));
}

function bad(msg: string): LoupeError {
  return new LoupeError(
    'BAD_INPUT',
    `This share link cannot be read: ${msg}.`,
    'The link may have been cut short when it was copied; ask for it again.',
  );
}

const isObj = (x: unknown): x is Record<string, unknown> => !!x && typeof x === 'object' && !Array.isArray(x);

/** Decode and validate the `s=` parameter. Throws LoupeError BAD_INPUT on anything malformed. */
export function decodeShare(text: string): ShareState {
  if (text.length > MAX_LINK_CHARS) throw bad('it is too long');
  let json: string;
  try {
    json = inflateLink(fromBase64Url(text));
  } catch (e) {
    throw bad((e as Error).message);
  }
  let raw: unknown;
  try {
    raw = JSON.parse(json);
  } catch {
    throw bad('its content is not JSON');
  }
  if (!isObj(raw)) throw bad('its content is not an object');
  if (raw.v !== SHARE_VERSION) throw bad(`it has version ${String(raw.v)}, this page reads version ${SHARE_VERSION}`);
  const m = raw.model;
  if (
    !isObj(m) ||
    typeof m.id !== 'string' ||
    typeof m.revision !== 'string' ||
    !['bundled', 'hub', 'url'].includes(m.kind as string)
  ) {
    throw bad('the model is missing or malformed');
  }
  if (m.endpoint !== undefined && (typeof m.endpoint !== 'string' || !/^https?:\/\//.test(m.endpoint)))
    throw bad('the Hub endpoint is not an http(s) URL');
  if (typeof raw.op !== 'string' || !/^[a-z_]+$/.test(raw.op)) throw bad('the operation is missing');
  if (!isObj(raw.input)) throw bad('the operation input is missing');
  return clean(raw as unknown as ShareState);
}

/** The fragment parameters this page understands: `s` (share state) and `pair` (bridge token). */
export function parseFragment(hash: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const part of hash.replace(/^#/, '').split('&')) {
    if (!part) continue;
    const i = part.indexOf('=');
    const k = i < 0 ? part : part.slice(0, i);
    const v = i < 0 ? '' : part.slice(i + 1);
    try {
      out.set(decodeURIComponent(k), decodeURIComponent(v));
    } catch {
      /* a mangled parameter is ignored, the rest still count */
    }
  }
  return out;
}

export function formatFragment(params: Map<string, string>): string {
  const parts: string[] = [];
  for (const [k, v] of params)
    parts.push(`${encodeURIComponent(k)}=${v.replace(/[^A-Za-z0-9\-_.~]/g, encodeURIComponent)}`);
  return parts.length ? `#${parts.join('&')}` : '';
}

/** A full link for `state` on the page at `pageUrl` (its own fragment, e.g. a pairing token, is dropped). */
export function shareUrl(pageUrl: string, state: ShareState, opts?: EncodeOptions): { url: string; embedded: boolean } {
  const { text, embedded } = encodeShare(state, opts);
  const base = pageUrl.split('#')[0];
  return { url: `${base}#s=${text}`, embedded };
}
