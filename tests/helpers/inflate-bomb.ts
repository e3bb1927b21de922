/**
 * Run by tests/hostile-inputs.test.ts in a process of its own, so its peak RSS is the bombs' alone:
 * a share link of 1,024 MiB of zeros (raw DEFLATE, 1 MB) and SAE descriptions of 1,024 MiB of
 * zeros (gzip, 1 MB), each decoded once; prints one JSON line with each refusal's code and the
 * growth of the peak RSS (MiB) over what the process had before it.
 */
import zlib from 'node:zlib';
import { toLoupeError } from '../../src/engine/errors';
import { parseDescriptions } from '../../src/ops/lib/feature-descriptions';
import { toBase64Url } from '../../src/share/base64url';
import { decodeShare } from '../../src/share/codec';

const MiB = 1 << 20;
const zero = Buffer.alloc(MiB);
// One MiB of zeros as DEFLATE blocks ending in a full flush: the unit repeats, each copy the same
// 1,037 bytes, so the bomb is built without deflating a GiB.
const unit = zlib.deflateRawSync(zero, { level: 9, finishFlush: zlib.constants.Z_FULL_FLUSH });
const end = zlib.deflateRawSync(Buffer.alloc(0));

/** `mib` MiB of zeros as raw DEFLATE, or as a gzip member (with its CRC and length) */
export function bomb(mib: number, gzip: boolean): Buffer {
  const body = [...Array<Buffer>(mib).fill(unit), end];
  if (!gzip) return Buffer.concat(body);
  let crc = 0;
  for (let i = 0; i < mib; i++) crc = zlib.crc32(zero, crc);
  const trailer = Buffer.alloc(8);
  trailer.writeUInt32LE(crc >>> 0, 0);
  trailer.writeUInt32LE((mib * MiB) >>> 0, 4);
  return Buffer.concat([Buffer.from([0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3]), ...body, trailer]);
}

const peakMiB = () => process.resourceUsage().maxRSS / 1024;
function attempt(f: () => unknown): { code: string; growth_mib: number } {
  const before = peakMiB();
  let code = 'none';
  try {
    f();
  } catch (e) {
    code = toLoupeError(e).code;
  }
  return { code, growth_mib: Math.round(peakMiB() - before) };
}

if (process.argv[2] === 'run') {
  const link = toBase64Url(bomb(1024, false));
  const gz = new Uint8Array(bomb(1024, true));
  // the link first: its cap (16 MiB) is far below the descriptions' (256 MiB), whose peak would hide it
  const out = {
    link: attempt(() => decodeShare(link)),
    descriptions: attempt(() => parseDescriptions(gz, 'a bomb')),
  };
  console.log(JSON.stringify(out));
}
