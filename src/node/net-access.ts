/**
 * Which hosts a caller may make this process fetch from. The CLI's user and an agent's companion
 * may name any ('any'). A page attached to `loupe serve` may not: its engine fetches only from the
 * hosts its user allowed (`--allow-host HOST`; by default the Hub endpoint's host, $HF_ENDPOINT or
 * huggingface.co), or a page could make a server-side request to anything the engine's machine
 * reaches and read fields of the answer back. A request's first URL is checked; the redirects an
 * allowed host answers with are followed (the Hub sends its downloads to its CDN).
 *
 * Applied where a spec becomes a source (sourceFromSpec: models, SAEs, descriptions) before any
 * request, and again on every request that source makes (a file name from a repository's index
 * cannot lead elsewhere).
 */
import { LoupeError } from '../engine/errors';

export type NetAccess = 'any' | { hosts: readonly string[] };

/** `--allow-host` values as the checks read them: lowercased host or host:port, or '*' for any */
export function allowHosts(hosts: readonly string[]): NetAccess {
  if (hosts.includes('*')) return 'any';
  return {
    hosts: hosts.map((h) => {
      const s = h.trim().toLowerCase();
      if (!/^[a-z0-9.-]+(:\d{1,5})?$|^\[[0-9a-f:.]+\](:\d{1,5})?$/.test(s))
        throw new LoupeError('BAD_INPUT', `--allow-host takes a host or host:port (got '${h}').`);
      return s;
    }),
  };
}

/** host (any port) or host:port */
function allowed(url: URL, hosts: readonly string[]): boolean {
  return hosts.includes(url.hostname.toLowerCase()) || hosts.includes(url.host.toLowerCase());
}

/** Throw HOST_NOT_ALLOWED unless `url` is http(s) on an allowed host. */
export function checkUrlHost(url: string, access: NetAccess): void {
  if (access === 'any') return;
  let u: URL | null = null;
  try {
    u = new URL(url);
  } catch {
    /* refused below */
  }
  if (u && (u.protocol === 'http:' || u.protocol === 'https:') && allowed(u, access.hosts)) return;
  const host = u ? u.host : JSON.stringify(url.slice(0, 100));
  throw new LoupeError(
    'HOST_NOT_ALLOWED',
    `This engine fetches only from ${access.hosts.join(', ') || 'no host'}; ${host} is not one of them.`,
    'Load from the Hub, or start loupe serve with --allow-host HOST for that host.',
    { host },
  );
}

/** `fetch` that checks every request's URL first (redirects of an allowed host are followed) */
export function guardedFetch(access: NetAccess, inner: typeof fetch = (...a) => globalThis.fetch(...a)): typeof fetch {
  if (access === 'any') return inner;
  return async (input, init) => {
    checkUrlHost(typeof input === 'string' ? input : input instanceof URL ? input.href : input.url, access);
    return inner(input, init);
  };
}
