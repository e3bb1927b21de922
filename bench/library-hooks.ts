/**
 * What a library hook function costs (src/library/model.ts runWithHooks: each site whose value a
 * function changes is fed back as a patch intervention and the forward re-run), against the
 * engine's fixed interventions (data, one forward), on the GPT-2-small-shaped bench model, batch 1,
 * onnxruntime-node, interleaved run by run (bench/lib.ts timeInterleaved):
 *
 *  - forward                      model.run fetching no hooks
 *  - fixed intervention           model.run with a `scale` 0.5 at blocks.6.hook_resid_mid
 *  - runWithHooks, 1 reading fn   a function at blocks.6.hook_resid_mid that returns nothing
 *  - runWithHooks, 1 editing fn   x·0.5 in JavaScript at the same site (the fixed intervention's result)
 *  - runWithHooks, 3 editing fns  x·0.5 at blocks.2/6/10.hook_resid_mid
 *
 *   tsx bench/library-hooks.ts [--T 16,128] [--reps 5]
 */
import * as os from 'node:os';
import { loadModel, tensor } from '../src/library';
import { timeInterleaved } from './lib';
import { ensureBenchModel, randomIds } from './model-gen';
import { startResults, type ResultTable } from './results';

const arg = (name: string): string | undefined => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : undefined;
};
const Ts = (arg('T') ?? '16,128').split(',').map(Number);
const REPS = Number(arg('reps') ?? 5);
const fmt = (x: number, d = 1) => x.toFixed(d);

async function main() {
  const record = startResults(
    'library-hooks',
    'A library hook function against a fixed intervention (bench/library-hooks.ts)',
  );
  const bench = ensureBenchModel(undefined, (m) => console.error(m));
  const threads = os.cpus().length;
  const model = await loadModel(bench.dir, { backend: 'node', threads });
  const half = (x: tensor.Tensor) => tensor.map(x, (v) => 0.5 * v);
  const site = (l: number) => `blocks.${l}.hook_resid_mid`;
  const tables: ResultTable[] = [];
  const raw: Record<string, unknown> = {};
  for (const T of Ts) {
    const ids = [randomIds(T, model.cfg.d_vocab, 2000 + T)];
    const r = await timeInterleaved(
      [
        { name: 'forward (model.run, no hooks)', fn: () => model.engine.run(ids, { hooks: [] }) },
        {
          name: 'fixed intervention (scale 0.5 at one site)',
          fn: () => model.engine.run(ids, { hooks: [], interventions: [{ hook: site(6), op: 'scale', alpha: 0.5 }] }),
        },
        { name: 'runWithHooks, 1 reading fn', fn: () => model.runWithHooks(ids, { fwdHooks: [[site(6), () => {}]] }) },
        {
          name: 'runWithHooks, 1 editing fn (x·0.5)',
          fn: () => model.runWithHooks(ids, { fwdHooks: [[site(6), half]] }),
        },
        {
          name: 'runWithHooks, 3 editing fns',
          fn: () =>
            model.runWithHooks(ids, { fwdHooks: [2, 6, 10].map((l) => [site(l), half] as [string, typeof half]) }),
        },
      ],
      2,
      REPS,
      { settle: true },
    );
    raw[String(T)] = r;
    const base = r['forward (model.run, no hooks)'];
    tables.push({
      head: [`T=${T}`, 'median ms (min)', 'CPU ms (median)', '/ forward, wall', '/ forward, CPU'],
      rows: Object.entries(r).map(([k, v]) => [
        k,
        `${fmt(v.median_ms)} (${fmt(v.min_ms)})`,
        fmt(v.cpu_median_ms),
        fmt(v.median_ms / base.median_ms, 2),
        fmt(v.cpu_median_ms / base.cpu_median_ms, 2),
      ]),
    });
    console.error(`T=${T} done (load ${fmt(os.loadavg()[0])})`);
  }
  await model.dispose();
  const notes = [
    `onnxruntime-node, ${threads} threads; 2 warm-up rounds, then ${REPS} timed rounds, each configuration once per round ` +
      '(order rotated) right after an untimed run of the same one. A function that changes k sites costs k + 1 forwards ' +
      '(the sites in forward order, each fed back as a patch intervention), one that only reads costs one forward ' +
      'that also fetches its site; fixed interventions (zero, scale, add, set, mean, patch) stay one forward.',
  ];
  for (const t of tables)
    console.log([t.head, t.head.map(() => '---'), ...t.rows].map((x) => `| ${x.join(' | ')} |`).join('\n') + '\n');
  for (const n of notes) console.log(n);
  record.save(tables, notes, raw);
}

main().catch((e) => {
  console.error(e);
  process.exitCode = 1;
});
