/**
 * Issue 39, F5–F8: work a model repository, a cache or a compressed file can make the engine do,
 * bounded at its cause. Each case failed before its fix (a hang, silently different numbers, or
 * memory far past a cap) and is refused fast with a structured error on the fixed code.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { renderChat } from '../src/engine/chat';
import { LoupeError } from '../src/engine/errors';

/** the LoupeError a function throws (fails the test when it returns) */
function errorOf(f: () => unknown): LoupeError {
  try {
    f();
  } catch (e) {
    if (e instanceof LoupeError) return e;
    throw e;
  }
  throw new Error('expected a LoupeError');
}

describe('F5: a chat template is charged for its work, not its evaluations', () => {
  const render = (chat_template: string) => renderChat({ chat_template, bos_token: '<s>' }, 'hi');
  const stopped = (tpl: string, why: RegExp = /more steps/) => {
    const t0 = performance.now();
    const e = errorOf(() => render(tpl));
    expect([e.code, why.test(e.message)]).toEqual(['BAD_CHAT_TEMPLATE', true]);
    expect(performance.now() - t0).toBeLessThan(4000);
  };
  afterEach(() => vi.restoreAllMocks());

  it('nested empty loops (1e9 iterations ran with no step counted; 8 M took 32 s)', () => {
    stopped(
      '{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}' +
        '{% endfor %}{% endfor %}{% endfor %}x',
    );
    stopped('{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}');
  });
  it('a loop that breaks at once, over a long list, in a loop; a filtered loop that keeps nothing', () => {
    stopped('{% set l = range(150000) %}{% for a in l %}{% for b in l %}{% break %}{% endfor %}{% endfor %}');
    stopped('{% for a in range(1000) %}{% for b in range(1000) if false %}{% endfor %}{% endfor %}');
  });
  it('a macro that calls itself twice, 40 deep; a big list sorted in a loop', () => {
    stopped('{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(40) }}');
    stopped('{% set l = range(150000) %}{% for a in range(100000) %}{% set x = l|sort %}{% endfor %}');
  });
  it('the deadline stops a rendering whatever its steps', () => {
    let t = Date.now();
    vi.spyOn(Date, 'now').mockImplementation(() => (t += 1000));
    stopped('{% for a in range(10) %}{{ a }}{% endfor %}', /deadline of \d+ s/);
  });
  it('a real template still renders', () => {
    const tpl =
      "{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + " +
      "message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}" +
      "{{ '<|im_start|>assistant\\n' }}{% endif %}";
    expect(render(tpl)).toBe('<s><|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n');
  });
});
