/**
 * What the page remembers in this browser (localStorage): theme, backend choice, recently used
 * models, the last inputs, and Hub access tokens. A token is stored per Hub endpoint and is only
 * ever sent to that endpoint — a share link naming another endpoint never receives it.
 */
import type { BackendChoice } from '../../../workers/protocol';
import type { WeightsMode } from '../../engine/precision';

const P = 'loupe.';

function read<T>(key: string, dflt: T): T {
  try {
    const v = localStorage.getItem(P + key);
    return v === null ? dflt : (JSON.parse(v) as T);
  } catch {
    return dflt;
  }
}

function write(key: string, v: unknown): void {
  try {
    if (v === undefined) localStorage.removeItem(P + key);
    else localStorage.setItem(P + key, JSON.stringify(v));
  } catch {
    /* storage full or disabled: preferences are best effort */
  }
}

export type Theme = 'light' | 'dark';
/** how the causal methods' effects are shown: ΔM in logits, or the recovery (M − M(corrupted)) / (M(clean) − M(corrupted)) */
export type MetricUnit = 'raw' | 'normalised';

export interface RecentModel {
  kind: 'bundled' | 'hub' | 'url';
  id: string;
  revision: string;
  endpoint?: string;
  at: number;
}

export const DEFAULT_ENDPOINT = 'https://huggingface.co';

export const prefs = {
  theme(): Theme {
    const t = read<Theme | null>('theme', null);
    if (t) return t;
    return typeof matchMedia === 'function' && matchMedia('(prefers-color-scheme: dark)').matches ? 'dark' : 'light';
  },
  setTheme: (t: Theme) => write('theme', t),
  backend: (): BackendChoice => read<BackendChoice>('backend', 'auto'),
  setBackend: (b: BackendChoice) => write('backend', b),
  weights: (): WeightsMode => read<WeightsMode>('weights', 'auto'),
  setWeights: (w: WeightsMode) => write('weights', w),
  metricUnit: (): MetricUnit => read<MetricUnit>('metricUnit', 'normalised'),
  setMetricUnit: (u: MetricUnit) => write('metricUnit', u),
  endpoint: (): string => read('endpoint', DEFAULT_ENDPOINT),
  setEndpoint: (e: string) => write('endpoint', e),
  recent: (): RecentModel[] => read<RecentModel[]>('recent', []),
  addRecent(m: Omit<RecentModel, 'at'>): RecentModel[] {
    const same = (a: Omit<RecentModel, 'at'>) =>
      a.kind === m.kind && a.id === m.id && a.revision === m.revision && (a.endpoint ?? '') === (m.endpoint ?? '');
    const list = [{ ...m, at: Date.now() }, ...prefs.recent().filter((r) => !same(r))].slice(0, 8);
    write('recent', list);
    return list;
  },
  token: (endpoint: string): string => read<Record<string, string>>('tokens', {})[endpoint] ?? '',
  setToken(endpoint: string, token: string): void {
    const all = read<Record<string, string>>('tokens', {});
    if (token) all[endpoint] = token;
    else delete all[endpoint];
    write('tokens', all);
  },
  lastInputs: () =>
    read<{ prompt?: string; op?: string; params?: Record<string, Record<string, unknown>> }>('inputs', {}),
  setLastInputs: (v: { prompt: string; op: string; params: Record<string, Record<string, unknown>> }) =>
    write('inputs', v),
};
