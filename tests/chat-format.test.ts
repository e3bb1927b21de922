/**
 * Chat format (engine/chat.ts, applied by the operation template): the prompt rendered through the
 * model's own chat_template, BOS not prepended twice, the document records it, every surface gets
 * it (operation run, CLI --chat), and a model without a template refuses with NO_CHAT_TEMPLATE.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdtempSync, copyFileSync, readFileSync, writeFileSync, rmSync } from 'node:fs';
import { execFile } from 'node:child_process';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { LoupeError } from '../src/engine/errors';
import { operations } from '../src/ops';
import { renderChat } from '../src/engine/chat';
import { SHARED } from './helpers/shared';

const STORIES = path.join(SHARED, 'models', 'stories260K');
const BIN = path.resolve(__dirname, '../bin/loupe.mjs');
// ChatML-like, written here: BOS text first, one turn per message, then the assistant's turn
const TEMPLATE =
  '{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}';
const USER = 'Once upon a time';
const EXPECTED = '<s><|im_start|>user\nOnce upon a time<|im_end|>\n<|im_start|>assistant\n';

function loupe(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((res) => {
    execFile(
      process.execPath,
      [BIN, ...args],
      { cwd: tmpdir(), maxBuffer: 64 << 20, env: { ...process.env, NO_COLOR: '1' } },
      (err, stdout, stderr) => {
        res({ code: err ? (typeof (err as any).code === 'number' ? (err as any).code : 1) : 0, stdout, stderr });
      },
    );
  });
}

describe('chat format', () => {
  let dir: string;
  let chat: LoadedModel;
  let plain: LoadedModel;
  beforeAll(async () => {
    dir = mkdtempSync(path.join(tmpdir(), 'loupe-chat-'));
    for (const f of ['config.json', 'tokenizer.json', 'model.safetensors', 'generation_config.json'])
      copyFileSync(path.join(STORIES, f), path.join(dir, f));
    const tc = JSON.parse(readFileSync(path.join(STORIES, 'tokenizer_config.json'), 'utf8'));
    writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify({ ...tc, chat_template: TEMPLATE }));
    chat = await loadModelNode(dir);
    plain = await loadModelNode(STORIES);
  });
  afterAll(async () => {
    await chat?.dispose();
    await plain?.dispose();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('renders the user message through the template exactly', () => {
    expect(chat.chatPrompt(USER)).toBe(EXPECTED);
    // a list of named templates: the default one is used
    expect(
      renderChat(
        {
          bos_token: '<s>',
          chat_template: [
            { name: 'tool_use', template: 'x' },
            { name: 'default', template: TEMPLATE },
          ],
        },
        USER,
      ),
    ).toBe(EXPECTED);
  });

  it('an operation with chat: tokens are the rendered text tokenized, BOS once, and the document records it', async () => {
    const doc: any = await operations.logit_lens.run(chat, { prompt: USER, chat: true });
    const ids = chat.tokenize(EXPECTED, { prependBos: false });
    expect(doc.prompt).toBe(EXPECTED);
    expect(doc.prompt_format).toEqual({ chat: true, user_prompt: USER, rendered: EXPECTED });
    expect(doc.tokens.map((t: any) => t.id)).toEqual(ids);
    // the template's "<s>" text is the BOS token, and it is not prepended a second time
    expect(chat.bosTokenId).toBeDefined();
    expect(ids[0]).toBe(chat.bosTokenId);
    expect(ids.filter((id) => id === chat.bosTokenId)).toHaveLength(1);
    // asking for prepend_bos too does not add a second BOS
    const both: any = await operations.logit_lens.run(chat, { prompt: USER, chat: true, prepend_bos: true });
    expect(both.tokens.map((t: any) => t.id)).toEqual(ids);
    // without chat nothing changes: prompt as written, BOS prepended, no prompt_format
    const off: any = await operations.logit_lens.run(chat, { prompt: USER });
    expect(off.prompt).toBe(USER);
    expect(off.prompt_format).toBeUndefined();
    expect(off.tokens.map((t: any) => t.id)).toEqual(chat.tokenize(USER));
  });

  it('patch renders the corrupted prompt as well, so clean and corrupted are formatted alike', async () => {
    const doc: any = await operations.patch.run(chat, {
      prompt: 'Tim had a dog',
      corrupted_prompt: 'Tim had a cat',
      chat: true,
      answer: '#300',
      counterfactual: '#301',
    });
    expect(doc.prompt).toBe(chat.chatPrompt('Tim had a dog'));
    expect(doc.corrupted_prompt).toBe(chat.chatPrompt('Tim had a cat'));
    expect(doc.corrupted_tokens.map((t: any) => t.id)).toEqual(
      chat.tokenize(chat.chatPrompt('Tim had a cat'), { prependBos: false }),
    );
    expect(doc.prompt_format.user_prompt).toBe('Tim had a dog');
  });

  it('every operation that takes a prompt takes chat (one shared field)', () => {
    const missing: string[] = [];
    let checked = 0;
    for (const [name, op] of Object.entries(operations)) {
      const shape = (op.input as any).shape ?? (op.input as any)._def?.schema?.shape;
      if (shape && 'prompt' in shape) {
        checked++;
        if (!('chat' in shape)) missing.push(name);
      }
    }
    expect(missing).toEqual([]);
    expect(checked).toBeGreaterThan(10);
  });

  it('a model without a chat_template refuses with NO_CHAT_TEMPLATE; chat without a prompt is BAD_INPUT', async () => {
    const err = await operations.logit_lens.run(plain, { prompt: USER, chat: true }).catch((e) => e);
    expect(err).toBeInstanceOf(LoupeError);
    expect(err.code).toBe('NO_CHAT_TEMPLATE');
    expect(err.hint).toMatch(/without chat format/);
    const noPrompt = await operations.ablate.run(chat, { token_ids: [1, 2, 3], chat: true }).catch((e) => e);
    expect(noPrompt.code).toBe('BAD_INPUT');
  });

  it('CLI --chat: the document records the rendered prompt', async () => {
    const r = await loupe(['logit_lens', dir, USER, '--chat', '--json', '--quiet']);
    expect(r.code, r.stderr).toBe(0);
    const doc = JSON.parse(r.stdout);
    expect(doc.prompt_format).toEqual({ chat: true, user_prompt: USER, rendered: EXPECTED });
    expect(doc.tokens[0].id).toBe(1);
    const bad = await loupe(['logit_lens', STORIES, USER, '--chat', '--json']);
    expect(bad.code).not.toBe(0);
    expect(bad.stdout).toMatch(/NO_CHAT_TEMPLATE/);
  });
});
