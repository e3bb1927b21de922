/**
 * Node's document cache (engine/source/document-cache.ts): JSON files in `<cache dir>/documents`
 * ($LOUPE_CACHE_DIR or ~/.cache/loupe), so a CLI call or a headless companion reuses a dashboard
 * another process computed.
 */
import * as path from 'node:path';
import { DirCache, defaultCacheDir } from './dir-cache';
import { documentCacheOn, type DocumentCache } from '../engine/source/document-cache';

export function nodeDocumentCache(root = path.join(defaultCacheDir(), 'documents')): DocumentCache {
  return documentCacheOn(new DirCache(root), `the cache folder ${root}`);
}
