/**
 * The published JSON Schemas of every operation's input and output, generated from the zod
 * schemas the operations validate with (one source of truth). Used by `loupe schema`, the MCP
 * bridge (inputSchema / outputSchema) and the tests that validate documents against them.
 */
import { z } from 'zod';
import { operations, getOperation } from '../ops/index';
import type { Operation } from '../ops/types';
import { LoupeError } from '../engine/errors';
import { SCHEMA_VERSION } from './common';

export type JsonSchema = Record<string, unknown>;

export interface OperationSchemas {
  name: string;
  description: string;
  schema_version: string;
  /** what a caller may send (defaults applied by the operation: fields with a default are optional) */
  input: JsonSchema;
  /** what the operation returns */
  output: JsonSchema;
}

export function operationSchemas(op: Operation): OperationSchemas {
  return {
    name: op.name,
    description: op.description,
    schema_version: SCHEMA_VERSION,
    input: z.toJSONSchema(op.input, { io: 'input', target: 'draft-2020-12' }) as JsonSchema,
    output: z.toJSONSchema(op.output, { io: 'output', target: 'draft-2020-12' }) as JsonSchema,
  };
}

/** schemas of one operation by name (UNKNOWN_OPERATION when there is none) */
export function schemasOf(name: string): OperationSchemas {
  const op = getOperation(name);
  if (!op) throw new LoupeError('UNKNOWN_OPERATION', `No operation named '${name}'.`, `Operations: ${Object.keys(operations).join(', ')}.`);
  return operationSchemas(op);
}

/** every registered operation's schemas, keyed by name */
export function allSchemas(): Record<string, OperationSchemas> {
  const out: Record<string, OperationSchemas> = {};
  for (const name of Object.keys(operations)) out[name] = operationSchemas(operations[name]);
  return out;
}
