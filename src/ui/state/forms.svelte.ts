/**
 * What the user is setting up: the prompt, the selected operation, each operation's form values
 * (raw, as typed) and their validation errors, and the operations the worker offers. The inputs
 * persist in this browser (prefs) so a reload keeps them.
 */
import { prefs } from './prefs';
import { fieldsOf, buildInput, rawFromInput, visibleFields, type Field } from '../forms/schema-form';
import type { OperationInfo } from '../../../workers/protocol';
import type { ErrorInfo } from './errors';

/**
 * Values that mean the same experiment in sibling forms, carried from one to the others as they
 * are typed: the clean/corrupted pair and its metric tokens across the causal methods (one metric:
 * ops/lib/metric.ts), the direction across the steering checks. The prompt is shared already.
 */
const CARRIED: [string[], string[]][] = [
  [
    ['patch', 'attribution_patching', 'integrated_gradients'],
    ['corrupted_prompt', 'answer', 'counterfactual'],
  ],
  [
    ['steer', 'sweep', 'causality'],
    ['direction', 'layer'],
  ],
];

/** the prompt a first visit starts with */
export const DEFAULT_PROMPT = 'Once upon a time, there was a little';

/** Form values handed on: `{ op: { field: value } }` merged into those forms. */
export type Fills = Record<string, Record<string, unknown>>;

export class FormStore {
  prompt = $state(DEFAULT_PROMPT);
  op = $state('trace');
  params = $state<Record<string, Record<string, unknown>>>({});
  errors = $state<Record<string, string>>({});
  ops = $state.raw<OperationInfo[]>([]);
  /** called when the person edits an input (the page drops an error about the old input) */
  onEdit: () => void = () => {};
  opsError = $state<ErrorInfo | null>(null);

  constructor() {
    const last = prefs.lastInputs();
    if (last.prompt) this.prompt = last.prompt;
    if (last.op) this.op = last.op;
    if (last.params) this.params = last.params;
  }

  /** the worker's operations, in the registry's order (the tab order) */
  setOps(ops: OperationInfo[]): void {
    this.ops = ops;
    if (!this.ops.some((o) => o.name === this.op) && this.ops.length) this.op = this.ops[0].name;
    this.opsError = null;
  }

  get opInfo(): OperationInfo | undefined {
    return this.ops.find((o) => o.name === this.op);
  }

  /** an operation's title (its name, capitalised, until the worker has listed the operations) */
  title(op: string): string {
    return this.ops.find((o) => o.name === op)?.title ?? op.replace(/_/g, ' ').replace(/^\w/, (c) => c.toUpperCase());
  }

  /** after a run of `op`: fill the forms its document feeds (a capture's handle → the probe's capture) */
  fillFrom(op: string, doc: Record<string, unknown>): void {
    const feeds = this.ops.find((o) => o.name === op)?.feeds ?? {};
    const fills: Fills = {};
    for (const [target, fields] of Object.entries(feeds)) {
      for (const [field, from] of Object.entries(fields))
        if (doc[from] !== undefined) (fills[target] ??= {})[field] = doc[from];
    }
    this.fill(fills);
  }

  fieldsFor(op: string): Field[] {
    const info = this.ops.find((o) => o.name === op);
    return info ? fieldsOf(info.inputSchema) : [];
  }

  select(op: string): void {
    this.op = op;
    this.save();
  }

  save(): void {
    prefs.setLastInputs({ prompt: this.prompt, op: this.op, params: $state.snapshot(this.params) });
  }

  /** Build the input for an operation from its form and the prompt box. */
  inputFor(op: string): { input: Record<string, unknown>; errors: Record<string, string> } {
    const raw = $state.snapshot(this.params[op] ?? {});
    // a field that does not apply to the chosen options (a neuron when the subject is a feature) is not sent
    return buildInput(visibleFields(this.fieldsFor(op), raw), raw, this.prompt);
  }

  setParam(op: string, name: string, value: unknown): void {
    this.params[op] ??= {};
    this.params[op][name] = value;
    this.carry(op, { [name]: value });
    // the error this field had is about the old value
    if (op === this.op && this.errors[name]) delete this.errors[name];
    this.edited();
  }

  /**
   * One experiment across its methods: the carried fields among `values` (typed, filled from an
   * example, or sent in a run) follow into the sibling forms.
   */
  carry(op: string, values: Record<string, unknown>): void {
    for (const [ops, names] of CARRIED)
      if (ops.includes(op))
        for (const name of names)
          if (values[name] !== undefined && values[name] !== '')
            for (const other of ops) if (other !== op) (this.params[other] ??= {})[name] = values[name];
  }

  /** an input changed: keep it, and let errors about the old one go */
  edited(): void {
    this.save();
    this.onEdit();
  }

  /** merge values into other operations' forms (what follows a run, a click in a view) */
  fill(fills: Fills): void {
    for (const [op, values] of Object.entries(fills)) this.params[op] = { ...(this.params[op] ?? {}), ...values };
    this.save();
  }

  /**
   * Drop form values that name a layer or head a model does not have (after a model switch): a
   * layer or head field out of range is emptied (its default applies), out-of-range entries
   * leave lists. Returns what was cleared, as "op field".
   */
  fitModel(dims: { layers: number; heads: number }): string[] {
    const cleared: string[] = [];
    const limit = (name: string) =>
      /^(layer|values_layer)$/.test(name) ? dims.layers : name === 'head' ? dims.heads : null;
    const bad = (v: unknown, n: number) => {
      const x = Number(v);
      return Number.isInteger(x) && (x >= n || x < 0);
    };
    for (const [op, values] of Object.entries(this.params)) {
      for (const [name, v] of Object.entries(values ?? {})) {
        if (v === undefined || v === null || String(v).trim() === '') continue;
        const n = limit(name);
        let next: unknown = v;
        if (n !== null && bad(v, n)) next = '';
        else if (name === 'layers' && typeof v === 'string') {
          const kept = v.split(/[\s,]+/).filter((t) => t && !bad(t, dims.layers));
          if (kept.length !== v.split(/[\s,]+/).filter(Boolean).length) next = kept.join(', ');
        } else if (name === 'heads' && typeof v === 'string') {
          try {
            const list = JSON.parse(v);
            if (Array.isArray(list)) {
              const kept = list.filter(
                (h) => !(h && typeof h === 'object' && (bad(h.layer, dims.layers) || bad(h.head, dims.heads))),
              );
              if (kept.length !== list.length) next = kept.length ? JSON.stringify(kept) : '';
            }
          } catch {
            /* not JSON yet: the form's own check says so at run time */
          }
        }
        if (next !== v) {
          this.params[op][name] = next;
          cleared.push(`${op} ${name.replace(/_/g, ' ')} ${String(v)}`);
        }
      }
    }
    if (cleared.length) this.save();
    return cleared;
  }

  /** set an operation's form from a full input (a share link, a session entry) */
  fillFromInput(op: string, input: Record<string, unknown>): void {
    const fields = this.fieldsFor(op);
    if (fields.length) this.params[op] = rawFromInput(fields, input);
  }
}
