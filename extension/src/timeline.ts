/**
 * The timeline of the main-area view: one lane per allocation (in the list's order and filter),
 * every event of the window as a mark coloured by its cause (CAUSE_PALETTE). The view never holds
 * the event stream: it asks the kernel for the window it shows, at its width in pixels, and draws
 * the rows that come back (events narrower than a pixel arrive merged). The wheel zooms and a drag
 * pans (d3-zoom); hovering a mark says what it was; a click selects the mark's allocation.
 */

import { ISignal, Signal } from '@lumino/signaling';
import { ScaleLinear, scaleLinear } from 'd3-scale';
import { select } from 'd3-selection';
import { ZoomBehavior, ZoomTransform, zoom, zoomIdentity } from 'd3-zoom';

import { CAUSE_COLOURS, div, formatBytes, formatNs, kindName, placeHover, processorName } from './categories';
import { ITimeline, ITimelineSource } from './model';
import { CAUSE_NAMES, EVENT_KINDS } from './protocol';

const LANE_PX = 18;
const AXIS_PX = 22;
const LABEL_PX = 110;
/** The most lanes drawn at once; the rest are counted in the caption. */
const MAX_LANES_DRAWN = 60;
/** How soon to ask again for the same window and lanes (an update came, or an answer moved the window). */
const FOLLOW_MS = 1000;
/** While the timeline follows the kernel's clock, it is drawn again at most this often when only the clock moved. */
const FOLLOW_DRAW_MS = 100;

export class Timeline {
  constructor(
    readonly node: HTMLElement,
    private readonly _source: ITimelineSource,
    private readonly _onSelect: (id: number) => void,
    options: Timeline.IOptions = {}
  ) {
    node.classList.add('jp-UvmLab-timeline');
    const bar = div('jp-UvmLab-timelineBar');
    this._caption = div('jp-UvmLab-timelineCaption');
    this._live = document.createElement('button');
    this._live.type = 'button';
    this._live.className = 'jp-Button jp-mod-styled jp-UvmLab-live';
    this._live.textContent = options.showAllLabel ?? 'Follow live';
    this._live.title = options.showAllTitle ?? 'Show everything up to now, and keep following';
    this._live.addEventListener('click', () => this.followLive());
    bar.append(this._caption, this._live);
    this._canvas = document.createElement('canvas');
    this._canvas.className = 'jp-UvmLab-timelineCanvas';
    this._canvas.setAttribute('role', 'img');
    this._canvas.setAttribute('aria-label', 'Timeline of events by allocation');
    this._hover = div('jp-UvmLab-hover');
    this._hover.hidden = true;
    this._hover.setAttribute('role', 'tooltip');
    const box = div('jp-UvmLab-timelineBox');
    box.append(this._canvas, this._hover);
    node.append(bar, box);

    this._zoom = zoom<HTMLCanvasElement, unknown>()
      .scaleExtent([1, 1e9])
      .filter(event => !event.button && (event.type !== 'wheel' || !event.shiftKey))
      .on('start', (event: { sourceEvent: Event | null }) => {
        if (event.sourceEvent) {
          this._freeze();
        }
      })
      .on('zoom', (event: { transform: ZoomTransform; sourceEvent: Event | null }) => {
        this._transform = event.transform;
        this._requery();
        this._draw();
      });
    select(this._canvas).call(this._zoom);
    this._canvas.addEventListener('mousemove', event => this._onHover(event));
    this._canvas.addEventListener('mouseleave', () => (this._hover.hidden = true));
    this._canvas.addEventListener('click', event => {
      const rect = this._canvas.getBoundingClientRect();
      if (event.clientY - rect.top < AXIS_PX && event.clientX - rect.left >= LABEL_PX) {
        this._cursorRequested.emit(this._x().invert(event.clientX - rect.left));
        return;
      }
      const hit = this._hit(event);
      if (hit !== null && this._answer) {
        this._onSelect(this._answer.columns.lane[hit]);
      } else {
        const lane = this._laneAt(event);
        if (lane !== null && lane > 0) {
          this._onSelect(lane);
        }
      }
    });
  }

  /** The kernel answered for the window shown (its rows, and its by-source table). */
  get answered(): ISignal<this, ITimeline | null> {
    return this._answered;
  }

  /** A click on the time axis asks for the time cursor there (ns on the backend's clock). */
  get cursorRequested(): ISignal<this, number> {
    return this._cursorRequested;
  }

  /** Mark the time cursor at `time` (null: live, no mark). */
  setCursor(time: number | null): void {
    if (time !== this._cursor) {
      this._cursor = time;
      this._draw();
    }
  }

  /** The start of the oldest event the kernel holds (as last answered), in ns on the backend's clock. */
  get earliest(): number {
    return this._answer?.rows.first ?? this._source.earliest;
  }

  /** The window shown, in ns on the backend's clock. */
  get window(): [number, number] {
    const [a, b] = this._x().domain();
    return [a, b];
  }

  /** Whether the window follows the newest events. */
  get following(): boolean {
    return this._following;
  }

  /** Forget the rows held (the kernel they came from is gone). */
  clear(): void {
    if (this._answer) {
      this._answer = null;
      this._draw();
      this._answered.emit(null);
    }
  }

  /** Show everything up to now and follow it. */
  followLive(): void {
    this._following = true;
    this._frozen = null;
    select(this._canvas).call(this._zoom.transform, zoomIdentity);
  }

  /** Zoom by `factor` (> 1 in) about the middle of the window, as the wheel does about the pointer. */
  zoomBy(factor: number): void {
    this._freeze();
    select(this._canvas).call(this._zoom.scaleBy, factor, [LABEL_PX + (this._width - LABEL_PX) / 2, 0]);
    this._following = false;
  }

  /** Lay the timeline out for `lanes` (allocation ids, in order) and `width` pixels; ask for rows. */
  render(
    lanes: ReadonlyArray<number>,
    labelOf: (id: number) => string | undefined,
    selected: number | null,
    width: number
  ): void {
    this._lanes = [...lanes.slice(0, MAX_LANES_DRAWN), 0];
    this._hiddenLanes = Math.max(0, lanes.length - MAX_LANES_DRAWN);
    const labels = new Map<number, string>();
    for (const id of this._lanes) {
      const label = labelOf(id);
      if (label !== undefined) {
        labels.set(id, label);
      }
    }
    this._labels = labels;
    this._selected = selected;
    if (width !== this._width) {
      this._width = width;
      this._zoom.extent([
        [LABEL_PX, 0],
        [Math.max(LABEL_PX + 1, width), 1]
      ]);
      this._zoom.translateExtent([
        [LABEL_PX, -Infinity],
        [Math.max(LABEL_PX + 1, width), Infinity]
      ]);
    }
    // A new layout asks at once; otherwise (an update came) at most once a FOLLOW_MS: each answer costs the
    // kernel a pass over the events it holds, and updates come ten times a second while a loop runs.
    const layout = `${this._lanes.join()}|${width}`;
    if (layout !== this._layout) {
      this._layout = layout;
      this._requery();
    } else {
      this._askLater();
    }
    // Drawn again where the lanes, their labels or the selection changed; else, while it follows the kernel's
    // clock, a few times a second (each update moves "now" a little).
    const look = `${layout}|${[...this._labels.values()].join('\u0000')}|${selected}`;
    const now = performance.now();
    if (look !== this._look || (this._following && now - this._drawnAt >= FOLLOW_DRAW_MS)) {
      this._look = look;
      this._draw();
    }
  }

  /** The last event the rows held touch `[first, end)` of allocation `lane`, in words, or null. */
  lastEventAt(lane: number, first: number, end: number): string | null {
    const answer = this._answer;
    if (!answer) {
      return null;
    }
    const c = answer.columns;
    let best = -1;
    for (let i = 0; i < answer.rows.rows; i++) {
      if (c.lane[i] === lane && c.address[i] < end && c.reach[i] > first && (best < 0 || c.end[i] >= c.end[best])) {
        best = i;
      }
    }
    return best < 0 ? null : `${this._describe(best).split('\n')[0]} at ${formatNs(c.start[best])}`;
  }

  /** Stop the base moving with time: a window the user chose stays where it is. */
  private _freeze(): void {
    if (!this._frozen) {
      this._frozen = this._base();
    }
    this._following = false;
  }

  /** The base scale: everything held, from the kernel's first sample (or 0) to now; or where the user froze it. */
  private _base(): ScaleLinear<number, number> {
    if (this._frozen) {
      return this._frozen.copy().range([LABEL_PX, Math.max(LABEL_PX + 1, this._width)]);
    }
    // Everything the kernel holds: from its oldest event to the newest event or sample.
    const extent = this._answer?.rows;
    const first = extent ? extent.first : this._source.earliest;
    const now = Math.max(this._source.now, extent?.last ?? 0, first + 1);
    return scaleLinear()
      .domain([first, now])
      .range([LABEL_PX, Math.max(LABEL_PX + 1, this._width)]);
  }

  private _x(): ScaleLinear<number, number> {
    return this._transform.rescaleX(this._base());
  }

  /** Ask for the window's rows; one query at a time, the latest wish asked once the answer is in. */
  private _requery(): void {
    if (!this._source.ready || this._width <= LABEL_PX) {
      return;
    }
    if (this._inFlight) {
      this._again = true;
      return;
    }
    const [a, b] = this._x().domain();
    const start = Math.max(0, Math.floor(a));
    const end = Math.max(start + 1, Math.ceil(b));
    const width = Math.min(16384, Math.max(1, Math.round(this._width - LABEL_PX)));
    this._inFlight = true;
    void this._source.queryTimeline(start, end, width, this._lanes).then(answer => {
      this._inFlight = false;
      if ('columns' in answer) {
        const before = this._base().domain().join();
        this._answer = answer;
        this._draw();
        this._answered.emit(answer);
        if (!this._frozen && this._base().domain().join() !== before) {
          // The kernel's extent moved the window: ask for what it shows now, but not at once. While a loop
          // runs every answer moves it, and asking back to back kept the kernel answering all the time;
          // each update asks anyway, and this covers a kernel gone quiet.
          this._askLater();
        }
      } else {
        this._caption.textContent = `Timeline: ${answer.error?.message ?? 'no answer'}`;
      }
      if (this._again) {
        this._again = false;
        this._requery();
      }
    });
  }

  private _askLater(): void {
    if (this._later === null) {
      this._later = window.setTimeout(() => {
        this._later = null;
        this._requery();
      }, FOLLOW_MS);
    }
  }

  private _draw(): void {
    this._drawnAt = performance.now();
    const canvas = this._canvas;
    const width = this._width;
    const height = AXIS_PX + this._lanes.length * LANE_PX;
    const ratio = window.devicePixelRatio || 1;
    if (width <= LABEL_PX) {
      return;
    }
    canvas.width = width * ratio;
    canvas.height = height * ratio;
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    const ctx = canvas.getContext('2d');
    if (!ctx) {
      return;
    }
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const style = getComputedStyle(this.node);
    const ink = style.getPropertyValue('--jp-ui-font-color1').trim() || 'black';
    const faint = style.getPropertyValue('--jp-border-color2').trim() || 'lightgrey';
    const selectedFill = style.getPropertyValue('--jp-layout-color2').trim() || 'whitesmoke';
    ctx.font = '11px var(--jp-ui-font-family), sans-serif';
    ctx.textBaseline = 'middle';
    const x = this._x();
    // Lanes: labels, the selected one shaded.
    this._lanes.forEach((lane, i) => {
      const y = AXIS_PX + i * LANE_PX;
      if (lane === this._selected) {
        ctx.fillStyle = selectedFill;
        ctx.fillRect(0, y, width, LANE_PX);
      }
      ctx.fillStyle = ink;
      const label = lane === 0 ? 'no allocation' : this._labels.get(lane) ?? `#${lane} (freed)`;
      ctx.fillText(label.length > 16 ? label.slice(0, 15) + '…' : label, 4, y + LANE_PX / 2);
      ctx.fillStyle = faint;
      ctx.fillRect(LABEL_PX, y + LANE_PX - 1, width - LABEL_PX, 1);
    });
    // The axis: d3's ticks, in the time unit that reads best.
    ctx.fillStyle = ink;
    for (const tick of x.ticks(Math.max(2, Math.floor((width - LABEL_PX) / 110)))) {
      const px = x(tick);
      ctx.fillRect(px, AXIS_PX - 5, 1, 5);
      ctx.fillText(formatNs(tick), px + 2, AXIS_PX / 2 - 2);
    }
    // The rows the kernel sent.
    const answer = this._answer;
    const counts = new Array<number>(CAUSE_NAMES.length).fill(0);
    const byKind = new Map<number, number>();
    let drawn = 0;
    if (answer) {
      const c = answer.columns;
      const laneIndex = new Map(this._lanes.map((lane, i) => [lane, i]));
      ctx.save();
      ctx.beginPath();
      ctx.rect(LABEL_PX, AXIS_PX, width - LABEL_PX, height - AXIS_PX);
      ctx.clip();
      for (let i = 0; i < answer.rows.rows; i++) {
        const index = laneIndex.get(c.lane[i]);
        if (index === undefined) {
          continue;
        }
        const x0 = x(c.start[i]);
        const x1 = Math.max(x0 + 2, x(c.end[i]));
        if (x1 < LABEL_PX || x0 > width) {
          continue;
        }
        const cause = c.cause[i] < CAUSE_NAMES.length ? c.cause[i] : CAUSE_NAMES.indexOf('inferred');
        const rgba = CAUSE_COLOURS.subarray(4 * cause, 4 * cause + 3);
        ctx.fillStyle = `rgb(${rgba[0]}, ${rgba[1]}, ${rgba[2]})`;
        ctx.fillRect(x0, AXIS_PX + index * LANE_PX + 3, x1 - x0, LANE_PX - 6);
        counts[cause] += c.count[i];
        byKind.set(c.kind[i], (byKind.get(c.kind[i]) ?? 0) + c.count[i]);
        drawn++;
      }
      ctx.restore();
    }
    // The time cursor, where it is not live.
    if (this._cursor !== null) {
      const px = x(this._cursor);
      if (px >= LABEL_PX && px <= width) {
        ctx.fillStyle = ink;
        ctx.fillRect(Math.round(px) - 1, 0, 2, height);
      }
    }
    this.node.dataset.cursor = this._cursor === null ? 'live' : String(Math.round(this._cursor));
    const [a, b] = x.domain();
    this.node.dataset.rows = String(drawn);
    this.node.dataset.start = String(Math.round(a));
    this.node.dataset.end = String(Math.round(b));
    this.node.dataset.following = String(this._following);
    // Events drawn per cause, for a reader (and a test) to compare with the kernel: `data-causes`.
    this.node.dataset.causes = CAUSE_NAMES.map((name, i) => `${name}=${counts[i]}`).join(';');
    // ... and per kind, those drawn: `data-kinds`, such as "HtoD=3;DtoD=2".
    this.node.dataset.kinds = [...byKind]
      .sort(([a], [b]) => a - b)
      .map(([kind, n]) => `${EVENT_KINDS[kind] ? kindName(EVENT_KINDS[kind]) : `kind ${kind}`}=${n}`)
      .join(';');
    const parts = [`${formatNs(b - a)} shown`, `${drawn} marks`];
    if (answer) {
      parts.push(`${answer.rows.events} events`);
      if (answer.rows.dropped) {
        parts.push(`${answer.rows.dropped} oldest events no longer held`);
      }
      if (answer.rows.missed) {
        parts.push(`${answer.rows.missed} events missed while the view fell behind`);
      }
      if (answer.rows.truncated) {
        parts.push(`${answer.rows.truncated} rows left out`);
      }
    }
    if (this._hiddenLanes) {
      parts.push(`${this._hiddenLanes} more allocations not drawn (filter the list)`);
    }
    this._caption.textContent = parts.join(' · ');
  }

  private _laneAt(event: MouseEvent): number | null {
    const rect = this._canvas.getBoundingClientRect();
    const index = Math.floor((event.clientY - rect.top - AXIS_PX) / LANE_PX);
    return index >= 0 && index < this._lanes.length ? this._lanes[index] : null;
  }

  /** The row under the pointer (the latest one there), or null. */
  private _hit(event: MouseEvent): number | null {
    const answer = this._answer;
    const lane = this._laneAt(event);
    if (!answer || lane === null) {
      return null;
    }
    const rect = this._canvas.getBoundingClientRect();
    const px = event.clientX - rect.left;
    if (px < LABEL_PX) {
      return null;
    }
    const x = this._x();
    const c = answer.columns;
    let hit: number | null = null;
    for (let i = 0; i < answer.rows.rows; i++) {
      if (c.lane[i] !== lane) {
        continue;
      }
      const x0 = x(c.start[i]);
      const x1 = Math.max(x0 + 2, x(c.end[i]));
      if (px >= x0 - 1 && px <= x1 + 1) {
        hit = i;
      }
    }
    return hit;
  }

  private _describe(i: number): string {
    const c = this._answer!.columns;
    const raw = EVENT_KINDS[c.kind[i]];
    const kind = raw ? kindName(raw) : `kind ${c.kind[i]}`;
    const cause = CAUSE_NAMES[c.cause[i]] ?? 'inferred';
    const count = c.count[i];
    // Where: a move's way, a fault's processor; nothing for what has no place (an allocation, advice).
    const where = raw?.endsWith('PAGE_FAULT')
      ? `on ${processorName(c.dst[i])}`
      : ['HTOD', 'DTOH', 'DTOD', 'PREFETCH', 'REMOTE_MAP', 'UNOBSERVED'].includes(raw ?? '')
        ? `${processorName(c.src[i])} → ${processorName(c.dst[i])}`
        : '';
    const lines = [
      `${kind}${count > 1 ? ` ×${count}` : ''} · ${cause}`,
      `${formatBytes(c.bytes[i])} · ${Math.ceil(c.bytes[i] / 4096)} pages`,
      ...(where ? [where] : []),
      `at ${formatNs(c.start[i])}, for ${formatNs(c.end[i] - c.start[i])}`,
      // The line of code it came from: what no other memory tool shows.
      c.source[i] ? `from ${this._answer!.rows.sources[String(c.source[i])] ?? 'an unknown line'}` : 'from: not known'
    ];
    return lines.join('\n');
  }

  private _onHover(event: MouseEvent): void {
    const hit = this._hit(event);
    if (hit === null) {
      this._hover.hidden = true;
      return;
    }
    const lane = this._answer!.columns.lane[hit];
    this._hover.textContent = `${this._labels.get(lane) ?? (lane ? `#${lane}` : 'no allocation')}\n${this._describe(hit)}`;
    this._hover.hidden = false;
    // Fixed (to the view): the lanes' scroll box must not clip it.
    placeHover(this._hover, event);
  }

  private _caption: HTMLElement;
  private _live: HTMLButtonElement;
  private _canvas: HTMLCanvasElement;
  private _hover: HTMLElement;
  private _zoom: ZoomBehavior<HTMLCanvasElement, unknown>;
  private _transform: ZoomTransform = zoomIdentity;
  private _following = true;
  private _frozen: ScaleLinear<number, number> | null = null;
  private _width = 0;
  private _lanes: number[] = [0];
  private _hiddenLanes = 0;
  private _labels: ReadonlyMap<number, string> = new Map();
  private _look = '';
  private _drawnAt = 0;
  private _selected: number | null = null;
  private _answer: ITimeline | null = null;
  private _answered = new Signal<this, ITimeline | null>(this);
  private _cursorRequested = new Signal<this, number>(this);
  private _cursor: number | null = null;
  private _inFlight = false;
  private _again = false;
  private _later: number | null = null;
  private _layout = '';
}

export namespace Timeline {
  export interface IOptions {
    /** The button that shows the whole extent: its text and title (the live view: "Follow live"). */
    showAllLabel?: string;
    showAllTitle?: string;
  }
}
