/**
 * The comm protocol between the UVM Lab panel and the kernel.
 *
 * Twin of `uvm_lab/jupyter/protocol.py`: each type here has the same name and the same fields
 * as a TypedDict there (a unit test on the Python side compares the two files). Read that
 * module's docstring for the full story; in short, the panel sends only `Command`s, the kernel
 * answers each with a `Result`, and pushes `Snapshot`, `Update` and `Removed`. Residency comes
 * as binary buffers, the i-th buffer for `allocations[i]`, one byte per page or per cell of
 * `cell_pages` pages: the code of the page's (or most of the cell's pages') category; in an
 * update, mostly only the runs of cells that changed (`encoding: 'runs'`, `applyRuns`). The
 * timeline is asked for (`Timeline`) and comes back as binary columns (`TIMELINE_COLUMNS`). A Dask
 * cluster's workers come as `Cluster`; what the view asks of one worker names it by address
 * (`WorkerCommand`, `WorkerTimeline`, `WorkerBuffers`) and the kernel routes it there.
 */

export const COMM_TARGET = 'uvm_lab';
export const PROTOCOL_VERSION = 7;

/** The update interval a view may ask for, in milliseconds: [least, most]. */
export const RATE_LIMITS_MS = [50, 10000] as const;
/** The widest timeline a view may ask for, in pixels. */
export const MAX_WIDTH = 16384;
/** The most lanes one timeline query may name. */
export const MAX_LANES = 4096;

/**
 * Why each event happened, by code, as `uvm_lab.events.causes.CAUSE_NAMES`: the timeline's
 * `cause` column indexes this list.
 */
export const CAUSE_NAMES = [
  'demand fault',
  'prefetch',
  'eviction',
  'coherence',
  'thrashing',
  'remote map',
  'inferred',
  'allocation',
  'advice'
] as const;

export type CauseName = (typeof CAUSE_NAMES)[number];

/** What each `kind` of an event record is called, as `uvm_lab.events.EventKind`. */
export const EVENT_KINDS: Readonly<Record<number, string>> = {
  1: 'HTOD',
  2: 'DTOH',
  3: 'CPU_PAGE_FAULT',
  4: 'GPU_PAGE_FAULT',
  5: 'THRASHING',
  6: 'THROTTLING',
  7: 'REMOTE_MAP',
  8: 'DTOD',
  16: 'SEGMENT_ALLOC',
  17: 'SEGMENT_FREE',
  18: 'ALLOC',
  19: 'FREE',
  20: 'ALLOC_FAILURE',
  21: 'POOL_GROW',
  22: 'PREFETCH',
  23: 'ADVICE',
  24: 'INVALIDATE',
  25: 'UNOBSERVED',
  26: 'RESIDENCY',
  27: 'ACCESS'
};

/** The timeline's columns, in the order of its buffers, with their types (numpy's spelling). */
export const TIMELINE_COLUMNS = [
  ['start', '<f8'],
  ['end', '<f8'],
  ['lane', '<f8'],
  ['kind', 'u1'],
  ['cause', 'u1'],
  ['src', '<i2'],
  ['dst', '<i2'],
  ['bytes', '<f8'],
  ['address', '<f8'],
  ['reach', '<f8'],
  ['source', '<u4'],
  ['count', '<u4']
] as const;

/**
 * The page categories by code, as `uvm_lab.page_states.CATEGORY_NAMES`: a residency byte indexes
 * this list. The kernel sorts pages into them; the panel never sees a page state's bits.
 */
export const CATEGORY_NAMES = [
  'nowhere',
  'host',
  'both',
  'unknown',
  'gpus',
  'gpu:0',
  'gpu:1',
  'gpu:2',
  'gpu:3',
  'gpu:4',
  'gpu:5'
] as const;

export type CategoryName = (typeof CATEGORY_NAMES)[number];

/** "host", "gpu" (the current device) or "gpu:N"; whether GPU N exists, the kernel answers. */
export type Location = 'host' | 'gpu' | `gpu:${number}`;
export type AdviceName = 'read_mostly' | 'preferred_location' | 'accessed_by';

// --- front end -> kernel ----------------------------------------------------------------------

export type Hello = {
  type: 'hello';
  seq: number;
};

export type Prefetch = {
  type: 'prefetch';
  seq: number;
  id: number;
  location: Location;
  first_page: number;
  pages: number | null;
};

export type SetAdvice = {
  type: 'set_advice';
  seq: number;
  id: number;
  advice: AdviceName;
  value: boolean | string | string[] | null;
};

export type Pause = {
  type: 'pause';
  seq: number;
  paused: boolean;
};

export type Rate = {
  type: 'rate';
  seq: number;
  interval_ms: number;
};

export type Timeline = {
  type: 'timeline';
  seq: number;
  start: number;
  end: number;
  width: number;
  lanes: number[] | null;
};

export type Pages = {
  type: 'pages';
  seq: number;
  id: number;
  first_page: number;
  /** At most the snapshot's cell_limit: one byte a page. */
  pages: number;
};

/** The allocations whose maps the view shows (null: all): those are read whenever they change. */
export type Watch = {
  type: 'watch';
  seq: number;
  ids: number[] | null;
};

/** A prefetch or advice carried out on Dask worker `worker`, which owns the buffer. */
export type WorkerCommand = {
  type: 'worker_command';
  seq: number;
  worker: string;
  command: Prefetch | SetAdvice;
};

/** Worker `worker`'s events of [start, end] ns (its backend's clock), for a view `width` pixels wide. */
export type WorkerTimeline = {
  type: 'worker_timeline';
  seq: number;
  worker: string;
  start: number;
  end: number;
  width: number;
};

export type WorkerBuffers = {
  type: 'worker_buffers';
  seq: number;
  worker: string;
};

export type Command = Hello | Prefetch | SetAdvice | Pause | Rate | Timeline | Pages | Watch | WorkerCommand | WorkerTimeline | WorkerBuffers;

// --- kernel -> front end ----------------------------------------------------------------------

export type AdviceState = {
  read_mostly: boolean;
  preferred_location: string | null;
  accessed_by: string[];
};

/** Pages per category, every one of `CATEGORY_NAMES` (zero included), exact even when cells are coarser. */
export type PageCounts = {
  nowhere: number;
  host: number;
  both: number;
  unknown: number;
  gpus: number;
  'gpu:0': number;
  'gpu:1': number;
  'gpu:2': number;
  'gpu:3': number;
  'gpu:4': number;
  'gpu:5': number;
};

/** Faults and bytes moved in an allocation since it was made, in all and per cause (CAUSE_NAMES). */
export type Traffic = {
  faults: number;
  htod_bytes: number;
  dtoh_bytes: number;
  /** Moved between GPUs (peer migrations). */
  dtod_bytes: number;
  by_cause: [number, number, number, number][];
};

export type AllocationInfo = {
  id: number;
  label: string;
  address: number;
  size: number;
  is_managed: boolean;
  advice: AdviceState;
  pages: number;
  cell_pages: number;
  cells: number;
  counts: PageCounts;
  encoding: 'cells' | 'runs';
  traffic: Traffic;
  requested: string | null;
};

export type DeviceMemory = {
  free: number;
  total: number;
};

export type DeviceInfo = {
  backend: string;
  device_count: number;
  /** The current GPU's. */
  free: number;
  total: number;
  /** Each GPU's, by ordinal. */
  devices: DeviceMemory[];
};

/**
 * One update interval of the device lanes, stamped on the backend's clock (the timeline's). Lists are
 * per GPU, by ordinal, all of one length; the rest is one number.
 */
export type DeviceSample = {
  time: number;
  /** Bytes of each GPU's memory in use (0 where not known: a trace's). */
  used: number[];
  total: number[];
  /** Bytes of the live allocations: more than the capacity is oversubscription. */
  allocated: number;
  /** Into each GPU from the host. */
  htod_bytes: number[];
  /** Out of each GPU to the host, evictions included. */
  dtoh_bytes: number[];
  /** Into each GPU from a peer GPU. */
  dtod_bytes: number[];
  gpu_faults: number[];
  cpu_faults: number;
  evicted_bytes: number[];
};

export type Snapshot = {
  type: 'snapshot';
  version: number;
  /** ns on the backend's clock: the maps were read at this time (or just after). */
  time: number;
  page_size: number;
  cell_limit: number;
  device: DeviceInfo;
  allocations: AllocationInfo[];
  samples: DeviceSample[];
  samples_dropped: number;
};

export type Update = {
  type: 'update';
  time: number;
  /** Read when a device sample closes, and sent with it; absent: as last sent. */
  device?: DeviceInfo;
  allocations: AllocationInfo[];
  samples: DeviceSample[];
  /** The kernel's wall clock (ms since the epoch) when it read the maps sent: older changes are in. */
  clock: number;
};

export type Removed = {
  type: 'removed';
  ids: number[];
};

/** The fields of a timeline's answer, wherever its events are held: the kernel's or a worker's. */
type TimelineAnswer = {
  seq: number;
  start: number;
  end: number;
  width: number;
  columns: string[];
  rows: number;
  events: number;
  held: number;
  dropped: number;
  /** Events the kernel's timeline never got: dropped while it was too far behind the bus. */
  missed: number;
  truncated: number;
  first: number;
  last: number;
  sources: Record<string, string>;
  /** Per line of user code in the window: [source, events, gpu_faults, cpu_faults, bytes_htod, bytes_dtoh, bytes_dtod]. */
  by_source: number[][];
  by_source_others: number;
};

export type TimelineRows = TimelineAnswer & {
  type: 'timeline';
};

export type WorkerTimelineRows = TimelineAnswer & {
  type: 'worker_timeline';
  /** Whose events: the worker's address. */
  worker: string;
};

/** One GPU of a worker: memory as last read; what moved and faulted since the worker joined. */
export type WorkerDevice = {
  gpu: number;
  used: number;
  total: number;
  htod_bytes: number;
  dtoh_bytes: number;
  /** In from a peer GPU. */
  dtod_bytes: number;
  gpu_faults: number;
  evicted_bytes: number;
  /** Pages of the worker's live buffers held on this GPU. */
  pages: number;
};

export type WorkerInfo = {
  address: string;
  name: string;
  /** left: closed cleanly; gone: dead, restarted or retired. */
  state: 'live' | 'left' | 'gone';
  backend: string;
  gpus: number;
  events: number;
  cpu_faults: number;
  allocated: number;
  buffers: number;
  /** Deltas that never came. */
  lost: number;
  latency_ms: number;
  /** Empty until its first delta. */
  devices: WorkerDevice[];
};

/** Every worker x GPU of the kernel's Dask cluster, in the order they joined. */
export type Cluster = {
  type: 'cluster';
  workers: WorkerInfo[];
  workers_left_out: number;
};

export type WorkerBuffer = {
  id: number;
  label: string;
  size: number;
  is_managed: boolean;
  /** Pages per place ("host", "gpu:N") holding a copy. */
  copies: Record<string, number>;
  unknown: number;
};

export type WorkerBufferList = {
  type: 'worker_buffers';
  seq: number;
  worker: string;
  /** The oldest first. */
  buffers: WorkerBuffer[];
  /** More than the kernel lists: the newest were left out. */
  truncated: boolean;
};

/** Pages of one allocation at one page a cell; the one buffer holds each page's category code. */
export type PageRows = {
  type: 'pages';
  seq: number;
  id: number;
  first_page: number;
  pages: number;
  /** ns on the backend's clock: the pages were read at this time (or just after). */
  time: number;
};

export type ErrorInfo = {
  type: string;
  message: string;
};

export type Result = {
  type: 'result';
  seq: number | null;
  command: string | null;
  ok: boolean;
  error: ErrorInfo | null;
};

/** An experiment's chart (`ul.compare`'s result): a self-contained page, BokehJS inline. */
export type ExperimentChart = {
  type: 'experiment';
  workload: string;
  configurations: number;
  created: string;
  html: string;
};

export type KernelMessage =
  | Snapshot
  | Update
  | Removed
  | TimelineRows
  | PageRows
  | Result
  | ExperimentChart
  | Cluster
  | WorkerTimelineRows
  | WorkerBufferList;

/** Narrow an incoming comm payload to a kernel message, or undefined for anything else. */
export function asKernelMessage(data: unknown): KernelMessage | undefined {
  if (typeof data !== 'object' || data === null) {
    return undefined;
  }
  const type = (data as { type?: unknown }).type;
  switch (type) {
    case 'snapshot':
    case 'update':
    case 'removed':
    case 'timeline':
    case 'pages':
    case 'result':
    case 'experiment':
    case 'cluster':
    case 'worker_timeline':
    case 'worker_buffers':
      return data as KernelMessage;
    default:
      return undefined;
  }
}

/** The bytes of a comm buffer, whichever view the kernel connection handed over. */
export function bufferBytes(buffer: ArrayBuffer | ArrayBufferView): Uint8Array {
  if (buffer instanceof ArrayBuffer) {
    return new Uint8Array(buffer);
  }
  return new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength);
}

/**
 * `cells` with a `'runs'` buffer's changes applied, in place. Layout (little-endian, as
 * `uvm_lab.jupyter.protocol.encode_runs` writes it): uint32 n; n uint32 starts; n uint32
 * lengths; then each run's cells. Returns false, changing nothing, for a buffer that does not fit.
 */
export function applyRuns(cells: Uint8Array, runs: Uint8Array): boolean {
  if (runs.byteLength < 4) {
    return false;
  }
  const view = new DataView(runs.buffer, runs.byteOffset, runs.byteLength);
  const n = view.getUint32(0, true);
  const body = 4 + 8 * n;
  if (runs.byteLength < body) {
    return false;
  }
  let total = 0;
  for (let i = 0; i < n; i++) {
    const start = view.getUint32(4 + 4 * i, true);
    const length = view.getUint32(4 + 4 * (n + i), true);
    if (start + length > cells.length) {
      return false;
    }
    total += length;
  }
  if (body + total !== runs.byteLength) {
    return false;
  }
  let at = body;
  for (let i = 0; i < n; i++) {
    const start = view.getUint32(4 + 4 * i, true);
    const length = view.getUint32(4 + 4 * (n + i), true);
    cells.set(runs.subarray(at, at + length), start);
    at += length;
  }
  return true;
}

/** The timeline's columns, by name, as typed arrays over the comm's buffers. */
export interface ITimelineColumns {
  start: Float64Array;
  end: Float64Array;
  lane: Float64Array;
  kind: Uint8Array;
  cause: Uint8Array;
  src: Int16Array;
  dst: Int16Array;
  bytes: Float64Array;
  address: Float64Array;
  reach: Float64Array;
  source: Uint32Array;
  count: Uint32Array;
}

/** Read a `timeline` answer's buffers as columns; undefined if they do not match `TIMELINE_COLUMNS`. */
export function timelineColumns(
  rows: { rows: number },
  buffers: (ArrayBuffer | ArrayBufferView)[]
): ITimelineColumns | undefined {
  if (buffers.length !== TIMELINE_COLUMNS.length) {
    return undefined;
  }
  const out: Record<string, ArrayBufferView> = {};
  for (let i = 0; i < TIMELINE_COLUMNS.length; i++) {
    const [name, dtype] = TIMELINE_COLUMNS[i];
    // A copy: the typed array needs its own aligned buffer.
    const bytes = bufferBytes(buffers[i]).slice();
    const array = TYPED[dtype](bytes.buffer);
    if (array.length !== rows.rows) {
      return undefined;
    }
    out[name] = array;
  }
  return out as unknown as ITimelineColumns;
}

const TYPED: Record<(typeof TIMELINE_COLUMNS)[number][1], (b: ArrayBuffer) => ArrayBufferView & { length: number }> = {
  '<f8': b => new Float64Array(b),
  u1: b => new Uint8Array(b),
  '<i2': b => new Int16Array(b),
  '<u4': b => new Uint32Array(b)
};
