"""The event bus: every producer publishes records here; every consumer subscribes.

Records arrive in bulk (numpy arrays of ``EVENT_DTYPE``), so a producer that emits a thousand
migrations pays one call, not a thousand. Single records from hot paths (an allocator's ALLOC and
FREE) are queued by :meth:`EventBus.emit` as eight packed 64-bit ints (:data:`ALLOCATOR_RECORD`), a bare
``bytearray.extend`` that creates no object the garbage collector tracks; a batch of them becomes one
array when it is flushed, with no per-record conversion. Queued records are published, in order,
before any array is, whenever something reads (traces, history, residency maps), and otherwise within
``flush_interval`` seconds.

Publishing never waits for a consumer. A subscriber is called on a thread of its own, never the producer's
and never under a producer's lock: publishing hands each subscriber the batch (a reference, no copy) and
returns. What a subscriber has not yet taken waits for it, up to its ``limit`` of records
(:data:`PENDING_LIMIT`) besides the oldest batch; what arrives past that is dropped for that subscriber alone
and counted (:attr:`Subscription.dropped`, listed by :meth:`EventBus.subscriptions` for ``%uvm status``), so
memory stays bounded whatever a consumer does. :meth:`EventBus.flush` delivers what waits on the caller's thread
before it returns, so a reader sees everything published before it read.

A subscriber's thread delivers what has gathered, then pauses (:data:`DELIVERY_PAUSE`) before the next
delivery: a loop that publishes a small batch per operation then loses the interpreter to it once a pause, not
once a batch. A reader that needs its subscription's records now drains it (:meth:`Subscription.drain`).

Some consumers are the bus's own bookkeeping rather than subscribers: the residency tracker, the address
index that attributes CUPTI's records, and the wake-ups of the live view and the dashboard. They subscribe
``inline``: they are called as records are published (under the bus's lock, in the producer's thread), must be
quick and never block, and see every record. The maps are only true if nothing is skipped, and a thread woken
for each small batch would cost a loop more than the work itself.

The bus keeps the most recent records as history, so a view that attaches late (the lab panel's
timeline) can start with it; ``dropped`` counts records that fell out. A consumer that only needs the records when
it reads (the live view's timeline and device lanes, the dashboard's totals) takes them from the history with a
:class:`HistoryReader` instead of subscribing: the producer then pays nothing for it, not even a call. A reader that
falls further behind than the history holds misses the oldest of what it had not taken, and counts them. Published
arrays are therefore never written to again. A subscriber that raises is detached and logged, never allowed to break
the producer (a page fault must not fail because a plot did).

The simulator's modelled accesses (ACCESS records, what :mod:`uvm_lab.trace_replay` replays) are many and only a
recording made for replay reads them: the simulator publishes them, as batches of their own, only while a
subscription names the kind (:attr:`EventBus.wants_accesses`); they go to such subscriptions alone and are not
kept in the history.

An inline subscriber may publish too (the residency tracker publishes the migrations a completed prefetch
implies): its records are published right after the batch being published, so every subscriber sees the
same order.

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

from ..clock import SYSTEM_CLOCK, Clock, checked_clock, checked_seconds
from ..errors import InvalidArgumentError, shown
from .schema import EVENT_DTYPE, EventKind
from .sources import stamp
from .staged import joined

__all__ = ["ALLOCATOR_FIELDS", "ALLOCATOR_RECORD", "PENDING_LIMIT", "EventBus", "HistoryReader", "Subscription",
           "get_bus", "new_alloc_id"]

log = logging.getLogger("uvm_lab.events")

Callback = Callable[[np.ndarray], None]

_alloc_ids = itertools.count(1)
_ACCESS = int(EventKind.ACCESS)

#: The most records that may wait for one subscriber (about 8 MiB); what arrives past it is dropped for it.
PENDING_LIMIT = 1 << 17
#: How long a subscriber's thread lets records gather after a delivery: a loop publishes in small batches, and
#: the thread should take the interpreter from it once a pause, not once a batch.
DELIVERY_PAUSE = 0.02

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


def _kind_code(kind: object) -> int:
    if isinstance(kind, bool) or not isinstance(kind, (int, np.integer)) or not 0 <= kind < 256:
        raise InvalidArgumentError(f"kinds must be EventKind values, got {shown(kind)}", value=kind,
                                   expected="an EventKind (an int from 0 to 255)")
    return int(kind)


def new_alloc_id() -> int:
    """A process-unique allocation id (0 means "unknown" in records)."""
    return next(_alloc_ids)


class Subscription:
    """A live subscription; ``close()`` (or leaving its ``with`` block) detaches it.

    ``waiting`` records have been published to it and not yet delivered; ``dropped`` arrived while ``limit``
    were waiting besides the oldest batch (so a batch that finds none waiting is taken whole), and were never
    delivered to it.
    """

    def __init__(self, bus: EventBus, callback: Callback, kinds: frozenset[int] | None, *, inline: bool = False,
                 limit: int = 0, name: str = "") -> None:
        self.bus = bus
        self.callback = callback
        self.kinds = kinds
        self.inline = inline
        self.limit = limit
        self.name = name
        self.dropped = 0
        self._mask: np.ndarray | None = None
        if kinds is not None:
            self._mask = np.zeros(256, dtype=bool)
            self._mask[list(kinds)] = True
        self._pending: deque[np.ndarray] = deque()
        self._waiting = 0
        self._ready = threading.Condition(threading.Lock())   # guards _pending, _waiting, dropped, _closed
        self._delivery = threading.RLock()   # one delivery at a time, in order (re-entered by a closing callback)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._hurry = threading.Event()   # ends the thread's pause: set on close, or once half the limit waits
        #: Whether it asked for the simulator's ACCESS records, which no other subscription is given.
        self.takes_accesses = kinds is not None and int(EventKind.ACCESS) in kinds

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def closed(self) -> bool:
        return self._closed

    def _wanted(self, records: np.ndarray) -> np.ndarray | None:
        if self._mask is not None:
            if len(records) == 1:   # the allocator's common case: one record, no fancy indexing
                if not self._mask[records["kind"][0]]:
                    return None
            else:
                keep = self._mask[records["kind"]]
                if not keep.all():   # a copy only where some records are not wanted
                    records = records[keep]
                    if not len(records):
                        return None
        return records

    def _offer(self, records: np.ndarray) -> None:
        """Take ``records`` for delivery (the bus's lock held): an inline subscriber is called now, any other is
        handed them, up to its limit, for its own thread."""
        wanted = self._wanted(records)
        if wanted is None:
            return
        if self.inline:
            self._call(wanted)
            return
        with self._ready:
            if self._closed:
                return
            # The oldest batch waiting is not counted: a batch that finds nothing waiting is taken whole, however
            # large (it is in memory already: the history holds it too), and one that keeps up loses no part of a
            # burst, nor what follows it while it is being taken.
            room = self.limit - (self._waiting - (len(self._pending[0]) if self._pending else 0))
            if room < len(wanted) and self._waiting:
                self.dropped += len(wanted) - max(room, 0)
                if room <= 0:
                    return
                wanted = wanted[:room]
            self._pending.append(wanted)
            self._waiting += len(wanted)
            self._ready.notify()
            if self._waiting * 2 >= self.limit:   # no pause while the limit comes near: one that keeps up drops none
                self._hurry.set()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"uvm_lab-events-{self.name}", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._pending and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
            self.drain()
            self.bus._clock.wait(self._hurry, DELIVERY_PAUSE)
            self._hurry.clear()

    def drain(self) -> None:
        """Deliver, on this thread, everything waiting for this subscriber (:meth:`EventBus.flush` does, for all)."""
        with self._delivery:
            while True:
                with self._ready:
                    if not self._pending:
                        return
                    batch = self._pending.popleft()
                    self._waiting -= len(batch)
                self._call(batch)

    def _call(self, records: np.ndarray) -> None:
        try:
            self.callback(records)
        except Exception:
            log.exception("event subscriber %r raised and has been detached", self.callback)
            self._detach()

    def _stop(self, *, discard: bool = False, count: bool = False) -> None:
        """Take nothing more, and end the thread; with ``discard``, what waits is never delivered (and, with
        ``count``, counted as dropped)."""
        with self._ready:
            self._closed = True
            if discard:
                if count:
                    self.dropped += self._waiting
                self._pending.clear()
                self._waiting = 0
            self._ready.notify()
        self._hurry.set()

    def _detach(self) -> None:
        """After its callback raised: what waits is not delivered."""
        self._stop(discard=True)
        self.bus.unsubscribe(self)

    def close(self, *, deliver: bool = True) -> None:
        """Detach, after delivering what was published while it listened; with ``deliver=False``, what still
        waits is dropped (and counted) instead."""
        if not deliver:
            self._stop(discard=True, count=True)
        self.bus.unsubscribe(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Subscription {self.name}: {self._waiting} waiting, {self.dropped} dropped>"


class HistoryReader:
    """Reads what a bus publishes from its history, when asked (:meth:`take`), rather than being handed each batch as
    it is published: however many batches a loop publishes, the producer does nothing for a reader.

    ``waiting`` records were published since the last take. ``dropped`` left the history (past the bus's
    ``capacity``) before the reader took them: they are never read, only counted. ACCESS records are not in the
    history, so no reader sees them. Thread-safe; one take at a time hands each record out once.
    """

    def __init__(self, bus: EventBus, name: str, *, history: bool) -> None:
        self.bus = bus
        self.name = name
        self.dropped = 0
        # The history batch it reads next, and the records published before that batch: where a take starts.
        self._batch, self._record = bus._position(history=history)
        self._unasked = 0   # records published until falling_behind next looks

    @property
    def waiting(self) -> int:
        return self.bus.published - self._record

    @property
    def closed(self) -> bool:
        return self not in self.bus.readers()

    def falling_behind(self, published: int) -> bool:
        """Whether half the bus's history waits unread, so that a reader held back should take it now: for the
        inline callback of a reader's owner, told each batch's size. It looks once a quarter of the history, not at
        every batch (a publisher's thread pays for each look)."""
        self._unasked -= published
        if self._unasked > 0:
            return False
        self._unasked = self.bus.capacity // 4
        return self.waiting * 2 > self.bus.capacity

    def take(self) -> np.ndarray:
        """Every record published since the last take (or, the first time, since the reader was made; with
        ``history``, from the oldest the bus held then), oldest first, as one new array."""
        batches = self.bus._take(self)
        return joined(batches) if batches else np.zeros(0, dtype=EVENT_DTYPE)

    def close(self) -> None:
        """Stop counting it among the bus's readers (what it has not taken is simply not read)."""
        self.bus._forget(self)

    def __enter__(self) -> HistoryReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<HistoryReader {self.name}: {self.waiting} waiting, {self.dropped} dropped>"


class EventBus:
    """Fan-out of event records to subscribers, with a ring of recent history."""

    def __init__(self, capacity: int = 1 << 20, *, flush_interval: float = 0.05, clock: Clock = SYSTEM_CLOCK) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise InvalidArgumentError(f"capacity must be a positive number of records, got {capacity!r}",
                                       value=capacity, expected="an int > 0")
        self._flush_interval = checked_seconds(flush_interval, "flush_interval")
        self._clock = checked_clock(clock)   # what the flusher goes by (a test moves its own)
        self._capacity = capacity
        # Packed allocator records. extend, and the drain's copy and trim, are each atomic: emit takes no lock.
        self._queue = bytearray()
        self._flusher: threading.Thread | None = None
        self._delivering = False   # a subscriber detached while records are being delivered must not recurse
        self._follow: list[np.ndarray] = []   # published by a subscriber mid-delivery: delivered right after
        # History is kept as the published arrays themselves (appending is O(1) on the hot path);
        # the oldest are trimmed once more than ``capacity`` records are held.
        self._history: deque[np.ndarray] = deque()
        self._held = 0
        self._written = 0          # records ever published
        self._batches = 0          # batches ever added to the history: a reader's place in it (HistoryReader)
        self._subscribers: tuple[Subscription, ...] = ()
        self._readers: tuple[HistoryReader, ...] = ()
        self._wants_accesses = False   # whether one of them takes ACCESS records (kept as they change)
        self._lock = threading.RLock()
        self._hooks: tuple[Callable[[], None], ...] = ()
        self._in_hooks = threading.local()   # a hook that reads the bus must not run the hooks again
        self._owner = threading.local()      # depth: how deep this thread holds _lock (see flush)

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

    @property
    def wants_accesses(self) -> bool:
        """Whether a subscription asked for ACCESS records: only then does the simulator publish them."""
        return self._wants_accesses

    def subscribe(self, callback: Callback, kinds: Iterable[EventKind | int] | None = None, *,
                  limit: int = PENDING_LIMIT, name: str | None = None, inline: bool = False) -> Subscription:
        """Call ``callback(records)`` with every batch published from now on (only ``kinds``, if given), on a
        thread of the subscription's own. ACCESS records come only where ``kinds`` names them.

        At most ``limit`` records wait for it; past that, what arrives is dropped for it and counted. ``name``
        says whose it is in ``%uvm status`` (the callback's name by default). ``inline`` is for the bus's own
        bookkeeping (see the module docstring): called in the producer's thread, under the bus's lock, never
        dropped.
        """
        if not callable(callback):
            raise InvalidArgumentError(f"callback must be callable, got {shown(callback)}", value=callback,
                                       expected="a callable taking an EVENT_DTYPE array")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise InvalidArgumentError(f"limit must be a positive number of records, got {shown(limit)}",
                                       value=limit, expected="an int > 0")
        if name is not None and not isinstance(name, str):
            raise InvalidArgumentError(f"name must be a str, got {shown(name)}", value=name, expected="a str or None")
        codes = frozenset(_kind_code(k) for k in kinds) if kinds is not None else None
        label = name if name is not None else getattr(callback, "__qualname__", type(callback).__name__)
        sub = Subscription(self, callback, codes, inline=bool(inline), limit=limit, name=label)
        with self._locked():
            self._flush_locked()   # what was queued before happened before: it is not this subscriber's
            self._subscribers = (*self._subscribers, sub)
            self._wants_accesses = any(s.takes_accesses for s in self._subscribers)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Detach ``sub``, after delivering what was published while it listened (unless it failed)."""
        with self._locked():
            listening = sub in self._subscribers
            if listening and not self._delivering:
                self._flush_locked()
            self._subscribers = tuple(s for s in self._subscribers if s is not sub)
            self._wants_accesses = any(s.takes_accesses for s in self._subscribers)
        if listening and not sub.inline and not self._holds_lock():
            sub.drain()
        sub._stop()

    def subscriptions(self) -> list[Subscription]:
        """The live subscriptions, in the order they were made (``name``, ``waiting``, ``dropped`` on each)."""
        return list(self._subscribers)

    def reader(self, name: str, *, history: bool = False) -> HistoryReader:
        """A :class:`HistoryReader` of what is published from now on (with ``history``, of what the bus holds too).
        ``name`` says whose it is in ``%uvm status``."""
        if not isinstance(name, str):
            raise InvalidArgumentError(f"name must be a str, got {shown(name)}", value=name, expected="a str")
        with self._locked():
            self._flush_locked()   # what was queued before happened before: it is not this reader's, but history
            reader = HistoryReader(self, name, history=bool(history))
            self._readers = (*self._readers, reader)
        return reader

    def readers(self) -> list[HistoryReader]:
        """The open readers, in the order they were made (``name``, ``waiting``, ``dropped`` on each)."""
        return list(self._readers)

    def _forget(self, reader: HistoryReader) -> None:
        with self._locked():
            self._readers = tuple(r for r in self._readers if r is not reader)

    def _position(self, *, history: bool) -> tuple[int, int]:
        """Where a reader made now starts: the history's first batch and the records before it, or its end."""
        with self._locked():
            if history:
                return self._batches - len(self._history), self._written - self._held
            return self._batches, self._written

    def _take(self, reader: HistoryReader) -> list[np.ndarray]:
        """The history's batches from ``reader``'s place on, its place moved past them, and what of those left the
        history unread counted: at once, so that two threads taking from one reader never take a batch twice."""
        with self._locked():
            first = self._batches - len(self._history)
            if reader._batch < first:
                reader.dropped += (self._written - self._held) - reader._record
            # From the newest end: a reader that keeps up asks for the last few of many thousand batches held.
            batches = list(itertools.islice(reversed(self._history), self._batches - max(reader._batch, first)))
            reader._batch, reader._record = self._batches, self._written
        batches.reverse()
        return batches

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

    def flush(self, *, wait: bool = True) -> None:
        """Publish the queued records now, after asking every flush hook to hand over what it holds; then (with
        ``wait``) deliver, on this thread, whatever waits for any subscriber.

        A producer that only needs what came before published first (not yet delivered) passes
        ``wait=False``: it must not wait on a consumer. Inside :meth:`locked`, nothing is waited for either:
        a subscriber's thread may be waiting for that lock.
        """
        if self._hooks and not getattr(self._in_hooks, "active", False):
            self._run_hooks()
        self._flush_queue()
        if wait and not self._holds_lock():
            for sub in self._subscribers:
                if not sub.inline:
                    sub.drain()

    def _flush_queue(self) -> None:
        if not self._queue or sys.is_finalizing():   # at exit, module globals may already be gone
            return
        with self._locked():
            self._flush_locked()

    def add_flush_hook(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` at the start of every :meth:`flush` (once per hook, however often added).

        A hook publishes what its producer holds (CUPTI's collector drains its buffers). A hook that
        raises is logged and kept: the reader still gets what the bus has.
        """
        if not callable(hook):
            raise InvalidArgumentError(f"a flush hook must be callable, got {hook!r} ({type(hook).__name__})",
                                       value=hook, expected="a callable taking no arguments")
        with self._locked():
            if hook not in self._hooks:
                self._hooks = (*self._hooks, hook)

    def remove_flush_hook(self, hook: Callable[[], None]) -> None:
        """Stop calling ``hook`` on :meth:`flush` (nothing happens if it was not added)."""
        with self._locked():
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
        """Deliver ``records`` (an ``EVENT_DTYPE`` array) to every subscriber, after anything queued. ACCESS records
        come in batches of their own (see the module's docstring)."""
        if not isinstance(records, np.ndarray) or records.dtype != EVENT_DTYPE or records.ndim != 1:
            what = f"{records.dtype} array of {records.ndim} dimension(s)" if isinstance(records, np.ndarray) \
                else type(records).__name__
            raise InvalidArgumentError(f"records must be a 1-D array of EVENT_DTYPE (make_events, record_of), "
                                       f"got a {what}", value=records, expected="a 1-D EVENT_DTYPE array")
        if not len(records) or sys.is_finalizing():
            return
        if records["kind"][0] == _ACCESS and (records["kind"] != _ACCESS).any():
            raise InvalidArgumentError("ACCESS records are published in batches of their own, not with records of "
                                       "other kinds", value=records, expected="a batch of ACCESS records alone")
        with self._locked():
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
        with self._locked():
            yield

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            self._owner.depth = getattr(self._owner, "depth", 0) + 1
            try:
                yield
            finally:
                self._owner.depth -= 1

    def _holds_lock(self) -> bool:
        return getattr(self._owner, "depth", 0) > 0

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
            accesses = batch["kind"][0] == _ACCESS   # a batch of ACCESS records is all ACCESS records (publish)
            if not accesses:
                self._append(batch)
            self._delivering = True
            try:
                for sub in self._subscribers:
                    if sub.takes_accesses or not accesses:
                        sub._offer(batch)
            finally:
                self._delivering = False
            batches.extend(self._follow)
            self._follow.clear()

    def _start_flusher(self) -> None:
        with self._locked():
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_periodically, name="uvm_lab-event-flush",
                                                 daemon=True)
                self._flusher.start()

    def _flush_periodically(self) -> None:
        never = threading.Event()
        while not sys.is_finalizing():
            self._clock.wait(never, self._flush_interval)
            try:
                self._flush_queue()   # the allocator's queue only: hooks run when someone reads
            except Exception:   # never let the flusher die silently mid-run
                log.exception("flushing queued events failed")

    def history(self) -> np.ndarray:
        """A copy of the newest ``capacity`` records, oldest first."""
        self.flush(wait=False)
        with self._locked():
            if not self._history:
                return np.zeros(0, dtype=EVENT_DTYPE)
            return joined(self._history)[-self._capacity :]   # tens of thousands of small batches, from a loop

    def _append(self, records: np.ndarray) -> None:
        self._history.append(records)
        self._batches += 1
        self._held += len(records)
        self._written += len(records)
        while self._held - len(self._history[0]) >= self._capacity:
            self._held -= len(self._history.popleft())


_bus = EventBus()


def get_bus() -> EventBus:
    """The process-wide bus that both backends and every resource publish to."""
    return _bus
