/**
 * Where the hooked graph's extra time over the plain graph goes on onnxruntime-node (issue 28 item 2),
 * on the GPT-2-small-shaped bench model, batch 1, interleaved run by run (bench/lib.ts timeInterleaved,
 * an untimed settle run before each timed one):
 *
 *  - plain                    the `hooks: false` graph, logits only
 *  - hooked, no hooks         model.run fetching none (the intervention inputs fed identity scalars)
 *  - hooked, all hooks        model.run fetching every hook
 *  - … session.run            the same session run directly with the same feeds: onnxruntime alone,
 *                             without model.run's feeds and result tensors
 *  - … pre-allocated outputs  session.run given an output tensor per fetch, reused run after run,
 *                             and how many of them onnxruntime-node wrote into (it may allocate its own)
 *  - observe-only, all hooks  the lean variant with every hook an output and no intervention inputs
 *
 *   tsx bench/hooked-cost.ts [--T 16,128] [--reps 7]
 */
import * as os from 'node:os';
import { loadModelNode } from '../src/node/load';
import type { OrtTensorLike } from '../src/engine/runtime/ort-session';
import { packageVersion, plainSession, timeInterleaved } from './lib';
import { ensureBenchModel, randomIds } from './model-gen';
import { startResults, type ResultTable } from './results';

const arg = (name: string): string | undefined => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : undefined;
};
const Ts = (arg('T') ?? '16,128').split(',').map(Number);
const REPS = Number(arg('reps') ?? 7);
const fmt = (x: number, d = 1) => x.toFixed(d);

type Session = {
  run(feeds: Record<string, OrtTensorLike>, fetches: unknown): Promise<Record<string, OrtTensorLike>>;
};

async function main() {
  const record = startResults(
    'hooked-cost',
    'The hooked graph against the plain one on onnxruntime-node, piece by piece (bench/hooked-cost.ts)',
  );
  const bench = ensureBenchModel(undefined, (m) => console.error(m));
  const threads = os.cpus().length;
  const plain = await plainSession(bench.dir, 'node', threads);
  const model = await loadModelNode(bench.dir, { backend: 'node', threads });
  // the engine's hooked session, as model.run uses it (a private member: the bench reads it)
  const { session } = (await (model as any).variant({ kind: 'hooked', withResult: false })) as { session: Session };
  const ort = plain.factory.ort;
  const tables: ResultTable[] = [];
  const raw: Record<string, unknown> = {};
  const notes: string[] = [];
  for (const T of Ts) {
    const ids = randomIds(T, model.info.d_vocab, 1000 + T);
    // model.run's own feeds and fetches for every hook, caught once
    let feeds: Record<string, OrtTensorLike> = {};
    let fetches: string[] = [];
    const run = session.run.bind(session);
    session.run = (f, n) => {
      feeds = f;
      fetches = n as string[];
      return run(f, n);
    };
    await model.run(ids, { hooks: 'all' });
    session.run = run;
    const first = await session.run(feeds, fetches);
    const pre: Record<string, OrtTensorLike> = {};
    for (const n of fetches)
      pre[n] = new ort.Tensor('float32', new Float32Array((first[n].data as Float32Array).length), first[n].dims);
    const again = await session.run(feeds, pre);
    const honoured = fetches.filter((n) => again[n].data === pre[n].data).length;
    const bytes = fetches.reduce((s, n) => s + (first[n].data as Float32Array).byteLength, 0);
    notes.push(
      `T=${T}: ${fetches.length} outputs (every hook and the logits), ${fmt(bytes / 2 ** 20)} MiB a run; ` +
        `onnxruntime-node ${packageVersion('onnxruntime-node')} wrote into ${honoured} of the ${fetches.length} pre-allocated output tensors it was given ` +
        `(it returned tensors of its own for the others).`,
    );
    const r = await timeInterleaved(
      [
        { name: 'plain', fn: () => plain.run(ids) },
        { name: 'hooked, no hooks fetched (model.run)', fn: () => model.run(ids, { hooks: [] }) },
        { name: 'hooked, all hooks (model.run)', fn: () => model.run(ids, { hooks: 'all' }) },
        { name: 'hooked, all hooks (session.run, same feeds)', fn: () => session.run(feeds, fetches) },
        { name: 'hooked, all hooks, pre-allocated outputs (session.run)', fn: () => session.run(feeds, pre) },
        {
          name: 'observe-only variant (no intervention inputs), all hooks',
          fn: () => model.run(ids, { hooks: 'all', lean: true }),
        },
      ],
      3,
      REPS,
      { settle: true },
    );
    raw[String(T)] = r;
    const p = r.plain;
    tables.push({
      head: [`T=${T}`, 'median ms (min)', 'CPU ms (median)', '/ plain, wall', '/ plain, CPU'],
      rows: Object.entries(r).map(([k, v]) => [
        k,
        `${fmt(v.median_ms)} (${fmt(v.min_ms)})`,
        fmt(v.cpu_median_ms),
        fmt(v.median_ms / p.median_ms, 2),
        fmt(v.cpu_median_ms / p.cpu_median_ms, 2),
      ]),
    });
    console.error(`T=${T} done (load ${fmt(os.loadavg()[0])})`);
  }
  await model.dispose();
  await plain.release();
  notes.push(
    `onnxruntime-node, ${threads} threads; 3 warm-up rounds, then ${REPS} timed rounds, each running every configuration once ` +
      '(order rotated each round) right after an untimed run of the same one. CPU = process CPU time (every thread). ' +
      'Target (issue 28): hooked, all hooks / plain ≤ 1.15 at T = 16 and 128. `tsx bench/profile-forward.ts` gives the kernel-time share per op type of the two graphs.',
  );
  for (const t of tables)
    console.log([t.head, t.head.map(() => '---'), ...t.rows].map((x) => `| ${x.join(' | ')} |`).join('\n') + '\n');
  for (const n of notes) console.log(n);
  record.save(tables, notes, raw);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
