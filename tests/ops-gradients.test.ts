/**
 * attribution_patching and integrated_gradients on induction-gpt2, judged against independent
 * references: the float64 reference forward (tests/reference) with central finite differences
 * for the gradients, and the `patch` operation (real activation patching) for the validation.
 * Then the same documents from the CLI (--json), the operation called directly and headless MCP.
 */
import { execFile } from 'node:child_process';
import { realpathSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { getOperation } from '../src/ops/index';
import { loadModelDir, referenceForward, mulberry32, type RefModel } from './reference';
import { SHARED } from './helpers/shared';
import type { OperationDocument } from '../src/ops/index';
type AttributionPatchingDocument = OperationDocument<'attribution_patching'>;
type IntegratedGradientsDocument = OperationDocument<'integrated_gradients'>;
type PatchDocument = OperationDocument<'patch'>;

// the real path: the companion's --allow-local check compares resolved folders
const INDUCTION = realpathSync(path.join(SHARED, 'models/induction-gpt2'));
const ROOT = path.resolve(__dirname, '..');
const BIN = path.join(ROOT, 'bin', 'loupe.mjs');

// [EOT] + R + R[:-1]: the last token's next is R's last byte, which only the induction circuit can
// know; the corrupted prompt has a different first copy, so induction predicts R2's last byte there
const r = mulberry32(5);
const R = Array.from({ length: 12 }, () => Math.floor(r() * 256));
const R2 = Array.from({ length: 12 }, () => Math.floor(r() * 256));
const CLEAN = [256, ...R, ...R.slice(0, -1)];
const CORR = [256, ...R2, ...R.slice(0, -1)];
const ANSWER = R[R.length - 1];
const CF = R2[R2.length - 1];
const T = CLEAN.length;
const ATP_INPUT = {
  token_ids: CLEAN,
  corrupted_token_ids: CORR,
  answer: `#${ANSWER}`,
  counterfactual: `#${CF}`,
  validate: 8,
};
const IG_INPUT = { token_ids: CLEAN, answer: `#${ANSWER}`, counterfactual: `#${CF}`, steps: 8 };

let model: LoadedModel;
let ref: RefModel;
let atp: AttributionPatchingDocument;
let ig: IntegratedGradientsDocument;

beforeAll(async () => {
  model = await loadModelNode(INDUCTION, { backend: 'node' });
  ref = loadModelDir(INDUCTION);
  atp = await getOperation('attribution_patching')!.run(model, ATP_INPUT, {});
  ig = await getOperation('integrated_gradients')!.run(model, IG_INPUT, {});
}, 120_000);
afterAll(async () => {
  await model?.dispose();
});

/** M of the float64 reference with one hook's value replaced */
function refMetric(tokens: number[], hook: string, edit: (v: Float64Array) => void): number {
  const out = referenceForward(ref, tokens, {
    record: false,
    hook: (name, v) => {
      if (name !== hook) return;
      edit(v);
      return v;
    },
  });
  const V = out.logits.dims[2];
  const L = out.logits.data;
  return L[(T - 1) * V + ANSWER] - L[(T - 1) * V + CF];
}

function refHook(tokens: number[], hook: string): Float64Array {
  return referenceForward(ref, tokens, { record: (n) => n === hook }).hooks[hook].data;
}

describe('attribution_patching on induction-gpt2', () => {
  it('ranks the four layer-1 induction heads top, and the validation agrees with real patching', async () => {
    const top = atp.heads
      .slice()
      .sort((a, b) => b.estimate - a.estimate)
      .slice(0, 4);
    expect(top.map((h) => h.layer)).toEqual([1, 1, 1, 1]);
    expect(atp.metric.clean).toBeGreaterThan(5);
    expect(atp.metric.clean - atp.metric.corrupted).toBeGreaterThan(5);

    // the validation's actual effects are those of the patch operation (head_out, all positions)
    const patch: PatchDocument = await getOperation('patch')!.run(
      model,
      {
        token_ids: CLEAN,
        corrupted_token_ids: CORR,
        answer: `#${ANSWER}`,
        counterfactual: `#${CF}`,
        scans: ['head_out'],
      },
      {},
    );
    const denom = patch.clean_logit_diff - patch.corrupted_logit_diff;
    const v = atp.validation!;
    expect(v.heads.length).toBe(8);
    for (const h of v.heads) expect(h.actual).toBeCloseTo(patch.head_out![h.layer][h.head]! * denom, 4);
    // on the induction heads the linear estimate holds: same sign, within 25%
    for (const h of v.heads.filter((x) => x.layer === 1)) {
      expect(Math.sign(h.estimate)).toBe(Math.sign(h.actual));
      expect(Math.abs(h.estimate - h.actual) / Math.abs(h.actual)).toBeLessThan(0.25);
    }
    expect(v.rank_correlation.heads!).toBeGreaterThan(0.5);
    console.log(
      'AtP heads (estimate / actual):',
      v.heads.map((h) => `L${h.layer}H${h.head} ${h.estimate.toFixed(3)}/${h.actual.toFixed(3)}`).join(', '),
      `ρ = ${v.rank_correlation.heads?.toFixed(3)}`,
    );
  });

  it('float32 estimates agree with float64 finite differences within 1e-4 (every head and site)', () => {
    const eps = 1e-5;
    let worst = 0;
    const check = (hook: string, mask: (i: number) => boolean, estimate: number) => {
      const c = refHook(CLEAN, hook),
        k = refHook(CORR, hook);
      const dir = c.map((x, i) => (mask(i) ? x - k[i] : 0));
      const fd =
        (refMetric(CORR, hook, (v) => v.forEach((_, i) => (v[i] += eps * dir[i]))) -
          refMetric(CORR, hook, (v) => v.forEach((_, i) => (v[i] -= eps * dir[i])))) /
        (2 * eps);
      worst = Math.max(worst, Math.abs(fd - estimate));
      expect(Math.abs(fd - estimate), `${hook}`).toBeLessThan(1e-4);
    };
    const { n_heads: H, d_head: Dh, d_model: D } = model.info;
    for (const h of atp.heads)
      check(`blocks.${h.layer}.attn.hook_z`, (i) => Math.floor(i / Dh) % H === h.head, h.estimate);
    for (const s of atp.sites) check(s.hook, (i) => Math.floor(i / D) === s.position, s.estimate);
    console.log(
      `AtP: ${atp.heads.length} heads + ${atp.sites.length} sites, worst |estimate − float64 FD| ${worst.toExponential(2)}`,
    );
  }, 120_000);

  it('unequal token lengths are BAD_INPUT', async () => {
    await expect(
      getOperation('attribution_patching')!.run(model, { ...ATP_INPUT, corrupted_token_ids: CORR.slice(1) }, {}),
    ).rejects.toMatchObject({ code: 'BAD_INPUT' });
  });
});

describe('integrated_gradients on induction-gpt2', () => {
  it('float32 attributions agree with a float64 finite-difference IG within 1e-3; completeness is reported', () => {
    const hook = 'blocks.0.hook_resid_pre';
    const x = refHook(CLEAN, hook);
    const D = model.info.d_model;
    const n = IG_INPUT.steps;
    const eps = 1e-5;
    let worst = 0;
    let sum = 0;
    for (let p = 0; p < T; p++) {
      let acc = 0;
      for (let k = 1; k <= n; k++) {
        const alpha = k / n;
        const at = (e: number) =>
          refMetric(CLEAN, hook, (v) =>
            v.forEach((_, i) => (v[i] = alpha * x[i] + (Math.floor(i / D) === p ? e * x[i] : 0))),
          );
        acc += (at(eps) - at(-eps)) / (2 * eps) / n;
      }
      sum += acc;
      worst = Math.max(worst, Math.abs(acc - ig.attributions[p].attribution));
      expect(Math.abs(acc - ig.attributions[p].attribution), `position ${p}`).toBeLessThan(1e-3);
    }
    const mIn = refMetric(CLEAN, hook, () => undefined);
    const mBase = refMetric(CLEAN, hook, (v) => v.fill(0));
    expect(ig.completeness.metric_input).toBeCloseTo(mIn, 3);
    expect(ig.completeness.metric_baseline).toBeCloseTo(mBase, 3);
    expect(ig.completeness.sum).toBeCloseTo(sum, 2);
    expect(ig.completeness.error).toBeCloseTo(sum - (mIn - mBase), 2);
    expect(ig.attributions.map((a) => a.token)).toEqual(model.tokenStrings(CLEAN));
    console.log(
      `IG (${n} steps): worst |attribution − float64 FD IG| ${worst.toExponential(2)}; completeness error ${ig.completeness.error.toFixed(3)} of ${(mIn - mBase).toFixed(3)}`,
    );
  }, 120_000);
});

describe('the same documents from the CLI, the operation and headless MCP', () => {
  let client: Client;
  beforeAll(async () => {
    const transport = new StdioClientTransport({
      command: process.execPath,
      args: [BIN, 'mcp', '--headless', '--allow-local', path.dirname(INDUCTION)],
      cwd: ROOT,
      env: process.env as Record<string, string>,
      stderr: 'pipe',
    });
    client = new Client({ name: 'gradients-test', version: '1' });
    await client.connect(transport);
    const loaded = await client.callTool({ name: 'load_model', arguments: { model: INDUCTION } });
    expect(loaded.isError, JSON.stringify(loaded.content)).toBeFalsy();
  }, 60_000);
  afterAll(async () => {
    await client?.close();
  });

  const close = (a: unknown, b: unknown, tol: number, at = '$'): void => {
    if (typeof a === 'number' && typeof b === 'number') {
      expect(Math.abs(a - b), at).toBeLessThanOrEqual(tol);
      return;
    }
    if (Array.isArray(a) && Array.isArray(b)) {
      expect(a.length, at).toBe(b.length);
      a.forEach((x, i) => close(x, b[i], tol, `${at}[${i}]`));
      return;
    }
    if (a && b && typeof a === 'object' && typeof b === 'object') {
      expect(Object.keys(a).sort(), at).toEqual(Object.keys(b).sort());
      for (const k of Object.keys(a)) close((a as any)[k], (b as any)[k], tol, `${at}.${k}`);
      return;
    }
    expect(a, at).toEqual(b);
  };

  it.each([
    [
      'attribution_patching',
      [
        '--token-ids',
        CLEAN.join(','),
        '--corrupted-token-ids',
        CORR.join(','),
        '--answer',
        `#${ANSWER}`,
        '--counterfactual',
        `#${CF}`,
        '--validate',
        '8',
      ],
      ATP_INPUT,
    ],
    [
      'integrated_gradients',
      ['--token-ids', CLEAN.join(','), '--answer', `#${ANSWER}`, '--counterfactual', `#${CF}`, '--steps', '8'],
      IG_INPUT,
    ],
  ] as const)(
    '%s',
    async (op, args, input) => {
      const cli = await promisify(execFile)(process.execPath, [BIN, op, INDUCTION, ...args, '--json'], {
        cwd: ROOT,
        maxBuffer: 64 << 20,
      });
      const viaCli = JSON.parse(cli.stdout);
      const viaMcp = await client.callTool({ name: op, arguments: input as any });
      expect(viaMcp.isError).toBeFalsy();
      const direct = op === 'attribution_patching' ? atp : ig;
      close(viaCli, JSON.parse(JSON.stringify(direct)), 1e-4);
      close(viaMcp.structuredContent, JSON.parse(JSON.stringify(direct)), 1e-4);
    },
    120_000,
  );
});
