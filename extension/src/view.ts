/**
 * The UVM Lab view in the main area: device lanes, a timeline of events by allocation and cause,
 * the allocation list, the selected allocation's page map with its traffic, and the controls for
 * everything a buffer does; and, where the kernel watches a Dask cluster, every worker × GPU of it
 * (`ClusterSection`). It follows the current notebook's kernel through its own model (one
 * comm); it only renders and sends commands, and shows each command's result.
 */

import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { AllocationList } from './alloclist';
import { ClusterSection } from './cluster';
import {
  GPU_CATEGORIES,
  LABELS,
  button,
  div,
  eachGpuMemory,
  formatBytes,
  formatNs,
  legendItem,
  legendItems,
  nonZero,
  resultText,
  shownCategories,
  trafficRows
} from './categories';
import { MapHistory } from './history';
import { DeviceLanes } from './lanes';
import { IAllocation, IPageRange, UvmLabModel } from './model';
import { PageMap } from './pagemap';
import { SourceLines } from './sourcelines';
import { CAUSE_PALETTE } from './palette';
import { CAUSE_NAMES, CategoryName, Location, RATE_LIMITS_MS, Result } from './protocol';
import { Timeline } from './timeline';

/** Below this width the view stacks its list above the charts and maps. */
const NARROW_PX = 900;

/** The update intervals offered, in ms (within the protocol's limits). */
const RATES = [50, 100, 250, 500, 1000, 2000].filter(ms => ms >= RATE_LIMITS_MS[0] && ms <= RATE_LIMITS_MS[1]);

export class UvmLabView extends Widget {
  constructor(model: UvmLabModel) {
    super();
    this.model = model;
    this.addClass('jp-UvmLabView');
    this.node.tabIndex = -1;
    this._build();
    model.stateChanged.connect(this._schedule, this);
    model.allocationsChanged.connect((_, ids) => {
      ids.forEach(id => this._changed.add(id));
      this._schedule();
    }, this);
    model.samplesChanged.connect(this._schedule, this);
    model.experimentChanged.connect(this._showExperiment, this);
    model.clusterChanged.connect(this._schedule, this);
    model.setPaused(true); // until shown
  }

  readonly model: UvmLabModel;

  /** The allocation the map and the controls show. */
  get selectedId(): number | null {
    return this._selected;
  }

  select(id: number): void {
    if (this.model.allocations.has(id)) {
      this._selected = id;
      this._schedule();
    }
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    cancelAnimationFrame(this._frame);
    this._list.dispose();
    this._lanes.dispose();
    this.model.dispose();
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    this._hidden = false;
    this.model.setPaused(this._userPaused);
    this._schedule();
  }

  protected onAfterAttach(msg: Message): void {
    // A widget attached visible is never "shown": it starts here.
    if (this.isVisible) {
      this.onAfterShow(msg);
    }
  }

  protected onAfterHide(msg: Message): void {
    this._hidden = true;
    this.model.setPaused(true);
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    this._schedule();
  }

  protected onActivateRequest(msg: Message): void {
    this.node.focus();
  }

  /** Draw once per animation frame however many messages arrived. */
  private _schedule(): void {
    if (this._frame) {
      return;
    }
    this._frame = requestAnimationFrame(() => {
      this._frame = 0;
      this._render();
    });
  }

  /** Draw the latest experiment's chart, where it is a new one. */
  private _showExperiment(): void {
    const chart = this.model.experiment;
    if (!chart || this._experiment.dataset.created === chart.created) {
      return;
    }
    this._experiment.dataset.created = chart.created;
    this._experiment.hidden = false;
    const configurations = `${chart.configurations} configuration${chart.configurations === 1 ? '' : 's'}`;
    this._experimentTitle.textContent = `Experiment: ${chart.workload}, ${configurations} (${chart.created})`;
    // The figure is 60 px and 28 a configuration tall (Experiment.plot), with the page's margins.
    this._experimentFrame.style.height = `${100 + 28 * chart.configurations}px`;
    this._experimentFrame.srcdoc = chart.html;
    // The user just ran it: bring it on screen (the view scrolls; the chart sits below the timeline).
    this._experiment.scrollIntoView({ block: 'nearest' });
  }

  // --- building ---------------------------------------------------------------------------------

  private _build(): void {
    const header = div('jp-UvmLabView-header');
    const title = div('jp-UvmLab-title');
    title.textContent = 'UVM Lab';
    this._kernelLine = div('jp-UvmLab-kernel');
    this._pause = button('Pause', 'jp-UvmLab-pause');
    this._pause.setAttribute('aria-pressed', 'false');
    this._pause.title = 'Stop the updates (the kernel keeps recording)';
    this._pause.addEventListener('click', () => this._togglePause());
    this._rate = document.createElement('select');
    this._rate.setAttribute('aria-label', 'Update interval');
    this._rate.title = 'The least time between two updates';
    for (const ms of RATES) {
      const option = document.createElement('option');
      option.value = String(ms);
      option.textContent = ms < 1000 ? `every ${ms} ms` : `every ${ms / 1000} s`;
      this._rate.appendChild(option);
    }
    this._rate.addEventListener('change', () => {
      const ms = Number(this._rate.value);
      void this._run(`Asking for updates every ${ms} ms…`, `Updates every ${ms} ms.`, () => this.model.setRate(ms));
    });
    header.append(title, this._kernelLine, this._pause, this._rate);

    this._notice = div('jp-UvmLab-notice');
    this._noticeText = document.createElement('p');
    const retry = button('Retry', 'jp-UvmLab-retry');
    retry.addEventListener('click', () => void this.model.attach());
    this._notice.append(this._noticeText, retry);

    const body = div('jp-UvmLabView-body');
    const side = div('jp-UvmLabView-side');
    this._list = new AllocationList(
      div(''),
      id => this.select(id),
      () => this._schedule()
    );
    side.append(this._list.node);
    // Scrolling the list brings other maps on screen: the kernel is told (_watchShown) at the next frame.
    this._list.node.addEventListener('scroll', () => this._schedule(), true);

    const main = div('jp-UvmLabView-main');
    // A Dask client's kernel does little on its own GPU: its cluster comes first, where it has one.
    this._cluster = new ClusterSection(document.createElement('section'), this.model, () => this._schedule());
    this._lanes = new DeviceLanes(div(''));
    this._lanesNote = div('jp-UvmLab-lanesNote');
    this._timeline = new Timeline(div(''), this.model, id => this.select(id));
    this._sourceLines = new SourceLines(div(''));
    this._sourceLines.render(null);
    this._timeline.answered.connect((_, answer) => this._sourceLines.render(answer));
    this._timeline.cursorRequested.connect((_, time) => {
      this._cursorAt = time;
      this._cursorLive = false;
      this._schedule();
    });
    const causes = div('jp-UvmLab-legend jp-UvmLab-causes');
    causes.append(
      ...CAUSE_NAMES.map(name => legendItem(name, CAUSE_PALETTE[name], { cause: name }))
    );

    const selected = div('jp-UvmLab-selection');
    this._selectedTitle = div('jp-UvmLab-selectionTitle');
    this._legend = div('jp-UvmLab-legend');
    const zoom = div('jp-UvmLab-zoom');
    const zoomIn = button('+', 'jp-UvmLab-zoomIn');
    zoomIn.setAttribute('aria-label', 'Zoom the page map in');
    const zoomOut = button('−', 'jp-UvmLab-zoomOut');
    zoomOut.setAttribute('aria-label', 'Zoom the page map out');
    zoomIn.addEventListener('click', () => this._map.zoom(1));
    zoomOut.addEventListener('click', () => this._map.zoom(-1));
    zoom.append(zoomOut, zoomIn);
    const lastEvent = (lane: number, first: number, end: number) => this._timeline.lastEventAt(lane, first, end);
    this._map = new PageMap(div(''), lastEvent);
    this._map.cellClicked.connect((_, cell) => this._drill(cell));
    // A large allocation's cells hold many pages each: a click reads those pages, one a cell.
    this._detail = new PageMap(div(''), lastEvent, 'jp-UvmLab-detailMap');
    this._detailTitle = div('jp-UvmLab-detailTitle');
    this._detailTitle.setAttribute('aria-label', 'Page detail');
    this._placement = div('jp-UvmLab-placement');
    const cursorRow = div('jp-UvmLab-controlRow jp-UvmLab-cursor');
    this._cursor = document.createElement('input');
    this._cursor.type = 'range';
    this._cursor.min = '0';
    this._cursor.setAttribute('aria-label', 'Time cursor');
    this._cursor.title = 'Show the maps as they were at a moment (or click the timeline\'s time axis); all the way right is live';
    this._cursor.step = 'any';
    this._cursor.addEventListener('input', () => {
      this._cursorLive = Number(this._cursor.value) >= Number(this._cursor.max);
      this._cursorAt = this._cursorLive ? null : Number(this._cursor.value);
      this._schedule();
    });
    this._cursorText = div('jp-UvmLab-cursorText');
    this._cursorText.setAttribute('aria-label', 'Time cursor position');
    cursorRow.append(label('Time cursor'), this._cursor, this._cursorText);
    this._traffic = document.createElement('table');
    this._traffic.className = 'jp-UvmLab-traffic';
    this._controls = this._buildControls();
    selected.append(
      this._selectedTitle,
      this._placement,
      this._legend,
      cursorRow,
      zoom,
      this._map.node,
      this._detailTitle,
      this._detail.node,
      this._traffic,
      this._controls
    );

    // The latest experiment's chart (ul.compare), in a frame of its own: its page carries BokehJS, and runs
    // sandboxed, apart from JupyterLab's page. Hidden until the kernel sends one.
    this._experiment = document.createElement('details');
    this._experiment.className = 'jp-UvmLab-experiment';
    this._experiment.open = true;
    this._experiment.hidden = true;
    this._experimentTitle = document.createElement('summary');
    this._experimentFrame = document.createElement('iframe');
    this._experimentFrame.className = 'jp-UvmLab-experimentFrame';
    this._experimentFrame.title = 'The latest experiment';
    this._experimentFrame.setAttribute('sandbox', 'allow-scripts');
    this._experiment.append(this._experimentTitle, this._experimentFrame);

    main.append(
      this._cluster.node,
      this._lanes.node,
      this._lanesNote,
      this._timeline.node,
      causes,
      this._sourceLines.node,
      this._experiment,
      selected
    );
    body.append(side, main);

    this._status = div('jp-UvmLab-status');
    this._status.setAttribute('role', 'status');
    this.node.append(header, this._notice, body, this._status);
  }

  private _buildControls(): HTMLElement {
    const controls = div('jp-UvmLab-controls');
    // Prefetch: where, and which pages.
    const prefetch = div('jp-UvmLab-controlRow');
    this._destination = document.createElement('select');
    this._destination.setAttribute('aria-label', 'Prefetch destination');
    this._firstPage = numberInput('First page', '0');
    this._pageCount = numberInput('Page count', 'all');
    const go = button('Prefetch', 'jp-mod-accept jp-UvmLab-prefetch');
    go.title = 'cudaMemPrefetchAsync: move the pages to the chosen place';
    go.addEventListener('click', () => this._prefetch());
    prefetch.append(label('Prefetch to'), this._destination, label('pages from'), this._firstPage, label('count'), this._pageCount, go);

    // Advice: each kind, set and unset.
    const advice = div('jp-UvmLab-controlRow');
    this._readMostly = button('ReadMostly', 'jp-UvmLab-toggle');
    this._readMostly.setAttribute('role', 'switch');
    this._readMostly.setAttribute('aria-checked', 'false');
    this._readMostly.title = 'cudaMemAdviseSetReadMostly: reads duplicate pages instead of moving them';
    this._readMostly.addEventListener('click', () => this._toggleReadMostly());
    this._preferred = document.createElement('select');
    this._preferred.setAttribute('aria-label', 'Preferred location');
    this._preferred.title = 'cudaMemAdviseSetPreferredLocation (none unsets it)';
    this._preferred.addEventListener('change', () => this._setPreferred());
    this._accessedBy = div('jp-UvmLab-accessedBy');
    this._accessedBy.setAttribute('role', 'group');
    this._accessedBy.setAttribute('aria-label', 'Accessed by');
    advice.append(this._readMostly, label('Preferred location'), this._preferred, label('Accessed by'), this._accessedBy);

    this._result = div('jp-UvmLab-result');
    this._result.setAttribute('role', 'status');
    this._result.setAttribute('aria-label', 'Last command');
    controls.append(prefetch, advice, this._result);
    return controls;
  }

  // --- rendering --------------------------------------------------------------------------------

  private _render(): void {
    if (!this.isVisible) {
      return;
    }
    const model = this.model;
    const device = model.device;
    const parts = [model.kernelName || 'no kernel'];
    if (device) {
      parts.push(
        `${device.backend} backend`,
        eachGpuMemory(device, m => `${formatBytes(m.total - m.free)} of ${formatBytes(m.total)} in use`)
      );
    }
    this._kernelLine.textContent = parts.join(' · ');
    this.node.dataset.state = model.state;
    // What the picture shows is the kernel's state as of this time (a benchmark times changes to screen by it).
    this.node.dataset.clock = String(model.clock);
    const showNotice = model.state === 'not-loaded' || model.state === 'no-kernel' || model.state === 'no-notebook';
    this._notice.hidden = !showNotice;
    this._noticeText.textContent = model.status;
    this._status.textContent = model.status;
    this._pause.textContent = this._userPaused ? 'Resume' : 'Pause';
    this._pause.setAttribute('aria-pressed', String(this._userPaused));

    const allocations = model.allocations;
    if (this._selected !== null && !allocations.has(this._selected)) {
      this._selected = null;
    }
    if (this._selected === null && allocations.size) {
      this._selected = allocations.keys().next().value ?? null;
    }
    // Each part is drawn again only where what it shows changed: an update a loop causes changes a few
    // allocations of a thousand, and comes twenty times a second.
    const changed = [...this._changed];
    this._changed.clear();
    if (changed.length || this._selected !== this._listedSelection) {
      this._listedSelection = this._selected;
      this._list.setData(allocations, this._selected);
    }
    this._watchShown();

    // Narrow (beside a notebook): the list goes above the charts (style/base.css).
    this.node.classList.toggle('jp-mod-narrow', this.node.clientWidth < NARROW_PX);
    const width = Math.max(0, (this.node.querySelector('.jp-UvmLabView-main') as HTMLElement)?.clientWidth - 24);
    const window = this._timeline.following ? null : this._timeline.window;
    const samples = model.samples;
    const lanesKey = `${samples.length}|${samples[samples.length - 1]?.time}|${model.samplesDropped}|${window}|${width}`;
    if (lanesKey !== this._lanesKey) {
      this._lanesKey = lanesKey;
      this._lanes.render(samples, window, width);
    }
    this._lanesNote.textContent = model.samplesDropped
      ? `${model.samplesDropped} older samples no longer held`
      : '';
    if (model.state !== 'connected') {
      this._timeline.clear();
      this._history.clear(); // another kernel's ids may mean other allocations
    } else {
      const recorded: IAllocation[] = [];
      for (const id of changed) {
        const allocation = allocations.get(id);
        if (allocation) {
          recorded.push(allocation);
        }
      }
      this._history.record(recorded);
    }
    const cursor = this._cursorTime();
    this._lanes.setCursor(cursor);
    this._timeline.setCursor(cursor);
    this._timeline.render(this._list.shownIds, id => allocations.get(id)?.info.label, this._selected, width);
    this._cluster.render(width);

    const selected = this._selectedAllocation();
    this._renderSelection(selected, width);
    this._renderControls(selected);
  }

  private _renderSelection(selected: IAllocation | undefined, width: number): void {
    const shown = this._atCursor(selected);
    const key = [selected, shown, width, this.model.state, this._deviceCount(), this._detailRange, this._detailAnswer,
      this._detailError];
    if (key.length === this._selectionKey.length && key.every((part, i) => part === this._selectionKey[i])) {
      return; // nothing it shows changed
    }
    this._selectionKey = key;
    this._selectedTitle.textContent = selected
      ? `${selected.info.label} (#${selected.info.id}, ${formatBytes(selected.info.size)}, ${selected.info.pages} pages)`
      : this.model.state === 'connected'
        ? 'No live allocations. Create a uvm_lab.DeviceBuffer in the notebook.'
        : '';
    const present = new Set<CategoryName>(selected ? nonZero(selected.info.counts) : []);
    const spec = shownCategories(this._deviceCount(), present);
    if (spec.join('|') !== this._legendSpec) {
      this._legendSpec = spec.join('|');
      this._legend.replaceChildren(...legendItems(spec));
    }
    this._map.render(shown, Math.min(width, 900));
    this._renderDetail(selected, Math.min(width, 900));
    if (!selected) {
      this._placement.textContent = '';
      this._traffic.replaceChildren();
      return;
    }
    this._map.node.title = selected.info.cell_pages > 1 ? 'Click a cell to read its pages, one a cell' : '';
    // Placement and traffic as they were at the cursor.
    const { info } = shown ?? selected;
    // Requested (the last prefetch, whoever asked) beside observed (where the pages are).
    const requested = info.requested ? LABELS[info.requested as CategoryName] ?? info.requested : 'no prefetch yet';
    const observed = nonZero(info.counts)
      .map(name => `${LABELS[name].split(' (')[0]} ${percent(info.counts[name], info.pages)}`)
      .join(' · ');
    this._placement.textContent = `Requested: ${requested} · Observed: ${observed || 'no pages'}`;
    this._placement.dataset.requested = info.requested ?? '';
    // Traffic by cause: faults and bytes each way, the causes that have any.
    this._traffic.replaceChildren(...trafficRows(info.traffic));
  }

  /** Tell the kernel which maps are on screen (the list's rows and the selected one), when that changes. */
  private _watchShown(): void {
    if (this.model.state !== 'connected') {
      this._watching = '';
      return;
    }
    const ids = [...new Set([...this._list.visibleIds, ...(this._selected === null ? [] : [this._selected])])].sort(
      (a, b) => a - b
    );
    const key = ids.join(',');
    if (key !== this._watching) {
      this._watching = key;
      void this.model.watch(ids);
    }
  }

  /** The time the cursor shows, or null when it is live. */
  private _cursorTime(): number | null {
    // From the first event the timeline knows of, so a moment before the first state held can be chosen
    // (and the map says it is not held then).
    const oldest = this._history.oldest;
    const now = Math.max(this.model.now, oldest ?? 0);
    const first = Math.min(this._timeline.earliest, oldest ?? now);
    this._cursor.min = String(first);
    this._cursor.max = String(now);
    if (this._cursorLive || this._cursorAt === null) {
      this._cursor.value = String(now);
      return null;
    }
    const time = Math.min(Math.max(this._cursorAt, first), now);
    this._cursor.value = String(time);
    return time;
  }

  /**
   * The selected allocation as the time cursor shows it: live, or the state the history holds for the
   * cursor's moment; undefined where none is held from then. The cursor's line says which, and how many
   * older states were dropped.
   */
  private _atCursor(selected: IAllocation | undefined): IAllocation | undefined {
    const history = this._history;
    const dropped = history.dropped ? ` · ${history.dropped} older states dropped` : '';
    const time = this._cursorTime();
    this._cursorText.dataset.live = String(time === null);
    if (time === null) {
      this._cursorText.textContent = `live · ${history.size} states held${dropped}`;
      return selected;
    }
    const shown = selected ? history.at(selected.info.id, time) : null;
    this._cursorText.textContent =
      `at ${formatNs(time)} · ${history.size} states held${dropped}` +
      (selected && !shown ? ' · this allocation\'s map from then is not held' : '');
    return shown?.allocation;
  }

  /** Read the pages of the map's `cell` (and those around it, up to the cell limit), one page a cell. */
  private _drill(cell: number): void {
    const selected = this._selectedAllocation();
    if (!selected || selected.info.cell_pages <= 1) {
      return; // one page a cell already
    }
    const { info } = selected;
    const span = Math.min(this.model.cellLimit, info.pages);
    const first = Math.min(Math.floor((cell * info.cell_pages) / span) * span, info.pages - span);
    this._detailRange = { id: info.id, first, pages: span };
    this._detailAnswer = null;
    this._readDetail();
  }

  /** Ask for the detail's pages: one query at a time, the newest wish asked once the answer is in. */
  private _readDetail(): void {
    const range = this._detailRange;
    if (!range) {
      return;
    }
    if (this._detailInFlight) {
      this._detailAgain = true;
      return;
    }
    this._detailInFlight = true;
    const revision = this.model.allocations.get(range.id)?.revision ?? 0;
    void this.model.queryPages(range.id, range.first, range.pages).then(answer => {
      this._detailInFlight = false;
      if (this._detailRange === range) {
        this._detailAnswer = 'codes' in answer ? { ...answer, revision } : null;
        this._detailError = 'codes' in answer ? '' : `${answer.error?.type ?? 'Error'}: ${answer.error?.message ?? 'no answer'}`;
      }
      if (this._detailAgain) {
        this._detailAgain = false;
        this._readDetail();
      }
      this._schedule();
    });
  }

  private _renderDetail(selected: IAllocation | undefined, width: number): void {
    const range = this._detailRange;
    if (!selected || !range || range.id !== selected.info.id) {
      this._detailRange = null;
      this._detailTitle.hidden = true;
      this._detail.render(undefined, width);
      return;
    }
    const answer = this._detailAnswer;
    if (answer && answer.revision !== selected.revision && !this._detailInFlight) {
      this._readDetail(); // the pages changed: read them again (the old ones stay drawn until then)
    }
    this._detailTitle.hidden = false;
    const last = range.first + range.pages - 1;
    this._detailTitle.textContent = this._detailError
      ? this._detailError
      : `Pages ${range.first.toLocaleString()}–${last.toLocaleString()}, one a cell` +
        (answer ? ` · read at ${formatNs(answer.rows.time)}` : ' · reading…');
    if (!answer) {
      return;
    }
    const { info } = selected;
    const pageSize = info.pages ? Math.ceil(info.size / info.pages) : 4096;
    const detail: IAllocation = {
      info: {
        ...info,
        address: info.address + range.first * pageSize,
        size: Math.min(range.pages * pageSize, info.size - range.first * pageSize),
        pages: range.pages,
        cell_pages: 1,
        cells: range.pages
      },
      cells: answer.codes,
      revision: answer.revision,
      time: answer.rows.time
    };
    this._detail.render(detail, width, range.first);
  }

  private _renderControls(selected: IAllocation | undefined): void {
    const usable = !!selected && selected.info.is_managed && this.model.state === 'connected' && !this._busy;
    this._controls.hidden = !selected;
    const gpus = GPU_CATEGORIES.slice(0, Math.min(this._deviceCount(), GPU_CATEGORIES.length));
    const locations = [...gpus, 'host'];
    fillOptions(this._destination, locations, locations[0]);
    fillOptions(this._preferred, ['', ...locations], '');
    if (selected) {
      const advice = selected.info.advice;
      this._readMostly.setAttribute('aria-checked', String(advice.read_mostly));
      this._readMostly.classList.toggle('jp-mod-active', advice.read_mostly);
      if (document.activeElement !== this._preferred) {
        this._preferred.value = advice.preferred_location ?? '';
      }
      // One checkbox per place, checked where the kernel says.
      const spec = locations.join('|');
      if (this._accessedBy.dataset.spec !== spec) {
        this._accessedBy.dataset.spec = spec;
        this._accessedBy.replaceChildren(
          ...locations.map(location => {
            const box = document.createElement('input');
            box.type = 'checkbox';
            box.value = location;
            box.addEventListener('change', () => this._setAccessedBy());
            const wrap = document.createElement('label');
            wrap.append(box, document.createTextNode(LABELS[location as CategoryName]));
            return wrap;
          })
        );
      }
      this._accessedBy.querySelectorAll('input').forEach(box => {
        box.checked = advice.accessed_by.includes(box.value);
        box.disabled = !usable;
      });
    }
    for (const control of [this._destination, this._firstPage, this._pageCount, this._readMostly, this._preferred]) {
      control.disabled = !usable;
    }
    (this._controls.querySelector('.jp-UvmLab-prefetch') as HTMLButtonElement).disabled = !usable;
  }

  // --- commands ---------------------------------------------------------------------------------

  private _prefetch(): void {
    const selected = this._selectedAllocation();
    if (!selected) {
      return;
    }
    const location = this._destination.value as Location;
    const first = this._firstPage.value === '' ? 0 : Number(this._firstPage.value);
    const count = this._pageCount.value === '' ? null : Number(this._pageCount.value);
    const where = LABELS[location as CategoryName] ?? location;
    const range = first === 0 && count === null ? '' : ` (pages ${first}–${count === null ? 'end' : first + count - 1})`;
    void this._run(`Prefetching ${selected.info.label}${range} to ${where}…`, `Prefetched ${selected.info.label}${range} to ${where}.`, () =>
      this.model.prefetch(selected.info.id, location, first, count)
    );
  }

  private _toggleReadMostly(): void {
    const selected = this._selectedAllocation();
    if (selected) {
      const value = !selected.info.advice.read_mostly;
      void this._run(`Setting ReadMostly ${value ? 'on' : 'off'}…`, `ReadMostly is ${value ? 'on' : 'off'} for ${selected.info.label}.`, () =>
        this.model.setAdvice(selected.info.id, 'read_mostly', value)
      );
    }
  }

  private _setPreferred(): void {
    const selected = this._selectedAllocation();
    if (selected) {
      const value = this._preferred.value || null;
      const what = value ? `PreferredLocation is ${LABELS[value as CategoryName] ?? value}` : 'PreferredLocation is unset';
      void this._run(`Setting PreferredLocation…`, `${what} for ${selected.info.label}.`, () =>
        this.model.setAdvice(selected.info.id, 'preferred_location', value)
      );
    }
  }

  private _setAccessedBy(): void {
    const selected = this._selectedAllocation();
    if (selected) {
      const value = [...this._accessedBy.querySelectorAll('input')].filter(box => box.checked).map(box => box.value);
      const what = value.length ? `AccessedBy is ${value.join(', ')}` : 'AccessedBy is unset';
      void this._run(`Setting AccessedBy…`, `${what} for ${selected.info.label}.`, () =>
        this.model.setAdvice(selected.info.id, 'accessed_by', value)
      );
    }
  }

  private _togglePause(): void {
    this._userPaused = !this._userPaused;
    this.model.setPaused(this._userPaused || this._hidden);
    this._result.textContent = this._userPaused ? 'Paused: the view holds what it last received.' : 'Resumed.';
    this._schedule();
  }

  private async _run(doing: string, done: string, command: () => Promise<Result>): Promise<void> {
    this._busy = true;
    this._result.textContent = doing;
    this._result.dataset.ok = '';
    this._schedule();
    try {
      const result = await command();
      this._result.textContent = resultText(result, done);
      this._result.dataset.ok = String(result.ok);
    } finally {
      this._busy = false;
      this._schedule();
    }
  }

  private _selectedAllocation(): IAllocation | undefined {
    return this._selected === null ? undefined : this.model.allocations.get(this._selected);
  }

  private _deviceCount(): number {
    return this.model.device?.device_count ?? 1;
  }

  private _kernelLine!: HTMLElement;
  private _pause!: HTMLButtonElement;
  private _rate!: HTMLSelectElement;
  private _notice!: HTMLElement;
  private _noticeText!: HTMLElement;
  private _list!: AllocationList;
  private _lanes!: DeviceLanes;
  private _lanesNote!: HTMLElement;
  private _timeline!: Timeline;
  private _cluster!: ClusterSection;
  private _sourceLines!: SourceLines;
  private _experiment!: HTMLDetailsElement;
  private _experimentTitle!: HTMLElement;
  private _experimentFrame!: HTMLIFrameElement;
  private _selectedTitle!: HTMLElement;
  private _legend!: HTMLElement;
  private _map!: PageMap;
  private _detail!: PageMap;
  private _detailTitle!: HTMLElement;
  private _detailRange: { id: number; first: number; pages: number } | null = null;
  private _detailAnswer: (IPageRange & { revision: number }) | null = null;
  private _detailError = '';
  private _detailInFlight = false;
  private _detailAgain = false;
  private _placement!: HTMLElement;
  private _traffic!: HTMLTableElement;
  private _controls!: HTMLElement;
  private _destination!: HTMLSelectElement;
  private _firstPage!: HTMLInputElement;
  private _pageCount!: HTMLInputElement;
  private _readMostly!: HTMLButtonElement;
  private _preferred!: HTMLSelectElement;
  private _accessedBy!: HTMLElement;
  private _result!: HTMLElement;
  private _status!: HTMLElement;
  private _cursor!: HTMLInputElement;
  private _cursorText!: HTMLElement;
  private _cursorLive = true;
  private _watching = '';
  private _cursorAt: number | null = null;
  private _history = new MapHistory();
  private _changed = new Set<number>(); // allocations an update or snapshot changed since the last drawing
  private _listedSelection: number | null | undefined = undefined;
  private _lanesKey = '';
  private _selectionKey: unknown[] = [];
  private _selected: number | null = null;
  private _legendSpec = '';
  private _busy = false;
  private _userPaused = false;
  private _hidden = true;
  private _frame = 0;
}

/** `part` of `whole` as a percentage; a share too small to show as 0.1% says so rather than read as none. */
function percent(part: number, whole: number): string {
  const value = (100 * part) / Math.max(whole, 1);
  return part > 0 && value < 0.1 ? '<0.1%' : `${value.toFixed(1)}%`;
}

function label(text: string): HTMLSpanElement {
  const node = document.createElement('span');
  node.className = 'jp-UvmLab-controlLabel';
  node.textContent = text;
  return node;
}

function numberInput(name: string, placeholder: string): HTMLInputElement {
  const input = document.createElement('input');
  input.type = 'number';
  input.min = '0';
  input.step = '1';
  input.placeholder = placeholder;
  input.className = 'jp-UvmLab-number';
  input.setAttribute('aria-label', name);
  return input;
}

function fillOptions(select: HTMLSelectElement, values: string[], fallback: string): void {
  if (values.join('|') === [...select.options].map(o => o.value).join('|')) {
    return;
  }
  const chosen = select.value;
  select.replaceChildren(
    ...values.map(value => {
      const option = document.createElement('option');
      option.value = value;
      option.textContent = value === '' ? 'none' : LABELS[value as CategoryName] ?? value;
      return option;
    })
  );
  select.value = values.includes(chosen) ? chosen : fallback;
}
