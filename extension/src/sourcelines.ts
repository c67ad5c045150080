/**
 * The "by source line" table: which lines of the user's code caused the traffic of the window the
 * timeline shows. The kernel tallies it with the timeline's rows (the lines that moved the most
 * bytes first); this only lays it out, and says how many more lines the window has.
 */

import { div, formatBytes, tableRow as row } from './categories';
import { ITimeline } from './model';

export class SourceLines {
  constructor(readonly node: HTMLElement) {
    node.classList.add('jp-UvmLab-sourceLines');
    this._caption = div('jp-UvmLab-sourceCaption');
    this._table = document.createElement('table');
    this._table.className = 'jp-UvmLab-traffic jp-UvmLab-sourceTable';
    this._table.setAttribute('aria-label', 'By source line');
    node.append(this._caption, this._table);
  }

  /** Show the lines of `answer` (null: none yet). */
  render(answer: ITimeline | null): void {
    const rows = answer?.rows.by_source ?? [];
    const header = row(['source line', 'faults', 'to GPU', 'to host', 'GPU to GPU', 'events'], 'th');
    const body = rows.map(([source, events, gpuFaults, cpuFaults, htod, dtoh, dtod]) => {
      const text = source ? answer!.rows.sources[String(source)] ?? 'an unknown line' : 'not known';
      const tr = row([text, String(gpuFaults + cpuFaults), formatBytes(htod), formatBytes(dtoh), formatBytes(dtod), String(events)], 'td');
      tr.dataset.source = text;
      return tr;
    });
    this._table.replaceChildren(header, ...body);
    const others = answer?.rows.by_source_others ?? 0;
    this._caption.textContent = !answer
      ? 'By source line: waiting for the timeline'
      : rows.length
        ? `By source line, in the window shown${others ? ` · ${others} more lines` : ''}`
        : 'By source line: no events in the window shown';
  }

  private _caption: HTMLElement;
  private _table: HTMLTableElement;
}
