/**
 * The allocation list of the main-area view: search by label or id, sort by size, faults or bytes
 * moved, and only the rows in sight in the DOM (@tanstack/virtual-core), so a thousand allocations
 * cost a screenful of rows. A row shows the label, the size, the traffic and a bar of the exact
 * share of each page category.
 */

import { Virtualizer, elementScroll, observeElementOffset, observeElementRect } from '@tanstack/virtual-core';

import { DISPLAY_ORDER, div, formatBytes } from './categories';
import { IAllocation } from './model';
import { PALETTE } from './palette';

export type SortKey = 'age' | 'size' | 'faults' | 'moved';

const SORTS: Record<SortKey, { label: string; value: (a: IAllocation) => number }> = {
  age: { label: 'Oldest first', value: a => -a.info.id },
  size: { label: 'Size', value: a => a.info.size },
  faults: { label: 'Faults', value: a => a.info.traffic.faults },
  moved: { label: 'Bytes moved', value: a => a.info.traffic.htod_bytes + a.info.traffic.dtoh_bytes + a.info.traffic.dtod_bytes }
};

const ROW_HEIGHT = 40;

export class AllocationList {
  /**
   * `onSelect` is called with a clicked row's id; `onFilter` when the search or the sort change what is
   * shown (the timeline's lanes follow the list).
   */
  constructor(
    readonly node: HTMLElement,
    private readonly _onSelect: (id: number) => void,
    private readonly _onFilter: () => void
  ) {
    node.classList.add('jp-UvmLab-allocList');
    const tools = div('jp-UvmLab-listTools');
    this._search = document.createElement('input');
    this._search.type = 'search';
    this._search.placeholder = 'Search allocations';
    this._search.setAttribute('aria-label', 'Search allocations');
    this._search.className = 'jp-UvmLab-search';
    this._sort = document.createElement('select');
    this._sort.setAttribute('aria-label', 'Sort allocations');
    for (const [key, { label }] of Object.entries(SORTS)) {
      const option = document.createElement('option');
      option.value = key;
      option.textContent = label;
      this._sort.appendChild(option);
    }
    this._count = div('jp-UvmLab-listCount');
    tools.append(this._search, this._sort, this._count);
    this._scroller = div('jp-UvmLab-listScroller');
    this._scroller.setAttribute('role', 'listbox');
    this._scroller.setAttribute('aria-label', 'Live allocations');
    this._sizer = div('jp-UvmLab-listSizer');
    this._scroller.appendChild(this._sizer);
    node.append(tools, this._scroller);
    this._search.addEventListener('input', () => {
      this._refilter();
      this._onFilter();
    });
    this._sort.addEventListener('change', () => {
      this._refilter();
      this._onFilter();
    });

    this._virtualizer = new Virtualizer<HTMLDivElement, HTMLDivElement>({
      count: 0,
      getScrollElement: () => this._scroller,
      estimateSize: () => ROW_HEIGHT,
      overscan: 6,
      observeElementRect,
      observeElementOffset,
      scrollToFn: elementScroll,
      onChange: () => this._paint()
    });
    this._unmount = this._virtualizer._didMount();
  }

  /** The allocations to list, and the selected one. */
  setData(allocations: ReadonlyMap<number, IAllocation>, selected: number | null): void {
    this._all = allocations;
    this._selected = selected;
    this._refilter();
  }

  /** The ids in the list's order (after search and sort). */
  get shownIds(): ReadonlyArray<number> {
    return this._rows.map(a => a.info.id);
  }

  /** The ids of the rows in the page now (the visible ones, and a few either side). */
  get visibleIds(): ReadonlyArray<number> {
    return this._visible;
  }

  dispose(): void {
    this._unmount();
  }

  private _refilter(): void {
    const query = this._search.value.trim().toLowerCase();
    const sort = SORTS[this._sort.value as SortKey] ?? SORTS.age;
    this._rows = [...this._all.values()]
      .filter(a => !query || a.info.label.toLowerCase().includes(query) || `#${a.info.id}` === query)
      .sort((a, b) => sort.value(b) - sort.value(a) || a.info.id - b.info.id);
    this._count.textContent = `${this._rows.length} of ${this._all.size}`;
    this.node.dataset.shown = String(this._rows.length);
    this._virtualizer.setOptions({ ...this._virtualizer.options, count: this._rows.length });
    this._virtualizer._willUpdate();
    this._paint();
  }

  private _paint(): void {
    const items = this._virtualizer.getVirtualItems();
    this._sizer.style.height = `${this._virtualizer.getTotalSize()}px`;
    const rows: HTMLElement[] = [];
    const visible: number[] = [];
    const painted = new Map<number, IPaintedRow>();
    for (const item of items) {
      const allocation = this._rows[item.index];
      if (!allocation) {
        continue;
      }
      // A row whose allocation, place and selection are as they were is kept: an update changes a few.
      const id = allocation.info.id;
      const selected = id === this._selected;
      const before = this._painted.get(id);
      const row =
        before && before.allocation === allocation && before.top === item.start && before.selected === selected
          ? before
          : { allocation, top: item.start, selected, node: this._row(allocation, item.start) };
      painted.set(id, row);
      rows.push(row.node);
      visible.push(id);
    }
    this._visible = visible;
    const same = rows.length === this._sizer.children.length && rows.every((row, i) => row === this._sizer.children[i]);
    if (!same) {
      this._sizer.replaceChildren(...rows);
    }
    this._painted = painted;
  }

  private _row(allocation: IAllocation, top: number): HTMLElement {
    const { info } = allocation;
    const row = div('jp-UvmLab-row');
    row.setAttribute('role', 'option');
    row.dataset.allocId = String(info.id);
    row.dataset.label = info.label;
    row.style.transform = `translateY(${top}px)`;
    row.style.height = `${ROW_HEIGHT}px`;
    const selected = info.id === this._selected;
    row.classList.toggle('jp-mod-selected', selected);
    row.setAttribute('aria-selected', String(selected));
    const title = div('jp-UvmLab-rowTitle');
    const name = document.createElement('span');
    name.className = 'jp-UvmLab-label';
    name.textContent = info.label;
    const facts = document.createElement('span');
    facts.className = 'jp-UvmLab-rowFacts';
    const moved = info.traffic.htod_bytes + info.traffic.dtoh_bytes + info.traffic.dtod_bytes;
    facts.textContent = `#${info.id} · ${formatBytes(info.size)} · ${info.traffic.faults} faults · ${formatBytes(moved)} moved`;
    title.append(name, facts);
    const bar = div('jp-UvmLab-rowBar');
    const total = Math.max(info.pages, 1);
    for (const category of DISPLAY_ORDER) {
      const pages = info.counts[category];
      if (pages) {
        const part = document.createElement('span');
        part.style.width = `${(100 * pages) / total}%`;
        part.style.background = PALETTE[category];
        part.dataset.category = category;
        bar.appendChild(part);
      }
    }
    row.append(title, bar);
    row.addEventListener('click', () => this._onSelect(info.id));
    return row;
  }

  private _search: HTMLInputElement;
  private _sort: HTMLSelectElement;
  private _count: HTMLElement;
  private _scroller: HTMLDivElement;
  private _sizer: HTMLDivElement;
  private _virtualizer: Virtualizer<HTMLDivElement, HTMLDivElement>;
  private _visible: number[] = [];
  private _painted = new Map<number, IPaintedRow>();
  private _unmount: () => void;
  private _all: ReadonlyMap<number, IAllocation> = new Map();
  private _rows: IAllocation[] = [];
  private _selected: number | null = null;
}

/** A row on screen, and what it was drawn from. */
interface IPaintedRow {
  allocation: IAllocation;
  top: number;
  selected: boolean;
  node: HTMLElement;
}
