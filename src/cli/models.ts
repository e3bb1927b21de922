/**
 * `loupe models [--json] [FILTER]`: the catalog (engine/catalog.ts), the names researchers use for
 * each Hub id, with family, parameters, download size and memory per backend, each entry judged
 * as the page's picker judges it (fits WASM, needs q8, WebGPU only, too large here) against this
 * host's memory. Nominal sizes: a load judges the real safetensors headers again first.
 */
import { totalmem } from 'node:os';
import { CATALOG, judgeEntry, namesOf, shortName } from '../engine/catalog';
import { fmtGB } from '../engine/budget';
import type { Io } from './load-model';

const fmtParams = (n: number) => (n >= 1e9 ? `${(n / 1e9).toFixed(n >= 1e10 ? 0 : 1)}B` : `${Math.round(n / 1e6)}M`);

export function modelsCommand(argv: string[], io: Io): number {
  const json = argv.includes('--json');
  const filter = argv.find((a) => !a.startsWith('-'))?.toLowerCase();
  const limits = { hostBytes: totalmem() };
  const rows = CATALOG.filter(
    (e) => !filter || e.family.includes(filter) || namesOf(e).some((n) => n.toLowerCase().includes(filter)),
  ).map((e) => ({ e, j: judgeEntry(e, limits) }));
  if (json) {
    io.stdout(
      JSON.stringify({
        host_bytes: limits.hostBytes,
        models: rows.map(({ e, j }) => ({
          id: e.id,
          name: shortName(e),
          transformerlens_aliases: e.tl,
          loupe_aliases: e.loupe ?? [],
          family: e.family,
          n_params: e.params,
          dtype: e.dtype,
          download_bytes: j.downloadBytes,
          memory: Object.fromEntries(
            j.memory.map((m) => [m.backend, { precision: m.precision, peak_bytes: m.peakBytes, fits: m.fits }]),
          ),
          verdict: j.verdict,
        })),
      }) + '\n',
    );
    return 0;
  }
  const table = [
    ['NAME', 'HUB ID', 'FAMILY', 'PARAMS', 'DOWNLOAD', 'NODE', 'WASM', 'WEBGPU', 'PAGE'],
    ...rows.map(({ e, j }) => [
      [...new Set([shortName(e), ...namesOf(e).filter((n) => n !== e.id && !n.includes('/'))])].join(', '),
      e.id,
      e.family,
      fmtParams(e.params),
      fmtGB(j.downloadBytes),
      ...j.memory.map((m) => (m.fits ? `${fmtGB(m.peakBytes)} ${m.precision}` : 'too large')),
      j.verdict,
    ]),
  ];
  const widths = table[0].map((_, c) => Math.max(...table.map((r) => r[c].length)));
  io.stdout(
    table
      .map((r) =>
        r
          .map((v, c) => v.padEnd(widths[c]))
          .join('  ')
          .trimEnd(),
      )
      .join('\n') + '\n',
  );
  io.stdout(
    `\n${rows.length} models. Any name above or its Hub id is a MODEL (names as TransformerLens's, any case).\n` +
      `Sizes are nominal; memory is the estimated peak at the precision that fits (host ${fmtGB(limits.hostBytes)});\n` +
      'a load judges the real headers before any weight byte.\n',
  );
  return 0;
}
