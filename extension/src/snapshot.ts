/**
 * The viewer of a snapshot: the page `uvm_lab.snapshot(trace, path)` writes. It draws a trace's view
 * with the lab view's own parts (device lanes, timeline, allocation list, legends) from the data
 * embedded in the page, with no kernel, server or network.
 *
 * The timeline's rows were merged in Python, by the kernel's one rule, at several widths (levels);
 * `SnapshotTimeline` answers a window from the coarsest level whose pixel is no wider than the
 * screen's, so what is drawn is always an answer the kernel gave. Residency maps are not in
 * snapshots (a trace cannot rebuild them truthfully), and the page says so.
 */

import 'uplot/dist/uPlot.min.css';
import '../style/base.css';
import '../style/snapshot.css';

import { AllocationList } from './alloclist';
import { div, formatBytes, formatNs, legendItem, tableRow, trafficRows } from './categories';
import { DeviceLanes, SampleField } from './lanes';
import { IAllocation, ITimeline, ITimelineSource } from './model';
import { CAUSE_PALETTE } from './palette';
import {
  AllocationInfo,
  CAUSE_NAMES,
  CATEGORY_NAMES,
  DeviceSample,
  ITimelineColumns,
  PageCounts,
  Result,
  TIMELINE_COLUMNS,
  Traffic
} from './protocol';
import { Timeline } from './timeline';

/** As `uvm_lab.jupyter.snapshot.SnapshotLevel`: one width's rows, each column deflated and in base64. */
export interface ISnapshotLevel {
  width: number;
  rows: number;
  events: number;
  truncated: number;
  columns: Record<string, string>;
}

export interface ISnapshotAllocation {
  id: number;
  label: string;
  address: number;
  size: number;
  made: number;
  freed: number | null;
  source: string;
  traffic: Traffic;
}

export interface ISnapshotBounds {
  events_not_held: number;
  events_missed: number;
  levels: number;
  finest_pixel_ns: number;
  finer_levels_left_out: number;
  rows: number;
  max_rows: number;
  rows_truncated: number;
  allocations_left_out: number;
  sources_left_out: number;
}

/** As `uvm_lab.jupyter.snapshot.SnapshotData`. */
export interface ISnapshotData {
  title: string;
  made: string;
  first: number;
  last: number;
  events: number;
  summary: { counts: Record<string, number>; [key: string]: unknown };
  levels: ISnapshotLevel[];
  sources: Record<string, string>;
  allocations: ISnapshotAllocation[];
  samples: DeviceSample[];
  sampled: SampleField[];
  by_source: Record<string, string | number | null>[];
  bounds: ISnapshotBounds;
}

/** A level's rows as columns. */
interface ILevel {
  width: number;
  pixel: number;
  truncated: number;
  columns: ITimelineColumns;
}

/** Answers timeline queries from a snapshot's levels, as the kernel would from its events. */
export class SnapshotTimeline implements ITimelineSource {
  constructor(
    private readonly _data: ISnapshotData,
    private readonly _levels: ILevel[],
    private readonly _onLevel: (level: ILevel, finerWanted: boolean) => void
  ) {}

  readonly ready = true;

  get earliest(): number {
    return this._data.first;
  }

  get now(): number {
    return this._data.last;
  }

  queryTimeline(start: number, end: number, width: number, lanes: number[] | null): Promise<ITimeline | Result> {
    const pixel = (end - start) / width;
    // The coarsest level fine enough for the screen; past the finest, the finest.
    const level = this._levels.find(l => l.pixel <= pixel) ?? this._levels[this._levels.length - 1];
    this._onLevel(level, level.pixel > pixel);
    const c = level.columns;
    const wanted = lanes ? new Set(lanes) : null;
    const keep: number[] = [];
    let events = 0;
    for (let i = 0; i < c.start.length; i++) {
      if (c.start[i] <= end && c.end[i] >= start && (!wanted || wanted.has(c.lane[i]))) {
        keep.push(i);
        events += c.count[i];
      }
    }
    const columns = {} as Record<string, ArrayBufferView>;
    for (const [name] of TIMELINE_COLUMNS) {
      const all = c[name] as Float64Array;
      const out = new (all.constructor as Float64ArrayConstructor)(keep.length);
      keep.forEach((row, i) => (out[i] = all[row]));
      columns[name] = out;
    }
    return Promise.resolve({
      rows: {
        type: 'timeline',
        seq: 0,
        start,
        end,
        width,
        columns: TIMELINE_COLUMNS.map(([name]) => name),
        rows: keep.length,
        events,
        held: this._data.events,
        dropped: this._data.bounds.events_not_held,
        missed: this._data.bounds.events_missed,
        truncated: level.truncated,
        first: this._data.first,
        last: this._data.last,
        sources: this._data.sources,
        // The page's own by-source table covers the whole trace (Trace.by_source).
        by_source: [],
        by_source_others: 0
      },
      columns: columns as unknown as ITimelineColumns
    });
  }
}

/** Read a level's deflated base64 columns. */
async function decodeLevel(level: ISnapshotLevel, first: number, last: number): Promise<ILevel> {
  const out: Record<string, ArrayBufferView> = {};
  for (const [name, dtype] of TIMELINE_COLUMNS) {
    const packed = Uint8Array.from(atob(level.columns[name]), ch => ch.charCodeAt(0));
    const stream = new Blob([packed]).stream().pipeThrough(new DecompressionStream('deflate'));
    const bytes = await new Response(stream).arrayBuffer();
    out[name] = TYPED[dtype](bytes);
  }
  return { width: level.width, pixel: (last - first) / level.width, truncated: level.truncated, columns: out as unknown as ITimelineColumns };
}

const TYPED: Record<(typeof TIMELINE_COLUMNS)[number][1], (b: ArrayBuffer) => ArrayBufferView> = {
  '<f8': b => new Float64Array(b),
  u1: b => new Uint8Array(b),
  '<i2': b => new Int16Array(b),
  '<u4': b => new Uint32Array(b)
};

/** An allocation of the trace as the list shows one: no page counts (snapshots carry no maps). */
function asAllocation(a: ISnapshotAllocation): IAllocation {
  const counts = {} as PageCounts;
  CATEGORY_NAMES.forEach(name => (counts[name] = 0));
  const info: AllocationInfo = {
    id: a.id,
    label: a.label,
    address: a.address,
    size: a.size,
    is_managed: true,
    advice: { read_mostly: false, preferred_location: null, accessed_by: [] },
    pages: Math.ceil(a.size / 4096),
    cell_pages: 1,
    cells: 0,
    counts,
    encoding: 'cells',
    traffic: a.traffic,
    requested: null
  };
  return { info, cells: new Uint8Array(0), revision: 0, time: a.made };
}

/** The whole page. */
export class SnapshotPage {
  constructor(
    readonly node: HTMLElement,
    private readonly _data: ISnapshotData,
    levels: ILevel[]
  ) {
    node.classList.add('jp-UvmLab-snapshot');
    const data = _data;
    this._byId = new Map(data.allocations.map(a => [a.id, a]));
    this._allocations = new Map(data.allocations.map(a => [a.id, asAllocation(a)]));

    const header = div('jp-UvmLab-snapshotHeader');
    const title = document.createElement('h1');
    title.textContent = data.title;
    const facts = div('jp-UvmLab-snapshotFacts');
    const kinds = Object.entries(data.summary.counts)
      .map(([kind, n]) => `${n} ${kind}`)
      .join(', ');
    facts.textContent =
      `${data.events} events over ${formatNs(data.last - data.first)} (${formatNs(data.first)} to ${formatNs(data.last)})` +
      (kinds ? `: ${kinds}` : '') +
      ` · written ${data.made}`;
    header.append(title, facts, this._boundsList());

    const body = div('jp-UvmLabView-body jp-UvmLab-snapshotBody');
    const side = div('jp-UvmLabView-side');
    this._list = new AllocationList(div(''), id => this._select(id), () => this._render());
    side.append(this._list.node);
    const main = div('jp-UvmLabView-main');
    this._lanes = new DeviceLanes(div(''), data.sampled);
    const lanesNote = div('jp-UvmLab-lanesNote');
    lanesNote.textContent =
      `${data.samples.length} intervals of ${formatNs((data.last - data.first) / Math.max(1, data.samples.length))}. ` +
      'Allocated: bytes of the allocations made in this trace and not yet freed. ' +
      'Device memory in use and capacity are not in traces.';
    this._levelNote = div('jp-UvmLab-levelNote');
    const source = new SnapshotTimeline(data, levels, (level, finer) => this._showLevel(level, finer));
    this._timeline = new Timeline(div(''), source, id => this._select(id), {
      showAllLabel: 'Show all',
      showAllTitle: 'Show the whole trace'
    });
    const causes = div('jp-UvmLab-legend jp-UvmLab-causes');
    causes.append(...CAUSE_NAMES.map(name => legendItem(name, CAUSE_PALETTE[name], { cause: name })));
    this._selection = div('jp-UvmLab-selection');
    const maps = div('jp-UvmLab-mapsNote');
    maps.textContent =
      'Page maps are not in snapshots: a trace does not hold where pages were before it began, nor records ' +
      'that were lost, so a map rebuilt from it could be wrong. Open the live view for maps.';
    const table = div('jp-UvmLab-bySource');
    const heading = document.createElement('h2');
    heading.textContent = 'By source line';
    table.append(heading, this._bySource());
    main.append(this._lanes.node, lanesNote, this._timeline.node, this._levelNote, causes, this._selection, maps, table);
    body.append(side, main);
    node.append(header, body);
    window.addEventListener('resize', () => this._render());
    this._list.setData(this._allocations, null);
    this._render();
  }

  private _select(id: number): void {
    this._selected = this._allocations.has(id) ? id : null;
    this._list.setData(this._allocations, this._selected);
    this._render();
  }

  private _render(): void {
    const main = this.node.querySelector('.jp-UvmLabView-main') as HTMLElement;
    const width = Math.max(0, main.clientWidth - 24);
    const window = this._timeline.following ? null : this._timeline.window;
    this._lanes.render(this._data.samples, window, width);
    const labels = new Map(this._data.allocations.map(a => [a.id, a.label]));
    this._timeline.render(this._list.shownIds, id => labels.get(id), this._selected, width);
    this._renderSelection();
  }

  private _renderSelection(): void {
    const a = this._selected === null ? undefined : this._byId.get(this._selected);
    if (!a) {
      this._selection.textContent = 'Select an allocation in the list or the timeline for its traffic by cause.';
      return;
    }
    const title = div('jp-UvmLab-selectionTitle');
    title.textContent = `${a.label} (#${a.id}, ${formatBytes(a.size)})`;
    const when = div('jp-UvmLab-placement');
    when.textContent =
      `Made at ${formatNs(a.made)}${a.source ? ` by ${a.source}` : ''}` +
      (a.freed === null ? ' · not freed in this trace' : ` · freed at ${formatNs(a.freed)}`);
    const traffic = document.createElement('table');
    traffic.className = 'jp-UvmLab-traffic';
    traffic.replaceChildren(...trafficRows(a.traffic));
    this._selection.replaceChildren(title, when, traffic);
  }

  /** The device lanes follow the timeline's window, once a frame however often it moves. */
  private _followWindow(): void {
    if (this._frame) {
      return;
    }
    this._frame = requestAnimationFrame(() => {
      this._frame = 0;
      const main = this.node.querySelector('.jp-UvmLabView-main') as HTMLElement;
      const window = this._timeline.following ? null : this._timeline.window;
      this._lanes.render(this._data.samples, window, Math.max(0, main.clientWidth - 24));
    });
  }

  private _showLevel(level: ILevel, finerWanted: boolean): void {
    this._followWindow();
    this._levelNote.dataset.width = String(level.width);
    this._levelNote.textContent =
      `Events narrower than ${formatNs(level.pixel)} are merged (level of ${level.width} px)` +
      (finerWanted ? ': zoomed in past the finest level this snapshot holds' : '');
  }

  /** Every bound the snapshot met, counted. */
  private _boundsList(): HTMLElement {
    const b = this._data.bounds;
    const list = document.createElement('ul');
    list.className = 'jp-UvmLab-bounds';
    const items = [
      `Timeline: ${b.rows} rows in ${b.levels} levels (at most ${b.max_rows}), finest ${formatNs(b.finest_pixel_ns)} a pixel`
    ];
    if (b.finer_levels_left_out) {
      items.push(`${b.finer_levels_left_out} finer levels left out for room: zoomed past ${formatNs(b.finest_pixel_ns)} a pixel, marks stay merged`);
    }
    if (b.rows_truncated) {
      items.push(`${b.rows_truncated} timeline rows left out (past the most one level holds)`);
    }
    if (b.events_not_held) {
      items.push(`${b.events_not_held} older events no longer held by the kernel, not in this snapshot`);
    }
    if (b.events_missed) {
      items.push(`${b.events_missed} events missed while the recording fell behind, not in this snapshot`);
    }
    if (b.allocations_left_out) {
      items.push(`${b.allocations_left_out} allocations not listed`);
    }
    if (b.sources_left_out) {
      items.push(`${b.sources_left_out} source lines not listed (the fewest bytes moved)`);
    }
    list.append(
      ...items.map(text => {
        const item = document.createElement('li');
        item.textContent = text;
        return item;
      })
    );
    return list;
  }

  private _bySource(): HTMLTableElement {
    const table = document.createElement('table');
    table.className = 'jp-UvmLab-traffic jp-UvmLab-bySourceTable';
    const bytes = (v: string | number | null) => formatBytes(Number(v ?? 0));
    const rows = [tableRow(['source', 'events', 'GPU faults', 'CPU faults', 'to GPU', 'to host', 'GPU to GPU', 'moved'], 'th')];
    for (const r of this._data.by_source) {
      rows.push(
        tableRow(
          [
            String(r.source || (r.cell !== null ? `In [${r.cell}]` : 'not known')),
            String(r.events),
            String(r.gpu_faults),
            String(r.cpu_faults),
            bytes(r.bytes_htod),
            bytes(r.bytes_dtoh),
            bytes(r.bytes_dtod),
            bytes(r.bytes_moved)
          ],
          'td'
        )
      );
    }
    table.replaceChildren(...rows);
    return table;
  }

  private _byId: Map<number, ISnapshotAllocation>;
  private _allocations: Map<number, IAllocation>;
  private _list: AllocationList;
  private _lanes: DeviceLanes;
  private _timeline: Timeline;
  private _levelNote: HTMLElement;
  private _selection: HTMLElement;
  private _selected: number | null = null;
  private _frame = 0;
}

/** Read the page's data and draw it. */
async function main(): Promise<void> {
  const root = document.getElementById('uvm-lab-snapshot');
  const script = document.getElementById('uvm-lab-data');
  if (!root || !script) {
    return;
  }
  try {
    const data = JSON.parse(script.textContent ?? '') as ISnapshotData;
    const levels = await Promise.all(data.levels.map(level => decodeLevel(level, data.first, data.last)));
    new SnapshotPage(root, data, levels);
    root.dataset.ready = 'true';
  } catch (err) {
    root.textContent = `This snapshot could not be read: ${String(err)}`;
    root.dataset.ready = 'error';
  }
}

void main();
