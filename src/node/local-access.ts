/**
 * Which local folders a caller may make this process read. The CLI's user may name any folder
 * ('any'). Callers over MCP (an agent, or whatever drives it) may not: a companion reads local
 * folders for them only inside the folders its user listed with `--allow-local DIR`, and none
 * by default. The refusal is decided before any filesystem call on the caller's path and reads
 * the same whether the path exists or not, so it cannot be used to probe the disk.
 *
 * It is applied where a spec becomes a source (sourceFromSpec), which every model, SAE and
 * descriptions path goes through.
 */
import { realpathSync } from 'node:fs';
import * as path from 'node:path';
import { LoupeError } from '../engine/errors';

export type LocalAccess = 'any' | { roots: readonly string[] };

/** Resolve `--allow-local` folders once, at startup (they must exist; symlinks resolved). */
export function allowLocal(dirs: readonly string[]): LocalAccess {
  return { roots: dirs.map((d) => realpathSync(path.resolve(d))) };
}

export const NO_LOCAL: LocalAccess = { roots: [] };

function refused(spec: string, roots: readonly string[]): LoupeError {
  return new LoupeError(
    'LOCAL_PATH_REFUSED',
    `${JSON.stringify(spec.slice(0, 200))} is a local path; this companion reads no local ` +
      `files for MCP clients${roots.length ? ' outside the folders its user allowed' : ''}.`,
    roots.length
      ? 'Give a Hub repository or an http(s) URL, or a path inside a folder the companion was started with (--allow-local DIR).'
      : 'Give a Hub repository or an http(s) URL. To let agents read a local folder, the user starts the companion with --allow-local DIR.',
  );
}

const inside = (p: string, root: string) =>
  p === root || p.startsWith(root.endsWith(path.sep) ? root : root + path.sep);

/**
 * Throw LOCAL_PATH_REFUSED unless `abs` (an absolute path) is inside an allowed root, both as
 * written and with its symlinks resolved. A path that does not exist yet passes when its
 * written form is inside a root (the read that follows reports it missing, inside that root).
 */
export function checkLocalPath(abs: string, access: LocalAccess, spec = abs): void {
  if (access === 'any') return;
  const roots = access.roots;
  if (!roots.some((r) => inside(abs, r))) throw refused(spec, roots);
  let real: string;
  try {
    real = realpathSync(abs);
  } catch {
    return;
  }
  if (!roots.some((r) => inside(real, r))) throw refused(spec, roots);
}
