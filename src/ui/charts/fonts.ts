/**
 * The first layout of text in a font face, size and weight the page has not used yet is slow in
 * Chromium on Linux (a font match per combination), a long task in the first chart's frame
 * (bench/page-frames.ts --profile shows it). The charts draw SVG text in the monospace stack at a few sizes, regular and bold,
 * which the page before a result barely uses. So once the page is idle after start-up, this lays
 * out a hidden sample of each, and the cost is paid while nothing is drawn rather than in the
 * frame that shows the first result.
 */
// not palette(): that module brings d3, which the page's first JavaScript does not carry
const monoStack = () =>
  getComputedStyle(document.documentElement).getPropertyValue('--font-mono').trim() || 'monospace';

/** marks the views draw beyond ASCII (a glyph outside a face's set would need a fallback face) */
const SAMPLE = 'Aa0 ·⊙−Σ␣×Δ→←↓↑‖…≈≠≥≤±√∞²αρσ∂∑★✓✗—–‘’“”';
/** the sizes (px) chart text is drawn at, and the page's own */
const SIZES = [9, 10, 11, 12, 12.5, 13, 14, 15, 17, 18, 22];
const WEIGHTS = ['400', '600', '700'];

export function warmFonts(): void {
  const mono = monoStack();
  const NS = 'http://www.w3.org/2000/svg';
  const box = document.createElement('div');
  box.setAttribute('aria-hidden', 'true');
  box.setAttribute('data-testid', 'font-warmup');
  box.style.cssText = 'position:absolute;left:-9999px;top:0;width:400px;visibility:hidden;pointer-events:none';
  const svg = document.createElementNS(NS, 'svg');
  svg.setAttribute('font-family', mono);
  let y = 0;
  for (const size of SIZES) {
    for (const weight of WEIGHTS) {
      const t = document.createElementNS(NS, 'text');
      t.setAttribute('y', String((y += 20)));
      t.setAttribute('font-size', String(size));
      t.setAttribute('font-weight', weight);
      t.textContent = SAMPLE;
      svg.appendChild(t);
      for (const family of [mono, '']) {
        const s = document.createElement('div');
        if (family) s.style.fontFamily = family;
        s.style.fontSize = `${size}px`;
        s.style.fontWeight = weight;
        s.textContent = SAMPLE;
        box.appendChild(s);
      }
    }
  }
  box.appendChild(svg);
  document.body.appendChild(box);
  void box.offsetHeight;
  box.remove();
}
