/**
 * The panel's model: one comm to the current notebook's kernel, the allocations it reported,
 * and Lumino signals for the view. It never draws anything.
 */

import { ISessionContext } from '@jupyterlab/apputils';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import {
  AdviceName,
  AllocationInfo,
  COMM_TARGET,
  Cluster,
  Command,
  DeviceInfo,
  DeviceSample,
  ExperimentChart,
  ITimelineColumns,
  Location,
  PageRows,
  Prefetch,
  PROTOCOL_VERSION,
  Result,
  SetAdvice,
  Snapshot,
  TimelineRows,
  Update,
  WorkerBufferList,
  WorkerTimelineRows,
  applyRuns,
  asKernelMessage,
  bufferBytes,
  timelineColumns
} from './protocol';

/** Where the model stands with the kernel. */
export type ConnectionState =
  | 'no-notebook' // no notebook is current
  | 'no-kernel' // the notebook has no running kernel
  | 'connecting' // a hello is on its way; no answer yet (the kernel may be busy)
  | 'not-loaded' // the kernel closed our comm: `%load_ext uvm_lab` has not run there
  | 'connected'; // snapshots and updates flow

/** One allocation as last reported: its metadata and its residency bytes. */
export interface IAllocation {
  info: AllocationInfo;
  cells: Uint8Array;
  /** Increases with every snapshot or update that carried this allocation (one counter for all). */
  revision: number;
  /** ns on the backend's clock: the kernel read this state at this time (or just after). */
  time: number;
}

/** A `pages` answer: its header and each page's category code. */
export interface IPageRange {
  rows: PageRows;
  codes: Uint8Array;
}

/** A timeline answer: its header and its columns. */
export interface ITimeline {
  rows: TimelineRows;
  columns: ITimelineColumns;
}

/**
 * Where a timeline's rows come from: the kernel, through the model, or a snapshot's levels. Either
 * answers a window at a width with rows merged by the kernel's one rule.
 */
export interface ITimelineSource {
  /** Whether a query can be answered now. */
  readonly ready: boolean;
  /** The earliest time known before any rows arrive, in ns on the backend's clock. */
  readonly earliest: number;
  /** The latest time known, in ns: the end of the window shown in full. */
  readonly now: number;
  /** The rows of [start, end] ns for a view `width` pixels wide, of `lanes` (all: null). */
  queryTimeline(start: number, end: number, width: number, lanes: number[] | null): Promise<ITimeline | Result>;
}

/** A worker's timeline answer: its header and its columns. */
export interface IWorkerTimeline {
  rows: WorkerTimelineRows;
  columns: ITimelineColumns;
}

/** Omit<T, K> over each member of a union, so a command can be built without its seq. */
type CommandBody<T> = T extends Command ? Omit<T, 'seq'> : never;

export class UvmLabModel implements ITimelineSource {
  /** Emitted when the connection state, status text or device info change. */
  get stateChanged(): ISignal<this, void> {
    return this._stateChanged;
  }

  /** Emitted with the ids whose entries changed or went away (all of them after a snapshot). */
  get allocationsChanged(): ISignal<this, number[]> {
    return this._allocationsChanged;
  }

  /** The kernel's wall clock (ms since the epoch) when it read the maps of the last update; 0 before one. */
  get clock(): number {
    return this._clock;
  }

  get state(): ConnectionState {
    return this._state;
  }

  /** A line for the status bar of the panel. */
  get status(): string {
    return this._status;
  }

  get device(): DeviceInfo | null {
    return this._device;
  }

  get kernelName(): string {
    return this._session?.kernelDisplayName ?? '';
  }

  get allocations(): ReadonlyMap<number, IAllocation> {
    return this._allocations;
  }

  get paused(): boolean {
    return this._paused;
  }

  /** Emitted when device samples arrive (or all go, on a new connection). */
  /** The latest experiment's chart the kernel sent (`ul.compare`), or null. */
  get experiment(): ExperimentChart | null {
    return this._experiment;
  }

  get experimentChanged(): ISignal<this, void> {
    return this._experimentChanged;
  }

  get samplesChanged(): ISignal<this, void> {
    return this._samplesChanged;
  }

  /** The kernel's Dask cluster as last sent (every worker x GPU), or null: none shown. */
  get cluster(): Cluster | null {
    return this._cluster;
  }

  get clusterChanged(): ISignal<this, void> {
    return this._clusterChanged;
  }

  /** The device lanes' samples held, oldest first (at most `MAX_SAMPLES`). */
  get samples(): ReadonlyArray<DeviceSample> {
    return this._samples;
  }

  /** Samples no longer held: dropped by the kernel before the snapshot, or here past `MAX_SAMPLES`. */
  get samplesDropped(): number {
    return this._samplesDropped;
  }

  /** The most cells a map has, and the most pages one `pages` query reads (the kernel's word). */
  get cellLimit(): number {
    return this._cellLimit;
  }

  /** Whether the kernel answers timeline queries now. */
  get ready(): boolean {
    return this._state === 'connected';
  }

  /** The time of the oldest device sample held (0 before any). */
  get earliest(): number {
    return this._samples[0]?.time ?? 0;
  }

  /** The latest time the kernel has reported, in ns on the backend's clock (the timeline's). */
  get now(): number {
    const last = this._samples[this._samples.length - 1];
    return last ? last.time : 0;
  }

  /** Say which allocations' maps are on screen (null: all): the kernel reads those first. */
  watch(ids: number[] | null): Promise<Result> {
    return this.send({ type: 'watch', ids });
  }

  /**
   * Ask for the least time between two updates, in ms. Once the kernel takes it, it is asked for again on every
   * new connection (a restarted kernel starts at its default), as a pause is.
   */
  async setRate(intervalMs: number): Promise<Result> {
    const result = await this.send({ type: 'rate', interval_ms: intervalMs });
    if (result.ok) {
      this._rateMs = intervalMs;
    }
    return result;
  }

  /**
   * Ask the kernel for the events of [start, end] ns, for a view `width` pixels wide. Resolves with
   * the answer, or with the command's failed result.
   */
  queryTimeline(start: number, end: number, width: number, lanes: number[] | null): Promise<ITimeline | Result> {
    const seq = this._nextSeq;
    return new Promise(resolve => {
      this._timelineWaiters.set(seq, resolve);
      void this.send({ type: 'timeline', start, end, width, lanes }).then(result => {
        if (this._timelineWaiters.delete(seq)) {
          resolve(result); // no answer came: the result says why
        }
      });
    });
  }

  /**
   * Ask the kernel for pages [firstPage, firstPage + pages) of allocation `id`, one byte a page (at most
   * the cell limit). Resolves with them, or with the command's failed result.
   */
  queryPages(id: number, firstPage: number, pages: number): Promise<IPageRange | Result> {
    const seq = this._nextSeq;
    return new Promise(resolve => {
      this._pageWaiters.set(seq, resolve);
      void this.send({ type: 'pages', id, first_page: firstPage, pages }).then(result => {
        if (this._pageWaiters.delete(seq)) {
          resolve(result); // no answer came: the result says why
        }
      });
    });
  }

  /**
   * Ask the kernel for Dask worker `worker`'s events of [start, end] ns, for a view `width` pixels wide.
   * Resolves with the answer, or with the command's failed result.
   */
  queryWorkerTimeline(worker: string, start: number, end: number, width: number): Promise<IWorkerTimeline | Result> {
    return this._ask<IWorkerTimeline>({ type: 'worker_timeline', worker, start, end, width });
  }

  /** Ask the kernel for Dask worker `worker`'s live buffers; resolves with them, or with the failed result. */
  queryWorkerBuffers(worker: string): Promise<WorkerBufferList | Result> {
    return this._ask<WorkerBufferList>({ type: 'worker_buffers', worker });
  }

  /** Have Dask worker `worker` carry out a prefetch or advice on a buffer it owns; resolves with the result. */
  workerCommand(worker: string, command: CommandBody<Prefetch | SetAdvice>): Promise<Result> {
    // The inner command's seq is its own (checked, not answered): the result answers the outer one.
    return this.send({ type: 'worker_command', worker, command: { ...command, seq: 0 } as Prefetch | SetAdvice });
  }

  /** Send a query answered by a message of its own (matched by seq); if none comes, the result says why. */
  private _ask<T>(body: CommandBody<Command>): Promise<T | Result> {
    const seq = this._nextSeq;
    return new Promise(resolve => {
      this._answerWaiters.set(seq, answer => resolve(answer as T));
      void this.send(body).then(result => {
        if (this._answerWaiters.delete(seq)) {
          resolve(result);
        }
      });
    });
  }

  /** Follow another notebook's session (or none). */
  setSession(session: ISessionContext | null): void {
    if (session === this._session) {
      return;
    }
    if (this._session) {
      this._session.kernelChanged.disconnect(this._onKernelChanged, this);
      this._session.statusChanged.disconnect(this._onStatusChanged, this);
      this._session.iopubMessage.disconnect(this._onIOPub, this);
    }
    this._session = session;
    if (session) {
      session.kernelChanged.connect(this._onKernelChanged, this);
      session.statusChanged.connect(this._onStatusChanged, this);
      session.iopubMessage.connect(this._onIOPub, this);
    }
    this._attachWhenShown();
  }

  /** Open a fresh comm to the current kernel and ask for a snapshot. */
  attach(): Promise<void> {
    this._retries = 0;
    return this._attach();
  }

  private async _attach(force = false): Promise<void> {
    // One hello per kernel at a time: a restart brings both kernelChanged and idle, and closing
    // a comm whose subshell is still starting races JupyterLab's per-target subshell count.
    const kernelNow = this._session?.session?.kernel;
    if (!force && this._comm && this._state === 'connecting' && kernelNow?.id === this._commKernelId) {
      return;
    }
    this._detach();
    const session = this._session;
    if (!session) {
      this._setState('no-notebook', 'Open a notebook to see its allocations.');
      return;
    }
    // The session may still be starting; only a ready one has a kernel worth asking.
    await session.ready;
    if (session !== this._session || this._comm) {
      return;
    }
    const kernel = session.session?.kernel;
    if (!kernel || kernel.status === 'dead') {
      this._setState('no-kernel', 'This notebook has no running kernel.');
      return;
    }
    await this._openComm(kernel);
  }

  /** Ask the kernel to move an allocation's pages: all of them, or `pages` from `firstPage` on. */
  prefetch(id: number, location: Location, firstPage = 0, pages: number | null = null): Promise<Result> {
    return this.send({ type: 'prefetch', id, location, first_page: firstPage, pages });
  }

  /** Set one kind of memory advice on an allocation. */
  setAdvice(id: number, advice: AdviceName, value: boolean | string | string[] | null): Promise<Result> {
    return this.send({ type: 'set_advice', id, advice, value });
  }

  /**
   * Stop (while the panel is hidden) or restart the flow of updates. A hidden panel also makes
   * no new connections: each one a kernel without uvm_lab refuses costs a line in its log.
   */
  setPaused(paused: boolean): void {
    if (paused === this._paused) {
      return;
    }
    this._paused = paused;
    if (this._state === 'connected') {
      void this.send({ type: 'pause', paused });
    } else if (!paused && !this._comm) {
      void this.attach();
    }
  }

  /** Send a command; resolves with the kernel's result for it. */
  send(body: CommandBody<Command>): Promise<Result> {
    const comm = this._comm;
    if (!comm || this._state !== 'connected') {
      return Promise.resolve(this._localError(body.type, 'not connected to a kernel that has run %load_ext uvm_lab'));
    }
    const seq = this._nextSeq++;
    const command = { ...body, seq } as Command;
    return new Promise<Result>(resolve => {
      this._pending.set(seq, resolve);
      comm.send(command);
    });
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this.setSession(null);
    this._detach();
    Signal.clearData(this);
  }

  private async _openComm(kernel: Kernel.IKernelConnection): Promise<void> {
    const comm = kernel.createComm(COMM_TARGET);
    this._comm = comm;
    this._commKernelId = kernel.id;
    comm.onMsg = msg => this._onCommMsg(comm, msg);
    comm.onClose = () => this._onCommClose(comm);
    this._setState('connecting', 'Asking the kernel for its allocations…');
    await subshellOf(kernel, comm);
    if (comm !== this._comm) {
      return; // detached while waiting
    }
    // The open message is itself the hello: the kernel answers it with a snapshot.
    const hello = { type: 'hello', seq: this._nextSeq++ } as const;
    try {
      comm.open(hello);
      this._armWatchdog(comm);
    } catch (err) {
      this._detach();
      this._setState('no-kernel', `Could not reach the kernel: ${String(err)}`);
    }
  }

  /**
   * A hello the kernel neither answers nor refuses while idle went astray (around a restart, a
   * comm can be opened on a subshell the new kernel never had): open a new comm, a few times.
   */
  private _armWatchdog(comm: Kernel.IComm): void {
    window.clearTimeout(this._watchdog);
    this._watchdog = window.setTimeout(() => {
      if (comm !== this._comm || this._state !== 'connecting') {
        return;
      }
      if (this._session?.session?.kernel?.status !== 'idle') {
        this._armWatchdog(comm); // busy: the answer may still come
      } else if (this._retries++ < MAX_RETRIES) {
        console.warn('uvm-lab: the kernel did not answer the hello; opening a new comm');
        void this._attach(true);
      } else {
        this._detach();
        this._setState('no-kernel', 'The kernel does not answer the UVM Lab panel.');
      }
    }, HELLO_TIMEOUT_MS);
  }

  private _onCommMsg(comm: Kernel.IComm, msg: KernelMessage.ICommMsgMsg): void {
    if (comm !== this._comm) {
      return;
    }
    const data = asKernelMessage(msg.content.data);
    if (!data) {
      console.warn('uvm-lab: ignoring an unknown message from the kernel', msg.content.data);
      return;
    }
    const buffers = msg.buffers ?? [];
    switch (data.type) {
      case 'snapshot':
        this._onSnapshot(data, buffers);
        break;
      case 'update':
        this._onUpdate(data, buffers);
        break;
      case 'removed':
        this._forget(data.ids);
        break;
      case 'timeline':
        this._onTimeline(data, buffers);
        break;
      case 'pages': {
        const resolve = this._pageWaiters.get(data.seq);
        const codes = buffers[0] ? bufferBytes(buffers[0]) : null;
        if (resolve && codes && codes.length === data.pages) {
          this._pageWaiters.delete(data.seq);
          resolve({ rows: data, codes: codes.slice() });
        }
        break;
      }
      case 'result':
        this._onResult(data);
        break;
      case 'experiment':
        this._experiment = data;
        this._experimentChanged.emit();
        break;
      case 'cluster':
        this._cluster = data;
        this._clusterChanged.emit();
        break;
      case 'worker_timeline': {
        const resolve = this._answerWaiters.get(data.seq);
        const columns = timelineColumns(data, buffers);
        if (resolve && columns) {
          this._answerWaiters.delete(data.seq);
          resolve({ rows: data, columns });
        }
        break;
      }
      case 'worker_buffers': {
        const resolve = this._answerWaiters.get(data.seq);
        if (resolve) {
          this._answerWaiters.delete(data.seq);
          resolve(data);
        }
        break;
      }
    }
  }

  private _onSnapshot(data: Snapshot, buffers: (ArrayBuffer | ArrayBufferView)[]): void {
    if (data.version !== PROTOCOL_VERSION) {
      this._detach();
      this._setState(
        'not-loaded',
        `The kernel speaks protocol version ${data.version}; this panel speaks ${PROTOCOL_VERSION}. ` +
          'Install matching versions of uvm_lab and the extension.'
      );
      return;
    }
    const gone = [...this._allocations.keys()];
    this._allocations.clear();
    this._cellLimit = data.cell_limit;
    this._store(data.allocations, buffers, data.time);
    this._device = data.device;
    this._samples = [];
    this._samplesDropped = data.samples_dropped;
    this._addSamples(data.samples);
    const wasConnected = this._state === 'connected';
    this._setState('connected', this._summary());
    if (!wasConnected && this._paused) {
      void this.send({ type: 'pause', paused: true });
    }
    if (!wasConnected && this._rateMs !== null) {
      void this.send({ type: 'rate', interval_ms: this._rateMs });
    }
    this._allocationsChanged.emit([...gone, ...data.allocations.map(a => a.id)]);
  }

  private _onUpdate(data: Update, buffers: (ArrayBuffer | ArrayBufferView)[]): void {
    if (Number.isFinite(data.clock)) {
      this._clock = data.clock;
    }
    this._store(data.allocations, buffers, data.time);
    if (data.device) {
      this._device = data.device;
    }
    this._setState('connected', this._summary());
    if (data.allocations.length) {
      this._allocationsChanged.emit(data.allocations.map(a => a.id));
    }
    this._addSamples(data.samples);
  }

  private _addSamples(samples: DeviceSample[]): void {
    if (!samples.length) {
      return;
    }
    this._samples.push(...samples);
    const extra = this._samples.length - MAX_SAMPLES;
    if (extra > 0) {
      this._samples.splice(0, extra);
      this._samplesDropped += extra;
    }
    this._samplesChanged.emit();
  }

  private _onTimeline(rows: TimelineRows, buffers: (ArrayBuffer | ArrayBufferView)[]): void {
    const resolve = this._timelineWaiters.get(rows.seq);
    const columns = timelineColumns(rows, buffers);
    if (resolve && columns) {
      this._timelineWaiters.delete(rows.seq);
      resolve({ rows, columns });
    }
  }

  private _store(infos: AllocationInfo[], buffers: (ArrayBuffer | ArrayBufferView)[], time: number): void {
    infos.forEach((info, i) => {
      const buffer = buffers[i];
      const bytes = buffer ? bufferBytes(buffer) : new Uint8Array(0);
      let cells: Uint8Array;
      if (info.encoding === 'runs') {
        // The changed cells, on top of what we hold: a copy, so a view holding the old array keeps it.
        const held = this._allocations.get(info.id);
        cells = held && held.cells.length === info.cells ? held.cells.slice() : new Uint8Array(info.cells);
        if (!held || !applyRuns(cells, bytes)) {
          // We lost step with the kernel: ask for everything again.
          console.warn('uvm-lab: a map change did not fit the map held; asking for a snapshot');
          void this.send({ type: 'hello' });
          return;
        }
      } else {
        cells = bytes.length === info.cells ? bytes.slice() : new Uint8Array(info.cells);
      }
      this._allocations.set(info.id, { info, cells, revision: ++this._revision, time });
    });
  }

  private _forget(ids: number[]): void {
    ids.forEach(id => this._allocations.delete(id));
    this._setState(this._state, this._summary());
    this._allocationsChanged.emit(ids);
  }

  private _onResult(result: Result): void {
    const resolve = result.seq === null ? undefined : this._pending.get(result.seq);
    if (resolve && result.seq !== null) {
      this._pending.delete(result.seq);
      resolve(result);
    }
  }

  private _onCommClose(comm: Kernel.IComm): void {
    if (comm !== this._comm) {
      return;
    }
    const wasConnected = this._state === 'connected';
    this._detach();
    this._setState(
      'not-loaded',
      wasConnected
        ? 'The kernel closed the UVM Lab connection.'
        : 'This kernel has not loaded uvm_lab. Run %load_ext uvm_lab in the notebook, then retry.'
    );
  }

  private _onKernelChanged(): void {
    this._attachWhenShown();
  }

  /** Attach now if the panel is shown; otherwise drop the old kernel and wait for setPaused(false). */
  private _attachWhenShown(): void {
    if (!this._paused || !this._session) {
      void this.attach();
      return;
    }
    this._detach();
    this._setState('connecting', 'Waiting for the panel to be shown.');
  }

  private _onStatusChanged(_: ISessionContext, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      // A restart drops every comm; start over once it is back. No comm_close to the old
      // kernel: its answer (busy, then idle) would look like the new kernel being ready.
      this._detach(false);
      this._restarted = true;
      this._setState('no-kernel', status === 'dead' ? 'The kernel died.' : 'The kernel is restarting…');
    } else if (status === 'idle' && this._restarted) {
      this._restarted = false;
      this._attachWhenShown();
    }
  }

  private _onIOPub(_: ISessionContext, msg: KernelMessage.IMessage): void {
    // After a cell has run, try again if we were waiting for `%load_ext uvm_lab`. Only
    // executions count: our own comm_open also makes the kernel go busy and idle.
    if (
      msg.header.msg_type === 'status' &&
      (msg.content as KernelMessage.IStatusMsg['content']).execution_state === 'idle' &&
      (msg.parent_header as Partial<KernelMessage.IHeader>).msg_type === 'execute_request' &&
      this._state === 'not-loaded' &&
      !this._paused
    ) {
      void this.attach();
    }
  }

  private _detach(close = true): void {
    const comm = this._comm;
    this._comm = null;
    window.clearTimeout(this._watchdog);
    for (const [seq, resolve] of this._pending) {
      resolve(this._localError('command', 'the connection to the kernel closed', seq));
    }
    this._pending.clear();
    if (this._cluster) {
      this._cluster = null; // another kernel may have no cluster, or another one
      this._clusterChanged.emit();
    }
    if (this._allocations.size) {
      const ids = [...this._allocations.keys()];
      this._allocations.clear();
      this._allocationsChanged.emit(ids);
    }
    this._device = null;
    if (comm && close && !comm.isDisposed) {
      try {
        comm.close();
      } catch {
        // The kernel is gone already; nothing to tell it.
      }
    }
  }

  private _localError(command: string, message: string, seq: number | null = null): Result {
    return { type: 'result', seq, command, ok: false, error: { type: 'NotConnected', message } };
  }

  private _summary(): string {
    const n = this._allocations.size;
    return `${n} live allocation${n === 1 ? '' : 's'} · ${this._device?.backend ?? '?'} backend`;
  }

  private _setState(state: ConnectionState, status: string): void {
    this._state = state;
    this._status = status;
    this._stateChanged.emit();
  }

  private _session: ISessionContext | null = null;
  private _comm: Kernel.IComm | null = null;
  private _commKernelId = '';
  private _state: ConnectionState = 'no-notebook';
  private _status = 'Open a notebook to see its allocations.';
  private _device: DeviceInfo | null = null;
  private _clock = 0;
  private _allocations = new Map<number, IAllocation>();
  private _pending = new Map<number, (result: Result) => void>();
  private _timelineWaiters = new Map<number, (answer: ITimeline | Result) => void>();
  private _cellLimit = 16384;
  private _pageWaiters = new Map<number, (answer: IPageRange | Result) => void>();
  private _samples: DeviceSample[] = [];
  private _samplesDropped = 0;
  private _samplesChanged = new Signal<this, void>(this);
  private _answerWaiters = new Map<number, (answer: IWorkerTimeline | WorkerBufferList) => void>();
  private _cluster: Cluster | null = null;
  private _clusterChanged = new Signal<this, void>(this);
  private _experiment: ExperimentChart | null = null;
  private _experimentChanged = new Signal<this, void>(this);
  private _nextSeq = 1;
  private _revision = 0;
  private _retries = 0;
  private _watchdog = 0;
  private _paused = false;
  private _rateMs: number | null = null; // the update interval the view asked for and the kernel took
  private _restarted = false;
  private _disposed = false;
  private _stateChanged = new Signal<this, void>(this);
  private _allocationsChanged = new Signal<this, number[]>(this);
}

/**
 * Wait (up to a few seconds) for the comm's own kernel subshell, where the kernel has them.
 *
 * JupyterLab >= 4.4 gives each comm target a subshell of an ipykernel 7 kernel, but starts it
 * only after `createComm`. Opening the comm there, rather than on the main shell, is what lets
 * the panel's commands run while a cell executes: ipykernel routes a comm's messages to the
 * shell it last answered from. `subshellStarted` is not on the `IComm` interface, hence the
 * feature test; without it, or without subshells, the comm simply opens on the main shell.
 */
async function subshellOf(kernel: Kernel.IKernelConnection, comm: Kernel.IComm): Promise<void> {
  const started = (comm as Partial<{ subshellStarted: Promise<void> }>).subshellStarted;
  try {
    await kernel.info;
    if (!started || !kernel.supportsSubshells || comm.commsOverSubshells === 'disabled') {
      return;
    }
    await Promise.race([started, new Promise(resolve => setTimeout(resolve, SUBSHELL_WAIT_MS))]);
  } catch {
    // No kernel info or no subshell: the main shell will do.
  }
}

/** The device samples a view keeps: ten minutes at ten a second. */
const MAX_SAMPLES = 6000;
const SUBSHELL_WAIT_MS = 5000;
const HELLO_TIMEOUT_MS = 4000;
const MAX_RETRIES = 3;
