/**
 * The comm protocol between the UVM Lab panel and the kernel.
 *
 * Twin of `uvm_lab/jupyter/protocol.py`: each type here has the same name and the same fields
 * as a TypedDict there (a unit test on the Python side compares the two files). Read that
 * module's docstring for the full story; in short, the panel sends only `Command`s, the kernel
 * answers each with a `Result`, and pushes `Snapshot`, `Update` and `Removed`. Residency comes
 * as binary buffers, the i-th buffer for `allocations[i]`, one byte per page or per cell of
 * `cell_pages` pages: the code of the page's (or most of the cell's pages') category.
 */

export const COMM_TARGET = 'uvm_lab';
export const PROTOCOL_VERSION = 2;

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

export type Command = Hello | Prefetch | SetAdvice | Pause;

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

export type AllocationInfo = {
  id: number;
  label: string;
  size: number;
  is_managed: boolean;
  advice: AdviceState;
  pages: number;
  cell_pages: number;
  cells: number;
  counts: PageCounts;
};

export type DeviceInfo = {
  backend: string;
  device_count: number;
  free: number;
  total: number;
};

export type Snapshot = {
  type: 'snapshot';
  version: number;
  page_size: number;
  cell_limit: number;
  device: DeviceInfo;
  allocations: AllocationInfo[];
};

export type Update = {
  type: 'update';
  device: DeviceInfo;
  allocations: AllocationInfo[];
};

export type Removed = {
  type: 'removed';
  ids: number[];
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

export type KernelMessage = Snapshot | Update | Removed | Result;

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
    case 'result':
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
