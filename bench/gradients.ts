/**
 * Bench extension: the gradient operations on the GPT-2-small shape (issue 12). Costs are in
 * forward-equivalents: wall time / one unbatched forward of the same prompt on the hooked graph
 * fetching no hooks (as the circuit extension measures it), times taken side by side per round.
 *
 *  - attribution_patching with validate 0: every head and every resid_pre/attn_out/mlp_out site
 *    (a clean forward fetching the hooks + a corrupted forward and backward). Target ≤ 3.
 *  - the corrupted forward + backward alone (one engine run with `grad`).
 *  - exhaustive activation patching of the same things with the `patch` operation (heads only, and
 *    heads + every site × position), the thing AtP approximates.
 *  - integrated_gradients: cost per step = (time at 32 steps − time at 16 steps) / 16.
 * The first call of each builds its graph variant (the gradient graph is a separate session): that
 * cold time is reported apart.
 */
import type { BenchExtension } from './extension';
import { median, now, timeInterleaved } from './lib';
import { randomIds } from './model-gen';

const T = 16;
const ROUNDS = 3;
const TARGET = 3;
const fmt = (x: number, d = 1) => x.toFixed(d);

export const gradientCosts: BenchExtension = {
  name: 'gradients',
  title: 'gradients: attribution patching vs exhaustive patching, integrated gradients per step (forward-equivalents)',
  timeoutMs: 1_200_000,
  async run(ctx) {
    const { getOperation } = await import('../src/ops/index');
    const atp = getOperation('attribution_patching')!;
    const patch = getOperation('patch')!;
    const ig = getOperation('integrated_gradients')!;
    const { metricSeed } = await import('../src/ops/lib/gradients');
    const model = await ctx.loadModel();
    const { n_layers: L, n_heads: H, d_vocab: V } = model.info;
    const clean = randomIds(T, V, 4242);
    const corrupted = [...randomIds(T / 2, V, 777), ...clean.slice(T / 2)];
    const answer = `#${clean[3]}`,
      counterfactual = `#${corrupted[3]}`;
    const hooks = Array.from({ length: L }, (_, l) => [
      `blocks.${l}.attn.hook_z`,
      `blocks.${l}.hook_resid_pre`,
      `blocks.${l}.hook_attn_out`,
      `blocks.${l}.hook_mlp_out`,
    ]).flat();
    const forward = () => model.run(clean, { hooks: [] });
    const timeOf = async (fn: () => Promise<unknown>) => {
      const t0 = now();
      await fn();
      return now() - t0;
    };

    const atpRun = () =>
      atp.run(model, { token_ids: clean, corrupted_token_ids: corrupted, answer, counterfactual, validate: 0 }, {});
    const fwdBwd = () =>
      model.run(corrupted, {
        hooks,
        logitPositions: [T - 1],
        grad: { hooks, seed: metricSeed(V, 1, clean[3], corrupted[3]) },
      });
    const patchHeads = () =>
      patch.run(
        model,
        { token_ids: clean, corrupted_token_ids: corrupted, answer, counterfactual, scans: ['head_out'] },
        {},
      );
    const patchAll = () =>
      patch.run(
        model,
        {
          token_ids: clean,
          corrupted_token_ids: corrupted,
          answer,
          counterfactual,
          scans: ['resid_pre', 'attn_out', 'mlp_out', 'head_out'],
        },
        {},
      );
    const igRun = (steps: number) => () => ig.run(model, { token_ids: clean, answer, counterfactual, steps }, {});

    for (let i = 0; i < 3; i++) await forward();
    const cold = { atp: await timeOf(atpRun), ig: await timeOf(igRun(16)) };
    ctx.log(
      `cold: attribution_patching ${fmt(cold.atp)} ms (builds the gradient graph), integrated_gradients ${fmt(cold.ig)} ms`,
    );
    await timeOf(patchAll); // warms the lean variants

    const rounds: Record<string, number>[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      const f = (await timeInterleaved([{ name: 'fwd', fn: forward }], 0, 5)).fwd.median_ms;
      const row = {
        forward_ms: f,
        atp_ms: await timeOf(atpRun),
        fwd_bwd_ms: await timeOf(fwdBwd),
        patch_heads_ms: await timeOf(patchHeads),
        patch_all_ms: await timeOf(patchAll),
        ig16_ms: await timeOf(igRun(16)),
        ig32_ms: await timeOf(igRun(32)),
      };
      rounds.push(row);
      ctx.log(
        `round ${r + 1}: forward ${fmt(f)} ms; AtP ${fmt(row.atp_ms)} ms = ${fmt(row.atp_ms / f, 2)} FE; patch all ${fmt(row.patch_all_ms)} ms = ${fmt(row.patch_all_ms / f, 1)} FE; IG 16/32 steps ${fmt(row.ig16_ms)}/${fmt(row.ig32_ms)} ms`,
      );
    }
    await model.dispose();
    const fe = (k: string) => median(rounds.map((r) => r[k] / r.forward_ms));
    const ms = (k: string) => median(rounds.map((r) => r[k]));
    const atpFe = fe('atp_ms');
    const igStep = median(rounds.map((r) => (r.ig32_ms - r.ig16_ms) / 16 / r.forward_ms));
    const nSites = 3 * L * T;
    const nAll = nSites + 2 * L + L * H; // patch also runs attn_out/mlp_out at all positions per layer
    return {
      rows: [
        {
          metric: `one unbatched forward, T=${T} (hooked graph, no hooks fetched)`,
          value: `${fmt(ms('forward_ms'))} ms`,
        },
        {
          metric: `**attribution_patching**: all ${L * H} heads + ${nSites} sites (clean forward + corrupted forward & backward)`,
          value: `${fmt(ms('atp_ms'))} ms = **${fmt(atpFe, 2)} forward-equivalents**`,
          target: `≤ ${TARGET}`,
          ok: atpFe <= TARGET,
        },
        {
          metric: 'of which the corrupted forward + backward (one engine run)',
          value: `${fmt(ms('fwd_bwd_ms'))} ms = ${fmt(fe('fwd_bwd_ms'), 2)} FE`,
        },
        {
          metric: `exhaustive patching, heads only (patch head_out, ${L * H} variants batched)`,
          value: `${fmt(ms('patch_heads_ms'))} ms = ${fmt(fe('patch_heads_ms'), 1)} FE`,
        },
        {
          metric: `exhaustive patching, heads + every site × position (patch, ${nAll} variants batched)`,
          value: `${fmt(ms('patch_all_ms'))} ms = ${fmt(fe('patch_all_ms'), 1)} FE (${fmt(fe('patch_all_ms') / atpFe, 1)}× AtP)`,
        },
        {
          metric: 'integrated_gradients, cost per step ((32 steps − 16 steps) / 16, steps batched)',
          value: `${fmt(igStep, 2)} FE per step; 32 steps in all ${fmt(ms('ig32_ms'))} ms = ${fmt(fe('ig32_ms'), 1)} FE`,
        },
        {
          metric: 'cold first calls (graph variants built): attribution_patching; integrated_gradients (16 steps)',
          value: `${fmt(cold.atp)} ms; ${fmt(cold.ig)} ms`,
        },
      ],
      json: { T, rounds, cold, atp_forward_equivalents: atpFe, ig_step_forward_equivalents: igStep, target: TARGET },
    };
  },
};
