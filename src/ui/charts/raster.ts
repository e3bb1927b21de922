/**
 * Large grids drawn as pixels instead of one SVG element per cell. An attention pattern over 120
 * tokens is 14,400 cells, a layer's small multiples eight times that: as <rect>s their creation,
 * attributes, style and layout hold the main thread long after each result (bench/page-frames.ts
 * measures the frames). Here a grid becomes one bitmap (a pixel per cell,
 * coloured through a lookup table), placed in the chart's SVG as an <image> with a data URL, so
 * an exported SVG or PNG still carries it.
 */

/** grids with more cells than this are drawn as a bitmap (smaller ones keep a <rect> per cell) */
export const RASTER_CELLS = 2048;

const LUT_SIZE = 256;

/** RGB of a colour scale at LUT_SIZE evenly spaced points of [0, 1] */
export function colorLut(scale: (t: number) => string): Uint8ClampedArray {
  const lut = new Uint8ClampedArray(LUT_SIZE * 3);
  const ctx = scratch();
  for (let i = 0; i < LUT_SIZE; i++) {
    const [r, g, b] = rgbOf(ctx, scale(i / (LUT_SIZE - 1)));
    lut[i * 3] = r;
    lut[i * 3 + 1] = g;
    lut[i * 3 + 2] = b;
  }
  return lut;
}

let scratchCtx: CanvasRenderingContext2D | null = null;
function scratch(): CanvasRenderingContext2D {
  scratchCtx ??= document.createElement('canvas').getContext('2d', { willReadFrequently: true })!;
  return scratchCtx;
}

/** any CSS colour → RGB, as the browser parses it */
function rgbOf(ctx: CanvasRenderingContext2D, css: string): [number, number, number] {
  ctx.clearRect(0, 0, 1, 1);
  ctx.fillStyle = '#000';
  ctx.fillStyle = css;
  ctx.fillRect(0, 0, 1, 1);
  const d = ctx.getImageData(0, 0, 1, 1).data;
  return [d[0], d[1], d[2]];
}

export interface RasterOptions {
  /** a cell's value → its place on the colour scale in [0, 1], or NaN for "no value" */
  toT: (v: number) => number;
  lut: Uint8ClampedArray;
  /** the colour of cells without a value (CSS colour); omitted: transparent */
  missing?: string;
  /** draw only cells with col <= row (a causal attention pattern's lower triangle) */
  lowerTriangle?: boolean;
}

/** a grid as a canvas of cols × rows pixels */
export function rasterCanvas(values: ArrayLike<ArrayLike<number | null>>, o: RasterOptions): HTMLCanvasElement {
  const rows = values.length;
  const cols = rows ? values[0].length : 0;
  const canvas = document.createElement('canvas');
  canvas.width = Math.max(1, cols);
  canvas.height = Math.max(1, rows);
  const ctx = canvas.getContext('2d')!;
  const img = ctx.createImageData(canvas.width, canvas.height);
  const px = img.data;
  const miss = o.missing ? rgbOf(scratch(), o.missing) : null;
  for (let r = 0; r < rows; r++) {
    const row = values[r];
    const last = o.lowerTriangle ? Math.min(cols - 1, r) : cols - 1;
    for (let c = 0; c <= last; c++) {
      const v = row[c];
      const t = v === null ? NaN : o.toT(v);
      const j = (r * canvas.width + c) * 4;
      if (Number.isFinite(t)) {
        const i = Math.round(Math.max(0, Math.min(1, t)) * (LUT_SIZE - 1)) * 3;
        px[j] = o.lut[i];
        px[j + 1] = o.lut[i + 1];
        px[j + 2] = o.lut[i + 2];
        px[j + 3] = 255;
      } else if (miss) {
        px[j] = miss[0];
        px[j + 1] = miss[1];
        px[j + 2] = miss[2];
        px[j + 3] = 255;
      }
    }
  }
  ctx.putImageData(img, 0, 0);
  return canvas;
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/** an SVG <image> of the grid, scaled to width × height with square (unsmoothed) pixels */
export function rasterImage(
  values: ArrayLike<ArrayLike<number | null>>,
  o: RasterOptions,
  box: { x: number; y: number; width: number; height: number },
): SVGImageElement {
  const im = document.createElementNS(SVG_NS, 'image');
  im.setAttribute('href', rasterCanvas(values, o).toDataURL('image/png'));
  im.setAttribute('x', String(box.x));
  im.setAttribute('y', String(box.y));
  im.setAttribute('width', String(box.width));
  im.setAttribute('height', String(box.height));
  im.setAttribute('preserveAspectRatio', 'none');
  im.setAttribute('image-rendering', 'pixelated');
  im.style.imageRendering = 'pixelated';
  return im;
}

// ---- the token position under the pointer, for charts drawn as bitmaps ----
// A bitmap has no element per cell to carry data-pos (what App.svelte's highlight reads), so a
// raster chart sets data-pos on its image as the pointer moves, and draws the highlight of a
// position hovered elsewhere itself: App.svelte calls highlightPosition().

const highlighters = new Set<(pos: number | null) => void>();
let current: number | null = null;

/** a raster chart's way to draw the hovered position; returns the unregister function */
export function onHighlight(fn: (pos: number | null) => void): () => void {
  highlighters.add(fn);
  if (current !== null) fn(current);
  return () => highlighters.delete(fn);
}

export function highlightPosition(pos: number | null): void {
  current = pos;
  for (const fn of highlighters) fn(pos);
}
