/**
 * Per-operation cost: each operation's wall time divided by the time of the forward passes it
 * needs, on the bench model, per backend (onnxruntime-node with the bench's threads; onnxruntime-web
 * WASM in Node, 1 thread).
 *
 * "The forward" is the cheapest pass that yields a prediction: model.run(ids, { hooks: [],
 * logitPositions: [T-1] }) on the same prompt. An operation that needs n forwards (a clean run
 * plus n−1 edited variants) is compared with n of them. Each round times 3 forwards (median) and
 * then the operation once, side by side; the ratio reported is the median over rounds, after one
 * untimed warm-up run of each operation (its first run builds graph variants and per-model
 * constants: that cold time is reported separately).
 */
import type { LoadedModel } from '../src/engine/api';
import { cpuNow, median, now } from './lib';

export interface OpCase {
  op: string;
  /** label in the table */
  label: string;
  input: (prompt: string) => Record<string, unknown>;
  /** forward passes the result needs, given the prompt's tokens T and the model */
  forwards: (T: number, m: LoadedModel) => number;
  /** what the forward count is, in words */
  why: string;
  /** the single-forward target applies */
  target?: number;
  /** measured at T≈16 only (its T≈128 run alone takes minutes on a loaded 2-core machine) */
  shortOnly?: boolean;
}

export const SINGLE_TARGET = 1.2;

export const OP_CASES: OpCase[] = [
  {
    op: 'trace',
    label: 'trace',
    input: (p) => ({ prompt: p }),
    forwards: () => 1,
    why: '1 forward',
    target: SINGLE_TARGET,
  },
  {
    op: 'activations',
    label: 'activations',
    input: (p) => ({ prompt: p }),
    forwards: () => 1,
    why: '1 forward',
    target: SINGLE_TARGET,
  },
  {
    op: 'attention',
    label: 'attention (layer 0)',
    input: (p) => ({ prompt: p, layers: [0] }),
    forwards: () => 1,
    why: '1 forward',
    target: SINGLE_TARGET,
  },
  {
    op: 'logit_lens',
    label: 'logit_lens',
    input: (p) => ({ prompt: p }),
    forwards: () => 1,
    why: '1 forward (+ the lens: (L+1)·T unembeddings of d_model × vocab, ~5.7× the FLOPs of a forward that unembeds one position)',
    target: SINGLE_TARGET,
    shortOnly: true,
  },
  {
    op: 'ablate',
    label: 'ablate (L0H0, zero)',
    input: (p) => ({ prompt: p, layer: 0, head: 0 }),
    forwards: () => 2,
    why: 'clean + ablated',
  },
  {
    op: 'layer_ablation',
    label: 'layer_ablation',
    input: (p) => ({ prompt: p }),
    forwards: (_T, m) => 1 + 2 * m.info.n_layers,
    why: 'clean + attn_out and mlp_out of every layer',
  },
];

export interface OpCostRow {
  op: string;
  label: string;
  T: number;
  forwards: number;
  why: string;
  forward_ms: number;
  op_ms: number;
  cold_ms: number;
  /** op time / (forwards × forward time), median over rounds */
  ratio: number;
  rounds: number[];
  /**
   * fastest op run / (forwards × fastest forward), over every round (secondary: on a shared
   * machine the fastest runs are the least disturbed, so this is the ratio nearer an idle one)
   */
  ratio_fastest: number;
  /**
   * the same median ratio from process CPU time (user + system, every thread; secondary: it counts
   * onnxruntime's pool threads spinning too, but not the time other processes hold the cores)
   */
  ratio_cpu: number;
  target?: number;
}

export async function measureOps(
  model: LoadedModel,
  prompt: string,
  cases: OpCase[],
  rounds: number,
  log: (m: string) => void,
): Promise<OpCostRow[]> {
  const ops = await import('../src/ops/index');
  const ids = model.tokenize(prompt);
  const T = ids.length;
  const forward = () => model.run(ids, { hooks: [], logitPositions: [T - 1] });
  for (let i = 0; i < 3; i++) await forward();
  const rows: OpCostRow[] = [];
  for (const c of cases) {
    const op = ops.getOperation(c.op);
    if (!op) {
      log(`no operation ${c.op}; skipped`);
      continue;
    }
    const run = () => op.run(model, c.input(prompt), {});
    const t0 = now();
    await run();
    const cold = now() - t0;
    const n = c.forwards(T, model);
    const ratios: number[] = [];
    const fwds: number[] = [];
    const opms: number[] = [];
    const allFwd: number[] = [];
    const cpuRatios: number[] = [];
    for (let r = 0; r < rounds; r++) {
      const f: number[] = [];
      const fc: number[] = [];
      for (let i = 0; i < 3; i++) {
        const a = now(),
          ac = cpuNow();
        await forward();
        f.push(now() - a);
        fc.push(cpuNow() - ac);
      }
      const a = now(),
        ac = cpuNow();
      await run();
      const o = now() - a;
      cpuRatios.push((cpuNow() - ac) / (n * median(fc)));
      fwds.push(median(f));
      allFwd.push(...f);
      opms.push(o);
      ratios.push(o / (n * median(f)));
    }
    const row: OpCostRow = {
      op: c.op,
      label: c.label,
      T,
      forwards: n,
      why: c.why,
      forward_ms: median(fwds),
      op_ms: median(opms),
      cold_ms: cold,
      ratio: median(ratios),
      rounds: ratios,
      ratio_fastest: Math.min(...opms) / (n * Math.min(...allFwd)),
      ratio_cpu: median(cpuRatios),
      target: c.target,
    };
    log(
      `${c.label} T=${T}: ${row.op_ms.toFixed(1)} ms vs ${n} × ${row.forward_ms.toFixed(1)} ms → ${row.ratio.toFixed(2)} (rounds ${ratios.map((x) => x.toFixed(2)).join(', ')}; fastest ${row.ratio_fastest.toFixed(2)}; cpu ${row.ratio_cpu.toFixed(2)}; cold ${cold.toFixed(0)} ms)`,
    );
    rows.push(row);
  }
  return rows;
}

/** a prompt of about n tokens for the bench tokenizer (two-byte merges: ~2 characters a token) */
export function benchPrompt(model: LoadedModel, n: number): string {
  const words = 'the quick brown fox jumps over the lazy dog while seven wizards quietly hex a jovial bard'.split(' ');
  let text = '';
  for (let i = 0; model.tokenize(text).length < n; i++) text += (i ? ' ' : '') + words[i % words.length];
  return text;
}
