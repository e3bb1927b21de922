/**
 * The page's "chat" checkbox (the shared chat field, rendered by the operation form): an instruct
 * model from a loopback Hub mimic, whose tokenizer_config.json has a ChatML-like chat_template,
 * runs logit_lens on the rendered prompt; the document records it and BOS appears once.
 */
import { mkdtempSync, copyFileSync, readFileSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import type { BrowserContext, Page } from '@playwright/test';
import {
  test,
  expect,
  openReady,
  loadFromHub,
  waitModelReady,
  runOp,
  watchErrors,
  pageDoc,
  SHARED_MODELS,
  shotWidthsThemes,
} from './fixtures';

test.describe.configure({ mode: 'serial' });

const REPO = 'loupe-test/stories-chat';
const TEMPLATE =
  '{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}';
let context: BrowserContext;
let page: Page;
let dir: string;

test.beforeAll(async ({ browser, hub }) => {
  const src = path.resolve(SHARED_MODELS, 'stories260K');
  dir = mkdtempSync(path.join(tmpdir(), 'loupe-chat-e2e-'));
  for (const f of ['config.json', 'tokenizer.json', 'model.safetensors', 'generation_config.json'])
    copyFileSync(path.join(src, f), path.join(dir, f));
  const tc = JSON.parse(readFileSync(path.join(src, 'tokenizer_config.json'), 'utf8'));
  writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify({ ...tc, chat_template: TEMPLATE }));
  hub.addRepo(REPO, dir);
  context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  watchErrors(page);
});
test.afterAll(async () => {
  await context.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test('chat checkbox: logit_lens runs the chat-template rendering and the document records it', async ({
  site,
  hub,
}) => {
  await openReady(page, site.url);
  await waitModelReady(page);
  await loadFromHub(page, hub.url, REPO);
  await expect(page.getByTestId('status-model')).toContainText(REPO, { timeout: 90_000 });
  await waitModelReady(page);
  await page.getByTestId('prompt').fill('Once upon a time');
  await page.getByTestId('tab-logit_lens').click();
  await page.locator('#p-logit_lens-chat').check();
  await runOp(page, 'logit_lens');
  const doc = await pageDoc(page, 'logit_lens');
  const rendered = '<s><|im_start|>user\nOnce upon a time<|im_end|>\n<|im_start|>assistant\n';
  expect(doc.prompt_format).toEqual({ chat: true, user_prompt: 'Once upon a time', rendered });
  expect(doc.prompt).toBe(rendered);
  expect(doc.tokens[0].id).toBe(1);
  expect(doc.tokens.filter((t: any) => t.id === 1)).toHaveLength(1);
  await shotWidthsThemes(page, 'chat-format');
});
