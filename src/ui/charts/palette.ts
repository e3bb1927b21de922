/**
 * Colours for charts, read from the theme's CSS variables at draw time, written into the SVG as
 * attributes so an exported SVG/PNG looks like the screen without the page's stylesheet.
 */
import { interpolateRdBu, interpolateViridis } from 'd3';

export interface Palette {
  fg: string;
  muted: string;
  grid: string;
  bg: string;
  accent: string;
  pos: string;
  neg: string;
  highlight: string;
  font: string;
}

export function palette(): Palette {
  const s = getComputedStyle(document.documentElement);
  const v = (name: string, dflt: string) => s.getPropertyValue(name).trim() || dflt;
  return {
    fg: v('--fg', '#1b1f24'),
    muted: v('--muted', '#5b636e'),
    grid: v('--grid', '#d8dde3'),
    bg: v('--bg', '#ffffff'),
    accent: v('--accent', '#2f6fdf'),
    pos: v('--pos', '#c0392b'),
    neg: v('--neg', '#2166ac'),
    highlight: v('--highlight', '#f5b700'),
    font: v('--font-mono', 'ui-monospace, monospace'),
  };
}

/** Diverging, zero-centred: negative blue, zero white, positive red (RdBu reversed). */
export function divergingColor(t: number): string {
  return interpolateRdBu(0.5 - t / 2);
}

/** Sequential for non-negative quantities (probabilities, attention weights). */
export function sequentialColor(t: number): string {
  return interpolateViridis(t);
}

/** Black or white text, whichever reads on a cell of colour c. */
export function textOn(c: string): string {
  const m = c.match(/\d+(\.\d+)?/g);
  if (!m || m.length < 3) return '#000';
  const [r, g, b] = m.slice(0, 3).map(Number);
  return 0.299 * r + 0.587 * g + 0.114 * b > 150 ? '#111' : '#fff';
}
