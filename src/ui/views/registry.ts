/**
 * Which view draws an operation's document: the file named for the operation, `trace` →
 * TraceView.svelte, `logit_lens` → LogitLensView.svelte, found here by that name (no list to
 * keep). The tabs' titles and order come from the operation registry (src/ops/index.ts, each
 * operation's `title`), listed by the worker. Views load lazily, so the page's first JavaScript
 * carries neither d3 nor any view until a result is shown. An operation without a view shows its
 * document as JSON (tests/views-registry.test.ts checks that every registered operation has one).
 */
import type { Component } from 'svelte';

type Loader = () => Promise<{ default: Component<{ doc: any }> }>;

// JsonView is the fallback, which ResultPanel imports itself
const VIEWS = import.meta.glob<{ default: Component<{ doc: any }> }>(['./*View.svelte', '!./JsonView.svelte']);

/** the file of an operation's view: `logit_lens` → `LogitLensView.svelte` */
export function viewFileOf(op: string): string {
  return `${op
    .split('_')
    .map((w) => w.charAt(0).toUpperCase() + w.slice(1))
    .join('')}View.svelte`;
}

/** the view's loader, or null: its document is shown as JSON */
export function viewFor(op: string): Loader | null {
  return VIEWS[`./${viewFileOf(op)}`] ?? null;
}
