/** What every cache's sink (CacheSink) does alike: its version kept where known, its length and version read live. */
import type { CacheSink } from './types';

/** the version of the bytes being written: validator and size */
export interface SinkMeta {
  etag?: string;
  total?: number;
}

/** a version's etag and total, each only where known */
export const knownMeta = (m: SinkMeta): SinkMeta => ({
  ...(m.etag ? { etag: m.etag } : {}),
  ...(m.total != null ? { total: m.total } : {}),
});

/** a sink whose length and version are read, when asked, from its writer's state */
export function cacheSink(
  length: () => number,
  meta: () => SinkMeta,
  ops: Omit<CacheSink, 'length' | 'etag' | 'total'>,
): CacheSink {
  return {
    get length() {
      return length();
    },
    get etag() {
      return meta().etag;
    },
    get total() {
      return meta().total;
    },
    ...ops,
  };
}
