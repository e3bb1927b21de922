/**
 * docs/bridge.md names every operation tool: the line between its `operation-tools` markers is
 * generated here from the registry, so adding an operation without documenting it fails.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { BRIDGE_TOOL_NAMES, listTools } from '../src/bridge/tools';
import { operations } from '../src/ops/index';

const DOC = path.resolve(__dirname, '..', 'docs', 'bridge.md');

describe('docs/bridge.md', () => {
  it("lists exactly the registry's operation tools, in registry order", () => {
    const text = readFileSync(DOC, 'utf8');
    const m = /<!-- operation-tools -->(.*?)<!-- \/operation-tools -->/s.exec(text);
    expect(m, 'the operation-tools markers').not.toBeNull();
    const expected = Object.keys(operations)
      .map((n) => `\`${n}\``)
      .join(', ');
    expect(m![1], `replace the line between the markers in docs/bridge.md with:\n${expected}`).toBe(expected);
    // and the page tool list is the bridge's own tools plus exactly these
    const names = listTools('page', operations).map((t) => t.name);
    expect(names.filter((n) => !(BRIDGE_TOOL_NAMES as readonly string[]).includes(n))).toEqual(Object.keys(operations));
  });

  it('names every bridge tool and every --option of loupe mcp', async () => {
    const text = readFileSync(DOC, 'utf8');
    for (const t of BRIDGE_TOOL_NAMES) expect(text).toContain(`\`${t}\``);
    const { USAGE } = await import('../src/bridge/main');
    for (const opt of USAGE.match(/--[a-z-]+/g)!) if (opt !== '--help') expect(text, opt).toContain(opt);
  });
});
