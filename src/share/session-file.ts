/**
 * Reading a session file ('loupe-session', version 1: the page's Session panel exports it) as a
 * file from outside: at most maxSessionFileBytes, at most maxSessionEntries entries come in (the
 * newest; the session keeps no more), each with its fields reduced to what an entry has and its
 * document checked (document-check.ts) before anything shows it. The operation's output schema is
 * checked after this, in the worker.
 */
import { CAPS, checkCap } from '../engine/caps';
import { LoupeError, toLoupeError } from '../engine/errors';
import { checkDocument } from './document-check';
import type { ShareModel } from './codec';

export interface SessionEntryData {
  id: string;
  /** ms since the epoch */
  at: number;
  op: string;
  input: Record<string, unknown>;
  doc: unknown;
  model: ShareModel | null;
  ms: number | null;
  pinned: boolean;
}

export interface SessionFileRead {
  /** entries that may come in, newest first */
  entries: SessionEntryData[];
  /** entries of the file in all */
  total: number;
  /** older entries left out: the session keeps at most maxSessionEntries */
  skipped: number;
  /** entries refused, with why */
  refused: { id: string; message: string }[];
}

type Obj = Record<string, unknown>;
const isObj = (x: unknown): x is Obj => !!x && typeof x === 'object' && !Array.isArray(x);

function notSession(msg: string): LoupeError {
  return new LoupeError(
    'BAD_INPUT',
    msg,
    'Import a file the Session panel exported (format "loupe-session", version 1).',
  );
}

/** the model an entry names, as a share link names it; anything else is dropped */
export function entryModel(m: unknown): ShareModel | null {
  if (!isObj(m) || typeof m.id !== 'string' || typeof m.revision !== 'string') return null;
  if (!['bundled', 'hub', 'url'].includes(m.kind as string)) return null;
  if (m.id.length > 1000 || m.revision.length > CAPS.maxNameChars) return null;
  const out: ShareModel = { kind: m.kind as ShareModel['kind'], id: m.id, revision: m.revision };
  if (typeof m.commit === 'string' && /^[0-9a-f]{40}$/.test(m.commit)) out.commit = m.commit;
  if (typeof m.endpoint === 'string' && /^https?:\/\//.test(m.endpoint) && m.endpoint.length <= 1000)
    out.endpoint = m.endpoint;
  return out;
}

/** Throws BAD_INPUT / TOO_LARGE for a file that is not a session; otherwise the entries that may come in. */
export function readSessionFile(text: string, now = Date.now()): SessionFileRead {
  checkCap('maxSessionFileBytes', text.length, 'the session file', { unit: 'characters' });
  let f: unknown;
  try {
    f = JSON.parse(text);
  } catch {
    throw notSession('This file is not JSON.');
  }
  if (!isObj(f) || f.format !== 'loupe-session' || f.version !== 1 || !Array.isArray(f.entries))
    throw notSession('This is not a Loupe session file (format "loupe-session", version 1).');
  const all = f.entries as unknown[];
  const at = (e: unknown) => (isObj(e) && Number.isFinite(Number(e.at)) ? Number(e.at) : 0);
  // the newest entries only: the session keeps no more, and checking the rest would cost time for nothing
  const newest = all
    .map((e, i) => ({ e, i, at: at(e) }))
    .sort((a, b) => b.at - a.at || a.i - b.i)
    .slice(0, CAPS.maxSessionEntries);
  const entries: SessionEntryData[] = [];
  const refused: SessionFileRead['refused'] = [];
  for (const { e, i } of newest) {
    const id = isObj(e) && typeof e.id === 'string' ? e.id : `#${i}`;
    try {
      if (!isObj(e)) throw notSession(`entry ${i} is not an object.`);
      if (typeof e.id !== 'string' || !e.id || e.id.length > CAPS.maxNameChars)
        throw notSession(`entry ${i} has no id (a string of at most ${CAPS.maxNameChars} characters).`);
      if (typeof e.op !== 'string' || !/^[a-z_]{1,64}$/.test(e.op)) throw notSession(`entry ${i} names no operation.`);
      checkDocument(e.op, e.doc, `session entry ${i} (${e.op})`);
      entries.push({
        id: e.id,
        at: at(e) || now,
        op: e.op,
        input: isObj(e.input) ? e.input : {},
        doc: e.doc,
        model: entryModel(e.model),
        ms: typeof e.ms === 'number' && Number.isFinite(e.ms) ? e.ms : null,
        pinned: e.pinned === true,
      });
    } catch (err) {
      refused.push({ id, message: toLoupeError(err).message });
    }
  }
  return { entries, total: all.length, skipped: all.length - newest.length, refused };
}
