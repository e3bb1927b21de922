/**
 * Validate documents against the PUBLISHED JSON Schemas (src/ops/schemas.ts), with an
 * independent validator (ajv, draft 2020-12) — not with the zod schemas they were made from.
 * ajv is a pinned devDependency.
 */
import Ajv2020 from 'ajv/dist/2020';
import { schemasOf } from '../src/ops/schemas';

const ajv = new Ajv2020({ strict: false, allErrors: true });
const cache = new Map<string, ReturnType<typeof ajv.compile>>();

function validator(op: string, which: 'input' | 'output') {
  const key = `${op}/${which}`;
  let v = cache.get(key);
  if (!v) {
    v = ajv.compile(schemasOf(op)[which]);
    cache.set(key, v);
  }
  return v;
}

/** errors of a document (or input) against op's published schema; [] when valid */
export function schemaErrors(op: string, doc: unknown, which: 'input' | 'output' = 'output'): string[] {
  const v = validator(op, which);
  if (v(doc)) return [];
  return (v.errors ?? []).map((e) => `${e.instancePath || '/'} ${e.message}`);
}

/** JSON round trip: what a surface actually sends */
export const viaJson = <T>(x: T): T => JSON.parse(JSON.stringify(x));
