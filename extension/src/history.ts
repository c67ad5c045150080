/**
 * The time cursor's memory: every allocation's map as the view received it, each state stamped with
 * the kernel's clock when it was read, so the cursor can show any allocation as it was at a moment. Bounded by the
 * cells it holds: past `capacity` the oldest states go (whichever allocation's), and how many went
 * is counted, for the view to say. Before an allocation's first state held, nothing is known: `at`
 * says so rather than guess.
 */

import { IAllocation } from './model';

export interface IMapState {
  /** ns on the backend's clock, when the kernel read the state. */
  time: number;
  allocation: IAllocation;
}

export class MapHistory {
  /** `capacity`: the most map cells (bytes) held, all allocations together. */
  constructor(readonly capacity = 64 * 1024 * 1024) {}

  /** States no longer held, the oldest first. */
  get dropped(): number {
    return this._dropped;
  }

  /** States held, all allocations together. */
  get size(): number {
    return this._order.length - this._head;
  }

  /** The time of the oldest state held (null: none). */
  get oldest(): number | null {
    return this.size ? this._order[this._head].time : null;
  }

  /** Note each of `allocations` at the time the kernel read it, where its state is not the one held last. */
  record(allocations: Iterable<IAllocation>): void {
    for (const allocation of allocations) {
      const id = allocation.info.id;
      let states = this._states.get(id);
      if (!states) {
        states = [];
        this._states.set(id, states);
      }
      const last = states[states.length - 1];
      if (last && last.allocation.revision === allocation.revision) {
        continue;
      }
      const state = { time: Math.max(allocation.time, last?.time ?? allocation.time), allocation };
      states.push(state);
      this._order.push(state);
      this._cells += allocation.cells.length;
    }
    while (this._cells > this.capacity && this.size > 1) {
      const gone = this._order[this._head++];
      const states = this._states.get(gone.allocation.info.id)!;
      states.shift(); // its own oldest: states arrive in time order
      if (!states.length) {
        this._states.delete(gone.allocation.info.id);
      }
      this._cells -= gone.allocation.cells.length;
      this._dropped++;
    }
    if (this._head > 4096 && this._head * 2 > this._order.length) {
      this._order = this._order.slice(this._head);
      this._head = 0;
    }
  }

  /**
   * Allocation `id` as it was at `time`: the last state held at or before it, or null where none is
   * (the allocation came later, or its states from then were dropped).
   */
  at(id: number, time: number): IMapState | null {
    const states = this._states.get(id);
    if (!states || !states.length || states[0].time > time) {
      return null;
    }
    let lo = 0;
    let hi = states.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (states[mid].time <= time) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return states[lo];
  }

  /** Forget every state (the kernel they came from is gone). */
  clear(): void {
    this._states.clear();
    this._order = [];
    this._head = 0;
    this._cells = 0;
  }

  private _states = new Map<number, IMapState[]>();
  private _order: IMapState[] = []; // every state held, oldest first, from _head on
  private _head = 0;
  private _cells = 0;
  private _dropped = 0;
}
