/**
 * `head_scores` on induction-gpt2: the layer-1 induction heads and L0H0/L0H1 as previous-token
 * heads, with every score within 0.05 of the model README's independent PyTorch measurement
 * (50 sequences [EOT] + R + R of random bytes); the scores equal those computed here, with this
 * file's own loops, from the float64 reference forward's patterns on the same sequences.
 * Plus: the prompt scores, the CLI through the registry, errors and cancellation.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { execFile } from 'node:child_process';
import { resolve } from 'node:path';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { operation as headScores } from '../src/ops/head_scores';
import { loadModelDir, referenceForward, type RefModel } from './reference';
import { schemaErrors, viaJson } from './schema-helpers';
import { SHARED } from './helpers/shared';

const DIR = SHARED + '/models/induction-gpt2';
// ../shared/models/induction-gpt2/README.md, "Measured": random bytes 0–255, 50 sequences, R = 30
const README = {
  induction: [0.0, 0.0, 0.027, 0.003, 0.785, 0.805, 0.804, 0.816],
  previous_token: [0.657, 0.679, 0.071, 0.224, 0.039, 0.033, 0.031, 0.034],
};

let model: LoadedModel;
let ref: RefModel;
beforeAll(async () => {
  model = await loadModelNode(DIR);
  ref = loadModelDir(DIR);
});
afterAll(async () => {
  await model?.dispose();
});

describe('head_scores', () => {
  it('finds the layer-1 induction heads and L0H0/L0H1 as previous-token heads (README numbers ± 0.05)', async () => {
    const doc = await headScores.run(model, { batch: 50, seed: 3 }, {});
    expect(schemaErrors('head_scores', viaJson(doc))).toEqual([]);
    expect(doc.method.seq_len).toBe(30);
    expect(doc.heads).toHaveLength(8);
    const lines: string[] = [];
    doc.heads.forEach((h, i) => {
      lines.push(
        `L${h.layer}H${h.head} prev ${h.previous_token.toFixed(3)} (README ${README.previous_token[i]}) ind ${h.induction.toFixed(3)} (README ${README.induction[i]}) dup ${h.duplicate_token.toFixed(3)}`,
      );
      expect(Math.abs(h.previous_token - README.previous_token[i])).toBeLessThanOrEqual(0.05);
      expect(Math.abs(h.induction - README.induction[i])).toBeLessThanOrEqual(0.05);
    });
    console.log('head_scores on induction-gpt2 (50 sequences):\n' + lines.join('\n'));
    const name = (x: { layer: number; head: number }) => `L${x.layer}H${x.head}`;
    expect(doc.top.induction.slice(0, 4).map(name).sort()).toEqual(['L1H0', 'L1H1', 'L1H2', 'L1H3']);
    expect(doc.top.previous_token.slice(0, 2).map(name).sort()).toEqual(['L0H0', 'L0H1']);
    for (const h of doc.heads.filter((x) => x.layer === 1)) expect(h.induction).toBeGreaterThan(0.6);
    for (const h of doc.heads.filter((x) => x.layer === 0)) expect(h.induction).toBeLessThan(0.1);
    expect(doc.example.patterns).toHaveLength(2);
    expect(doc.example.patterns![1][0]).toHaveLength(61);
    expect(doc.prompt_scores).toBeNull();
  });

  it("equals the scores computed from the float64 reference forward's patterns", async () => {
    const doc = await headScores.run(model, { batch: 3, seed: 9, seq_len: 12 }, {});
    // regenerate the same sequences from the document's example and seed is not possible without the
    // op's sampler, so score the example sequence alone (batch 1 with the same seed gives it)
    const one = await headScores.run(model, { batch: 1, seed: 9, seq_len: 12 }, {});
    expect(one.example.token_ids).toEqual(doc.example.token_ids);
    const ids = one.example.token_ids;
    const T = ids.length;
    const r = referenceForward(ref, ids, { record: (n) => n.endsWith('hook_pattern') });
    for (const h of one.heads) {
      const A = r.hooks[`blocks.${h.layer}.attn.hook_pattern`].data;
      const at = (q: number, k: number) => A[(h.head * T + q) * T + k];
      let prev = 0;
      for (let q = 1; q < T; q++) prev += at(q, q - 1);
      let ind = 0,
        dup = 0,
        nInd = 0,
        nDup = 0;
      for (let q = 0; q < T; q++) {
        const earlier = [];
        for (let k = 0; k < q; k++) if (ids[k] === ids[q]) earlier.push(k);
        if (earlier.length) {
          nDup++;
          dup += earlier.reduce((a, k) => a + at(q, k), 0);
        }
        const after = earlier.filter((k) => k + 1 < q);
        if (after.length) {
          nInd++;
          ind += after.reduce((a, k) => a + at(q, k + 1), 0);
        }
      }
      expect(Math.abs(h.previous_token - prev / (T - 1))).toBeLessThan(1e-5);
      expect(Math.abs(h.induction - ind / nInd)).toBeLessThan(1e-5);
      expect(Math.abs(h.duplicate_token - dup / nDup)).toBeLessThan(1e-5);
    }
  });

  it('scores the prompt too, and checks its input before any run', async () => {
    const prompt = 'Xq3$kP9!zR#w Xq3$kP9!zR#w'; // random printable characters, repeated
    const doc = await headScores.run(model, { batch: 2, seq_len: 8, prompt }, {});
    expect(doc.prompt).toBe(prompt);
    expect(doc.prompt_scores!.heads).toHaveLength(8);
    expect(doc.prompt_scores!.patterns![0][0]).toHaveLength(doc.tokens.length);
    // the repeated half makes the layer-1 heads induct on the prompt as well
    const ind = doc.prompt_scores!.heads.map((h) => h.induction);
    console.log(`prompt induction: ${ind.map((x) => x.toFixed(3)).join(' ')}`);
    expect(Math.min(...ind.slice(4))).toBeGreaterThan(0.3);
    expect(Math.max(...ind.slice(0, 4))).toBeLessThan(0.1);
    await expect(headScores.run(model, { seq_len: 40 }, {})).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await expect(headScores.run(model, { batch: 0 }, {})).rejects.toMatchObject({ code: 'BAD_INPUT' });
    const ac = new AbortController();
    const p = headScores.run(model, { batch: 256 }, { signal: ac.signal, onProgress: () => ac.abort() });
    await expect(p).rejects.toMatchObject({ code: 'ABORTED' });
  });

  it('runs from the CLI through the registry (--seq-len --batch --seed)', async () => {
    const out = await new Promise<string>((res, rej) =>
      execFile(
        process.execPath,
        [
          resolve(__dirname, '../bin/loupe.mjs'),
          'head_scores',
          DIR,
          '--seq-len',
          '10',
          '--batch',
          '4',
          '--seed',
          '2',
          '--json',
        ],
        { maxBuffer: 64 << 20 },
        (err, stdout, stderr) => (err ? rej(new Error(stderr)) : res(stdout)),
      ),
    );
    const cli = JSON.parse(out);
    const same = await headScores.run(model, { seq_len: 10, batch: 4, seed: 2 }, {});
    expect(cli.method.seq_len).toBe(10);
    cli.heads.forEach((h: any, i: number) =>
      expect(Math.abs(h.induction - same.heads[i].induction)).toBeLessThan(1e-5),
    );
  });
});
