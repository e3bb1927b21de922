/**
 * A small DSL over onnx-proto for writing a graph by hand: `op()` adds a node and returns its
 * output name, `weight()` declares an initializer whose bytes stay in the safetensors file
 * (ONNX external data: location/offset/length), `input()`/`output()` declare graph I/O.
 */
import onnxProto from 'onnx-proto';
import type { TensorEntry } from '../safetensors-types';

const { onnx } = onnxProto as any;
const DT = { FLOAT: 1, INT64: 7, FLOAT16: 10, BFLOAT16: 16 } as const;

type Attr = number | number[] | string | { tensor: { dims: number[]; floats?: number[]; ints?: number[] } };

export class OnnxGraph {
  private nodes: any[] = [];
  private initializers: any[] = [];
  private inputs: any[] = [];
  private outputs: any[] = [];
  private counter = 0;
  private consts = new Map<string, string>();
  private weights = new Map<string, string>();

  constructor(private readonly weightFileName: (file: string) => string) {}

  private fresh(hint: string): string {
    return `${hint}_${this.counter++}`;
  }

  /** Add one node; returns its output names (one unless nOut > 1). */
  op(type: string, inputs: string[], attrs: Record<string, Attr> = {}, nOut = 1, hint = type): string[] {
    const outs = Array.from({ length: nOut }, () => this.fresh(hint));
    this.nodes.push(onnx.NodeProto.create({ opType: type, input: inputs, output: outs, name: this.fresh('n'), attribute: Object.entries(attrs).map(([k, v]) => attr(k, v)) }));
    return outs;
  }

  /** Single-output convenience. */
  o(type: string, inputs: string[], attrs: Record<string, Attr> = {}, hint?: string): string {
    return this.op(type, inputs, attrs, 1, hint)[0];
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
    const key = `f${dims}:${values}`;
    const hit = this.consts.get(key);
    if (hit) return hit;
    const name = this.fresh('cf');
    this.initializers.push(onnx.TensorProto.create({ name, dims, dataType: DT.FLOAT, floatData: values }));
    this.consts.set(key, name);
    return name;
  }

  constI(values: number[], dims: number[] = [values.length]): string {
    const key = `i${dims}:${values}`;
    const hit = this.consts.get(key);
    if (hit) return hit;
    const name = this.fresh('ci');
    this.initializers.push(onnx.TensorProto.create({ name, dims, dataType: DT.INT64, int64Data: values }));
    this.consts.set(key, name);
    return name;
  }

  /** A weight read by ORT straight from the safetensors bytes; half types are cast to float32 in-graph. */
  weight(e: TensorEntry): string {
    const hit = this.weights.get(e.name);
    if (hit) return hit;
    const dataType = e.dtype === 'F32' ? DT.FLOAT : e.dtype === 'F16' ? DT.FLOAT16 : e.dtype === 'BF16' ? DT.BFLOAT16 : -1;
    if (dataType < 0) throw new Error(`weight ${e.name}: dtype ${e.dtype} cannot be used as a float weight`);
    const name = `w:${e.name}`;
    this.initializers.push(onnx.TensorProto.create({
      name, dims: e.shape, dataType, dataLocation: 1,
      externalData: [
        { key: 'location', value: this.weightFileName(e.file) },
        { key: 'offset', value: String(e.fileOffset) },
        { key: 'length', value: String(e.byteLength) },
      ],
    }));
    const out = dataType === DT.FLOAT ? name : this.o('Cast', [name], { to: DT.FLOAT }, 'cast');
    this.weights.set(e.name, out);
    return out;
  }

  input(name: string, elemType: 'float' | 'int64', dims?: (number | string)[]): string {
    this.inputs.push(valueInfo(name, elemType, dims));
    return name;
  }

  output(name: string, elemType: 'float' | 'int64' = 'float'): void {
    this.outputs.push(valueInfo(name, elemType));
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

  /** Serialise to ONNX bytes (opset 17, IR 8). */
  encode(): Uint8Array {
    const graph = onnx.GraphProto.create({ name: 'loupe', node: this.nodes, initializer: this.initializers, input: this.inputs, output: this.outputs });
    const model = onnx.ModelProto.create({ irVersion: 8, producerName: 'loupe', opsetImport: [{ domain: '', version: 17 }], graph });
    return onnx.ModelProto.encode(model).finish();
  }
}

function valueInfo(name: string, elemType: 'float' | 'int64', dims?: (number | string)[]) {
  const tensorType: any = { elemType: elemType === 'float' ? DT.FLOAT : DT.INT64 };
  if (dims) tensorType.shape = { dim: dims.map((d) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d })) };
  return onnx.ValueInfoProto.create({ name, type: { tensorType } });
}

function attr(name: string, v: Attr) {
  // AttributeProto.AttributeType: FLOAT=1, INT=2, STRING=3, TENSOR=4, INTS=7
  // Only integer attributes are used; float parameters go in as constants so no value is ever mistyped.
  if (typeof v === 'number') return { name, type: 2, i: v };
  if (typeof v === 'string') return { name, type: 3, s: new TextEncoder().encode(v) };
  if (Array.isArray(v)) return { name, type: 7, ints: v };
  return { name, type: 4, t: { dims: v.tensor.dims, dataType: v.tensor.floats ? DT.FLOAT : DT.INT64, floatData: v.tensor.floats, int64Data: v.tensor.ints } };
}

