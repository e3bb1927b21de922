/**
 * The page's onnxruntime-web builds, chosen here and nowhere else (which ones a build ships:
 * vite.config.ts ORT_BUILDS). `native` is onnxruntime-web's native WebGPU execution provider
 * (ort.webgpu.min.mjs and its asyncify runtime: onnxruntime's C++ WebGPU provider, the recommended
 * path since 1.29); `jsep` is the JavaScript one (ort.min.mjs, deprecated since 1.29), kept only as
 * the fallback: a load whose runtime is missing or whose session the native build cannot create is
 * loaded again on JSEP, and the page says so (LoadedModelSummary.runtime: the status bar and the
 * Doctor). Each build is its own module with its own WASM heap and WebGPU device; both serve the
 * WASM backend too (their CPU provider), so a model and its agreement twin share one build.
 * `ort=jsep` or `ort=native` in the worker's name (the page's ?ort=) forces one, for comparing.
 */
import type { OrtModule } from '../src/engine/runtime/ort-session';

export type OrtBuild = 'native' | 'jsep';

/** what vite.config.ts shipped: literals, so a build not shipped is not bundled either */
declare const __LOUPE_ORT_NATIVE__: boolean;
declare const __LOUPE_ORT_JSEP__: boolean;

export const ORT_BUILD_NAMES: Record<OrtBuild, string> = {
  native: 'onnxruntime-web native WebGPU EP (ort.webgpu.min.mjs)',
  jsep: 'onnxruntime-web JSEP (ort.min.mjs)',
};

/** the builds this page has, the preferred first; `forced` (the worker name's ort=) keeps only that one */
export function ortBuildOrder(shipped: Record<OrtBuild, boolean>, forced: string | null): OrtBuild[] {
  const order = (['native', 'jsep'] as const).filter((b) => shipped[b]);
  return forced === 'native' || forced === 'jsep' ? order.filter((b) => b === forced) : order;
}

const forced = /(?:^| )ort=(\w+)/.exec(typeof self.name === 'string' ? self.name : '')?.[1] ?? null;
export const ORT_BUILDS: OrtBuild[] = ortBuildOrder({ native: __LOUPE_ORT_NATIVE__, jsep: __LOUPE_ORT_JSEP__ }, forced);

const modules = new Map<OrtBuild, Promise<OrtModule>>();

/** The build's module, imported once and configured by `setup` (runtime path, threads) before first use. */
export function ortModule(build: OrtBuild, setup: (ort: OrtModule) => void): Promise<OrtModule> {
  let m = modules.get(build);
  if (!m) {
    m = (async () => {
      const ort = (
        build === 'native'
          ? __LOUPE_ORT_NATIVE__
            ? await import('onnxruntime-web/webgpu')
            : null
          : __LOUPE_ORT_JSEP__
            ? await import('onnxruntime-web')
            : null
      ) as OrtModule | null;
      if (!ort) throw new Error(`this page was built without ${ORT_BUILD_NAMES[build]}`);
      setup(ort);
      return ort;
    })();
    m.catch(() => modules.delete(build));
    modules.set(build, m);
  }
  return m;
}
