/**
 * MCP Apps (the `io.modelcontextprotocol/ui` extension, SEP-1865, stable 2026-01-26): each
 * operation tool names a view, `ui://loupe/<op>`, that a host renders in a sandboxed iframe with
 * the tool's result. The view is one self-contained HTML file built from the page's own view
 * component (vite.apps.config.ts → dist/apps/<op>.html; src/ui/apps/ is its runtime); it loads
 * nothing from anywhere, so its resource declares no CSP domains and the host's restrictive
 * default (no network) applies, and the document carries its own CSP allowing only its inline
 * script and style.
 *
 * Only views whose bundle exists are declared: a companion run from an unbuilt checkout lists
 * its tools without `_meta.ui`, and hosts show the text and structuredContent instead.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';

export const UI_EXTENSION = 'io.modelcontextprotocol/ui';
export const APP_MIME_TYPE = 'text/html;profile=mcp-app';
export const UI_URI_PREFIX = 'ui://loupe/';
/** the largest view bundle served (they are 100–400 KB; anything bigger is not ours) */
const MAX_VIEW_BYTES = 4 * 1024 * 1024;

export const appUri = (op: string): string => UI_URI_PREFIX + op;

/** What a resource listing and read carry about a view: no domains (nothing external), a border. */
const UI_RESOURCE_META = { ui: { csp: {}, prefersBorder: true } };

/** The tool's `_meta` naming its view: the current key and the deprecated flat one older hosts read. */
export function toolUiMeta(op: string): Record<string, unknown> {
  return { ui: { resourceUri: appUri(op) }, 'ui/resourceUri': appUri(op) };
}

export class AppViews {
  private readonly ops: Set<string>;
  private cache = new Map<string, string>();

  /** `dir` is dist/apps of the build; absent or unreadable, there are no views */
  constructor(private readonly dir: string | undefined) {
    let names: string[] = [];
    try {
      if (dir && existsSync(dir)) names = readdirSync(dir);
    } catch {
      names = [];
    }
    this.ops = new Set(names.filter((n) => /^[a-z][a-z0-9_]*\.html$/.test(n)).map((n) => n.slice(0, -5)));
  }

  has(op: string): boolean {
    return this.ops.has(op);
  }

  get size(): number {
    return this.ops.size;
  }

  /** resources/list entries of the views of these operations (titles from the registry) */
  list(titles: Record<string, string | undefined>): Record<string, unknown>[] {
    return [...this.ops]
      .filter((op) => op in titles)
      .map((op) => ({
        uri: appUri(op),
        name: `${op} view`,
        title: `Loupe ${titles[op] ?? op} view`,
        description: `Draws a ${op} document (the tool's structuredContent) as the Loupe workbench does, with hover and the host's theme.`,
        mimeType: APP_MIME_TYPE,
        _meta: UI_RESOURCE_META,
      }));
  }

  /** resources/read of a ui:// URI, or undefined when it names no view of ours */
  read(uri: string): { contents: Record<string, unknown>[] } | undefined {
    if (!uri.startsWith(UI_URI_PREFIX)) return undefined;
    const op = uri.slice(UI_URI_PREFIX.length);
    if (!this.ops.has(op) || !this.dir) return undefined;
    let html = this.cache.get(op);
    if (html === undefined) {
      const buf = readFileSync(path.join(this.dir, `${op}.html`));
      if (buf.length > MAX_VIEW_BYTES) return undefined;
      html = buf.toString('utf8');
      this.cache.set(op, html);
    }
    return { contents: [{ uri, mimeType: APP_MIME_TYPE, text: html, _meta: UI_RESOURCE_META }] };
  }
}
