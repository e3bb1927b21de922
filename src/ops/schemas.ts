/**
 * The published JSON Schemas of every operation's input and output, generated from the zod
 * schemas the operations validate with (one source of truth), by one conversion: `loupe schema`
 * and the page's forms read draft 2020-12, the MCP bridge reads draft-07 (what MCP clients and
 * the SDK's own servers use). The tests validate documents against these.
 */
import { z } from 'zod';
import { SCHEMA_VERSION } from '../schema/common';
import type { Operation } from './types';
import { operations, requireOperation } from './index';

export type JsonSchema = Record<string, unknown>;
export type SchemaTarget = 'draft-2020-12' | 'draft-7';

/**
 * zod → JSON Schema. `io: 'input'` describes what a caller may send (fields with a default are
 * optional); `'output'` what comes back. Types JSON cannot express (none in documents today)
 * become `{}` rather than failing a listing.
 */
export function toJsonSchema(
  schema: z.ZodType,
  io: 'input' | 'output',
  target: SchemaTarget = 'draft-2020-12',
): JsonSchema {
  return z.toJSONSchema(schema, { io, target, unrepresentable: 'any' }) as JsonSchema;
}

export interface OperationSchemas {
  name: string;
  description: string;
  schema_version: string;
  /** what a caller may send (defaults applied by the operation: fields with a default are optional) */
  input: JsonSchema;
  /** what the operation returns */
  output: JsonSchema;
}

export function operationSchemas(op: Operation, target: SchemaTarget = 'draft-2020-12'): OperationSchemas {
  return {
    name: op.name,
    description: op.description,
    schema_version: SCHEMA_VERSION,
    input: toJsonSchema(op.input, 'input', target),
    output: toJsonSchema(op.output, 'output', target),
  };
}

/** schemas of one operation by name (UNKNOWN_OPERATION when there is none) */
export function schemasOf(name: string, target?: SchemaTarget): OperationSchemas {
  return operationSchemas(requireOperation(name), target);
}

/** every registered operation's schemas, keyed by name */
export function allSchemas(target?: SchemaTarget): Record<string, OperationSchemas> {
  const out: Record<string, OperationSchemas> = {};
  for (const name of Object.keys(operations)) out[name] = operationSchemas(operations[name], target);
  return out;
}
