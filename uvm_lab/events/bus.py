"""The event bus: every producer publishes records here; every consumer subscribes.

Records arrive in bulk (numpy arrays of ``EVENT_DTYPE``), so a producer that emits a thousand
migrations pays one call, not a thousand. Single records from hot paths (an allocator's ALLOC and
FREE) are queued by :meth:`EventBus.emit` as eight packed 64-bit ints (:data:`ALLOCATOR_RECORD`), a bare
``bytearray.extend`` that creates no object the garbage collector tracks; a batch of them becomes one
array when it is flushed, with no per-record conversion. Queued records are
delivered, in order, before any array is published, whenever something reads (traces, history,
residency maps), and otherwise within ``flush_interval`` seconds: subscribers see every record, in
order, a little late at worst.

The bus keeps the most recent records as history, so a view that attaches late (the lab panel's
timeline) can start with it; ``dropped`` counts records that fell out. A subscriber that raises is
detached and logged, never allowed to break the producer (a page fault must not fail because a plot did).

A subscriber may publish too (the residency tracker publishes the migrations a completed prefetch
implies): its records are delivered right after the batch being delivered, to every subscriber, so all
of them see the same order.

Producers that hold records elsewhere (CUPTI keeps them in its own buffers until drained) register a
flush hook (:meth:`EventBus.add_flush_hook`): :meth:`EventBus.flush`, which every reader calls, runs
the hooks first, so reading a map or a trace sees what the hardware has already reported.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import struct
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from ..errors import InvalidArgumentError
from .schema import EVENT_DTYPE, EventKind
from .sources import stamp

__all__ = ["ALLOCATOR_FIELDS", "ALLOCATOR_RECORD", "EventBus", "Subscription", "get_bus", "new_alloc_id"]

log = logging.getLogger("uvm_lab.events")

Callback = Callable[[np.ndarray], None]

_alloc_ids = itertools.count(1)

#: The fields of an allocator's record, in order. ``time`` fills both ``start`` and ``end``, ``bytes``
#: both ``bytes`` and ``value``; ``flags`` and ``src`` are zero. ``source`` is :func:`.sources.capture`'s.
ALLOCATOR_FIELDS = ("kind", "dst", "time", "address", "bytes", "alloc_id", "stream", "source")

#: What :meth:`EventBus.emit` takes: ``ALLOCATOR_RECORD.pack(kind, dst, time, address, bytes, alloc_id,
#: stream, source)``, 64 bytes. The compiled pool writes the same layout (``uvm_lab/mr/_pool.c``).
ALLOCATOR_RECORD = struct.Struct("<qqqQQqQQ")
_ALLOCATOR_DTYPE = np.dtype([(name, "<u8" if code == "Q" else "<i8")
                             for name, code in zip(ALLOCATOR_FIELDS, ALLOCATOR_RECORD.format[1:], strict=True)])


def _from_allocator_records(packed: bytes) -> np.ndarray:
    """Packed :data:`ALLOCATOR_RECORD` rows as one ``EVENT_DTYPE`` array."""
    rows = np.frombuffer(packed, dtype=_ALLOCATOR_DTYPE)
    out = np.zeros(len(rows), dtype=EVENT_DTYPE)
    for name in ("kind", "dst", "address", "bytes", "alloc_id", "stream", "source"):
        out[name] = rows[name]
    out["start"] = out["end"] = rows["time"]
    out["value"] = rows["bytes"]
    return out


def new_alloc_id() -> int:
    """A process-unique allocation id (0 means "unknown" in records)."""
    return next(_alloc_ids)


class Subscription:
    """A live subscription; ``close()`` (or leaving its ``with`` block) detaches it."""

    def __init__(self, bus: EventBus, callback: Callback, kinds: frozenset[int] | None) -> None:
        self.bus = bus
        self.callback = callback
        self.kinds = kinds
        self._mask: np.ndarray | None = None
        if kinds is not None:
            self._mask = np.zeros(256, dtype=bool)
            self._mask[list(kinds)] = True

    def deliver(self, records: np.ndarray) -> None:
        if self._mask is not None:
            if len(records) == 1:   # the allocator's common case: one record, no fancy indexing
                if not self._mask[records["kind"][0]]:
                    return
            else:
                keep = self._mask[records["kind"]]
                if not keep.all():   # a copy only where some records are not wanted
                    records = records[keep]
                    if not len(records):
                        return
        self.callback(records)

    def close(self) -> None:
        self.bus.unsubscribe(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventBus:
    """Fan-out of event records to subscribers, with a ring of recent history."""

    def __init__(self, capacity: int = 1 << 20, *, flush_interval: float = 0.05) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise InvalidArgumentError(f"capacity must be a positive number of records, got {capacity!r}",
                                       value=capacity, expected="an int > 0")
        if isinstance(flush_interval, bool) or not isinstance(flush_interval, (int, float)) or not flush_interval > 0:
            raise InvalidArgumentError(f"flush_interval must be a positive number of seconds, got {flush_interval!r}",
                                       value=flush_interval, expected="a number of seconds > 0")
        self._capacity = capacity
        # Packed allocator records. extend, and the drain's copy and trim, are each atomic: emit takes no lock.
        self._queue = bytearray()
        self._flush_interval = flush_interval
        self._flusher: threading.Thread | None = None
        self._delivering = False   # a subscriber detached while records are being delivered must not recurse
        self._follow: list[np.ndarray] = []   # published by a subscriber mid-delivery: delivered right after
        # History is kept as the published arrays themselves (appending is O(1) on the hot path);
        # the oldest are trimmed once more than ``capacity`` records are held.
        self._history: deque[np.ndarray] = deque()
        self._held = 0
        self._written = 0          # records ever published
        self._subscribers: tuple[Subscription, ...] = ()
        self._lock = threading.RLock()
        self._hooks: tuple[Callable[[], None], ...] = ()
        self._in_hooks = threading.local()   # a hook that reads the bus must not run the hooks again

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def published(self) -> int:
        """Records published since the bus was made."""
        return self._written

    @property
    def dropped(self) -> int:
        """Records that fell out of the history ring."""
        return max(0, self._written - self._capacity)

    def subscribe(self, callback: Callback, kinds: Iterable[EventKind | int] | None = None) -> Subscription:
        """Call ``callback(records)`` with every batch published from now on (only ``kinds``, if given)."""
        sub = Subscription(self, callback, frozenset(int(k) for k in kinds) if kinds is not None else None)
        with self._lock:
            self._flush_locked()   # what was queued before happened before: it is not this subscriber's
            self._subscribers = (*self._subscribers, sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Detach ``sub``, after delivering what was queued while it listened."""
        with self._lock:
            if sub in self._subscribers and not self._delivering:
                self._flush_locked()
            self._subscribers = tuple(s for s in self._subscribers if s is not sub)

    def emit(self, record: bytes) -> None:
        """Queue one allocator record, packed as :data:`ALLOCATOR_RECORD`.

        Resources append to :meth:`allocator_queue` directly (their records are packed by construction);
        this checks what it is given, since one record of the wrong length would misalign every later one.
        """
        if not isinstance(record, (bytes, bytearray)) or len(record) != ALLOCATOR_RECORD.size:
            raise InvalidArgumentError(
                f"an allocator record is ALLOCATOR_RECORD.pack(kind, dst, time, address, bytes, alloc_id, stream, "
                f"source), "
                f"{ALLOCATOR_RECORD.size} bytes; got {type(record).__name__} of length "
                f"{len(record) if isinstance(record, (bytes, bytearray)) else '-'}",
                value=record, expected=f"{ALLOCATOR_RECORD.size} packed bytes")
        self._start_flusher()
        self._queue.extend(record)

    def allocator_queue(self) -> bytearray:
        """The queue of packed allocator records, for producers that append to it themselves (the resources'
        hot paths: ``queue.extend(ALLOCATOR_RECORD.pack(...))``, or the compiled pool's own writes)."""
        self._start_flusher()
        return self._queue

    def flush(self) -> None:
        """Deliver the queued records now, after asking every flush hook to hand over what it holds."""
        if self._hooks and not getattr(self._in_hooks, "active", False):
            self._run_hooks()
        self._flush_queue()

    def _flush_queue(self) -> None:
        if not self._queue or sys.is_finalizing():   # at exit, module globals may already be gone
            return
        with self._lock:
            self._flush_locked()

    def add_flush_hook(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` at the start of every :meth:`flush` (once per hook, however often added).

        A hook publishes what its producer holds (CUPTI's collector drains its buffers). A hook that
        raises is logged and kept: the reader still gets what the bus has.
        """
        if not callable(hook):
            raise InvalidArgumentError(f"a flush hook must be callable, got {hook!r} ({type(hook).__name__})",
                                       value=hook, expected="a callable taking no arguments")
        with self._lock:
            if hook not in self._hooks:
                self._hooks = (*self._hooks, hook)

    def remove_flush_hook(self, hook: Callable[[], None]) -> None:
        """Stop calling ``hook`` on :meth:`flush` (nothing happens if it was not added)."""
        with self._lock:
            self._hooks = tuple(h for h in self._hooks if h != hook)

    def _run_hooks(self) -> None:
        self._in_hooks.active = True
        try:
            for hook in self._hooks:
                try:
                    hook()
                except Exception:
                    log.exception("flush hook %r raised", hook)
        finally:
            self._in_hooks.active = False

    def publish(self, records: np.ndarray) -> None:
        """Deliver ``records`` (an ``EVENT_DTYPE`` array) to every subscriber, after anything queued."""
        if not isinstance(records, np.ndarray) or records.dtype != EVENT_DTYPE or records.ndim != 1:
            what = f"{records.dtype} array of {records.ndim} dimension(s)" if isinstance(records, np.ndarray) \
                else type(records).__name__
            raise InvalidArgumentError(f"records must be a 1-D array of EVENT_DTYPE (make_events, record_of), "
                                       f"got a {what}", value=records, expected="a 1-D EVENT_DTYPE array")
        if not len(records) or sys.is_finalizing():
            return
        with self._lock:
            if self._delivering:   # a subscriber publishing (the lock is this thread's): after this batch
                self._follow.append(records)
                return
            self._flush_locked()
            self._deliver(records)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold off every other thread's publishing while the block runs (this thread may publish).

        For a reader that publishes what follows from what it read, with nothing published in between:
        the host watcher reads a map, compares it with the host's page tables and publishes the difference.
        Keep the block short: producers on other threads wait for it.
        """
        with self._lock:
            yield

    def _flush_locked(self) -> None:
        queue = self._queue
        if queue:
            packed = bytes(queue)
            del queue[:len(packed)]     # only what was copied: a record emitted meanwhile stays queued
            self._deliver(_from_allocator_records(packed))

    def _deliver(self, records: np.ndarray) -> None:
        batches = [records]
        while batches:
            batch = stamp(batches.pop(0))   # the driver's records, and any without a caller: the running cell
            self._append(batch)
            self._delivering = True
            try:
                for sub in self._subscribers:
                    try:
                        sub.deliver(batch)
                    except Exception:
                        self.unsubscribe(sub)
                        log.exception("event subscriber %r raised and has been detached", sub.callback)
            finally:
                self._delivering = False
            batches.extend(self._follow)
            self._follow.clear()

    def _start_flusher(self) -> None:
        with self._lock:
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_periodically, name="uvm_lab-event-flush",
                                                 daemon=True)
                self._flusher.start()

    def _flush_periodically(self) -> None:
        wake = threading.Event()
        while not sys.is_finalizing():
            wake.wait(self._flush_interval)
            try:
                self._flush_queue()   # the allocator's queue only: hooks run when someone reads
            except Exception:   # never let the flusher die silently mid-run
                log.exception("flushing queued events failed")

    def history(self) -> np.ndarray:
        """A copy of the newest ``capacity`` records, oldest first."""
        self.flush()
        with self._lock:
            if not self._history:
                return np.zeros(0, dtype=EVENT_DTYPE)
            return np.concatenate(self._history)[-self._capacity :]

    def _append(self, records: np.ndarray) -> None:
        self._history.append(records)
        self._held += len(records)
        self._written += len(records)
        while self._held - len(self._history[0]) >= self._capacity:
            self._held -= len(self._history.popleft())


_bus = EventBus()


def get_bus() -> EventBus:
    """The process-wide bus that both backends and every resource publish to."""
    return _bus
