// The package's Node entry (`import { loadModel } from 'loupe'`): the TypeScript library
// (src/library/index.ts) loaded through tsx's scoped loader, as bin/loupe.mjs runs the CLI, so a
// fresh clone needs no build step; its types are the TypeScript source (package.json `types`).
import { tsImport } from 'tsx/esm/api';

const lib = await tsImport('../src/library/index.ts', import.meta.url);
export const { loadModel, ops, Model, makeOps, getActName, tensor, LoupeError } = lib;
