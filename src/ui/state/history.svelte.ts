/**
 * The result history (the page's Session panel; its file format is 'loupe-session'): every result
 * this page produced or was given (a run, an agent's call, a share link, an import), with its
 * inputs and document, kept in this browser's IndexedDB so a reload loses nothing. Entries can be
 * pinned (kept when the history is trimmed, listed first), picked as A and B for a side-by-side
 * comparison, and the whole session exported and imported as one JSON file.
 */
import { openDB, type IDBPDatabase } from 'idb';
import type { ResultEntry } from './results.svelte';

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
/** unpinned entries beyond this many (oldest first) are dropped */
export const HISTORY_LIMIT = 100;

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

  private open(): Promise<IDBPDatabase> {
    this.db ??= openDB(DB, 1, {
      upgrade(db) {
        db.createObjectStore(STORE, { keyPath: 'id' });
      },
    });
    return this.db;
  }

  /** read the stored session (newest first) */
  async load(): Promise<HistoryEntry[]> {
    try {
      const all = (await (await this.open()).getAll(STORE)) as HistoryEntry[];
      this.entries = all.sort((a, b) => b.at - a.at);
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
    this.entries = this.entries.map((x) => (x.id === id ? next : x));
    await this.put([next]);
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

  /** add a file's entries (ones already here, by id, are skipped); returns how many were added */
  async importFile(text: string): Promise<number> {
    let f: HistoryFile;
    try {
      f = JSON.parse(text);
    } catch {
      throw new Error('This file is not JSON.');
    }
    if (!f || f.format !== 'loupe-session' || f.version !== 1 || !Array.isArray(f.entries))
      throw new Error('This is not a Loupe session file (format "loupe-session", version 1).');
    const have = new Set(this.entries.map((e) => e.id));
    const fresh = f.entries
      .filter(
        (e) => e && typeof e.id === 'string' && typeof e.op === 'string' && e.doc !== undefined && !have.has(e.id),
      )
      .map((e) => ({
        id: e.id,
        at: Number(e.at) || Date.now(),
        op: e.op,
        input: e.input ?? {},
        doc: e.doc,
        model: e.model ?? null,
        ms: e.ms ?? null,
        fromLink: false,
        pinned: !!e.pinned,
      }));
    this.entries = [...fresh, ...this.entries].sort((a, b) => b.at - a.at);
    await this.put(fresh);
    return fresh.length;
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
