/**
 * Whole CLI calls on the GPT-2-small shape (issue 28 item 3): `loupe trace` against
 * `loupe generate --max-new-tokens 1`, each a whole `node bin/loupe.mjs … --json` process, load
 * included, interleaved round by round (order rotated each round), after one untimed call of each.
 * Reports the best (contention only ever adds time) and the median of each, trace / generate
 * from the best calls and the median of the rounds' side-by-side ratios, by wall clock and by
 * the child's CPU time. Target: trace / generate ≤ 1.15.
 *
 * `--against DIR`: a second checkout (its own bin/loupe.mjs and node_modules), timed in the same
 * rounds, so that a change's before and after are measured side by side at one load.
 * `--phases`: one more call of each operation per checkout, in a process that times its stages
 * (bench/whole-calls-phases.ts), for where trace's extra time goes.
 *
 *   tsx bench/whole-calls.ts [--rounds 5] [--against DIR] [--phases]
 */
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, readFileSync, rmSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { ROOT, median } from './lib';
import { ensureBenchModel } from './model-gen';
import { startResults, type ResultTable } from './results';
import { useScratchCacheDir } from '../tests/helpers/scratch-cache';

const arg = (name: string): string | undefined => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : undefined;
};
const ROUNDS = Number(arg('rounds') ?? 5);
const against = arg('against');
const phases = process.argv.includes('--phases');
const TARGET = 1.15;
/** 16 tokens with the bench model's GPT-2 tokenizer, BOS included */
const PROMPT = 'The quick brown fox jumps over the lazy dog while the cat sleeps in the sun';
const OPS = {
  generate: ['generate', '--max-new-tokens', '1'],
  trace: ['trace'],
} as const;
type Op = keyof typeof OPS;

/** CPU time of this process's waited-for children so far (cutime + cstime of /proc/self/stat), ms */
function childCpuMs(): number {
  const stat = readFileSync('/proc/self/stat', 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // fields 16 and 17 of stat(5), counted from 1 with pid and comm before the ')'
  return ((Number(f[13]) + Number(f[14])) * 1000) / 100;
}

interface Call {
  ms: number;
  cpu_ms: number;
  load1: number;
}

function call(tree: string, model: string, op: Op): Call {
  const c0 = childCpuMs();
  const t0 = performance.now();
  const r = spawnSync(process.execPath, [path.join(tree, 'bin', 'loupe.mjs'), ...OPS[op], model, PROMPT, '--json'], {
    cwd: tree,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
    timeout: 300_000,
  });
  const ms = performance.now() - t0;
  if (r.status !== 0) throw new Error(`${tree}: loupe ${op} exited ${r.status ?? r.signal}: ${r.stderr.slice(-2000)}`);
  const doc = JSON.parse(r.stdout);
  if (doc.operation !== op) throw new Error(`${tree}: loupe ${op} printed no ${op} document`);
  return { ms, cpu_ms: childCpuMs() - c0, load1: os.loadavg()[0] };
}

/** one call in bench/whole-calls-phases.ts on `tree`'s code (a copy of it in that tree's bench/): its stages in ms */
function phaseCall(tree: string, model: string, op: Op): Record<string, number> {
  const own = path.join(ROOT, 'bench', 'whole-calls-phases.ts');
  const script = path.resolve(tree) === ROOT ? own : path.join(tree, 'bench', `.whole-calls-phases-${process.pid}.ts`);
  if (script !== own) copyFileSync(own, script);
  try {
    const r = spawnSync(process.execPath, ['--import', 'tsx', script, op, model, PROMPT], {
      cwd: tree,
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: 300_000,
    });
    if (r.status !== 0)
      throw new Error(`phases ${tree} ${op} exited ${r.status ?? r.signal}: ${r.stderr.slice(-2000)}`);
    return JSON.parse(r.stdout.trim().split('\n').pop()!);
  } finally {
    if (script !== own) rmSync(script, { force: true });
  }
}

const fmt = (x: number, d = 2) => x.toFixed(d);

/** ' (commit abc1234, with uncommitted changes)' for a git checkout, else '' */
function commitOf(dir: string): string {
  const git = (...a: string[]) => spawnSync('git', ['-C', dir, ...a], { encoding: 'utf8' });
  const head = git('rev-parse', '--short', 'HEAD');
  if (head.status !== 0 || git('rev-parse', '--show-toplevel').stdout.trim() !== dir) return '';
  return ` (commit ${head.stdout.trim()}${git('status', '--porcelain', '--untracked-files=no').stdout.trim() ? ', with uncommitted changes' : ''})`;
}

function main() {
  const record = startResults(
    'whole-calls',
    '`loupe trace` / `loupe generate --max-new-tokens 1` as whole processes on the GPT-2-small shape (bench/whole-calls.ts)',
  );
  process.on('exit', useScratchCacheDir()); // the children inherit LOUPE_CACHE_DIR
  const bench = ensureBenchModel(undefined, (m) => console.error(m));
  const trees: { name: string; dir: string }[] = [{ name: `this checkout${commitOf(ROOT)}`, dir: ROOT }];
  if (against) {
    const dir = path.resolve(against);
    if (!existsSync(path.join(dir, 'bin', 'loupe.mjs'))) throw new Error(`--against ${dir}: no bin/loupe.mjs`);
    trees.push({ name: `--against ${against}${commitOf(dir)}`, dir });
  }
  const configs = trees.flatMap((t) => (Object.keys(OPS) as Op[]).map((op) => ({ tree: t, op })));
  for (const c of configs) call(c.tree.dir, bench.dir, c.op); // untimed: tsx's transform cache, the page cache
  const calls = new Map<string, Call[]>(configs.map((c) => [`${c.tree.name}|${c.op}`, []]));
  const rounds: Record<string, number>[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const round: Record<string, number> = {};
    for (let k = 0; k < configs.length; k++) {
      const c = configs[(k + r) % configs.length];
      const x = call(c.tree.dir, bench.dir, c.op);
      calls.get(`${c.tree.name}|${c.op}`)!.push(x);
      round[`${c.tree.name}|${c.op}`] = x.ms;
      round[`${c.tree.name}|${c.op}|cpu`] = x.cpu_ms;
    }
    round.load1 = os.loadavg()[0];
    rounds.push(round);
    console.error(
      `round ${r + 1}/${ROUNDS} (load ${fmt(round.load1, 1)}): ` +
        trees
          .map(
            (t) =>
              `${t.name}: trace ${fmt(round[`${t.name}|trace`], 0)} ms, generate ${fmt(round[`${t.name}|generate`], 0)} ms`,
          )
          .join('; '),
    );
  }

  const head = [
    'checkout',
    'trace: best / median (ms)',
    'generate: best / median (ms)',
    'trace / generate, best calls',
    'median of the rounds’ ratios (wall / CPU)',
    `target ≤ ${TARGET}`,
  ];
  const summary: Record<string, unknown> = {};
  const rows = trees.map((t) => {
    const get = (op: Op) => calls.get(`${t.name}|${op}`)!;
    const best = (op: Op) => Math.min(...get(op).map((x) => x.ms));
    const med = (op: Op) => median(get(op).map((x) => x.ms));
    const ratioBest = best('trace') / best('generate');
    const ratioWall = median(rounds.map((r) => r[`${t.name}|trace`] / r[`${t.name}|generate`]));
    const ratioCpu = median(rounds.map((r) => r[`${t.name}|trace|cpu`] / r[`${t.name}|generate|cpu`]));
    summary[t.name] = { ratio_best: ratioBest, ratio_rounds_wall: ratioWall, ratio_rounds_cpu: ratioCpu };
    return [
      t.name,
      `${fmt(best('trace'), 0)} / ${fmt(med('trace'), 0)}`,
      `${fmt(best('generate'), 0)} / ${fmt(med('generate'), 0)}`,
      `**${fmt(ratioBest)}**`,
      `${fmt(ratioWall)} / ${fmt(ratioCpu)}`,
      ratioBest <= TARGET ? 'met' : 'missed',
    ];
  });
  const tables: ResultTable[] = [{ head, rows }];

  let phaseRows: Record<string, Record<string, number>> | undefined;
  if (phases) {
    phaseRows = {};
    for (const c of configs) {
      console.error(`phases: ${c.tree.name}, ${c.op} …`);
      phaseRows[`${c.tree.name}|${c.op}`] = phaseCall(c.tree.dir, bench.dir, c.op);
    }
    const stages = [...new Set(Object.values(phaseRows).flatMap((p) => Object.keys(p)))];
    tables.push({
      head: ['stage (ms, one call each)', ...configs.map((c) => `${c.tree.name}: ${c.op}`)],
      rows: stages.map((s) => [s, ...configs.map((c) => fmt(phaseRows![`${c.tree.name}|${c.op}`][s] ?? NaN, 0))]),
    });
  }

  const loads = rounds.map((r) => r.load1);
  const notes = [
    `Each call is a whole \`node bin/loupe.mjs <op> <bench model> "${PROMPT}" --json\` process (load, operation, document, exit), ` +
      `onnxruntime-node with its default threads, the bench model with random F32 weights; ${ROUNDS} rounds, each calling every ` +
      `configuration once in an order rotated each round, after one untimed call of each. CPU = the child's user + system time. ` +
      `Load average (1 min) over the rounds ${fmt(Math.min(...loads), 1)}–${fmt(Math.max(...loads), 1)} on ${os.cpus().length} cores.`,
    ...(phases
      ? [
          'Stages: one more call of each in a process that runs the CLI’s steps itself (bench/whole-calls-phases.ts): ' +
            'module imports, the model load, the operation (with the engine calls inside it), the document’s JSON, dispose.',
        ]
      : []),
  ];
  for (const t of tables)
    console.log([t.head, t.head.map(() => '---'), ...t.rows].map((r) => `| ${r.join(' | ')} |`).join('\n') + '\n');
  for (const n of notes) console.log(n);
  record.save(tables, notes, { rounds, calls: Object.fromEntries(calls), summary, phases: phaseRows });
}

main();
