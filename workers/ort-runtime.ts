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
import type { LoadDecision } from '../src/engine/plan';

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

/**
 * Why `build` cannot run a load so decided, known from the decision before any weight byte, or
 * null. The native build has no Cast from bfloat16 on any provider (runtime/pieces.ts): a BF16
 * weight kept 16-bit (weights stored, or the unquantised rest at q8/q4) is widened by one in the
 * graph, so such a load goes to JSEP before it downloads or fills a heap that never shrinks.
 */
export function buildRefuses(build: OrtBuild, d: Pick<LoadDecision, 'precision' | 'stats'>): string | null {
  const bf16 = d.stats.byDtype.BF16 ?? 0;
  if (build !== 'native' || d.precision === 'f32' || bf16 === 0) return null;
  return (
    `${ORT_BUILD_NAMES.native} has no Cast from bfloat16, and weights ${d.precision} keep this model's ` +
    `${bf16} BF16 parameters 16-bit, widened by such a Cast at use`
  );
}
