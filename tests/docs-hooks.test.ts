/**
 * The hook list lives once, in src/engine/graph/hooks.ts (allHookNames, layerHooks). Its copies for
 * readers — api.ts's header, docs/DESIGN.md and the README, each between `<!-- hooks -->` markers —
 * must name exactly those hooks: a hook added to the engine or to one copy only fails here. And the
 * README's operations table names exactly the registered operations.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { allHookNames } from '../src/engine/graph/hooks';
import type { ModelSpec } from '../src/engine/spec';
import { operations } from '../src/ops/index';

const ROOT = path.resolve(__dirname, '..');
const read = (f: string) => readFileSync(path.join(ROOT, f), 'utf8');

/**
 * A two-layer model with every optional hook: learned positions, pre- and post-norms, a gated MLP,
 * a sequential block (hook_resid_mid), asked with hook_result; layer 0 attends (with every optional
 * attention field), layer 1 is a linear-attention layer (Qwen3.5). Any other field a layer is
 * asked for is present, so a hook that a new optional field adds is in the list too.
 */
const EVERY_LAYER = new Proxy({} as Record<string, unknown>, {
  get: (_, k) =>
    k === 'parallel'
      ? false
      : k === 'mlp'
        ? { kind: 'gated' }
        : k === 'attn'
          ? { outputGate: true }
          : k === 'moe' || k === 'linearAttn'
            ? undefined
            : {},
});
/** and a mixture-of-experts layer (its MLP's hooks instead of the dense ones), with a shared expert */
const MOE_LAYER = new Proxy({} as Record<string, unknown>, {
  get: (_, k) =>
    k === 'parallel'
      ? false
      : k === 'mlp' || k === 'linearAttn'
        ? undefined
        : k === 'moe'
          ? { experts: [{}], shared: {} }
          : {},
});
/** and a Gemma 4 MoE layer: experts beside a dense gated MLP (MoeSpec.beside) */
const BESIDE_LAYER = new Proxy({} as Record<string, unknown>, {
  get: (_, k) =>
    k === 'parallel'
      ? false
      : k === 'mlp'
        ? { kind: 'gated' }
        : k === 'moe'
          ? { experts: [{}], beside: {} }
          : k === 'linearAttn'
            ? undefined
            : {},
});
/** and a linear-attention layer (Qwen3.5's gated delta-net: its hooks instead of attention's) */
const LINEAR_LAYER = new Proxy({} as Record<string, unknown>, {
  get: (_, k) => (k === 'parallel' ? false : k === 'mlp' ? { kind: 'gated' } : k === 'moe' ? undefined : {}),
});
const EVERY_HOOK = {
  posEmbed: { w: 'wpe' },
  nLayers: 4,
  layers: [EVERY_LAYER, MOE_LAYER, LINEAR_LAYER, BESIDE_LAYER],
} as unknown as ModelSpec;

/** the engine's hooks as the copies write them: each layer as `blocks.{l}`, expert 0 as `experts.{e}`, and `logits` */
function engineHooks(): string[] {
  const names = allHookNames(EVERY_HOOK, true).map((h) =>
    h.replace(/^blocks\.\d+\./, 'blocks.{l}.').replace('.experts.0.', '.experts.{e}.'),
  );
  return [...new Set(names), 'logits'].sort();
}

/** the hooks a copy names: every `code` span between its markers, `a.hook_x|hook_y` meaning a.hook_x and a.hook_y */
function hooksOfCopy(text: string): string[] {
  const m = /<!-- hooks -->([\s\S]*?)<!-- \/hooks -->/.exec(text);
  if (!m) throw new Error('no <!-- hooks --> … <!-- /hooks --> markers');
  const names: string[] = [];
  for (const [, span] of m[1].matchAll(/`([^`]+)`/g)) {
    if (!/^[\w.{}|]+$/.test(span) || !/(^|\.)(hook_\w+|logits)/.test(span)) continue;
    const [first, ...rest] = span.split('|');
    const prefix = first.slice(0, first.lastIndexOf('.') + 1);
    names.push(first, ...rest.map((r) => prefix + r));
  }
  return names.sort();
}

const COPIES = ['src/engine/api.ts', 'docs/DESIGN.md', 'README.md'];

describe('the hook list has one source', () => {
  it('the model with every optional hook has each kind once (the reference the copies are held to)', () => {
    const hooks = engineHooks();
    expect(new Set(hooks).size).toBe(hooks.length);
    for (const h of [
      'hook_pos_embed',
      'blocks.{l}.ln1.hook_scale',
      'blocks.{l}.ln1_post.hook_scale',
      'blocks.{l}.mlp.hook_pre_linear',
      'blocks.{l}.mlp.experts.{e}.hook_out',
      'blocks.{l}.ln2_experts.hook_scale',
    ])
      expect(hooks).toContain(h);
    expect(hooks).toContain('blocks.{l}.attn.hook_result');
    expect(hooks).toContain('blocks.{l}.linear_attn.hook_core');
  });

  for (const file of COPIES) {
    it(`${file} names exactly graph/hooks.ts's hooks`, () => {
      expect(hooksOfCopy(read(file))).toEqual(engineHooks());
    });
  }

  it('a hook in one copy only is caught', () => {
    const readme = read('README.md');
    const extra = readme.replace('`blocks.{l}.hook_resid_post`', '`blocks.{l}.hook_resid_post`, `blocks.{l}.hook_new`');
    expect(extra).not.toBe(readme);
    expect(hooksOfCopy(extra)).not.toEqual(engineHooks());
    const missing = readme.replace('`blocks.{l}.hook_mlp_out`, ', '');
    expect(missing).not.toBe(readme);
    expect(hooksOfCopy(missing)).not.toEqual(engineHooks());
  });
});

describe("the README's operations table", () => {
  it('has one row per registered operation, in registry order', () => {
    const m = /<!-- operations-table -->([\s\S]*?)<!-- \/operations-table -->/.exec(read('README.md'));
    expect(m, 'the operations-table markers').not.toBeNull();
    const rows = [...m![1].matchAll(/^\| `(\w+)` \|/gm)].map((r) => r[1]);
    expect(rows).toEqual(Object.keys(operations));
  });
});
