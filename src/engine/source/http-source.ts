/**
 * Fetching one model file over HTTP with streaming progress, an AbortSignal, a byte cache and
 * resume. Shared by HubSource and UrlSource, which only say how a file name becomes a URL, which
 * cache key it has and which headers go with it.
 *
 * fetchFile(file, { cache, signal, onProgress, optional, cacheOnly, retries }):
 *  1. a complete cache entry is returned with no request (progress: one `cached` event);
 *  2. a partial entry is resumed with `Range: bytes=N-` (+ `If-Range: <etag>` when the etag is
 *     strong); a 206 whose Content-Range starts at N is appended, a 200 restarts from zero;
 *  3. on a network failure / cut connection / 5xx it retries (default 2 times, resuming from the
 *     bytes already received); when it gives up, or on abort, the bytes received are saved as a
 *     partial cache entry so the next call resumes.
 * downloadToCache(file, { cache, ... }) does the same into a cache that streams to storage
 * (ByteCache.openSink: DirCache), so a multi-GB shard never sits in memory.
 * Errors: 404 -> FILE_NOT_FOUND (MODEL_NOT_FOUND when the Hub says the repository does not exist),
 * 401/403 -> HTTP_ERROR with a token hint, other statuses -> HTTP_ERROR, network -> NETWORK_ERROR,
 * abort -> ABORTED.
 *
 * Bounds (caps.ts): `maxBytes` caps a file's size, counted in decoded bytes (gzip/br, chunked or
 * not): a larger declared size, or a body that runs past it, is TOO_LARGE, and the partial entry
 * is deleted. `validate` runs on a small file's bytes before they are cached (a cached entry that
 * fails it is deleted and fetched again; bytes that fail it are never kept). Every request has an
 * idle timeout (no byte for idleTimeoutMs: NETWORK_ERROR, retried like a cut connection) and every
 * download an overall deadline over its retries (deadlineMs, plus the time its bytes — the declared
 * size, else maxBytes — take at CAPS.requestMinRateBytesPerS: DEADLINE_EXCEEDED).
 */
import { CAPS, fileTooLarge } from '../caps';
import { env } from '../env';
import { LoupeError } from '../errors';
import type { ByteCache, CacheKey, FetchOptions, FileProgress, ModelRef, ModelSource, RangeRead } from './types';

export interface HttpSourceOptions {
  /** fetch implementation (default globalThis.fetch) */
  fetch?: typeof fetch;
  /** default retries after a failure (default 2) */
  retries?: number;
  /** first retry delay in ms, doubled each time (default 300) */
  retryDelayMs?: number;
  /** ms a request may wait for its next byte (default $LOUPE_IDLE_TIMEOUT s, else CAPS.idleTimeoutS) */
  idleTimeoutMs?: number;
  /** ms one download may take before the bytes it may carry are counted in (default $LOUPE_REQUEST_DEADLINE s, else CAPS.requestDeadlineS) */
  deadlineMs?: number;
}

/** Preallocate a body of known size up to this; beyond it the buffer grows as bytes arrive. */
const MAX_PREALLOCATE = 1024 ** 3;

/** A growable byte buffer; preallocated when the total size is known so nothing is copied twice. */
class ByteBuffer {
  private buf: Uint8Array;
  length = 0;
  constructor(capacity: number) {
    this.buf = new Uint8Array(Math.min(Math.max(capacity, 0), MAX_PREALLOCATE));
  }
  reserve(n: number): void {
    if (n <= this.buf.byteLength || n > MAX_PREALLOCATE) return;
    const next = new Uint8Array(Math.max(n, this.buf.byteLength * 2, 1 << 16));
    next.set(this.buf.subarray(0, this.length));
    this.buf = next;
  }
  append(chunk: Uint8Array): void {
    this.reserve(this.length + chunk.byteLength);
    if (this.length + chunk.byteLength > this.buf.byteLength) {
      const next = new Uint8Array(Math.max(this.length + chunk.byteLength, this.buf.byteLength * 2));
      next.set(this.buf.subarray(0, this.length));
      this.buf = next;
    }
    this.buf.set(chunk, this.length);
    this.length += chunk.byteLength;
  }
  reset(capacity: number): void {
    this.buf = new Uint8Array(Math.min(Math.max(capacity, 0), MAX_PREALLOCATE));
    this.length = 0;
  }
  /** the bytes received; the exact-size buffer itself when it is full (no copy) */
  bytes(): Uint8Array {
    return this.length === this.buf.byteLength ? this.buf : this.buf.slice(0, this.length);
  }
}

function isAbort(e: unknown, signal?: AbortSignal): boolean {
  return !!signal?.aborted || (!!e && typeof e === 'object' && (e as Error).name === 'AbortError');
}

function abortableSleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(new LoupeError('ABORTED', 'The operation was cancelled.'));
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(new LoupeError('ABORTED', 'The operation was cancelled.'));
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** `bytes a-b/total` -> {start, total}; total null for `*`. */
function parseContentRange(v: string | null): { start: number; total: number | null } | undefined {
  const m = v && /^bytes\s+(\d+)-(\d+)\/(\d+|\*)$/i.exec(v.trim());
  if (!m) return undefined;
  return { start: Number(m[1]), total: m[3] === '*' ? null : Number(m[3]) };
}

/**
 * The idle timeout of one request and the deadline of the download it belongs to: `signal` aborts
 * the fetch when the caller aborts, when no byte came for `idleMs`, or at `deadlineAt`.
 */
class Watch {
  private readonly ctl = new AbortController();
  private idle?: ReturnType<typeof setTimeout>;
  private deadline?: ReturnType<typeof setTimeout>;
  private readonly onOuter = () => this.ctl.abort();
  why?: 'idle' | 'deadline';
  constructor(
    private readonly outer: AbortSignal | undefined,
    private readonly idleMs: number,
    deadlineAt: number,
  ) {
    outer?.addEventListener('abort', this.onOuter, { once: true });
    if (outer?.aborted) this.ctl.abort();
    this.setDeadline(deadlineAt);
    this.tick();
  }
  /** move the deadline (a download of unknown size learns its size from the response) */
  setDeadline(at: number): void {
    clearTimeout(this.deadline);
    this.deadline = setTimeout(() => this.fire('deadline'), Math.max(0, at - Date.now()));
  }
  get signal(): AbortSignal {
    return this.ctl.signal;
  }
  private fire(why: 'idle' | 'deadline'): void {
    this.why ??= why;
    this.ctl.abort();
  }
  /** a byte (or the response's headers) arrived */
  tick(): void {
    clearTimeout(this.idle);
    this.idle = setTimeout(() => this.fire('idle'), this.idleMs);
  }
  done(): void {
    clearTimeout(this.idle);
    clearTimeout(this.deadline);
    this.outer?.removeEventListener('abort', this.onOuter);
  }
  /** the error when the watch stopped the request (undefined: the caller aborted, or it did not stop) */
  error(file: string, url: string, loaded: number): LoupeError | Retryable | undefined {
    if (this.why === 'deadline')
      return new LoupeError(
        'DEADLINE_EXCEEDED',
        `${file} did not arrive within its deadline (${loaded} bytes received from ${url}).`,
        'The server is too slow or stalls; try again later, or raise the deadline ($LOUPE_REQUEST_DEADLINE, seconds).',
        { file, url, loaded },
      );
    if (this.why === 'idle')
      return new Retryable(
        new LoupeError(
          'NETWORK_ERROR',
          `No byte of ${file} arrived for ${Math.round(this.idleMs / 1000)} s (${loaded} bytes received from ${url}).`,
          'The server stalled; try again (finished bytes are kept), or raise the idle timeout (--idle-timeout, $LOUPE_IDLE_TIMEOUT).',
          { file, url, loaded },
        ),
      );
    return undefined;
  }
}

/** seconds from an environment variable, when it holds a positive number */
function envSeconds(name: string): number | undefined {
  const v = Number(env.variable(name));
  return Number.isFinite(v) && v > 0 ? v : undefined;
}

/** Failures worth another try: the connection, not the request, was the problem. */
class Retryable extends Error {
  constructor(
    readonly error: LoupeError,
    /** the partial bytes were dropped: start over once, without spending a retry */
    readonly restart = false,
  ) {
    super(error.message);
  }
}

/** A status that is neither 200 nor 206 after the cases a caller handles: a server error (5xx) is retried, any other is HTTP_ERROR. */
async function refuseStatus(status: number, file: string, url: string, drop: () => unknown): Promise<never> {
  await drop();
  if (status >= 500)
    throw new Retryable(
      new LoupeError('HTTP_ERROR', `Server error ${status} for ${url}.`, 'The server had a problem; try again later.', {
        file,
        url,
        status,
      }),
    );
  throw new LoupeError('HTTP_ERROR', `Unexpected HTTP ${status} for ${url}.`, undefined, { file, url, status });
}

/** Where downloaded bytes go: memory (ByteBuffer) or a cache's sink (disk). */
interface Sink {
  readonly length: number;
  append(chunk: Uint8Array): void;
  reset(capacity: number): void;
  reserve?(n: number): void;
}

/** What is known about the download in progress; kept across attempts and saved with a partial. */
interface DownloadState {
  buf: Sink;
  /** validator of the version whose bytes are in buf */
  etag?: string;
  /** full size of that version when known */
  total: number | null;
  /** called when etag/total change (a disk sink records them for resuming) */
  onMeta?: () => void;
}

export abstract class HttpSource implements ModelSource {
  abstract readonly ref: ModelRef;
  /** absolute URL of a file */
  abstract url(file: string): string;
  /** cache key of a file */
  abstract cacheKey(file: string): CacheKey;
  /** headers for a request to `url` (auth goes only where it belongs) */
  protected headersFor(_url: string): Record<string, string> {
    return {};
  }

  protected readonly fetchImpl: typeof fetch;
  protected readonly defaultRetries: number;
  protected readonly retryDelayMs: number;
  protected readonly idleTimeoutMs: number;
  protected readonly deadlineMs: number;

  constructor(opts: HttpSourceOptions = {}) {
    this.fetchImpl = opts.fetch ?? ((...args: Parameters<typeof fetch>) => globalThis.fetch(...args));
    this.defaultRetries = opts.retries ?? 2;
    this.retryDelayMs = opts.retryDelayMs ?? 300;
    this.idleTimeoutMs = opts.idleTimeoutMs ?? (envSeconds('LOUPE_IDLE_TIMEOUT') ?? CAPS.idleTimeoutS) * 1000;
    this.deadlineMs = opts.deadlineMs ?? (envSeconds('LOUPE_REQUEST_DEADLINE') ?? CAPS.requestDeadlineS) * 1000;
  }

  /** when a download started at `start` that may carry `bytes` must be done by */
  private deadlineFor(bytes: number | null | undefined, start = Date.now()): number {
    return start + this.deadlineMs + ((bytes ?? 0) / CAPS.requestMinRateBytesPerS) * 1000;
  }

  /** Hint for 401/403; the Hub overrides it to talk about tokens and gated models. */
  protected authHint(_file: string, _res: Response): string {
    return 'The server refused access to this file; check that the URL is public or that you are allowed to read it.';
  }

  /** Map a 404 to an error; the Hub says whether the repository or only the file is missing. */
  protected notFound(file: string, url: string, _res: Response): LoupeError {
    return new LoupeError('FILE_NOT_FOUND', `${file} not found at ${url} (HTTP 404).`, undefined, {
      file,
      url,
      status: 404,
    });
  }

  async fetchFile(file: string, opts: FetchOptions = {}): Promise<Uint8Array | null> {
    const { cache, signal } = opts;
    const key = this.cacheKey(file);
    if (signal?.aborted) throw new LoupeError('ABORTED', 'The operation was cancelled.');
    if (cache) {
      const hit = await cache.get(key, opts.maxBytes != null ? { maxBytes: opts.maxBytes } : undefined);
      if (hit && this.valid(hit, opts)) {
        opts.onProgress?.({ file, loaded: hit.byteLength, total: hit.byteLength, cached: true, done: true });
        return hit;
      }
      // an entry too large or failing validation (cached by an older Loupe) is not kept: fetch it again
      if (hit || (opts.maxBytes != null && (await cache.hasComplete?.(key)))) await cache.delete(key).catch(() => {});
    }
    if (opts.optional && cache?.isMissing && (await cache.isMissing(key).catch(() => false))) return null;
    if (opts.cacheOnly) return null;

    const stored = cache ? await cache.getPartial(key) : undefined;
    // The preflight's header bytes are the file's start: resume after them instead of fetching them again.
    const partial = stored && stored.bytes.byteLength > 0 ? stored : opts.head;
    const buf = new ByteBuffer(partial?.total ?? partial?.bytes.byteLength ?? 0);
    const state: DownloadState = { buf, total: null };
    if (partial && partial.bytes.byteLength > 0) {
      buf.append(partial.bytes);
      state.etag = partial.etag;
      state.total = partial.total ?? null;
    }
    const save = async () => {
      // Resume only what has a definite size (a body of unknown, maybe compressed, length restarts).
      if (!cache || buf.length === 0 || state.total == null) return;
      const meta = {
        ...(state.etag ? { etag: state.etag } : {}),
        ...(state.total != null ? { total: state.total } : {}),
      };
      try {
        await cache.putPartial(key, buf.bytes(), meta);
      } catch {
        /* the cache is best effort */
      }
    };
    const discard = async () => {
      buf.reset(0);
      if (cache) await cache.delete(key).catch(() => {});
    };
    if (!(await this.download(file, state, opts, save, discard))) {
      await this.rememberMissing(file, cache);
      return null;
    }
    const bytes = buf.bytes();
    if (opts.validate) {
      try {
        opts.validate(bytes);
      } catch (e) {
        await discard();
        throw e;
      }
    }
    if (cache) {
      try {
        await cache.put(key, bytes);
      } catch {
        /* a full cache must not fail the load */
      }
    }
    opts.onProgress?.({ file, loaded: bytes.byteLength, total: bytes.byteLength, done: true });
    return bytes;
  }

  /** whether cached bytes pass the caller's validation */
  private valid(bytes: Uint8Array, opts: FetchOptions): boolean {
    try {
      opts.validate?.(bytes);
      return true;
    } catch {
      return false;
    }
  }

  /**
   * Download a file into a cache that can stream to storage (ByteCache.openSink, e.g. DirCache)
   * without holding it in memory; resumes a partial entry. Resolves to false for an optional
   * file that does not exist (or, with cacheOnly, one not cached), true when the file is cached
   * complete. Same errors, progress and retries as fetchFile.
   */
  async downloadToCache(file: string, opts: FetchOptions & { cache: ByteCache }): Promise<boolean> {
    const { cache, signal } = opts;
    const key = this.cacheKey(file);
    if (!cache.openSink) throw new LoupeError('INTERNAL', 'downloadToCache needs a cache with openSink (DirCache).');
    if (signal?.aborted) throw new LoupeError('ABORTED', 'The operation was cancelled.');
    if (cache.localPath?.(key) || (await cache.hasComplete?.(key))) return true;
    if (opts.optional && cache.isMissing && (await cache.isMissing(key).catch(() => false))) return false;
    if (opts.cacheOnly) return false;
    const sink = await cache.openSink(key);
    if (sink.length === 0 && opts.head && opts.head.bytes.byteLength > 0) {
      sink.setMeta({ ...(opts.head.etag ? { etag: opts.head.etag } : {}), total: opts.head.total });
      sink.append(opts.head.bytes);
    }
    const state: DownloadState = {
      buf: {
        get length() {
          return sink.length;
        },
        append: (c) => sink.append(c),
        reset: () => sink.reset(),
      },
      etag: sink.etag,
      total: sink.total ?? null,
      onMeta: () => sink.setMeta({ etag: state.etag, ...(state.total != null ? { total: state.total } : {}) }),
    };
    let found: boolean;
    const discard = async () => {
      sink.reset();
      await sink.suspend().catch(() => {});
      await cache.delete(key).catch(() => {});
    };
    try {
      found = await this.download(file, state, opts, () => sink.suspend(), discard);
    } catch (e) {
      await sink.suspend().catch(() => {});
      throw e;
    }
    if (!found) {
      await sink.suspend();
      await this.rememberMissing(file, cache);
      return false;
    }
    await sink.commit();
    opts.onProgress?.({ file, loaded: sink.length, total: sink.length, done: true });
    return true;
  }

  /**
   * One GET with the source's headers. Records the Hub's X-Repo-Commit (the commit the revision
   * resolved to); maps refusals (401/403) to an error naming the token. Network failures are
   * Retryable; 404 is left to the caller (optional files).
   */
  private async request(
    file: string,
    url: string,
    headers: Record<string, string>,
    signal?: AbortSignal,
  ): Promise<Response> {
    let res: Response;
    try {
      res = await this.fetchImpl(url, { headers, signal });
    } catch (e) {
      // an abort, or a refusal of the fetch itself (a host not allowed: src/node/net-access.ts), is not retried
      if (isAbort(e, signal) || e instanceof LoupeError) throw e;
      throw new Retryable(
        new LoupeError(
          'NETWORK_ERROR',
          `Could not reach ${url} (${e instanceof Error ? e.message : String(e)}).`,
          'Check the network connection and the endpoint, then try again; finished bytes are kept.',
          { file, url },
        ),
      );
    }
    const commit = res.headers.get('x-repo-commit');
    if (commit && /^[0-9a-f]{40}$/i.test(commit)) this.noteCommit(commit.toLowerCase(), res.url || url);
    if (res.status === 401 || res.status === 403) {
      res.body?.cancel().catch(() => {});
      const nf = this.notFound(file, url, res);
      if (nf.code === 'MODEL_NOT_FOUND') throw nf;
      throw new LoupeError(
        'HTTP_ERROR',
        `Access to ${file} was refused (HTTP ${res.status}) at ${url}.`,
        this.authHint(file, res),
        { file, url, status: res.status },
      );
    }
    return res;
  }

  /** The Hub overrides this to remember the commit its revision resolved to (`from`: the answering URL). */
  protected noteCommit(_commit: string, _from: string): void {}

  /**
   * `length` bytes at `offset` (a safetensors header) with a Range request, or from a complete
   * cache entry with no request. Through redirects too: fetch keeps Range on a cross-origin
   * redirect (and drops Authorization). A server that ignores Range is read only up to what was
   * asked and then cut off. size is null when neither Content-Range nor Content-Length says it.
   */
  async readRange(file: string, offset: number, length: number, opts: FetchOptions = {}): Promise<RangeRead | null> {
    const { cache, signal } = opts;
    const key = this.cacheKey(file);
    if (signal?.aborted) throw new LoupeError('ABORTED', 'The operation was cancelled.');
    const hit = cache?.readRange ? await cache.readRange(key, offset, length).catch(() => undefined) : undefined;
    if (hit) return { ...hit, cached: true, stored: hit.stored ?? hit.size ?? undefined };
    if (opts.optional && cache?.isMissing && (await cache.isMissing(key).catch(() => false))) return null;
    if (opts.cacheOnly) return null;
    const url = this.url(file);
    let retriesLeft = opts.retries ?? this.defaultRetries;
    let delay = this.retryDelayMs;
    const deadlineAt = this.deadlineFor(length);
    for (;;) {
      try {
        return await this.rangeAttempt(file, url, offset, length, opts, deadlineAt);
      } catch (e) {
        if (e instanceof Retryable) {
          if (retriesLeft-- > 0) {
            await abortableSleep(delay, signal);
            delay *= 2;
            continue;
          }
          throw e.error;
        }
        if (isAbort(e, signal)) throw new LoupeError('ABORTED', 'The operation was cancelled.');
        throw e;
      }
    }
  }

  private async rangeAttempt(
    file: string,
    url: string,
    offset: number,
    length: number,
    opts: FetchOptions,
    deadlineAt: number,
  ): Promise<RangeRead | null> {
    const watch = new Watch(opts.signal, this.idleTimeoutMs, deadlineAt);
    try {
      return await this.rangeWatched(file, url, offset, length, opts, watch);
    } catch (e) {
      throw watch.error(file, url, 0) ?? e;
    } finally {
      watch.done();
    }
  }

  private async rangeWatched(
    file: string,
    url: string,
    offset: number,
    length: number,
    opts: FetchOptions,
    watch: Watch,
  ): Promise<RangeRead | null> {
    const res = await this.request(
      file,
      url,
      { ...this.headersFor(url), Range: `bytes=${offset}-${offset + length - 1}` },
      watch.signal,
    );
    watch.tick();
    const drop = () => res.body?.cancel().catch(() => {});
    if (res.status === 404) {
      await drop();
      if (!opts.optional) throw this.notFound(file, url, res);
      await this.rememberMissing(file, opts.cache);
      return null;
    }
    if (res.status === 416) {
      // the file is shorter than offset: nothing to read, but its size is in Content-Range
      await drop();
      const m = /\/(\d+)\s*$/.exec(res.headers.get('content-range') ?? '');
      return { bytes: new Uint8Array(0), size: m ? Number(m[1]) : offset };
    }
    if (res.status !== 200 && res.status !== 206) await refuseStatus(res.status, file, url, drop);
    let size: number | null;
    let skip = 0;
    if (res.status === 206) {
      const cr = parseContentRange(res.headers.get('content-range'));
      if (!cr || cr.start !== offset) {
        await drop();
        throw new LoupeError(
          'HTTP_ERROR',
          `Server answered a range other than bytes ${offset}- for ${file}.`,
          undefined,
          { file, url },
        );
      }
      size = cr.total;
    } else {
      const encoded = (res.headers.get('content-encoding') ?? 'identity').toLowerCase() !== 'identity';
      const cl = res.headers.get('content-length');
      size = !encoded && cl != null && /^\d+$/.test(cl) ? Number(cl) : null;
      skip = offset;
    }
    const out = new Uint8Array(length);
    let got = 0,
      seen = 0;
    if (res.body) {
      const reader = res.body.getReader();
      try {
        while (got < length) {
          const { done, value } = await reader.read();
          if (done) break;
          watch.tick();
          const from = Math.max(0, skip - seen);
          seen += value.byteLength;
          if (from >= value.byteLength) continue;
          const piece = value.subarray(from, from + (length - got));
          out.set(piece, got);
          got += piece.byteLength;
        }
      } catch (e) {
        if (isAbort(e, watch.signal)) throw e;
        throw new Retryable(
          new LoupeError('NETWORK_ERROR', `Connection lost while reading ${file}.`, 'Try again.', { file, url }),
        );
      } finally {
        // a 200 (Range ignored) would go on with the whole file: stop it here
        reader.cancel().catch(() => {});
      }
    }
    const etag = res.headers.get('etag') ?? undefined;
    return { bytes: out.subarray(0, got), size, ...(etag && res.status === 206 ? { etag } : {}) };
  }

  /** Remember an optional file's 404 in the cache, so a cached load does not ask again. */
  private async rememberMissing(file: string, cache?: ByteCache): Promise<void> {
    if (cache?.putMissing) await cache.putMissing(this.cacheKey(file)).catch(() => {});
  }

  /** The retry loop around attempt(): resumes after failures, saves the partial when giving up. */
  private async download(
    file: string,
    state: DownloadState,
    opts: FetchOptions,
    save: () => Promise<void>,
    discard: () => Promise<void>,
  ): Promise<boolean> {
    const { signal, onProgress } = opts;
    const url = this.url(file);
    const report = (p: Omit<FileProgress, 'file'>) => onProgress?.({ file, ...p });
    let retriesLeft = opts.retries ?? this.defaultRetries;
    let delay = this.retryDelayMs;
    let restarted = false;
    const startedAt = Date.now();
    for (;;) {
      try {
        return await this.attempt(file, url, state, { ...opts, startedAt }, report);
      } catch (e) {
        if (e instanceof LoupeError && e.code === 'TOO_LARGE') {
          await discard();
          throw e;
        }
        if (e instanceof Retryable) {
          if (e.restart && !restarted) {
            restarted = true;
            continue;
          }
          if (retriesLeft > 0) {
            retriesLeft--;
            try {
              await abortableSleep(delay, signal);
            } catch (abortErr) {
              await save();
              throw abortErr;
            }
            delay *= 2;
            continue;
          }
          await save();
          throw e.error;
        }
        if (isAbort(e, signal)) {
          await save();
          throw new LoupeError(
            'ABORTED',
            `Download of ${file} was cancelled after ${state.buf.length} bytes.`,
            opts.cache ? 'Load again to resume where it stopped.' : undefined,
            { file, loaded: state.buf.length },
          );
        }
        throw e;
      }
    }
  }

  /** Forget the partial bytes (they belong to another version, or the server refused the range). */
  private restart(state: DownloadState, report: (p: Omit<FileProgress, 'file'>) => void, total: number | null): void {
    const had = state.buf.length > 0;
    state.buf.reset(total ?? 0);
    state.etag = undefined;
    state.total = total;
    state.onMeta?.();
    if (had) report({ loaded: 0, total, restarted: true });
  }

  /**
   * One request, appending to state.buf (resuming from its length when > 0) and updating
   * state.etag/total as soon as the response says. Returns false for an optional 404; throws
   * Retryable for failures worth another try.
   */
  private async attempt(
    file: string,
    url: string,
    state: DownloadState,
    opts: FetchOptions & { startedAt: number },
    report: (p: Omit<FileProgress, 'file'>) => void,
  ): Promise<boolean> {
    const at = (bytes: number | null | undefined) => this.deadlineFor(bytes, opts.startedAt);
    const watch = new Watch(opts.signal, this.idleTimeoutMs, at(opts.maxBytes ?? state.total));
    try {
      return await this.attemptWatched(file, url, state, opts, report, watch, at);
    } catch (e) {
      throw watch.error(file, url, state.buf.length) ?? e;
    } finally {
      watch.done();
    }
  }

  private async attemptWatched(
    file: string,
    url: string,
    state: DownloadState,
    opts: FetchOptions,
    report: (p: Omit<FileProgress, 'file'>) => void,
    watch: Watch,
    deadlineAt: (bytes: number | null | undefined) => number,
  ): Promise<boolean> {
    const { buf } = state;
    const { optional, maxBytes } = opts;
    const signal = watch.signal;
    const headers: Record<string, string> = { ...this.headersFor(url) };
    const resumeFrom = buf.length;
    if (resumeFrom > 0) {
      headers.Range = `bytes=${resumeFrom}-`;
      // If-Range needs a strong validator; with a weak or no etag the Content-Range total guards us.
      if (state.etag && !state.etag.startsWith('W/')) headers['If-Range'] = state.etag;
    }
    const res = await this.request(file, url, headers, signal);
    watch.tick();
    const drop = () => res.body?.cancel().catch(() => {});
    if (res.status === 404) {
      await drop();
      if (optional) return false;
      throw this.notFound(file, url, res);
    }
    if (res.status === 416 && resumeFrom > 0) {
      // Our partial bytes do not fit the file any more: start over.
      await drop();
      this.restart(state, report, null);
      throw new Retryable(
        new LoupeError('HTTP_ERROR', `Resuming ${file} was refused (HTTP 416).`, undefined, { file, url, status: 416 }),
        true,
      );
    }
    if (res.status !== 200 && res.status !== 206) await refuseStatus(res.status, file, url, drop);

    const etag = res.headers.get('etag') ?? undefined;
    const encoded = (res.headers.get('content-encoding') ?? 'identity').toLowerCase() !== 'identity';
    const cl = res.headers.get('content-length');
    const contentLength = !encoded && cl != null && /^\d+$/.test(cl) ? Number(cl) : null;

    if (res.status === 206 && resumeFrom > 0) {
      const cr = parseContentRange(res.headers.get('content-range'));
      const sameFile =
        !!cr &&
        cr.start === resumeFrom &&
        (state.total == null || cr.total == null || cr.total === state.total) &&
        (!state.etag || !etag || etag === state.etag);
      if (!sameFile) {
        // A range we did not ask for, or of another version of the file: drop everything.
        await drop();
        this.restart(state, report, null);
        throw new Retryable(
          new LoupeError('HTTP_ERROR', `Server answered an unusable range for ${file}.`, undefined, { file, url }),
          true,
        );
      }
      state.total = cr!.total ?? (contentLength != null ? resumeFrom + contentLength : null);
      state.etag = etag ?? state.etag;
      state.onMeta?.();
    } else if (res.status === 206) {
      await drop();
      throw new LoupeError(
        'HTTP_ERROR',
        `Server sent a partial response (206) for ${url} that was not asked for.`,
        undefined,
        { file, url, status: 206 },
      );
    } else {
      // 200: the whole file (also the answer to a Range whose If-Range no longer matches).
      this.restart(state, report, contentLength);
      state.etag = etag;
      state.onMeta?.();
    }
    let total = state.total;
    if (maxBytes != null && total != null && total > maxBytes) {
      await drop();
      throw fileTooLarge(file, total, maxBytes, true);
    }
    if (total != null) buf.reserve?.(total);
    // the time allowed for the bytes: the declared size's, when it is known and below the bound
    if (total != null) watch.setDeadline(deadlineAt(Math.min(total, maxBytes ?? Infinity)));
    report({ loaded: buf.length, total });

    if (!res.body) {
      throw new Retryable(new LoupeError('NETWORK_ERROR', `Empty response body for ${url}.`, undefined, { file, url }));
    }
    const reader = res.body.getReader();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        watch.tick();
        // decoded bytes: a gzip, br or chunked body is counted as what it becomes
        if (maxBytes != null && buf.length + value.byteLength > maxBytes) {
          reader.cancel().catch(() => {});
          throw fileTooLarge(file, buf.length + value.byteLength, maxBytes, false);
        }
        if (total != null && buf.length + value.byteLength > total) {
          if (res.status === 206) {
            throw new LoupeError('HTTP_ERROR', `${url} sent more bytes than its declared size ${total}.`, undefined, {
              file,
              url,
            });
          }
          // A compressed body whose Content-Encoding a cross-origin response hides: the
          // Content-Length was the compressed size. The size is unknown after all.
          total = state.total = null;
          state.onMeta?.();
        }
        buf.append(value);
        report({ loaded: buf.length, total });
      }
    } catch (e) {
      reader.cancel().catch(() => {});
      if (e instanceof LoupeError) throw e;
      if (isAbort(e, signal)) throw e;
      throw new Retryable(
        new LoupeError(
          'NETWORK_ERROR',
          `Connection lost while downloading ${file} (${buf.length}${total != null ? ` of ${total}` : ''} bytes received).`,
          'Try again: the download resumes where it stopped.',
          { file, url, loaded: buf.length, total },
        ),
      );
    }
    if (total != null && buf.length < total) {
      throw new Retryable(
        new LoupeError(
          'NETWORK_ERROR',
          `Connection closed early while downloading ${file} (${buf.length} of ${total} bytes).`,
          'Try again: the download resumes where it stopped.',
          { file, url, loaded: buf.length, total },
        ),
      );
    }
    return true;
  }
}
