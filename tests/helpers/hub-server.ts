/**
 * A stand-in for the Hugging Face Hub on 127.0.0.1 (tests only, no network).
 *
 *   const hub = await startHubServer();
 *   hub.addRepo('owner/name', '/path/to/folder');            // serves /owner/name/resolve/main/<file>
 *   hub.addFile('owner/name', 'extra.json', bytes);           // in-memory file (overrides the folder)
 *   hub.fault('owner/name', 'model.safetensors', { cutAfter: 1000 });  // next response dies after 1000 body bytes
 *   new HubSource('owner/name', { endpoint: hub.url })
 *   hub.stats('owner/name', 'model.safetensors')  // { requests, bytes, ranges, auth }
 *   await hub.close();
 *
 * Behaves like the Hub where Loupe cares: Content-Length, strong ETag, Accept-Ranges, Range
 * (206 / 416) with If-Range, 404 with X-Error-Code RepositoryNotFound / EntryNotFound, gated
 * repos (401 + GatedRepo unless the right Bearer token), redirects (to test where tokens go),
 * and CORS (Access-Control-Allow-Origin *, exposed headers, preflight, Cross-Origin-Resource-Policy:
 * cross-origin, so cross-origin-isolated pages can fetch from it).
 *
 * Faults (each applies to the next `times` responses of a file, default 1, after `skip` untouched ones):
 *   cutAfter: N   send N body bytes, then destroy the socket
 *   stallAfter: N send N body bytes, then hold the connection open without sending more
 *   delayMs: ms   wait before answering
 *   status: code  answer with this status and no body
 * Pacing (every response of a file): `throttle(id, file, { chunkSize, chunkDelayMs })`.
 */
import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import * as http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import * as path from 'node:path';

export interface FaultSpec {
  cutAfter?: number;
  stallAfter?: number;
  delayMs?: number;
  status?: number;
  times?: number;
  /** let this many responses of the file through untouched first (e.g. the two header range reads of a preflight) */
  skip?: number;
}

export interface FileStats {
  /** GET requests answered for this file (any status) */
  requests: number;
  /** body bytes written for this file, over all requests */
  bytes: number;
  /** the Range header of each request ('' when none) */
  ranges: string[];
  /** the Authorization header of each request ('' when none) */
  auth: string[];
  /** status of each response */
  statuses: number[];
}

export interface RequestLog {
  method: string;
  url: string;
  id?: string;
  revision?: string;
  file?: string;
  range: string;
  authorization: string;
  status: number;
  bytes: number;
}

export interface HubServer {
  /** origin, e.g. http://127.0.0.1:41234 (use as the HubSource endpoint) */
  readonly url: string;
  readonly port: number;
  /** the commit `revision` of repo `id` resolves to now (sent as X-Repo-Commit; /resolve/<commit>/ serves that snapshot) */
  commitOf(id: string, revision?: string): string;
  /** move a branch: `revision` now serves `dir` under a new commit; the old commit still serves the old files */
  moveRevision(id: string, dir: string, revision?: string): string;
  /** serve the files of a local folder as repo `id` at `revision` (default 'main') */
  addRepo(id: string, dir: string | null, opts?: { revision?: string; token?: string }): void;
  /** an in-memory file in repo `id` (created if needed), overriding the folder's */
  addFile(id: string, file: string, bytes: Uint8Array | string, revision?: string): void;
  /** hide a file of a repo (404 EntryNotFound) */
  removeFile(id: string, file: string, revision?: string): void;
  /** answer requests for a file with a 302 to `location` */
  redirect(id: string, file: string, location: string, revision?: string): void;
  fault(id: string, file: string, spec: FaultSpec): void;
  throttle(id: string, file: string, pacing: { chunkSize: number; chunkDelayMs: number }): void;
  stats(id: string, file: string): FileStats;
  /** body bytes served over all files */
  totalBytes(): number;
  /** every request, in order */
  readonly log: RequestLog[];
  resetCounters(): void;
  close(): Promise<void>;
}

interface Repo {
  /** the commit this snapshot is (40 hex digits) */
  commit: string;
  dir: string | null;
  token?: string;
  files: Map<string, Uint8Array>;
  hidden: Set<string>;
  redirects: Map<string, string>;
}

const EXPOSE =
  'Content-Length, Content-Range, Content-Type, ETag, Accept-Ranges, X-Error-Code, X-Error-Message, X-Repo-Commit';

function cors(res: http.ServerResponse): void {
  res.setHeader('Access-Control-Allow-Origin', '*');
  res.setHeader('Access-Control-Expose-Headers', EXPOSE);
  res.setHeader('Cross-Origin-Resource-Policy', 'cross-origin');
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export async function startHubServer(): Promise<HubServer> {
  const repos = new Map<string, Repo>(); // key: `${id}@${revision}`
  const faults = new Map<string, FaultSpec[]>(); // key: `${id}/${file}`
  const pacing = new Map<string, { chunkSize: number; chunkDelayMs: number }>();
  const stats = new Map<string, FileStats>();
  const log: RequestLog[] = [];
  const sockets = new Set<Socket>();
  const etags = new WeakMap<Uint8Array, string>();

  const statsOf = (id: string, file: string): FileStats => {
    const k = `${id}/${file}`;
    let s = stats.get(k);
    if (!s) {
      s = { requests: 0, bytes: 0, ranges: [], auth: [], statuses: [] };
      stats.set(k, s);
    }
    return s;
  };
  const commits = new Map<string, Repo>(); // key: `${id}@${commit}`
  let commitSeq = 0;
  const newRepo = (id: string, revision: string, dir: string | null, token?: string): Repo => {
    const commit = createHash('sha1').update(`${id}@${revision}#${commitSeq++}`).digest('hex');
    const r: Repo = { commit, dir, token, files: new Map(), hidden: new Set(), redirects: new Map() };
    repos.set(`${id}@${revision}`, r);
    commits.set(`${id}@${commit}`, r);
    return r;
  };
  const repoOf = (id: string, revision = 'main'): Repo => repos.get(`${id}@${revision}`) ?? newRepo(id, revision, null);
  const etagOf = (bytes: Uint8Array): string => {
    let e = etags.get(bytes);
    if (!e) {
      e = `"${createHash('sha256').update(bytes).digest('hex')}"`;
      etags.set(bytes, e);
    }
    return e;
  };

  /** A file to serve: memory files as they are, folder files read from disk chunk by chunk. */
  interface Body {
    size: number;
    etag: string;
    read(start: number, len: number): Promise<Uint8Array>;
    close(): Promise<void>;
  }

  async function openRepoFile(repo: Repo, file: string): Promise<Body | undefined> {
    if (repo.hidden.has(file)) return undefined;
    const mem = repo.files.get(file);
    if (mem)
      return {
        size: mem.byteLength,
        etag: etagOf(mem),
        read: async (s, n) => mem.subarray(s, s + n),
        close: async () => {},
      };
    if (!repo.dir) return undefined;
    const p = path.resolve(repo.dir, file);
    if (!p.startsWith(path.resolve(repo.dir) + path.sep)) return undefined;
    let fh: fsp.FileHandle;
    try {
      fh = await fsp.open(p, 'r');
    } catch {
      return undefined;
    }
    const st = await fh.stat();
    if (!st.isFile()) {
      await fh.close();
      return undefined;
    }
    return {
      size: st.size,
      etag: `"${st.size.toString(16)}-${Math.floor(st.mtimeMs).toString(16)}"`,
      async read(s, n) {
        const out = new Uint8Array(n);
        let got = 0;
        while (got < n) {
          const { bytesRead } = await fh.read(out, got, n - got, s + got);
          if (bytesRead === 0) break;
          got += bytesRead;
        }
        return out.subarray(0, got);
      },
      close: () => fh.close(),
    };
  }

  const server = http.createServer(async (req, res) => {
    const entry: RequestLog = {
      method: req.method ?? 'GET',
      url: req.url ?? '',
      range: String(req.headers.range ?? ''),
      authorization: String(req.headers.authorization ?? ''),
      status: 0,
      bytes: 0,
    };
    log.push(entry);
    const finish = (status: number, headers: Record<string, string> = {}, body?: string) => {
      entry.status = status;
      res.writeHead(status, headers);
      res.end(body);
    };
    cors(res);
    if (req.method === 'OPTIONS') {
      res.setHeader('Access-Control-Allow-Methods', 'GET, HEAD, OPTIONS');
      res.setHeader('Access-Control-Allow-Headers', 'Range, If-Range, Authorization, Content-Type');
      res.setHeader('Access-Control-Max-Age', '600');
      return finish(204);
    }
    const m = /^\/(.+?)\/resolve\/([^/]+)\/(.+)$/.exec((req.url ?? '').split('?')[0]);
    if (!m) return finish(404, { 'X-Error-Code': 'RepositoryNotFound' }, 'not found');
    const id = decodeURIComponent(m[1]);
    const revision = decodeURIComponent(m[2]);
    const file = m[3].split('/').map(decodeURIComponent).join('/');
    Object.assign(entry, { id, revision, file });
    const st = statsOf(id, file);
    st.requests++;
    st.ranges.push(entry.range);
    st.auth.push(entry.authorization);
    const done = (status: number, headers: Record<string, string> = {}, body?: string) => {
      st.statuses.push(status);
      finish(status, headers, body);
    };

    const repo = repos.get(`${id}@${revision}`) ?? commits.get(`${id}@${revision}`);
    if (!repo) {
      const anyRev = [...repos.keys()].some((k) => k.startsWith(`${id}@`));
      return done(404, { 'X-Error-Code': anyRev ? 'RevisionNotFound' : 'RepositoryNotFound' }, 'not found');
    }
    if (repo.token && req.headers.authorization !== `Bearer ${repo.token}`) {
      return done(401, { 'X-Error-Code': 'GatedRepo' }, 'gated');
    }
    const fq = faults.get(`${id}/${file}`);
    let fault = fq && fq.length ? fq[0] : undefined;
    if (fault?.skip) {
      fault.skip--;
      fault = undefined;
    }
    if (fault) {
      fault.times = (fault.times ?? 1) - 1;
      if (fault.times <= 0) fq!.shift();
      if (fault.delayMs) await sleep(fault.delayMs);
      if (fault.status) return done(fault.status, {}, '');
    }
    const loc = repo.redirects.get(file);
    // the Hub answers LFS files with a 302 to its CDN, carrying the commit on the redirect itself
    if (loc) return done(302, { Location: loc, 'X-Repo-Commit': repo.commit });
    const bytes = await openRepoFile(repo, file);
    if (!bytes) return done(404, { 'X-Error-Code': 'EntryNotFound' }, 'not found');
    try {
      await send(req, res, entry, st, bytes, fault, pacing.get(`${id}/${file}`), done, repo.commit);
    } finally {
      await bytes.close();
    }
  });

  async function send(
    req: http.IncomingMessage,
    res: http.ServerResponse,
    entry: RequestLog,
    st: FileStats,
    bytes: Body,
    fault: FaultSpec | undefined,
    pace: { chunkSize: number; chunkDelayMs: number } | undefined,
    done: (status: number, headers?: Record<string, string>, body?: string) => void,
    commit = '0'.repeat(40),
  ): Promise<void> {
    const size = bytes.size;
    const etag = bytes.etag;
    let start = 0,
      end = size - 1,
      status = 200;
    const range = req.headers.range;
    const ifRange = req.headers['if-range'];
    if (range && (!ifRange || ifRange === etag)) {
      const r = /^bytes=(\d*)-(\d*)$/.exec(range.trim());
      if (!r || (r[1] === '' && r[2] === '')) return done(416, { 'Content-Range': `bytes */${size}` });
      if (r[1] === '') {
        start = Math.max(0, size - Number(r[2]));
      } else {
        start = Number(r[1]);
        if (r[2] !== '') end = Math.min(end, Number(r[2]));
      }
      if (start >= size || start > end) return done(416, { 'Content-Range': `bytes */${size}` });
      status = 206;
    }
    const headers: Record<string, string> = {
      'Content-Type': (entry.file ?? '').endsWith('.json') ? 'application/json' : 'application/octet-stream',
      'Content-Length': String(end - start + 1),
      ETag: etag,
      'Accept-Ranges': 'bytes',
      'X-Repo-Commit': commit,
    };
    if (status === 206) headers['Content-Range'] = `bytes ${start}-${end}/${size}`;
    st.statuses.push(status);
    entry.status = status;
    res.writeHead(status, headers);
    if (req.method === 'HEAD') {
      res.end();
      return;
    }

    const bodyLength = end - start + 1;
    const limit = fault?.cutAfter ?? fault?.stallAfter;
    const sendable = limit != null ? Math.min(limit, bodyLength) : bodyLength;
    const chunk = pace?.chunkSize ?? 64 * 1024;
    let sent = 0;
    while (sent < sendable && !res.destroyed) {
      const piece = await bytes.read(start + sent, Math.min(chunk, sendable - sent));
      if (piece.byteLength === 0) break;
      const ok = res.write(piece);
      sent += piece.byteLength;
      st.bytes += piece.byteLength;
      entry.bytes += piece.byteLength;
      // whichever comes first removes the other: a 'close' listener left per wait piled up on a
      // long download (Node's MaxListenersExceededWarning in bench/page-scale.ts)
      if (!ok)
        await new Promise<void>((r) => {
          const done = () => {
            res.off('drain', done);
            res.off('close', done);
            r();
          };
          res.once('drain', done);
          res.once('close', done);
        });
      if (pace?.chunkDelayMs) await sleep(pace.chunkDelayMs);
    }
    if (fault?.cutAfter != null && sendable < bodyLength) {
      // Let the bytes reach the client, then kill the connection mid-body.
      await new Promise<void>((r) => setTimeout(r, 20));
      res.socket?.destroy();
      return;
    }
    if (fault?.stallAfter != null && sendable < bodyLength) return; // keep the socket open; close() ends it
    res.end();
  }
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;

  return {
    url: `http://127.0.0.1:${port}`,
    port,
    log,
    commitOf: (id, revision = 'main') => repoOf(id, revision).commit,
    moveRevision(id, dir, revision = 'main') {
      return newRepo(id, revision, dir, repos.get(`${id}@${revision}`)?.token).commit;
    },
    addRepo(id, dir, opts = {}) {
      const r = repoOf(id, opts.revision);
      r.dir = dir;
      r.token = opts.token;
    },
    addFile(id, file, bytes, revision) {
      repoOf(id, revision).files.set(file, typeof bytes === 'string' ? new TextEncoder().encode(bytes) : bytes);
      repoOf(id, revision).hidden.delete(file);
    },
    removeFile(id, file, revision) {
      const r = repoOf(id, revision);
      r.files.delete(file);
      r.hidden.add(file);
    },
    redirect(id, file, location, revision) {
      repoOf(id, revision).redirects.set(file, location);
    },
    fault(id, file, spec) {
      const k = `${id}/${file}`;
      faults.set(k, [...(faults.get(k) ?? []), { ...spec }]);
    },
    throttle(id, file, p) {
      pacing.set(`${id}/${file}`, p);
    },
    stats: (id, file) => statsOf(id, file),
    totalBytes: () => [...stats.values()].reduce((a, s) => a + s.bytes, 0),
    resetCounters() {
      stats.clear();
      log.length = 0;
    },
    close() {
      for (const s of sockets) s.destroy();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
