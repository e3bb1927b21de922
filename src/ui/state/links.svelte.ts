/**
 * What links the views: the head in focus (one object in every view: the trace heatmap and its
 * top-heads table, circuit bars, patch maps, attention thumbnails; clicking one opens its pattern
 * with actions) and the token position under the pointer (highlighted in every view that draws
 * positions: elements carrying data-pos). Clicking a token fills a position into the form.
 */
import type { FormStore, Fills } from './forms.svelte';
import type { ShareModel } from '../../share/codec';

export interface HeadRef {
  layer: number;
  head: number;
  /** the model of the result the head was clicked in (null: none known); the panel runs only on it */
  model: ShareModel | null;
}

/** "L3H7" → {layer: 3, head: 7} (bars and tables label heads this way) */
export function parseHead(label: string): Omit<HeadRef, 'model'> | null {
  const m = /^L(\d+)H(\d+)$/.exec(label.trim());
  return m ? { layer: Number(m[1]), head: Number(m[2]) } : null;
}

export class LinkStore {
  head = $state<HeadRef | null>(null);
  hoverPos = $state<number | null>(null);

  constructor(
    private readonly forms: FormStore,
    private readonly notify: (kind: 'info', text: string, ms?: number) => void,
    /** the model of the result in view: a head clicked there is that model's */
    private readonly shownModel: () => ShareModel | null = () => null,
  ) {}

  openHead(layer: number, head: number): void {
    this.head = { layer, head, model: this.shownModel() };
  }

  isHead(layer: number, head: number): boolean {
    return this.head?.layer === layer && this.head.head === head;
  }

  /** fill forms and switch to an operation (an action on a head, a click on a cell) */
  goTo(op: string, fills: Fills): void {
    this.forms.fill(fills);
    this.forms.select(op);
  }

  /**
   * A click on a token: add its position to the `positions` field of the current operation's form
   * (or of ablate, when the current one has none).
   */
  pickPosition(pos: number): void {
    const has = (op: string) => this.forms.fieldsFor(op).some((f) => f.name === 'positions');
    const op = has(this.forms.op) ? this.forms.op : 'ablate';
    if (!has(op)) return;
    const cur = String(this.forms.params[op]?.positions ?? '').trim();
    const list =
      cur && cur !== 'all'
        ? cur
            .split(/[\s,]+/)
            .filter(Boolean)
            .map(Number)
        : [];
    const next = list.includes(pos) ? list.filter((p) => p !== pos) : [...list, pos].sort((a, b) => a - b);
    this.forms.setParam(op, 'positions', next.join(', '));
    this.notify('info', `${op} positions: ${next.join(', ') || 'all (none picked)'}`, 3000);
  }
}
