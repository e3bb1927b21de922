/**
 * The gated delta rule of Qwen3.5's linear-attention layers (transformers'
 * torch_recurrent_gated_delta_rule) as ONNX Scans: the forward recurrence the model graph runs,
 * and its reverse-mode derivative the backward pass (backward.ts) appends. One step, per batch
 * row and value head, with the state S [Dk, Dv], q (already scaled by 1/√Dk), k [Dk], v [Dv],
 * β and the log-decay g:
 *
 *   S₁ = e^g S_{t−1};  u = v − S₁ᵀk;  δ = β u;  S_t = S₁ + k δᵀ;  o_t = S_tᵀ q
 *
 * Its derivative, given ∂M/∂o_t and ∂M/∂S_t (carried backwards from the last position; zero after
 * it, since the final state feeds no metric in a gradient run):
 *
 *   ∂S_t += q ∂oᵀ;  ∂q = S_t ∂o;  ∂δ = ∂S_tᵀ k;  ∂k = ∂S_t δ + S₁ ∂u';  ∂v = β ∂δ;
 *   ∂β = u·∂δ;  ∂u' = −β ∂δ (∂ of S₁ᵀk);  ∂S₁ = ∂S_t + k ∂u'ᵀ;  ∂g = Σ S₁ ⊙ ∂S₁;  ∂S_{t−1} = e^g ∂S₁
 *
 * The backward needs every S_{t−1}: a second forward Scan (the same step) emits them, then a
 * reverse Scan runs the step above; the forward graph's nodes are untouched. Memory: T states
 * [B, Hv, Dk, Dv] per layer while its backward runs.
 */
import { OnnxGraph } from './onnx-builder';

export interface DeltaRuleDims {
  Hv: number;
  Dk: number;
  Dv: number;
}

/** one position's S₁, u, δ and S_t from the incoming state and that position's k, v, β, g */
function step(f: OnnxGraph, S: string, k: string, v: string, beta: string, gl: string) {
  const col = (t: string) => f.o('Unsqueeze', [t, f.constI([2, 3])]); // `b h -> b h 1 1`
  const decay = f.o('Exp', [col(gl)]);
  const S1 = f.o('Mul', [S, decay]);
  const kRow = f.o('Unsqueeze', [k, f.constI([2])]); // [B, Hv, 1, Dk]
  const kCol = f.o('Unsqueeze', [k, f.constI([3])]); // [B, Hv, Dk, 1]
  const u = f.o('Sub', [f.o('Unsqueeze', [v, f.constI([2])]), f.o('MatMul', [kRow, S1])]); // v − S₁ᵀk as a row
  const b = col(beta);
  const delta = f.o('Mul', [u, b]);
  const St = f.o('Add', [S1, f.o('MatMul', [kCol, delta])]);
  return { decay, S1, kRow, kCol, u, b, delta, St };
}

/** a body's inputs: the state, then one position of each named scan input */
function inputs(f: OnnxGraph, prefix: string, d: DeltaRuleDims, names: string[]): string[] {
  const dims: Record<string, (number | string)[]> = {
    S: ['B', d.Hv, d.Dk, d.Dv],
    dS: ['B', d.Hv, d.Dk, d.Dv],
    Sprev: ['B', d.Hv, d.Dk, d.Dv],
    q: ['B', d.Hv, d.Dk],
    k: ['B', d.Hv, d.Dk],
    v: ['B', d.Hv, d.Dv],
    beta: ['B', d.Hv],
    g: ['B', d.Hv],
    dO: ['B', d.Hv, d.Dv],
  };
  return names.map((n) => f.input(`${prefix}${n}`, 'float', dims[n]));
}
const STATE = (d: DeltaRuleDims) => ['B', d.Hv, d.Dk, d.Dv];

/**
 * The forward recurrence: S0 [B, Hv, Dk, Dv] and q, k [B, T, Hv, Dk], v [B, T, Hv, Dv], β, g
 * [B, T, Hv]; returns the final state and o [B, T, Hv, Dv].
 */
export function deltaRuleScan(g: OnnxGraph, prefix: string, d: DeltaRuleDims, ins: string[]): [string, string] {
  const f = g.body(prefix);
  const [S, q, k, v, beta, gl] = inputs(f, prefix, d, ['S', 'q', 'k', 'v', 'beta', 'g']);
  const { St } = step(f, S, k, v, beta, gl);
  const o = f.o('Squeeze', [f.o('MatMul', [f.o('Unsqueeze', [q, f.constI([2])]), St]), f.constI([2])]);
  f.output(St, 'float', STATE(d)); // (onnxruntime's Scan asks for its body's output shapes)
  f.output(o, 'float', ['B', d.Hv, d.Dv]);
  const [sT, out] = g.op('Scan', ins, { body: { graph: f }, ...SCAN_ATTRS }, 2);
  return [sT, out];
}
const SCAN_ATTRS = { num_scan_inputs: 5, scan_input_axes: [1, 1, 1, 1, 1], scan_output_axes: [1] };

/** the body's op types, in order, as deltaRuleScan writes it: what marks a Scan as this rule's */
let signature: string | undefined;
const opTypes = (body: any): string => body.node.map((n: any) => n.opType).join(',');

/** whether a Scan node of the graph (its input names and attributes) is deltaRuleScan's */
export function isDeltaRuleScan(n: { input: string[]; attribute: any[] }): boolean {
  const a = (name: string) => n.attribute.find((x: any) => x.name === name);
  const body = a('body')?.g;
  if (!body || n.input.length !== 6 || Number(a('num_scan_inputs')?.i) !== 5) return false;
  if (a('scan_input_directions') || a('scan_output_directions')) return false;
  if ((a('scan_input_axes')?.ints ?? []).map(Number).join() !== '1,1,1,1,1') return false;
  if ((a('scan_output_axes')?.ints ?? []).map(Number).join() !== '1') return false;
  signature ??= opTypes(probeBody());
  return body.input.length === 6 && body.output.length === 2 && opTypes(body) === signature;
}

/** the dims a delta-rule Scan was written for, read from its body's declared state input */
export function deltaRuleDims(n: { attribute: any[] }): DeltaRuleDims {
  const body = n.attribute.find((x: any) => x.name === 'body').g;
  const [, Hv, Dk, Dv] = body.input[0].type.tensorType.shape.dim.map((x: any) => Number(x.dimValue));
  return { Hv, Dk, Dv };
}

function probeBody(): any {
  const g = new OnnxGraph(() => '');
  deltaRuleScan(g, 'probe_', { Hv: 1, Dk: 1, Dv: 1 }, ['s', 'q', 'k', 'v', 'b', 'g']);
  const scan = g.nodeList()[g.nodeList().length - 1];
  return scan.attribute.find((x: any) => x.name === 'body').g;
}

/**
 * ∂M/∂(q, k, v, β, g) of a delta-rule Scan node (inputs S0, q, k, v, β, g) given ∂M/∂o [B, T, Hv, Dv]
 * and ∂M/∂S_T (undefined: zero); appended to g. Returns the five gradients, each shaped like its input.
 */
export function deltaRuleBackward(
  g: OnnxGraph,
  n: { input: string[]; attribute: any[] },
  dOut: string,
  dFinal: string | undefined,
  prefix: string,
): string[] {
  const d = deltaRuleDims(n);
  const [S0, q, k, v, beta, gl] = n.input;

  // every incoming state S_{t−1}: the same step, emitting its input. ∂o rides along unused, so this Scan
  // waits for the gradient and runs just before its reverse Scan (not with the forward: then every
  // layer's T states were held at once)
  const fw = g.body(`${prefix}re_`);
  const [S, kt, vt, bt, gt] = inputs(fw, `${prefix}re_`, d, ['S', 'k', 'v', 'beta', 'g', 'dO']);
  fw.output(step(fw, S, kt, vt, bt, gt).St, 'float', STATE(d));
  fw.output(fw.o('Identity', [S]), 'float', STATE(d));
  const [, Sprevs] = g.op(
    'Scan',
    [S0, k, v, beta, gl, dOut],
    // the states stacked on axis 0 [T, B, Hv, Dk, Dv]: onnxruntime's Scan copies any other axis through a transpose
    { body: { graph: fw }, num_scan_inputs: 5, scan_input_axes: [1, 1, 1, 1, 1], scan_output_axes: [0] },
    2,
  );

  // the reverse pass: state ∂S_t, from the last position to the first
  const bw = g.body(`${prefix}bw_`);
  const [dS0, Sp, qb, kb, vb, bb, gb, dO] = inputs(bw, `${prefix}bw_`, d, [
    'dS',
    'Sprev',
    'q',
    'k',
    'v',
    'beta',
    'g',
    'dO',
  ]);
  const s = step(bw, Sp, kb, vb, bb, gb);
  const dORow = bw.o('Unsqueeze', [dO, bw.constI([2])]); // [B, Hv, 1, Dv]
  const dS = bw.o('Add', [dS0, bw.o('MatMul', [bw.o('Unsqueeze', [qb, bw.constI([3])]), dORow])]);
  const dq = bw.o('Squeeze', [bw.o('MatMul', [s.St, bw.o('Unsqueeze', [dO, bw.constI([3])])]), bw.constI([3])]);
  const dDelta = bw.o('MatMul', [s.kRow, dS]); // ∂Sᵀk as a row [B, Hv, 1, Dv]
  const dv = bw.o('Squeeze', [bw.o('Mul', [dDelta, s.b]), bw.constI([2])]);
  const dBeta = bw.o('ReduceSum', [bw.o('Mul', [s.u, dDelta]), bw.constI([2, 3])], { keepdims: 0 });
  const dMem = bw.o('Neg', [bw.o('Mul', [dDelta, s.b])]); // ∂(S₁ᵀk) as a row
  const dS1 = bw.o('Add', [dS, bw.o('MatMul', [s.kCol, dMem])]);
  const T = (x: string) => bw.o('Transpose', [x], { perm: [0, 1, 3, 2] });
  const dk = bw.o('Squeeze', [
    bw.o('Add', [bw.o('MatMul', [dS, T(s.delta)]), bw.o('MatMul', [s.S1, T(dMem)])]),
    bw.constI([3]),
  ]);
  const dg = bw.o('ReduceSum', [bw.o('Mul', [s.S1, dS1]), bw.constI([2, 3])], { keepdims: 0 });
  bw.output(bw.o('Mul', [dS1, s.decay]), 'float', STATE(d));
  bw.output(dq, 'float', ['B', d.Hv, d.Dk]);
  bw.output(dk, 'float', ['B', d.Hv, d.Dk]);
  bw.output(dv, 'float', ['B', d.Hv, d.Dv]);
  bw.output(dBeta, 'float', ['B', d.Hv]);
  bw.output(dg, 'float', ['B', d.Hv]);
  const dInit =
    dFinal ?? g.o('ConstantOfShape', [g.o('Shape', [S0])], { value: { tensor: { dims: [1], floats: [0] } } });
  const outs = g.op(
    'Scan',
    [dInit, Sprevs, q, k, v, beta, gl, dOut],
    {
      body: { graph: bw },
      num_scan_inputs: 7,
      scan_input_axes: [0, 1, 1, 1, 1, 1, 1],
      scan_input_directions: new Array(7).fill(1),
      scan_output_axes: new Array(5).fill(1),
      scan_output_directions: new Array(5).fill(1),
    },
    6,
  );
  return outs.slice(1);
}
