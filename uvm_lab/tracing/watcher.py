"""The host watcher: the host's page tables, read at a low rate, keep the residency map true with no tracing.

On a real GPU the host's page tables (:func:`~uvm_lab.tracing.host_resident`) say exactly which pages of a
managed allocation the host holds. A kernel that faults pages in, host code that touches them, a copy, a
ReadMostly collapse: whatever moved pages to or from the host, with or without a record, shows there. The
watcher compares them with the map of every live managed allocation and publishes what they show and the
map lacks (:func:`~uvm_lab.tracing.reconcile`): inferred migrations, and the pages' new states. It costs the
GPU nothing; its cost is CPU time on the host, about a page-table read of 8 bytes a page a round.

Pages may move while the tables are read. Each allocation's tables are read before its map; where they
disagree with it, they are read again, and only pages that read the same both times are corrected: a page
in motion waits for the next round. A round that finds nothing to correct reads the tables once and makes a
few passes over the pages. The map is read, compared and corrected while no other thread may publish
(:meth:`~uvm_lab.events.EventBus.locked`), so no record arriving meanwhile is overwritten. Completed
prefetches and CUPTI's records are brought in first (the bus's flush hooks), so the watcher infers only what
no record will tell.

While CUPTI's collector runs, what a round finds that CUPTI should have recorded is counted as lost in its
status (:meth:`~uvm_lab.tracing.CuptiCollector.account`): its losses are always counted and shown, also those
no drain can see.

``ul.tracing.watch()`` starts the process-wide watcher (``use_backend("cuda")`` does, unless told not to);
the simulator has no real pages to read, so it is never watched there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import BackendError, InvalidArgumentError
from ..events.bus import EventBus
from ..page_states import HOST
from .cupti import running_collector
from .pagemap import host_resident
from .reconcile import Reconciliation, changes, reconcile

__all__ = ["DEFAULT_INTERVAL", "HostWatcher", "check_host", "get_watcher", "unwatch", "watch"]

#: Seconds between two rounds of the process-wide watcher, by default.
DEFAULT_INTERVAL = 0.25

HostReader = Callable[[int, int], np.ndarray]


def check_host(tracker: Any, *, gpus: int, bus: EventBus | None = None, read_host: HostReader = host_resident,
               now: Callable[[], int] = time.perf_counter_ns, repair: bool = True) -> Reconciliation:
    """One round: every live managed allocation of ``tracker`` against the host's page tables.

    Parameters
    ----------
    tracker
        The :class:`~uvm_lab.ResidencyTracker` whose maps to check (it must listen to ``bus``).
    gpus
        How many GPUs the process has (:func:`~uvm_lab.tracing.reconcile`).
    bus
        Where the corrections go; the tracker's bus by default.
    read_host
        ``read_host(address, size)``: a bool per page, True where the host holds it (the host's page tables;
        tests pass recorded ones).
    now
        The inferred events' timestamp, on the backend's clock.
    repair
        Publish the corrections (else only count them).
    """
    bus = bus if bus is not None else tracker.bus
    bus.flush(wait=False)   # completed prefetches and CUPTI's records first: infer only what no record will tell
    found = Reconciliation()
    for seg in tracker.segments():
        if seg["kind"] != "managed" or not seg["size"]:
            continue
        address, size = seg["address"], seg["size"]
        before = np.asarray(read_host(address, size), dtype=bool)
        with bus.locked():
            try:
                current = tracker.map(address, size)
            except InvalidArgumentError:   # freed meanwhile
                continue
            n = min(len(current.states), len(before))
            states = current.states[:n]
            rm = current.read_mostly[:n] if current.read_mostly is not None else np.zeros(n, dtype=bool)
            if not changes(states, before[:n], rm, gpus=gpus).any():   # the common case: one read, one pass
                found = found + Reconciliation(pages=n)
                continue
            after = np.asarray(read_host(address, size), dtype=bool)[:n]
            settled = before[:n] == after
            # A page read differently twice is in motion: it keeps what the map says, to be looked at again.
            host = np.where(settled, after, (states & HOST) != 0)
            part = reconcile(states, host, address=address, gpus=gpus, read_mostly=rm, settled=settled,
                             alloc_id=seg["id"], now=now())
            if repair and len(part.events):
                bus.publish(part.events)
        found = found + part
    return found


class HostWatcher:
    """Reads the host's page tables every ``interval`` seconds and corrects the maps (see the module docstring).

    Parameters
    ----------
    interval
        Seconds between rounds, 0.01 .. 3600.
    tracker
        The tracker whose maps to keep true; the process-wide one by default.
    gpus
        How many GPUs the process has; the current backend's count by default.
    read_host
        Where the host's page tables come from (:func:`~uvm_lab.tracing.host_resident`; tests pass recorded ones).
    now
        The clock of the inferred events; the current backend's by default.
    """

    def __init__(self, interval: float = DEFAULT_INTERVAL, *, tracker: Any = None, gpus: int | None = None,
                 read_host: HostReader = host_resident, now: Callable[[], int] | None = None) -> None:
        from ..residency_map import ResidencyTracker, get_tracker

        _check_interval(interval)
        if tracker is not None and not isinstance(tracker, ResidencyTracker):
            raise InvalidArgumentError(f"tracker must be a ResidencyTracker, got {type(tracker).__name__}",
                                       value=tracker, expected="a ResidencyTracker, or None for the process-wide one")
        if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
            raise InvalidArgumentError(f"gpus must be the number of GPUs, at least 1, got {gpus!r}", value=gpus,
                                       expected="an int >= 1, or None for the current backend's")
        if not callable(read_host) or (now is not None and not callable(now)):
            raise InvalidArgumentError("read_host and now must be callables", value=(read_host, now),
                                       expected="read_host(address, size) -> bools; now() -> ns")
        self.interval = float(interval)
        self.tracker = tracker if tracker is not None else get_tracker()
        self._gpus = gpus
        self._read_host = read_host
        self._now = now
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()   # one round at a time
        self.rounds = 0                  #: rounds run
        self.pages = 0                   #: pages compared, over all rounds
        self.cpu_seconds = 0.0           #: this process's CPU time the rounds took (thread time)
        self.found = Reconciliation()    #: what every round found, summed (its events are not kept)
        self.errors = 0                  #: rounds that failed (logged)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> HostWatcher:
        """Run rounds every ``interval`` seconds on a thread of its own, until :meth:`stop`."""
        if not self.running:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="uvm_lab-host-watcher", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def check(self, *, repair: bool = True) -> Reconciliation:
        """Run one round now, on this thread; what it found (with its events)."""
        if not isinstance(repair, bool):
            raise InvalidArgumentError(f"repair must be True or False, got {repair!r}", value=repair,
                                       expected="a bool")
        with self._lock:
            started = time.thread_time()
            found = check_host(self.tracker, gpus=self._gpu_count(), read_host=self._read_host,
                               now=self._now or _backend_clock(), repair=repair)
            self.cpu_seconds += time.thread_time() - started
            self.rounds += 1
            self.pages += found.pages
            self.found = self.found + Reconciliation(found.pages, found.htod, found.dtoh, found.first_touch,
                                                     found.host_copy_dropped, found.learned)
        collector = running_collector()
        if collector is not None and collector.bus is self.tracker.bus:   # what CUPTI should have recorded, lost
            collector.account(found)
        return found

    def status(self) -> dict[str, Any]:
        """What the watcher has done: rounds, pages compared, CPU seconds, and what it found, by kind."""
        f = self.found
        return {"running": self.running, "interval": self.interval, "rounds": self.rounds, "pages": self.pages,
                "cpu_seconds": self.cpu_seconds, "unrecorded": f.unrecorded, "htod": f.htod, "dtoh": f.dtoh,
                "first_touch": f.first_touch, "host_copy_dropped": f.host_copy_dropped, "learned": f.learned,
                "errors": self.errors}

    def __repr__(self) -> str:
        state = f"every {self.interval:g} s" if self.running else "stopped"
        return (f"<HostWatcher {state}, {self.rounds} rounds, {self.found.unrecorded} pages moved unrecorded, "
                f"{self.found.learned} learned>")

    def _gpu_count(self) -> int:
        if self._gpus is not None:
            return self._gpus
        from ..backends import get_backend

        return int(get_backend().device_count())

    def _run(self) -> None:
        import logging

        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:   # a failed round is logged and counted; the next one tries again
                self.errors += 1
                logging.getLogger("uvm_lab.tracing").exception("the host watcher's round failed")


def _check_interval(interval: object) -> None:
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0.01 <= interval <= 3600:
        raise InvalidArgumentError(f"interval must be 0.01..3600 seconds, got {interval!r}", value=interval,
                                   expected="seconds, 0.01..3600")


def _backend_clock() -> Callable[[], int]:
    from ..backends import get_backend

    return get_backend().now_ns


_watcher: HostWatcher | None = None
_watcher_lock = threading.Lock()


def watch(interval: float = DEFAULT_INTERVAL) -> HostWatcher:
    """Start the process-wide host watcher (or change its interval), and return it.

    Raises
    ------
    BackendError
        The current backend is the simulator: its addresses name no real memory to read.
    InvalidArgumentError
        ``interval`` is not 0.01..3600 seconds.
    """
    global _watcher
    _check_interval(interval)
    from ..backends import get_backend

    if get_backend().is_simulated:
        raise BackendError("the simulated device has no host page tables to watch: its maps are exact already")
    with _watcher_lock:
        if _watcher is None:
            _watcher = HostWatcher(interval)
        _watcher.interval = float(interval)
        return _watcher.start()


def unwatch() -> None:
    """Stop the process-wide host watcher, if it runs."""
    with _watcher_lock:
        if _watcher is not None:
            _watcher.stop()


def get_watcher() -> HostWatcher | None:
    """The process-wide host watcher, running or stopped, or None if it was never started."""
    return _watcher
