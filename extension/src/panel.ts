/**
 * The UVM Lab sidebar panel: the view of a `UvmLabModel`.
 *
 * It lists the kernel's live allocations, draws each one's residency map on a canvas (one pixel
 * per page or per cell of pages, scaled up crisp), and offers the controls for the selected
 * allocation. It only renders and sends commands; the kernel's answer is what it shows.
 * Each map carries the page counts it drew in data attributes (`data-gpu-pages` …), so a test
 * can compare the picture with the kernel's own residency.
 */

import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { ConnectionState, IAllocation, UvmLabModel } from './model';
import { BOTH, GPU, HOST, Location, NOWHERE, Result } from './protocol';

/** State number -> the name used in CSS variables, data attributes and the legend. */
const STATES: ReadonlyArray<{ state: number; key: 'gpu' | 'host' | 'both' | 'nowhere'; label: string }> = [
  { state: GPU, key: 'gpu', label: 'GPU' },
  { state: HOST, key: 'host', label: 'Host' },
  { state: BOTH, key: 'both', label: 'Both (read-duplicated)' },
  { state: NOWHERE, key: 'nowhere', label: 'Nowhere (not populated)' }
];

export class UvmLabPanel extends Widget {
  constructor(model: UvmLabModel) {
    super();
    this.model = model;
    this.addClass('jp-UvmLab');
    this._build();
    model.stateChanged.connect(this._onStateChanged, this);
    model.allocationsChanged.connect(this._onAllocationsChanged, this);
    // The panel starts in a collapsed sidebar: nothing to draw until it is shown.
    model.setPaused(true);
  }

  readonly model: UvmLabModel;

  /** The id of the allocation the controls act on, if any. */
  get selectedId(): number | null {
    return this._selected;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.model.stateChanged.disconnect(this._onStateChanged, this);
    this.model.allocationsChanged.disconnect(this._onAllocationsChanged, this);
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    // Updates were paused while hidden; the kernel answers the resume with a full snapshot.
    this.model.setPaused(false);
    this._dirtyAll = true;
    this.update();
  }

  protected onAfterHide(msg: Message): void {
    this.model.setPaused(true);
  }

  protected onUpdateRequest(msg: Message): void {
    if (!this.isVisible) {
      return;
    }
    this._renderHeader();
    this._renderList();
    this._renderControls();
  }

  private _onStateChanged(): void {
    // A new connection state outdates the last command's message in the status line.
    if (this.model.state !== this._shownState) {
      this._shownState = this.model.state;
      this._lastAction = null;
    }
    this.update();
  }

  private _onAllocationsChanged(_: UvmLabModel, ids: number[]): void {
    ids.forEach(id => this._dirty.add(id));
    this.update();
  }

  // --- building ---------------------------------------------------------------------------------

  private _build(): void {
    const header = div('jp-UvmLab-header');
    const title = div('jp-UvmLab-title');
    title.textContent = 'UVM Lab';
    this._kernelLine = div('jp-UvmLab-kernel');
    header.append(title, this._kernelLine);

    this._notice = div('jp-UvmLab-notice');
    this._noticeText = document.createElement('p');
    const retry = button('Retry', 'jp-UvmLab-retry');
    retry.addEventListener('click', () => void this.model.attach());
    this._notice.append(this._noticeText, retry);

    const legend = div('jp-UvmLab-legend');
    for (const { key, label } of STATES) {
      const item = document.createElement('span');
      item.className = 'jp-UvmLab-legendItem';
      const swatch = document.createElement('span');
      swatch.className = `jp-UvmLab-swatch jp-UvmLab-swatch-${key}`;
      item.append(swatch, document.createTextNode(label));
      legend.append(item);
    }

    this._controls = div('jp-UvmLab-controls');
    this._selectedLine = div('jp-UvmLab-selected');
    const row = div('jp-UvmLab-buttons');
    this._toGpu = button('Prefetch to GPU', 'jp-mod-accept');
    this._toHost = button('Prefetch to host', 'jp-mod-accept');
    this._readMostly = button('ReadMostly', 'jp-UvmLab-toggle');
    this._readMostly.setAttribute('role', 'switch');
    this._readMostly.setAttribute('aria-checked', 'false');
    this._readMostly.title = 'cudaMemAdviseSetReadMostly: reads duplicate pages instead of moving them';
    this._toGpu.addEventListener('click', () => this._prefetch('gpu'));
    this._toHost.addEventListener('click', () => this._prefetch('host'));
    this._readMostly.addEventListener('click', () => this._toggleReadMostly());
    row.append(this._toGpu, this._toHost, this._readMostly);
    this._controls.append(this._selectedLine, row);

    this._list = document.createElement('ul');
    this._list.className = 'jp-UvmLab-list';
    this._list.setAttribute('aria-label', 'Live allocations');
    this._empty = div('jp-UvmLab-empty');

    this._status = div('jp-UvmLab-status');
    this._status.setAttribute('role', 'status');

    this.node.append(header, this._notice, legend, this._controls, this._list, this._empty, this._status);
  }

  // --- rendering --------------------------------------------------------------------------------

  private _renderHeader(): void {
    const model = this.model;
    const device = model.device;
    const parts = [model.kernelName || 'no kernel'];
    if (device) {
      parts.push(`${device.backend} backend`, `${formatBytes(device.free)} free of ${formatBytes(device.total)}`);
    }
    this._kernelLine.textContent = parts.join(' · ');
    this.node.dataset.state = model.state;

    const showNotice = model.state === 'not-loaded' || model.state === 'no-kernel';
    this._notice.hidden = !showNotice;
    this._noticeText.textContent = model.status;
    this._status.textContent = this._lastAction ?? model.status;
  }

  private _renderList(): void {
    const allocations = this.model.allocations;
    for (const [id, item] of this._items) {
      if (!allocations.has(id)) {
        item.remove();
        this._items.delete(id);
      }
    }
    if (this._selected !== null && !allocations.has(this._selected)) {
      this._selected = null;
    }
    if (this._selected === null && allocations.size) {
      this._selected = allocations.keys().next().value ?? null;
    }
    const palette = this._palette();
    let previous: HTMLElement | null = null;
    for (const [id, allocation] of allocations) {
      let item = this._items.get(id);
      const fresh = !item;
      if (!item) {
        item = this._makeItem(id);
        this._items.set(id, item);
      }
      // Keep the list in the kernel's order (oldest first).
      const expected: ChildNode | null = previous ? previous.nextSibling : this._list.firstChild;
      if (expected !== item) {
        this._list.insertBefore(item, expected);
      }
      previous = item;
      if (fresh || this._dirtyAll || this._dirty.has(id) || palette.changed) {
        renderItem(item, allocation, palette.colours);
      }
      item.classList.toggle('jp-mod-selected', id === this._selected);
      item.setAttribute('aria-selected', String(id === this._selected));
    }
    this._dirty.clear();
    this._dirtyAll = false;
    const connected = this.model.state === 'connected';
    this._empty.hidden = !connected || allocations.size > 0;
    this._empty.textContent = 'No live allocations. Create a uvm_lab.DeviceBuffer in the notebook.';
  }

  private _renderControls(): void {
    const selected = this._selected === null ? undefined : this.model.allocations.get(this._selected);
    const usable = !!selected && this.model.state === 'connected' && !this._busy;
    this._controls.hidden = this.model.state !== 'connected';
    this._selectedLine.textContent = selected
      ? `Selected: ${selected.info.label} (#${selected.info.id}, ${formatBytes(selected.info.size)})`
      : 'Select an allocation.';
    const managed = !!selected && selected.info.is_managed;
    this._toGpu.disabled = !usable || !managed;
    this._toHost.disabled = !usable || !managed;
    this._readMostly.disabled = !usable || !managed;
    const on = !!selected && selected.info.advice.read_mostly;
    this._readMostly.setAttribute('aria-checked', String(on));
    this._readMostly.classList.toggle('jp-mod-active', on);
  }

  private _makeItem(id: number): HTMLLIElement {
    const item = document.createElement('li');
    item.className = 'jp-UvmLab-allocation';
    item.dataset.allocId = String(id);
    item.tabIndex = 0;
    const head = div('jp-UvmLab-allocationHead');
    const map = document.createElement('canvas');
    map.className = 'jp-UvmLab-map';
    const counts = div('jp-UvmLab-counts');
    item.append(head, map, counts);
    const select = () => {
      this._selected = id;
      this.update();
    };
    item.addEventListener('click', select);
    item.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        select();
      }
    });
    return item;
  }

  // --- commands ---------------------------------------------------------------------------------

  private _prefetch(location: Location): void {
    const selected = this._selectedAllocation();
    if (selected) {
      const where = location === 'gpu' ? 'the GPU' : 'the host';
      void this._run(`Prefetching ${selected.info.label} to ${where}…`, `Prefetched ${selected.info.label} to ${where}.`, () =>
        this.model.prefetch(selected.info.id, location)
      );
    }
  }

  private _toggleReadMostly(): void {
    const selected = this._selectedAllocation();
    if (selected) {
      const value = !selected.info.advice.read_mostly;
      void this._run(
        `Setting ReadMostly ${value ? 'on' : 'off'} for ${selected.info.label}…`,
        `ReadMostly is ${value ? 'on' : 'off'} for ${selected.info.label}.`,
        () => this.model.setAdvice(selected.info.id, 'read_mostly', value)
      );
    }
  }

  private async _run(doing: string, done: string, command: () => Promise<Result>): Promise<void> {
    this._busy = true;
    this._lastAction = doing;
    this.update();
    try {
      const result = await command();
      this._lastAction = result.ok ? done : `${result.error?.type ?? 'Error'}: ${result.error?.message ?? 'failed'}`;
    } finally {
      this._busy = false;
      this.update();
    }
  }

  private _selectedAllocation(): IAllocation | undefined {
    return this._selected === null ? undefined : this.model.allocations.get(this._selected);
  }

  /** The four state colours from the theme, as RGBA; `changed` when the theme moved them. */
  private _palette(): { colours: Uint8ClampedArray; changed: boolean } {
    const style = getComputedStyle(this.node);
    const spec = STATES.map(s => style.getPropertyValue(`--uvm-lab-${s.key}`).trim()).join('|');
    const changed = spec !== this._paletteSpec;
    if (changed) {
      this._paletteSpec = spec;
      this._colours = new Uint8ClampedArray(4 * 4);
      STATES.forEach((s, i) => this._colours.set(cssToRgba(spec.split('|')[i]), 4 * s.state));
    }
    return { colours: this._colours, changed };
  }

  private _kernelLine!: HTMLElement;
  private _notice!: HTMLElement;
  private _noticeText!: HTMLElement;
  private _controls!: HTMLElement;
  private _selectedLine!: HTMLElement;
  private _toGpu!: HTMLButtonElement;
  private _toHost!: HTMLButtonElement;
  private _readMostly!: HTMLButtonElement;
  private _list!: HTMLUListElement;
  private _empty!: HTMLElement;
  private _status!: HTMLElement;
  private _items = new Map<number, HTMLLIElement>();
  private _dirty = new Set<number>();
  private _dirtyAll = true;
  private _selected: number | null = null;
  private _busy = false;
  private _lastAction: string | null = null;
  private _shownState: ConnectionState | null = null;
  private _paletteSpec = '';
  private _colours = new Uint8ClampedArray(16);
}

/** Draw one allocation's entry: its title line, its map, its counts and data attributes. */
function renderItem(item: HTMLElement, allocation: IAllocation, colours: Uint8ClampedArray): void {
  const { info, cells } = allocation;
  const head = item.querySelector('.jp-UvmLab-allocationHead') as HTMLElement;
  const advice: string[] = [];
  if (!info.is_managed) {
    advice.push('device memory');
  }
  if (info.advice.read_mostly) {
    advice.push('ReadMostly');
  }
  if (info.advice.preferred_location) {
    advice.push(`preferred: ${info.advice.preferred_location}`);
  }
  if (info.advice.accessed_by.length) {
    advice.push(`accessed by: ${info.advice.accessed_by.join(', ')}`);
  }
  head.textContent = '';
  const name = document.createElement('span');
  name.className = 'jp-UvmLab-label';
  name.textContent = info.label;
  const size = document.createElement('span');
  size.className = 'jp-UvmLab-size';
  size.textContent = `#${info.id} · ${formatBytes(info.size)}${advice.length ? ' · ' + advice.join(' · ') : ''}`;
  head.append(name, size);

  const map = item.querySelector('canvas') as HTMLCanvasElement;
  const drawn = drawMap(map, cells, info.pages, info.cell_pages, colours);
  const data = map.dataset;
  data.allocId = String(info.id);
  data.label = info.label;
  data.pages = String(info.pages);
  data.cells = String(cells.length);
  data.cellPages = String(info.cell_pages);
  data.gpuPages = String(drawn[GPU]);
  data.hostPages = String(drawn[HOST]);
  data.bothPages = String(drawn[BOTH]);
  data.nowherePages = String(drawn[NOWHERE]);
  data.readMostly = String(info.advice.read_mostly);
  data.revision = String(allocation.revision);
  map.setAttribute('role', 'img');
  map.setAttribute(
    'aria-label',
    `Residency of ${info.label}: ${STATES.map(s => `${drawn[s.state]} pages ${s.label}`).join(', ')}`
  );

  const counts = item.querySelector('.jp-UvmLab-counts') as HTMLElement;
  const total = Math.max(info.pages, 1);
  counts.textContent = STATES.filter(s => info.counts[s.key] > 0)
    .map(s => `${s.label.split(' ')[0]} ${((100 * info.counts[s.key]) / total).toFixed(1)}%`)
    .join(' · ');
  if (info.cell_pages > 1) {
    counts.textContent += ` · 1 pixel = ${info.cell_pages} pages`;
  }
}

/**
 * Paint `cells` into `canvas`, one pixel each, row by row, and return how many pages it drew
 * in each state (a cell stands for `cellPages` pages; the last one for what is left).
 */
function drawMap(
  canvas: HTMLCanvasElement,
  cells: Uint8Array,
  pages: number,
  cellPages: number,
  colours: Uint8ClampedArray
): number[] {
  const n = cells.length;
  // Wide rather than tall: about 8 columns per row, at most 256 pixels across.
  const cols = Math.min(256, Math.max(8, Math.ceil(Math.sqrt(n * 8))));
  const rows = Math.max(1, Math.ceil(n / cols));
  if (canvas.width !== cols || canvas.height !== rows) {
    canvas.width = cols;
    canvas.height = rows;
  }
  const counts = [0, 0, 0, 0];
  const ctx = canvas.getContext('2d');
  const image = ctx ? ctx.createImageData(cols, rows) : null;
  for (let i = 0; i < n; i++) {
    const state = cells[i] & 3;
    counts[state] += i === n - 1 ? pages - cellPages * (n - 1) : cellPages;
    if (image) {
      image.data.set(colours.subarray(4 * state, 4 * state + 4), 4 * i);
    }
  }
  if (ctx && image) {
    ctx.putImageData(image, 0, 0);
  }
  return counts;
}

/** Any CSS colour as RGBA bytes, by letting a 1x1 canvas parse it. */
function cssToRgba(colour: string): number[] {
  const canvas = document.createElement('canvas');
  canvas.width = canvas.height = 1;
  const ctx = canvas.getContext('2d', { willReadFrequently: true });
  if (!ctx || !colour) {
    return [128, 128, 128, 255];
  }
  ctx.fillStyle = colour;
  ctx.fillRect(0, 0, 1, 1);
  return Array.from(ctx.getImageData(0, 0, 1, 1).data);
}

export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${i === 0 ? v : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)} ${units[i]}`;
}

function div(className: string): HTMLDivElement {
  const node = document.createElement('div');
  node.className = className;
  return node;
}

function button(label: string, className: string): HTMLButtonElement {
  const node = document.createElement('button');
  node.type = 'button';
  node.className = `jp-Button jp-mod-styled ${className}`;
  node.textContent = label;
  return node;
}
