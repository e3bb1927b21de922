/** Show a token's text so whitespace and control characters are visible (views, compare labels). */
export function showToken(t: string): string {
  return t.replace(/ /g, '␣').replace(/\n/g, '↵').replace(/\t/g, '⇥') || '∅';
}
