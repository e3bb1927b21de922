/**
 * A hostile Hugging Face Hub on 127.0.0.1 (tests only): the repository's name picks the attack
 * and its size, so one server answers every attack of the suite and a model spec says it all.
 *
 *   const hub = await startHostileHub(path.join(SHARED, 'models/stories260K'));
 *   loupe trace attack/gzip-weights-5000000 …      (HF_ENDPOINT=hub.url)
 *   hub.files('attack/gzip-weights-5000000')         // what the plan judged: file -> honest size
 *
 * Every repository is the bundled stories260K model (served honestly, with Range, ETag and
 * X-Repo-Commit like the Hub) except for what its attack changes. Attacks (`attack/<kind>-<n>`):
 *   layers-N         config.json claims N layers (failure 1)
 *   badjson          config.json that is not JSON (it must not be cached)
 *   shards-C-H       an index of C shards, each with a legal H-byte header (failure 2)
 *   template-N       a chat_template looping range(N) (failure 3)
 *   regex            a normalizer that backtracks exponentially, refused when loaded (failure 4)
 *   regex-poly-K     a normalizer of K adjacent repetitions, polynomial: slow, not refused (failure 4)
 *   gzip-weights-N   the weights' download answered 200 + gzip, N bytes past the planned size (failure 6)
 *   chunked-weights-N the same, chunked without Content-Length (failure 6)
 *   gzip-config-N    config.json as a gzip bomb of N decoded bytes (failure 7)
 *   gzip-tokenizer-N tokenizer.json as a gzip bomb of N decoded bytes (failure 7)
 *   sae-header-N     an SAE whose cfg.json says 64×16 but whose header holds N bytes of W_enc (failure 8)
 *   sae-body-N       an SAE with an honest small header whose body runs N bytes past it (failure 8)
 *   trickle-MS       config.json one byte every MS ms (under the idle timeout, past the deadline) (failure 10)
 *   stall            config.json's headers, then silence (failure 10)
 *   huge-length      the weights' download declares Content-Length 2^50
 *   i32              a weight tensor stored as I32
 *   plain            the model as it is (the control)
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import * as http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import * as path from 'node:path';
import { createGzip, gzipSync } from 'node:zlib';

/** A file served by byte range, generated on demand (a 99 MB header is never held). */
export interface VirtualFile {
  size: number;
  read(start: number, len: number): Uint8Array;
}

const mem = (b: Uint8Array): VirtualFile => ({ size: b.byteLength, read: (s, n) => b.subarray(s, s + n) });
const json = (v: unknown): VirtualFile => mem(new TextEncoder().encode(JSON.stringify(v)));

/** A safetensors file: `pad` bytes of __metadata__ in the header, data from `data` (or zeros). */
function safetensors(
  tensors: Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>,
  dataLength: number,
  opts: { pad?: number; data?: Uint8Array } = {},
): VirtualFile {
  const pad = opts.pad ?? 0;
  const head = JSON.stringify({ ...tensors, __metadata__: { pad: '' } });
  // the header is head with `pad` spaces inside the metadata string: "pad":"<spaces>"
  const cut = head.lastIndexOf('""') + 1;
  const before = new TextEncoder().encode(head.slice(0, cut));
  const after = new TextEncoder().encode(head.slice(cut));
  const n = before.byteLength + pad + after.byteLength;
  const prefix = new Uint8Array(8);
  new DataView(prefix.buffer).setBigUint64(0, BigInt(n), true);
  const dataStart = 8 + n;
  return {
    size: dataStart + dataLength,
    read(start, len) {
      const out = new Uint8Array(Math.max(0, Math.min(len, dataStart + dataLength - start)));
      const end = start + out.byteLength;
      // the file's pieces in order: [from, to) and the bytes they hold (null: spaces or zeros)
      const pieces: [number, number, Uint8Array | null, number][] = [
        [0, 8, prefix, 0],
        [8, 8 + before.byteLength, before, 0],
        [8 + before.byteLength, 8 + before.byteLength + pad, null, 32],
        [8 + before.byteLength + pad, dataStart, after, 0],
        [dataStart, dataStart + dataLength, opts.data ?? null, 0],
      ];
      for (const [from, to, bytes, fill] of pieces) {
        const lo = Math.max(from, start),
          hi = Math.min(to, end);
        if (lo >= hi) continue;
        if (bytes) out.set(bytes.subarray(lo - from, hi - from), lo - start);
        else out.fill(fill, lo - start, hi - start);
      }
      return out;
    },
  };
}

/** One gzip member of 1 MiB of zeros: a bomb of N bytes is this member repeated (gunzip reads every member). */
const ZERO_MEMBER = gzipSync(new Uint8Array(1 << 20), { level: 9 });

export interface Attack {
  /** files that differ from the model's own */
  files: Record<string, VirtualFile>;
  /** a file answered in its own way (the rest are served honestly) */
  answer?: Record<string, (req: http.IncomingMessage, res: http.ServerResponse, honest: VirtualFile) => Promise<void>>;
}

export interface HostileHub {
  readonly url: string;
  /** every request: repository, file, Range, status */
  readonly log: { id: string; file: string; range: string; status: number }[];
  /** the files of a repository as served (the size a plan should judge for each) */
  files(id: string): Map<string, VirtualFile>;
  close(): Promise<void>;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export async function startHostileHub(modelDir: string): Promise<HostileHub> {
  const base = new Map<string, VirtualFile>();
  for (const f of [
    'config.json',
    'tokenizer.json',
    'tokenizer_config.json',
    'generation_config.json',
    'model.safetensors',
  ])
    base.set(f, mem(new Uint8Array(readFileSync(path.join(modelDir, f)))));
  const config = JSON.parse(new TextDecoder().decode(base.get('config.json')!.read(0, 1e9)));
  const tokenizer = JSON.parse(new TextDecoder().decode(base.get('tokenizer.json')!.read(0, 1e9)));
  const weights = base.get('model.safetensors')!.read(0, 1e9);
  const headerLength = Number(new DataView(weights.buffer, weights.byteOffset, 8).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(weights.subarray(8, 8 + headerLength)));
  const withNormalizer = (pattern: string) => ({
    ...tokenizer,
    normalizer: {
      type: 'Sequence',
      normalizers: [tokenizer.normalizer, { type: 'Replace', pattern: { Regex: pattern }, content: '▁' }],
    },
  });

  /** The honest weights, then `extra` more bytes, as the answer to the download (not to the header's range reads). */
  const overlong =
    (extra: number, how: 'gzip' | 'chunked' | 'huge-length') =>
    async (req: http.IncomingMessage, res: http.ServerResponse, honest: VirtualFile): Promise<void> => {
      const range = /^bytes=(\d+)-(\d*)$/.exec(String(req.headers.range ?? ''));
      // the preflight's header reads (a closed range) are answered honestly
      if (range && range[2] !== '') return serve(req, res, honest);
      const headers: Record<string, string> = {
        ETag: '"w"',
        'Accept-Ranges': 'bytes',
        'X-Repo-Commit': '1'.repeat(40),
      };
      const size = honest.size + Math.max(0, extra);
      const zeros = new Uint8Array(1 << 16);
      const chunks = function* () {
        for (let off = 0; off < size; off += 1 << 16)
          yield off < honest.size
            ? honest.read(off, Math.min(1 << 16, honest.size - off))
            : zeros.subarray(0, Math.min(1 << 16, size - off));
      };
      const send = async (w: { write(c: Uint8Array): boolean; once(e: 'drain', f: () => void): unknown }) => {
        for (const c of chunks()) {
          if (res.destroyed) return;
          if (!w.write(c)) await new Promise<void>((r) => w.once('drain', () => r()));
        }
      };
      if (how === 'gzip') {
        res.writeHead(200, { ...headers, 'Content-Encoding': 'gzip' });
        const z = createGzip({ level: 1 });
        z.pipe(res);
        await send(z);
        z.end();
      } else if (how === 'chunked') {
        res.writeHead(200, headers); // no Content-Length: Node sends it chunked
        await send(res);
        res.end();
      } else {
        res.writeHead(200, { ...headers, 'Content-Length': String(2 ** 50) });
        await send(res);
        await sleep(500);
        res.destroy();
      }
    };

  const bomb =
    (decoded: number) =>
    async (_req: http.IncomingMessage, res: http.ServerResponse): Promise<void> => {
      res.writeHead(200, {
        'Content-Encoding': 'gzip',
        'Content-Type': 'application/json',
        'X-Repo-Commit': '1'.repeat(40),
      });
      for (let sent = 0; sent < decoded && !res.destroyed; sent += 1 << 20)
        if (!res.write(ZERO_MEMBER)) await new Promise((r) => res.once('drain', r));
      res.end();
    };

  function attackOf(id: string): Attack | undefined {
    const m = /^attack\/([a-z0-9-]+?)(?:-(\d+))?(?:-(\d+))?$/.exec(id);
    if (!m) return undefined;
    const [kind, a, b] = [m[1], Number(m[2] ?? 0), Number(m[3] ?? 0)];
    switch (kind) {
      case 'plain':
        return { files: {} };
      case 'badjson':
        return { files: { 'config.json': mem(new TextEncoder().encode('{"model_type": "llama", ')) } };
      case 'layers':
        return { files: { 'config.json': json({ ...config, num_hidden_layers: a }) } };
      case 'shards': {
        // shard 1 holds the model's tensors; the others a 4-byte tensor each and an a-byte header
        const names = Array.from(
          { length: a },
          (_, i) => `model-${String(i + 1).padStart(5, '0')}-of-${String(a).padStart(5, '0')}.safetensors`,
        );
        const weight_map: Record<string, string> = {};
        for (const t of Object.keys(header)) if (t !== '__metadata__') weight_map[t] = names[0];
        const files: Record<string, VirtualFile> = { 'model.safetensors': undefined as unknown as VirtualFile };
        files[names[0]] = base.get('model.safetensors')!;
        for (let i = 1; i < a; i++) {
          weight_map[`pad.${i}`] = names[i];
          files[names[i]] = safetensors({ [`pad.${i}`]: { dtype: 'F32', shape: [1], data_offsets: [0, 4] } }, 4, {
            pad: b,
          });
        }
        files['model.safetensors.index.json'] = json({ metadata: {}, weight_map });
        return { files };
      }
      case 'template':
        return {
          files: {
            'tokenizer_config.json': json({
              ...JSON.parse(new TextDecoder().decode(base.get('tokenizer_config.json')!.read(0, 1e9))),
              chat_template: `{% for i in range(${a}) %}{{ messages[0]['content'] }}{% endfor %}`,
            }),
          },
        };
      case 'regex':
        return { files: { 'tokenizer.json': json(withNormalizer('([^\\d]+)+\\d')) } };
      case 'regex-poly':
        return { files: { 'tokenizer.json': json(withNormalizer(`${'▁*'.repeat(Math.max(2, a))}!`)) } };
      case 'gzip-weights':
        return { files: {}, answer: { 'model.safetensors': overlong(a, 'gzip') } };
      case 'chunked-weights':
        return { files: {}, answer: { 'model.safetensors': overlong(a, 'chunked') } };
      case 'huge-length':
        return { files: {}, answer: { 'model.safetensors': overlong(0, 'huge-length') } };
      case 'gzip-config':
        return { files: {}, answer: { 'config.json': bomb(a) } };
      case 'gzip-tokenizer':
        return { files: {}, answer: { 'tokenizer.json': bomb(a) } };
      case 'i32': {
        const t = { ...header };
        const name = Object.keys(t).find((k) => k.endsWith('q_proj.weight'))!;
        t[name] = { ...t[name], dtype: 'I32' };
        const data = weights.subarray(8 + headerLength);
        return { files: { 'model.safetensors': safetensors(stripMeta(t), data.byteLength, { data }) } };
      }
      case 'sae-header':
      case 'sae-body': {
        const dIn = 64,
          dSae = 16;
        const cfg = json({
          architecture: 'standard',
          d_in: dIn,
          d_sae: dSae,
          hook_name: 'blocks.0.hook_resid_pre',
          dtype: 'float32',
          apply_b_dec_to_input: true,
        });
        // sae-header: W_enc claims [64, a/256] (a bytes); sae-body: an honest 64×16 SAE, answered with a more bytes
        const cols = kind === 'sae-header' ? Math.max(dSae + 1, Math.floor(a / 256)) : dSae;
        const shapes: [string, number[]][] = [
          ['W_enc', [dIn, cols]],
          ['b_enc', [cols]],
          ['W_dec', [cols, dIn]],
          ['b_dec', [dIn]],
        ];
        const tensors: Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }> = {};
        let off = 0;
        for (const [n, s] of shapes) {
          const bytes = s.reduce((x, y) => x * y, 1) * 4;
          tensors[n] = { dtype: 'F32', shape: s, data_offsets: [off, off + bytes] };
          off += bytes;
        }
        const sae = safetensors(tensors, off);
        return {
          files: { 'cfg.json': cfg, 'sae_weights.safetensors': sae },
          ...(kind === 'sae-body' ? { answer: { 'sae_weights.safetensors': overlong(a, 'chunked') } } : {}),
        };
      }
      case 'trickle':
        return {
          files: {},
          answer: {
            'config.json': async (_req, res, honest) => {
              res.writeHead(200, { 'Content-Length': String(honest.size), 'X-Repo-Commit': '1'.repeat(40) });
              for (let i = 0; i < honest.size && !res.destroyed; i++) {
                res.write(honest.read(i, 1));
                await sleep(Math.max(10, a));
              }
              res.end();
            },
          },
        };
      case 'stall':
        return {
          files: {},
          answer: {
            'config.json': async (_req, res, honest) => {
              res.writeHead(200, { 'Content-Length': String(honest.size) });
              res.write(honest.read(0, 10));
              // then nothing: the socket stays open until close()
            },
          },
        };
      default:
        return undefined;
    }
  }

  const stripMeta = (t: Record<string, unknown>) => {
    const { __metadata__: _, ...rest } = t;
    return rest as Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>;
  };

  const filesOf = (id: string): Map<string, VirtualFile> | undefined => {
    const a = attackOf(id);
    if (!a) return undefined;
    const out = new Map(base);
    for (const [f, v] of Object.entries(a.files))
      if (v) out.set(f, v);
      else out.delete(f);
    return out;
  };

  async function serve(req: http.IncomingMessage, res: http.ServerResponse, file: VirtualFile): Promise<void> {
    const etag = `"${createHash('sha1').update(String(file.size)).update(file.read(0, 64)).digest('hex')}"`;
    let start = 0,
      end = file.size - 1,
      status = 200;
    const r = /^bytes=(\d+)-(\d*)$/.exec(String(req.headers.range ?? ''));
    const ifRange = req.headers['if-range'];
    if (r && (!ifRange || ifRange === etag)) {
      start = Number(r[1]);
      if (r[2] !== '') end = Math.min(end, Number(r[2]));
      if (start >= file.size || start > end) {
        res.writeHead(416, { 'Content-Range': `bytes */${file.size}` });
        return void res.end();
      }
      status = 206;
    }
    res.writeHead(status, {
      'Content-Length': String(end - start + 1),
      ETag: etag,
      'Accept-Ranges': 'bytes',
      'X-Repo-Commit': '1'.repeat(40),
      ...(status === 206 ? { 'Content-Range': `bytes ${start}-${end}/${file.size}` } : {}),
    });
    for (let off = start; off <= end && !res.destroyed; off += 1 << 20) {
      const piece = file.read(off, Math.min(1 << 20, end - off + 1));
      if (!res.write(piece)) await new Promise((ok) => res.once('drain', ok));
    }
    res.end();
  }

  const log: HostileHub['log'] = [];
  const sockets = new Set<Socket>();
  const server = http.createServer((req, res) => {
    const m = /^\/(.+?)\/resolve\/([^/]+)\/(.+)$/.exec((req.url ?? '').split('?')[0]);
    const id = m ? decodeURIComponent(m[1]) : '';
    const file = m ? m[3].split('/').map(decodeURIComponent).join('/') : '';
    const entry = { id, file, range: String(req.headers.range ?? ''), status: 0 };
    log.push(entry);
    res.on('finish', () => (entry.status = res.statusCode));
    const files = m ? filesOf(id) : undefined;
    if (!files) {
      res.writeHead(404, { 'X-Error-Code': 'RepositoryNotFound' });
      return void res.end('not found');
    }
    const honest = files.get(file);
    const answer = attackOf(id)!.answer?.[file];
    if (!honest && !answer) {
      res.writeHead(404, { 'X-Error-Code': 'EntryNotFound' });
      return void res.end('not found');
    }
    (answer ? answer(req, res, honest ?? mem(new Uint8Array(0))) : serve(req, res, honest!)).catch(() => res.destroy());
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((ok) => server.listen(0, '127.0.0.1', ok));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    log,
    files: (id) => filesOf(id) ?? new Map(),
    close() {
      for (const s of sockets) s.destroy();
      return new Promise<void>((ok) => server.close(() => ok()));
    },
  };
}
