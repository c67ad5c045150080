/**
 * The time cursor's memory: the states of the selected allocation's map as the view received them
 * (one per drawn frame at most), each stamped with the kernel's clock. Bounded: past `capacity`
 * states the oldest go, and how many went is counted, for the view to say.
 */

import { IAllocation } from './model';

export interface IMapState {
  /** ns on the backend's clock, the latest the kernel had reported when the state arrived. */
  time: number;
  allocation: IAllocation;
}

export class MapHistory {
  constructor(readonly capacity = 512) {}

  /** The allocation whose states are held (null: none yet). */
  get id(): number | null {
    return this._id;
  }

  get states(): ReadonlyArray<IMapState> {
    return this._states;
  }

  /** States no longer held, the oldest first. */
  get dropped(): number {
    return this._dropped;
  }

  /** Note `allocation`'s state at `time`, unless it is the one held last; another allocation starts afresh. */
  record(allocation: IAllocation, time: number): void {
    if (allocation.info.id !== this._id) {
      this._id = allocation.info.id;
      this._states = [];
      this._dropped = 0;
    }
    const last = this._states[this._states.length - 1];
    if (last && last.allocation.revision === allocation.revision) {
      return;
    }
    this._states.push({ time, allocation });
    if (this._states.length > this.capacity) {
      this._states.shift();
      this._dropped++;
    }
  }

  private _id: number | null = null;
  private _states: IMapState[] = [];
  private _dropped = 0;
}
