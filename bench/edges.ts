/**
 * edge_attribution's cost per pair on the GPT-2-small shape (issue 26): EAP, EAP-IG-inputs (m = 5)
 * and each circuit evaluation of MIB's faithfulness curve, in forward-equivalents (FE): wall time
 * per pair / one unbatched forward of the same 16-token prompt on the hooked graph fetching no
 * hooks, times taken side by side in each round (the machine may be shared); medians over rounds,
 * after one untimed run of each (the first builds the edge variant's sessions: reported as cold).
 *
 *  - eap: one corrupted forward fetching every node output + one clean forward & backward.
 *  - eap_ig_inputs: that corrupted forward, one clean forward, and m clean forward & backward rows.
 *  - a circuit evaluation: (time of eap with evaluate − time of eap) / (pairs × distinct circuits
 *    of the curve), one batched forward row per circuit and pair.
 *  - EAP's two engine runs alone, for where its time goes: the edge variant's forward fetching every
 *    node output, and its forward & backward (w = 0, the gradient at every edge).
 *
 * Targets (issue 26): EAP ≤ 4 FE, EAP-IG ≤ 2m + 3, each circuit evaluation ≤ 1.5 FE.
 *
 *   tsx bench/edges.ts [--pairs N] [--rounds R]     (default 4 pairs, 5 rounds; onnxruntime-node)
 */
import * as os from 'node:os';
import { loadModelNode } from '../src/node/load';
import { getOperation, type OperationDocument } from '../src/ops/index';
import { metricSeed } from '../src/ops/lib/gradients';
import { edgeLayout } from '../src/engine/edges';
import { cpuNow, median, now } from './lib';
import { ensureBenchModel, randomIds } from './model-gen';
import { startResults } from './results';

type Doc = OperationDocument<'edge_attribution'>;
const T = 16;
const M_STEPS = 5;
const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
};
const fmt = (x: number, d = 2) => x.toFixed(d);

async function main() {
  const record = startResults(
    'edges',
    'edge_attribution per pair on the GPT-2-small shape, in forward-equivalents (bench/edges.ts)',
  );
  const N = arg('pairs', 4);
  const ROUNDS = arg('rounds', 5);
  const bench = ensureBenchModel(undefined, (m) => console.error(m));
  const threads = os.cpus().length;
  const model = await loadModelNode(bench.dir, { backend: 'node', threads });
  const V = model.info.d_vocab;
  const dataset = Array.from({ length: N }, (_, i) => {
    const clean = randomIds(T, V, 1000 + i);
    const corrupted = [...randomIds(T / 2, V, 2000 + i), ...clean.slice(T / 2)];
    return {
      clean_token_ids: clean,
      corrupted_token_ids: corrupted,
      answer: `#${clean[3]}`,
      counterfactual: `#${corrupted[3]}`,
    };
  });
  const op = getOperation('edge_attribution')!;
  const run = (x: Record<string, unknown>) => op.run(model, { dataset, ...x }, {}) as Promise<Doc>;
  const ids = dataset[0].clean_token_ids;
  const forward = () => model.run(ids, { hooks: [] });
  const edgeForward = () => model.run(ids, { logitPositions: [T - 1], edges: { subtract: true, outputs: true } });
  const src = (await edgeForward()).edgeOutputs!;
  const { nForward: nf, nBackward: nb } = edgeLayout(
    model.info.n_layers,
    model.info.n_heads,
    model.info.parallel_attn_mlp,
  );
  const edgeGrad = () =>
    model.run(ids, {
      logitPositions: [T - 1],
      edges: { subtract: true, source: src, weights: { dims: [1, nf, nb], data: new Float32Array(nf * nb) } },
      grad: { hooks: [], seed: metricSeed(V, 1, ids[3], ids[4]) },
    });
  const timed = async <R>(fn: () => Promise<R>): Promise<{ ms: number; cpu: number; out: R }> => {
    const t0 = now();
    const c0 = cpuNow();
    const out = await fn();
    return { ms: now() - t0, cpu: cpuNow() - c0, out };
  };
  /** fn's wall and CPU time beside the median of 3 forwards taken right before it */
  const bracketed = async (row: Record<string, number>, k: string, fn: () => Promise<unknown>) => {
    const f: { ms: number; cpu: number }[] = [];
    for (let i = 0; i < 3; i++) f.push(await timed(forward));
    row[`${k}_fwd_ms`] = median(f.map((x) => x.ms));
    row[`${k}_fwd_cpu`] = median(f.map((x) => x.cpu));
    const r = await timed(fn);
    row[`${k}_ms`] = r.ms;
    row[`${k}_cpu`] = r.cpu;
  };
  const cases = {
    eap: () => run({ method: 'eap' }),
    ig: () => run({ method: 'eap_ig_inputs', ig_steps: M_STEPS }),
    eval: () => run({ method: 'eap', evaluate: true }),
  };

  for (let i = 0; i < 3; i++) await forward();
  const cold: Record<string, number> = {};
  const docs: Partial<Record<keyof typeof cases, Doc>> = {};
  for (const [k, fn] of Object.entries(cases) as [keyof typeof cases, () => Promise<Doc>][]) {
    const r = await timed(fn);
    cold[k] = r.ms;
    docs[k] = r.out;
    console.error(`cold ${k}: ${fmt(r.ms, 0)} ms`);
  }
  const E = docs.eap!.n_edges;
  // distinct circuits of the curve: forward rows = N corrupted + N per circuit
  const C = (docs.eval!.cost.forward_rows - N) / N;

  const rounds: Record<string, number>[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const row: Record<string, number> = {};
    for (const [k, fn] of Object.entries(cases)) await bracketed(row, k, fn);
    await bracketed(row, 'edge_forward', edgeForward);
    await bracketed(row, 'edge_grad', edgeGrad);
    rounds.push(row);
    console.error(
      `round ${r + 1}: forward ${fmt(row.eap_fwd_ms, 1)} ms; eap ${fmt(row.eap_ms, 0)} ms, eap_ig_inputs ${fmt(row.ig_ms, 0)} ms, ` +
        `eap + evaluate ${fmt(row.eval_ms, 0)} ms (load ${os.loadavg()[0].toFixed(1)})`,
    );
  }
  await model.dispose();
  /** forward-equivalents of k (per pair: / N), wall and CPU, medians over rounds */
  const fe = (k: string, per = 1) => ({
    wall: median(rounds.map((r) => r[`${k}_ms`] / per / r[`${k}_fwd_ms`])),
    cpu: median(rounds.map((r) => r[`${k}_cpu`] / per / r[`${k}_fwd_cpu`])),
  });
  const circuit = {
    wall: median(rounds.map((r) => (r.eval_ms - r.eap_ms) / (N * C) / ((r.eval_fwd_ms + r.eap_fwd_ms) / 2))),
    cpu: median(rounds.map((r) => (r.eval_cpu - r.eap_cpu) / (N * C) / ((r.eval_fwd_cpu + r.eap_fwd_cpu) / 2))),
  };
  const ms = (k: string) => median(rounds.map((r) => r[k]));
  const eap = fe('eap', N);
  const ig = fe('ig', N);
  const both = (x: { wall: number; cpu: number }) => `**${fmt(x.wall)}** / ${fmt(x.cpu)}`;
  const met = (x: { wall: number; cpu: number }, t: number) =>
    `${x.wall <= t ? 'yes' : 'no'} / ${x.cpu <= t ? 'yes' : 'no'}`;
  const head = ['measured', 'wall time', 'FE wall / CPU', 'target', 'met (wall / CPU)', 'the operation counts'];
  const rows = [
    [
      `one unbatched forward, T = ${T} (hooked graph, no hooks fetched)`,
      `${fmt(ms('eap_fwd_ms'), 1)} ms`,
      '1',
      '',
      '',
      '',
    ],
    [
      `**eap** per pair (${N} pairs of ${T} tokens, ${E.toLocaleString('en-US')} edges)`,
      `${fmt(ms('eap_ms'), 0)} ms`,
      both(eap),
      '≤ 4',
      met(eap, 4),
      fmt(docs.eap!.cost.forward_equivalents),
    ],
    [
      `**eap_ig_inputs** per pair, m = ${M_STEPS}`,
      `${fmt(ms('ig_ms'), 0)} ms`,
      both(ig),
      `≤ ${2 * M_STEPS + 3}`,
      met(ig, 2 * M_STEPS + 3),
      fmt(docs.ig!.cost.forward_equivalents),
    ],
    [
      `**a circuit evaluation** per pair (evaluate's ${C} distinct circuits; (eap + evaluate − eap) / ${N * C})`,
      `${fmt(ms('eval_ms') - ms('eap_ms'), 0)} ms`,
      both(circuit),
      '≤ 1.5',
      met(circuit, 1.5),
      '1',
    ],
    [
      "of EAP: the edge variant's forward fetching every node output",
      `${fmt(ms('edge_forward_ms'), 0)} ms`,
      both(fe('edge_forward')),
      '',
      '',
      '1',
    ],
    [
      "of EAP: the edge variant's forward & backward (every edge's gradient)",
      `${fmt(ms('edge_grad_ms'), 0)} ms`,
      both(fe('edge_grad')),
      '',
      '',
      '2',
    ],
    [
      'cold first calls (edge variant sessions built): eap; eap_ig_inputs; eap + evaluate',
      `${fmt(cold.eap, 0)} ms; ${fmt(cold.ig, 0)} ms; ${fmt(cold.eval, 0)} ms`,
      '',
      '',
      '',
      '',
    ],
  ];
  const notes = [
    `FE (forward-equivalents) = time per pair / one unbatched forward of the same prompt, the median of 3 forwards taken right before each measurement; wall-clock and process CPU time (the CPU ratio is the steadier one on a loaded machine); medians of ${ROUNDS} rounds on onnxruntime-node (${threads} threads), the GPT-2-small-shaped bench model with random weights. "The operation counts": cost.forward_equivalents of its document (a forward row 1, a forward & backward row 2).`,
  ];
  console.log([head, ...rows].map((r) => `| ${r.join(' | ')} |`).join('\n'));
  record.save([{ head, rows }], notes, { T, N, E, C, rounds, cold, m: M_STEPS });
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
