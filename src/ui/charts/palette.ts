/**
 * Colours for charts, read from the theme's CSS variables at draw time, written into the SVG as
 * attributes so an exported SVG/PNG looks like the screen without the page's stylesheet.
 */
import { color as d3color, interpolateRdBu, interpolateViridis, schemeTableau10 } from 'd3';

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

/** Black or white text, whichever reads on a cell of colour c (any CSS colour: hex, rgb(), named). */
export function textOn(c: string): string {
  const rgb = d3color(c)?.rgb();
  if (!rgb) return '#111';
  const lin = (v: number) => {
    const x = v / 255;
    return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4;
  };
  const L = 0.2126 * lin(rgb.r) + 0.7152 * lin(rgb.g) + 0.0722 * lin(rgb.b);
  // WCAG contrast against black (L + .05)/.05 vs white 1.05/(L + .05): pick the larger
  return (L + 0.05) / 0.05 >= 1.05 / (L + 0.05) ? '#111' : '#fff';
}

/**
 * The colour of a named quantity, the same in every chart that draws it (the sweep, the SAE
 * sweep and causality all plot these): one definition so a legend means the same everywhere.
 */
export const METRIC_COLORS: Record<string, string> = {
  'target Δ log-prob': '#c0392b',
  'control Δ log-prob': '#2166ac',
  'normalised effect': '#2e8b57',
  'KL from base': '#8e44ad',
};

/**
 * The i-th colour of a set of series: Tableau 10, then further hues by the golden angle, so no
 * two series of one chart share a colour however many there are.
 */
export function seriesColor(i: number): string {
  if (i < schemeTableau10.length) return schemeTableau10[i];
  return `hsl(${Math.round((i * 137.508) % 360)}, 62%, 46%)`;
}
