import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { LoupeError } from '../src/engine/errors';
import {
  MAX_HEADER_BYTES,
  parseSafetensors,
  readTensorF32,
  weightSetFromFiles,
  type ReadableWeightSet,
} from '../src/engine/safetensors';
import { readFileRange, readSafetensorsHeaderFromDisk } from '../src/node/load-files-node';
import { f32Bytes, rawSafetensors, writeSafetensors } from './helpers/safetensors-writer';

const tmp = mkdtempSync(path.join(tmpdir(), 'loupe-st-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** f32 -> f16 bits for values exactly representable in f16 (test-side, by bit surgery on the f32). */
function f16Bits(x: number): number {
  const u = new Uint32Array(new Float32Array([x]).buffer)[0];
  const sign = (u >>> 16) & 0x8000;
  const exp = (u >>> 23) & 0xff;
  const mant = u & 0x7fffff;
  if (exp === 0) return sign; // ±0
  const e = exp - 127 + 15;
  if (e >= 1) return sign | (e << 10) | (mant >>> 13); // normal
  // subnormal f16: value = mant16 * 2^-24
  const full = mant | 0x800000;
  return sign | (full >>> (14 - e));
}

function u16Bytes(bits: number[]): Uint8Array {
  return new Uint8Array(Uint16Array.from(bits).buffer);
}

function expectCode(fn: () => unknown, code: string, ...mentions: string[]): LoupeError {
  let err: unknown;
  try {
    fn();
  } catch (e) {
    err = e;
  }
  expect(err, `expected ${code}`).toBeInstanceOf(LoupeError);
  const le = err as LoupeError;
  expect(le.code).toBe(code);
  for (const m of mentions) expect(le.message).toContain(m);
  return le;
}

describe('safetensors: valid files', () => {
  const f32 = [1.5, -2.25, 3.125, 0, -0.5, Math.fround(1e-3)];
  const f16Values = [1, -2, 65504, 2 ** -24, 2 ** -14, 0.333251953125, -0.099975586, 1024 + 1];
  const bf16Src = [1.5, -3.25, Math.fround(1e-3), 123456, -7.0e-20];
  const bf16Bits = bf16Src.map((v) => new Uint32Array(new Float32Array([v]).buffer)[0] >>> 16);
  const bf16Expected = bf16Bits.map((b) => new Float32Array(new Uint32Array([b << 16]).buffer)[0]);
  const bytes = writeSafetensors(
    [
      { name: 'a.f32', dtype: 'F32', shape: [2, 3], data: f32Bytes(f32) },
      { name: 'b.f16', dtype: 'F16', shape: [8], data: u16Bytes(f16Values.map(f16Bits)) },
      { name: 'c.bf16', dtype: 'BF16', shape: [5], data: u16Bytes(bf16Bits) },
      { name: 'd.f64', dtype: 'F64', shape: [2], data: new Uint8Array(new Float64Array([0.1, -1e10]).buffer) },
      { name: 'e.i64', dtype: 'I64', shape: [2], data: new Uint8Array(new BigInt64Array([-5n, 7n]).buffer) },
      { name: 'f.empty', dtype: 'F32', shape: [0, 4], data: new Uint8Array(0) },
      { name: 'g.u8', dtype: 'U8', shape: [3], data: new Uint8Array([0, 7, 255]) },
    ],
    { format: 'pt' },
  );

  it('parses entries with file offsets and metadata', () => {
    const h = parseSafetensors(bytes, 'x.safetensors');
    expect(h.metadata).toEqual({ format: 'pt' });
    expect(h.tensors.map((t) => t.name)).toEqual(['a.f32', 'b.f16', 'c.bf16', 'd.f64', 'e.i64', 'f.empty', 'g.u8']);
    const a = h.tensors[0];
    expect(a).toMatchObject({
      dtype: 'F32',
      shape: [2, 3],
      byteLength: 24,
      file: 'x.safetensors',
      fileOffset: h.dataStart,
    });
    expect(h.dataStart % 8).toBe(0);
  });

  it('reads every dtype as float32', () => {
    const ws = weightSetFromFiles(new Map([['x.safetensors', bytes]]));
    expect(Array.from(readTensorF32(ws, 'a.f32'))).toEqual(f32);
    expect(Array.from(readTensorF32(ws, 'b.f16'))).toEqual(f16Values.map((v) => Math.fround(v)));
    expect(Array.from(readTensorF32(ws, 'c.bf16'))).toEqual(bf16Expected);
    expect(Array.from(readTensorF32(ws, 'd.f64'))).toEqual([Math.fround(0.1), Math.fround(-1e10)]);
    expect(Array.from(readTensorF32(ws, 'e.i64'))).toEqual([-5, 7]);
    expect(readTensorF32(ws, 'f.empty').length).toBe(0);
    expect(Array.from(readTensorF32(ws, 'g.u8'))).toEqual([0, 7, 255]);
    expect(() => readTensorF32(ws, 'nope')).toThrowError(/no tensor named "nope"/);
  });

  it('decodes special f16 values (signed zero, inf, NaN, subnormals)', () => {
    const special = writeSafetensors([
      { name: 's', dtype: 'F16', shape: [6], data: u16Bytes([0x8000, 0x7c00, 0xfc00, 0x7e00, 0x0001, 0x03ff]) },
    ]);
    const v = readTensorF32(weightSetFromFiles(new Map([['s.safetensors', special]])), 's');
    expect(Object.is(v[0], -0)).toBe(true);
    expect(v[1]).toBe(Infinity);
    expect(v[2]).toBe(-Infinity);
    expect(Number.isNaN(v[3])).toBe(true);
    expect(v[4]).toBe(2 ** -24);
    expect(v[5]).toBe(Math.fround(1023 * 2 ** -24));
  });

  it('reads a tensor at an unaligned offset', () => {
    // A header not padded to 8 puts F32 data at an odd offset; the reader must copy, not view.
    const header = JSON.stringify({ t: { dtype: 'F32', shape: [2], data_offsets: [0, 8] } }) + ' ';
    const hb = new TextEncoder().encode(header);
    const file = new Uint8Array(8 + hb.length + 8);
    new DataView(file.buffer).setBigUint64(0, BigInt(hb.length), true);
    file.set(hb, 8);
    file.set(f32Bytes([3.5, -1]), 8 + hb.length);
    expect((8 + hb.length) % 4).not.toBe(0);
    expect(Array.from(readTensorF32(weightSetFromFiles(new Map([['u.safetensors', file]])), 't'))).toEqual([3.5, -1]);
  });

  it('reads a header from disk and tensors by byte range (paths, no whole-file read)', () => {
    const p = path.join(tmp, 'disk.safetensors');
    writeFileSync(p, bytes);
    const h = readSafetensorsHeaderFromDisk(p, 'disk.safetensors');
    expect(h.tensors.length).toBe(7);
    const ws: ReadableWeightSet = {
      files: new Map(),
      paths: new Map([['disk.safetensors', p]]),
      tensors: new Map(h.tensors.map((t) => [t.name, t])),
      metadata: h.metadata,
    };
    ws.readRange = (file, offset, length) => readFileRange(ws.paths.get(file)!, offset, length);
    expect(Array.from(readTensorF32(ws, 'a.f32'))).toEqual(f32);
    expect(Array.from(readTensorF32(ws, 'c.bf16'))).toEqual(bf16Expected);
    // Without bytes or a reader the error is structured, not a crash.
    expect(() => readTensorF32({ ...ws, readRange: undefined }, 'a.f32')).toThrowError(LoupeError);
  });
});

describe('safetensors: each broken rule has its own error code', () => {
  const good = {
    w: { dtype: 'F32', shape: [2, 2], data_offsets: [0, 16] },
    v: { dtype: 'F32', shape: [4], data_offsets: [16, 32] },
  };
  const data = f32Bytes([1, 2, 3, 4, 5, 6, 7, 8]);

  it('accepts the control file', () => {
    expect(parseSafetensors(rawSafetensors(good, data), 'ok.safetensors').tensors.length).toBe(2);
  });

  it('SAFETENSORS_TRUNCATED: file cut inside the data, inside the header, before the length', () => {
    const full = rawSafetensors(good, data);
    const e = expectCode(
      () => parseSafetensors(full.subarray(0, full.byteLength - 5), 'cut.safetensors'),
      'SAFETENSORS_TRUNCATED',
      'cut.safetensors',
      '"v"',
    );
    expect(e.hint).toBeTruthy();
    expectCode(
      () => parseSafetensors(full.subarray(0, 20), 'cut2.safetensors'),
      'SAFETENSORS_TRUNCATED',
      'cut2.safetensors',
    );
    expectCode(
      () => parseSafetensors(full.subarray(0, 5), 'cut3.safetensors'),
      'SAFETENSORS_TRUNCATED',
      'cut3.safetensors',
    );
  });

  it('SAFETENSORS_HEADER_TOO_LARGE: header length above the cap', () => {
    const f = rawSafetensors(good, data, { headerLength: BigInt(MAX_HEADER_BYTES + 1) });
    expectCode(() => parseSafetensors(f, 'big.safetensors'), 'SAFETENSORS_HEADER_TOO_LARGE', 'big.safetensors');
    const f2 = rawSafetensors(good, data, { headerLength: 2n ** 63n });
    expectCode(() => parseSafetensors(f2, 'huge.safetensors'), 'SAFETENSORS_HEADER_TOO_LARGE');
  });

  it('SAFETENSORS_BAD_HEADER: not JSON, not an object, bad fields, negative or fractional dims', () => {
    const notJson = new TextEncoder().encode('{"w": {"dtype": "F32",');
    const f = new Uint8Array(8 + notJson.length);
    new DataView(f.buffer).setBigUint64(0, BigInt(notJson.length), true);
    f.set(notJson, 8);
    expectCode(() => parseSafetensors(f, 'json.safetensors'), 'SAFETENSORS_BAD_HEADER', 'json.safetensors', 'JSON');
    expectCode(() => parseSafetensors(rawSafetensors([1, 2], data), 'arr.safetensors'), 'SAFETENSORS_BAD_HEADER');
    expectCode(
      () =>
        parseSafetensors(
          rawSafetensors({ w: { dtype: 'F32', shape: [-2, -2], data_offsets: [0, 16] } }, data),
          'neg.safetensors',
        ),
      'SAFETENSORS_BAD_HEADER',
      '"w"',
    );
    expectCode(
      () =>
        parseSafetensors(
          rawSafetensors({ w: { dtype: 'F32', shape: [2.5], data_offsets: [0, 10] } }, data),
          'frac.safetensors',
        ),
      'SAFETENSORS_BAD_HEADER',
      '"w"',
    );
    expectCode(
      () =>
        parseSafetensors(
          rawSafetensors({ w: { dtype: 'F32', shape: [4], data_offsets: [16, 0] } }, data),
          'rev.safetensors',
        ),
      'SAFETENSORS_BAD_HEADER',
      '"w"',
    );
    expectCode(
      () => parseSafetensors(rawSafetensors({ w: { dtype: 'F32', shape: [4] } }, data), 'nooff.safetensors'),
      'SAFETENSORS_BAD_HEADER',
      '"w"',
    );
    expectCode(
      () => parseSafetensors(rawSafetensors({ __metadata__: { a: 1 }, ...good }, data), 'meta.safetensors'),
      'SAFETENSORS_BAD_HEADER',
      '__metadata__',
    );
  });

  it('SAFETENSORS_UNKNOWN_DTYPE names the tensor and the dtype', () => {
    const e = expectCode(
      () =>
        parseSafetensors(
          rawSafetensors({ ...good, q: { dtype: 'F8_E4M3', shape: [1], data_offsets: [32, 33] } }, data),
          'dt.safetensors',
        ),
      'SAFETENSORS_UNKNOWN_DTYPE',
      'dt.safetensors',
      '"q"',
      'F8_E4M3',
    );
    expect(e.hint).toContain('BF16');
  });

  it('SAFETENSORS_SIZE_MISMATCH: shape x dtype size != byte span', () => {
    // declared F16 but spans F32-sized bytes
    expectCode(
      () =>
        parseSafetensors(
          rawSafetensors({ w: { dtype: 'F16', shape: [2, 2], data_offsets: [0, 16] }, v: good.v }, data),
          'sz.safetensors',
        ),
      'SAFETENSORS_SIZE_MISMATCH',
      'sz.safetensors',
      '"w"',
    );
  });

  it('SAFETENSORS_OVERLAP: two tensors share bytes', () => {
    expectCode(
      () =>
        parseSafetensors(
          rawSafetensors({ w: good.w, v: { dtype: 'F32', shape: [4], data_offsets: [8, 24] } }, data),
          'ov.safetensors',
        ),
      'SAFETENSORS_OVERLAP',
      'ov.safetensors',
      '"w"',
      '"v"',
    );
  });

  it('SAFETENSORS_OFFSET_OUT_OF_RANGE: a tensor placed past the end of the data', () => {
    expectCode(
      () =>
        parseSafetensors(
          rawSafetensors({ w: good.w, v: { dtype: 'F32', shape: [4], data_offsets: [1000, 1016] } }, data),
          'oor.safetensors',
        ),
      'SAFETENSORS_OFFSET_OUT_OF_RANGE',
      'oor.safetensors',
      '"v"',
    );
  });

  it('never throws anything but a LoupeError on random corruption', () => {
    // Flip bytes of the header region of a valid file: whatever breaks must break cleanly.
    const base = rawSafetensors(good, data);
    let seed = 12345;
    const rnd = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    let errors = 0;
    for (let i = 0; i < 500; i++) {
      const f = base.slice();
      const k = 1 + Math.floor(rnd() * 3);
      for (let j = 0; j < k; j++) f[Math.floor(rnd() * (base.byteLength - data.byteLength))] = Math.floor(rnd() * 256);
      try {
        parseSafetensors(f, 'fuzz.safetensors');
      } catch (e) {
        expect(e).toBeInstanceOf(LoupeError);
        errors++;
      }
    }
    expect(errors).toBeGreaterThan(100);
  });
});
