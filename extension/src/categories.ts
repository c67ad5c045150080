/**
 * What every UVM Lab view says and draws of a page category, written once: its label, the order
 * categories are listed in, which the legend shows, their colours as bytes, and how many pages a
 * map of cells stands for in each. The sidebar panel and the main-area view both read these.
 */

import { CAUSE_PALETTE, PALETTE } from './palette';
import {
  CATEGORY_NAMES,
  CAUSE_NAMES,
  CategoryName,
  DeviceInfo,
  DeviceMemory,
  PageCounts,
  Result,
  Traffic
} from './protocol';

/** What the legend and the counts call each category. */
export const LABELS: Readonly<Record<CategoryName, string>> = {
  nowhere: 'Nowhere (not populated)',
  host: 'Host',
  both: 'Both (read-duplicated)',
  unknown: 'Unknown (whether a GPU holds it)',
  gpus: 'GPUs (several)',
  'gpu:0': 'GPU 0',
  'gpu:1': 'GPU 1',
  'gpu:2': 'GPU 2',
  'gpu:3': 'GPU 3',
  'gpu:4': 'GPU 4',
  'gpu:5': 'GPU 5'
};

export const GPU_CATEGORIES = CATEGORY_NAMES.filter(name => name.startsWith('gpu:'));

/** The order the legend and the counts list categories in: the GPUs, then the host, both, and no known copy. */
export const DISPLAY_ORDER: ReadonlyArray<CategoryName> = [
  ...GPU_CATEGORIES,
  'gpus',
  'host',
  'both',
  'unknown',
  'nowhere'
];

/** Listed on every device, whatever its GPUs. */
const ALWAYS_SHOWN: ReadonlyArray<CategoryName> = ['host', 'both', 'unknown', 'nowhere'];

/** A code the views cannot name (a newer kernel's) is drawn as what it is to us: unknown. */
export const UNKNOWN_CODE = CATEGORY_NAMES.indexOf('unknown');

/** The category code of a residency byte, as drawn. */
export function drawnCode(byte: number): number {
  return byte < CATEGORY_NAMES.length ? byte : UNKNOWN_CODE;
}

/** Every category's colour as RGBA bytes, four per code. */
export const COLOURS = rgbaBytes(CATEGORY_NAMES.map(name => PALETTE[name]));

/** Every cause's colour as RGBA bytes, four per cause code (the timeline's `cause` column). */
export const CAUSE_COLOURS = rgbaBytes(CAUSE_NAMES.map(name => CAUSE_PALETTE[name]));

/** The categories that hold pages, in display order. */
export function nonZero(counts: PageCounts): CategoryName[] {
  return DISPLAY_ORDER.filter(name => counts[name] > 0);
}

/**
 * The categories the legend lists for a device of `deviceCount` GPUs: each GPU, "gpus" where there
 * are two or more, host, both, unknown and nowhere; and any other in `present`. As the dashboard's
 * `shown_categories`.
 */
export function shownCategories(deviceCount: number, present: ReadonlySet<CategoryName>): CategoryName[] {
  const gpus = Math.min(Math.max(deviceCount, 0), GPU_CATEGORIES.length);
  const wanted = new Set<CategoryName>([...present, ...GPU_CATEGORIES.slice(0, gpus), ...ALWAYS_SHOWN]);
  if (gpus > 1) {
    wanted.add('gpus');
  }
  return DISPLAY_ORDER.filter(name => wanted.has(name));
}

/** The pages of page `first` to `last` (inclusive) of a map of `pages` pages in cells of `cellPages`. */
export function cellPageRange(cell: number, pages: number, cellPages: number): [number, number] {
  const first = cell * cellPages;
  return [first, Math.min(pages, first + cellPages) - 1];
}

/** How many pages `cells` stand for in each category, by code (the last cell holds what is left). */
export function pagesDrawn(cells: Uint8Array, pages: number, cellPages: number): number[] {
  const counts = new Array<number>(CATEGORY_NAMES.length).fill(0);
  const n = cells.length;
  for (let i = 0; i < n; i++) {
    counts[drawnCode(cells[i])] += i === n - 1 ? pages - cellPages * (n - 1) : cellPages;
  }
  return counts;
}

/**
 * Carry the pages drawn per category on `node` as data attributes (`data-gpu0-pages`,
 * `data-unknown-pages` …, every category, zero included), so a test can read the picture.
 */
export function markPagesDrawn(node: HTMLElement, drawn: number[]): void {
  CATEGORY_NAMES.forEach((name, code) => (node.dataset[`${name.replace(':', '')}Pages`] = String(drawn[code])));
}

/** A legend entry: a swatch of `colour` and `label`; `data` names what it stands for (`data-category`, say). */
export function legendItem(label: string, colour: string, data: Record<string, string>): HTMLElement {
  const item = document.createElement('span');
  item.className = 'jp-UvmLab-legendItem';
  Object.assign(item.dataset, data);
  const swatch = document.createElement('span');
  swatch.className = 'jp-UvmLab-swatch';
  swatch.style.background = colour;
  item.append(swatch, document.createTextNode(label));
  return item;
}

/** A legend: a swatch in the category's colour and its label, per category. */
export function legendItems(shown: ReadonlyArray<CategoryName>): HTMLElement[] {
  return shown.map(name => legendItem(LABELS[name], PALETTE[name], { category: name }));
}

export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${i === 0 ? v : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)} ${units[i]}`;
}

/** A duration in nanoseconds, in the unit that reads best. */
export function formatNs(ns: number): string {
  const a = Math.abs(ns);
  if (a >= 1e9) {
    return `${(ns / 1e9).toFixed(a >= 1e10 ? 1 : 3)} s`;
  }
  if (a >= 1e6) {
    return `${(ns / 1e6).toFixed(a >= 1e7 ? 1 : 3)} ms`;
  }
  if (a >= 1e3) {
    return `${(ns / 1e3).toFixed(a >= 1e4 ? 1 : 3)} µs`;
  }
  return `${Math.round(ns)} ns`;
}

/** What a processor id of an event record names: -1 the host, -2 none, -3 several (a merged row). */
export function processorName(id: number): string {
  return id === -1 ? 'host' : id === -2 ? '—' : id === -3 ? 'several' : `GPU ${id}`;
}

/** `say` of the device's memory: the current GPU's where there is one, each GPU's, named, where there are several. */
export function eachGpuMemory(device: DeviceInfo, say: (memory: DeviceMemory) => string): string {
  const gpus = device.devices;
  return gpus.length > 1 ? gpus.map((memory, gpu) => `GPU ${gpu}: ${say(memory)}`).join(', ') : say(device);
}

export function div(className: string): HTMLDivElement {
  const node = document.createElement('div');
  node.className = className;
  return node;
}

export function button(label: string, className: string): HTMLButtonElement {
  const node = document.createElement('button');
  node.type = 'button';
  node.className = `jp-Button jp-mod-styled ${className}`;
  node.textContent = label;
  return node;
}

/**
 * Put a hover box (`position: fixed`) beside the pointer, within the window. It is measured first: where an
 * ancestor is its containing block (JupyterLab contains its panels), fixed is relative to that, not the window.
 */
export function placeHover(hover: HTMLElement, event: MouseEvent): void {
  hover.style.left = '0px';
  hover.style.top = '0px';
  const origin = hover.getBoundingClientRect(); // its size too: it keeps within the view that holds it
  const view = hover.closest('.lm-Widget')?.getBoundingClientRect() ?? new DOMRect(0, 0, window.innerWidth, window.innerHeight);
  const x = Math.max(view.left, Math.min(event.clientX + 12, view.right - origin.width - 4));
  const y = Math.max(view.top, Math.min(event.clientY + 12, view.bottom - origin.height - 4));
  hover.style.left = `${x - origin.left}px`;
  hover.style.top = `${y - origin.top}px`;
}

/** An event kind (EVENT_KINDS' name) as a reader says it: "HtoD", "GPU fault", "prefetch". */
export function kindName(kind: string): string {
  const words: Record<string, string> = {
    HTOD: 'HtoD',
    DTOH: 'DtoH',
    DTOD: 'DtoD',
    CPU_PAGE_FAULT: 'CPU fault',
    GPU_PAGE_FAULT: 'GPU fault'
  };
  return words[kind] ?? kind.toLowerCase().replace(/_/g, ' ');
}

/** What a command's result says to the user: `done` where it succeeded, else its error's type and message. */
export function resultText(result: Result, done: string): string {
  return result.ok ? done : `${result.error?.type ?? 'Error'}: ${result.error?.message ?? 'failed'}`;
}

/** A table row of `cells`' text, as header (`th`) or data (`td`) cells. */
export function tableRow(cells: string[], tag: 'td' | 'th'): HTMLTableRowElement {
  const row = document.createElement('tr');
  row.append(
    ...cells.map(text => {
      const cell = document.createElement(tag);
      cell.textContent = text;
      return cell;
    })
  );
  return row;
}

/** An allocation's traffic as table rows: a header, one row per cause that has any, and the totals. */
export function trafficRows(traffic: Traffic): HTMLTableRowElement[] {
  // The peer column only where a buffer moved between GPUs: a one-GPU buffer's table stays as it was.
  const peer = traffic.dtod_bytes > 0;
  const rows = [tableRow(['cause', 'faults', 'to GPU', 'to host', ...(peer ? ['GPU to GPU'] : [])], 'th')];
  traffic.by_cause.forEach(([faults, htod, dtoh, dtod], i) => {
    if (faults || htod || dtoh || dtod) {
      const cells = [CAUSE_NAMES[i], String(faults), formatBytes(htod), formatBytes(dtoh), ...(peer ? [formatBytes(dtod)] : [])];
      const row = tableRow(cells, 'td');
      row.dataset.cause = CAUSE_NAMES[i];
      rows.push(row);
    }
  });
  rows.push(
    tableRow(
      ['all', String(traffic.faults), formatBytes(traffic.htod_bytes), formatBytes(traffic.dtoh_bytes), ...(peer ? [formatBytes(traffic.dtod_bytes)] : [])],
      'th'
    )
  );
  return rows;
}

function rgbaBytes(colours: string[]): Uint8ClampedArray {
  const bytes = new Uint8ClampedArray(4 * colours.length);
  colours.forEach((hex, code) => {
    bytes.set([1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16)).concat(255), 4 * code);
  });
  return bytes;
}
