/**
 * The selected allocation's page map in the main-area view: one square per cell (a page, or a
 * cell of `cell_pages` pages for a large allocation), row by row; the wheel zooms from the whole
 * allocation in view to cells 16 pixels wide (the box scrolls); hovering a cell says its page
 * range, address, category and the last event the timeline holds there.
 */

import { ISignal, Signal } from '@lumino/signaling';

import { LABELS, COLOURS, cellPageRange, div, drawnCode, formatBytes, markPagesDrawn, pagesDrawn, placeHover } from './categories';
import { IAllocation } from './model';
import { CATEGORY_NAMES } from './protocol';

/** The last event at an address, for the hover (looked up in the timeline rows the view holds). */
export type LastEventAt = (lane: number, first: number, end: number) => string | null;

const MAX_CELL_PX = 16;

export class PageMap {
  /** `canvasClass` names the drawing (a detail map is told apart from the whole allocation's). */
  constructor(
    readonly node: HTMLElement,
    private readonly _lastEvent: LastEventAt,
    canvasClass = 'jp-UvmLab-bigMap'
  ) {
    node.classList.add('jp-UvmLab-pageMap');
    this._box = div('jp-UvmLab-pageMapBox');
    this._canvas = document.createElement('canvas');
    this._canvas.className = canvasClass;
    this._canvas.setAttribute('role', 'img');
    this._box.appendChild(this._canvas);
    this._hover = div('jp-UvmLab-hover');
    this._hover.hidden = true;
    this._hover.setAttribute('role', 'tooltip');
    node.append(this._box, this._hover);
    this._canvas.addEventListener('mousemove', event => this._onHover(event));
    this._canvas.addEventListener('mouseleave', () => (this._hover.hidden = true));
    this._canvas.addEventListener('click', event => {
      const cell = this._cellAt(event);
      if (cell !== null) {
        this._cellClicked.emit(cell);
      }
    });
    this._box.addEventListener(
      'wheel',
      event => {
        if (!event.ctrlKey && !event.metaKey && !event.altKey) {
          return; // a plain wheel scrolls the box
        }
        event.preventDefault();
        this.zoom(event.deltaY < 0 ? 1 : -1);
      },
      { passive: false }
    );
  }

  /** A cell was clicked: its index. */
  get cellClicked(): ISignal<this, number> {
    return this._cellClicked;
  }

  /** The cell size in CSS pixels now (0 until drawn). */
  get cellPx(): number {
    return this._cellPx;
  }

  /** Zoom one step in (1) or out (-1): the cell size doubles or halves, within [fit, 16 px]. */
  zoom(step: 1 | -1): void {
    this._zoom = Math.max(0, Math.min(this._zoom + step, 8));
    this.render(this._allocation, this._width, this._firstPage);
  }

  /** Draw `allocation`'s cells in `width` pixels; `firstPage`: the allocation's page its first cell starts at
   * (a detail map of some of its pages). */
  render(allocation: IAllocation | undefined, width: number, firstPage = 0): void {
    this._allocation = allocation;
    this._width = width;
    this._firstPage = firstPage;
    const canvas = this._canvas;
    if (!allocation || width < 20) {
      canvas.width = canvas.height = 0;
      delete canvas.dataset.label;
      return;
    }
    const { info, cells } = allocation;
    const n = Math.max(cells.length, 1);
    // Fit: the largest whole cell size that shows every cell in a box about a third as tall as wide.
    const fit = Math.max(1, Math.floor(Math.sqrt((width * width) / 3 / n)));
    const px = Math.min(MAX_CELL_PX, Math.max(fit, fit * 2 ** this._zoom));
    const cols = Math.max(1, Math.floor(width / px));
    const rows = Math.ceil(n / cols);
    this._cellPx = px;
    this._cols = cols;
    const ratio = window.devicePixelRatio || 1;
    canvas.width = cols * px * ratio;
    canvas.height = rows * px * ratio;
    canvas.style.width = `${cols * px}px`;
    canvas.style.height = `${rows * px}px`;
    const ctx = canvas.getContext('2d');
    if (ctx) {
      // One pixel per cell, scaled up crisp: cheap for 16 384 cells at any zoom.
      const image = new ImageData(cols, rows);
      for (let i = 0; i < cells.length; i++) {
        const code = drawnCode(cells[i]);
        image.data.set(COLOURS.subarray(4 * code, 4 * code + 4), 4 * i);
      }
      const small = document.createElement('canvas');
      small.width = cols;
      small.height = rows;
      small.getContext('2d')?.putImageData(image, 0, 0);
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(small, 0, 0, canvas.width, canvas.height);
      if (px >= 6) {
        // Gaps between cells once they are big enough to tell apart.
        ctx.strokeStyle = 'rgba(255,255,255,0.6)';
        ctx.lineWidth = ratio;
        ctx.beginPath();
        for (let c = 1; c < cols; c++) {
          ctx.moveTo(c * px * ratio, 0);
          ctx.lineTo(c * px * ratio, canvas.height);
        }
        for (let r = 1; r < rows; r++) {
          ctx.moveTo(0, r * px * ratio);
          ctx.lineTo(canvas.width, r * px * ratio);
        }
        ctx.stroke();
      }
    }
    const data = canvas.dataset;
    data.allocId = String(info.id);
    data.label = info.label;
    data.cells = String(cells.length);
    data.cellPages = String(info.cell_pages);
    data.cellPx = String(px);
    data.revision = String(allocation.revision);
    data.firstPage = String(firstPage);
    markPagesDrawn(canvas, pagesDrawn(cells, info.pages, info.cell_pages));
    canvas.setAttribute('aria-label', `Page map of ${info.label}, ${info.pages} pages`);
  }

  /** The cell under the pointer, or null. */
  private _cellAt(event: MouseEvent): number | null {
    const allocation = this._allocation;
    if (!allocation || !this._cellPx) {
      return null;
    }
    const rect = this._canvas.getBoundingClientRect();
    const col = Math.floor((event.clientX - rect.left) / this._cellPx);
    const row = Math.floor((event.clientY - rect.top) / this._cellPx);
    const cell = row * this._cols + col;
    return col < 0 || col >= this._cols || cell < 0 || cell >= allocation.cells.length ? null : cell;
  }

  private _onHover(event: MouseEvent): void {
    const allocation = this._allocation;
    const cell = this._cellAt(event);
    if (!allocation || cell === null) {
      this._hover.hidden = true;
      return;
    }
    const { info } = allocation;
    const [first, last] = cellPageRange(cell, info.pages, info.cell_pages);
    const pageSize = info.pages ? Math.ceil(info.size / info.pages) : 4096;
    const start = info.address + first * pageSize;
    const end = info.address + (last + 1) * pageSize;
    const category = CATEGORY_NAMES[drawnCode(allocation.cells[cell])];
    const at = this._firstPage;
    const pages = first === last ? `page ${first + at}` : `pages ${first + at}–${last + at}`;
    const state = info.cell_pages > 1 ? `mostly ${LABELS[category]}` : LABELS[category];
    const lines = [
      `${info.label}: ${pages}`,
      `0x${start.toString(16)} (${formatBytes(end - start)})`,
      state,
      `last event: ${this._lastEvent(info.id, start, end) ?? 'none in the timeline'}`
    ];
    this._hover.textContent = lines.join('\n');
    this._hover.dataset.cell = String(cell);
    this._hover.hidden = false;
    placeHover(this._hover, event);
  }

  private _box: HTMLElement;
  private _canvas: HTMLCanvasElement;
  private _hover: HTMLElement;
  private _allocation: IAllocation | undefined;
  private _width = 0;
  private _firstPage = 0;
  private _cellClicked = new Signal<this, number>(this);
  private _zoom = 0;
  private _cellPx = 0;
  private _cols = 1;
}
