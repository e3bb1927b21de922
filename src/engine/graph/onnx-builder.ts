/**
 * A small DSL over onnx-proto for writing a graph by hand: `op()` adds a node and returns its
 * output name, `weight()` declares an initializer whose bytes stay in the safetensors file
 * (ONNX external data: location/offset/length), `input()`/`output()` declare graph I/O.
 */
import onnxProto from 'onnx-proto';
import type { Q8Layout, TensorEntry } from '../safetensors-types';
import { Q4_BLOB } from '../q4';
import type { WeightPrecision } from '../precision';

const { onnx } = onnxProto as any;

/** inputs of one Concat node (OnnxGraph.concat): 7 storage buffers + the output = WebGPU's default per-stage limit */
export const CONCAT_MAX_INPUTS = 7;
const DT = { FLOAT: 1, UINT8: 2, INT8: 3, INT64: 7, FLOAT16: 10, BFLOAT16: 16 } as const;

type Attr =
  | number
  | number[]
  | string
  | { float: number }
  | { tensor: { dims: number[]; floats?: number[]; ints?: number[] } }
  /** a subgraph (the body of a Scan): see OnnxGraph.body */
  | { graph: OnnxGraph };

/** onnxruntime's contrib operator domain (its fused kernels: FastGelu, SimplifiedLayerNormalization, …) */
export const MS_DOMAIN = 'com.microsoft';

/** A graph encoded, with what a session needs to know of it. */
export interface BuiltGraph {
  bytes: Uint8Array;
  inputNames: string[];
  outputNames: string[];
  /** hook sites that take mul/add inputs */
  sites: string[];
  /** how the graph holds its weights (session options depend on it) */
  precision: WeightPrecision;
  /** bytes of the weight initializers as the graph declares them (what a session holds at stored / q8) */
  weightBytes: number;
  /** onnxruntime session config entries the graph asks for (runtime/ort-session.ts graphSessionOptions) */
  sessionConfig?: Record<string, string>;
}

export class OnnxGraph {
  private nodes: any[] = [];
  private initializers: any[] = [];
  private inputs: any[] = [];
  private outputs: any[] = [];
  private counter = 0;
  private consts = new Map<string, string>();
  private weights = new Map<string, string>();

  /** weights kept in their own dtype ('stored', 'q8'): also declared as graph inputs, see rawWeight() */
  private readonly overridable: any[] = [];

  constructor(
    private readonly weightFileName: (file: string) => string,
    private readonly precision: WeightPrecision = 'f32',
    /** prefixed to every generated name: a subgraph's names must not shadow its outer graph's */
    private readonly namePrefix = '',
  ) {}

  private fresh(hint: string): string {
    return `${this.namePrefix}${hint}_${this.counter++}`;
  }

  /**
   * An empty graph for the body of a control-flow node (a Scan), its names under `prefix` (unique
   * within the model); it holds its own constants and passes as the attribute `{ graph: body }`.
   */
  body(prefix: string): OnnxGraph {
    return new OnnxGraph(this.weightFileName, this.precision, prefix);
  }

  /**
   * A body whose weights are this graph's (an If branch: graph/readout products): their
   * initializers stay here, read from the outer scope; float32 weights are this graph's own (folded
   * once at load), any other precision's widening is the body's, so it runs only when the body does.
   */
  bodyWithWeights(prefix: string): OnnxGraph {
    const b = new OnnxGraph(this.weightFileName, this.precision, prefix);
    b.outer = this;
    return b;
  }
  private outer?: OnnxGraph;

  /** Add one node; returns its output names (one unless nOut > 1). */
  op(type: string, inputs: string[], attrs: Record<string, Attr> = {}, nOut = 1, hint = type): string[] {
    const outs = Array.from({ length: nOut }, () => this.fresh(hint));
    this.nodes.push(
      onnx.NodeProto.create({
        opType: type,
        input: inputs,
        output: outs,
        name: this.fresh('n'),
        attribute: Object.entries(attrs).map(([k, v]) => attr(k, v)),
      }),
    );
    return outs;
  }

  /**
   * A node of onnxruntime's contrib domain (MS_DOMAIN); the model then imports that opset.
   * `unused`: indices of optional outputs left out (named '' in the node, so the kernel does not
   * compute them); their entries in the returned list are ''.
   */
  msOp(type: string, inputs: string[], attrs: Record<string, Attr> = {}, nOut = 1, unused: number[] = []): string[] {
    const outs = this.op(type, inputs, attrs, nOut);
    const node = this.nodes[this.nodes.length - 1];
    node.domain = MS_DOMAIN;
    for (const i of unused) outs[i] = node.output[i] = '';
    this.contrib = true;
    return outs;
  }
  private contrib = false;

  /** Single-output convenience. */
  o(type: string, inputs: string[], attrs: Record<string, Attr> = {}, hint?: string): string {
    return this.op(type, inputs, attrs, 1, hint)[0];
  }

  /**
   * Concat of any number of values, in groups of at most CONCAT_MAX_INPUTS (same result: a copy).
   * onnxruntime-web's WebGPU Concat binds every input as a storage buffer of one shader, and the
   * device it asks for keeps WebGPU's default of 8 storage buffers per stage: a Concat of more
   * than 7 inputs fails to compile there and its output is garbage, with no error (seen on
   * SwiftShader: 37 vocabulary chunks gave logits off by 13 while every hook agreed with WASM).
   */
  concat(parts: string[], axis: number): string {
    let level = parts;
    while (level.length > 1) {
      const next: string[] = [];
      for (let i = 0; i < level.length; i += CONCAT_MAX_INPUTS) {
        const group = level.slice(i, i + CONCAT_MAX_INPUTS);
        next.push(group.length === 1 ? group[0] : this.o('Concat', group, { axis }));
      }
      level = next;
    }
    return level[0];
  }

  /**
   * Give a computed value a fixed name (hook outputs, present keys) by renaming its producer's
   * output in place: no Identity node, so ORT returns the tensor itself rather than a copy.
   * Graph inputs and initializers cannot be renamed; those get an Identity.
   */
  rename(x: string, name: string): string {
    const producer = this.nodes.find((n) => n.output.includes(x));
    if (!producer) return this.identity(x, name);
    producer.output = producer.output.map((o: string) => (o === x ? name : o));
    for (const n of this.nodes) n.input = n.input.map((i: string) => (i === x ? name : i));
    return name;
  }

  /** A copy of a value under a fixed name. */
  identity(x: string, name: string): string {
    this.nodes.push(onnx.NodeProto.create({ opType: 'Identity', input: [x], output: [name], name: this.fresh('n') }));
    return name;
  }

  /** A small inline constant (shapes, scalars). Not for weights. */
  constF(values: number[], dims: number[] = [values.length]): string {
    return this.constant('f', values, dims);
  }

  constI(values: number[], dims: number[] = [values.length]): string {
    return this.constant('i', values, dims);
  }

  /** one initializer per distinct float ('f') or int64 ('i') constant */
  private constant(kind: 'f' | 'i', values: number[], dims: number[]): string {
    const key = `${kind}${dims}:${values}`;
    const hit = this.consts.get(key);
    if (hit) return hit;
    const name = this.fresh(`c${kind}`);
    const data = kind === 'f' ? { dataType: DT.FLOAT, floatData: values } : { dataType: DT.INT64, int64Data: values };
    this.initializers.push(onnx.TensorProto.create({ name, dims, ...data }));
    this.consts.set(key, name);
    return name;
  }

  /**
   * A weight as float32 at its point of use, read by ORT straight from the weight bytes; the one
   * place a weight enters the graph. Half types are cast in-graph.
   * 'f32': one Cast that ORT folds into a float32 initializer at session creation.
   * 'stored': the weight is a graph input too, so the Cast runs at each use (see rawWeight).
   * 'q8': tensors with a Q8Layout (q8.ts) are int8 + float16 scales, widened at each use as
   * q · s over the blocked view; any other weight is held as in 'stored'.
   * 'q4': tensors with a Q4Layout (q4.ts) are widened at use too (widenQ4), where a weight is used
   * other than as a Linear's matrix (`linear` multiplies by them without widening).
   * `after` (the activation the weight multiplies) orders the widening in 'stored'/'q8': without a
   * data dependency every Cast is ready when the run starts and onnxruntime widened all weights
   * at once (a peak RSS above that of f32 weights); with it only the weights of the op
   * being computed are float32.
   */
  weight(e: TensorEntry, after?: string): string {
    if (this.outer && this.precision === 'f32') return this.outer.weight(e);
    const ordered = this.precision !== 'f32' && e.dtype !== 'F32' && after !== undefined;
    const key = ordered ? `${e.name}|${after}` : e.name;
    const hit = this.weights.get(key);
    if (hit) return hit;
    let out: string;
    if (e.q4) {
      const { n, k, block, axis, scale } = e.q4;
      const dims = [n, k / block, Q4_BLOB];
      let raw = this.rawWeight(e);
      if (ordered)
        raw = this.o('Reshape', [raw, this.o('Add', [this.constI(dims), this.zeroAfter(after!)])], {}, 'wdep');
      const w = this.widenQ4(raw, this.rawWeight(scale), n, k, block);
      out = axis === 1 ? w : this.o('Transpose', [w], { perm: [1, 0] });
    } else if (e.q8) {
      const { axis, block, scale } = e.q8;
      const [R, C] = e.shape;
      // the blocked view: [out, in/block, block] (axis 1) or [in/block, block, out] (axis 0), broadcast against the scales
      const blocked = axis === 1 ? [R, C / block, block] : [R / block, block, C];
      const view = (t: TensorEntry, dims: number[]) =>
        this.o(
          'Reshape',
          [this.rawWeight(t), ordered ? this.o('Add', [this.constI(dims), this.zeroAfter(after!)]) : this.constI(dims)],
          {},
          'wdep',
        );
      const q = this.widenInt8(view(e, blocked), e.q8, blocked[2]);
      const s = this.widenScale(view(scale, scale.shape), scale);
      out = this.o('Reshape', [this.o('Mul', [q, s]), this.constI(e.shape)], {}, 'dq');
    } else {
      let raw = this.rawWeight(e);
      if (ordered)
        raw = this.o('Reshape', [raw, this.o('Add', [this.constI(e.shape), this.zeroAfter(after!)])], {}, 'wdep');
      out = e.dtype === 'F32' ? raw : this.o('Cast', [raw], { to: DT.FLOAT }, 'cast');
    }
    this.weights.set(key, out);
    return out;
  }

  /**
   * x [M, in] → x · W (+ b) [M, out] through a stored matrix `e` of either layout (`b m i, o i -> b m o` for
   * [out, in], `i o` for GPT-2's Conv1D [in, out]). A q4 matrix is multiplied as it is held, by
   * com.microsoft MatMulNBits (bits 4, its block; no zero points: q4.ts); others through weight() and Gemm.
   */
  linear(x: string, e: TensorEntry, layout: 'out_in' | 'in_out', bias?: TensorEntry): string {
    if (!e.q4) {
      const args = [x, this.weight(e, x)];
      if (bias) args.push(this.weight(bias));
      return this.o('Gemm', args, layout === 'out_in' ? { transB: 1 } : {});
    }
    const { n, k, block, scale } = e.q4;
    const [y] = this.msOp('MatMulNBits', [x, this.rawWeight(e), this.rawWeight(scale)], {
      K: k,
      N: n,
      bits: 4,
      block_size: block,
    });
    return bias ? this.o('Add', [y, this.weight(bias)]) : y;
  }

  /**
   * A q4 matrix as float32 [n, k] from its packed bytes [n, k/block, block/2] (uint8) and scales
   * [n · k/block]: (u − 8) · s, every step exact in float32. The bytes become floats through
   * DequantizeLinear with scales of 1 per axis, not a Cast (WebGPU has no uint8 Cast; see widenInt8
   * for why per axis); a byte b gives its low nibble b − 16·⌊b/16⌋ and its high nibble ⌊b/16⌋.
   * Public for the backward pass (backward.ts: the VJP of MatMulNBits).
   */
  widenQ4(packed: string, scales: string, n: number, k: number, block: number): string {
    const nb = k / block;
    const bytes = this.o('DequantizeLinear', [packed, this.constF(new Array(Q4_BLOB).fill(1))], { axis: -1 }, 'dq');
    const hi = this.o('Floor', [this.o('Mul', [bytes, this.constF([1 / 16], [])])]);
    const lo = this.o('Sub', [bytes, this.o('Mul', [hi, this.constF([16], [])])]);
    const last = this.constI([-1]);
    const pairs = this.o('Concat', [this.o('Unsqueeze', [lo, last]), this.o('Unsqueeze', [hi, last])], { axis: -1 });
    const u = this.o('Reshape', [pairs, this.constI([n, nb, block])]);
    const s = this.o('Reshape', [scales, this.constI([n, nb, 1])]);
    return this.o(
      'Reshape',
      [this.o('Mul', [this.o('Sub', [u, this.constF([8], [])]), s]), this.constI([n, k])],
      {},
      'dq',
    );
  }

  /** int64 [0] computed from x's shape: adding it to a constant shape makes a Reshape wait for x (a Reshape is a view, no copy). */
  private zeroAfter(x: string): string {
    let z = this.zeros.get(x);
    if (!z) {
      z = this.o('Mul', [
        this.o('Slice', [this.o('Shape', [x]), this.constI([0]), this.constI([1])]),
        this.constI([0]),
      ]);
      this.zeros.set(x, z);
    }
    return z;
  }
  private readonly zeros = new Map<string, string>();

  /**
   * Rows of a weight table (embeddings), as float32: in 'stored' only the gathered rows are
   * widened; at q8 only the gathered int8 rows and their scales (`idx d, idx (d/block) 1`).
   */
  gatherRows(e: TensorEntry, indices: string): string {
    if (e.q8) {
      const { block, scale } = e.q8;
      const D = e.shape[1];
      const lead = this.o('Shape', [indices]);
      const rows = this.widenInt8(this.o('Gather', [this.rawWeight(e), indices], { axis: 0 }), e.q8, D);
      const s = this.widenScale(this.o('Gather', [this.rawWeight(scale), indices], { axis: 0 }), scale);
      const blocked = this.o('Reshape', [rows, this.o('Concat', [lead, this.constI([D / block, block])], { axis: 0 })]);
      return this.o(
        'Reshape',
        [this.o('Mul', [blocked, s]), this.o('Concat', [lead, this.constI([D])], { axis: 0 })],
        {},
        'dq',
      );
    }
    if (this.precision === 'f32' || e.dtype === 'F32') return this.o('Gather', [this.weight(e), indices], { axis: 0 });
    return this.o('Cast', [this.o('Gather', [this.rawWeight(e), indices], { axis: 0 })], { to: DT.FLOAT }, 'cast');
  }

  /**
   * q8 values as float32: Cast, or in the WebGPU form (q8.ts q8ForWebGpu) DequantizeLinear with
   * scales of 1 (the same values) along x's last axis, of length `last`. Per axis, not one scalar
   * scale: onnxruntime-web 1.30's WebGPU DequantizeLinear reads packed int8 at the wrong offset
   * when it vectorises the per-tensor case (it indexes the u32 words by global_idx / 4 while each
   * invocation writes four values), which gave wrong numbers on SwiftShader.
   */
  private widenInt8(x: string, q8: Q8Layout, last: number): string {
    if (!q8.dequantize) return this.o('Cast', [x], { to: DT.FLOAT }, 'cast');
    return this.o('DequantizeLinear', [x, this.constF(new Array(last).fill(1))], { axis: -1 }, 'dq');
  }

  /** q8 scales as float32 (float16 ones are cast; the WebGPU form's are float32 already) */
  private widenScale(x: string, scale: TensorEntry): string {
    return scale.dtype === 'F32' ? x : this.o('Cast', [x], { to: DT.FLOAT }, 'cast');
  }

  /**
   * The initializer of a weight in its stored dtype. In 'stored' and 'q8' a non-float32 weight is also
   * declared as a graph input (an "overridable initializer", never fed): onnxruntime does not treat
   * those as constants, so neither constant folding nor the CPU provider's float16 handling (which
   * otherwise rewrites Cast(float16 initializer) into a float32 initializer even with constant
   * folding disabled — checked in the optimized model) turns it into a float32 copy.
   */
  private rawWeight(e: TensorEntry): string {
    if (this.outer) return this.outer.rawWeight(e);
    const name = `w:${e.name}`;
    if (this.raw.has(name)) return name;
    const dataType =
      e.dtype === 'F32'
        ? DT.FLOAT
        : e.dtype === 'F16'
          ? DT.FLOAT16
          : e.dtype === 'BF16'
            ? DT.BFLOAT16
            : e.dtype === 'I8' && e.q8
              ? DT.INT8
              : e.dtype === 'U8' && e.q4
                ? DT.UINT8
                : -1;
    if (dataType < 0) throw new Error(`weight ${e.name}: dtype ${e.dtype} cannot be used as a float weight`);
    // a q4 matrix is declared as MatMulNBits' B: [n, k/block, block/2] bytes
    const dims = e.q4 ? [e.q4.n, e.q4.k / e.q4.block, Q4_BLOB] : e.shape;
    this.initializers.push(
      onnx.TensorProto.create({
        name,
        dims,
        dataType,
        dataLocation: 1,
        externalData: [
          { key: 'location', value: this.weightFileName(e.file) },
          { key: 'offset', value: String(e.fileOffset) },
          { key: 'length', value: String(e.byteLength) },
        ],
      }),
    );
    if (this.precision !== 'f32' && dataType !== DT.FLOAT) {
      this.overridable.push(
        onnx.ValueInfoProto.create({
          name,
          type: { tensorType: { elemType: dataType, shape: { dim: dims.map((d) => ({ dimValue: d })) } } },
        }),
      );
    }
    this.raw.add(name);
    this.rawBytes += e.byteLength;
    return name;
  }
  private readonly raw = new Set<string>();
  private rawBytes = 0;

  /** bytes of every weight initializer declared so far, in its stored (or q8) dtype */
  weightBytes(): number {
    return this.rawBytes;
  }

  input(name: string, elemType: 'float' | 'int64', dims?: (number | string)[]): string {
    this.inputs.push(valueInfo(name, elemType, dims));
    return name;
  }

  output(name: string, elemType: 'float' | 'int64' = 'float', dims?: (number | string)[]): void {
    this.outputs.push(valueInfo(name, elemType, dims));
  }

  /** The nodes so far, in the order they were added (a topological order); for graph transforms (backward.ts). */
  nodeList(): readonly { opType: string; input: string[]; output: string[]; attribute: any[] }[] {
    return this.nodes;
  }

  /** Dims and (for int64 constants) values of an initializer, or undefined when the name is not one. */
  initializerInfo(name: string): { dims: number[]; ints?: number[] } | undefined {
    const t = this.initializers.find((i) => i.name === name);
    if (!t) return undefined;
    return { dims: t.dims.map(Number), ints: t.dataType === DT.INT64 ? t.int64Data.map(Number) : undefined };
  }

  /** Declared dims of a graph input (symbolic dims as strings), or undefined when the name is not an input. */
  inputDims(name: string): (number | string)[] | undefined {
    const i = this.inputs.find((x) => x.name === name);
    if (!i) return undefined;
    const dims = i.type?.tensorType?.shape?.dim ?? [];
    return dims.map((d: any) => (d.dimParam ? d.dimParam : Number(d.dimValue)));
  }

  inputNames(): string[] {
    return this.inputs.map((i) => i.name);
  }

  outputNames(): string[] {
    return this.outputs.map((o) => o.name);
  }

  /** The graph encoded, with what a session needs: its hook sites that take mul/add inputs, the config entries it asks for. */
  built(sites: string[] = [], sessionConfig?: Record<string, string>): BuiltGraph {
    return {
      bytes: this.encode(),
      inputNames: this.inputNames(),
      outputNames: this.outputNames(),
      sites,
      precision: this.precision,
      weightBytes: this.weightBytes(),
      ...(sessionConfig ? { sessionConfig } : {}),
    };
  }

  /** Serialise to ONNX bytes (opset 17, IR 8). */
  encode(): Uint8Array {
    const graph = this.graphProto('loupe');
    const model = onnx.ModelProto.create({
      irVersion: 8,
      producerName: 'loupe',
      opsetImport: [{ domain: '', version: 17 }, ...(this.contrib ? [{ domain: MS_DOMAIN, version: 1 }] : [])],
      graph,
    });
    return onnx.ModelProto.encode(model).finish();
  }

  graphProto(name: string): any {
    return onnx.GraphProto.create({
      name,
      node: this.nodes,
      initializer: this.initializers,
      input: [...this.inputs, ...this.overridable],
      output: this.outputs,
    });
  }
}

function valueInfo(name: string, elemType: 'float' | 'int64', dims?: (number | string)[]) {
  const tensorType: any = { elemType: elemType === 'float' ? DT.FLOAT : DT.INT64 };
  if (dims) tensorType.shape = { dim: dims.map((d) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d })) };
  return onnx.ValueInfoProto.create({ name, type: { tensorType } });
}

function attr(name: string, v: Attr) {
  // AttributeProto.AttributeType: FLOAT=1, INT=2, STRING=3, TENSOR=4, INTS=7
  // Integer attributes, except the epsilon of fused norms; other float parameters go in as constants.
  if (typeof v === 'number') return { name, type: 2, i: v };
  if (typeof v === 'string') return { name, type: 3, s: new TextEncoder().encode(v) };
  if (Array.isArray(v)) return { name, type: 7, ints: v };
  if ('float' in v) return { name, type: 1, f: v.float }; // fused kernels' epsilon
  if ('graph' in v) return { name, type: 5, g: v.graph.graphProto(name) }; // GRAPH
  return {
    name,
    type: 4,
    t: {
      dims: v.tensor.dims,
      dataType: v.tensor.floats ? DT.FLOAT : DT.INT64,
      floatData: v.tensor.floats,
      int64Data: v.tensor.ints,
    },
  };
}
