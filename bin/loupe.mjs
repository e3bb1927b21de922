#!/usr/bin/env node
// The `loupe` command: runs the TypeScript CLI through tsx (a dependency), from any directory.
import { register } from 'tsx/esm/api';

register();
const { main } = await import(new URL('../src/cli/main.ts', import.meta.url).href);
process.exitCode = await main(process.argv.slice(2));
