/**
 * The page finds an operation's view by its file name (src/ui/views/registry.ts): every
 * registered operation has one, and every *View.svelte there draws a registered operation (a
 * misnamed view would otherwise leave its operation's document shown as JSON, silently).
 */
import { readdirSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { operations } from '../src/ops/index';
import { viewFileOf, viewFor } from '../src/ui/views/registry';

const VIEWS_DIR = path.resolve(__dirname, '..', 'src', 'ui', 'views');

describe('operation views', () => {
  it('every registered operation has its view, found by name', () => {
    const files = new Set(readdirSync(VIEWS_DIR));
    expect(viewFileOf('logit_lens')).toBe('LogitLensView.svelte');
    for (const op of Object.keys(operations)) {
      expect(files.has(viewFileOf(op)), `${op} → ${viewFileOf(op)}`).toBe(true);
      expect(typeof viewFor(op), op).toBe('function');
    }
    expect(viewFor('no_such_operation')).toBeNull();
  });

  it("every *View.svelte is an operation's view (JsonView is the fallback for documents without one)", () => {
    const named = new Set(Object.keys(operations).map(viewFileOf));
    const strays = readdirSync(VIEWS_DIR).filter(
      (f) => f.endsWith('View.svelte') && f !== 'JsonView.svelte' && !named.has(f),
    );
    expect(strays).toEqual([]);
  });

  it('every operation has a title for its tab', () => {
    for (const op of Object.values(operations)) expect(op.title.trim().length, op.name).toBeGreaterThan(0);
  });
});
