/**
 * Reverse-mode differentiation of the graph the builder writes: a transform over its ONNX node
 * list that appends the backward pass as more ONNX nodes, so one session runs forward and
 * backward (on every backend the forward runs on, batched like the forward).
 *
 * Input:  a seed ∂M/∂out for one forward output (the logits: seed [B, P', V]; a metric that is
 *         linear in the logits, e.g. logit[A] − logit[B] at the last position, is a seed with +1/−1).
 * Output: `grad:{tensor}` = ∂M/∂tensor for each requested tensor (hook names).
 *
 * Only activations are differentiated, never weights: a node's inputs get a gradient when they
 * depend on a requested tensor AND the seeded output depends on them. Each forward op type has a
 * VJP rule, a case of the op switch in addBackward written as ONNX nodes; an op on that path
 * without a rule is an UNSUPPORTED_OP error naming it (never a silently wrong number). The forward nodes are not
 * touched, so the forward numbers do not change.
 *
 * Broadcasting: a VJP for an input that was broadcast must sum over the broadcast axes. The
 * graph has dynamic dims (B, T, …), so shapes are inferred twice with different concrete sizes
 * for the graph inputs; an axis is a broadcast axis when the input's dim is 1 in both and the
 * output's is not. Those axes are then static.
 */
import { LoupeError } from '../errors';
import type { OnnxGraph } from './onnx-builder';
import { deltaRuleBackward, isDeltaRuleScan } from './delta-rule';

type Node = { opType: string; input: string[]; output: string[]; attribute: any[] };
type Shape = number[];

export interface BackwardSpec {
  /** the forward output the seed belongs to (e.g. 'logits') */
  output: string;
  /** name of the seed graph input (same shape as `output`) */
  seed: string;
  /** tensors whose gradients become outputs, each as `gradName(t)` */
  wrt: string[];
  /**
   * concrete sizes for graph inputs in two shape evaluations (name → dims); symbolic dims of
   * the declared inputs are filled from `symbols`
   */
  symbols: [Record<string, number>, Record<string, number>];
  /** per-input overrides of declared dims (e.g. an empty KV cache) for each evaluation */
  inputDims?: (name: string, declared: (number | string)[], ev: number) => number[] | undefined;
  /**
   * tensors the pass treats as constants (a stop-gradient): no gradient flows into them or, through
   * them, into what they were computed from. The edge variant's fed differences (edge-graph.ts) are
   * such values: its ∂M/∂(edge weight) is Σ difference · ∂M/∂input, the edge's linear attribution.
   */
  stop?: string[];
}

export const gradName = (t: string) => `grad:${t}`;

/** Ops whose outputs carry no gradient (integer, boolean or shape results). */
const NON_DIFF = new Set([
  'Shape',
  'Greater',
  'GreaterOrEqual',
  'Less',
  'Equal',
  'NonZero',
  'ArgMax',
  'Range',
  'ConstantOfShape',
]);

/** Ops with a VJP rule below. */
const VJP_OPS = new Set([
  'MatMulNBits',
  'Identity',
  'Cast',
  'Neg',
  'Add',
  'Sub',
  'Mul',
  'Div',
  'Sqrt',
  'Tanh',
  'Sigmoid',
  'Erf',
  'Relu',
  'Clip',
  'Softmax',
  'MatMul',
  'Gemm',
  'Reshape',
  'Expand',
  'Transpose',
  'Unsqueeze',
  'Squeeze',
  'Split',
  'Concat',
  'Slice',
  'Gather',
  'ReduceMean',
  'ReduceSum',
  'ReduceSumSquare',
  'Exp',
  'Softplus',
  'Scan', // the gated delta rule's only (delta-rule.ts); any other body is refused where it is met
]);

function attr(n: Node, name: string): any {
  const a = n.attribute.find((x: any) => x.name === name);
  if (!a) return undefined;
  if (a.type === 2) return Number(a.i);
  if (a.type === 7) return a.ints.map(Number);
  if (a.type === 3) return new TextDecoder().decode(a.s);
  if (a.type === 1) return a.f;
  return a;
}

// ---------------------------------------------------------------- shape inference

interface Info {
  shape?: Shape;
  ints?: number[];
}

function broadcast(a: Shape, b: Shape): Shape {
  const r = Math.max(a.length, b.length);
  const out: number[] = [];
  for (let i = 0; i < r; i++) {
    const x = a[a.length - r + i] ?? 1;
    const y = b[b.length - r + i] ?? 1;
    if (x !== y && x !== 1 && y !== 1) throw new Error(`broadcast ${a} vs ${b}`);
    out.push(x === 1 ? y : x);
  }
  return out;
}

const norm = (axis: number, rank: number) => (axis < 0 ? axis + rank : axis);
const prod = (s: number[]) => s.reduce((a, b) => a * b, 1);

/** Concrete shapes (and small int64 values) of every tensor for one assignment of input sizes. */
function inferShapes(
  g: OnnxGraph,
  nodes: readonly Node[],
  inputShape: (name: string) => number[] | undefined,
): Map<string, Info> {
  const info = new Map<string, Info>();
  const get = (name: string): Info => {
    let i = info.get(name);
    if (i) return i;
    const init = g.initializerInfo(name);
    if (init) i = { shape: init.dims, ints: init.ints };
    else {
      const s = inputShape(name);
      i = s ? { shape: s } : {};
    }
    info.set(name, i);
    return i;
  };
  for (const n of nodes) {
    const ins = n.input.map((x) => (x === '' ? {} : get(x)));
    const s0 = ins[0]?.shape;
    let outs: Info[] = [];
    try {
      switch (n.opType) {
        case 'Neg':
        case 'Sqrt':
        case 'Tanh':
        case 'Erf':
        case 'Sigmoid':
        case 'Relu':
        case 'Identity':
        case 'Exp':
        case 'Softplus':
        case 'Softmax':
        case 'Clip':
          outs = [{ shape: s0 }];
          break;
        case 'Where': // the chunked vocabulary lookup (vocab.ts)
          outs = [{ shape: broadcast(broadcast(s0!, ins[1].shape!), ins[2].shape!) }];
          break;
        case 'Cast':
          outs = [{ shape: s0, ints: ins[0].ints }];
          break;
        case 'Add':
        case 'Sub':
        case 'Mul':
        case 'Div':
        case 'Greater':
        case 'GreaterOrEqual':
        case 'Equal':
        case 'Less': {
          const shape = s0 && ins[1].shape ? broadcast(s0, ins[1].shape) : undefined;
          // small int64 arithmetic on shapes (a stored weight's ordered Reshape target, onnx-builder.ts weight)
          const [a, b] = [ins[0].ints, ins[1].ints];
          const f = (
            {
              Add: (x: number, y: number) => x + y,
              Sub: (x: number, y: number) => x - y,
              Mul: (x: number, y: number) => x * y,
            } as Record<string, ((x: number, y: number) => number) | undefined>
          )[n.opType];
          const ints =
            f && a && b && shape?.length === 1
              ? Array.from({ length: shape[0] }, (_, k) => f(a[a.length === 1 ? 0 : k], b[b.length === 1 ? 0 : k]))
              : undefined;
          outs = [{ shape, ints }];
          break;
        }
        case 'MatMul': {
          const a = s0!,
            b = ins[1].shape!;
          outs = [{ shape: [...broadcast(a.slice(0, -2), b.slice(0, -2)), a[a.length - 2], b[b.length - 1]] }];
          break;
        }
        case 'Gemm': {
          const a = s0!,
            b = ins[1].shape!;
          outs = [{ shape: [attr(n, 'transA') ? a[1] : a[0], attr(n, 'transB') ? b[0] : b[1]] }];
          break;
        }
        case 'MatMulNBits': // x [.., K] · (q4 matrix [N, K])ᵀ
          outs = [{ shape: [...s0!.slice(0, -1), attr(n, 'N')] }];
          break;
        case 'Shape': {
          const r = s0!.length;
          const st = norm(attr(n, 'start') ?? 0, r),
            en = norm(attr(n, 'end') ?? r, r);
          const v = s0!.slice(st, en);
          outs = [{ shape: [v.length], ints: v }];
          break;
        }
        case 'Concat': {
          const ax = norm(attr(n, 'axis'), s0!.length);
          const shape = s0!.slice();
          shape[ax] = ins.reduce((t, x) => t + x.shape![ax], 0);
          const ints = ins.every((x) => x.ints) && s0!.length === 1 ? ins.flatMap((x) => x.ints!) : undefined;
          outs = [{ shape, ints }];
          break;
        }
        case 'Reshape': {
          const target = ins[1].ints!.slice();
          const total = prod(s0!);
          target.forEach((d, k) => {
            if (d === 0) target[k] = s0![k];
          });
          const known = target.filter((d) => d !== -1).reduce((a, b) => a * b, 1);
          outs = [{ shape: target.map((d) => (d === -1 ? total / known : d)), ints: ins[0].ints }];
          break;
        }
        case 'Transpose': {
          const perm: number[] = attr(n, 'perm') ?? s0!.map((_, k) => s0!.length - 1 - k);
          outs = [{ shape: perm.map((p) => s0![p]) }];
          break;
        }
        case 'Unsqueeze': {
          const r = s0!.length + ins[1].ints!.length;
          const axes = ins[1].ints!.map((a) => norm(a, r));
          const shape: number[] = [];
          let k = 0;
          for (let i = 0; i < r; i++) shape.push(axes.includes(i) ? 1 : s0![k++]);
          outs = [{ shape, ints: ins[0].ints }];
          break;
        }
        case 'Squeeze': {
          const axes = ins[1].ints!.map((a) => norm(a, s0!.length));
          outs = [{ shape: s0!.filter((_, i) => !axes.includes(i)), ints: ins[0].ints }];
          break;
        }
        case 'Split': {
          const ax = norm(attr(n, 'axis') ?? 0, s0!.length);
          outs = ins[1].ints!.map((sz) => ({ shape: s0!.map((d, i) => (i === ax ? sz : d)) }));
          break;
        }
        case 'Slice': {
          const shape = s0!.slice();
          const starts = ins[1].ints!,
            ends = ins[2].ints!;
          const axes = ins[3]?.ints ?? starts.map((_, k) => k);
          axes.forEach((a, k) => {
            const ax = norm(a, shape.length);
            const d = s0![ax];
            const st = Math.min(Math.max(starts[k] < 0 ? starts[k] + d : starts[k], 0), d);
            const en = Math.min(Math.max(ends[k] < 0 ? ends[k] + d : ends[k], 0), d);
            shape[ax] = Math.max(0, en - st);
          });
          let ints: number[] | undefined;
          if (ins[0].ints && s0!.length === 1) {
            const d = s0![0];
            const st = Math.min(Math.max(starts[0] < 0 ? starts[0] + d : starts[0], 0), d);
            ints = ins[0].ints.slice(st, st + shape[0]);
          }
          outs = [{ shape, ints }];
          break;
        }
        case 'Gather': {
          const ax = norm(attr(n, 'axis') ?? 0, s0!.length);
          outs = [{ shape: [...s0!.slice(0, ax), ...ins[1].shape!, ...s0!.slice(ax + 1)] }];
          break;
        }
        case 'Expand':
          outs = [{ shape: broadcast(s0!, ins[1].ints!) }];
          break;
        case 'ReduceMean':
        case 'ReduceSumSquare':
        case 'ReduceSum': {
          const axes: number[] = (n.opType === 'ReduceSum' ? ins[1]?.ints : attr(n, 'axes')) ?? s0!.map((_, k) => k);
          const ax = axes.map((a) => norm(a, s0!.length));
          const keep = (attr(n, 'keepdims') ?? 1) === 1;
          outs = [
            { shape: keep ? s0!.map((d, i) => (ax.includes(i) ? 1 : d)) : s0!.filter((_, i) => !ax.includes(i)) },
          ];
          break;
        }
        case 'TopK': {
          const ax = norm(attr(n, 'axis') ?? -1, s0!.length);
          const shape = s0!.map((d, i) => (i === ax ? ins[1].ints![0] : d));
          outs = [{ shape }, { shape }];
          break;
        }
        case 'Scan': {
          // the body's declared dims, its symbols bound from the inputs: states as they are, scan inputs
          // less their scan axis; scan outputs gain the sequence axis (tensors after a recurrence have shapes)
          const body = n.attribute.find((a: any) => a.name === 'body').g;
          const nScan = attr(n, 'num_scan_inputs');
          const nState = ins.length - nScan;
          const inAxes: number[] = attr(n, 'scan_input_axes') ?? new Array(nScan).fill(0);
          const outAxes: number[] = attr(n, 'scan_output_axes') ?? [];
          const dimsOf = (v: any): (number | string)[] =>
            (v.type?.tensorType?.shape?.dim ?? []).map((d: any) => (d.dimParam ? d.dimParam : Number(d.dimValue)));
          const sym = new Map<string, number>();
          body.input.forEach((v: any, i: number) => {
            let actual = ins[i].shape!;
            if (i >= nState) actual = actual.filter((_, k) => k !== norm(inAxes[i - nState], actual.length));
            dimsOf(v).forEach((d, k) => typeof d === 'string' && sym.set(d, actual[k]));
          });
          const seq = ins[nState].shape![norm(inAxes[0], ins[nState].shape!.length)];
          outs = body.output.map((v: any, j: number) => {
            const shape = dimsOf(v).map((d) => (typeof d === 'string' ? sym.get(d)! : d));
            if (j >= nState) shape.splice(norm(outAxes[j - nState] ?? 0, shape.length + 1), 0, seq);
            return { shape };
          });
          break;
        }
        default:
          outs = [];
      }
    } catch {
      outs = [];
    }
    n.output.forEach((o, k) => info.set(o, outs[k] ?? {}));
  }
  return info;
}

// ---------------------------------------------------------------- the transform

export function addBackward(g: OnnxGraph, spec: BackwardSpec): string[] {
  const nodes = g.nodeList().slice(); // forward nodes only: the backward nodes are appended after
  const shapes = spec.symbols.map((sym, ev) =>
    inferShapes(g, nodes, (name) => {
      const declared = g.inputDims(name);
      if (!declared) return undefined;
      const over = spec.inputDims?.(name, declared, ev);
      if (over) return over;
      return declared.map((d) => (typeof d === 'number' ? d : sym[d]));
    }),
  );
  const shapeOf = (t: string, ev: number) => shapes[ev].get(t)?.shape;

  // which tensors depend on a requested one, and which the seeded output depends on
  const fromSrc = new Set(spec.wrt);
  const stop = new Set(spec.stop ?? []);
  for (const n of nodes) {
    if (NON_DIFF.has(n.opType)) continue;
    if (n.opType === 'Cast' && attr(n, 'to') !== 1) continue;
    if (n.input.some((i) => fromSrc.has(i))) n.output.forEach((o) => stop.has(o) || fromSrc.add(o));
  }
  const toOut = new Set([spec.output]);
  for (let k = nodes.length - 1; k >= 0; k--) {
    const n = nodes[k];
    if (NON_DIFF.has(n.opType)) continue;
    if (n.output.some((o) => toOut.has(o))) n.input.forEach((i) => i && toOut.add(i));
  }
  for (const w of spec.wrt) {
    if (!toOut.has(w))
      throw new LoupeError(
        'BAD_INPUT',
        `'${w}' does not feed the metric in this graph, so it has no gradient here.`,
        'Ask for a hook on the path from the input to the logits (hook_result is computed beside the graph, not on it: use hook_z).',
      );
  }
  const active = (t: string) => fromSrc.has(t) && toOut.has(t);
  // refuse before writing anything: every op on the gradient path needs a rule; a recurrence (Scan)
  // is named before the ops feeding it, since it is the one a caller must ask around
  const missing = nodes.filter(
    (n) => n.output.some(active) && n.input.some((i) => i !== '' && active(i)) && !VJP_OPS.has(n.opType),
  );
  if (missing.length) throw unsupported(missing[0]);
  const otherScan = nodes.find(
    (n) =>
      n.opType === 'Scan' && n.output.some(active) && n.input.some((i) => i !== '' && active(i)) && !isDeltaRuleScan(n),
  );
  if (otherScan) throw unsupported(otherScan);

  const contrib = new Map<string, string[]>();
  const addGrad = (t: string, gname: string) => {
    if (!active(t)) return;
    const list = contrib.get(t) ?? [];
    list.push(gname);
    contrib.set(t, list);
  };
  const gradOf = (t: string): string | undefined => {
    const list = contrib.get(t);
    if (!list || list.length === 0) return undefined;
    // a chain of Adds, not Sum: onnxruntime's WebGPU provider has no Sum kernel and ran it on the CPU
    if (list.length > 1) contrib.set(t, [list.slice(1).reduce((a, b) => g.o('Add', [a, b], {}, 'gsum'), list[0])]);
    return contrib.get(t)![0];
  };
  addGrad(spec.output, spec.seed);

  const staticShape = (t: string): number[] => {
    const a = shapeOf(t, 0),
      b = shapeOf(t, 1);
    if (!a || !b || a.length !== b.length) throw new LoupeError('INTERNAL', `backward: no inferred shape for ${t}`);
    return a.map((d, i) => (d === b[i] ? d : -1));
  };
  const rank = (t: string) => staticShape(t).length;
  const c = (v: number) => g.constF([v], []);
  const zerosLike = (t: string) =>
    g.o('ConstantOfShape', [g.o('Shape', [t])], { value: { tensor: { dims: [1], floats: [0] } } }, 'gzero');

  /** Sum a gradient shaped like `out` down to the shape of input `x` (undo broadcasting). */
  const unbroadcast = (gr: string, out: string, x: string): string => {
    const o0 = shapeOf(out, 0)!,
      o1 = shapeOf(out, 1)!;
    const x0 = shapeOf(x, 0),
      x1 = shapeOf(x, 1);
    if (!x0 || !x1) throw new LoupeError('INTERNAL', `backward: no inferred shape for ${x}`);
    const same = (a: number[], b: number[]) => a.length === b.length && a.every((d, i) => d === b[i]);
    if (same(o0, x0) && same(o1, x1)) return gr;
    const R = o0.length,
      r = x0.length;
    const axes: number[] = [];
    for (let i = 0; i < R; i++) {
      const k = i - (R - r);
      if (k < 0) {
        axes.push(i);
        continue;
      }
      const bc0 = x0[k] === 1 && o0[i] !== 1,
        bc1 = x1[k] === 1 && o1[i] !== 1;
      if (bc0 || bc1) {
        if (x0[k] !== 1 || x1[k] !== 1)
          throw new LoupeError('INTERNAL', `backward: axis ${i} of ${x} is broadcast in one shape evaluation only`);
        axes.push(i);
      }
    }
    let y = axes.length ? g.o('ReduceSum', [gr, g.constI(axes)], { keepdims: 1 }, 'gred') : gr;
    if (R > r) y = g.o('Squeeze', [y, g.constI(Array.from({ length: R - r }, (_, i) => i))]);
    return y;
  };
  const swapLast = (t: string, r: number) =>
    g.o('Transpose', [t], { perm: [...Array.from({ length: r - 2 }, (_, i) => i), r - 1, r - 2] });

  for (let k = nodes.length - 1; k >= 0; k--) {
    const n = nodes[k];
    if (!n.output.some(active)) continue;
    const needs = n.input.map((i) => i !== '' && active(i));
    if (!needs.some(Boolean)) continue;
    const gys = n.output.map((o) => gradOf(o));
    if (gys.every((x) => x === undefined)) continue;
    const gy = gys[0]!;
    const [a, b] = n.input;
    const y = n.output[0];
    const send = (i: number, v: () => string) => {
      if (needs[i]) addGrad(n.input[i], v());
    };
    switch (n.opType) {
      case 'Identity':
        send(0, () => gy);
        break;
      case 'Cast':
        send(0, () => gy);
        break;
      case 'Neg':
        send(0, () => g.o('Neg', [gy]));
        break;
      case 'Add':
        send(0, () => unbroadcast(gy, y, a));
        send(1, () => unbroadcast(gy, y, b));
        break;
      case 'Sub':
        send(0, () => unbroadcast(gy, y, a));
        send(1, () => unbroadcast(g.o('Neg', [gy]), y, b));
        break;
      case 'Mul':
        send(0, () => unbroadcast(g.o('Mul', [gy, b]), y, a));
        send(1, () => unbroadcast(g.o('Mul', [gy, a]), y, b));
        break;
      case 'Div':
        send(0, () => unbroadcast(g.o('Div', [gy, b]), y, a));
        send(1, () => unbroadcast(g.o('Neg', [g.o('Div', [g.o('Mul', [gy, y]), b])]), y, b));
        break;
      case 'Exp':
        send(0, () => g.o('Mul', [gy, y]));
        break;
      case 'Softplus': // d log(1 + eˣ) = σ(x)
        send(0, () => g.o('Mul', [gy, g.o('Sigmoid', [a])]));
        break;
      case 'Sqrt': // d√x = 1 / (2√x)
        send(0, () => g.o('Div', [g.o('Mul', [gy, c(0.5)]), y]));
        break;
      case 'Tanh':
        send(0, () => g.o('Mul', [gy, g.o('Sub', [c(1), g.o('Mul', [y, y])])]));
        break;
      case 'Sigmoid':
        send(0, () => g.o('Mul', [gy, g.o('Mul', [y, g.o('Sub', [c(1), y])])]));
        break;
      case 'Erf': // d erf(x) = 2/√π e^{−x²}
        send(0, () =>
          g.o('Mul', [gy, g.o('Mul', [g.o('Exp', [g.o('Neg', [g.o('Mul', [a, a])])]), c(2 / Math.sqrt(Math.PI))])]),
        );
        break;
      case 'Relu':
        send(0, () => g.o('Mul', [gy, g.o('Cast', [g.o('Greater', [a, c(0)])], { to: 1 })]));
        break;
      case 'Clip': // 1 where x was not clamped (the bounds included, as torch.clamp's gradient)
        send(0, () => g.o('Mul', [gy, g.o('Cast', [g.o('Equal', [y, a])], { to: 1 })]));
        break;
      case 'Softmax': {
        // y ⊙ (g − Σ g⊙y)
        const ax = norm(attr(n, 'axis') ?? -1, rank(y));
        send(0, () =>
          g.o('Mul', [y, g.o('Sub', [gy, g.o('ReduceSum', [g.o('Mul', [gy, y]), g.constI([ax])], { keepdims: 1 })])]),
        );
        break;
      }
      case 'MatMul': {
        const ra = rank(a),
          rb = rank(b);
        if (ra < 2 || rb < 2) throw unsupported(n, 'MatMul with a vector operand');
        send(0, () => unbroadcast(g.o('MatMul', [gy, swapLast(b, rb)]), y, a));
        send(1, () => unbroadcast(g.o('MatMul', [swapLast(a, ra), gy]), y, b));
        break;
      }
      case 'Gemm': {
        if ((attr(n, 'alpha') ?? 1) !== 1 || (attr(n, 'beta') ?? 1) !== 1 || attr(n, 'transA'))
          throw unsupported(n, 'Gemm with alpha, beta or transA');
        const tb = attr(n, 'transB') === 1;
        send(0, () => g.o('Gemm', [gy, b], tb ? {} : { transB: 1 })); // g · op(B)ᵀ
        send(1, () => (tb ? g.o('Gemm', [gy, a], { transA: 1 }) : g.o('Gemm', [a, gy], { transA: 1 })));
        if (n.input.length > 2) send(2, () => unbroadcast(gy, y, n.input[2]));
        break;
      }
      case 'MatMulNBits': {
        // y = x · Wᵀ with W [N, K] the q4 matrix (onnx-builder.ts linear): ∂x = g · W, W widened as weight() widens it
        const [N, K, block] = ['N', 'K', 'block_size'].map((k) => attr(n, k) as number);
        if (rank(a) !== 2) throw unsupported(n, 'MatMulNBits of a non-matrix input');
        send(0, () => g.o('MatMul', [gy, g.widenQ4(b, n.input[2], N, K, block)]));
        break;
      }
      case 'Reshape':
        send(0, () => g.o('Reshape', [gy, g.o('Shape', [a])]));
        break;
      case 'Expand':
        send(0, () => unbroadcast(gy, y, a));
        break;
      case 'Transpose': {
        const perm: number[] = attr(n, 'perm') ?? Array.from({ length: rank(a) }, (_, i) => rank(a) - 1 - i);
        const inv = perm.slice();
        perm.forEach((p, i) => {
          inv[p] = i;
        });
        send(0, () => g.o('Transpose', [gy], { perm: inv }));
        break;
      }
      case 'Unsqueeze':
        send(0, () => g.o('Squeeze', [gy, b]));
        break;
      case 'Squeeze':
        send(0, () => g.o('Unsqueeze', [gy, b]));
        break;
      case 'Split': {
        const ax = attr(n, 'axis') ?? 0;
        send(0, () =>
          g.o(
            'Concat',
            n.output.map((o, i) => gys[i] ?? zerosLike(o)),
            { axis: ax },
          ),
        );
        break;
      }
      case 'Concat': {
        const ax = norm(attr(n, 'axis'), rank(y));
        // dynamic offsets: the sizes along the axis are read from the inputs at run time
        let start = g.constI([0]);
        n.input.forEach((x, i) => {
          const size = g.o('Slice', [g.o('Shape', [x]), g.constI([ax]), g.constI([ax + 1])]);
          const end = g.o('Add', [start, size]);
          const st = start;
          send(i, () => g.o('Slice', [gy, st, end, g.constI([ax])]));
          start = end;
        });
        break;
      }
      case 'Slice': {
        const xs = staticShape(a);
        const info0 = shapes[0];
        const starts = info0.get(n.input[1])?.ints,
          ends = info0.get(n.input[2])?.ints;
        const axes = n.input[3] ? info0.get(n.input[3])?.ints : starts?.map((_, i) => i);
        if (!starts || !ends || !axes || (n.input[4] && info0.get(n.input[4])?.ints?.some((s) => s !== 1)))
          throw unsupported(n, 'Slice with non-constant bounds or steps');
        const pads = new Array(2 * xs.length).fill(0);
        axes.forEach((ax0, i) => {
          const ax = norm(ax0, xs.length);
          const d = xs[ax];
          if (d < 0) {
            // a dynamic axis: the pads are still static when the start counts from the front and the
            // end from the back (GPT-OSS's sink column sliced off the key axis: ends −1)
            const [st, en] = [starts[i], ends[i]];
            if (!(st >= 0 && (en < 0 || en >= 2 ** 31 - 1))) throw unsupported(n, 'Slice along a dynamic axis');
            pads[ax] = st;
            pads[xs.length + ax] = en < 0 ? -en : 0;
            return;
          }
          const st = Math.min(Math.max(starts[i] < 0 ? starts[i] + d : starts[i], 0), d);
          const en = Math.min(Math.max(ends[i] < 0 ? ends[i] + d : ends[i], 0), d);
          pads[ax] = st;
          pads[xs.length + ax] = d - en;
        });
        send(0, () => g.o('Pad', [gy, g.constI(pads)]));
        break;
      }
      case 'Gather': {
        const ax = norm(attr(n, 'axis') ?? 0, rank(a));
        if (rank(n.input[1]) !== 1) throw unsupported(n, 'Gather of an activation with indices that are not a vector');
        // scatter-add g back to the gathered rows: indices reshaped to broadcast along the other axes
        send(0, () => {
          const r = rank(a);
          const idx = g.o('Expand', [
            g.o('Reshape', [b, g.constI(Array.from({ length: r }, (_, i) => (i === ax ? -1 : 1)))]),
            g.o('Shape', [gy]),
          ]);
          return g.o('ScatterElements', [zerosLike(a), idx, gy], { axis: ax, reduction: 'add' });
        });
        break;
      }
      case 'ReduceMean': {
        if ((attr(n, 'keepdims') ?? 1) !== 1) throw unsupported(n, 'ReduceMean without keepdims');
        const xs = staticShape(a);
        const axes: number[] = (attr(n, 'axes') ?? xs.map((_, i) => i)).map((x: number) => norm(x, xs.length));
        const count = prod(axes.map((i) => xs[i]));
        if (count <= 0) throw unsupported(n, 'ReduceMean over a dynamic axis');
        send(0, () => g.o('Expand', [g.o('Mul', [gy, c(1 / count)]), g.o('Shape', [a])]));
        break;
      }
      case 'ReduceSum': {
        // axes as a constant input (opset 13+); keepdims 0 puts the summed axes back first
        const xs = staticShape(a);
        const axes = (n.input[1] ? shapes[0].get(n.input[1])?.ints : xs.map((_, i) => i))?.map((x) =>
          norm(x, xs.length),
        );
        if (!axes) throw unsupported(n, 'ReduceSum with non-constant axes');
        const keep = (attr(n, 'keepdims') ?? 1) === 1;
        send(0, () =>
          g.o('Expand', [keep ? gy : g.o('Unsqueeze', [gy, g.constI(axes.sort((p, q) => p - q))]), g.o('Shape', [a])]),
        );
        break;
      }
      case 'ReduceSumSquare': {
        // 2x ⊙ ∂y broadcast back; axes as an attribute (opset < 18)
        const xs = staticShape(a);
        const axes: number[] = (attr(n, 'axes') ?? xs.map((_, i) => i)).map((x: number) => norm(x, xs.length));
        const keep = (attr(n, 'keepdims') ?? 1) === 1;
        const gyk = keep ? gy : g.o('Unsqueeze', [gy, g.constI(axes.sort((p, q) => p - q))]);
        send(0, () => g.o('Mul', [g.o('Mul', [a, c(2)]), gyk]));
        break;
      }
      case 'Scan': {
        // the gated delta rule (inputs S0, q, k, v, β, g): its reverse Scan; the initial state gets no gradient
        const grads = deltaRuleBackward(g, n, gys[1] ?? zerosLike(n.output[1]), gys[0], `gscan${k}_`);
        grads.forEach((gr, i) => send(i + 1, () => gr));
        break;
      }
      default:
        throw unsupported(n);
    }
  }

  const outs: string[] = [];
  for (const w of spec.wrt) {
    const gr = gradOf(w) ?? zerosLike(w);
    const name = gradName(w);
    g.identity(gr, name);
    g.output(name);
    outs.push(name);
  }
  return outs;
}

function unsupported(n: Node, what?: string): LoupeError {
  if (n.opType === 'Scan')
    return new LoupeError(
      'UNSUPPORTED_OP',
      "Gradients through this ONNX 'Scan' (a recurrence over positions) are not implemented: the backward " +
        "pass has a rule for the gated delta rule's Scan (Qwen3.5's linear attention) only.",
      'Ask for gradients at hooks after the recurrence, or use ablate or patch (no gradients).',
      { op: 'Scan' },
    );
  return new LoupeError(
    'UNSUPPORTED_OP',
    `Gradients through the ONNX op '${n.opType}'${what ? ` (${what})` : ''} are not implemented, so no gradient is computed.`,
    'Ask for gradients at hooks after this op, or run without gradients.',
    { op: n.opType },
  );
}
