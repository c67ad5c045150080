/**
 * The device lanes: memory in use against capacity (and what is allocated, so oversubscription
 * shows), bytes moved each way, faults, and bytes evicted, per update interval, on one time axis
 * (the backend's clock, the timeline's). Drawn with uPlot, one chart per lane, cursors in step.
 */

import uPlot from 'uplot';

import { formatBytes, formatNs } from './categories';
import { DeviceSample } from './protocol';
import { CAUSE_PALETTE, PALETTE } from './palette';

/** A sample's measured fields (all but its time). */
export type SampleField = Exclude<keyof DeviceSample, 'time'>;

type Lane = {
  title: string;
  unit: 'bytes' | 'count';
  series: { label: string; colour: string; field: SampleField; fill?: boolean; dash?: number[] }[];
};

const LANES: Lane[] = [
  {
    title: 'Device memory',
    unit: 'bytes',
    series: [
      { label: 'used', colour: PALETTE['gpu:0'], field: 'used', fill: true },
      { label: 'allocated', colour: PALETTE['host'], field: 'allocated' },
      { label: 'capacity', colour: PALETTE['gpus'], field: 'total', dash: [4, 4] }
    ]
  },
  {
    title: 'Moved per interval',
    unit: 'bytes',
    // Coloured by where the bytes went.
    series: [
      { label: 'HtoD', colour: PALETTE['gpu:0'], field: 'htod_bytes' },
      { label: 'DtoH', colour: PALETTE['host'], field: 'dtoh_bytes' }
    ]
  },
  {
    title: 'Faults per interval',
    unit: 'count',
    series: [
      { label: 'GPU', colour: PALETTE['gpu:0'], field: 'gpu_faults' },
      { label: 'CPU', colour: PALETTE['host'], field: 'cpu_faults' }
    ]
  },
  {
    title: 'Evicted per interval',
    unit: 'bytes',
    series: [{ label: 'evicted', colour: CAUSE_PALETTE['eviction'], field: 'evicted_bytes', fill: true }]
  }
];

const SYNC_KEY = 'uvm-lab-lanes';

export class DeviceLanes {
  /** `fields`: the ones the samples know (a trace knows no memory in use); a series of another is left out. */
  constructor(
    readonly node: HTMLElement,
    fields: ReadonlyArray<SampleField> | null = null
  ) {
    node.classList.add('jp-UvmLab-lanes');
    this._lanes = LANES.map(lane => ({ ...lane, series: lane.series.filter(s => !fields || fields.includes(s.field)) })).filter(
      lane => lane.series.length
    );
  }

  /** Draw `samples` (oldest first) over [start, end] ns, or over all of them when no window is given. */
  render(given: ReadonlyArray<DeviceSample>, window: [number, number] | null, fullWidth: number): void {
    if (fullWidth < 50) {
      return;
    }
    const samples = atDistinctTimes(given);
    // Two lanes a row where there is room.
    const width = fullWidth >= 700 ? Math.floor(fullWidth / 2) - 8 : fullWidth;
    const xs = samples.map(s => s.time);
    if (!this._plots.length) {
      this._plots = this._lanes.map(lane => this._makePlot(lane, width));
    }
    this._plots.forEach((plot, i) => {
      const lane = this._lanes[i];
      const data: uPlot.AlignedData = [xs, ...lane.series.map(s => samples.map(sample => sample[s.field]))];
      plot.setData(data, !window);
      if (window) {
        plot.setScale('x', { min: window[0], max: window[1] });
      }
      if (plot.width !== width) {
        plot.setSize({ width, height: HEIGHT });
      }
    });
    this.node.dataset.samples = String(samples.length);
    const last = samples[samples.length - 1];
    if (last) {
      this.node.dataset.used = String(last.used);
      this.node.dataset.total = String(last.total);
      this.node.dataset.allocated = String(last.allocated);
      this.node.dataset.oversubscribed = String(last.allocated > last.total);
    }
  }

  /** Mark the time cursor at `time` on every lane (null: live, no mark). */
  setCursor(time: number | null): void {
    if (time !== this._cursor) {
      this._cursor = time;
      this._plots.forEach(plot => plot.redraw(false, false));
    }
  }

  dispose(): void {
    this._plots.forEach(plot => plot.destroy());
    this._plots = [];
  }

  private _makePlot(lane: Lane, width: number): uPlot {
    const holder = document.createElement('div');
    holder.className = 'jp-UvmLab-lane';
    holder.dataset.lane = lane.title;
    this.node.appendChild(holder);
    const format = lane.unit === 'bytes' ? formatBytes : (n: number) => String(Math.round(n));
    // A canvas cannot read CSS variables: the theme's colour, resolved.
    const ink = getComputedStyle(this.node).getPropertyValue('--jp-ui-font-color2').trim() || 'grey';
    const opts: uPlot.Options = {
      title: lane.title,
      width,
      height: HEIGHT,
      cursor: { sync: { key: SYNC_KEY }, drag: { x: false, y: false } },
      legend: { live: true },
      hooks: { draw: [plot => this._drawCursor(plot)] },
      scales: { x: { time: false } },
      axes: [
        // space (px between ticks): room for a label such as "250.0 ms", so neighbours never run together; and
        // on a lane this low, room for two values or more, not 0 alone.
        { values: (_u, ticks) => ticks.map(t => formatNs(t)), size: 30, space: 80, stroke: ink },
        { values: (_u, ticks) => ticks.map(format), size: 70, space: 20, stroke: ink }
      ],
      series: [
        { label: 'time', value: (_u, v) => (v === null ? '—' : formatNs(v)) },
        ...lane.series.map(s => ({
          label: s.label,
          stroke: s.colour,
          width: 1.5,
          dash: s.dash,
          fill: s.fill ? s.colour + '40' : undefined,
          paths: lane.unit === 'count' || lane.title.includes('per interval') ? uPlot.paths.stepped?.({ align: 1 }) : undefined,
          value: (_u: uPlot, v: number | null) => (v === null ? '—' : format(v))
        }))
      ]
    };
    return new uPlot(opts, [[], ...lane.series.map(() => [])], holder);
  }

  /** The time cursor's line, over the plotting area. */
  private _drawCursor(plot: uPlot): void {
    if (this._cursor === null) {
      return;
    }
    const x = plot.valToPos(this._cursor, 'x', true);
    const { left, top, width, height } = plot.bbox;
    if (x < left || x > left + width) {
      return;
    }
    const ctx = plot.ctx;
    ctx.save();
    ctx.fillStyle = getComputedStyle(this.node).getPropertyValue('--jp-ui-font-color1').trim() || 'black';
    ctx.fillRect(Math.round(x) - 1, top, 2 * (window.devicePixelRatio || 1), height);
    ctx.restore();
  }

  private _lanes: Lane[];
  private _plots: uPlot[] = [];
  private _cursor: number | null = null;
}

const HEIGHT = 90;

/** What was moved and faulted per interval. */
const SUMMED = ['htod_bytes', 'dtoh_bytes', 'gpu_faults', 'cpu_faults', 'evicted_bytes'] as const;

/**
 * Samples at one time each: a clock that stood still between samples (an idle simulator's) makes them one,
 * its traffic summed and its memory the last one's. A chart cannot place two values at one time.
 */
function atDistinctTimes(samples: ReadonlyArray<DeviceSample>): ReadonlyArray<DeviceSample> {
  if (samples.every((s, i) => i === 0 || s.time > samples[i - 1].time)) {
    return samples;
  }
  const out: DeviceSample[] = [];
  for (const sample of samples) {
    const last = out[out.length - 1];
    if (last && sample.time <= last.time) {
      const merged = { ...sample, time: last.time };
      SUMMED.forEach(field => (merged[field] = last[field] + sample[field]));
      out[out.length - 1] = merged;
    } else {
      out.push(sample);
    }
  }
  return out;
}
