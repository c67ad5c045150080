/**
 * The comm protocol between the UVM Lab panel and the kernel.
 *
 * Twin of `uvm_lab/jupyter/protocol.py`: each type here has the same name and the same fields
 * as a TypedDict there (a unit test on the Python side compares the two files). Read that
 * module's docstring for the full story; in short, the panel sends only `Command`s, the kernel
 * answers each with a `Result`, and pushes `Snapshot`, `Update` and `Removed`. Residency comes
 * as binary buffers, the i-th buffer for `allocations[i]`, one byte per page or per cell of
 * `cell_pages` pages.
 */

export const COMM_TARGET = 'uvm_lab';
export const PROTOCOL_VERSION = 1;

/** Page states, as in `uvm_lab.residency`: bit 1 a copy on the host, bit 2 one on the GPU. */
export const NOWHERE = 0;
export const HOST = 1;
export const GPU = 2;
export const BOTH = 3;

export type Location = 'gpu' | 'host';
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

export type PageCounts = {
  gpu: number;
  host: number;
  both: number;
  nowhere: number;
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
