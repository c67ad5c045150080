/**
 * The device lanes: memory in use against capacity (and what is allocated, so oversubscription
 * shows), bytes moved each way, faults, and bytes evicted, per update interval, on one time axis
 * (the backend's clock, the timeline's). Drawn with uPlot, one chart per lane, cursors in step.
 *
 * Every GPU is drawn: a memory chart each, and a series each in the other charts, in the GPU's
 * colour, the kinds of move told apart by dash (HtoD solid, DtoH dashed, DtoD dotted). With one
 * GPU the charts are as they always were.
 */

import uPlot from 'uplot';

import { formatBytes, formatNs } from './categories';
import { CategoryName, DeviceSample } from './protocol';
import { CAUSE_PALETTE, PALETTE } from './palette';

/** A sample's measured fields (all but its time). */
export type SampleField = Exclude<keyof DeviceSample, 'time'>;

type Series = {
  label: string;
  colour: string;
  field: SampleField;
  /** The GPU whose entry a per-GPU field's series draws. */
  gpu?: number;
  fill?: boolean;
  dash?: number[];
};

type Lane = {
  title: string;
  unit: 'bytes' | 'count';
  series: Series[];
};

const CAPACITY_DASH = [4, 4];
const DTOH_DASH = [6, 3];
const DTOD_DASH = [1.5, 3];

/** A GPU's colour; past the palette's GPUs, "unknown"'s, as a page there reads. */
function gpuColour(gpu: number): string {
  return PALETTE[`gpu:${gpu}` as CategoryName] ?? PALETTE['unknown'];
}

/** The lanes of samples of `gpus` GPUs; `fields`: those the samples know (null: all). */
function lanesFor(gpus: number, fields: ReadonlyArray<SampleField> | null): Lane[] {
  const known = (field: SampleField) => !fields || fields.includes(field);
  const ids = Array.from({ length: gpus }, (_, gpu) => gpu);
  const one = gpus === 1;
  const memory = (title: string, gpu: number, used: string): Lane => ({
    title,
    unit: 'bytes',
    series: [
      { label: 'used', colour: used, field: 'used', gpu, fill: true },
      { label: 'allocated', colour: PALETTE['host'], field: 'allocated' },
      { label: 'capacity', colour: PALETTE['gpus'], field: 'total', gpu, dash: CAPACITY_DASH }
    ]
  });
  // A memory chart per GPU where memory is known (a trace knows only what is allocated: one chart).
  const memoryLanes =
    one || !(known('used') || known('total'))
      ? [memory('Device memory', 0, PALETTE['gpu:0'])]
      : ids.map(gpu => memory(`GPU ${gpu} memory`, gpu, gpuColour(gpu)));
  const lanes: Lane[] = [
    ...memoryLanes,
    {
      title: 'Moved per interval',
      unit: 'bytes',
      // One GPU: coloured by where the bytes went. Several: by GPU, the way by dash; peers only where there are.
      series: one
        ? [
            { label: 'HtoD', colour: PALETTE['gpu:0'], field: 'htod_bytes', gpu: 0 },
            { label: 'DtoH', colour: PALETTE['host'], field: 'dtoh_bytes', gpu: 0 }
          ]
        : ([] as Series[]).concat(
            ...ids.map((gpu): Series[] => [
              { label: `HtoD to GPU ${gpu}`, colour: gpuColour(gpu), field: 'htod_bytes', gpu },
              { label: `DtoH from GPU ${gpu}`, colour: gpuColour(gpu), field: 'dtoh_bytes', gpu, dash: DTOH_DASH },
              { label: `DtoD to GPU ${gpu}`, colour: gpuColour(gpu), field: 'dtod_bytes', gpu, dash: DTOD_DASH }
            ])
          )
    },
    {
      title: 'Faults per interval',
      unit: 'count',
      series: [
        ...(one
          ? [{ label: 'GPU', colour: PALETTE['gpu:0'], field: 'gpu_faults' as const, gpu: 0 }]
          : ids.map(gpu => ({ label: `GPU ${gpu}`, colour: gpuColour(gpu), field: 'gpu_faults' as const, gpu }))),
        { label: 'CPU', colour: PALETTE['host'], field: 'cpu_faults' }
      ]
    },
    {
      title: 'Evicted per interval',
      unit: 'bytes',
      series: one
        ? [{ label: 'evicted', colour: CAUSE_PALETTE['eviction'], field: 'evicted_bytes', gpu: 0, fill: true }]
        : ids.map(gpu => ({ label: `GPU ${gpu}`, colour: gpuColour(gpu), field: 'evicted_bytes' as const, gpu, fill: true }))
    }
  ];
  return lanes.map(lane => ({ ...lane, series: lane.series.filter(s => known(s.field)) })).filter(lane => lane.series.length);
}

/** What `series` draws of `sample`: its GPU's entry of a per-GPU field (null where the sample has none). */
function valueOf(sample: DeviceSample, series: Series): number | null {
  const value = sample[series.field];
  return typeof value === 'number' ? value : value[series.gpu ?? 0] ?? null;
}

/** The GPUs the samples list (the most any does), at least one. */
function gpusOf(samples: ReadonlyArray<DeviceSample>): number {
  return samples.reduce((most, s) => Math.max(most, s.used.length), 1);
}

const sum = (values: ReadonlyArray<number>) => values.reduce((a, b) => a + b, 0);

const SYNC_KEY = 'uvm-lab-lanes';

export class DeviceLanes {
  /** `fields`: the ones the samples know (a trace knows no memory in use); a series of another is left out. */
  constructor(
    readonly node: HTMLElement,
    private readonly _fields: ReadonlyArray<SampleField> | null = null
  ) {
    node.classList.add('jp-UvmLab-lanes');
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
    const gpus = gpusOf(samples);
    if (gpus !== this._gpus) {
      // Another device (a new backend): its lanes.
      this.dispose();
      this._gpus = gpus;
      this._lanes = lanesFor(gpus, this._fields);
    }
    if (!this._plots.length) {
      this._plots = this._lanes.map(lane => this._makePlot(lane, width));
    }
    this._plots.forEach((plot, i) => {
      const lane = this._lanes[i];
      const data = [xs, ...lane.series.map(s => samples.map(sample => valueOf(sample, s)))] as uPlot.AlignedData;
      plot.setData(data, !window);
      if (window) {
        plot.setScale('x', { min: window[0], max: window[1] });
      }
      if (plot.width !== width) {
        plot.setSize({ width, height: HEIGHT });
      }
    });
    this.node.dataset.samples = String(samples.length);
    this.node.dataset.gpus = String(gpus);
    const last = samples[samples.length - 1];
    if (last) {
      // Over every GPU.
      const total = sum(last.total);
      this.node.dataset.used = String(sum(last.used));
      this.node.dataset.total = String(total);
      this.node.dataset.allocated = String(last.allocated);
      this.node.dataset.oversubscribed = String(last.allocated > total);
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
    this._holders.forEach(holder => holder.remove());
    this._holders = [];
  }

  private _makePlot(lane: Lane, width: number): uPlot {
    const holder = document.createElement('div');
    holder.className = 'jp-UvmLab-lane';
    holder.dataset.lane = lane.title;
    this.node.appendChild(holder);
    this._holders.push(holder);
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

  private _gpus = 0;
  private _lanes: Lane[] = [];
  private _plots: uPlot[] = [];
  private _holders: HTMLElement[] = [];
  private _cursor: number | null = null;
}

const HEIGHT = 90;

/** What was moved and faulted per interval, per GPU. */
const SUMMED = ['htod_bytes', 'dtoh_bytes', 'dtod_bytes', 'gpu_faults', 'evicted_bytes'] as const;

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
      const merged = { ...sample, time: last.time, cpu_faults: last.cpu_faults + sample.cpu_faults };
      SUMMED.forEach(field => (merged[field] = addLists(last[field], sample[field])));
      out[out.length - 1] = merged;
    } else {
      out.push(sample);
    }
  }
  return out;
}

/** Entry by entry, as long as the longer (a GPU one lacks adds nothing). */
function addLists(a: ReadonlyArray<number>, b: ReadonlyArray<number>): number[] {
  return Array.from({ length: Math.max(a.length, b.length) }, (_, i) => (a[i] ?? 0) + (b[i] ?? 0));
}
