/**
 * The UVM Lab sidebar panel: the view of a `UvmLabModel`.
 *
 * It lists the kernel's live allocations, draws each one's residency map on a canvas (one pixel
 * per page or per cell of pages, scaled up crisp), and offers the controls for the selected
 * allocation. It only renders and sends commands; the kernel's answer is what it shows.
 * A residency byte is a category code (`CATEGORY_NAMES`), coloured from `PALETTE`, the
 * dashboard's colours. Each map carries the pages it drew per category in data attributes
 * (`data-gpu0-pages`, `data-host-pages`, `data-unknown-pages` …), so a test can compare the
 * picture with the kernel's own residency.
 */

import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import {
  COLOURS,
  GPU_CATEGORIES,
  LABELS,
  button,
  div,
  drawnCode,
  eachGpuMemory,
  formatBytes,
  legendItems,
  markPagesDrawn,
  nonZero,
  pagesDrawn,
  resultText,
  shownCategories
} from './categories';
import { ConnectionState, IAllocation, UvmLabModel } from './model';
import { CATEGORY_NAMES, CategoryName, Location, Result } from './protocol';

export class UvmLabPanel extends Widget {
  constructor(model: UvmLabModel, openView?: () => void) {
    super();
    this.model = model;
    this._openView = openView;
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
    if (this._openView) {
      const open = button('Open the full view', 'jp-UvmLab-openViewButton');
      open.title = 'Device lanes, timeline, page maps and every control, in the main area';
      open.addEventListener('click', () => this._openView?.());
      header.append(open);
    }

    this._notice = div('jp-UvmLab-notice');
    this._noticeText = document.createElement('p');
    const retry = button('Retry', 'jp-UvmLab-retry');
    retry.addEventListener('click', () => void this.model.attach());
    this._notice.append(this._noticeText, retry);

    this._legend = div('jp-UvmLab-legend');

    this._controls = div('jp-UvmLab-controls');
    this._selectedLine = div('jp-UvmLab-selected');
    const row = div('jp-UvmLab-buttons');
    // Where to prefetch: the host and each GPU of the device (filled in once the kernel says how many).
    this._destination = document.createElement('select');
    this._destination.className = 'jp-UvmLab-destination';
    this._destination.setAttribute('aria-label', 'Prefetch destination');
    this._destination.title = 'Where a prefetch sends the selected allocation';
    this._prefetchButton = button('Prefetch', 'jp-mod-accept');
    this._prefetchButton.title = 'cudaMemPrefetchAsync: move the pages to the chosen place';
    this._readMostly = button('ReadMostly', 'jp-UvmLab-toggle');
    this._readMostly.setAttribute('role', 'switch');
    this._readMostly.setAttribute('aria-checked', 'false');
    this._readMostly.title = 'cudaMemAdviseSetReadMostly: reads duplicate pages instead of moving them';
    this._prefetchButton.addEventListener('click', () => this._prefetch(this._destination.value as Location));
    this._readMostly.addEventListener('click', () => this._toggleReadMostly());
    row.append(this._destination, this._prefetchButton, this._readMostly);
    this._controls.append(this._selectedLine, row);

    this._list = document.createElement('ul');
    this._list.className = 'jp-UvmLab-list';
    this._list.setAttribute('aria-label', 'Live allocations');
    this._empty = div('jp-UvmLab-empty');

    this._status = div('jp-UvmLab-status');
    this._status.setAttribute('role', 'status');

    this.node.append(header, this._notice, this._legend, this._controls, this._list, this._empty, this._status);
  }

  // --- rendering --------------------------------------------------------------------------------

  private _renderHeader(): void {
    const model = this.model;
    const device = model.device;
    const parts = [model.kernelName || 'no kernel'];
    if (device) {
      parts.push(`${device.backend} backend`, eachGpuMemory(device, m => `${formatBytes(m.free)} free of ${formatBytes(m.total)}`));
    }
    this._kernelLine.textContent = parts.join(' · ');
    this.node.dataset.state = model.state;
    this._renderLegend();

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
      if (fresh || this._dirtyAll || this._dirty.has(id)) {
        renderItem(item, allocation);
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
    this._renderDestinations();
    this._destination.disabled = !usable || !managed;
    this._prefetchButton.disabled = !usable || !managed;
    this._readMostly.disabled = !usable || !managed;
    const on = !!selected && selected.info.advice.read_mostly;
    this._readMostly.setAttribute('aria-checked', String(on));
    this._readMostly.classList.toggle('jp-mod-active', on);
  }

  /** The legend: each GPU of the device, the other categories, and any category that holds pages. */
  private _renderLegend(): void {
    const present = new Set<CategoryName>();
    for (const { info } of this.model.allocations.values()) {
      nonZero(info.counts).forEach(name => present.add(name));
    }
    const shown = shownCategories(this._deviceCount(), present);
    const spec = shown.join('|');
    if (spec === this._legendSpec) {
      return;
    }
    this._legendSpec = spec;
    this._legend.replaceChildren(...legendItems(shown));
  }

  /** The prefetch destinations: one per GPU of the device, then the host; the choice is kept. */
  private _renderDestinations(): void {
    const gpus = GPU_CATEGORIES.slice(0, Math.min(this._deviceCount(), GPU_CATEGORIES.length));
    const locations = [...gpus, 'host'];
    if (locations.join('|') === [...this._destination.options].map(o => o.value).join('|')) {
      return;
    }
    const chosen = this._destination.value;
    this._destination.replaceChildren(
      ...locations.map(location => {
        const option = document.createElement('option');
        option.value = location;
        option.textContent = LABELS[location as CategoryName];
        return option;
      })
    );
    this._destination.value = locations.includes(chosen) ? chosen : locations[0];
  }

  private _deviceCount(): number {
    // Until the kernel says, assume the usual one GPU.
    return this.model.device?.device_count ?? 1;
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
      const where = location === 'host' ? 'the host' : LABELS[location as CategoryName] ?? location;
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
      this._lastAction = resultText(result, done);
    } finally {
      this._busy = false;
      this.update();
    }
  }

  private _selectedAllocation(): IAllocation | undefined {
    return this._selected === null ? undefined : this.model.allocations.get(this._selected);
  }

  private _openView: (() => void) | undefined;
  private _kernelLine!: HTMLElement;
  private _notice!: HTMLElement;
  private _noticeText!: HTMLElement;
  private _legend!: HTMLElement;
  private _controls!: HTMLElement;
  private _selectedLine!: HTMLElement;
  private _destination!: HTMLSelectElement;
  private _prefetchButton!: HTMLButtonElement;
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
  private _legendSpec = '';
}

/** Draw one allocation's entry: its title line, its map, its counts and data attributes. */
function renderItem(item: HTMLElement, allocation: IAllocation): void {
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
  const drawn = drawMap(map, cells, info.pages, info.cell_pages);
  const data = map.dataset;
  data.allocId = String(info.id);
  data.label = info.label;
  data.pages = String(info.pages);
  data.cells = String(cells.length);
  data.cellPages = String(info.cell_pages);
  markPagesDrawn(map, drawn);
  data.readMostly = String(info.advice.read_mostly);
  data.revision = String(allocation.revision);
  map.setAttribute('role', 'img');
  const present = nonZero(info.counts);
  map.setAttribute(
    'aria-label',
    `Residency of ${info.label}: ` +
      (present.map(name => `${drawn[CATEGORY_NAMES.indexOf(name)]} pages ${LABELS[name]}`).join(', ') || 'no pages')
  );

  // The exact share of each category that holds pages (the cells may be coarser than pages).
  const counts = item.querySelector('.jp-UvmLab-counts') as HTMLElement;
  const total = Math.max(info.pages, 1);
  counts.textContent = present
    .map(name => `${LABELS[name].split(' (')[0]} ${((100 * info.counts[name]) / total).toFixed(1)}%`)
    .join(' · ');
  if (info.cell_pages > 1) {
    counts.textContent += ` · 1 pixel = ${info.cell_pages} pages`;
  }
}

/**
 * Paint `cells` (category codes) into `canvas`, one pixel each, row by row, and return how many
 * pages it drew in each category, by code.
 */
function drawMap(canvas: HTMLCanvasElement, cells: Uint8Array, pages: number, cellPages: number): number[] {
  const n = cells.length;
  // Wide rather than tall: about 8 columns per row, at most 256 pixels across.
  const cols = Math.min(256, Math.max(8, Math.ceil(Math.sqrt(n * 8))));
  const rows = Math.max(1, Math.ceil(n / cols));
  if (canvas.width !== cols || canvas.height !== rows) {
    canvas.width = cols;
    canvas.height = rows;
  }
  const ctx = canvas.getContext('2d');
  if (ctx) {
    const image = ctx.createImageData(cols, rows);
    for (let i = 0; i < n; i++) {
      const code = drawnCode(cells[i]);
      image.data.set(COLOURS.subarray(4 * code, 4 * code + 4), 4 * i);
    }
    ctx.putImageData(image, 0, 0);
  }
  return pagesDrawn(cells, pages, cellPages);
}
