/**
 * The result history (the page's Session panel; its file format is 'loupe-session'): every result
 * this page produced or was given (a run, an agent's call, a share link, an import), with its
 * inputs and document, kept in this browser's IndexedDB so a reload loses nothing. Entries can be
 * pinned (kept when the history is trimmed, listed first), picked as A and B for a side-by-side
 * comparison, and the whole session exported and imported as one JSON file.
 */
import { openDB, type IDBPDatabase } from 'idb';
import type { ResultEntry } from './results.svelte';
import { CAPS } from '../../engine/caps';
import { checkDocument } from '../../share/document-check';
import { readSessionFile } from '../../share/session-file';
import type { ErrorInfo } from './errors';

export interface HistoryEntry extends ResultEntry {
  id: string;
  /** ms since the epoch */
  at: number;
  pinned: boolean;
}

export interface HistoryFile {
  format: 'loupe-session';
  version: 1;
  exported_at: string;
  entries: HistoryEntry[];
}

const DB = 'loupe-session';
const STORE = 'entries';
/** unpinned entries beyond this many (oldest first) are dropped; an import brings in no more */
export const HISTORY_LIMIT = CAPS.maxSessionEntries;

/** what an import did, for the Session panel to say */
export interface ImportReport {
  added: number;
  /** older entries of the file left out (the session keeps at most HISTORY_LIMIT) */
  skipped: number;
  refused: { id: string; message: string }[];
}

/** the operation's output schema, checked where the operations are (the worker): per item, null or why not */
export type SchemaCheck = (items: { op: string; doc: unknown; what: string }[]) => Promise<(ErrorInfo | null)[]>;

let seq = 0;
const newId = () => `${Date.now().toString(36)}-${(++seq).toString(36)}-${Math.random().toString(36).slice(2, 6)}`;

/**
 * An entry as plain data for IndexedDB. The inputs may be reactive state (a form's values); the
 * document is the worker's (or a file's) plain object and goes as it is: $state.snapshot walks
 * every number of it (structuredClone per primitive), a long task on the main thread for a large
 * result such as attention's.
 */
function plain(e: HistoryEntry): HistoryEntry {
  return { ...e, input: $state.snapshot(e.input) as Record<string, unknown>, model: $state.snapshot(e.model) };
}

export class ResultHistory {
  entries = $state.raw<HistoryEntry[]>([]);
  compareA = $state<string | null>(null);
  compareB = $state<string | null>(null);
  error = $state<string | null>(null);
  private db: Promise<IDBPDatabase> | null = null;
  /** set by the app: an import's documents are checked against their operation's output schema */
  schemaCheck: SchemaCheck | null = null;

  private open(): Promise<IDBPDatabase> {
    this.db ??= openDB(DB, 1, {
      upgrade(db) {
        db.createObjectStore(STORE, { keyPath: 'id' });
      },
    });
    return this.db;
  }

  /** read the stored session (newest first); an entry whose document fails the checks is dropped, never shown */
  async load(): Promise<HistoryEntry[]> {
    try {
      const all = (await (await this.open()).getAll(STORE)) as HistoryEntry[];
      const ok: HistoryEntry[] = [];
      const bad: HistoryEntry[] = [];
      for (const e of all) {
        try {
          checkDocument(e.op, e.doc, 'a stored session entry');
          ok.push(e);
        } catch {
          bad.push(e);
        }
      }
      this.entries = ok.sort((a, b) => b.at - a.at);
      for (const e of bad) await this.remove(e.id);
      await this.trim();
    } catch (e) {
      this.error = `The session history is not available in this browser: ${(e as Error).message}`;
    }
    return this.entries;
  }

  /** the newest entry of each operation (what the result panel shows after a reload) */
  latestByOp(): Record<string, HistoryEntry> {
    const out: Record<string, HistoryEntry> = {};
    for (const e of this.entries) if (!out[e.op]) out[e.op] = e;
    return out;
  }

  get(id: string | null): HistoryEntry | undefined {
    return id ? this.entries.find((e) => e.id === id) : undefined;
  }

  async record(r: ResultEntry): Promise<HistoryEntry> {
    const entry: HistoryEntry = { ...r, id: newId(), at: Date.now(), pinned: false };
    this.entries = [entry, ...this.entries];
    await this.put([entry]);
    await this.trim();
    return entry;
  }

  async togglePin(id: string): Promise<void> {
    const e = this.get(id);
    if (!e) return;
    const next = { ...e, pinned: !e.pinned };
    // shown once stored (a few ms): a reload right after the star lit up keeps the pin
    await this.put([next]);
    this.entries = this.entries.map((x) => (x.id === id ? next : x));
  }

  async remove(id: string): Promise<void> {
    this.entries = this.entries.filter((e) => e.id !== id);
    if (this.compareA === id) this.compareA = null;
    if (this.compareB === id) this.compareB = null;
    try {
      await (await this.open()).delete(STORE, id);
    } catch {
      /* best effort */
    }
  }

  async clear(): Promise<void> {
    const keep = this.entries.filter((e) => e.pinned);
    const drop = this.entries.filter((e) => !e.pinned);
    this.entries = keep;
    try {
      const db = await this.open();
      for (const e of drop) await db.delete(STORE, e.id);
    } catch {
      /* best effort */
    }
  }

  /** pick an entry as A or B of the comparison (picking it again unpicks it) */
  pick(slot: 'A' | 'B', id: string): void {
    if (slot === 'A') this.compareA = this.compareA === id ? null : id;
    else this.compareB = this.compareB === id ? null : id;
  }

  toFile(): HistoryFile {
    return {
      format: 'loupe-session',
      version: 1,
      exported_at: new Date().toISOString(),
      entries: this.entries.map(plain),
    };
  }

  /**
   * Add a session file's entries: at most HISTORY_LIMIT (the newest), each document checked against
   * Loupe's limits and its operation's output schema before it is kept; entries already here (by
   * id) are skipped. Throws for a file that is not a session.
   */
  async importFile(text: string): Promise<ImportReport> {
    const read = readSessionFile(text);
    const refused = [...read.refused];
    const have = new Set(this.entries.map((e) => e.id));
    let list = read.entries.filter((e) => !have.has(e.id));
    if (this.schemaCheck && list.length) {
      const verdicts = await this.schemaCheck(
        list.map((e, i) => ({ op: e.op, doc: e.doc, what: `session entry ${i}` })),
      );
      refused.push(...list.flatMap((e, i) => (verdicts[i] ? [{ id: e.id, message: verdicts[i]!.message }] : [])));
      list = list.filter((_, i) => !verdicts[i]);
    }
    const fresh: HistoryEntry[] = list.map((e) => ({ ...e, fromLink: false }));
    this.entries = [...fresh, ...this.entries].sort((a, b) => b.at - a.at);
    await this.put(fresh);
    await this.trim();
    return { added: fresh.length, skipped: read.skipped, refused };
  }

  private async put(list: HistoryEntry[]): Promise<void> {
    if (!list.length) return;
    try {
      const db = await this.open();
      const tx = db.transaction(STORE, 'readwrite');
      for (const e of list) await tx.store.put(plain(e));
      await tx.done;
    } catch (e) {
      this.error = `Could not save to the session history: ${(e as Error).message}`;
    }
  }

  private async trim(): Promise<void> {
    const unpinned = this.entries.filter((e) => !e.pinned);
    if (unpinned.length <= HISTORY_LIMIT) return;
    for (const e of unpinned.slice(HISTORY_LIMIT)) await this.remove(e.id);
  }
}
