/**
 * One CLI trace walks the load path once: the model spec is resolved to a source once
 * (sourceFromSpec), the load is decided once (plan.ts decideLoad: the precision chosen once by
 * choosePrecision, the memory budget checked once by checkBudget), in the loader's judgement from
 * the headers, on each backend (webgpu: SwiftShader here); createModel runs at that decision. The three functions are wrapped in counting spies where their modules are
 * imported, and `loupe trace` runs in-process on the bundled model.
 */
import { describe, it, expect, vi, beforeEach } from 'vitest';
import { main } from '../src/cli/main';

vi.mock('../src/node/load-files-node', async (importOriginal) => {
  const m = await importOriginal<typeof import('../src/node/load-files-node')>();
  return { ...m, sourceFromSpec: vi.fn(m.sourceFromSpec) };
});
vi.mock('../src/engine/precision', async (importOriginal) => {
  const m = await importOriginal<typeof import('../src/engine/precision')>();
  return { ...m, choosePrecision: vi.fn(m.choosePrecision), choosePrecisionOnGpu: vi.fn(m.choosePrecisionOnGpu) };
});
vi.mock('../src/engine/plan', async (importOriginal) => {
  const m = await importOriginal<typeof import('../src/engine/plan')>();
  return { ...m, decideLoad: vi.fn(m.decideLoad) };
});
vi.mock('../src/engine/budget', async (importOriginal) => {
  const m = await importOriginal<typeof import('../src/engine/budget')>();
  return { ...m, checkBudget: vi.fn(m.checkBudget) };
});

const { sourceFromSpec } = await import('../src/node/load-files-node');
const { choosePrecision, choosePrecisionOnGpu } = await import('../src/engine/precision');
const { checkBudget } = await import('../src/engine/budget');
const { decideLoad } = await import('../src/engine/plan');

async function trace(args: string[]) {
  let stdout = '',
    stderr = '';
  const code = await main(['trace', 'default', 'Once upon a time', '--json', '--quiet', ...args], {
    stdout: (s) => (stdout += s),
    stderr: (s) => (stderr += s),
  });
  return { code, stdout, stderr };
}

describe('a CLI trace decides its load once', () => {
  beforeEach(() => {
    vi.mocked(sourceFromSpec).mockClear();
    vi.mocked(choosePrecision).mockClear();
    vi.mocked(choosePrecisionOnGpu).mockClear();
    vi.mocked(checkBudget).mockClear();
    vi.mocked(decideLoad).mockClear();
  });

  for (const backend of ['node', 'wasm', 'webgpu']) {
    it(`sourceFromSpec, decideLoad, choosePrecision and checkBudget each run once (--backend ${backend})`, async () => {
      const r = await trace(['--backend', backend]);
      expect(r.stderr).toBe('');
      expect(r.code).toBe(0);
      const doc = JSON.parse(r.stdout);
      // the document carries the precision that was judged
      expect(doc.model.weights).toBe('f32');
      expect(doc.model.backend).toBe(backend);
      expect(vi.mocked(sourceFromSpec)).toHaveBeenCalledTimes(1);
      expect(vi.mocked(sourceFromSpec).mock.calls[0][0]).toBe('default');
      // on WebGPU the adapter's chooser (which asks choosePrecision inside its own module)
      expect(vi.mocked(backend === 'webgpu' ? choosePrecisionOnGpu : choosePrecision)).toHaveBeenCalledTimes(1);
      expect(vi.mocked(checkBudget)).toHaveBeenCalledTimes(1);
      expect(vi.mocked(checkBudget).mock.calls[0][2]).toBe('f32');
      // the one decision, made in the loader's judgement from the headers; createModel runs at it
      expect(vi.mocked(decideLoad)).toHaveBeenCalledTimes(1);
      expect(vi.mocked(decideLoad).mock.calls[0][0].backend).toBe(backend);
    });
  }

  it('an asked precision is the one judged and run (--weights stored)', async () => {
    const r = await trace(['--weights', 'stored']);
    expect(r.code).toBe(0);
    const doc = JSON.parse(r.stdout);
    expect(doc.model.weights).toBe('stored');
    expect(vi.mocked(choosePrecision)).toHaveBeenCalledTimes(1);
    expect(vi.mocked(choosePrecision).mock.calls[0][0]).toBe('stored');
    expect(vi.mocked(checkBudget)).toHaveBeenCalledTimes(1);
    expect(vi.mocked(checkBudget).mock.calls[0][2]).toBe('stored');
  });
});
