/**
 * The hostile Hub against whole processes (issue 22, item 7): a headless companion and the CLI,
 * each a child process with its own cache, pointed at a hostile Hub stand-in on 127.0.0.1
 * (tests/helpers/hostile-hub.ts: the repository's name picks the attack, its size drawn from a
 * seed). Every class of the issue: model dimensions, shard counts and header bytes, chat-template
 * loops, a backtracking tokenizer regex, weights past the plan (gzip, chunked, Content-Length 2^50),
 * gzip bombs of small files, an SAE bigger than its cfg.json, stalled and trickling servers, I32
 * weights, dot revisions, and text fields past the character cap. After each attack:
 *   - the process is alive (companion) or has exited 1 or 3 with one structured JSON error (CLI);
 *   - its peak RSS (VmHWM; the CLI's from /usr/bin/time) stayed under PEAK_BYTES;
 *   - the cache grew by no more than the attacked repository's honest files (the plan);
 *   - the companion answers loupe_status and gives the same trace as before the first attack.
 * And the engine thread (bridge/headless-engine.ts) past its heap limit: TOO_LARGE, and it is replaced.
 * The in-process checks of each fix are in hardening-downloads/hardening-limits.test.ts.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CAPS, maxTextChars } from '../src/engine/caps';
import { startHostileHub, type HostileHub } from './helpers/hostile-hub';
import { BIN, Companion, ROOT, int, rng } from './helpers/hostile';
import { SHARED } from './helpers/shared';
import { ThreadExecutor } from '../src/bridge/headless-engine';
import { toLoupeError } from '../src/engine/errors';

const SEED = Number(process.env.LOUPE_HOSTILE_SEED ?? 20261202);
/** peak resident memory any process may reach during an attack (the old code reached 3.2–6.7 GB) */
const PEAK_BYTES = 1.5 * 1024 ** 3;
const HANG_MS = 45_000;
/** the companion's call deadline */
const DEADLINE_S = 10;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** the cache's own records beside the files (ETags, commits, markers of absent optional files) */
const METADATA_BYTES = 64 * 1024;
const TRACE_ARGS = { prompt: 'Once upon a time, there was a little', top_k: 5 };

const r = rng(SEED);
/** each attack: its repository, and the structured codes it may end in */
const ATTACKS: { id: string; codes: string[]; tool?: string; args?: Record<string, unknown> }[] = [
  { id: `attack/layers-${int(r, CAPS.maxLayers + 1, 1e9)}`, codes: ['BAD_CONFIG'] },
  { id: 'attack/badjson', codes: ['BAD_CONFIG'] },
  { id: `attack/shards-${int(r, CAPS.maxShards + 1, CAPS.maxShards + 300)}-0`, codes: ['TOO_LARGE'] },
  { id: `attack/shards-${int(r, 14, 20)}-${int(r, 10_000_000, 12_000_000)}`, codes: ['TOO_LARGE'] },
  { id: 'attack/regex', codes: ['UNSUPPORTED_CONFIG'] },
  { id: `attack/gzip-weights-${int(r, 2e6, 2e7)}`, codes: ['TOO_LARGE'] },
  { id: `attack/chunked-weights-${int(r, 2e6, 2e7)}`, codes: ['TOO_LARGE'] },
  { id: 'attack/huge-length', codes: ['TOO_LARGE'] },
  { id: `attack/gzip-config-${int(r, CAPS.maxConfigBytes + 1, 3e8)}`, codes: ['TOO_LARGE'] },
  {
    id: `attack/gzip-tokenizer-${int(r, CAPS.maxTokenizerBytes + 1, CAPS.maxTokenizerBytes + 3e7)}`,
    codes: ['TOO_LARGE'],
  },
  { id: 'attack/trickle-300', codes: ['DEADLINE_EXCEEDED'] },
  // the idle timeout (2 s) or, on a loaded machine, the request's deadline (3 s) fires first
  { id: 'attack/stall', codes: ['NETWORK_ERROR', 'DEADLINE_EXCEEDED'] },
  { id: 'attack/i32', codes: ['SAFETENSORS_UNKNOWN_DTYPE'] },
  { id: 'attack/plain@..', codes: ['BAD_INPUT'] },
  { id: `attack/plain@${'r'.repeat(int(r, CAPS.maxNameChars + 1, 5000))}`, codes: ['BAD_INPUT'] },
];
/** attacks on a loaded model: an SAE bigger than its cfg.json, a looping chat template, over-long text fields */
const SAE_ATTACKS = [`attack/sae-header-${int(r, 1e8, 4e8)}`, `attack/sae-body-${int(r, 1e7, 3e7)}`];
const TEMPLATE = `attack/template-${int(r, 1e6, 1e9)}`;
const longText = (nCtx: number) => 'a'.repeat(maxTextChars(nCtx) + int(r, 1, 1e6));

let hub: HostileHub;
const tmp: string[] = [];
const mk = (p: string) => {
  const d = mkdtempSync(path.join(os.tmpdir(), p));
  tmp.push(d);
  return d;
};
const du = (d: string): number =>
  existsSync(d)
    ? readdirSync(d, { withFileTypes: true }).reduce(
        (n, e) => n + (e.isDirectory() ? du(path.join(d, e.name)) : statSync(path.join(d, e.name)).size),
        0,
      )
    : 0;
/** the honest files of a repository: what a plan may bring into the cache at most */
const planBytes = (id: string) => [...hub.files(id.replace(/@.*$/, '')).values()].reduce((n, f) => n + f.size, 0);
/** idle timeout and deadline short enough for the stalling attacks (the CLIs run side by side: more room) */
const env = (cache: string, idle = 2, deadline = 3): NodeJS.ProcessEnv => ({
  ...process.env,
  LOUPE_CONFIG_DIR: path.join(mk('loupe-hc-cfg-'), 'loupe'),
  LOUPE_CACHE_DIR: cache,
  HF_ENDPOINT: hub.url,
  LOUPE_IDLE_TIMEOUT: String(idle),
  LOUPE_REQUEST_DEADLINE: String(deadline),
});
const peak = (pid: number): number => {
  const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : 0;
};
const tally = { inputs: 0, crashes: 0, hangs: 0, companionPeak: 0, cliPeak: 0 };
const mb = (b: number) => `${(b / 2 ** 20).toFixed(0)} MiB`;

beforeAll(async () => {
  hub = await startHostileHub(path.join(SHARED, 'models/stories260K'));
});
afterAll(async () => {
  await hub?.close();
  for (const d of tmp) rmSync(d, { recursive: true, force: true });
  console.log(
    `[hostile-hub] seed ${SEED}: ${tally.inputs} hostile inputs to the companion and the CLI, ${tally.crashes} crashes, ${tally.hangs} hangs; peak RSS: companion ${mb(tally.companionPeak)}, CLI ${mb(tally.cliPeak)}`,
  );
});

type Reply = Record<string, unknown> | 'timeout';
/** the structured error code of a tools/call reply, or 'ok' */
function codeOf(res: Reply): string {
  if (res === 'timeout') return 'timeout';
  const result = res.result as { isError?: boolean; content?: { text: string }[] } | undefined;
  if (!result) return `rpc-error ${JSON.stringify(res.error)}`;
  if (!result.isError) return 'ok';
  return (JSON.parse(result.content![0].text) as { error: { code: string } }).error.code;
}

describe('a headless companion attacked by a hostile Hub', () => {
  let c: Companion;
  let cache: string;
  let baseline: unknown;
  const call = async (tool: string, args: Record<string, unknown>): Promise<Reply> => {
    const res = await c.callRaw(tool, JSON.stringify(args), HANG_MS);
    if (res === 'timeout') tally.hangs++;
    return res;
  };
  const trace = async () => ((await call('trace', TRACE_ARGS)) as { result: { structuredContent: unknown } }).result;

  beforeAll(async () => {
    cache = mk('loupe-hc-cache-');
    c = new Companion(['--headless', '--deadline', String(DEADLINE_S)], env(cache));
    await c.initialize();
    baseline = (await trace()).structuredContent;
    expect(baseline).toMatchObject({ operation: 'trace' });
  });
  afterAll(async () => {
    await c?.close();
  });

  /** after an attack: alive, bounded, loupe_status answers, the same trace (on the bundled model) */
  async function after(what: string, cacheBefore: number, plan: number): Promise<void> {
    if (!c.alive) tally.crashes++;
    expect(c.alive, `${what}: the companion exited ${JSON.stringify(c.exited)}\n${c.stderr.slice(-2000)}`).toBe(true);
    tally.companionPeak = Math.max(tally.companionPeak, peak(c.child.pid!));
    expect(tally.companionPeak, `${what}: peak RSS`).toBeLessThan(PEAK_BYTES);
    expect(du(cache) - cacheBefore, `${what}: bytes the cache gained`).toBeLessThanOrEqual(plan + METADATA_BYTES);
    expect(codeOf(await call('loupe_status', {})), `${what}: loupe_status`).toBe('ok');
    expect(codeOf(await call('load_model', { model: 'default' }))).toBe('ok');
    expect((await trace()).structuredContent, `${what}: the trace after it`).toEqual(baseline);
  }

  it(`load_model of ${ATTACKS.length} hostile repositories: each a structured error`, async () => {
    for (const a of ATTACKS) {
      const before = du(cache);
      tally.inputs++;
      const code = codeOf(await call('load_model', { model: a.id }));
      expect(a.codes, `${a.id.slice(0, 80)}: ${code}`).toContain(code);
      await after(a.id.slice(0, 80), before, planBytes(a.id));
    }
  });

  it('a tokenizer that runs for ever (a polynomial regex on a run of spaces): the deadline and loupe_status answer meanwhile', async () => {
    const before = du(cache);
    const id = `attack/regex-poly-${int(r, 4, 6)}`;
    expect(codeOf(await call('load_model', { model: id }))).toBe('ok');
    tally.inputs++;
    const t0 = Date.now();
    // under the character cap (n_ctx 512 × 64), so it reaches the tokenizer
    const run = call('trace', { prompt: ' '.repeat(30_000) });
    await sleep(1500);
    const st = await c.callRaw('loupe_status', '{}', 5000);
    expect(codeOf(st), 'loupe_status while the tokenizer runs').toBe('ok');
    expect(
      (st as { result: { structuredContent: { engine_thread: { busy: boolean } } } }).result.structuredContent,
    ).toMatchObject({ engine_thread: { busy: true } });
    expect(codeOf(await run)).toBe('DEADLINE_EXCEEDED');
    expect(Date.now() - t0, 'answered at the deadline').toBeLessThan((DEADLINE_S + 5) * 1000);
    await after(id, before, planBytes(id));
  });

  it('an SAE whose weights are larger than its cfg.json says (header, then body)', async () => {
    for (const id of SAE_ATTACKS) {
      const before = du(cache);
      tally.inputs++;
      const code = codeOf(await call('sae_features', { prompt: 'Once upon a time', sae_source: id, sae_path: '' }));
      expect(['TOO_LARGE', 'SAE_MISMATCH'], `${id}: ${code}`).toContain(code);
      await after(id, before, 1 << 20);
    }
  });

  it('a chat template that loops, and text fields past the character cap before tokenizing', async () => {
    const before = du(cache);
    expect(codeOf(await call('load_model', { model: TEMPLATE }))).toBe('ok');
    tally.inputs++;
    expect(codeOf(await call('trace', { ...TRACE_ARGS, chat: true }))).toBe('BAD_CHAT_TEMPLATE');
    await after(TEMPLATE, before, planBytes(TEMPLATE));
    const nCtx = (baseline as { model: { n_ctx: number } }).model.n_ctx;
    for (const [tool, args] of [
      ['trace', { prompt: longText(nCtx) }],
      ['trace', { prompt: 'Once upon a time', answer: longText(nCtx) }],
      ['patch', { prompt: 'Once upon a time', corrupted_prompt: 'Once upon a day', answer: longText(nCtx) }],
      ['steer', { prompt: 'Once upon a time', targets: [longText(nCtx)] }],
    ] as const) {
      tally.inputs++;
      const code = codeOf(await call(tool, args));
      expect(['PROMPT_TOO_LONG', 'BAD_INPUT'], `${tool}: ${code}`).toContain(code);
    }
    await after('text fields', du(cache), 0);
  });
});

describe('the CLI attacked by a hostile Hub', () => {
  const cli = (id: string, cache: string) =>
    new Promise<{ code: number; stdout: string; peak: number }>((res) => {
      execFile(
        '/usr/bin/time',
        ['-f', 'maxrss %M', process.execPath, BIN, 'trace', id, 'Once upon a time', '--json'],
        { cwd: ROOT, env: env(cache, 10, 20), maxBuffer: 16 << 20, timeout: HANG_MS },
        (err, stdout, stderr) => {
          const code = err
            ? typeof (err as { code?: unknown }).code === 'number'
              ? (err as { code: number }).code
              : -1
            : 0;
          const m = /maxrss (\d+)/.exec(stderr);
          res({ code, stdout, peak: m ? Number(m[1]) * 1024 : Infinity });
        },
      );
    });

  it.runIf(existsSync('/usr/bin/time'))(
    'one attack of each download class: exit 1, one JSON error, bounded',
    async () => {
      const picks = ['layers', 'shards', 'chunked-weights', 'gzip-config', 'stall'].map((k) =>
        ATTACKS.find((a) => a.id.startsWith(`attack/${k}-`) || a.id === `attack/${k}`)!,
      );
      await Promise.all(
        picks.map(async (a) => {
          const cache = mk('loupe-hc-cli-');
          tally.inputs++;
          const out = await cli(a.id, cache);
          if (out.code === -1) tally.hangs++;
          const lines = out.stdout.trim().split('\n');
          expect(lines, a.id).toHaveLength(1);
          const doc = JSON.parse(lines[0]) as { error: { code: string } };
          // exit 1 (a runtime error) or 3 (a model too large, found before any weight byte): never a crash
          expect(
            [[1, 3].includes(out.code), a.codes.includes(doc.error.code)],
            `${a.id}: ${out.code} ${lines[0].slice(0, 300)}`,
          ).toEqual([true, true]);
          tally.cliPeak = Math.max(tally.cliPeak, out.peak);
          expect(out.peak, `${a.id}: peak RSS`).toBeLessThan(PEAK_BYTES);
          expect(du(cache), `${a.id}: cache`).toBeLessThanOrEqual(planBytes(a.id) + METADATA_BYTES);
        }),
      );
    },
  );
});

describe('the headless engine thread past its heap limit', () => {
  it('a run that needs more heap than the thread may have: TOO_LARGE, the thread replaced, the executor answers', async () => {
    // 6 MiB: loading even the bundled model needs more, so the first call reaches the limit
    const ex = new ThreadExecutor({ heapMiB: 6 });
    try {
      const e = await ex.execute('trace', TRACE_ARGS, { deadline: Date.now() + HANG_MS }).then(
        () => null,
        (err) => toLoupeError(err),
      );
      expect([e?.code, e?.message]).toEqual(['TOO_LARGE', expect.stringContaining('engineHeapMiB')]);
      expect(await ex.status()).toMatchObject({ engine_thread: { busy: false, restarts: 1 } });
    } finally {
      await ex.close();
    }
  });
});
