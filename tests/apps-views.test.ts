/**
 * MCP Apps views (issue 30): each view is one self-contained HTML file built from the page's own
 * view component, loading nothing (its CSP allows only its inline script by hash); the companion
 * serves it as `ui://loupe/<op>` with the MCP Apps mime type and names it in the tool's
 * `_meta.ui.resourceUri`. Every tool schema compiles with the official client v2's validator
 * (MCP reads a schema without `$schema` as 2020-12, where the tuples of draft-07 are invalid:
 * the client refused attribution_graph and causality before their schemas named their dialect).
 * The views drawn in Chromium inside a sandboxed host: e2e/apps.spec.ts.
 */
import { createHash } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { AjvJsonSchemaValidator } from '@modelcontextprotocol/client/validators/ajv';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { APP_MIME_TYPE, AppViews, appUri } from '../src/bridge/apps';
import { listTools } from '../src/bridge/tools';
import { operations } from '../src/ops/index';
import { buildApps, viewOps } from '../vite.apps.config';

const OUT = mkdtempSync(path.join(os.tmpdir(), 'loupe-apps-'));
const BUILT = ['trace', 'attention'];
let sizes: Record<string, number>;
beforeAll(async () => {
  sizes = await buildApps(BUILT, OUT);
}, 240_000);
afterAll(() => rmSync(OUT, { recursive: true, force: true }));

describe('MCP Apps views', () => {
  it('every registered operation has a view to build', () => {
    expect(viewOps().sort()).toEqual(Object.keys(operations).sort());
  });

  it('a view is one self-contained file: inline script allowed by its hash, nothing loaded, no engine', () => {
    expect(readdirSync(OUT).sort()).toEqual(BUILT.map((op) => `${op}.html`).sort());
    for (const op of BUILT) {
      const html = readFileSync(path.join(OUT, `${op}.html`), 'utf8');
      expect(sizes[op]).toBeLessThan(600_000);
      const csp = /<meta http-equiv="Content-Security-Policy" content="([^"]+)"/.exec(html)?.[1];
      expect(csp).toBeDefined();
      expect(csp).toContain("default-src 'none'");
      expect(csp).not.toMatch(/connect-src|https?:|\*/);
      const scripts = [...html.matchAll(/<script([^>]*)>([\s\S]*?)<\/script>/g)];
      expect(scripts.length).toBe(1);
      expect(scripts[0][1]).toBe(' type="module"');
      const hash = createHash('sha256').update(scripts[0][2], 'utf8').digest('base64');
      expect(csp).toContain(`script-src 'sha256-${hash}'`);
      expect(html).not.toMatch(/<(script|link|img|iframe)[^>]*\s(src|href)=/);
      for (const s of ['onnxruntime', 'new Worker', 'WebSocket(', 'XMLHttpRequest', 'sendBeacon'])
        expect(html).not.toContain(s);
      // the page's view component itself, not a second drawing
      expect(html).toContain(op === 'trace' ? 'trace-heatmap' : 'attention-pattern');
    }
  });

  it('the companion serves them as ui:// resources and names them in the tools', () => {
    const apps = new AppViews(OUT);
    const tools = listTools('headless', operations, (op) => apps.has(op));
    for (const op of BUILT) {
      const t = tools.find((x) => x.name === op)!;
      expect((t._meta as { ui: { resourceUri: string } }).ui.resourceUri).toBe(appUri(op));
      const read = apps.read(appUri(op))!;
      expect(read.contents[0].mimeType).toBe(APP_MIME_TYPE);
      expect(read.contents[0].text).toBe(readFileSync(path.join(OUT, `${op}.html`), 'utf8'));
    }
    expect(tools.find((x) => x.name === 'logit_lens')!._meta).toBeUndefined(); // not built here
    for (const bad of ['ui://loupe/../trace', 'ui://loupe/Trace', 'ui://other/trace', 'ui://loupe/trace.html'])
      expect(apps.read(bad)).toBeUndefined();
    const listed = apps.list(Object.fromEntries(Object.values(operations).map((o) => [o.name, o.title])));
    expect(listed.map((r) => r.uri).sort()).toEqual(BUILT.map(appUri).sort());
  });

  it("every tool's input and output schema compiles with the official client v2's validator", () => {
    const v = new AjvJsonSchemaValidator();
    const failed: string[] = [];
    for (const t of listTools('headless', operations)) {
      for (const [k, s] of [
        ['input', t.inputSchema],
        ['output', t.outputSchema],
      ] as const) {
        if (!s) continue;
        try {
          v.getValidator(s as never);
        } catch (e) {
          failed.push(`${t.name} ${k}: ${(e as Error).message.slice(0, 120)}`);
        }
      }
    }
    expect(failed).toEqual([]);
  });
});
