/**
 * circuit (NeuronScope's circuit discovery, plus the redundancy check it lacks):
 *  1. rank heads and MLP neurons by direct logit attribution (lib/dla.ts) to the target token
 *     (the clean prediction, or a given answer) at the last position;
 *  2. ablate each candidate singly — all singles in one batched scan — and measure its causal
 *     effect (logit and log-prob change of the target);
 *  3. ablate groups — the top few heads pairwise (top by |attribution| and top by |single effect|),
 *     each layer's candidate heads together, all candidate heads together, all candidate
 *     neurons together — so that redundant heads (small singly, large together, e.g. backup or
 *     duplicated induction heads) show up instead of being called unimportant.
 * A layer without heads (Qwen3.5's linear attention) is one attention candidate: its output
 * (hook_attn_out), ranked with the heads by its DLA term and ablated whole.
 */
import { z } from 'zod';
import { defineOperation } from './types';
import { documentBase, documentHead, interventionList } from '../schema/common';
import { LoupeError } from '../engine/errors';
import { CAPS, finite } from '../engine/caps';
import { CONVENTIONS, decomposeLogit, dlaHookNames, isLinearLayer } from './lib/dla';
import {
  Ablator,
  effectFields,
  idsAndAnswer,
  promptOrIdsFields,
  readoutFields,
  checkVariants,
  targetLabel,
  type AblationTarget,
  type Effect,
} from './lib/ablation';

const CIRCUIT_METHODS = ['zero', 'mean'] as const;
/** a group is called redundant when it moves the target's log-prob by at least this many nats … */
const REDUNDANT_MIN_NATS = 0.5;
/** … and by at least this multiple of the sum of its members' single effects */
const REDUNDANT_RATIO = 2;

export const circuitInput = z.object({
  ...promptOrIdsFields,
  answer: z
    .string()
    .optional()
    .describe('Target token (text or "#id"); default the clean prediction at the last position.'),
  convention: z
    .enum(CONVENTIONS)
    .default('transformer_lens')
    .describe('DLA convention used to rank candidates (see trace).'),
  ablation: z
    .enum(CIRCUIT_METHODS)
    .default('zero')
    .describe("zero, or mean (the clean activation averaged over the prompt's positions)."),
  top_k_heads: z
    .number()
    .int()
    .min(0)
    .max(4096)
    .default(12)
    .describe(
      'Candidate heads: the top k by |direct logit attribution| (capped at n_layers × n_heads); ' +
        "a linear-attention layer's whole output competes as one candidate.",
    ),
  top_k_neurons: z
    .number()
    .int()
    .min(0)
    .max(4096)
    .default(10)
    .describe('Candidate MLP neurons: the top k by |direct logit attribution| (0 = heads only).'),
  pair_k: z
    .number()
    .int()
    .min(0)
    .max(16)
    .default(6)
    .describe(
      'Pairs are formed among the top pair_k heads by |attribution| and among the top pair_k by |single effect|.',
    ),
});
export type CircuitInput = z.input<typeof circuitInput>;

const member = z.object({
  layer: z.number().int(),
  head: z.number().int().optional(),
  neuron: z.number().int().optional(),
  component: z.literal('attn_out').optional().describe("a linear-attention layer's whole output"),
});

/** a candidate ablated singly: its head or neuron, its label, what ranked it, its effect */
const candidate = <U extends 'head' | 'neuron', R extends z.ZodRawShape>(unit: U, ranked: R) =>
  z.object({
    layer: z.number().int(),
    ...({ [unit]: z.number().int() } as Record<U, z.ZodNumber>),
    label: z.string(),
    ...ranked,
    ...effectFields,
  });

export const circuitOutput = documentBase('circuit').extend({
  method: z.string().describe('exactly what was and was not done'),
  ablation: z.enum(CIRCUIT_METHODS),
  convention: z.enum(CONVENTIONS),
  ...readoutFields,
  heads: z
    .array(candidate('head', { attribution: z.number() }))
    .describe('candidate heads, ranked by |attribution|, each ablated singly'),
  neurons: z
    .array(candidate('neuron', { activation: z.number(), attribution: z.number() }))
    .describe('candidate neurons, ranked by |attribution|, each ablated singly'),
  linear_layers: z
    .array(
      z.object({
        layer: z.number().int(),
        component: z.literal('attn_out'),
        label: z.string(),
        attribution: z.number(),
        ...effectFields,
      }),
    )
    .optional()
    .describe(
      'linear-attention layers (no heads) among the attention candidates: the whole output ' +
        '(hook_attn_out) ranked with the heads and ablated singly; present only where the model has such layers',
    ),
  groups: z.array(
    z.object({
      kind: z.enum(['pair', 'layer_heads', 'all_heads', 'all_neurons']),
      label: z.string(),
      members: z.array(member),
      ...effectFields,
      sum_of_singles_logprob_delta: z.number().describe("Σ of the members' single logprob_delta"),
      max_single_abs_logprob_delta: z.number(),
      interaction_logprob_delta: z
        .number()
        .describe('group − Σ singles (negative: more damage together than the parts add up to)'),
      redundant: z.boolean().describe(`|group| ≥ ${REDUNDANT_MIN_NATS} nats and ≥ ${REDUNDANT_RATIO} × Σ|single|`),
    }),
  ),
  findings: z.array(z.string()).describe('plain-language summary of the redundant groups and the strongest singles'),
  interventions: interventionList.describe(
    'every site ablated: each candidate alone, and the groups above (sets of these)',
  ),
  n_variants: z.number().int(),
  n_engine_runs: z.number().int(),
});

type Member = z.infer<typeof member>;

function byAbsDesc<T>(xs: T[], key: (x: T) => number): T[] {
  return [...xs].sort((a, b) => Math.abs(key(b)) - Math.abs(key(a)));
}

function pairsOf<T>(xs: T[]): [T, T][] {
  const out: [T, T][] = [];
  for (let i = 0; i < xs.length; i++) for (let j = i + 1; j < xs.length; j++) out.push([xs[i], xs[j]]);
  return out;
}

export const operation = defineOperation({
  name: 'circuit',
  title: 'Circuit',
  description:
    'Find which heads and MLP neurons matter for the prediction at the last position: ' +
    'rank candidates by direct logit attribution, ablate each singly (batched) and report its causal ' +
    'effect (logit and log-prob change of the target, KL), then ablate groups (top heads pairwise, ' +
    "each layer's candidate heads, all candidate heads, all candidate neurons) to expose redundancy " +
    '(small singly, large together). Cost: one clean run plus two batched scans (singles, then groups).',
  input: circuitInput,
  output: circuitOutput,
  long: true,
}).implement(async (model, input, ctx) => {
  const { n_layers: L, n_heads: H, d_mlp: M } = model.info;
  const { ids, prompt, answerId } = idsAndAnswer(model, input);
  // attention candidates: each head of a layer with heads, the whole output of one without (linear attention)
  const linear = Array.from({ length: L }, (_, l) => isLinearLayer(model, l));
  const nUnits = linear.reduce((n, lin) => n + (lin ? 1 : H), 0);
  const kHeads = Math.min(input.top_k_heads, nUnits);
  const kNeurons = Math.min(input.top_k_neurons, L * M);
  const pairK = Math.min(input.pair_k, kHeads);
  if (kHeads + kNeurons === 0)
    throw new LoupeError(
      'BAD_INPUT',
      'No candidates: top_k_heads and top_k_neurons are both 0.',
      'Ask for at least one head or neuron.',
    );
  // worst case: singles + 2·C(pair_k, 2) pairs + one group per layer + all heads + all neurons
  const maxVariants = kHeads + kNeurons + pairK * (pairK - 1) + L + 2;
  checkVariants(maxVariants, 'This circuit search', 'Lower top_k_heads, top_k_neurons or pair_k.');

  // every hook_z (a linear layer's hook_attn_out) and hook_post: DLA reads them, and mean ablation averages them
  const siteHooks: string[] = [];
  for (let l = 0; l < L; l++)
    siteHooks.push(linear[l] ? `blocks.${l}.hook_attn_out` : `blocks.${l}.attn.hook_z`, `blocks.${l}.mlp.hook_post`);
  ctx.onProgress?.({ stage: 'clean run and attribution', done: 0, total: 1 });
  const { ablator, clean } = await Ablator.prepare(
    model,
    ids,
    siteHooks,
    { method: input.ablation, positions: 'all', answerId },
    ctx,
    dlaHookNames(model),
  );
  const { answer } = ablator;
  const dla = await decomposeLogit(
    model,
    clean,
    { tokenId: answer.token_id },
    { convention: input.convention, signal: ctx.signal, logitIndex: 0 },
  );
  ctx.onProgress?.({ stage: 'clean run and attribution', done: 1, total: 1 });

  // ---- candidates by |attribution|
  type Unit = { layer: number; head?: number; attribution: number };
  const allUnits: Unit[] = [];
  const termOf = new Map(dla.terms.map((t) => [t.name, t.value]));
  for (let l = 0; l < L; l++) {
    if (linear[l]) allUnits.push({ layer: l, attribution: termOf.get(`L${l}.linear_attn`)! });
    else for (let h = 0; h < H; h++) allUnits.push({ layer: l, head: h, attribution: dla.heads[l][h] });
  }
  const units = byAbsDesc(allUnits, (x) => x.attribution).slice(0, kHeads);
  const unitTarget = (u: { layer: number; head?: number }): AblationTarget =>
    u.head === undefined ? { layer: u.layer, component: 'attn_out' } : { layer: u.layer, head: u.head };
  const heads = units.flatMap((u) => (u.head === undefined ? [] : [{ ...u, head: u.head }]));
  const allNeurons: { layer: number; neuron: number; attribution: number; activation: number }[] = [];
  if (kNeurons > 0) {
    for (let l = 0; l < L; l++)
      for (let n = 0; n < dla.neuronAttribution[l].length; n++)
        // each layer's own width (Gemma 4's double-wide MLPs)
        allNeurons.push({
          layer: l,
          neuron: n,
          attribution: dla.neuronAttribution[l][n],
          activation: dla.neuronActivation[l][n],
        });
  }
  const neurons = byAbsDesc(allNeurons, (x) => x.attribution).slice(0, kNeurons);

  // ---- singles, one batched scan
  const singleTargets: AblationTarget[] = [
    ...units.map(unitTarget),
    ...neurons.map((n) => ({ layer: n.layer, neuron: n.neuron })),
  ];
  const singleEffects = await ablator.effects(
    singleTargets.map((t) => [t]),
    ctx,
    'single ablations',
  );
  const singles = new Map<string, Effect>();
  singleTargets.forEach((t, i) => singles.set(targetLabel(t), singleEffects[i]));
  const headRows = heads.map((h) => ({
    layer: h.layer,
    head: h.head,
    label: `L${h.layer}H${h.head}`,
    attribution: finite(h.attribution),
    ...singles.get(`L${h.layer}H${h.head}`)!,
  }));
  const linearRows = units.flatMap((u) =>
    u.head !== undefined
      ? []
      : [
          {
            layer: u.layer,
            component: 'attn_out' as const,
            label: `L${u.layer}.attn_out`,
            attribution: finite(u.attribution),
            ...singles.get(`L${u.layer}.attn_out`)!,
          },
        ],
  );
  // the attention candidates in rank order: heads and linear-attention layers
  const unitRows = units.map((u) =>
    u.head === undefined
      ? linearRows.find((r) => r.layer === u.layer)!
      : headRows.find((r) => r.layer === u.layer && r.head === u.head)!,
  );
  const neuronRows = neurons.map((n) => ({
    layer: n.layer,
    neuron: n.neuron,
    label: `L${n.layer}N${n.neuron}`,
    activation: finite(n.activation),
    attribution: finite(n.attribution),
    ...singles.get(`L${n.layer}N${n.neuron}`)!,
  }));

  // ---- groups
  type Group = { kind: 'pair' | 'layer_heads' | 'all_heads' | 'all_neurons'; label: string; members: Member[] };
  const groups: Group[] = [];
  const seen = new Set<string>();
  const labelOf = (ms: Member[]) => ms.map((m) => targetLabel(m)).join('+');
  const addGroup = (kind: Group['kind'], members: Member[], label?: string) => {
    const key = members
      .map((m) => targetLabel(m))
      .sort()
      .join('+');
    if (members.length < 2 || seen.has(key)) return;
    seen.add(key);
    groups.push({ kind, label: label ?? labelOf(members), members });
  };
  const headMember = (h: { layer: number; head?: number }): Member =>
    h.head === undefined ? { layer: h.layer, component: 'attn_out' } : { layer: h.layer, head: h.head };
  const topByAttr = unitRows.slice(0, pairK);
  const topByEffect = byAbsDesc(unitRows, (x) => x.logprob_delta).slice(0, pairK);
  for (const [a, b] of [...pairsOf(topByAttr), ...pairsOf(topByEffect)])
    addGroup('pair', [headMember(a), headMember(b)]);
  for (let l = 0; l < L; l++) {
    const inLayer = headRows.filter((h) => h.layer === l).map(headMember);
    addGroup('layer_heads', inLayer, `L${l} candidate heads (${inLayer.length})`);
  }
  addGroup(
    'all_heads',
    unitRows.map(headMember),
    linearRows.length
      ? `all ${headRows.length} candidate heads and ${linearRows.length} linear-attention layers`
      : `all ${headRows.length} candidate heads`,
  );
  addGroup(
    'all_neurons',
    neuronRows.map((n) => ({ layer: n.layer, neuron: n.neuron })),
    `all ${neuronRows.length} candidate neurons`,
  );
  const groupEffects = groups.length
    ? await ablator.effects(
        groups.map((g) => g.members),
        ctx,
        'group ablations',
      )
    : [];
  const groupRows = groups.map((g, i) => {
    const e = groupEffects[i];
    const singleDeltas = g.members.map((m) => singles.get(targetLabel(m))!.logprob_delta);
    const sum = singleDeltas.reduce((a, b) => a + b, 0);
    const sumAbs = singleDeltas.reduce((a, b) => a + Math.abs(b), 0);
    const maxAbs = Math.max(...singleDeltas.map(Math.abs));
    const redundant =
      Math.abs(e.logprob_delta) >= REDUNDANT_MIN_NATS && Math.abs(e.logprob_delta) >= REDUNDANT_RATIO * sumAbs;
    return {
      ...g,
      ...e,
      sum_of_singles_logprob_delta: finite(sum),
      max_single_abs_logprob_delta: finite(maxAbs),
      interaction_logprob_delta: finite(e.logprob_delta - sum),
      redundant,
    };
  });

  // ---- findings (from the numbers above, by the stated rule)
  const findings: string[] = [];
  const f2 = (x: number) => x.toFixed(2);
  for (const g of groupRows.filter((x) => x.redundant)) {
    findings.push(
      `Redundant: ${g.label} together change log p(${JSON.stringify(answer.token)}) ` +
        `by ${f2(g.logprob_delta)} nats, while singly the largest change is ` +
        `${f2(g.max_single_abs_logprob_delta)} (sum of singles ${f2(g.sum_of_singles_logprob_delta)}).`,
    );
  }
  const strongest = byAbsDesc([...unitRows, ...neuronRows], (x) => x.logprob_delta).slice(0, 3);
  for (const s of strongest)
    findings.push(
      `Single ${s.label}: attribution ${f2(s.attribution)}, ablation changes log p by ${f2(s.logprob_delta)} nats (logit ${f2(s.logit_delta)}).`,
    );
  if (!groupRows.some((g) => g.redundant))
    findings.push('No tested group was redundant by the rule (group ≥ 0.5 nats and ≥ 2 × the sum of its singles).');

  const nVariants = singleTargets.length + groups.length;
  const runs = 1 + Math.ceil(singleTargets.length / CAPS.maxBatch) + Math.ceil(groups.length / CAPS.maxBatch);
  const hasLinear = linear.some(Boolean);
  const linearNote = hasLinear ? ` and ${linearRows.length} linear-attention layers` : '';
  const how =
    input.ablation === 'zero'
      ? 'zero-ablation'
      : "mean-ablation (clean activation averaged over the prompt's positions)";
  return {
    ...documentHead('circuit', model, prompt, ids),
    method:
      `Candidates: the top ${heads.length} heads${linearNote} and top ${neurons.length} MLP neurons by |direct logit ` +
      `attribution| (${input.convention} convention) to ${JSON.stringify(answer.token)} at the last position. ` +
      `Causal effect: ${how} of attn.hook_z per head and of mlp.hook_post per neuron, at every position, ` +
      (hasLinear
        ? '(a linear-attention layer has no heads: its whole output hook_attn_out is one candidate, ' +
          'ranked with the heads by its DLA term), '
        : '') +
      'all downstream layers recomputed (total effect), each candidate singly in batched runs; ' +
      `then groups: pairs among the top ${pairK} heads by |attribution| and the top ${pairK} by |single effect|, ` +
      "each layer's candidate heads together, all candidate heads, all candidate neurons. " +
      `A group is flagged redundant when |Δ log p| ≥ ${REDUNDANT_MIN_NATS} nats and ≥ ${REDUNDANT_RATIO} × Σ|single Δ log p|. ` +
      'Not done: path patching, attention-pattern or Q/K/V-level ablation, gradient (attribution) ' +
      'patching, heads or neurons outside the candidate lists, groups other than those listed.',
    ablation: input.ablation,
    convention: input.convention,
    answer,
    clean: ablator.cleanBlock(),
    heads: headRows,
    neurons: neuronRows,
    ...(hasLinear ? { linear_layers: linearRows } : {}),
    groups: groupRows,
    findings,
    interventions: ablator.records(singleTargets),
    n_variants: nVariants,
    n_engine_runs: runs,
  };
});
