/**
 * The Cluster section of the main-area view: every worker × GPU of the kernel's Dask cluster (the
 * `cluster` message, from the kernel's `ClusterMonitor`), one row each: memory used against capacity,
 * what moved and faulted, the pages the worker's buffers hold there. A click on a worker's row asks
 * for that worker's timeline (drawn by the view's own `Timeline`, from rows the worker merged by the
 * kernel's rule) and lists its buffers, each with "Prefetch to" buttons: the command goes to the
 * worker that owns the buffer (`worker_command`), and its result, a typed error included, is shown
 * under the table. Hidden until a cluster with a worker comes.
 *
 * For a reader (and a test): the section's `data-workers`, `data-rows` (worker × GPU rows),
 * `data-gone` (rows of workers gone or left) and `data-selected`; each row's `data-worker`, `data-gpu`,
 * `data-state` and `data-pages`; the worker's `data-worker`, `data-state` and `data-reading` (its buffers
 * are being read); each listed buffer's `data-buffer` and `data-label`.
 */

import { button, div, formatBytes, resultText } from './categories';
import { ITimeline, ITimelineSource, UvmLabModel } from './model';
import { PALETTE } from './palette';
import { CategoryName, Location, Result, WorkerBuffer, WorkerBufferList, WorkerInfo } from './protocol';
import { Timeline } from './timeline';

/** A worker's first timeline query asks for everything it holds: from 0 to here (ns; a double holds it exactly). */
const WHOLE_EXTENT_NS = 2 ** 52;
/** A selected worker's buffers are read again as its counts change, at most this often. */
const BUFFERS_EVERY_MS = 1000;

const COLUMNS = ['Worker', 'GPU', 'State', 'Memory used', 'HtoD', 'DtoH', 'Peer in', 'GPU faults', 'Evicted',
  'Pages held', 'Events', 'Lost deltas'];
const TITLES: Record<string, string> = {
  HtoD: 'Bytes moved into this GPU from the host since the worker joined',
  DtoH: 'Bytes moved out of this GPU to the host (evictions included)',
  'Peer in': 'Bytes moved into this GPU from a peer GPU (DtoD)',
  'Pages held': 'Pages of the worker\'s live buffers on this GPU',
  'Lost deltas': 'Reports from the worker that never reached the client'
};

/** One worker × GPU row and the parts of it that change. */
interface IRow {
  tr: HTMLTableRowElement;
  cells: HTMLTableCellElement[];
  fill: HTMLDivElement;
  memory: HTMLSpanElement;
}

export class ClusterSection {
  /** `changed` asks the view for a frame: something this section shows changed. */
  constructor(
    readonly node: HTMLElement,
    private readonly _model: UvmLabModel,
    private readonly _changed: () => void
  ) {
    node.classList.add('jp-UvmLab-cluster');
    node.hidden = true;
    node.setAttribute('aria-label', 'Cluster');
    this._title = div('jp-UvmLab-clusterTitle');
    const scroller = div('jp-UvmLab-clusterScroller');
    const table = document.createElement('table');
    table.className = 'jp-UvmLab-clusterTable';
    const head = document.createElement('tr');
    for (const name of COLUMNS) {
      const th = document.createElement('th');
      th.textContent = name;
      th.title = TITLES[name] ?? '';
      head.appendChild(th);
    }
    table.createTHead().appendChild(head);
    this._body = table.createTBody();
    scroller.appendChild(table);
    this._result = div('jp-UvmLab-result jp-UvmLab-clusterResult');
    this._result.setAttribute('role', 'status');
    this._result.setAttribute('aria-label', 'Last worker command');

    this._detail = div('jp-UvmLab-workerDetail');
    this._detail.hidden = true;
    this._detailTitle = div('jp-UvmLab-workerTitle');
    this._timelineBox = div('jp-UvmLab-workerTimeline');
    this._buffersTable = document.createElement('table');
    this._buffersTable.className = 'jp-UvmLab-workerBuffers';
    this._buffersNote = div('jp-UvmLab-workerNote');
    const buffers = div('jp-UvmLab-workerBuffersScroller');
    buffers.appendChild(this._buffersTable);
    this._detail.append(this._detailTitle, this._timelineBox, buffers, this._buffersNote);
    node.append(this._title, scroller, this._result, this._detail);
  }

  /** The worker whose timeline and buffers are shown (its address), or null. */
  get selected(): string | null {
    return this._selected;
  }

  /** Show worker `address`'s timeline and buffers. */
  select(address: string): void {
    if (address === this._selected) {
      return;
    }
    this._selected = address;
    this._selectedBuffer = null;
    this._buffers = null;
    this._buffersError = '';
    this._buffersKey = '';
    this._result.textContent = '';
    this._result.dataset.ok = '';
    // A timeline of its own for each worker: an answer on its way from the last one is never drawn for this one.
    this._source?.retire();
    const source = new WorkerTimelineSource(this._model, address, () => this._info(address)?.state === 'live');
    this._source = source;
    this._timeline = new Timeline(div(''), source, id => {
      this._selectedBuffer = id;
      this._changed();
    }, { showAllLabel: 'Show all', showAllTitle: 'Show everything the worker holds, and keep following' });
    this._timeline.answered.connect((_, answer) => {
      this._answerLanes = answer ? [...new Set(answer.columns.lane)].filter(lane => lane > 0) : [];
      this._changed();
    });
    this._answerLanes = [];
    this._timelineBox.replaceChildren(this._timeline.node);
    this._askBuffers();
    this._changed();
  }

  /** Draw what changed, `width` pixels wide. */
  render(width: number): void {
    const cluster = this._model.cluster;
    const workers = cluster?.workers ?? [];
    this.node.hidden = !workers.length;
    if (!workers.length) {
      this._forget();
      return;
    }
    if (this._selected !== null && !this._info(this._selected)) {
      this._forget(); // no longer listed: the cluster is another one, or the worker was forgotten
    }
    if (cluster !== this._drawn || this._selected !== this._rowsSelected) {
      this._drawn = cluster;
      this._rowsSelected = this._selected;
      this._drawRows(workers, cluster?.workers_left_out ?? 0);
    }
    this._renderDetail(width);
  }

  // --- the table --------------------------------------------------------------------------------

  private _drawRows(workers: WorkerInfo[], leftOut: number): void {
    const order: string[] = [];
    let gone = 0;
    let live = 0;
    let waiting = 0;
    for (const worker of workers) {
      live += worker.state === 'live' ? 1 : 0;
      waiting += worker.devices.length ? 0 : 1;
      worker.devices.forEach((device, i) => {
        const key = `${worker.address}|${device.gpu}`;
        order.push(key);
        let row = this._rows.get(key);
        if (!row) {
          row = this._newRow(worker.address);
          this._rows.set(key, row);
        }
        const ended = worker.state !== 'live';
        gone += ended ? 1 : 0;
        const { tr, cells } = row;
        tr.dataset.gpu = String(device.gpu);
        tr.dataset.state = worker.state;
        tr.dataset.pages = String(device.pages);
        tr.classList.toggle('jp-mod-gone', ended);
        tr.classList.toggle('jp-mod-firstGpu', i === 0);
        tr.classList.toggle('jp-mod-selected', worker.address === this._selected);
        tr.setAttribute('aria-selected', String(worker.address === this._selected));
        // The worker's own numbers on its first GPU's row; each GPU's on its row.
        setWorkerCell(cells[0], worker, i === 0);
        setText(cells[1], `GPU ${device.gpu}`);
        setText(cells[2], worker.state);
        const share = device.total ? Math.min(1, device.used / device.total) : 0;
        row.fill.style.width = `${(100 * share).toFixed(1)}%`;
        row.fill.style.background = PALETTE[`gpu:${device.gpu}` as CategoryName] ?? PALETTE.gpus;
        setText(row.memory, `${formatBytes(device.used)} / ${formatBytes(device.total)}`);
        const values = [formatBytes(device.htod_bytes), formatBytes(device.dtoh_bytes), formatBytes(device.dtod_bytes),
          count(device.gpu_faults), formatBytes(device.evicted_bytes), count(device.pages),
          i === 0 ? count(worker.events) : '', i === 0 ? count(worker.lost) : ''];
        values.forEach((text, j) => setText(cells[4 + j], text));
      });
    }
    const listed = new Set(order);
    for (const key of [...this._rows.keys()]) {
      if (!listed.has(key)) {
        this._rows.delete(key); // a worker no longer listed: nothing holds its row
      }
    }
    const key = order.join('\n');
    if (key !== this._order) {
      this._order = key;
      this._body.replaceChildren(...order.map(k => this._rows.get(k)!.tr));
    }
    const gpus = order.length;
    const parts = [plural(workers.length, 'worker'), plural(gpus, 'GPU'), `${live} live`];
    if (workers.length - live) {
      parts.push(`${workers.length - live} gone or left`);
    }
    if (waiting) {
      parts.push(`${waiting} not reported yet`);
    }
    if (leftOut) {
      parts.push(`${leftOut} more not listed`);
    }
    this._title.textContent = `Cluster: ${parts.join(' · ')} · click a worker for its timeline and buffers`;
    this.node.dataset.workers = String(workers.length);
    this.node.dataset.rows = String(gpus);
    this.node.dataset.gone = String(gone);
    this.node.dataset.selected = this._selected ?? '';
  }

  private _newRow(address: string): IRow {
    const tr = document.createElement('tr');
    tr.className = 'jp-UvmLab-clusterRow';
    tr.dataset.worker = address;
    tr.tabIndex = 0;
    const cells = COLUMNS.map(() => document.createElement('td'));
    const bar = div('jp-UvmLab-memBar');
    const fill = div('jp-UvmLab-memFill');
    bar.appendChild(fill);
    const memory = document.createElement('span');
    cells[3].append(bar, memory);
    tr.append(...cells);
    tr.addEventListener('click', () => this.select(address));
    tr.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        this.select(address);
      }
    });
    return { tr, cells, fill, memory };
  }

  // --- one worker ---------------------------------------------------------------------------------

  private _renderDetail(width: number): void {
    const address = this._selected;
    const info = address === null ? undefined : this._info(address);
    this._detail.hidden = !info;
    if (!info || !this._timeline) {
      return;
    }
    const live = info.state === 'live';
    this._detail.dataset.worker = info.address;
    this._detail.dataset.state = info.state;
    setText(this._detailTitle, `Worker ${info.name || info.address} (${info.address}) · ${info.backend} backend · ` +
      (live ? `${plural(info.buffers, 'buffer')}, ${formatBytes(info.allocated)}` : `${info.state}: its last picture`));
    this._refreshBuffers(info);
    // Whether a read of its buffers is on its way or waits its turn (what a test waits out before a stale click).
    this._detail.dataset.reading = String(this._buffersInFlight || this._buffersTimer !== 0);
    // The timeline's lanes: the buffers listed, then those its events name that are freed since.
    const listed = this._buffers?.buffers ?? [];
    const labels = new Map(listed.map(b => [b.id, b.label || `#${b.id}`]));
    const freed = this._answerLanes.filter(lane => !labels.has(lane)).sort((a, b) => a - b);
    this._timeline.render([...labels.keys(), ...freed], id => labels.get(id), this._selectedBuffer, width);
    this._drawBuffers(info);
  }

  /** Read the selected worker's buffers again where its counts moved (at most once a BUFFERS_EVERY_MS). */
  private _refreshBuffers(info: WorkerInfo): void {
    if (info.state !== 'live') {
      return; // it cannot answer: its last list stays
    }
    const key = `${info.buffers}|${info.allocated}|${info.devices.map(d => d.pages).join(',')}`;
    if (key === this._buffersKey) {
      return;
    }
    const wait = this._buffersAskedAt + BUFFERS_EVERY_MS - performance.now();
    if (wait > 0) {
      if (!this._buffersTimer) {
        this._buffersTimer = window.setTimeout(() => {
          this._buffersTimer = 0;
          this._changed();
        }, wait);
      }
      return;
    }
    this._buffersKey = key;
    this._askBuffers();
  }

  /** Ask for the selected worker's buffers: one query at a time, asked again once in if wished meanwhile. */
  private _askBuffers(): void {
    const worker = this._selected;
    if (worker === null) {
      return;
    }
    if (this._buffersInFlight) {
      this._buffersAgain = true;
      return;
    }
    this._buffersInFlight = true;
    this._buffersAskedAt = performance.now();
    void this._model.queryWorkerBuffers(worker).then(answer => {
      this._buffersInFlight = false;
      if (worker === this._selected) {
        if ('buffers' in answer) {
          this._buffers = answer;
          this._buffersError = '';
        } else {
          this._buffersError = resultText(answer, '');
        }
      }
      if (this._buffersAgain) {
        this._buffersAgain = false;
        this._askBuffers();
      }
      this._changed();
    });
  }

  private _drawBuffers(info: WorkerInfo): void {
    const list = this._buffers;
    const usable = info.state === 'live' && this._model.ready && !this._busy;
    const gpus = Math.max(info.gpus, info.devices.length);
    const look = [list, usable, gpus, this._selectedBuffer, this._buffersError];
    if (look.length === this._buffersLook.length && look.every((part, i) => part === this._buffersLook[i])) {
      return; // nothing it shows changed
    }
    this._buffersLook = look;
    const locations: Location[] = ['host', ...Array.from({ length: gpus }, (_, d) => `gpu:${d}` as Location)];
    const head = document.createElement('tr');
    for (const name of ['Buffer', 'Size', 'Where its pages are', 'Prefetch to']) {
      const th = document.createElement('th');
      th.textContent = name;
      head.appendChild(th);
    }
    const rows = (list?.buffers ?? []).map(buffer => this._bufferRow(buffer, locations, usable));
    this._buffersTable.replaceChildren(head, ...rows);
    this._buffersTable.dataset.buffers = String(rows.length);
    this._buffersNote.textContent = this._buffersError
      ? `Buffers: ${this._buffersError}`
      : !list
        ? 'Reading the worker\'s buffers…'
        : !list.buffers.length
          ? 'This worker holds no live buffers.'
          : list.truncated
            ? `The oldest ${list.buffers.length} buffers; the newest are not listed.`
            : '';
  }

  private _bufferRow(buffer: WorkerBuffer, locations: Location[], usable: boolean): HTMLTableRowElement {
    const tr = document.createElement('tr');
    tr.dataset.buffer = String(buffer.id);
    tr.dataset.label = buffer.label;
    tr.classList.toggle('jp-mod-selected', buffer.id === this._selectedBuffer);
    const name = buffer.label || `#${buffer.id}`;
    const where = Object.entries(buffer.copies)
      .filter(([, pages]) => pages > 0)
      .map(([place, pages]) => `${placeName(place)}: ${count(pages)} pages`);
    if (buffer.unknown) {
      where.push(`unknown: ${count(buffer.unknown)} pages`);
    }
    const cells = [`${name} (#${buffer.id})`, formatBytes(buffer.size), where.join(' · ') || 'no pages yet'].map(text => {
      const td = document.createElement('td');
      td.textContent = text;
      return td;
    });
    const actions = document.createElement('td');
    actions.className = 'jp-UvmLab-workerActions';
    for (const location of locations) {
      const go = button(placeName(location), 'jp-UvmLab-workerPrefetch');
      go.dataset.location = location;
      go.setAttribute('aria-label', `Prefetch ${name} to ${placeName(location)}`);
      go.title = buffer.is_managed ? `Prefetch every page of ${name} to ${placeName(location)}` : 'Not managed memory';
      go.disabled = !usable || !buffer.is_managed;
      go.addEventListener('click', () => void this._prefetch(buffer, location));
      actions.appendChild(go);
    }
    tr.append(...cells, actions);
    return tr;
  }

  private async _prefetch(buffer: WorkerBuffer, location: Location): Promise<void> {
    const worker = this._selected;
    if (worker === null) {
      return;
    }
    const what = `${buffer.label || `#${buffer.id}`} on worker ${this._info(worker)?.name || worker} to ${placeName(location)}`;
    this._busy = true;
    this._result.textContent = `Prefetching ${what}…`;
    this._result.dataset.ok = '';
    this._changed();
    let result: Result | null = null;
    try {
      result = await this._model.workerCommand(worker, {
        type: 'prefetch',
        id: buffer.id,
        location,
        first_page: 0,
        pages: null
      });
    } finally {
      this._busy = false;
      if (result) {
        this._result.textContent = resultText(result, `Prefetched ${what}.`);
        this._result.dataset.ok = String(result.ok);
      }
      this._askBuffers(); // what it moved, or that the buffer is gone
      this._changed();
    }
  }

  private _info(address: string): WorkerInfo | undefined {
    return this._model.cluster?.workers.find(w => w.address === address);
  }

  /** Drop the selected worker (the cluster it was in is not shown any more). */
  private _forget(): void {
    if (this._selected === null) {
      return;
    }
    this._selected = null;
    this._source?.retire();
    this._source = null;
    this._timeline = null;
    this._timelineBox.replaceChildren();
    this._buffers = null;
    this._buffersLook = [];
    this._detail.hidden = true;
    this.node.dataset.selected = '';
  }

  private _title: HTMLElement;
  private _body: HTMLTableSectionElement;
  private _result: HTMLElement;
  private _detail: HTMLElement;
  private _detailTitle: HTMLElement;
  private _timelineBox: HTMLElement;
  private _buffersTable: HTMLTableElement;
  private _buffersNote: HTMLElement;
  private _rows = new Map<string, IRow>();
  private _order = '';
  private _drawn: unknown = null;
  private _rowsSelected: string | null = null;
  private _selected: string | null = null;
  private _selectedBuffer: number | null = null;
  private _source: WorkerTimelineSource | null = null;
  private _timeline: Timeline | null = null;
  private _answerLanes: number[] = [];
  private _buffers: WorkerBufferList | null = null;
  private _buffersError = '';
  private _buffersKey = '';
  private _buffersAskedAt = -Infinity;
  private _buffersTimer = 0;
  private _buffersInFlight = false;
  private _buffersAgain = false;
  private _buffersLook: unknown[] = [];
  private _busy = false;
}

/** One worker's timeline, asked of the kernel, which asks the worker (`worker_timeline`). */
class WorkerTimelineSource implements ITimelineSource {
  constructor(
    private readonly _model: UvmLabModel,
    readonly worker: string,
    private readonly _live: () => boolean
  ) {}

  /** A worker that is gone cannot answer: its last rows stay drawn. */
  get ready(): boolean {
    return !this._retired && this._model.ready && this._live();
  }

  get earliest(): number {
    return this._first;
  }

  /** Until the worker has answered: far enough ahead that the first query covers everything it holds. */
  get now(): number {
    return this._last ?? WHOLE_EXTENT_NS;
  }

  /** Another worker is shown now: this one asks nothing more. */
  retire(): void {
    this._retired = true;
  }

  async queryTimeline(start: number, end: number, width: number): Promise<ITimeline | Result> {
    const answer = await this._model.queryWorkerTimeline(this.worker, start, end, width);
    if (!('columns' in answer)) {
      return answer;
    }
    this._first = answer.rows.first;
    this._last = Math.max(answer.rows.last, answer.rows.first + 1);
    return { rows: { ...answer.rows, type: 'timeline' }, columns: answer.columns };
  }

  private _first = 0;
  private _last: number | null = null;
  private _retired = false;
}

function setWorkerCell(cell: HTMLTableCellElement, worker: WorkerInfo, first: boolean): void {
  const key = `${worker.name}|${worker.address}|${first}`;
  if (cell.dataset.key === key) {
    return;
  }
  cell.dataset.key = key;
  const name = document.createElement('span');
  name.className = first ? 'jp-UvmLab-workerName' : 'jp-UvmLab-workerName jp-mod-repeat';
  name.textContent = worker.name || worker.address;
  cell.replaceChildren(name);
  cell.title = worker.address;
  if (first) {
    const address = document.createElement('span');
    address.className = 'jp-UvmLab-workerAddress';
    address.textContent = worker.address;
    cell.appendChild(address);
  }
}

function setText(node: HTMLElement, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

function count(n: number): string {
  return n.toLocaleString('en-US');
}

function plural(n: number, what: string): string {
  return `${count(n)} ${what}${n === 1 ? '' : 's'}`;
}

/** "host", "gpu:1" as a reader says them. */
function placeName(place: string): string {
  return place.startsWith('gpu:') ? `GPU ${place.slice(4)}` : place;
}
