/**
 * The `app` the page's views read (src/ui/state/instance.ts), as an MCP Apps view has it: no
 * worker and no model, only the document the host passed and the host to ask for more. The apps
 * build (vite.apps.config.ts) resolves `../state/instance` here, so the views and ChartFrame are
 * the page's own files, unchanged.
 *
 * What the page does itself goes through the host here: clicking a head asks for `attention` on
 * that head over the same tokens (shown under the view), an operation a view runs is a
 * `tools/call`. Form fills have no form to fill and are ignored. Without a host that answers,
 * every view still draws its document alone.
 */
import { LoupeError, toLoupeError } from '../../engine/errors';
import type { ToolResult } from './host';
import type { ShareView } from '../../share/codec';

export interface HeadRef {
  layer: number;
  head: number;
}

type Theme = 'light' | 'dark';

/** What the app asks of the host (host.ts), settable once the bridge is up. */
export interface HostCalls {
  callTool(name: string, args: Record<string, unknown>): Promise<ToolResult>;
  canCallTools(): boolean;
}

/** The document a tool result carries, or the LoupeError its error text names. */
export function documentOf(r: ToolResult): Record<string, unknown> {
  if (r.isError || !r.structuredContent) {
    let parsed: { error?: { code?: string; message?: string; hint?: string } } = {};
    try {
      parsed = JSON.parse(r.content?.find((c) => c.type === 'text')?.text ?? '{}');
    } catch {
      /* not a Loupe error document */
    }
    const e = parsed.error;
    throw new LoupeError((e?.code as never) ?? 'INTERNAL', e?.message ?? 'The tool returned no document.', e?.hint);
  }
  return r.structuredContent;
}

class Prefs {
  theme = $state<Theme>('light');
  setTheme(t: Theme): void {
    // the attribute first: charts redrawn for the new theme read its CSS variables
    document.documentElement.dataset.theme = t;
    this.theme = t;
  }
}

/** A follow-up the view asked for (a head's pattern), drawn under the view. */
export interface FollowUp {
  op: string;
  title: string;
  doc?: Record<string, unknown>;
  error?: string;
  running: boolean;
}

class Links {
  head = $state<HeadRef | null>(null);
  hoverPos = $state<number | null>(null);
  constructor(private readonly owner: AppsApp) {}

  openHead(layer: number, head: number): void {
    this.head = { layer, head };
    void this.owner.headPattern(layer, head);
  }

  isHead(layer: number, head: number): boolean {
    return this.head?.layer === layer && this.head.head === head;
  }

  goTo(): void {}
  pickPosition(): void {}
}

const forms = {
  op: '',
  params: {} as Record<string, Record<string, unknown>>,
  fill(): void {},
  select(): void {},
  setParam(): void {},
  fieldsFor: (): { name: string }[] => [],
};

/** A view's pins and supernodes, kept beside its document; a view here has no share link to put them in. */
class Share {
  private views = new WeakMap<object, ShareView>();
  setView(doc: object, view: ShareView): void {
    this.views.set(doc, view);
  }
  viewFor(_op: string, doc: object): ShareView | undefined {
    return this.views.get(doc);
  }
}

export class AppsApp {
  readonly prefs = new Prefs();
  readonly links = new Links(this);
  readonly forms = forms;
  readonly share = new Share();
  /** the operation this view draws, its call's arguments (tool-input) and its document (tool-result) */
  op = $state('');
  input = $state<Record<string, unknown> | undefined>(undefined);
  doc = $state<Record<string, unknown> | undefined>(undefined);
  link = $state<string | undefined>(undefined);
  followUp = $state<FollowUp | null>(null);
  host: HostCalls | undefined;

  /** the page's per-operation results, as far as views read them: the input of this view's call */
  get results(): Record<string, { input: Record<string, unknown> } | undefined> {
    return this.op && this.input ? { [this.op]: { input: this.input } } : {};
  }

  /** Run an operation through the host; the document, or a LoupeError. */
  async execute(op: string, input: Record<string, unknown>): Promise<{ doc: any; ms: number }> {
    if (!this.host?.canCallTools())
      throw new LoupeError('BAD_INPUT', 'This host does not let views call tools.', 'Ask the agent to run it.');
    const t0 = performance.now();
    const doc = documentOf(await this.host.callTool(op, $state.snapshot(input) as Record<string, unknown>));
    return { doc, ms: performance.now() - t0 };
  }

  /** An operation a view starts (a head's pattern from a gradient map): shown as the follow-up. */
  async runOperation(op: string, input: Record<string, unknown>, title = op): Promise<void> {
    if (!this.host?.canCallTools()) return;
    this.followUp = { op, title, running: true };
    try {
      const { doc } = await this.execute(op, input);
      this.followUp = { op, title, doc, running: false };
    } catch (e) {
      this.followUp = { op, title, error: toLoupeError(e).message, running: false };
    }
  }

  /** `attention` for one head over this document's tokens (its ids: their text need not re-tokenize to them) */
  headPattern(layer: number, head: number): Promise<void> {
    if (this.op === 'attention') return Promise.resolve(); // the view shows that head itself
    const tokens = (this.doc as { tokens?: { id: number }[] } | undefined)?.tokens;
    const args: Record<string, unknown> = Array.isArray(tokens)
      ? { token_ids: tokens.map((t) => t.id) }
      : typeof this.input?.prompt === 'string'
        ? { prompt: this.input.prompt }
        : {};
    if (!('token_ids' in args) && !('prompt' in args)) return Promise.resolve();
    return this.runOperation('attention', { ...args, heads: [{ layer, head }] }, `Attention of L${layer}H${head}`);
  }
}

export const app = new AppsApp();
