/**
 * The browser's storage quota for this site (IndexedDB, where the page keeps models), judged in
 * two places that say the same thing:
 *
 *   before the download   `checkStorage(need, estimate)`: the bytes the load will store (weights
 *                         still to download, plus the q8 entry it will write) against
 *                         `navigator.storage.estimate()`'s quota − usage, before any weight byte
 *   at a refused write    `storageError`: IndexedDB's QuotaExceededError as the same TOO_LARGE,
 *                         for what the estimate did not foresee (it is an estimate; other tabs write
 *                         too) or where there is no estimate
 *
 * A private window's quota is a small share of RAM rather than of the disk: Llama-3.2-1B's 2.47 GB
 * file did not fit headless Chromium's off-the-record profile.
 */
import { LoupeError } from '../errors';
import { fmtGB } from '../budget';

export interface StorageEstimateLike {
  usage?: number;
  quota?: number;
}

/** What a load will store in this site's storage, by part. */
export interface StorageNeed {
  /** weight bytes not yet complete in the cache (ModelPlan.downloadBytes) */
  downloadBytes: number;
  /** the q8 entry the load will write (q8.ts q8EntryBytesToWrite), 0 when none */
  q8Bytes: number;
}

/** fmtGB, with kB below 1 MB (fmtGB's floor): a few hundred kB free is not "1 MB" */
const fmt = (bytes: number): string => (bytes < 1e6 ? `${Math.round(bytes / 1e3)} kB` : fmtGB(bytes));

const HINT =
  'Free space: delete cached models in the Model panel. A private or incognito window has a small quota: open Loupe in a normal window.';

/** `navigator.storage.estimate()` where there is one (a worker has it too); undefined where it is missing or fails */
export async function storageEstimate(): Promise<StorageEstimateLike | undefined> {
  try {
    return await (globalThis.navigator as Navigator | undefined)?.storage?.estimate?.();
  } catch {
    return undefined;
  }
}

/**
 * TOO_LARGE when the bytes `need` says cannot fit the quota left (quota − usage); null when they
 * fit, when nothing is stored, or when the estimate says nothing (the write-time check remains).
 */
export function checkStorage(
  need: StorageNeed,
  est: StorageEstimateLike | undefined,
  model = 'This model',
): LoupeError | null {
  const total = need.downloadBytes + need.q8Bytes;
  if (total <= 0 || !est || typeof est.quota !== 'number' || !Number.isFinite(est.quota) || est.quota <= 0) return null;
  const usage = typeof est.usage === 'number' && Number.isFinite(est.usage) ? est.usage : 0;
  const available = Math.max(0, est.quota - usage);
  if (total <= available) return null;
  const parts =
    need.q8Bytes > 0
      ? ` (${fmt(need.downloadBytes)} of weights to download + ${fmt(need.q8Bytes)} of q8 weights to keep)`
      : '';
  // q8 adds its entry to the download: only where the download alone would fit is "not q8" a way out
  const q8Hint =
    need.q8Bytes > 0 && need.downloadBytes <= available
      ? ` Or load it with weights "stored" (no q8 entry to write: ${fmt(need.q8Bytes)} less).`
      : ' Or load a smaller model.';
  return new LoupeError(
    'TOO_LARGE',
    `${model} needs ${fmt(total)} of this browser's storage${parts}, but only ${fmt(available)} ` +
      `is available to this site (${fmt(usage)} used of ${fmt(est.quota)}). No weight was downloaded.`,
    HINT + q8Hint,
    {
      need_bytes: total,
      download_bytes: need.downloadBytes,
      q8_bytes: need.q8Bytes,
      available_bytes: available,
      usage: usage,
      quota: est.quota,
    },
  );
}

/**
 * A write IndexedDB refused for want of room (QuotaExceededError, whose message Chromium leaves
 * empty) as a structured error naming the file and the site's quota; anything else unchanged.
 */
export async function storageError(e: unknown, file: string, bytes: number): Promise<unknown> {
  if (!(e && typeof e === 'object' && (e as { name?: unknown }).name === 'QuotaExceededError')) return e;
  const est = await storageEstimate();
  const q = est?.quota ? ` (${fmt(est.usage ?? 0)} used of ${fmt(est.quota)})` : '';
  return new LoupeError(
    'TOO_LARGE',
    `This browser refused to store ${file} (${fmt(bytes)}) in its cache: the storage quota for this site is used up${q}.`,
    HINT,
    { file, bytes, usage: est?.usage ?? null, quota: est?.quota ?? null },
  );
}
