/**
 * Issue 42, the page in a researcher's hands (round 2): a result card's share link is that
 * result's, never an older one's.
 */
import { test, expect, openReady, runOp, watchErrors, PROMPT } from './fixtures';
import { decodeShare, parseFragment } from '../src/share/codec';

const linkState = (url: string) => decodeShare(parseFragment(new URL(url).hash).get('s')!);

test("a result card's link is its own result's: a new run hides the older link", async ({ page, site }) => {
  const errors = watchErrors(page);
  await openReady(page, site.url);
  await page.getByTestId('prompt').fill(PROMPT);
  await runOp(page, 'trace');
  await page.getByTestId('copy-link').click();
  const first = await page.getByTestId('share-url').inputValue();
  expect(linkState(first).input.prompt).toBe(PROMPT);

  await page.getByTestId('prompt').fill('Lily went to the park');
  await runOp(page, 'trace');
  // the card shows no link until this result's own is made, and that one carries the new prompt
  await expect(page.getByTestId('share-url')).toHaveCount(0);
  await page.getByTestId('copy-link').click();
  expect(linkState(await page.getByTestId('share-url').inputValue()).input.prompt).toBe('Lily went to the park');
  expect(errors).toEqual([]);
});
