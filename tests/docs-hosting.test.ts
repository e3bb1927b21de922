/**
 * The deploy recipes name what the build really is: the Pages workflow and the Space's front matter run scripts that
 * exist and publish the folder `vite build` writes, with index.html and the service worker at its top.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = path.resolve(__dirname, '..');
const read = (f: string) => readFileSync(path.join(ROOT, f), 'utf8');
const scripts = JSON.parse(read('package.json')).scripts as Record<string, string>;

describe('deploy recipes', () => {
  it('.github/workflows/pages.yml: npm ci, npm run build, the Pages artifact from dist/, then deploy-pages', () => {
    const wf = read('.github/workflows/pages.yml');
    const steps = [...wf.matchAll(/^\s+- (?:run: (.+)|uses: (\S+))$/gm)].map((m) => m[1] ?? m[2].split('@')[0]);
    expect(steps).toEqual([
      'actions/checkout',
      'actions/setup-node',
      'npm ci',
      'npm run build',
      'actions/upload-pages-artifact',
    ]);
    expect(wf).toMatch(/upload-pages-artifact@v\d+\n\s+with:\n\s+path: dist\n/);
    expect(wf).toMatch(/uses: actions\/deploy-pages@v\d+/);
    expect(wf).toMatch(/pages: write/);
    expect(wf).toMatch(/id-token: write/);
    expect(scripts.build).toMatch(/^vite build( |$)/);
    expect(read('vite.config.ts')).toMatch(/const OUT_DIR = resolve\('dist'\)/);
  });

  it("docs/hosting.md's Space front matter builds with an existing script and serves the build's index.html", () => {
    const doc = read('docs/hosting.md');
    const fm = /```yaml\n---\n([\s\S]+?)\n---\n```/.exec(doc)![1];
    const field = (k: string) => new RegExp(`^${k}: (.+)$`, 'm').exec(fm)?.[1];
    expect(field('sdk')).toBe('static');
    expect(field('app_build_command')).toBe('npm run build');
    expect(field('app_file')).toBe('dist/index.html');
    expect(scripts.preview).toBe('tsx src/node/preview.ts');
  });

  it('the README links the hosting doc and stays within 320 lines', () => {
    const readme = read('README.md');
    expect(readme).toContain('## Host it');
    expect(readme).toContain('(docs/hosting.md)');
    expect(readme.split('\n').length).toBeLessThanOrEqual(321);
  });
});
