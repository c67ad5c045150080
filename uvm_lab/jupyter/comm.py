"""The ``uvm_lab`` comm target: the kernel's end of the JupyterLab panel.

The panel opens a comm to target ``"uvm_lab"`` with a ``hello``; each open comm gets a
:class:`PanelSession`, which

- answers every command (:mod:`.protocol`) with a ``result``, carrying it out only through the
  entry points user code calls (``DeviceBuffer.prefetch`` and the advice properties); a bad
  command or a failing call comes back as an error result and never closes the comm;
- listens to the event bus, and from a background thread sends at most one ``update`` per
  ``interval`` (0.05 s, or what the view asks with ``rate``) holding only the allocations whose
  residency or advice changed, each as the cells that changed (``"runs"``), and the device lanes'
  new samples, so the map follows a cell while it runs;
- answers ``timeline`` queries from the kernel's shared event window (:mod:`.timeline`);
- sends each ``ul.compare`` result's chart as it ends (``experiment``), and the latest one to a view that opens;
- shows the Dask cluster of the kernel's :class:`~uvm_lab.dask.ClusterMonitor` (:mod:`uvm_lab.cluster_feed`):
  every worker x GPU (``cluster``) at the snapshot and then at most every ``CLUSTER_INTERVAL`` while it changes,
  and routes a worker's timeline, buffers, prefetch and advice to it (over Dask: no lock is held meanwhile);
- stops sending while the panel says it is hidden (``pause``), and sends a full snapshot when it
  is shown again.

Handlers may run on any thread: ipykernel 7 delivers comm messages on subshell threads while a
cell executes on the main one. ipykernel routes a comm's incoming messages to the shell its last
outgoing message was sent from (the parent request, a context variable), so the background
thread sends from a copy of the context the panel's last message arrived in: otherwise the first
update sent during a cell would pin the panel's commands behind that cell.

Locks, in the only order they are taken::

    _command_lock  (one command at a time)  ->  the core's own locks
    _send_lock     (one snapshot/update at a time, owns _sent, _next_sample and _cluster_shown)  ->  the core's own
                   locks, the cluster monitor's
    _lock          (the dirty ranges, the pause flag, the cluster's flag; held only for a few assignments)

The bus callback takes only ``_lock``, so a producer publishing under the core's locks never
waits on a send; so does the cluster feed's, on the Dask client's event loop. A worker's command or query
(over Dask) holds none of them while it waits.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

import numpy as np

import uvm_lab as ul

from .. import cluster_feed, experiment_feed
from ..backends.base import gpu_memory
from ..clock import SYSTEM_CLOCK, Clock, checked_clock, checked_seconds
from ..errors import InvalidStateError
from ..events import get_bus
from ..events.bus import EventBus
from ..units import PAGE_SIZE
from .commands import answer_timeline, change_buffer
from .dashboard.collect import LiveAllocations
from .protocol import (
    CELL_LIMIT,
    COMM_TARGET,
    COMMANDS,
    MAX_CLUSTER_WORKERS,
    MAX_WORKER_BUFFERS,
    PROTOCOL_VERSION,
    TIMELINE_COLUMNS,
    AdviceState,
    AllocationInfo,
    Cluster,
    Command,
    DeviceInfo,
    DeviceMemory,
    ErrorInfo,
    ExperimentChart,
    PageRows,
    Removed,
    Result,
    Snapshot,
    Timeline,
    Update,
    WorkerBuffer,
    WorkerBufferList,
    WorkerBuffers,
    WorkerCommand,
    WorkerDevice,
    WorkerInfo,
    WorkerTimeline,
    WorkerTimelineRows,
    encode_runs,
    pack_states,
    parse_command,
)
from .throttle import BUSY_SHARE, Budget, FineSwitching
from .timeline import DeviceSeries, EventWindow, release_shared, shared

__all__ = ["PanelSession", "register_comm_target", "sessions"]

log = logging.getLogger("uvm_lab.jupyter.comm")

#: Changed maps a view does not show (see the ``watch`` command) read a second, at most (one an update).
OTHERS_PER_SECOND = 5
#: Changed maps read an update, at most, for a panel that shows every map (no ``watch``): the longest waiting first,
#: so that a loop changing a thousand maps costs each update a bounded time, and the rest catch up.
MAPS_PER_UPDATE = 64
#: Buffers a view does not show whose counts alone changed (no map to read: cheaper), sent in one update.
COUNTS_PER_UPDATE = 2

# A "runs" buffer that changes no cell.
_NO_RUNS = np.zeros(4, dtype=np.uint8)

#: The longest error message a reply carries, in characters; past it the message is cut.
MAX_REPLY_TEXT = 500
#: The largest seq a reply echoes: the largest whole number a JavaScript view reads exactly.
MAX_SEQ = 2**53 - 1


#: Seconds between two updates of an idle kernel's view: a sample for the device lanes, nothing else.
IDLE_SAMPLE = 1.0
#: The share of the kernel's time (of the view's BUSY_SHARE) that updates may take; timeline answers take the rest.
UPDATES_SHARE = 0.04
#: Seconds of the answers' share that may be owed: a view asks for the timeline about once a second, and one answer
#: may cost more than its share of a second.
ANSWERS_BURST = 1.0
#: The least time between two updates, in seconds: about 20 a second at most, so that a change waits for the next
#: update 25 ms on average and 50 ms at most.
UPDATE_INTERVAL = 0.05
#: The least time between two ``cluster`` messages, in seconds: every worker's delta changes the feed, and a table of
#: numbers read four times a second reads as live however many workers send.
CLUSTER_INTERVAL = 0.25
#: The commands carried out on a Dask worker, through the cluster's monitor.
_ON_WORKERS = ("worker_command", "worker_timeline", "worker_buffers")


class CommLike(Protocol):
    """What a session needs of a comm (``comm.base_comm.BaseComm``, or a test's fake)."""

    def send(self, data: Any = None, metadata: Any = None, buffers: Any = None) -> None: ...

    def on_msg(self, callback: Callable[[dict[str, Any]], Any]) -> None: ...

    def on_close(self, callback: Callable[[dict[str, Any]], Any]) -> None: ...

    def close(self, data: Any = None, metadata: Any = None, buffers: Any = None) -> None: ...


class PanelSession:
    """One panel's comm: validated commands in, throttled residency updates out."""

    def __init__(self, comm: CommLike, *, interval: float = UPDATE_INTERVAL, bus: EventBus | None = None,
                 start: bool = True, timeline: tuple[EventWindow, DeviceSeries] | None = None,
                 idle: float = IDLE_SAMPLE, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = checked_clock(clock)   # what the throttle and the pauses go by (a test moves its own)
        self.interval = checked_seconds(interval, "interval")
        self.idle = checked_seconds(idle, "idle")
        self.comm = comm
        self._command_lock = threading.Lock()
        self._send_lock = threading.RLock()
        self._lock = threading.Lock()
        # Which buffers to describe again: those the residency tracker's journal says changed (the rule the
        # dashboard reads too), so an update costs what changed, not what the device holds.
        self._live = LiveAllocations()
        self._packed: dict[int, tuple[dict[str, Any], dict[str, Any], np.ndarray]] = {}  # by id, per description
        self._everything_dirty = False
        self._paused = False
        self._snapshot_sent = False
        self._sent: dict[int, tuple[AllocationInfo, np.ndarray]] = {}  # what the panel holds, by id
        self._lanes_seen = 0   # the timeline window's cursor: traffic read up to here is in _sent
        self._watched: frozenset[int] | None = None   # the maps the view shows (None: all, the sidebar's way)
        self._next_other = 0.0   # when the next map off the view's screen may be read (_refresh)
        self._lanes_deferred: dict[int, None] = {}   # off-screen buffers whose new counts wait, in order (_due)
        # The kernel's shared ones unless given (a test's, fed and clocked by the test); given back at close.
        self._owns_timeline = timeline is None
        self._window, self._series = timeline or shared(bus)
        self._next_sample = 0  # the number of the first device sample the view does not hold
        self._wake = threading.Event()
        self._closed = threading.Event()
        # The throttle (.throttle): updates and timeline answers each have their share of the view's, so that an
        # answer (it reads every event held, once a second) never leaves a hole in the updates.
        self._budget = Budget(UPDATES_SHARE)
        self._answers = Budget(BUSY_SHARE - UPDATES_SHARE, burst=ANSWERS_BURST)
        self._context = contextvars.copy_context()  # where the panel's last message was handled
        self._bus = bus or get_bus()
        # Inline (the bus's own bookkeeping): it only wakes the sender, so it costs the producer nothing, and the
        # wake comes as the event is published, not after a subscriber thread's pause.
        self._subscription = self._bus.subscribe(self._on_events, inline=True, name="the live view's session")
        comm.on_msg(self._on_msg)
        comm.on_close(self._on_close)
        self._charted: tuple[Any, str] | None = None   # the last experiment drawn, and its chart
        self._unsubscribe_experiments = experiment_feed.subscribe(self._send_experiment)
        self._cluster_dirty = False   # the feed changed since the last cluster message (under _lock)
        self._next_cluster = 0.0      # when the next cluster message may go (the session's clock)
        self._cluster_shown = False   # the view was last sent a cluster with a monitor behind it
        self._unsubscribe_cluster = cluster_feed.subscribe(self._on_cluster)
        self._thread = threading.Thread(target=self._run, name="uvm_lab-panel-updates", daemon=True)
        self._switching: FineSwitching | None = None
        if start:   # its updates run beside the kernel's code: in fine grains of the interpreter's lock (.throttle)
            self._switching = FineSwitching()
            self._thread.start()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def paused(self) -> bool:
        return self._paused

    def handle(self, data: object) -> Result:
        """Validate and carry out one command; send its result (and any update it caused) back."""
        # A reply names its command and seq only where they are ones the view could have sent: it never echoes
        # what it was given (a reply must stay small and encodable whatever came in).
        seq = data.get("seq") if isinstance(data, dict) else None
        kind = data.get("type") if isinstance(data, dict) else None
        result = Result(type="result", seq=seq if type(seq) is int and 0 <= seq <= MAX_SEQ else None,
                        command=kind if isinstance(kind, str) and kind in COMMANDS else None, ok=True, error=None)
        try:
            command = parse_command(data)
            if command["type"] in _ON_WORKERS:
                # The worker's work, over Dask: it takes none of the kernel's share, and no lock is held while
                # the answer comes (tens of ms; longer from a worker that just died).
                self._ask_worker(cast(WorkerCommand | WorkerTimeline | WorkerBuffers, command))
            else:
                if command["type"] == "timeline":
                    # An answer reads every event held: it waits for its own share of the kernel (see __init__).
                    self._clock.wait(self._closed, max(0.0, self._answers.ready_at() - self._clock.monotonic()))
                    self._catch_up()   # what the hardware has reported, in the window; not charged: see _run
                started, cpu = self._clock.monotonic(), self._clock.thread_time()
                with self._command_lock:
                    self._execute(command)
                if command["type"] == "timeline":
                    self._answers.spend(started, self._clock.thread_time() - cpu)
        except Exception as err:
            # Any failure, ours or the core's, is the command's answer, never the comm's end.
            result["ok"] = False
            result["error"] = ErrorInfo(type=type(err).__name__, message=_reply_text(str(err)))
        self._send(result)
        return result

    def flush(self) -> bool:
        """Send an ``update`` for every allocation that changed since the last one (and ``removed``
        for those freed). Returns whether anything was sent. A paused session, or one that has not
        sent its snapshot yet, sends nothing."""
        with self._lock:
            # Before the first snapshot the panel holds nothing an update could change.
            if self._paused or self.closed or not self._snapshot_sent:
                return False
            everything, self._everything_dirty = self._everything_dirty, False
        with self._send_lock:
            try:
                self._catch_up()
                now = ul.get_backend().now_ns()   # the maps are read at this time or later
                clock = self._clock.wall_ms()   # before the maps are read: what changed earlier is in them
                described = self._refresh()
                lanes_seen, lanes = self._window.changed_lanes(self._lanes_seen)
                # Only what may differ from what the panel holds: maps described again, and counts that moved.
                if everything:
                    self._lanes_deferred.clear()
                candidates = None if everything else self._due(lanes)
                infos, cells, held = self._describe_changed(described, candidates)
                gone = sorted(self._sent.keys() - described.keys()) if self._live.relisted else []
                update = Update(type="update", time=now, allocations=infos, samples=[], clock=clock)
                if self._series.due():   # the device's memory is read for its lanes' samples, and sent with them
                    update["device"] = _device_info()
                    self._sample(now, update["device"])
                update["samples"], next_sample = self._series.since(self._next_sample)
                if infos or update["samples"]:
                    self._send(update, cells)
                if gone:
                    self._send(Removed(type="removed", ids=gone))
            except BaseException:
                # What changed was taken and not sent: dropped, the panel would keep a stale map until
                # those pages moved again. The next flush describes every allocation.
                self._live = LiveAllocations()
                with self._lock:
                    self._everything_dirty = True
                raise
            self._sent.update(held)
            self._next_sample, self._lanes_seen = next_sample, lanes_seen
            for alloc_id in gone:
                del self._sent[alloc_id]
                self._lanes_deferred.pop(alloc_id, None)
            for alloc_id in self._packed.keys() - described.keys() if self._live.relisted else ():
                del self._packed[alloc_id]
            cluster = self._flush_cluster()
            return bool(infos or gone or update["samples"] or cluster)

    def send_snapshot(self) -> None:
        """Send every live allocation, replacing whatever the panel holds."""
        with self._lock:
            self._everything_dirty = False
            self._snapshot_sent = True
        with self._send_lock:
            self._sent.clear()
            self._lanes_deferred.clear()
            now = ul.get_backend().now_ns()
            self._live.refresh()   # a snapshot holds every map as it is
            described = self._live.described
            lanes_seen, _ = self._window.changed_lanes(self._lanes_seen)
            self._packed.clear()
            infos, cells, held = self._describe_changed(described, None)
            device = _device_info()
            self._sample(now, device)
            samples, next_sample = self._series.since(0)
            snapshot = Snapshot(type="snapshot", version=PROTOCOL_VERSION, time=now, page_size=PAGE_SIZE,
                                cell_limit=CELL_LIMIT, device=device, allocations=infos, samples=samples,
                                samples_dropped=self._series.dropped)
            self._send(snapshot, cells)
            self._sent.update(held)
            self._next_sample, self._lanes_seen = next_sample, lanes_seen
            with self._lock:
                self._cluster_dirty = False
                self._next_cluster = self._clock.monotonic() + CLUSTER_INTERVAL
            self._send_cluster()

    def _sample(self, now: int, device: DeviceInfo) -> None:
        gpus = device["devices"]
        self._series.close_interval(now, [gpu["total"] - gpu["free"] for gpu in gpus], [gpu["total"] for gpu in gpus],
                                    self._live.managed_bytes)

    def _refresh(self) -> Mapping[int, dict[str, Any]]:
        """Every live buffer's description: the maps the view shows read again where they changed, and
        another's (changed too) now and then (``OTHERS_PER_SECOND``), so the rest catch up in time; for a panel
        that shows every map, the ``MAPS_PER_UPDATE`` changed ones that waited longest."""
        if self._watched is None:
            return self._live.refresh((), MAPS_PER_UPDATE)
        now = self._clock.monotonic()
        others = 1 if OTHERS_PER_SECOND > 0 and now >= self._next_other else 0
        if others:
            self._next_other = now + 1 / OTHERS_PER_SECOND
        return self._live.refresh(self._watched, others)

    def _due(self, lanes: set[int]) -> set[int]:
        """The buffers to describe to the panel now: those whose maps were read again, and of ``lanes`` (those
        whose counts moved) the ones it shows and those it has not had; off-screen counts wait their turn,
        ``COUNTS_PER_UPDATE`` an update, the longest waiting first."""
        due, deferred = set(self._live.changed), self._lanes_deferred
        if self._watched is None:
            due |= lanes
        else:   # as sets, at C speed: a loop changes many lanes an update
            due |= lanes.intersection(self._watched) | lanes.difference(self._sent)
            deferred.update(dict.fromkeys(lanes - due))   # a dict as an ordered set: a lane waiting keeps its place
        for lane in [lane for lane in due if lane in deferred]:
            del deferred[lane]   # its counts go now anyway
        for lane in list(itertools.islice(deferred, COUNTS_PER_UPDATE)):
            del deferred[lane]
            due.add(lane)
        return due

    def _describe_changed(self, described: Mapping[int, dict[str, Any]], candidates: set[int] | None) -> tuple[
            list[AllocationInfo], list[np.ndarray], dict[int, tuple[AllocationInfo, np.ndarray]]]:
        """Describe those of ``candidates`` (None: every one of ``described``) that differ from what the panel
        holds, each as its changed runs where the panel holds it; with what it will hold once they are sent
        (noted by the caller after sending, so that a failed send leaves nothing noted). A description the
        journal left as it was is not packed again, and one packed again is packed from its last packing (only
        the cells where pages changed)."""
        infos: list[AllocationInfo] = []
        payloads: list[np.ndarray] = []
        held: dict[int, tuple[AllocationInfo, np.ndarray]] = {}
        ids = described.keys() if candidates is None else sorted(i for i in candidates if i in described)
        for alloc_id in ids:
            plain = described[alloc_id]
            if not plain["size"]:
                continue   # a zero-size buffer holds no pages: there is nothing to draw or to move
            packed = self._packed.get(alloc_id)
            if packed is None or packed[0] is not plain:
                packed = self._packed[alloc_id] = (plain, *_pack(plain, packed))
            # What the events say of it changes without its pages: read where the window says it may have.
            # As of the flush's one read-in (changed_lanes): a loop running meanwhile is not read in per buffer.
            info = AllocationInfo(**packed[1],  # type: ignore[typeddict-item]
                                  traffic=self._window.traffic(alloc_id, read_in=False),
                                  requested=self._window.requested(alloc_id, read_in=False))
            cells = packed[2]
            before = self._sent.get(alloc_id)
            if before is not None and before[0] == info and (before[1] is cells or np.array_equal(before[1], cells)):
                continue
            held[alloc_id] = (info, cells)
            payload = cells
            # Runs hold a header of 12 bytes at least and every changed cell: worth encoding when few changed.
            if before is not None and before[1] is cells:   # its counts alone moved: no run at all
                info, payload = AllocationInfo(**{**info, "encoding": "runs"}), _NO_RUNS  # type: ignore[typeddict-item]
            elif before is not None and len(before[1]) == len(cells) and \
                    12 + np.count_nonzero(before[1] != cells) < len(cells):
                runs = encode_runs(before[1], cells)
                if len(runs) < len(cells):
                    info, payload = AllocationInfo(**{**info, "encoding": "runs"}), runs  # type: ignore[typeddict-item]
            infos.append(info)
            payloads.append(payload)
        return infos, payloads, held

    def close(self) -> None:
        """Stop listening and sending (the comm closed, or the kernel is shutting down)."""
        with self._lock:   # once, whoever else closes it meanwhile
            if self._closed.is_set():
                return
            self._closed.set()
        self._wake.set()
        self._subscription.close()
        self._unsubscribe_experiments()
        self._unsubscribe_cluster()
        if self._switching is not None:
            self._switching.release()
        if self._owns_timeline:
            release_shared()
        with _sessions_lock:
            _sessions.discard(self)

    # -- commands --------------------------------------------------------------------------------------
    def _execute(self, command: Command) -> None:
        # Every branch is spelled out: a command picks one of these, it never names code to run.
        if command["type"] == "hello":
            self.send_snapshot()
            if (result := experiment_feed.latest()) is not None:   # the latest experiment, drawn once a view is new
                self._send_experiment(result)
        elif command["type"] == "pause":
            with self._lock:
                self._paused = command["paused"]
            if not command["paused"]:
                self.send_snapshot()
        elif command["type"] == "rate":
            self.interval = command["interval_ms"] / 1000
        elif command["type"] == "timeline":
            self._answer_timeline(command)
        elif command["type"] == "watch":
            ids = command["ids"]
            self._watched = None if ids is None else frozenset(ids)
            self._wake.set()   # maps just come into view are read at the next update
        elif command["type"] == "pages":
            now = ul.get_backend().now_ns()
            pages = ul.residency(command["id"], first_page=command["first_page"], pages=command["pages"])
            self._send(PageRows(type="pages", seq=command["seq"], id=command["id"], first_page=command["first_page"],
                                pages=len(pages.states), time=now), [pages.categories()])
        elif command["type"] in ("prefetch", "set_advice"):
            change_buffer(command)
            self.flush()

    def _answer_timeline(self, query: Timeline) -> None:
        self._send(*answer_timeline(self._window, query))

    def _ask_worker(self, command: WorkerCommand | WorkerTimeline | WorkerBuffers) -> None:
        """Carry ``command`` out on the worker it names, through the cluster's monitor, and send the answer. The
        worker's refusal (its typed error, pickled back) raises here, and is the command's result as any failure."""
        monitor = cluster_feed.current()
        if monitor is None:
            raise InvalidStateError(f"{command['type']} needs a Dask cluster: make a "
                                    "uvm_lab.dask.ClusterMonitor(client) in this kernel first")
        worker = command["worker"]
        if command["type"] == "worker_command":
            monitor.run(worker, command["command"])
        elif command["type"] == "worker_timeline":
            rows, columns = monitor.timeline(worker, command["start"], command["end"], command["width"])
            self._send(cast(WorkerTimelineRows, {**rows, "type": "worker_timeline", "seq": command["seq"],
                                                 "worker": worker}),
                       [columns[name] for name, _ in TIMELINE_COLUMNS])
        else:
            # One more than is sent: whether there were more is said, not guessed.
            listed = monitor.buffers(worker, MAX_WORKER_BUFFERS + 1)
            self._send(WorkerBufferList(type="worker_buffers", seq=command["seq"], worker=worker,
                                        buffers=[_worker_buffer(b) for b in listed[:MAX_WORKER_BUFFERS]],
                                        truncated=len(listed) > MAX_WORKER_BUFFERS))

    def _flush_cluster(self) -> bool:
        """Send the cluster if it changed and its turn came (``CLUSTER_INTERVAL``); whether it went."""
        with self._lock:
            now = self._clock.monotonic()
            if not self._cluster_dirty or now < self._next_cluster:
                return False   # not changed; or changed, and _run wakes for it when its turn comes
            self._cluster_dirty = False
            self._next_cluster = now + CLUSTER_INTERVAL
        return self._send_cluster()

    def _send_cluster(self) -> bool:
        """The cluster as the feed has it now, where there is one or the view was shown one (now closed); whether
        a message went."""
        monitor = cluster_feed.current()
        if monitor is None and not self._cluster_shown:
            return False
        self._send(_cluster(monitor))
        self._cluster_shown = monitor is not None
        return True

    def _send_experiment(self, result: Any) -> None:
        """An experiment's chart (``ul.compare``'s result, :meth:`~uvm_lab.experiment.Experiment.to_html`)."""
        if self._charted is None or self._charted[0] is not result:
            self._charted = (result, result.to_html())
        summary = result.summary
        with self._send_lock:
            self._send(ExperimentChart(type="experiment", workload=str(result.metadata.get("workload", "")),
                                       configurations=len(summary),
                                       created=str(result.metadata.get("created", "")), html=self._charted[1]))

    # -- comm and bus callbacks ------------------------------------------------------------------------
    def _on_msg(self, msg: dict[str, Any]) -> None:
        self._context = contextvars.copy_context()
        content = msg.get("content") if isinstance(msg, dict) else None
        self.handle(content.get("data") if isinstance(content, dict) else None)

    def _on_close(self, msg: dict[str, Any]) -> None:
        self.close()

    def _on_cluster(self) -> None:
        # On the Dask client's event loop: a flag and a wake, nothing more; the sender reads the monitor.
        with self._lock:
            self._cluster_dirty = True
        self._wake.set()

    def _until_due(self) -> float:
        """How long the sender may sleep with no news: ``idle``, or less where a cluster change waits its turn."""
        with self._lock:
            if not self._cluster_dirty or self._paused or not self._snapshot_sent:
                return self.idle
            return min(self.idle, max(0.0, self._next_cluster - self._clock.monotonic()))

    def _on_events(self, records: np.ndarray) -> None:
        # Wake the sender, nothing more: what changed is the residency tracker's journal to say when the
        # sender reads it. Not while paused: a paused view sends nothing, and each wake takes the interpreter's lock
        # from the loop; unpausing sends a snapshot. Set once: setting a set Event still takes its lock and notifies.
        if not self._paused and not self._wake.is_set():
            self._wake.set()
        # Where the sender is held back (its budget, a pause) while half the bus's history goes by unread, this
        # thread reads the timeline in, as the sender would: the counts it keeps then miss nothing.
        if (reader := self._window.reader) is not None and reader.falling_behind(len(records)):
            self._window.catch_up(wait=False)

    def _run(self) -> None:
        failing = False
        while not self._closed.is_set():
            # Woken by events; and once every `idle` seconds without any, so the device lanes go on while nothing
            # moves.
            self._clock.wait(self._wake, self._until_due())
            self._wake.clear()
            if self._closed.is_set():
                break
            # The records the loop has queued are handed to the bus's subscribers here, rather than at the loop's
            # next publish: the loop's own work, moved, not the view's, so not charged to the view's share.
            self._catch_up()
            started, cpu = self._clock.monotonic(), self._clock.thread_time()
            try:
                if self._paused:   # once an idle pause: the window reads on, so the bus's history never leaves it
                    self._window.catch_up()
                # A copy each time: one context cannot be entered by two threads at once.
                self._context.copy().run(self.flush)
                failing = False
            except Exception:
                # Keep serving (a view must never stop the kernel's work): try again after the pause, with
                # everything marked as changed; say so once, not on every retry.
                if not failing:
                    log.exception("uvm_lab panel update failed")
                failing = True
                self._wake.set()
            # The throttle (.throttle): at most one update an interval and UPDATES_SHARE of the kernel's time; events
            # arriving meanwhile only set _wake, and go out together.
            self._budget.spend(started, self._clock.thread_time() - cpu)
            self._clock.wait(self._closed, max(0.0, max(started + self.interval, self._budget.ready_at())
                                               - self._clock.monotonic()))

    def _catch_up(self) -> None:
        """Have everything the loop and the hardware produced so far published (not waiting for any subscriber of
        the bus): the maps then hold it, and the timeline's window reads it in from the bus's history."""
        self._bus.flush(wait=False)

    def _send(self, message: Any, cells: list[np.ndarray] | None = None) -> None:
        if self.closed:
            return
        # As bytes: a float column's memoryview would otherwise carry its item format to the wire.
        buffers = [np.ascontiguousarray(c).view(np.uint8).data for c in cells] if cells else None
        self.comm.send(data=message, buffers=buffers)


# -- reading the core --------------------------------------------------------------------------------------


def _pack(plain: dict[str, Any], before: tuple[dict[str, Any], dict[str, Any], np.ndarray] | None = None) -> tuple[
        dict[str, Any], np.ndarray]:
    """An allocation's metadata (its AllocationInfo but for what the events say) and its residency bytes; from
    ``before``, the same allocation's last packing, where there is one."""
    since = (before[0]["states"], before[2], before[1]["counts"]) if before is not None else None
    cell_pages, cells, counts = pack_states(plain["states"], since=since, counts=plain["category_pages"])
    advice = plain["advice"] or {"read_mostly": False, "preferred_location": None, "accessed_by": ()}
    info = dict(
        id=plain["id"], label=plain["label"], address=plain["address"], size=plain["size"],
        is_managed=plain["is_managed"],
        advice=AdviceState(read_mostly=advice["read_mostly"], preferred_location=advice["preferred_location"],
                           accessed_by=list(advice["accessed_by"])),
        pages=len(plain["states"]), cell_pages=cell_pages, cells=len(cells), counts=counts, encoding="cells",
    )
    return info, cells


def _cluster(monitor: Any) -> Cluster:
    """Every worker ``monitor`` (a :class:`~uvm_lab.dask.ClusterMonitor`, or None: no cluster) knows, each with its
    GPUs, in the order they joined; at most MAX_CLUSTER_WORKERS."""
    if monitor is None:
        return Cluster(type="cluster", workers=[], workers_left_out=0)
    devices: dict[str, list[dict[str, Any]]] = {}
    for row in monitor.rows():   # one read under the monitor's lock: each worker's GPUs agree with each other
        devices.setdefault(row["worker"], []).append(row)
    workers = list(monitor.workers().values())
    known = len(workers)
    extra = known - MAX_CLUSTER_WORKERS
    if extra > 0:   # those that stopped go first, the earliest joined first; then the newest live ones
        dropped = {id(w) for w in [w for w in workers if w.state != "live"][:extra]}
        workers = [w for w in workers if id(w) not in dropped][:MAX_CLUSTER_WORKERS]
    infos = []
    for lanes in workers:
        rows = devices.get(lanes.address, [])
        head = rows[0] if rows else {"state": lanes.state}
        infos.append(WorkerInfo(
            address=str(lanes.address), name=str(lanes.name), state=head["state"], backend=str(lanes.backend),
            gpus=int(lanes.gpus), events=int(head.get("events", 0)), cpu_faults=int(head.get("cpu_faults", 0)),
            allocated=int(head.get("allocated", 0)), buffers=int(head.get("buffers", 0)),
            lost=int(head.get("lost", 0)), latency_ms=round(float(lanes.latency_ms), 1),
            devices=[WorkerDevice(gpu=int(r["gpu"]), used=int(r["used"]), total=int(r["total"]),
                                  htod_bytes=int(r["htod_bytes"]), dtoh_bytes=int(r["dtoh_bytes"]),
                                  dtod_bytes=int(r["dtod_bytes"]), gpu_faults=int(r["gpu_faults"]),
                                  evicted_bytes=int(r["evicted_bytes"]), pages=int(r["pages"])) for r in rows]))
    return Cluster(type="cluster", workers=infos, workers_left_out=known - len(infos))


def _worker_buffer(plain: Mapping[str, Any]) -> WorkerBuffer:
    """One buffer as a worker described it (:func:`uvm_lab.dask.worker.describe_buffers`)."""
    return WorkerBuffer(id=int(plain["id"]), label=str(plain["label"]), size=int(plain["size"]),
                        is_managed=bool(plain["is_managed"]),
                        copies={str(k): int(v) for k, v in plain["copies"].items()}, unknown=int(plain["unknown"]))


def _reply_text(text: str) -> str:
    """``text`` as a reply carries it: at most MAX_REPLY_TEXT characters, and encodable as UTF-8 (a lone surrogate
    from the message that caused it is escaped)."""
    if len(text) > MAX_REPLY_TEXT:
        text = f"{text[:MAX_REPLY_TEXT - 30]}... ({len(text):,} characters)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _device_info() -> DeviceInfo:
    backend = ul.get_backend()
    free, total = backend.mem_info()
    count = int(backend.device_count())
    devices = [DeviceMemory(free=int(f), total=int(t)) for f, t in gpu_memory(backend)]
    return DeviceInfo(backend=str(backend.name), device_count=count, free=int(free), total=int(total),
                      devices=devices)


# -- the comm target -------------------------------------------------------------------------------------

# Open sessions, held here so a session lives as long as its comm (not as long as a reference).
_sessions: set[PanelSession] = set()
_sessions_lock = threading.Lock()


def sessions() -> list[PanelSession]:
    """The panels connected to this kernel now."""
    with _sessions_lock:
        return list(_sessions)


def _open(comm: CommLike, msg: dict[str, Any]) -> None:
    session = PanelSession(comm)
    with _sessions_lock:
        _sessions.add(session)
    # The open message carries the panel's hello.
    session._on_msg(msg)


def register_comm_target() -> bool:
    """Register the ``"uvm_lab"`` comm target with the running kernel.

    Idempotent: registering again replaces the handler with itself. Returns False, and does
    nothing, outside a kernel (plain Python, a terminal IPython).
    """
    manager = _kernel_comm_manager()
    if manager is None:
        return False
    manager.register_target(COMM_TARGET, _open)
    return True


def _kernel_comm_manager() -> Any | None:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None:
        return None
    manager = getattr(kernel, "comm_manager", None)
    if manager is None:
        import comm

        manager = comm.get_comm_manager()
    return manager
